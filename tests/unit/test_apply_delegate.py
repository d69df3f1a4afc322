"""Delegate mode's executor (``apply/delegate.py``) against the in-memory ClusterApi, with a
scripted stand-in for pcidevices-controller that acts between polls the way docs/domain.md §6
says the real one does: it configures an enabled VGPUDevice's vGPU, clears ``vGPUStatus`` of a
disabled one in one status write and refreshes ``availableTypes`` in a later one, and lists a
GPU's VFs and VGPUDevices once it is enabled. (The faithful double of the controller, with its
webhook, drives the end-to-end tests.)"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import Any

from reconciler.apply.delegate import DelegateExecutor, poll_delays
from reconciler.apply.executor import OutcomeStatus
from reconciler.model import (
    Action,
    Observation,
    Plan,
    SriovGpuDeviceEnable,
)
from tests.doubles.cluster import FakeCluster
from tests.harvester_objects import GPU, NODE, TYPES, VF0, disable, enable, vf_object


class Controller:
    """What pcidevices-controller does between two of our polls (one change per tick)."""

    def __init__(self, api: FakeCluster, *, stalls: bool = False) -> None:
        self.api = api
        self.ticks = 0
        self.stalls = stalls

    def tick(self, _seconds: float) -> None:
        self.ticks += 1
        if self.stalls:
            return
        for (plural, ns, _), obj in list(self.api.store.items()):
            status = obj.setdefault("status", {})
            if plural == "vgpudevices":
                spec = obj["spec"]
                if spec["enabled"] and status.get("vGPUStatus") != "vGPUConfigured":
                    status.clear()
                    status.update(vGPUStatus="vGPUConfigured", uuid=TYPES[spec["vGPUTypeName"]],
                                  configureVGPUTypeName=spec["vGPUTypeName"])  # fmt: skip
                elif not spec["enabled"] and status.get("vGPUStatus"):
                    status.clear()  # first status write: vGPUStatus cleared
                elif not spec["enabled"] and not status.get("availableTypes"):
                    status["availableTypes"] = dict(TYPES)  # a later one: the types
                else:
                    continue
                self.api.put(plural, obj, ns)
                return
            if plural == "sriovgpudevices" and obj["spec"]["enabled"] and not status:
                status.update(vfAddresses=[str(VF0)], vGPUDevices=[f"{NODE}-000008004"])
                self.api.put(plural, obj, ns)
                return
            if (
                plural == "sriovgpudevices"
                and status
                and ("vgpudevices", None, f"{NODE}-000008004") not in self.api.store
            ):
                # The object itself comes at a later node resync than the status list.
                self.api.put("vgpudevices", vf_object(False, "", configured=False))
                return


def run(api: FakeCluster, *actions: Action, stalls: bool = False, used: str | None = None) -> Any:
    controller = Controller(api, stalls=stalls)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        controller.tick(seconds)

    executor = DelegateExecutor(
        api,
        used_by=lambda: {} if used is None else {f"{NODE}-000008004": used},
        timeout=30,
        poll=1,
        clock=lambda: now[0],
        sleep=sleep,
    )
    numbered = tuple(a.numbered(i) for i, a in enumerate(actions, start=1))
    return executor.run(Plan(NODE, "harvester", Observation("sha256:x"), actions=numbered)), api


def stored(api: FakeCluster, plural: str, name: str) -> dict[str, Any]:
    return api.store[(plural, None, name)]


def test_an_enable_is_one_patch_then_waits_for_the_controller() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    result, _ = run(api, enable("NVIDIA A2-4Q"))
    assert [o.status for o in result.outcomes] == [OutcomeStatus.DONE]
    assert api.patches == [
        [
            {"op": "test", "path": "/spec/enabled", "value": False},
            {"op": "add", "path": "/spec/vGPUTypeName", "value": "NVIDIA A2-4Q"},
            {"op": "replace", "path": "/spec/enabled", "value": True},
        ]
    ]
    status = stored(api, "vgpudevices", f"{NODE}-000008004")["status"]
    assert status == {
        "vGPUStatus": "vGPUConfigured",
        "configureVGPUTypeName": "NVIDIA A2-4Q",
        "uuid": "nvidia-744",
    }


def test_a_profile_change_waits_for_the_types_before_enabling_again() -> None:
    # Disable, then the controller clears vGPUStatus and only a tick later lists the types:
    # the enable is written only then (the webhook checks the old object's availableTypes).
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(True, "NVIDIA A2-4Q", configured=True)])
    result, _ = run(
        api, disable("NVIDIA A2-4Q", "NVIDIA A2-2Q"), enable("NVIDIA A2-2Q", "NVIDIA A2-4Q")
    )
    assert [o.status for o in result.outcomes] == [OutcomeStatus.DONE, OutcomeStatus.DONE]
    assert [op[-1]["value"] for op in api.patches] == [False, True]
    assert stored(api, "vgpudevices", f"{NODE}-000008004")["status"] == {
        "vGPUStatus": "vGPUConfigured",
        "configureVGPUTypeName": "NVIDIA A2-2Q",
        "uuid": "nvidia-743",
    }


def test_a_step_already_in_effect_is_a_noop_and_writes_nothing() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(True, "NVIDIA A2-4Q", configured=True)])
    result, _ = run(api, enable("NVIDIA A2-4Q"))
    assert [o.status for o in result.outcomes] == [OutcomeStatus.NOOP]
    assert api.patches == []


def test_a_vf_in_use_now_is_not_disabled_and_the_run_stops() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(True, "NVIDIA A2-4Q", configured=True)])
    result, _ = run(
        api,
        disable("NVIDIA A2-4Q", "NVIDIA A2-2Q"),
        enable("NVIDIA A2-2Q", "NVIDIA A2-4Q"),
        used="VM default/win11",
    )
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.message == f"{NODE}-000008004 is in use by VM default/win11 now: not disabled"
    assert len(result.not_run) == 1 and api.patches == []


def test_a_controller_that_never_acts_fails_the_step_when_the_wait_runs_out() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    result, _ = run(api, enable("NVIDIA A2-4Q"), stalls=True)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert outcome.message == (
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4Q on "
        f"{NODE}-000008004 after 30 s (spec.enabled: true; status.vGPUStatus: empty, "
        "configureVGPUTypeName: empty, uuid: empty); pcidevices-controller writes no Events or "
        "conditions: its log names the error"
    )


def test_a_profile_the_vf_does_not_offer_is_never_written() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    result, _ = run(api, enable("NVIDIA A2-16Q"))
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED
    assert "never offered NVIDIA A2-16Q within 30 s" in outcome.message
    assert api.patches == []


def test_an_object_edited_since_the_plan_is_a_conflict() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(True, "NVIDIA A2-2Q", configured=False)])
    result, _ = run(api, enable("NVIDIA A2-4Q"))
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED
    assert "run plan again" in outcome.message and api.patches == []


def test_a_gpu_enable_waits_until_its_vgpudevices_exist() -> None:
    api = FakeCluster()
    api.seed(
        "sriovgpudevices",
        [{"metadata": {"name": f"{NODE}-000008000", "labels": {"nodename": NODE}},
          "spec": {"address": str(GPU), "nodeName": NODE, "enabled": False}}],
    )  # fmt: skip
    step = SriovGpuDeviceEnable(
        target=f"{NODE}-000008000", reason="r", node=NODE, gpu=GPU, resource_version="1"
    )
    result, _ = run(api, step)
    assert [(o.status, o.message) for o in result.outcomes] == [
        (OutcomeStatus.DONE, "enabled (1 VGPUDevices)")
    ]
    assert ("vgpudevices", None, f"{NODE}-000008004") in api.store
    # A controller that lists them but never makes them: the step fails when the wait ends.
    stalled = FakeCluster()
    stalled.seed("sriovgpudevices", [api.store[("sriovgpudevices", None, f"{NODE}-000008000")]])
    stalled.store[("sriovgpudevices", None, f"{NODE}-000008000")]["spec"]["enabled"] = False
    result, _ = run(stalled, step, stalls=True)
    assert [o.status for o in result.outcomes] == [OutcomeStatus.FAILED]


def test_a_wait_reads_again_soon_then_once_a_poll() -> None:
    # The controller often answers within a fraction of a second: the first reads come after
    # 50 ms, doubling up to the poll, so a wait neither costs a whole second nor hammers.
    assert list(islice(poll_delays(1.0), 7)) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert list(islice(poll_delays(0.01), 3)) == [0.01, 0.01, 0.01]


def test_an_enable_written_before_is_waited_for_again_never_written_twice() -> None:
    # Issue 30, item 1: an earlier run's enable that pcidevices-controller has not carried
    # out (spec enabled: true, no status): the step waits for the status, writes nothing.
    api = FakeCluster()
    obj = vf_object(True, "NVIDIA A2-4Q", configured=False)
    api.seed("vgpudevices", [obj])
    result, _ = run(api, replace(enable("NVIDIA A2-4Q"), pending=True), stalls=True)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert outcome.message.startswith(
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4Q on {NODE}-000008004"
        " after 30 s (spec.enabled: true; status.vGPUStatus: empty"
    )
    assert api.patches == []
    # The controller carries it out: done, still without a write.
    result, _ = run(api, replace(enable("NVIDIA A2-4Q"), pending=True))
    assert [o.status for o in result.outcomes] == [OutcomeStatus.DONE]
    assert api.patches == []


def test_a_configured_status_without_a_uuid_is_not_a_done_enable() -> None:
    api = FakeCluster()
    obj = vf_object(True, "NVIDIA A2-4Q", configured=True)
    del obj["status"]["uuid"]
    api.seed("vgpudevices", [obj])
    result, _ = run(api, enable("NVIDIA A2-4Q"), stalls=True)
    assert [o.status for o in result.outcomes] == [OutcomeStatus.FAILED]
    assert api.patches == []


# --- issue 30, item 3: steps planned ahead, on objects not made yet -------------------------


def ahead(type_name: str) -> Action:
    """VF 0's enable as planned while its GPU's SR-IOV was off: its object not made yet."""
    return replace(enable(type_name), resource_version="", object_exists=False)


def gpu_object(enabled: bool, vfs: list[str] | None = None) -> dict[str, Any]:
    """The A2's SRIOVGPUDevice; ``vfs``: the VF addresses its status lists (and their names)."""
    status = (
        {"vfAddresses": vfs, "vGPUDevices": [f"{NODE}-0000{a[5:7]}{a[8:10]}{a[11]}" for a in vfs]}
        if vfs
        else {}
    )
    return {
        "metadata": {"name": f"{NODE}-000008000", "labels": {"nodename": NODE}},
        "spec": {"address": str(GPU), "nodeName": NODE, "enabled": enabled},
        "status": status,
    }


def test_a_step_planned_ahead_waits_for_its_object_then_enables_it() -> None:
    api = FakeCluster()
    api.seed("sriovgpudevices", [gpu_object(False)])
    gpu = SriovGpuDeviceEnable(
        target=f"{NODE}-000008000", reason="r", node=NODE, gpu=GPU, resource_version="1"
    )
    result, _ = run(api, gpu, ahead("NVIDIA A2-4Q"))
    assert [o.status for o in result.outcomes] == [OutcomeStatus.DONE, OutcomeStatus.DONE]
    assert [op[-1] for op in api.patches] == [
        {"op": "replace", "path": "/spec/enabled", "value": True},  # the GPU
        {"op": "replace", "path": "/spec/enabled", "value": True},  # its VF 0, once made
    ]
    assert stored(api, "vgpudevices", f"{NODE}-000008004")["status"]["uuid"] == "nvidia-744"


def test_a_step_planned_ahead_whose_object_was_made_under_another_name_writes_nothing() -> None:
    # The GPU's VFs came at function 0 of slot 1 (an SR-IOV VF offset of 8, not 4): the
    # controller made n1-000008010, never the predicted n1-000008004.
    api = FakeCluster()
    other = vf_object(False, "", configured=False)
    other["metadata"]["name"] = f"{NODE}-000008010"
    other["spec"]["address"] = "0000:08:01.0"
    api.seed("sriovgpudevices", [gpu_object(True, ["0000:08:01.0", "0000:08:01.1"])])
    api.seed("vgpudevices", [other])
    result, _ = run(api, ahead("NVIDIA A2-4Q"), stalls=True)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.message == (
        f"the plan predicted VGPUDevice {NODE}-000008004 for VF 0000:08:00.4 (VF 0 of GPU "
        "0000:08:00.0, from the catalogue's VF offset and stride), but pcidevices-controller "
        f"made other VGPUDevices: {NODE}-000008010, {NODE}-000008011 (status.vGPUDevices of "
        f"{NODE}-000008000); nothing was written to it: run plan again, which plans from the "
        "objects made"
    )
    assert api.patches == []


def test_a_step_planned_ahead_whose_object_is_another_vf_index_writes_nothing() -> None:
    # An SR-IOV VF offset of 2: 0000:08:00.4 exists, but as VF 2, so a plan made for VF 0
    # (the count form, an index key) would put the profile on another VF than planned.
    api = FakeCluster()
    api.seed("sriovgpudevices", [gpu_object(True, ["0000:08:00.2", "0000:08:00.3", str(VF0)])])
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    result, _ = run(api, ahead("NVIDIA A2-4Q"), stalls=True)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED
    assert (
        "but the object made is VF 0000:08:00.4 of GPU 0000:08:00.0 (VF 2 of "
        f"{NODE}-000008000's 3, first 0000:08:00.2)"
    ) in outcome.message
    assert api.patches == []


def test_a_step_planned_ahead_whose_object_never_comes_fails_when_the_wait_ends() -> None:
    api = FakeCluster()
    api.seed("sriovgpudevices", [gpu_object(True)])
    result, _ = run(api, ahead("NVIDIA A2-4Q"), stalls=True)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert outcome.message == (
        f"pcidevices-controller made no VGPUDevice {NODE}-000008004 (VF 0000:08:00.4) within "
        f"30 s (status.vGPUDevices of {NODE}-000008000: none yet)"
    )
    assert api.patches == []
