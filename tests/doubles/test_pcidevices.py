"""The pcidevices-controller double (``pcidevices.py``) does what harvester/pcidevices (bdd8025)
does, on a simulated A2 with the vendor-specific VFIO interface, through the real client.

Expected values are written out from the Go code and docs/domain.md: object names
``<node>-<address without ':' and '.'>`` (pcidevice.go ``PCIDeviceNameForHostname``), the A2's
VFs at function 4 onwards (docs/domain.md §1: ``sriov_offset`` 4, 16 VFs) and its type ids 742–756
(§4), ``status.uuid`` = the type id (vgpu_controller.go ``enableVGPU``), the webhook's messages
(pkg/webhook/vgpu.go, sriovgpudevices.go) behind the API server's ``admission webhook "…"
denied the request: `` as a 500 (harvester's AdmissionHandler: a plain error is an internal
error).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from reconciler.sim import SimHost, build_host
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.doubles.pcidevices import (
    MIGCONFIGURATIONS,
    NODES,
    PCIDEVICECLAIMS,
    PCIDEVICES,
    SRIOVGPUS,
    VGPUS,
    VMS,
    PciDevicesController,
    driver_pod,
    install,
    node_object,
    vm,
)

# The client is only partly typed: its entry points are used as Any.
new_client_from_config: Any = config.new_client_from_config
CRD_SETS = ("harvester",)  # tests/conftest.py: the ``emu`` fixture serves Harvester's CRDs

NODE = "harvester-kgd9c"
GPU = f"{NODE}-000008000"
VF_ADDRESSES = [
    *(f"0000:08:00.{f}" for f in range(4, 8)),
    *(f"0000:08:01.{f}" for f in range(8)),
    *(f"0000:08:02.{f}" for f in range(4)),
]
VGPU_NAMES = [
    *(f"{NODE}-00000800{f}" for f in range(4, 8)),
    *(f"{NODE}-00000801{f}" for f in range(8)),
    *(f"{NODE}-00000802{f}" for f in range(4)),
]
VF4, VF5 = VGPU_NAMES[0], VGPU_NAMES[1]
#: The same VFs in the order of their ``virtfn<N>`` links as text (common.go ``GetVFList``
#: globs them: virtfn0, virtfn1, virtfn10, …, virtfn15, virtfn2, …; docs/domain.md §1).
GLOB_ORDER = [0, 1, *range(10, 16), *range(2, 10)]
#: Every A2 type a VF lists while its GPU hosts no vGPU (name → id).
ALL_TYPES = {
    "NVIDIA A2-1B": "742",
    "NVIDIA A2-2B": "743",
    "NVIDIA A2-1Q": "744",
    "NVIDIA A2-2Q": "745",
    "NVIDIA A2-4Q": "746",
    "NVIDIA A2-8Q": "747",
    "NVIDIA A2-16Q": "748",
    "NVIDIA A2-1A": "749",
    "NVIDIA A2-2A": "750",
    "NVIDIA A2-4A": "751",
    "NVIDIA A2-8A": "752",
    "NVIDIA A2-16A": "753",
    "NVIDIA A2-4C": "754",
    "NVIDIA A2-8C": "755",
    "NVIDIA A2-16C": "756",
}
#: What a free VF lists once one 4 GB vGPU exists (equal-size mode, docs/domain.md §4).
FOUR_GB_TYPES = {"NVIDIA A2-4Q": "746", "NVIDIA A2-4A": "751", "NVIDIA A2-4C": "754"}
DENIED = 'admission webhook "pcidevices.harvesterhci.io" denied the request: '
SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"


@dataclass
class Harvester:
    emu: ApiServerEmulator
    host: SimHost
    ctl: PciDevicesController
    custom: Any

    def vf_file(self, address: str, name: str) -> str:
        return (self.host.sysfs_root / "bus/pci/devices" / address / "nvidia" / name).read_text()

    def stored(self, res: tuple[str, str, str], name: str) -> dict[str, Any]:
        found = self.emu.get_object(*res, name)
        assert found is not None, name
        return found

    def patch(self, res: tuple[str, str, str], name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(*res, name, {"spec": spec})

    def refused(self, call: Any, *args: Any) -> tuple[int, str, str]:
        """(status code, reason, message) of a request the API server refuses."""
        with pytest.raises(client.ApiException) as caught:
            call(*args)
        body = json.loads(caught.value.body or "{}")
        return caught.value.status, body.get("reason", ""), body["message"]


def a2_host(directory: Path, *, interface: str = "vfio", sriov: str = "disabled") -> SimHost:
    spec = {"model": "A2", "address": "0000:08:00.0", "interface": interface, "sriov": sriov}
    return build_host(directory, {"gpus": [spec]})


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Harvester]:
    """A node with one A2 (SR-IOV off) whose double has run its first resync."""
    install(emu)
    emu.seed(node_object(NODE))
    host = a2_host(tmp_path / "host")
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    api = new_client_from_config(config_file=str(kubeconfig))
    with PciDevicesController(emu, host, NODE, kubeconfig) as ctl:
        ctl.resync()
        ctl.run_until_idle()
        yield Harvester(emu, host, ctl, client.CustomObjectsApi(api))
    api.close()


@pytest.fixture
def enabled(harvester: Harvester) -> Harvester:
    """The A2 enabled, its VGPUDevices created and their status written."""
    harvester.patch(SRIOVGPUS, GPU, {"enabled": True})
    harvester.ctl.run_until_idle()
    harvester.ctl.resync()
    harvester.ctl.run_until_idle()
    return harvester


@pytest.fixture
def configured(enabled: Harvester) -> Harvester:
    """An A2-4Q on the first VF, as the UI enables one."""
    enabled.patch(VGPUS, VF4, {"enabled": True, "vGPUTypeName": "NVIDIA A2-4Q"})
    enabled.ctl.run_until_idle()
    assert enabled.ctl.errors == []
    return enabled


def step_until(ctl: PciDevicesController, key: str) -> list[str]:
    """Worker steps up to and including the one that handles ``key``."""
    handled: list[str] = []
    for _ in range(100):
        done = ctl.reconcile_once()
        assert done is not None, f"idle before {key} was handled: {handled}"
        handled.append(done)
        if done == key:
            return handled
    raise AssertionError(f"{key} never handled: {handled}")


def writes_since(emu: ApiServerEmulator, start: int) -> list[Request]:
    return [r for r in emu.requests[start:] if r.verb in ("create", "update", "delete")]


# --- GPUs -------------------------------------------------------------------------------------


def test_the_first_resync_creates_the_gpu_disabled_and_labels_the_node(
    harvester: Harvester,
) -> None:
    gpu = harvester.stored(SRIOVGPUS, GPU)
    assert gpu["metadata"]["labels"] == {"nodename": NODE}
    assert gpu["spec"] == {"address": "0000:08:00.0", "nodeName": NODE, "enabled": False}
    assert gpu.get("status", {}) == {}  # no VFs: both lists omitted
    assert harvester.emu.objects(*VGPUS) == []
    # checkAndUpdateNodeLabels (node_controller.go) lists SRIOVGPUDevices from the informer's
    # cache: the GPU created moments before in the same resync may not be there yet (a busy
    # machine), and then the label comes with the next resync, as in Harvester.
    harvester.ctl.resync()
    node = harvester.stored(NODES, NODE)
    assert node["metadata"]["labels"] == {"sriovgpu.harvesterhci.io/driver-needed": "true"}
    # A PCIDevice per device but the root ports (PCI bridges, class 0604).
    pf = harvester.stored(PCIDEVICES, GPU)
    assert pf["metadata"]["labels"] == {"nodename": NODE}
    assert pf["status"]["address"] == "0000:08:00.0"
    assert (pf["status"]["vendorId"], pf["status"]["deviceId"]) == ("10de", "25b6")
    assert pf["status"]["kernelDriverInUse"] == "nvidia"
    assert harvester.emu.get_object(*PCIDEVICES, f"{NODE}-000001000") is None
    assert harvester.ctl.errors == []


def test_enabling_a_gpu_runs_sriov_manage_and_its_vgpu_devices_come_with_the_resync(
    harvester: Harvester,
) -> None:
    harvester.patch(SRIOVGPUS, GPU, {"enabled": True})
    assert harvester.ctl.run_until_idle() == [f"sriovgpudevices/{GPU}"] * 2
    assert harvester.ctl.sriov_manage_calls == [[SRIOV_MANAGE, "-e", "0000:08:00.0"]]
    pf = harvester.host.sysfs_root / "bus/pci/devices/0000:08:00.0"
    assert (pf / "sriov_numvfs").read_text().strip() == "16"
    assert all((harvester.host.sysfs_root / "bus/pci/devices" / a).is_dir() for a in VF_ADDRESSES)
    assert harvester.stored(SRIOVGPUS, GPU)["status"] == {
        "vfAddresses": [VF_ADDRESSES[i] for i in GLOB_ORDER],
        "vGPUDevices": [VGPU_NAMES[i] for i in GLOB_ORDER],
    }
    # VGPUDevices are made by the node's periodic reconcile, not by the GPU's handler.
    assert harvester.emu.objects(*VGPUS) == []

    harvester.ctl.resync()
    created = harvester.emu.objects(*VGPUS)
    assert [v["metadata"]["name"] for v in created] == VGPU_NAMES
    first = harvester.stored(VGPUS, VF4)
    assert first["metadata"]["labels"] == {
        "nodename": NODE,
        "harvesterhci.io/parentSRIOVGPUDevice": GPU,
    }
    assert first["spec"] == {
        "vGPUTypeName": "",
        "address": "0000:08:00.4",
        "enabled": False,
        "nodeName": NODE,
        "parentGPUDeviceAddress": "0000:08:00.0",
    }
    assert "status" not in first  # dropped on create: the handler writes it
    harvester.ctl.run_until_idle()
    for name in VGPU_NAMES:
        assert harvester.stored(VGPUS, name)["status"] == {"availableTypes": ALL_TYPES}
    # The VF's PCIDevice carries the parent GPU's label.
    vf_device = harvester.stored(PCIDEVICES, VF4)
    assert vf_device["metadata"]["labels"]["harvesterhci.io/parentSRIOVGPUDevice"] == GPU
    assert harvester.ctl.errors == []


DRIVER = "nvidia-driver-runtime-x7k2p"


def test_a_driver_pod_whose_container_does_not_run_fails_the_readiness_check_until_it_runs(
    harvester: Harvester,
) -> None:
    """gpu_controller.go ``setupRemoteExecutor``: this node's pod of harvester-system labelled
    app=nvidia-driver-daemonset becomes the executor; ``manageGPU`` runs its ``CheckReady``
    (remote.go: an exec into the first container) before sriov-manage, and the key is
    requeued while it fails."""
    harvester.emu.seed(driver_pod(DRIVER, NODE, running=False))
    # Not this node's: another node's driver pod, and the label in another namespace.
    harvester.emu.seed(driver_pod("nvidia-driver-runtime-b2c4d", "harvester-other", running=True))
    elsewhere = driver_pod("nvidia-driver-runtime-e5f6g", NODE, running=True)
    elsewhere["metadata"]["namespace"] = "default"
    harvester.emu.seed(elsewhere)
    harvester.ctl.run_until_idle()
    assert harvester.ctl.executor_pod == ("harvester-system", DRIVER)
    harvester.patch(SRIOVGPUS, GPU, {"enabled": True})
    harvester.ctl.run_until_idle()
    failed = (
        f"sriovgpudevices/{GPU}",
        "error during readiness check: error during command execution: unable to upgrade "
        'connection: container not found ("nvidia-driver-ctr")',
    )
    # The MIG handler runs next on the same key (lasso runs every handler) and its nvidia-smi
    # goes through the same executor: the exec fails there too (mig.go
    # IsMigConfigurationNeeded wraps it, gpu_controller.go setupMigConfiguration again).
    query = "nvidia-smi -i 0000:08:00.0 --query-gpu=mig.mode.current --format=csv,noheader"
    mig_failed = (
        f"sriovgpudevices/{GPU}",
        f"error checking if GPU supports MIG instances: error executing {query}: error during "
        "command execution: unable to upgrade connection: container not found "
        '("nvidia-driver-ctr")',
    )
    assert [(e.key, e.message) for e in harvester.ctl.errors] == [failed, mig_failed]
    assert harvester.ctl.sriov_manage_calls == []
    # Requeued: a retry fails the same way while the container does not run.
    harvester.ctl.retry()
    harvester.ctl.run_until_idle()
    assert [(e.key, e.message) for e in harvester.ctl.errors] == [failed, mig_failed] * 2
    assert harvester.ctl.sriov_manage_calls == []
    # The container runs (the kubelet's status update): the next retry proceeds.
    harvester.emu.seed(driver_pod(DRIVER, NODE, running=True))
    harvester.ctl.run_until_idle()
    harvester.ctl.retry()
    harvester.ctl.run_until_idle()
    assert harvester.ctl.sriov_manage_calls == [[SRIOV_MANAGE, "-e", "0000:08:00.0"]]
    pf = harvester.host.sysfs_root / "bus/pci/devices/0000:08:00.0"
    assert (pf / "sriov_numvfs").read_text().strip() == "16"
    assert len(harvester.ctl.errors) == 4


def test_a_driver_pod_being_deleted_hands_back_to_the_local_executor(
    harvester: Harvester,
) -> None:
    # setupRemoteExecutor: DeletionTimestamp set → NewLocalExecutor, whose CheckReady
    # (file(1) on the host's sriov-manage) passes.
    pod = driver_pod(DRIVER, NODE, running=False)
    harvester.emu.seed(pod)
    harvester.ctl.run_until_idle()
    assert harvester.ctl.executor_pod == ("harvester-system", DRIVER)
    pod["metadata"]["deletionTimestamp"] = "2026-12-07T21:00:00Z"
    harvester.emu.seed(pod)
    harvester.ctl.run_until_idle()
    assert harvester.ctl.executor_pod is None
    harvester.patch(SRIOVGPUS, GPU, {"enabled": True})
    harvester.ctl.run_until_idle()
    assert harvester.ctl.errors == []
    assert harvester.ctl.sriov_manage_calls == [[SRIOV_MANAGE, "-e", "0000:08:00.0"]]


def test_a_gpu_on_an_mdev_host_makes_the_vgpu_setup_fail(
    emu: ApiServerEmulator, tmp_path: Path
) -> None:
    """At bdd8025 a VF has to have ``nvidia/current_vgpu_type``: an mdev VF has not."""
    install(emu)
    emu.seed(node_object(NODE))
    host = a2_host(tmp_path / "host", interface="mdev", sriov="enabled")
    with PciDevicesController(emu, host, NODE, emu.kubeconfig(tmp_path / "kc")) as ctl:
        ctl.resync()
    assert [e.message for e in ctl.errors] == [
        f"error setting VGPU devices for node {NODE}: error identifying vgpu devices: error "
        "during fetchVGPUstatus: error reading current_vgpu_type for device 0000:08:00.4: open "
        "/sys/bus/pci/devices/0000:08:00.4/nvidia/current_vgpu_type: no such file or directory"
    ]
    assert emu.objects(*VGPUS) == []
    assert emu.get_object(*SRIOVGPUS, GPU) is not None


# --- vGPUs ------------------------------------------------------------------------------------


def test_enabling_a_vgpu_writes_its_type_id_and_one_status_write_says_so(
    enabled: Harvester,
) -> None:
    h = enabled
    start = len(h.emu.requests)
    h.patch(VGPUS, VF4, {"enabled": True, "vGPUTypeName": "NVIDIA A2-4Q"})
    step_until(h.ctl, f"vgpudevices/{VF4}")
    assert h.vf_file("0000:08:00.4", "current_vgpu_type").strip() == "746"
    # enableVGPU: the PCIDevice's status, then its annotation and label, the claim, the status.
    assert writes_since(h.emu, start) == [
        Request("update", "devices.harvesterhci.io", "pcidevices", "status", None, VF4),
        Request("update", "devices.harvesterhci.io", "pcidevices", None, None, VF4),
        Request("create", "devices.harvesterhci.io", "pcideviceclaims", None, None, None),
        Request("update", "devices.harvesterhci.io", "vgpudevices", "status", None, VF4),
    ]
    # One write: configured, uuid = type id, the type's name; availableTypes as it was.
    assert h.stored(VGPUS, VF4)["status"] == {
        "vGPUStatus": "vGPUConfigured",
        "uuid": "746",
        "configureVGPUTypeName": "NVIDIA A2-4Q",
        "availableTypes": ALL_TYPES,
    }
    h.ctl.run_until_idle()
    # The next pass reads sysfs: a configured VF lists nothing, so availableTypes goes.
    assert h.stored(VGPUS, VF4)["status"] == {
        "vGPUStatus": "vGPUConfigured",
        "uuid": "746",
        "configureVGPUTypeName": "NVIDIA A2-4Q",
    }
    # Its disabled siblings were requeued and narrow to the 4 GB types.
    assert h.stored(VGPUS, VF5)["status"] == {"availableTypes": FOUR_GB_TYPES}
    claim = h.stored(PCIDEVICECLAIMS, VF4)
    assert claim["spec"] == {"address": "0000:08:00.4", "userName": "admin", "nodeName": NODE}
    assert claim["metadata"]["annotations"] == {
        "pcidevices.harvesterhci.io/skip-vfio-binding": "true",
        "pcidevice.harvesterhci.io/override-resource-name": "nvidia.com/NVIDIA_A2-4Q",
    }
    assert h.stored(PCIDEVICES, VF4)["status"]["resourceName"] == "nvidia.com/NVIDIA_A2-4Q"
    assert h.ctl.errors == []


def test_a_conflict_is_requeued_and_not_logged_as_an_error(
    enabled: Harvester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lasso (rancher/lasso pkg/controller/controller.go, processNextWorkItem) requeues every
    # failed key and logs every error but a conflict. Another writer labels VF5 just before
    # the controller writes its status (the narrowed types, once VF4 hosts a vGPU).
    h = enabled
    real = h.ctl._update_status
    raced: list[str] = []

    def racing(res: tuple[str, str, str], obj: dict[str, Any], status: dict[str, Any]) -> Any:
        if res == VGPUS and obj["metadata"]["name"] == VF5 and not raced:
            raced.append(VF5)
            h.custom.patch_cluster_custom_object(
                *VGPUS, VF5, {"metadata": {"labels": {"someone": "else"}}}
            )
        return real(res, obj, status)

    monkeypatch.setattr(h.ctl, "_update_status", racing)
    h.patch(VGPUS, VF4, {"enabled": True, "vGPUTypeName": "NVIDIA A2-4Q"})
    h.ctl.run_until_idle()
    assert raced == [VF5]
    assert h.ctl.conflicts == [f"vgpudevices/{VF5}"]
    assert h.ctl.errors == []
    h.ctl.retry()  # the rate limiter's delay elapsed
    h.ctl.run_until_idle()
    assert h.stored(VGPUS, VF5)["status"] == {"availableTypes": FOUR_GB_TYPES}
    assert h.stored(VGPUS, VF5)["metadata"]["labels"]["someone"] == "else"


def test_a_type_change_on_an_enabled_vgpu_is_ignored(configured: Harvester) -> None:
    h = configured
    writes = h.host.stats()["writes"]
    h.patch(VGPUS, VF4, {"vGPUTypeName": "NVIDIA A2-4A"})  # the webhook lets it through
    h.ctl.run_until_idle()
    assert h.host.stats()["writes"] == writes
    assert h.vf_file("0000:08:00.4", "current_vgpu_type").strip() == "746"
    status = h.stored(VGPUS, VF4)["status"]
    assert (status["uuid"], status["configureVGPUTypeName"]) == ("746", "NVIDIA A2-4Q")
    assert h.ctl.errors == []


def test_disabling_clears_the_status_then_a_second_write_refreshes_the_types(
    configured: Harvester,
) -> None:
    h = configured
    # The UI's "Disable" saves the object without its type (docs/domain.md §5).
    body = h.stored(VGPUS, VF4)
    del body["spec"]["vGPUTypeName"]
    body["spec"]["enabled"] = False
    h.custom.replace_cluster_custom_object(*VGPUS, VF4, body)
    start = len(h.emu.requests)
    step_until(h.ctl, f"vgpudevices/{VF4}")
    assert h.vf_file("0000:08:00.4", "current_vgpu_type").strip() == "0"
    assert writes_since(h.emu, start) == [
        Request("delete", "devices.harvesterhci.io", "pcideviceclaims", None, None, VF4),
        Request("update", "devices.harvesterhci.io", "pcidevices", None, None, VF4),
        Request("update", "devices.harvesterhci.io", "vgpudevices", "status", None, VF4),
    ]
    # First write: vGPUStatus, uuid and the type name cleared; availableTypes untouched (none).
    assert h.stored(VGPUS, VF4).get("status") == {}
    assert h.emu.get_object(*PCIDEVICECLAIMS, VF4) is None
    annotations = h.stored(PCIDEVICES, VF4)["metadata"]["annotations"]
    assert "pcidevice.harvesterhci.io/override-resource-name" not in annotations
    # Second write, on the handler's next pass over the same object (after the disabled
    # siblings reconcileDisabledVGPUStatus queued): the types from sysfs.
    start = len(h.emu.requests)
    handled = step_until(h.ctl, f"vgpudevices/{VF4}")
    assert handled == [f"vgpudevices/{name}" for name in [*VGPU_NAMES[1:], VF4]]
    assert [r for r in writes_since(h.emu, start) if r.name == VF4] == [
        Request("update", "devices.harvesterhci.io", "vgpudevices", "status", None, VF4)
    ]
    assert h.stored(VGPUS, VF4)["status"] == {"availableTypes": ALL_TYPES}
    h.ctl.run_until_idle()
    assert h.stored(VGPUS, VF5)["status"] == {"availableTypes": ALL_TYPES}
    assert h.ctl.errors == []


def test_enabling_a_type_that_vanished_since_the_status_fails_in_the_handler(
    enabled: Harvester,
) -> None:
    """The webhook judges the old status; the handler uses the object's status too: an A2-8Q
    on VF5 admitted while both still list everything, after VF4 took an A2-4Q, is the driver's
    to refuse (EINVAL: not creatable now) and the handler's error."""
    h = enabled
    h.patch(VGPUS, VF4, {"enabled": True, "vGPUTypeName": "NVIDIA A2-4Q"})
    h.patch(VGPUS, VF5, {"enabled": True, "vGPUTypeName": "NVIDIA A2-8Q"})
    h.ctl.run_until_idle()
    assert h.vf_file("0000:08:00.4", "current_vgpu_type").strip() == "746"
    assert h.vf_file("0000:08:00.5", "current_vgpu_type").strip() == "0"
    assert [e.key for e in h.ctl.errors] == [f"vgpudevices/{VF5}"]
    assert h.ctl.errors[0].message.startswith(
        f"error writing to create file for vgpu {VF5}: write "
        "/sys/bus/pci/devices/0000:08:00.5/nvidia/current_vgpu_type: "
    )
    assert "vGPUStatus" not in h.stored(VGPUS, VF5).get("status", {})


def test_a_vgpu_device_made_for_a_vf_that_hosts_a_vgpu_is_disabled_and_removes_it(
    emu: ApiServerEmulator, tmp_path: Path
) -> None:
    """gpuhelper.go ``generateVGPUDevice`` enables the new object only when the status names a
    configured type, which ``FetchVGPUStatus`` never does: an object (re)created for a VF with
    a vGPU says disabled, and ``OnVGPUChange`` then disables the VF (writes 0)."""
    install(emu)
    emu.seed(node_object(NODE))
    host = build_host(
        tmp_path / "host",
        {
            "gpus": [
                {
                    "model": "A2",
                    "address": "0000:08:00.0",
                    "interface": "vfio",
                    "vgpus": {"0000:08:00.4": "NVIDIA A2-4Q"},
                }
            ]
        },
    )
    with PciDevicesController(emu, host, NODE, emu.kubeconfig(tmp_path / "kc")) as ctl:
        ctl.resync()
        gpu = emu.get_object(*SRIOVGPUS, GPU)
        assert gpu is not None and gpu["spec"]["enabled"] is True  # VFs exist
        created = emu.get_object(*VGPUS, VF4)
        assert created is not None and created["spec"]["enabled"] is False
        ctl.run_until_idle()
        assert ctl.errors == []
    current = host.sysfs_root / "bus/pci/devices/0000:08:00.4/nvidia/current_vgpu_type"
    assert current.read_text().strip() == "0"
    assert ctl.sriov_manage_calls == []
    after = emu.get_object(*VGPUS, VF4)
    assert after is not None and after["status"] == {"availableTypes": ALL_TYPES}


# --- the webhook ------------------------------------------------------------------------------


def test_enabling_without_a_type_is_refused(enabled: Harvester) -> None:
    h = enabled
    before = h.stored(VGPUS, VF5)
    code, reason, message = h.refused(
        h.custom.patch_cluster_custom_object, *VGPUS, VF5, {"spec": {"enabled": True}}
    )
    assert (code, reason) == (500, "InternalError")
    assert message == DENIED + f"VGPUTypeName cannot be empty for vGPU device {VF5}"
    assert h.stored(VGPUS, VF5) == before


def test_enabling_a_type_the_old_status_does_not_list_is_refused(configured: Harvester) -> None:
    h = configured
    before = h.stored(VGPUS, VF5)
    assert before["status"]["availableTypes"] == FOUR_GB_TYPES
    code, _, message = h.refused(
        h.custom.patch_cluster_custom_object,
        *VGPUS,
        VF5,
        {"spec": {"enabled": True, "vGPUTypeName": "NVIDIA A2-8Q"}},
    )
    assert code == 500
    assert (
        message
        == DENIED + f"VGPUTypeName NVIDIA A2-8Q is not a valid profile for vGPU device {VF5}"
    )
    assert h.stored(VGPUS, VF5) == before
    # One it lists is admitted.
    h.patch(VGPUS, VF5, {"enabled": True, "vGPUTypeName": "NVIDIA A2-4A"})
    h.ctl.run_until_idle()
    assert h.vf_file("0000:08:00.5", "current_vgpu_type").strip() == "751"


def test_a_vm_holding_a_vgpu_blocks_its_disable_and_its_gpus_disable(
    configured: Harvester,
) -> None:
    h = configured
    h.emu.seed(vm("vm1", "default", hostdevices={"nvidia.com/NVIDIA_A2-4Q": [VF4]}))
    before = h.stored(VGPUS, VF4)
    code, reason, message = h.refused(
        h.custom.patch_cluster_custom_object, *VGPUS, VF4, {"spec": {"enabled": False}}
    )
    assert (code, reason) == (500, "InternalError")
    assert message == DENIED + f"device {VF4} is in use with VM vm1 in namespace default"
    assert h.stored(VGPUS, VF4) == before
    code, _, message = h.refused(
        h.custom.patch_cluster_custom_object, *SRIOVGPUS, GPU, {"spec": {"enabled": False}}
    )
    assert code == 500
    assert message == DENIED + f"device {VF4} is in use with VM vm1 in namespace default"
    assert h.stored(SRIOVGPUS, GPU)["spec"]["enabled"] is True
    # Deleting the vGPU's object is refused the same way while its node exists.
    code, _, message = h.refused(h.custom.delete_cluster_custom_object, *VGPUS, VF4)
    assert message == DENIED + f"device {VF4} is in use with VM vm1 in namespace default"

    # Once the VM is gone the disable goes through and the double removes the vGPU.
    h.emu.delete_object(*VMS, "vm1", "default")
    h.patch(VGPUS, VF4, {"enabled": False})
    h.ctl.run_until_idle()
    assert h.vf_file("0000:08:00.4", "current_vgpu_type").strip() == "0"


def test_only_the_hostdevices_of_the_allocation_count(configured: Harvester) -> None:
    """common.go ``VMByHostDeviceName`` indexes ``hostdevices`` only, never ``gpus``."""
    h = configured
    listed = vm("vm2", "apps", hostdevices={})
    listed["metadata"]["annotations"]["harvesterhci.io/deviceAllocationDetails"] = json.dumps(
        {"gpus": {"nvidia.com/NVIDIA_A2-4Q": [VF4]}}
    )
    h.emu.seed(listed)
    h.patch(VGPUS, VF4, {"enabled": False})
    assert h.stored(VGPUS, VF4)["spec"]["enabled"] is False


def test_deleting_an_enabled_gpu_is_refused_until_its_node_is_gone(enabled: Harvester) -> None:
    h = enabled
    code, reason, message = h.refused(h.custom.delete_cluster_custom_object, *SRIOVGPUS, GPU)
    assert (code, reason) == (500, "InternalError")
    assert message == DENIED + f"please disable gpuDevice {GPU} before deletion"
    assert h.emu.get_object(*SRIOVGPUS, GPU) is not None
    h.emu.delete_object(*NODES, NODE)
    h.custom.delete_cluster_custom_object(*SRIOVGPUS, GPU)
    assert h.emu.get_object(*SRIOVGPUS, GPU) is None


def test_disabling_a_gpu_nobody_uses_runs_sriov_manage_d(enabled: Harvester) -> None:
    h = enabled
    h.patch(SRIOVGPUS, GPU, {"enabled": False})
    h.ctl.run_until_idle()
    assert h.ctl.sriov_manage_calls[-1] == [SRIOV_MANAGE, "-d", "0000:08:00.0"]
    pf = h.host.sysfs_root / "bus/pci/devices/0000:08:00.0"
    assert (pf / "sriov_numvfs").read_text().strip() == "0"
    # The VFs are gone and the parent disabled: the next resync deletes the VGPUDevices.
    assert len(h.emu.objects(*VGPUS)) == 16
    h.ctl.resync()
    assert h.emu.objects(*VGPUS) == []
    assert h.ctl.errors == []


# --- the thread mode --------------------------------------------------------------------------


def test_the_thread_mode_reacts_to_a_change_on_its_own(harvester: Harvester) -> None:
    h = harvester
    h.ctl.start(resync_seconds=3600, poll_seconds=0.01)
    try:
        h.patch(SRIOVGPUS, GPU, {"enabled": True})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not h.ctl.sriov_manage_calls:
            time.sleep(0.01)
    finally:
        h.ctl.stop()
    assert h.ctl.sriov_manage_calls == [[SRIOV_MANAGE, "-e", "0000:08:00.0"]]


# --- MIG (gpu_controller.go reconcileMIGConfiguration) -----------------------------------------

A100_PF = "0000:08:00.0"
#: What the handler runs, in order, for a GPU it finds MIG-capable and has no MigConfiguration
#: of (mig.go: IsMigConfigurationNeeded, EnableMIGMode, GenerateMIGConfiguration,
#: GenerateMIGConfigurationStatus).
MIG_SETUP = [
    f"nvidia-smi -i {A100_PF} --query-gpu=mig.mode.current --format=csv,noheader",
    f"nvidia-smi -i {A100_PF} -mig 1",
    f"nvidia-smi mig -i {A100_PF} -lgip",
    f"nvidia-smi mig -i {A100_PF} -lgi || exit 0",
    f"nvidia-smi mig -i {A100_PF} -lgip",
]
#: The A100 40GB's GPU instance profiles (NVIDIA's MIG user guide), named as generateProfile
#: names them (the row's "MIG" and the profile), every one free.
A100_GI = [
    ("MIG 1g.5gb", 19, 7),
    ("MIG 1g.5gb+me", 20, 1),
    ("MIG 1g.10gb", 15, 4),
    ("MIG 2g.10gb", 14, 3),
    ("MIG 3g.20gb", 9, 2),
    ("MIG 4g.20gb", 5, 1),
    ("MIG 7g.40gb", 0, 1),
]


@pytest.fixture
def a100(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Harvester]:
    """A node with one A100 40GB (SR-IOV off, MIG mode off) whose double has run its first
    resync."""
    install(emu)
    emu.seed(node_object(NODE))
    spec = {"model": "A100", "address": A100_PF, "interface": "vfio", "sriov": "disabled"}
    host = build_host(tmp_path / "host", {"gpus": [spec]})
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    api = new_client_from_config(config_file=str(kubeconfig))
    with PciDevicesController(emu, host, NODE, kubeconfig) as ctl:
        ctl.resync()
        ctl.run_until_idle()
        yield Harvester(emu, host, ctl, client.CustomObjectsApi(api))
    api.close()


def mig_mode(host: SimHost) -> str:
    done = subprocess.run(
        [str(host.nvidia_smi), "-i", A100_PF, "--query-gpu=mig.mode.current",
         "--format=csv,noheader"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()


def test_enabling_an_a100_turns_mig_mode_on_and_creates_its_mig_configuration(
    a100: Harvester,
) -> None:
    """As Harvester's UI would: the SRIOVGPUDevice enabled. OnGPUChange enables SR-IOV, then
    the MIG handler finds the GPU MIG-capable, turns MIG mode on and records a
    MigConfiguration named as the GPU, disabled, every profile requested 0."""
    assert mig_mode(a100.host) == "Disabled"
    gpu = a100.stored(SRIOVGPUS, GPU)
    a100.patch(SRIOVGPUS, GPU, {"enabled": True})
    a100.ctl.run_until_idle()
    assert a100.ctl.errors == []
    assert a100.ctl.sriov_manage_calls == [[SRIOV_MANAGE, "-e", A100_PF]]
    assert a100.ctl.nvidia_smi_calls[:5] == MIG_SETUP
    assert mig_mode(a100.host) == "Enabled"
    mig = a100.stored(MIGCONFIGURATIONS, GPU)
    assert mig["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "devices.harvesterhci.io/v1beta1",
            "kind": "SRIOVGPUDevice",
            "name": GPU,
            "uid": gpu["metadata"]["uid"],
        }
    ]
    assert mig["spec"] == {
        "enabled": False,
        "gpuAddress": A100_PF,
        "nodeName": NODE,
        "profileSpec": [{"name": n, "id": i, "requested": 0} for n, i, _ in A100_GI],
    }
    assert mig["status"] == {
        "profileStatus": [
            {"name": n, "id": i, "available": total, "total": total} for n, i, total in A100_GI
        ],
        "status": "",
    }
    # Later changes of the GPU find MIG mode on and the object there: -mig 1 again, no write.
    assert a100.ctl.nvidia_smi_calls[5:7] == MIG_SETUP[:2]
    # Its VFs, in MIG mode without a GPU instance, offer nothing: no time-sliced type.
    a100.ctl.resync()
    a100.ctl.run_until_idle()
    vgpus = a100.emu.objects(*VGPUS)
    assert [v["metadata"]["name"] for v in vgpus] == VGPU_NAMES
    assert all((v.get("status") or {}).get("availableTypes") is None for v in vgpus)
    assert a100.vf_file("0000:08:00.4", "creatable_vgpu_types") == "ID    : vGPU Name\n"
    assert a100.ctl.errors == []


def test_disabling_the_a100_deletes_its_mig_configuration_and_mig_mode_stays(
    a100: Harvester,
) -> None:
    a100.patch(SRIOVGPUS, GPU, {"enabled": True})
    a100.ctl.run_until_idle()
    assert a100.emu.get_object(*MIGCONFIGURATIONS, GPU) is not None
    a100.patch(SRIOVGPUS, GPU, {"enabled": False})
    a100.ctl.run_until_idle()
    assert a100.ctl.sriov_manage_calls[-1] == [SRIOV_MANAGE, "-d", A100_PF]
    assert a100.emu.get_object(*MIGCONFIGURATIONS, GPU) is None
    assert mig_mode(a100.host) == "Enabled"  # nothing in pcidevices turns it off
    assert a100.ctl.errors == []


def test_an_a2_gets_no_mig_configuration(enabled: Harvester) -> None:
    """nvidia-smi answers [N/A] for a GPU without MIG: the handler stops there."""
    assert enabled.emu.objects(*MIGCONFIGURATIONS) == []
    query = "nvidia-smi -i 0000:08:00.0 --query-gpu=mig.mode.current --format=csv,noheader"
    assert enabled.ctl.nvidia_smi_calls
    assert set(enabled.ctl.nvidia_smi_calls) == {query}
    assert enabled.ctl.errors == []
