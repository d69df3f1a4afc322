"""A watch and two applies racing on one node, at the ci size: one proceeds, the others fail
fast naming the holder or find nothing to do, nothing is done twice (``watch_race.py``).

The judges are shown first what they must catch (fast); the scenario itself is slow.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.reliability.hosts import PROGRESS, Run
from tests.reliability.sizes import SIZES, Context, show
from tests.reliability.watch_race import (
    Trial,
    WatchRole,
    Work,
    find_double_work,
    judge_watch,
    watch_concurrency,
)

CI = SIZES["ci"]
U1 = "37ed2062-31c4-5889-a8cf-d7b103c0b722"
U2 = "4c1d0b6e-9a0f-5b7e-8c2d-1e2f3a4b5c6d"
LOCK = "another apply holds the lock for node race-node"


def _apply_work(label: str, line: str) -> Work:
    m = PROGRESS.match(line)
    assert m is not None, line
    return Work(label, m["kind"], m["target"], m["msg"])


def test_double_creates_are_found_in_both_output_formats() -> None:
    # apply's progress line (the message ends with the time taken) and watch's log message.
    a = _apply_work(
        "apply-a", f"  ✓   3 vgpu-create 0000:08:00.4: created NVIDIA A2-2Q {U1} (0.01 s)"
    )
    w = Work("watch", "vgpu-create", "0000:08:00.5", f"created NVIDIA A2-2Q {U1}")
    trial = Trial(0, 0, "interleaved")
    find_double_work([a, w], trial)
    assert trial.double_creates == [f"vGPU {U1} created 2 times"]
    assert not trial.errors

    # The same VF given a vGPU by two processes (different UUIDs), and an SR-IOV change done
    # twice: both are double work.
    enable = Work("apply-b", "sriov-enable", "0000:08:00.0", "enabled 16 VFs (0.1 s)")
    again = Work("watch", "sriov-enable", "0000:08:00.0", "enabled 16 VFs")
    other = Work("watch", "vgpu-create", "0000:08:00.4", f"created NVIDIA A2-2Q {U2}")
    trial = Trial(0, 0, "interleaved")
    find_double_work([a, other, enable, again], trial)
    assert trial.double_creates == ["VF 0000:08:00.4 given a vGPU 2 times"]
    assert len(trial.double_work) == 2

    # Distinct work is fine; a create message without a UUID blinds the check: an error.
    trial = Trial(0, 0, "interleaved")
    find_double_work([a, Work("watch", "vgpu-create", "0000:08:00.6", "created something")], trial)
    assert not trial.double_creates and not trial.double_work
    assert trial.errors and "no UUID" in trial.errors[0]


def _run(returncode: int | None = 0) -> Run:
    return Run(("vgpuctl", "watch"), 100, returncode, "", "", 1.0)


def _lock_line(pid: int) -> dict[str, Any]:
    return {
        "level": "warning",
        "msg": f"reconcile failed: {LOCK}: pid {pid} (vgpuctl apply d.yaml --yes); retrying in 1 s",
        "error": "lock",
    }


def test_the_watch_judge() -> None:
    done = {"msg": "done vgpu-create 0000:08:00.4: created x", "status": "done"}
    observe = {"msg": "reconcile failed: devices are changing; retrying", "error": "observe"}

    role = WatchRole()
    judge_watch([_lock_line(7), {"msg": "converged"}], [], _run(), [7, 8], role)
    assert (role.role, role.lock_retries, role.lock_retries_naming_another) == (
        "lock-conflict", 1, 1
    )  # fmt: skip
    role = WatchRole()
    judge_watch([_lock_line(9)], [], _run(), [7, 8], role)  # names no apply of the trial
    assert (role.lock_retries, role.lock_retries_naming_another) == (1, 0)
    role = WatchRole()
    judge_watch([done], [], _run(), [7, 8], role)
    assert role.role == "proceeded"
    role = WatchRole()
    judge_watch([observe], [], _run(), [7, 8], role)
    assert role.role == "failed-reconcile" and role.other_failures == {"observe": 1}
    role = WatchRole()
    judge_watch([], [], _run(), [7, 8], role)
    assert role.role == "nothing-to-do" and role.exit == "exit 0"
    role = WatchRole()
    judge_watch([done], ["Traceback (most recent call last):"], _run(), [7, 8], role)
    assert role.role == "broken"
    role = WatchRole()
    judge_watch([], [], _run(None), [7, 8], role)
    assert role.role == "broken" and role.exit == "hung"


@pytest.mark.slow
def test_a_watch_and_two_applies_one_proceeds_nothing_done_twice(ctx: Context) -> None:
    f = watch_concurrency(ctx)
    n = CI.watch_race_trials
    assert f["trials"] == n, show(f)
    assert f["trials_with_exactly_one_proceeding"] == n, show(f)
    assert f["apply_lock_conflicts_naming_the_holder"] == f["apply_lock_conflicts"], show(f)
    assert f["watch_lock_retries_naming_an_apply"] == f["watch_lock_retries"], show(f)
    assert f["watch_other_reconcile_failures"] == {}, show(f)
    assert f["broken_or_unexpected"] == 0, show(f)
    assert f["double_creates"] == 0, show(f)
    assert f["double_work"] == 0, show(f)
    assert f["host_safety_violations"] == 0, show(f)
    assert f["converged"] == n, show(f)
    assert f["watch_settled"] == n, show(f)
    assert f["watch_ready_at_end"] == n, show(f)
    assert f["watch_exit_codes"] == {"exit 0": n}, show(f)
    assert f["tracebacks"] == 0, show(f)
    # The race really happened: the lock was contended (an apply refused, or the watch retried).
    assert f["trials_with_a_lock_conflict"] >= 1, show(f)
    assert f["apply_lock_conflicts"] + f["watch_lock_retries"] >= 1, show(f)
    assert f["ok"], show(f)
