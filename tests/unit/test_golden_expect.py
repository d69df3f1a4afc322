"""The hand-written expectation checker (``tests/golden_expect.py``) is itself checked: it must
catch each kind of change in meaning a regenerated golden file could bring."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.golden_expect import check_errors, check_plan, load_expectation

PLAN: dict[str, Any] = {
    "actions": [
        {
            "seq": 1,
            "kind": "vgpu-remove",
            "target": "0000:08:00.7",
            "params": {"gpu": "0000:08:00.0", "type": "NVIDIA A2-4Q"},
            "reason": "no vGPU desired",
        },
        {
            "seq": 2,
            "kind": "kubevirt-update",
            "target": "kubevirt/ns/kubevirt",
            "params": {"add": [{"mdevNameSelector": "NVIDIA A2-4A"}], "remove": ["NVIDIA A2-4Q"]},
            "reason": "allow-list",
        },
    ],
    "blocked": [
        {
            "kind": "vgpu-remove",
            "target": "0000:08:00.5",
            "params": {"type": "NVIDIA A2-4Q"},
            "reason": "VF 0000:08:00.5 hosts NVIDIA A2-4Q, in use by simulated VM",
        },
    ],
    "notes": ["cluster actions skipped: no cluster configured"],
}
EXPECT: dict[str, Any] = {
    "actions": [
        ["vgpu-remove", "0000:08:00.7", "NVIDIA A2-4Q"],
        [
            "kubevirt-update",
            "kubevirt/ns/kubevirt",
            {"add": ["NVIDIA A2-4A"]},
            {"remove": "NVIDIA A2-4Q"},
        ],
    ],
    "blocked": [["vgpu-remove", "0000:08:00.5", "in use"]],
    "notes": ["no cluster"],
}


def test_a_plan_that_means_what_is_expected_passes() -> None:
    assert check_plan(EXPECT, PLAN) == []


def _changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    plan = copy.deepcopy(PLAN)
    node: Any = plan
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return plan


@pytest.mark.parametrize(
    ("plan", "complaint"),
    [
        (_changed(("actions",), list(reversed(PLAN["actions"]))), "actions: expected"),
        (_changed(("actions", 0, "target"), "0000:08:00.6"), "actions: expected"),
        (_changed(("actions", 0, "kind"), "vgpu-create"), "actions: expected"),
        (_changed(("actions", 0, "params", "type"), "NVIDIA A2-4A"), "does not carry 'NVIDIA"),
        # The profile named only in the reason is not carried.
        (_changed(("actions", 0, "params"), {"gpu": "0000:08:00.0"}), "does not carry"),
        (_changed(("actions", 1, "params", "add"), []), "does not carry {'add'"),
        (_changed(("actions", 1, "params", "remove"), []), "does not carry {'remove'"),
        (_changed(("blocked",), []), "blocked: expected"),
        (_changed(("blocked", 0, "reason"), "VF 0000:08:00.5: no vGPU desired"), "lacks 'in use'"),
        (_changed(("notes",), []), "no note contains"),
    ],
)
def test_each_change_of_meaning_is_caught(plan: dict[str, Any], complaint: str) -> None:
    problems = check_plan(EXPECT, plan)
    assert any(complaint in p for p in problems), problems


def test_error_lines_are_matched_by_place_and_phrases() -> None:
    expect = {"errors": [["desired.yaml:13", "0000:09:00.4", "0000:08:00.0"]]}
    good = ["desired.yaml:13:13: 0000:09:00.4 is a VF of 0000:09:00.0, not of 0000:08:00.0"]
    assert check_errors(expect, good) == []
    assert check_errors(expect, [good[0].replace(":13:13", ":14:13")])
    assert check_errors(expect, [good[0].replace("0000:08:00.0", "its GPU")])
    assert check_errors(expect, [*good, good[0]])


def test_an_unquoted_address_is_refused_not_read_as_a_number(tmp_path: Path) -> None:
    # YAML 1.1 reads 0000:08:00.5 as a sexagesimal float: the loader must say so.
    path = tmp_path / "expect.yaml"
    path.write_text("actions:\n  - [vgpu-remove, 0000:08:00.5]\nblocked: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="quote"):
        load_expectation(path)
    path.write_text("actions: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="required"):
        load_expectation(path)
