"""``--allow-list-grace`` and the retiring marks' own helpers (reconciler/model/retiring.py)."""

from __future__ import annotations

import pytest

from reconciler.cli.main import build_parser
from reconciler.cli.options import GlobalOptions, parse_duration
from reconciler.model.clustertext import ClusterTextError
from reconciler.model.errors import UsageError
from reconciler.model.retiring import (
    DEFAULT_ALLOW_LIST_GRACE,
    expired,
    format_marks,
    parse_marks,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("900", 900.0), ("90s", 90.0), ("15m", 900.0), ("1h30m", 5400.0), ("2h", 7200.0)],
)
def test_a_duration_is_seconds_or_hours_minutes_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15 minutes", "m", "1.5h", "-1", "30m1h"])
def test_anything_else_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_the_option_before_or_after_the_command_and_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VGPUCTL_ALLOW_LIST_GRACE", raising=False)

    def grace(*argv: str) -> float:
        return GlobalOptions.from_namespace(build_parser().parse_args(list(argv))).allow_list_grace

    assert grace("plan", "x.yaml") == DEFAULT_ALLOW_LIST_GRACE == 900.0
    assert grace("--allow-list-grace", "0", "plan", "x.yaml") == 0.0
    assert grace("apply", "x.yaml", "--allow-list-grace", "1h") == 3600.0
    monkeypatch.setenv("VGPUCTL_ALLOW_LIST_GRACE", "20m")
    assert grace("watch", "x.yaml") == 1200.0
    with pytest.raises(UsageError, match="--allow-list-grace: 'soon' is not a duration"):
        grace("plan", "x.yaml", "--allow-list-grace", "soon")


def test_marks_read_and_written() -> None:
    assert parse_marks(None) == parse_marks("") == {}
    text = format_marks({"b": "2026-12-07T19:00:00Z", "a": "2026-12-07T18:00:00Z"})
    assert text == '{"a":"2026-12-07T18:00:00Z","b":"2026-12-07T19:00:00Z"}'
    assert parse_marks(text) == {"a": "2026-12-07T18:00:00Z", "b": "2026-12-07T19:00:00Z"}
    assert format_marks({}) is None
    for bad in ("[]", '{"a": 1}', "{", "[" * 100):
        with pytest.raises(ClusterTextError):
            parse_marks(bad)


def test_a_mark_expires_only_when_both_times_are_read_and_far_enough_apart() -> None:
    at = "2026-12-07T19:00:00Z"
    assert expired("2026-12-07T18:45:00Z", at, 900.0)
    assert not expired("2026-12-07T18:45:01Z", at, 900.0)
    assert not expired(None, at, 900.0)
    assert not expired("yesterday", at, 900.0)
    assert not expired("2026-12-07T18:00:00Z", "", 900.0)
    assert expired(None, "", 0.0)  # a grace of 0 needs no mark
