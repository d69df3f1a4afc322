"""Faults survived under ``vgpuctl watch``, at the ci size, with the invariants asserted.

The full size is ``python -m tests.reliability.suite --only watch_faults_survived``. Here every
fault runs once and must be survived, and must really have happened to watch: the error counter
of its kind moved, the right message was logged, the kubelet really restarted and was
registered with again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.reliability.sizes import SIZES, Context, show
from tests.reliability.watch_faults import BREAKAGES, FAULTS, watch_faults_survived

CI = SIZES["ci"]

pytestmark = pytest.mark.slow


def _said(entry: dict[str, Any], fragment: str) -> bool:
    return any(fragment in m for m in entry["messages"])


def test_watch_survives_every_fault(ctx: Context) -> None:
    f = watch_faults_survived(ctx)
    for name in FAULTS:
        assert f[name]["trials"] == CI.fault_repeats, show(f)
        assert f[name]["survived"], show(f[name])
        assert f[name]["seconds_to_converge"], show(f[name])  # it converged after the fault

    deleted = f["desired_file_deleted"]
    assert deleted["errors_counted"].get("validation", 0) >= 1, show(deleted)
    assert _said(deleted, "desired.yaml: cannot read"), show(deleted)
    assert any("now invalid" in r for r in deleted["readyz_under_the_fault"]), show(deleted)

    invalid = f["desired_file_invalid"]
    tried = len(BREAKAGES) * CI.fault_repeats
    assert sum(invalid["variants"].values()) == tried, show(invalid)
    assert invalid["errors_counted"].get("validation", 0) >= tried, show(invalid)
    assert _said(invalid, "desired.yaml:21:11: "), show(invalid)  # file:line:column

    for name in ("sysfs_unreadable_while_idle", "sysfs_unreadable_mid_reconcile"):
        entry = f[name]
        assert sum(entry["errors_counted"].values()) >= 1, show(entry)
        assert _said(entry, "reconcile failed: "), show(entry)
        assert entry["readyz_under_the_fault"], show(entry)
    assert _said(f["sysfs_unreadable_while_idle"], "sysfs root <dir>/host/sys does not exist")

    api = f["api_server_down_then_back"]
    assert api["errors_counted"].get("cluster", 0) >= 1, show(api)
    assert _said(api, "cannot reach the Kubernetes API server"), show(api)

    hang = f["sriov_manage_hangs_past_timeout"]
    assert hang["errors_counted"].get("apply", 0) >= 1, show(hang)
    assert _said(hang, "did not finish within 2 s"), show(hang)  # --timeout 2, not 30

    kubelet = f["kubelet_restart"]
    assert len(kubelet["reregistration_seconds"]) == CI.fault_repeats, show(kubelet)
    assert kubelet["registrations_per_plugin_after_restart"], show(kubelet)
    assert not kubelet["errors_counted"], show(kubelet)

    assert not f["budget_exceeded"], show(f)
    assert f["ok"], show(f)
