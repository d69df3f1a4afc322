"""Crash safety of ``vgpuctl watch`` at the ci size, every invariant asserted (``just test``).

The full size runs in the suite; here the scenario runs small and must still hold every
invariant, and must have exercised what it is about: a watch killed in the middle of a
reconcile, and VMs holding vGPUs the desired state would remove, with KubeVirt's virt-handler
sweeping beside it and taking nothing; hosts whose vGPUs vgpuctl has no record of, on both
interfaces, and a state directory lost before the restart (issue 31).
"""

from __future__ import annotations

import pytest

from tests.reliability.sizes import SIZES, Context, show
from tests.reliability.watch_crash import watch_crash_safety

CI = SIZES["ci"]

pytestmark = pytest.mark.slow


def test_watch_killed_and_restarted_converges_and_loses_nothing(ctx: Context) -> None:
    f = watch_crash_safety(ctx)
    assert f["runs"] == CI.watch_crash_runs, show(f)
    assert f["converged"] == f["runs"], show(f)
    assert f["orphaned"] == 0, show(f)
    assert f["duplicates"] == 0, show(f)
    assert f["vfs_with_two_vgpus"] == 0, show(f)
    assert f["dangling_mdev_links"] == 0, show(f)
    assert f["in_use_removed"] == 0, show(f)
    assert f["not_converged_by_the_oracle"] == 0, show(f)
    assert f["metrics_inconsistent"] == 0, show(f)
    assert f["tracebacks"] == 0, show(f)
    assert f["hung_processes"] == 0, show(f)
    assert f["stray_sriov_manage"] == 0, show(f)
    assert f["unmanaged_gpus_touched"] == 0, show(f)
    assert f["first_watch"] == {"killed": f["runs"]}, show(f)  # never ended on its own
    assert f["sigterm_exit"] == {"exit 0": f["runs"]}, show(f)
    assert f["restart_to_ready_s"]["max"] is not None, show(f)
    # KubeVirt's virt-handler swept beside every watch (after each start, while waited on,
    # after the kill, after the restart): it took nothing.
    assert f["sweeper"]["heartbeats"] >= f["runs"] * 4, show(f)
    assert f["sweeper"]["vgpus_lost"] == 0, show(f)
    assert f["sweeper"]["in_use_removed"] == 0, show(f)
    # It tested what it is about: watch died mid-reconcile, at its start and after an edit,
    # with VMs holding vGPUs.
    assert f["kill_points"]["killed_mid_reconcile"] >= 1, show(f)
    assert f["kill_points"]["start"]["runs"] >= 1, show(f)
    assert f["kill_points"]["edit"]["runs"] >= 1, show(f)
    assert f["runs_with_held_vgpus"] >= 1, show(f)
    # ... from hosts with vGPUs vgpuctl has no record of on both interfaces (mdev ones, and
    # vfio ones at a type's maximum whose type no VF lists), and with the state directory lost
    # between the killed watch and its restart (issue 31).
    assert f["runs_with_unlisted_vfio_vgpus"] >= 1, show(f)
    assert f["runs_unrecorded_on_both_interfaces"] >= 1, show(f)
    assert f["state_dir_deleted"] >= 1, show(f)
    assert f["driver_asked_for_type_names"]["first_watch"] >= 1, show(f)  # nvidia-smi named them
    assert f["failures"] == [], show(f)
    assert f["ok"], show(f)
