"""Issue 30, items 2 and 6, end to end against the pcidevices-controller double
(``tests/doubles/pcidevices.py``) on a simulated A2: a type change the controller ignores, and
vgpuctl's spec patch racing the controller's status write.

pcidevices (bdd8025) pkg/controller/gpudevice/vgpu_controller.go ``OnVGPUChange``: ``enableVGPU``
runs only when ``spec.enabled`` and sysfs shows no vGPU on the VF, ``disableVGPU`` only when
``spec.enabled`` is false and sysfs shows one; otherwise the status alone is refreshed. So a
``vGPUTypeName`` written over an enabled VF's vGPU (Harvester's UI, kubectl) is never carried
out. Expected values from the seed (4A, 4Q, 4A, 4Q on VFs 0-3, functions 4-7) and the A2's type
ids (docs/domain.md §4: 4Q is 746, 4A 751); the host is judged from its own files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from reconciler.apply.delegate import DelegateExecutor
from reconciler.apply.executor import OutcomeStatus
from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.engine.delegate import plan_all
from reconciler.kube import connect
from reconciler.model.record import replace
from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.pcidevices import VGPUS
from tests.harvester_node import NODE, SEED, VFS, Cluster, harvester_node, layout, vm_holds

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)

#: VF 1 (function 5): the seed's 4Q.
VF1 = f"{NODE}-000008005"
IGNORED = "pcidevices-controller ignores a type change on an enabled VGPUDevice"


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path) as cluster:
        yield cluster


def _set_type(cluster: Cluster, name: str, type_name: str) -> None:
    """A direct spec edit of the type alone, as Harvester's UI or kubectl makes it (a merge
    patch: vgpuctl writes JSON patches only, so it is not counted as vgpuctl's)."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            *VGPUS, name, {"spec": {"vGPUTypeName": type_name}}
        )
    finally:
        api.close()
    cluster.ctl.run_until_idle()


def _spec(cluster: Cluster, name: str) -> dict[str, Any]:
    found = cluster.emu.get_object(*VGPUS, name)
    assert found is not None
    return dict(found["spec"])


def _patches(emu: ApiServerEmulator, name: str) -> int:
    """How many JSON patches of the VGPUDevice ``name`` the API server received (vgpuctl's)."""
    return sum(1 for r, _ in emu.patches if r.resource == "vgpudevices" and r.name == name)


def _desired(tmp_path: Path, vf1: str) -> Path:
    return layout(tmp_path, {VFS[0]: "NVIDIA A2-4A", VFS[1]: vf1, VFS[2]: "NVIDIA A2-4A",
                             VFS[3]: "NVIDIA A2-4Q"})  # fmt: skip


def test_an_ignored_type_change_is_carried_out_as_a_disable_then_an_enable(
    harvester: Cluster, tmp_path: Path
) -> None:
    harvester.ok("apply", SEED, "--yes")
    _set_type(harvester, VF1, "NVIDIA A2-4A")  # the controller ignores it: the 4Q stays
    assert harvester.types()[VFS[1]] == "746"
    want_4a = _desired(tmp_path, "NVIDIA A2-4A")
    doc = json.loads(harvester.ok("plan", want_4a, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    assert [(a["kind"], a["target"], a["type"]) for a in node_plan["actions"]] == [
        ("vgpudevice-disable", VF1, "NVIDIA A2-4Q"),
        ("vgpudevice-enable", VF1, "NVIDIA A2-4A"),
    ]
    assert not any(a.get("pending") for a in node_plan["actions"])
    for action in node_plan["actions"]:
        assert IGNORED in action["reason"]
    shown = harvester.ok("plan", want_4a).stdout
    assert f"-/+ vgpu {VFS[1]}  NVIDIA A2-4Q → NVIDIA A2-4A  (VGPUDevice {VF1})" in shown
    before = _patches(harvester.emu, VF1)
    harvester.ok("apply", want_4a, "--yes")
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "751", VFS[2]: "751", VFS[3]: "746"}
    assert _patches(harvester.emu, VF1) == before + 2  # the disable and the enable, once each
    assert harvester.run("assert", want_4a).returncode == 0
    assert harvester.ctl.errors == []


def test_an_ignored_type_change_on_a_vf_a_vm_uses_is_blocked_naming_the_vm(
    harvester: Cluster, tmp_path: Path
) -> None:
    harvester.ok("apply", SEED, "--yes")
    assert vm_holds(harvester, VFS[1]) == VF1
    _set_type(harvester, VF1, "NVIDIA A2-4A")
    want_4a = _desired(tmp_path, "NVIDIA A2-4A")
    doc = json.loads(harvester.ok("plan", want_4a, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    assert node_plan["actions"] == []
    assert [(b["kind"], b["target"]) for b in node_plan["blocked"]] == [
        ("vgpudevice-disable", VF1),
        ("vgpudevice-enable", VF1),
    ]
    assert "in use by VM default/win11" in node_plan["blocked"][0]["reason"]
    assert IGNORED in node_plan["blocked"][0]["reason"]
    before = _patches(harvester.emu, VF1)
    res = harvester.run("apply", want_4a, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert harvester.types()[VFS[1]] == "746"  # still its 4Q
    assert _patches(harvester.emu, VF1) == before


def test_an_ignored_type_change_over_the_desired_profile_is_set_back_even_in_use(
    harvester: Cluster,
) -> None:
    harvester.ok("apply", SEED, "--yes")
    vm_holds(harvester, VFS[1])
    _set_type(harvester, VF1, "NVIDIA A2-4A")  # the seed wants the 4Q VF 1 hosts
    writes = harvester.host.stats()["writes"]
    doc = json.loads(harvester.ok("plan", SEED, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    assert node_plan["blocked"] == []
    (action,) = node_plan["actions"]
    assert (action["kind"], action["target"], action["type"], action["replaces"]) == (
        "vgpudevice-enable",
        VF1,
        "NVIDIA A2-4Q",
        "NVIDIA A2-4A",
    )
    assert IGNORED in action["reason"]
    res = harvester.run("assert", SEED)
    assert res.returncode == 2, res.stdout + res.stderr  # not converged: the spec differs
    before = _patches(harvester.emu, VF1)
    harvester.ok("apply", SEED, "--yes")
    assert _spec(harvester, VF1)["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert _spec(harvester, VF1)["enabled"] is True
    assert _patches(harvester.emu, VF1) == before + 1
    # No vGPU touched: the host saw no write, the VM's 4Q is there.
    assert harvester.host.stats()["writes"] == writes
    assert harvester.types()[VFS[1]] == "746"
    assert harvester.run("assert", SEED).returncode == 0


def test_a_spec_patch_racing_the_controllers_status_write_is_kept_and_written_once(
    harvester: Cluster, tmp_path: Path
) -> None:
    """Item 6: pcidevices' handlers write with ``UpdateStatus`` over the object their informer
    delivered (its resourceVersion); lasso's ``syncHandler`` (rancher/lasso
    pkg/controller/controller.go) takes it from the informer's store. Once VF 0's vGPU is made,
    ``reconcileDisabledVGPUStatus`` enqueues its disabled siblings, VF 1 among them, to narrow
    their ``availableTypes``. vgpuctl's enable of VF 1 lands before that handler runs and
    before the informer has delivered it: the handler's status write, over the older object, is
    a 409 Conflict (requeued, not logged: lasso ``processNextWorkItem``); vgpuctl's spec is
    kept, the delivered change is carried out, and vgpuctl wrote it once.

    The two enables are run as two plans, one after the other (as two runs of apply would):
    in one plan they go out together (issue 33), VF 1's before VF 0's vGPU is made, and the
    race is then of another shape."""
    sriov_on = layout(tmp_path, {})
    harvester.ok("apply", sriov_on, "--yes")  # SR-IOV on, the 16 VGPUDevices made
    ctl = harvester.ctl
    ctl.stop()  # driven step by step from here, by vgpuctl's own waits
    ctl.run_until_idle()
    both = layout(tmp_path, {VFS[0]: "NVIDIA A2-4Q", VFS[1]: "NVIDIA A2-4Q"})
    catalog = default_catalog()
    api = connect(harvester.kubeconfig)
    planned = plan_all(load_desired([both], catalog=catalog), api, catalog)
    (plan,) = planned.plans
    assert [(a.kind.value, a.target) for a in plan.actions] == [
        ("vgpudevice-enable", f"{NODE}-000008004"),
        ("vgpudevice-enable", VF1),
    ]
    raced: list[str] = []

    def controller_works(_seconds: float) -> None:
        """One key of the controller per pause of vgpuctl's waits; the first time vgpuctl's
        enable of VF 1 is stored, the controller handles the key it has queued for VF 1
        before its informer delivers that change."""
        stored = harvester.emu.get_object(*VGPUS, VF1)
        assert stored is not None
        if stored["spec"]["enabled"] and not raced:
            raced.append(VF1)
            ctl.informer_lag = 600.0
            assert ctl.reconcile_once() == f"vgpudevices/{VF1}"
            ctl.informer_lag = 0.0
        ctl.reconcile_once()

    executor = DelegateExecutor(
        api, used_by=lambda: {}, timeout=60, poll=0.05, sleep=controller_works
    )
    outcomes = [
        o for step in plan.actions for o in executor.run(replace(plan, actions=(step,))).outcomes
    ]
    assert [o.status for o in outcomes] == [OutcomeStatus.DONE, OutcomeStatus.DONE]
    assert raced == [VF1]
    assert ctl.conflicts == [f"vgpudevices/{VF1}"]
    assert ctl.errors == []
    assert _spec(harvester, VF1)["enabled"] is True
    assert _spec(harvester, VF1)["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert _patches(harvester.emu, VF1) == 1
    assert harvester.types() == {VFS[0]: "746", VFS[1]: "746"}
    ctl.retry()  # the rate limiter's delay elapsed: the conflicted key again, on the new object
    ctl.run_until_idle()
    assert ctl.errors == []
    again = plan_all(load_desired([both], catalog=catalog), api, catalog)
    assert again.plans[0].actions == () and again.plans[0].blocked == ()
    assert _patches(harvester.emu, VF1) == 1
