"""Delegate mode's executor (``apply/delegate.py``) when a wait runs out while the node's NVIDIA
driver pod is not ready (issue 30, item 4): the message names the pod (read again then), not
the node resync nor the controller's log. The controller never acts here (a stalled one: its
readiness check fails, gpu_controller.go manageGPU → executor CheckReady)."""

from __future__ import annotations

from reconciler.apply.delegate import DelegateExecutor
from reconciler.apply.executor import OutcomeStatus
from reconciler.model import ClusterUnavailableError, Observation, Plan, SriovGpuDeviceEnable
from reconciler.model.harvester import DriverPod
from tests.doubles.cluster import FakeCluster
from tests.harvester_objects import GPU, NODE, enable, vf_object

POD = DriverPod("nvidia-driver-runtime-x7k2p", "phase Running; Ready: False (ContainersNotReady)")
NOT_READY = (
    f"the NVIDIA driver pod harvester-system/nvidia-driver-runtime-x7k2p on node {NODE} is not "
    "ready (phase Running; Ready: False (ContainersNotReady))"
)


def stalled(api: FakeCluster, step: object, driver: object) -> str:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    executor = DelegateExecutor(
        api,
        used_by=dict,
        timeout=30,
        poll=1,
        clock=lambda: now[0],
        sleep=sleep,
        driver=driver,  # type: ignore[arg-type]
    )
    plan = Plan(NODE, "harvester", Observation("sha256:x"), actions=(step.numbered(1),))  # type: ignore[attr-defined]
    (outcome,) = executor.run(plan).outcomes
    assert outcome.status is OutcomeStatus.FAILED
    return outcome.message


def gpu_api() -> FakeCluster:
    api = FakeCluster()
    api.seed(
        "sriovgpudevices",
        [{"metadata": {"name": f"{NODE}-000008000", "labels": {"nodename": NODE}},
          "spec": {"address": str(GPU), "nodeName": NODE, "enabled": False}}],
    )  # fmt: skip
    return api


GPU_ENABLE = SriovGpuDeviceEnable(
    target=f"{NODE}-000008000", reason="r", node=NODE, gpu=GPU, resource_version="1"
)


def test_a_gpu_enable_that_times_out_names_the_driver_pod_not_the_resync() -> None:
    message = stalled(gpu_api(), GPU_ENABLE, lambda: POD)
    assert message == (
        f"pcidevices-controller made no VGPUDevices for {NODE}-000008000 within 30 s (VFs: 0, "
        f"VGPUDevices listed: 0): {NOT_READY}: pcidevices-controller waits for it before any "
        "host work (gpu_controller.go manageGPU → executor CheckReady)"
    )
    # The pod ready (or none) when the wait ends: the message is the one it always was.
    assert stalled(gpu_api(), GPU_ENABLE, lambda: None).endswith(
        "(VFs: 0, VGPUDevices listed: 0; it makes them at a node resync)"
    )


def test_a_vf_enable_that_times_out_names_the_driver_pod_instead_of_the_log() -> None:
    api = FakeCluster()
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    message = stalled(api, enable("NVIDIA A2-4Q"), lambda: POD)
    assert message == (
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4Q on "
        f"{NODE}-000008004 after 30 s (spec.enabled: true; status.vGPUStatus: empty, "
        f"configureVGPUTypeName: empty, uuid: empty); {NOT_READY}: the vGPUs are made by the "
        "NVIDIA host driver it installs, and pcidevices-controller does no SR-IOV work until it "
        "is ready (gpu_controller.go manageGPU → executor CheckReady)"
    )


def test_a_driver_pod_that_cannot_be_read_then_leaves_the_timeout_as_it_was() -> None:
    def down() -> DriverPod:
        raise ClusterUnavailableError("cannot reach the Kubernetes API server")

    assert stalled(gpu_api(), GPU_ENABLE, down).endswith("it makes them at a node resync)")
