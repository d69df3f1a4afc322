"""Delegate mode's planner on a node whose NVIDIA driver pod is not ready (issue 30, item 4;
docs/delegate.md): pcidevices-controller's ``manageGPU`` (pkg/controller/gpudevice/
gpu_controller.go) runs the executor's readiness check before ``sriov-manage`` and requeues
the SRIOVGPUDevice while it fails, so every step that needs its host work is blocked with that
cause, and written only once the pod is ready. Expected reasons written by hand from that
source and the hand-built pod state below."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import (
    DesiredNode,
    PciAddress,
    Plan,
    SriovGpuDeviceEnable,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
)
from reconciler.model.harvester import DriverPod, HarvesterGpu, HarvesterNode, HarvesterVf
from reconciler.model.plan_json import plan_from_json, plan_to_json
from reconciler.plan.delegate import plan_delegate
from tests.gpus import A2, CATALOG, want

NODE = "harvester-kgd9c"
POD = DriverPod("nvidia-driver-runtime-x7k2p", "phase Pending; Ready: False (ContainersNotReady)")
NOT_READY = (
    f"the NVIDIA driver pod harvester-system/nvidia-driver-runtime-x7k2p on node {NODE} is not "
    "ready (phase Pending; Ready: False (ContainersNotReady))"
)
#: The two tails of a blocked step's reason: an SRIOVGPUDevice step is gated by the readiness
#: check itself; a VGPUDevice one by the host driver the pod installs.
GATED = (
    ": pcidevices-controller waits for it before any host work (gpu_controller.go manageGPU → "
    "executor CheckReady)"
)
DRIVER_MAKES_VGPUS = (
    ": the vGPUs are made by the NVIDIA host driver it installs, and pcidevices-controller does "
    "no SR-IOV work until it is ready (gpu_controller.go manageGPU → executor CheckReady)"
)
FREE = {"NVIDIA A2-4Q": "nvidia-744", "NVIDIA A2-2Q": "nvidia-743"}


def vf(index: int, profile: str = "", *, configured: bool | None = None) -> HarvesterVf:
    address = PciAddress.parse(f"0000:08:00.{4 + index}")
    hosts = profile if configured is None or configured else ""
    return HarvesterVf(
        name=f"{NODE}-00000800{4 + index}",
        resource_version=str(100 + index),
        address=address,
        parent=A2,
        enabled=bool(profile),
        type_name=profile,
        configured=bool(hosts),
        configured_type=hosts,
        uuid="nvidia-744" if hosts else "",
        available={} if hosts else FREE,
    )


def node(*vfs: HarvesterVf, enabled: bool = True, **fields: object) -> HarvesterNode:
    gpu = HarvesterGpu(
        name=f"{NODE}-000008000",
        resource_version="7",
        address=A2,
        enabled=enabled,
        vf_addresses=tuple(v.address for v in vfs),
        vgpu_devices=tuple(v.name for v in vfs),
    )
    return replace(HarvesterNode(NODE, (gpu,), tuple(vfs)), **fields)  # type: ignore[arg-type]


def plan(observed: HarvesterNode, **wanted: object) -> Plan:
    desired = DesiredNode(NODE, (want(**wanted),))  # type: ignore[arg-type]
    return plan_delegate(desired, observed, catalog=CATALOG)


def test_the_sriov_enable_of_a_node_whose_driver_pod_is_not_ready_is_blocked() -> None:
    p = plan(node(enabled=False, driver=POD), profiles={"A2-4Q": 2})
    assert p.actions == ()
    blocked = p.blocked[0]
    assert isinstance(blocked.action, SriovGpuDeviceEnable)
    assert blocked.reason == NOT_READY + GATED
    # Any VF step planned ahead of the enable waits for the same pod.
    assert all(b.reason.startswith(NOT_READY) for b in p.blocked)
    assert p.has_changes  # not converged: assert exits 2
    assert plan_from_json(plan_to_json(p)) == p
    # Ready (no DriverPod): the same node's enable is a step to write, as before.
    step = plan(node(enabled=False), profiles={"A2-4Q": 2}).actions[0]
    assert isinstance(step, SriovGpuDeviceEnable) and step.reason == "SR-IOV is off; desired on"


def test_vgpu_steps_are_blocked_with_the_cause_and_nothing_is_written() -> None:
    p = plan(node(vf(0, "NVIDIA A2-4Q"), vf(1), driver=POD), vgpus={0: "A2-2Q"})
    assert p.actions == ()
    assert [(b.kind.value, b.target, b.reason) for b in p.blocked] == [
        ("vgpudevice-disable", f"{NODE}-000008004", NOT_READY + DRIVER_MAKES_VGPUS),
        ("vgpudevice-enable", f"{NODE}-000008004", NOT_READY + DRIVER_MAKES_VGPUS),
    ]


def test_a_pending_step_keeps_what_its_status_shows_and_gets_the_cause() -> None:
    # The spec asks 4Q, the status shows nothing: written, not carried out.
    p = plan(node(vf(0, "NVIDIA A2-4Q", configured=False), driver=POD), vgpus={0: "A2-4Q"})
    assert p.actions == ()
    (blocked,) = p.blocked
    step = blocked.action
    assert isinstance(step, VgpuDeviceEnable) and step.pending
    assert step.reason == (
        "pending: pcidevices-controller has not carried out the spec (enabled: true, "
        "vGPUTypeName: NVIDIA A2-4Q; status.vGPUStatus: empty, configureVGPUTypeName: empty, "
        f"uuid: empty); {NOT_READY}{DRIVER_MAKES_VGPUS}"
    )
    assert plan_from_json(plan_to_json(p)) == p


def test_a_step_a_vm_blocks_keeps_its_own_reason() -> None:
    observed = node(
        vf(0, "NVIDIA A2-4Q"), driver=POD, used_by={f"{NODE}-000008004": "VM default/win11"}
    )
    p = plan(observed, vgpus={})
    (blocked,) = p.blocked
    assert isinstance(blocked.action, VgpuDeviceDisable)
    assert "in use by VM default/win11" in blocked.reason
    assert "NVIDIA driver pod" not in blocked.reason


def test_driver_pods_that_could_not_be_read_are_a_note_and_block_nothing() -> None:
    note = "the NVIDIA driver pods in harvester-system could not be read (forbidden)"
    p = plan(node(vf(0), driver_notes=(note,)), vgpus={0: "A2-4Q"})
    assert [(a.kind.value, a.target) for a in p.actions] == [
        ("vgpudevice-enable", f"{NODE}-000008004")
    ]
    assert note in p.notes and p.blocked == ()
