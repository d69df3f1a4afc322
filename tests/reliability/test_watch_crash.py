"""Crash safety of ``vgpuctl watch`` at the ci size, every invariant asserted (``just test``).

The full size runs in the suite; here the scenario runs small and must still hold every
invariant, and must have exercised what it is about: a watch killed in the middle of a
reconcile, and VMs holding vGPUs the desired state would remove.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.sizes import SIZES, Context
from tests.reliability.watch_crash import watch_crash_safety

CI = SIZES["ci"]
SEED = 5

pytestmark = pytest.mark.slow


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return Context(CI, seed=SEED, workdir=tmp_path, jobs=CI.jobs)


def _show(figures: dict[str, Any]) -> str:
    return json.dumps(figures, indent=1, ensure_ascii=False)[:6000]


def test_watch_killed_and_restarted_converges_and_loses_nothing(ctx: Context) -> None:
    f = watch_crash_safety(ctx)
    assert f["runs"] == CI.watch_crash_runs, _show(f)
    assert f["converged"] == f["runs"], _show(f)
    assert f["orphaned"] == 0, _show(f)
    assert f["duplicates"] == 0, _show(f)
    assert f["vfs_with_two_vgpus"] == 0, _show(f)
    assert f["dangling_mdev_links"] == 0, _show(f)
    assert f["in_use_removed"] == 0, _show(f)
    assert f["blocked_not_by_held_vgpus"] == 0, _show(f)
    assert f["metrics_inconsistent"] == 0, _show(f)
    assert f["tracebacks"] == 0, _show(f)
    assert f["hung_processes"] == 0, _show(f)
    assert f["stray_sriov_manage"] == 0, _show(f)
    assert f["unmanaged_gpus_touched"] == 0, _show(f)
    assert f["first_watch"] == {"killed": f["runs"]}, _show(f)  # never ended on its own
    assert f["sigterm_exit"] == {"exit 0": f["runs"]}, _show(f)
    assert f["restart_to_ready_s"]["max"] is not None, _show(f)
    # It tested what it is about: watch died mid-reconcile, at its start and after an edit,
    # with VMs holding vGPUs.
    assert f["kill_points"]["killed_mid_reconcile"] >= 1, _show(f)
    assert f["kill_points"]["start"]["runs"] >= 1, _show(f)
    assert f["kill_points"]["edit"]["runs"] >= 1, _show(f)
    assert f["runs_with_held_vgpus"] >= 1, _show(f)
    assert f["failures"] == [], _show(f)
    assert f["ok"], _show(f)
