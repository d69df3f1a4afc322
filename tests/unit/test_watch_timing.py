"""Pacing rules of the watch loop: backoff after failures, debounce of file-event bursts."""

from __future__ import annotations

import random

import pytest

from reconciler.watch.timing import Backoff, Debounce

# -- backoff ---------------------------------------------------------------------------------


def test_the_ceiling_doubles_from_one_second_up_to_a_minute() -> None:
    backoff = Backoff()
    assert [backoff.ceiling(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_a_long_streak_of_failures_stays_at_the_cap() -> None:
    # 2**5000 overflows a float: the cap must be reached without computing it.
    assert Backoff().ceiling(5000) == 60.0
    assert Backoff().delay(5000, rng=lambda: 0.999) <= 60.0


@pytest.mark.parametrize("failures", [1, 3, 7, 20])
def test_the_delay_lies_between_half_the_ceiling_and_the_ceiling(failures: int) -> None:
    backoff = Backoff()
    ceiling = backoff.ceiling(failures)
    assert backoff.delay(failures, rng=lambda: 0.0) == ceiling / 2
    assert backoff.delay(failures, rng=lambda: 0.5) == 0.75 * ceiling
    assert ceiling / 2 <= backoff.delay(failures, rng=lambda: 0.999999) < ceiling


def test_jitter_spreads_retries_of_nodes_that_failed_together() -> None:
    rng = random.Random(7)  # noqa: S311 - jitter, not cryptography
    delays = {round(Backoff().delay(4, rng=rng.random), 3) for _ in range(50)}
    assert len(delays) > 40
    assert all(4.0 <= d < 8.0 for d in delays)


def test_no_jitter_gives_the_ceiling_itself() -> None:
    backoff = Backoff(initial=0.5, cap=4, jitter=0)
    assert [backoff.delay(n, rng=lambda: 0.9) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 4, 4]


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 2, "cap": 1}, {"factor": 0.5}, {"jitter": 1.5}, {"jitter": -1}],
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)


# -- debounce --------------------------------------------------------------------------------


def test_nothing_is_due_without_an_event() -> None:
    debounce = Debounce(0.2)
    assert debounce.deadline is None
    assert not debounce.pending
    assert not debounce.take(100.0)


def test_due_a_quiet_period_after_the_last_event_of_a_burst() -> None:
    debounce = Debounce(0.2)
    debounce.poke(10.0)  # write the temporary file
    debounce.poke(10.05)  # rename it over the original
    debounce.poke(10.1)  # the directory's mtime
    assert debounce.deadline == pytest.approx(10.3)
    assert not debounce.take(10.29)
    assert debounce.take(10.3)
    # Taken once: the burst is forgotten.
    assert not debounce.pending
    assert not debounce.take(10.5)


def test_a_burst_that_never_pauses_is_still_read_after_max_wait() -> None:
    debounce = Debounce(0.2, max_wait=1.0)
    t = 0.0
    while t < 0.95:
        debounce.poke(t)
        t += 0.1
    debounce.poke(0.99)
    assert debounce.deadline == pytest.approx(1.0)
    assert debounce.take(1.0)


def test_the_default_max_wait_is_ten_quiet_periods() -> None:
    debounce = Debounce(0.2)
    assert debounce.max_wait == pytest.approx(2.0)
    assert Debounce(0).max_wait == 0


def test_zero_debounce_is_due_at_once() -> None:
    debounce = Debounce(0)
    debounce.poke(5.0)
    assert debounce.take(5.0)


def test_a_negative_debounce_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Debounce(-0.1)
