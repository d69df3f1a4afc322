"""The cluster observer against an in-memory ClusterApi: which calls, and what it makes of them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.model import (
    ForbiddenError,
    Interface,
    Inventory,
    ObserveError,
    PciAddress,
    ResourceMissingError,
)
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    KUBEVIRT_OWNED_PCI_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    PARENT_LABEL,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    ClusterState,
    ConfiguredProfile,
    DeviceUse,
    KubeObject,
    object_name,
)
from reconciler.model.retiring import KUBEVIRT_RETIRING_ANNOTATION as _RETIRING
from reconciler.observe.checkpoint import checkpoint_file
from reconciler.observe.cluster import (
    FleetReader,
    inventory_from_cluster,
    kubevirt_config,
    observe_cluster,
    observe_nodes_from_cluster,
    profiles_elsewhere,
    summary_type_names,
)
from tests.doubles.cluster import FakeCluster, ListCall

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parents[1] / "cases"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint"
NODE = "harvester-kgd9c"
OTHER = "harvester-x2"
KV = "kubevirts"
VMI = "virtualmachineinstances"


# -- objects ------------------------------------------------------------------------------------


def vgpu_device(node: str, vf: str, profile: str, *, managed: bool = True) -> dict[str, Any]:
    labels = {NODE_LABEL: node, PARENT_LABEL: object_name(node, "0000:08:00.0")}
    if managed:
        labels[MANAGED_BY_LABEL] = MANAGED_BY
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": VGPU_KIND,
        "metadata": {"name": object_name(node, vf), "labels": labels, "resourceVersion": "7"},
        "spec": {
            "address": vf,
            "enabled": bool(profile),
            "nodeName": node,
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": profile,
        },
    }


def sriov_device(node: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": SRIOV_GPU_KIND,
        "metadata": {
            "name": object_name(node, "0000:08:00.0"),
            "labels": {NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
            "resourceVersion": "5",
        },
        "spec": {"address": "0000:08:00.0", "nodeName": node, "enabled": True},
    }


def node_state(
    node: str, profiles: Mapping[str, tuple[int, int]], *, managed: bool = True
) -> dict[str, Any]:
    """A VGPUNodeState whose ``status.profiles`` give each profile (wanted, vgpus)."""
    labels = {NODE_LABEL: node}
    if managed:
        labels[MANAGED_BY_LABEL] = MANAGED_BY
    return {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUNodeState",
        "metadata": {"name": node, "labels": labels, "resourceVersion": "3"},
        "spec": {"nodeName": node},
        "status": {
            "profiles": [
                {"name": name, "wanted": wanted, "vgpus": vgpus, "creatable": 9}
                for name, (wanted, vgpus) in profiles.items()
            ]
        },
    }


def kubevirt(namespace: str = "harvester-system", **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {
            "name": "kubevirt",
            "namespace": namespace,
            "resourceVersion": "42",
            "annotations": annotations,
        },
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": "x"}],
                    "mediatedDevices": [
                        {
                            "mdevNameSelector": "NVIDIA A2-4Q",
                            "resourceName": "nvidia.com/NVIDIA_A2-4Q",
                            "externalResourceProvider": True,
                        }
                    ],
                }
            }
        },
    }


def vmi(
    name: str,
    uid: str,
    *,
    node: str = NODE,
    phase: str = "Running",
    gpus: tuple[str, ...] = (),
    pods: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A VMI as KubeVirt shows it: ``status.activePods`` maps its launcher pods' UIDs to
    their nodes (VirtualMachineInstanceStatus.ActivePods)."""
    status: dict[str, Any] = {"phase": phase, "nodeName": node}
    if pods is not None:
        status["activePods"] = dict(pods)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "labels": {"kubevirt.io/nodeName": node},
        },
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [{"name": f"gpu{i}", "deviceName": d} for i, d in enumerate(gpus)]
                }
            }
        },
        "status": status,
    }


NUMA_MAP = "kubelet-1.29-numa-map.json"
NONE = "no-allocations.json"
POD_WITH_VGPU = "6f1c2a9e-4b1d-4f3e-9a51-2d0c7e8b1a11"  # in the 1.29 fixture, holds A2-4Q
OTHER_POD = "0d9e8f7a-6b5c-4d3e-2f1a-0b9c8d7e6f5a"  # in the 1.29 fixture, holds A2-4A
A2_4Q_UUID = "9b4a6c1e-2f0d-5e3a-8c7b-1d2e3f4a5b6c"
A2_4A_UUID = "3c2b1a09-8f7e-5d6c-b5a4-39281706f5e4"


def cluster(**extra: list[dict[str, Any]]) -> FakeCluster:
    objects: dict[str, list[dict[str, Any]]] = {
        "sriovgpudevices": [sriov_device(NODE), sriov_device(OTHER)],
        "vgpudevices": [
            vgpu_device(NODE, "0000:08:00.4", "NVIDIA A2-4Q"),
            vgpu_device(NODE, "0000:08:00.5", ""),
            vgpu_device(OTHER, "0000:08:00.4", "NVIDIA A2-8Q"),
            vgpu_device(OTHER, "0000:08:00.5", "NVIDIA A2-2B", managed=False),
            vgpu_device(OTHER, "0000:08:00.6", ""),
        ],
        "vgpunodestates": [
            node_state(NODE, {"NVIDIA A2-4Q": (1, 1)}),
            # Wanted but not yet there, there but no longer wanted, only creatable: the first
            # two count as configured, the last does not.
            node_state(
                OTHER, {"NVIDIA A2-8Q": (1, 0), "NVIDIA A2-1Q": (0, 1), "NVIDIA A2-16Q": (0, 0)}
            ),
            node_state("not-ours", {"NVIDIA A2-2B": (1, 1)}, managed=False),
        ],
        KV: [kubevirt(**{KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q, NVIDIA A2-8Q,"})],
        VMI: [],
    }
    for key, value in extra.items():
        objects[{"kv": KV, "vmis": VMI}[key]] = value
    api = FakeCluster(read_only=True)  # the observer only reads
    for plural, items in objects.items():
        api.seed(plural, items)
    return api


def kubelet_with(tmp_path: Path, fixture: str) -> Path:
    path = checkpoint_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes((FIXTURES / fixture).read_bytes())
    return tmp_path


# -- our CRs and the KubeVirt CR ----------------------------------------------------------------


def test_a_node_without_vms_costs_five_list_calls_its_own_objects_selected() -> None:
    """Five lists; the KubeVirt CR before the VGPUNodeStates (a retiring mark it shows was
    written before the summaries were read: model.retiring)."""
    api = cluster()
    state = observe_cluster(api, node=NODE)
    assert api.calls == [
        ("list", "sriovgpudevices", None),
        ("list", "vgpudevices", None),
        ("list", "kubevirts", None),
        ("list", "vgpunodestates", None),
        ("list", "virtualmachineinstances", None),
    ]
    assert api.lists == [
        ListCall(GROUP, "v1beta1", "sriovgpudevices", None, f"nodename={NODE}", ""),
        ListCall(GROUP, "v1beta1", "vgpudevices", None, f"nodename={NODE}", ""),
        ListCall("kubevirt.io", "v1", "kubevirts", None, "", ""),
        ListCall("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates", None, "", ""),
        ListCall(
            "kubevirt.io", "v1", "virtualmachineinstances", None, f"kubevirt.io/nodeName={NODE}", ""
        ),
    ]
    assert sorted(state.sriov_gpu_devices) == [object_name(NODE, "0000:08:00.0")]
    assert sorted(state.vgpu_devices) == [
        object_name(NODE, "0000:08:00.4"),
        object_name(NODE, "0000:08:00.5"),
    ]
    obj = state.vgpu_devices[object_name(NODE, "0000:08:00.4")]
    assert isinstance(obj, KubeObject)
    assert (obj.kind, obj.resource_version, obj.managed_by_us) == (VGPU_KIND, "7", True)
    assert state.device_uses == {}
    assert state.vmi_resources == {}


def test_profiles_elsewhere_come_from_the_other_nodes_summaries() -> None:
    state = observe_cluster(cluster(), node=NODE)
    # Not this node's A2-4Q, not another controller's A2-2B, not the merely creatable A2-16Q.
    # Their summaries say nothing of GPUs (as an older vgpuctl's): mdev.
    assert state.profiles_elsewhere == frozenset(
        {ConfiguredProfile("NVIDIA A2-8Q"), ConfiguredProfile("NVIDIA A2-1Q")}
    )
    assert state.node_state is not None and state.node_state.name == NODE


def test_kubevirt_allow_list_and_owned_annotation() -> None:
    kv = observe_cluster(cluster(), node=NODE).kubevirt
    assert kv is not None
    assert (kv.namespace, kv.name, kv.resource_version) == ("harvester-system", "kubevirt", "42")
    assert [e["mdevNameSelector"] for e in kv.mediated_devices] == ["NVIDIA A2-4Q"]
    assert kv.owned == frozenset({"NVIDIA A2-4Q", "NVIDIA A2-8Q"})


def test_the_retiring_marks_and_the_time_the_summaries_were_read() -> None:
    """The marks (model.retiring) are read from their annotation; ``observed_at`` is the
    injected clock's time, taken after the KubeVirt CR is read and before the summaries are
    (no later than they are read: the safe side; the planner reads no clock); a mark
    annotation that cannot be read is no marks, and a note."""
    marks = {"NVIDIA A2-4Q": "2026-12-07T18:00:00Z"}
    api = cluster(
        kv=[kubevirt(**{KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q", _RETIRING: json.dumps(marks)})]
    )
    read: list[str] = []

    def clock() -> float:
        read.append(api.calls[-1][1])  # what was listed last when the time was taken
        return 1_796_670_000.0

    state = observe_cluster(api, node=NODE, clock=clock)
    assert state.kubevirt is not None and dict(state.kubevirt.retiring) == marks
    assert state.observed_at == "2026-12-07T19:00:00Z"
    assert read == ["kubevirts"]
    unreadable = observe_cluster(
        cluster(kv=[kubevirt(**{_RETIRING: "[not an object]"})]), node=NODE
    )
    assert unreadable.kubevirt is not None and dict(unreadable.kubevirt.retiring) == {}
    assert any(_RETIRING in n and "no retiring marks" in n for n in unreadable.notes)
    # The fleet reader reads them so too.
    (observed,) = FleetReader(api, clock=lambda: 1_796_670_000.0).observe([NODE]).values()
    assert not isinstance(observed, Exception)
    assert observed[1].observed_at == "2026-12-07T19:00:00Z"


# -- which kind of GPU a profile is configured on, per the other nodes' summaries --------------

L40S, L40S_VF0, L40S_VF1 = "0000:08:00.0", "0000:08:00.4", "0000:08:00.5"
A2, A2_VF0 = "0000:09:00.0", "0000:09:00.4"


def summary_gpu(
    address: str, vfs: list[str], *, interface: str | None, vf_device: str, type_set: int = 0
) -> dict[str, Any]:
    """A GPU entry of a VGPUNodeState's status as vgpuctl renders it (the fields read here);
    ``interface`` None: written by an older vgpuctl, which had no such field."""
    entry: dict[str, Any] = {
        "address": address,
        "sriov": {"totalVFs": 32, "numVFs": len(vfs), "vfDevice": vf_device},
        "managed": True,
        "vfAddresses": vfs,
        "typeSet": type_set,
    }
    if interface is not None:
        entry["interface"] = interface
    return entry


def summary(
    node: str,
    gpus: list[dict[str, Any]],
    vgpus: list[tuple[str, str]],
    profiles: Mapping[str, tuple[int, int]],
    type_sets: list[list[str]],
) -> KubeObject:
    """A VGPUNodeState with ``gpus``, ``vgpus`` (VF, profile), ``profiles`` (wanted, vgpus) and
    ``typeSets`` (type names)."""
    raw = node_state(node, profiles)
    raw["status"]["gpus"] = gpus
    raw["status"]["vgpus"] = [{"vf": vf, "profile": p, "uuid": vf} for vf, p in vgpus]
    raw["status"]["typeSets"] = [[{"name": n} for n in names] for names in type_sets]
    return KubeObject.from_json(raw)


def test_a_profile_on_a_vfio_gpu_elsewhere_carries_the_vfs_device_id() -> None:
    other = summary(
        OTHER,
        [
            summary_gpu(L40S, [L40S_VF0, L40S_VF1], interface="vfio", vf_device="26b9"),
            summary_gpu(A2, [A2_VF0], interface="mdev", vf_device="25b6", type_set=1),
        ],
        [(L40S_VF0, "NVIDIA L40S-8Q"), (A2_VF0, "NVIDIA A2-4Q")],
        {"NVIDIA L40S-8Q": (1, 1), "NVIDIA A2-4Q": (1, 1)},
        [["NVIDIA L40S-8Q"], ["NVIDIA A2-4Q"]],
    )
    assert profiles_elsewhere([other], node=NODE) == {
        ConfiguredProfile("NVIDIA L40S-8Q", Interface.VFIO, "26b9"),
        ConfiguredProfile("NVIDIA A2-4Q"),
    }
    assert profiles_elsewhere([other], node=OTHER) == frozenset()  # a node's own: not elsewhere


def test_a_wanted_profile_with_no_vgpu_yet_is_on_the_kind_of_the_gpus_offering_it() -> None:
    other = summary(
        OTHER,
        [summary_gpu(L40S, [L40S_VF0], interface="vfio", vf_device="26B9")],
        [],
        {"NVIDIA L40S-8Q": (1, 0), "NVIDIA L40S-4Q": (1, 0)},
        [["NVIDIA L40S-8Q"]],
    )
    assert profiles_elsewhere([other], node=NODE) == {
        ConfiguredProfile("NVIDIA L40S-8Q", Interface.VFIO, "26b9"),
        # No GPU of the summary offers it: mdev, as before vgpuctl knew kinds.
        ConfiguredProfile("NVIDIA L40S-4Q"),
    }


def test_a_summary_of_an_older_vgpuctl_counts_as_mdev() -> None:
    old = summary(
        OTHER,
        [summary_gpu(L40S, [L40S_VF0], interface=None, vf_device="26b9")],
        [(L40S_VF0, "NVIDIA L40S-8Q")],
        {"NVIDIA L40S-8Q": (1, 1)},
        [["NVIDIA L40S-8Q"]],
    )
    assert profiles_elsewhere([old], node=NODE) == {ConfiguredProfile("NVIDIA L40S-8Q")}


def test_one_profile_on_mdev_on_one_node_and_vfio_on_another_is_one_of_each() -> None:
    mdev = summary(
        OTHER,
        [summary_gpu(L40S, [L40S_VF0], interface="mdev", vf_device="26b9")],
        [(L40S_VF0, "NVIDIA L40S-8Q")],
        {"NVIDIA L40S-8Q": (1, 1)},
        [["NVIDIA L40S-8Q"]],
    )
    vfio = summary(
        "harvester-x3",
        [summary_gpu(L40S, [L40S_VF0], interface="vfio", vf_device="26b9")],
        [(L40S_VF0, "NVIDIA L40S-8Q")],
        {"NVIDIA L40S-8Q": (1, 1)},
        [["NVIDIA L40S-8Q"]],
    )
    assert profiles_elsewhere([mdev, vfio], node=NODE) == {
        ConfiguredProfile("NVIDIA L40S-8Q"),
        ConfiguredProfile("NVIDIA L40S-8Q", Interface.VFIO, "26b9"),
    }


def test_profiles_elsewhere_keep_their_kind_through_json_and_mdev_ones_stay_names() -> None:
    state = ClusterState(
        NODE,
        profiles_elsewhere=frozenset(
            {
                ConfiguredProfile("NVIDIA L40S-8Q", Interface.VFIO, "26b9"),
                ConfiguredProfile("NVIDIA A2-4Q"),
            }
        ),
    )
    doc = state.to_json()
    assert doc["profilesElsewhere"] == [
        "NVIDIA A2-4Q",
        {"name": "NVIDIA L40S-8Q", "interface": "vfio", "vfDevice": "26b9"},
    ]
    assert ClusterState.from_json(doc) == state
    # A bare name (an older document, a caller's shorthand) is an mdev profile.
    assert ClusterState(NODE, profiles_elsewhere=frozenset({"NVIDIA A2-4Q"})) == ClusterState(  # type: ignore[arg-type]
        NODE, profiles_elsewhere=frozenset({ConfiguredProfile("NVIDIA A2-4Q")})
    )


def test_the_pci_host_devices_allow_list_and_its_owned_annotation() -> None:
    raw = kubevirt(**{KUBEVIRT_OWNED_PCI_ANNOTATION: "nvidia.com/NVIDIA_L40S-8Q,"})
    kv = kubevirt_config(raw)
    assert kv.pci_host_devices == ({"pciVendorSelector": "10DE:2236", "resourceName": "x"},)
    assert kv.owned_pci == frozenset({"nvidia.com/NVIDIA_L40S-8Q"})
    assert kv.owned == frozenset()  # the mediated devices' annotation is another one
    raw["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = {"x": 1}
    with pytest.raises(ObserveError, match=r"permittedHostDevices\.pciHostDevices is not a list"):
        kubevirt_config(raw)


def test_no_kubevirt_cr_is_a_note() -> None:
    state = observe_cluster(cluster(kv=[]), node=NODE)
    assert state.kubevirt is None
    assert state.notes == (
        "no KubeVirt CR found in any namespace: its mediated-device allow-list is not managed",
    )


def test_kubevirt_not_installed_is_a_note_and_no_vmis_are_asked_for() -> None:
    api = cluster()
    api.unserved |= {"kubevirts", "virtualmachineinstances"}
    state = observe_cluster(api, node=NODE)
    assert state.kubevirt is None
    assert "KubeVirt is not installed (kubevirts.kubevirt.io is not served)" in state.notes[0]
    assert state.vmi_resources == {}


def test_two_kubevirt_crs_need_a_pinned_namespace() -> None:
    api = cluster(kv=[kubevirt("harvester-system"), kubevirt("kubevirt")])
    with pytest.raises(ObserveError) as err:
        observe_cluster(api, node=NODE)
    assert err.value.message == (
        "found 2 KubeVirt CRs in any namespace (harvester-system/kubevirt, kubevirt/kubevirt): "
        "pass --kubevirt-namespace to choose one"
    )
    state = observe_cluster(api, node=NODE, kubevirt_namespace="kubevirt")
    assert state.kubevirt is not None
    assert state.kubevirt.namespace == "kubevirt"
    assert ListCall("kubevirt.io", "v1", "kubevirts", "kubevirt", "", "") in api.lists


def test_malformed_allow_list_is_an_observe_error() -> None:
    kv = kubevirt()
    kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] = "NVIDIA A2-4Q"
    with pytest.raises(ObserveError, match="KubeVirt CR harvester-system/kubevirt: spec"):
        observe_cluster(cluster(kv=[kv]), node=NODE)


def test_cluster_errors_propagate() -> None:
    api = cluster()
    api.fail["vgpudevices"] = ForbiddenError(
        "RBAC denies list on vgpudevices.devices.harvesterhci.io (…)"
    )
    with pytest.raises(ForbiddenError):
        observe_cluster(api, node=NODE)


def test_our_crds_missing_propagates() -> None:
    api = cluster()
    api.unserved.add("vgpudevices")
    with pytest.raises(ResourceMissingError):
        observe_cluster(api, node=NODE)


# -- who uses which vGPU ------------------------------------------------------------------------


def test_vmi_active_pods_and_checkpoint_join_into_device_uses(tmp_path: Path) -> None:
    api = cluster(
        vmis=[vmi("win11", "vmi-1", gpus=("nvidia.com/NVIDIA_A2-4Q",), pods={POD_WITH_VGPU: NODE})]
    )
    state = observe_cluster(
        api, node=NODE, kubelet_dir=kubelet_with(tmp_path, "kubelet-1.29-numa-map.json")
    )
    # VMIs only: no request for pods (the agent has no access to them).
    assert [c[1] for c in api.calls] == [
        "sriovgpudevices",
        "vgpudevices",
        "kubevirts",
        "vgpunodestates",
        "virtualmachineinstances",
    ]
    assert state.device_uses == {
        A2_4Q_UUID: DeviceUse(
            A2_4Q_UUID, "nvidia.com/NVIDIA_A2-4Q", f"VM default/win11 (pod {POD_WITH_VGPU})"
        ),
        # A pod that is no VM's launcher still holds its vGPU.
        A2_4A_UUID: DeviceUse(A2_4A_UUID, "nvidia.com/NVIDIA_A2-4A", f"pod {OTHER_POD}"),
    }
    # kvm and tun allocations are not vGPUs.
    assert "kvm3" not in state.device_uses
    assert state.vmi_resources == {}
    assert state.notes == ()


def test_a_vm_whose_allocation_is_unknown_marks_its_resource(tmp_path: Path) -> None:
    api = cluster(
        vmis=[
            vmi(
                "linux",
                "vmi-2",
                gpus=("nvidia.com/NVIDIA_A2-8Q", "nvidia.com/NVIDIA_A2-4Q"),
                pods={"pod-not-in-checkpoint": NODE},
            )
        ]
    )
    state = observe_cluster(
        api, node=NODE, kubelet_dir=kubelet_with(tmp_path, "no-allocations.json")
    )
    assert state.vmi_resources == {
        "default/linux": ("nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-8Q")
    }
    assert state.device_uses == {}


def test_only_the_vms_pods_on_this_node_account_for_its_resources(tmp_path: Path) -> None:
    # The VMI's pod that holds A2-4Q in this node's checkpoint is, per KubeVirt, elsewhere
    # (a checkpoint can only hold this node's pods: the VMI's pod here is the other one).
    api = cluster(
        vmis=[
            vmi(
                "moving",
                "vmi-6",
                gpus=("nvidia.com/NVIDIA_A2-4Q",),
                pods={POD_WITH_VGPU: OTHER, "target-pod": NODE},
            )
        ]
    )
    state = observe_cluster(
        api, node=NODE, kubelet_dir=kubelet_with(tmp_path, "kubelet-1.29-numa-map.json")
    )
    assert state.vmi_resources == {"default/moving": ("nvidia.com/NVIDIA_A2-4Q",)}
    assert state.device_uses[A2_4Q_UUID].holder == f"VM default/moving (pod {POD_WITH_VGPU})"


def test_without_a_kubelet_dir_every_vm_resource_is_unknown() -> None:
    api = cluster(
        vmis=[vmi("win11", "vmi-1", gpus=("nvidia.com/NVIDIA_A2-4Q",), pods={POD_WITH_VGPU: NODE})]
    )
    state = observe_cluster(api, node=NODE)
    assert state.vmi_resources == {"default/win11": ("nvidia.com/NVIDIA_A2-4Q",)}
    assert state.device_uses == {}


def test_a_vmi_without_its_pod_still_counts() -> None:
    api = cluster(vmis=[vmi("starting", "vmi-3", gpus=("nvidia.com/NVIDIA_A2-4Q",))])
    state = observe_cluster(api, node=NODE)
    assert state.vmi_resources == {"default/starting": ("nvidia.com/NVIDIA_A2-4Q",)}


def test_a_finished_vms_pods_hold_nothing(tmp_path: Path) -> None:
    api = cluster(
        vmis=[
            # KubeVirt keeps a finished launcher in activePods until the pod is deleted; the
            # kubelet keeps its checkpoint entry until its next allocation.
            vmi(
                "done",
                "vmi-4",
                phase="Succeeded",
                gpus=("nvidia.com/NVIDIA_A2-4Q",),
                pods={POD_WITH_VGPU: NODE},
            ),
            vmi("pending", "vmi-5", gpus=("nvidia.com/NVIDIA_A2-8Q",)),
        ]
    )
    state = observe_cluster(
        api, node=NODE, kubelet_dir=kubelet_with(tmp_path, "kubelet-1.29-numa-map.json")
    )
    assert A2_4Q_UUID not in state.device_uses
    # The VMI that is not finished still counts, conservatively, as wanting its resource.
    assert state.vmi_resources == {"default/pending": ("nvidia.com/NVIDIA_A2-8Q",)}
    # The pod no VMI names still holds (another workload, or a launcher whose VMI is gone).
    assert state.device_uses[A2_4A_UUID].holder == f"pod {OTHER_POD}"


def test_missing_checkpoint_is_a_note(tmp_path: Path) -> None:
    state = observe_cluster(cluster(), node=NODE, kubelet_dir=tmp_path)
    assert state.notes == (
        f"no kubelet device-plugin checkpoint at {checkpoint_file(tmp_path)}: "
        "no vGPU is allocated to a pod",
    )


def test_malformed_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ObserveError, match="not a kubelet device-plugin checkpoint"):
        observe_cluster(cluster(), node=NODE, kubelet_dir=kubelet_with(tmp_path, "truncated.json"))


# -- inventory from the cluster ----------------------------------------------------------------


def contract_objects(node: str, inventory: Inventory) -> list[KubeObject]:
    """The node's objects written from the facts, independently of the planner: Harvester's
    fields on Harvester's kinds (docs/domain.md §5), the rest in the VGPUNodeState as its
    CRD describes it (schemas/crds/vgpunodestates.vgpu.reconciler.dev.yaml)."""
    out = []
    gpus, vgpus = [], []
    type_sets: list[list[dict[str, Any]]] = []
    for gpu in inventory.gpus:
        pf_name = object_name(node, str(gpu.address))
        vfs = sorted(gpu.vfs, key=lambda v: v.index)
        vf_names = [object_name(node, str(v.address)) for v in vfs]
        sriov: dict[str, Any] = {
            "totalVFs": gpu.total_vfs,
            "numVFs": gpu.num_vfs,
            "vfOffset": gpu.vf_offset,
            "vfStride": gpu.vf_stride,
        }
        if gpu.vf_device:
            sriov["vfDevice"] = gpu.vf_device
        gpus.append(
            {
                "address": str(gpu.address),
                "vendorId": gpu.vendor_id,
                "deviceId": gpu.device_id,
                "subsystemVendorId": gpu.subsystem_vendor_id,
                "subsystemDeviceId": gpu.subsystem_device_id,
                "model": gpu.model,
                "interface": gpu.interface.value,
                "driver": gpu.driver,
                "managed": True,
                "sriov": sriov,
                "vfAddresses": [str(v.address) for v in vfs],
                "typeSet": len(type_sets),  # one list per GPU: sharing is the planner's choice
            }
        )
        type_sets.append([t.to_json() for t in gpu.types])
        out.append(
            KubeObject(
                kind=SRIOV_GPU_KIND,
                name=pf_name,
                labels={NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
                spec={"address": str(gpu.address), "nodeName": node, "enabled": True},
                status={"vfAddresses": [str(v.address) for v in vfs], "vGPUDevices": vf_names}
                if vfs
                else {},
            )
        )
        ids = {t.name: t.type_id for t in gpu.types}
        for vf, name in zip(vfs, vf_names, strict=True):
            vg = vf.vgpu
            status: dict[str, Any] = {}
            if vg is not None:
                status = {"vGPUStatus": "vGPUConfigured", "uuid": vg.uuid}
                status["configureVGPUTypeName"] = vg.type_name
                entry = {"gpu": str(gpu.address), "vf": str(vf.address), "vfIndex": vf.index}
                entry |= {"profile": vg.type_name, "uuid": vg.uuid, "inUse": vg.in_use}
                if vg.holder:
                    entry["holder"] = vg.holder
                vgpus.append(entry)
            if vf.creatable:
                status["availableTypes"] = {n: ids.get(n, "") for n in sorted(vf.creatable)}
            out.append(
                KubeObject(
                    kind=VGPU_KIND,
                    name=name,
                    labels={NODE_LABEL: node, PARENT_LABEL: pf_name, MANAGED_BY_LABEL: MANAGED_BY},
                    spec={"address": str(vf.address), "enabled": False, "nodeName": node},
                    status=status,
                )
            )
    out.append(
        KubeObject(
            kind="VGPUNodeState",
            name=node,
            labels={NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
            spec={"nodeName": node},
            status={"gpus": gpus, "typeSets": type_sets, "vgpus": vgpus},
        )
    )
    return out


def case_inventory(case: str) -> Inventory:
    return Inventory.from_json(json.loads((CASES / case / "observed.json").read_text()))


def comparable(inventory: Inventory) -> dict[str, Any]:
    doc = inventory.to_json()
    doc.pop("sysfsRoot")
    for gpu in doc["gpus"]:
        for vf in gpu["vfs"]:
            if vf["vgpu"] is not None:  # what only the host knows: not in the cluster
                vf["vgpu"].pop("iommuGroup", None)
                vf["vgpu"].pop("removing", None)
    return doc


CASES_WITH_HOSTS = [
    "seed-already-applied",  # an A2 with four vGPUs
    "a16-four-gpus",  # SR-IOV on and off on one board
    "in-use-blocks-replacement",  # a vGPU in use, with its holder
    "unknown-gpu-model-sriov-off",  # a GPU the catalogue does not know
]


def _split(objects: list[KubeObject]) -> tuple[KubeObject, list[KubeObject], list[KubeObject]]:
    (state,) = [o for o in objects if o.kind == "VGPUNodeState"]
    return (
        state,
        [o for o in objects if o.kind == SRIOV_GPU_KIND],
        [o for o in objects if o.kind == VGPU_KIND],
    )


@pytest.mark.parametrize("case", CASES_WITH_HOSTS)
def test_inventory_round_trips_through_the_node_state_and_harvesters_objects(case: str) -> None:
    inventory = case_inventory(case)
    state, sriov, vgpus = _split(contract_objects(inventory.node, inventory))
    # Other nodes' objects in the same lists are ignored.
    _, other_sriov, other_vgpus = _split(
        contract_objects(OTHER, case_inventory("seed-already-applied"))
    )
    again = inventory_from_cluster(inventory.node, state, sriov + other_sriov, other_vgpus + vgpus)
    assert comparable(again) == comparable(inventory)


@pytest.mark.parametrize("case", CASES_WITH_HOSTS)
def test_inventory_round_trips_through_what_the_planner_writes(case: str) -> None:
    from reconciler.catalog import default_catalog
    from reconciler.model import CrCreate, DesiredGpu, DesiredNode
    from reconciler.model.cluster import ClusterState
    from reconciler.plan import plan_node

    inventory = case_inventory(case)
    desired = DesiredNode(
        inventory.node,
        tuple(
            DesiredGpu(
                address=g.address,
                sriov=g.sriov_enabled,
                vgpus={v.index: v.vgpu.type_name for v in g.vfs if v.vgpu is not None}
                if g.sriov_enabled
                else None,
            )
            for g in inventory.gpus
        ),
    )
    plan = plan_node(
        desired, inventory, catalog=default_catalog(), cluster=ClusterState(inventory.node)
    )
    # Through JSON, as the API server hands them back.
    written = [
        KubeObject.from_json(json.loads(json.dumps(a.object.to_json())))
        for a in plan.actions
        if isinstance(a, CrCreate)
    ]
    again = inventory_from_cluster(inventory.node, *_split(written))
    assert comparable(again) == comparable(inventory)


def test_a_node_without_a_node_state_cannot_be_planned_from_the_cluster() -> None:
    with pytest.raises(ObserveError) as err:
        inventory_from_cluster(NODE, None, [], [])
    assert err.value.message.startswith(f"node {NODE} has no VGPUNodeState: vgpuctl has not")


def test_a_vf_without_its_object_is_known_by_address_only() -> None:
    inventory = case_inventory("seed-already-applied")
    state, sriov, _ = _split(contract_objects(NODE, inventory))
    (gpu,) = inventory_from_cluster(NODE, state, sriov, []).gpus
    assert len(gpu.vfs) == 16
    assert all(not v.creatable for v in gpu.vfs)
    assert sum(v.vgpu is not None for v in gpu.vfs) == 4  # the node state lists them


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (
            {"gpus": [{"vfAddresses": ["0000:08:00.4", "nope"], "typeSet": 0}], "typeSets": [[]]},
            "status.gpus[0].vfAddresses[1] is not a PCI address",
        ),
        ({"gpus": "x"}, "status.gpus is not a list"),
        ({"gpus": [5]}, "status.gpus[0] is not an object"),
        (
            {
                "gpus": [{"address": "0000:08:00.0", "interface": "sriov", "typeSet": 0}],
                "typeSets": [[]],
            },
            "status.gpus is malformed",
        ),
        ({"gpus": [{"address": "0000:08:00.0"}]}, "status.gpus[0].typeSet is not an index"),
        ({"gpus": [{"typeSet": 1}], "typeSets": [[]]}, "status.gpus[0].typeSet is not an index"),
        ({"vgpus": [{"vf": "0000:08:00.4", "uuid": 7}]}, "status.vgpus[0].uuid is not text"),
        (
            {"vgpus": [{"vf": "0000:08:00.4", "holder": "x" * 5000}]},
            "status.vgpus[0].holder is longer than 1024 characters",
        ),
        ({"vgpus": [{"vf": "x"}]}, "status.vgpus[0].vf is not a PCI address"),
    ],
)
def test_a_malformed_node_state_names_object_and_field(
    status: dict[str, Any], message: str
) -> None:
    state = KubeObject.from_json({**node_state(NODE, {}), "status": status})
    with pytest.raises(ObserveError) as err:
        inventory_from_cluster(NODE, state, [], [])
    assert err.value.message.startswith(f"VGPUNodeState {NODE}: ")
    assert message in err.value.message


# -- many nodes ---------------------------------------------------------------------------------


def test_a_fleet_readers_vgpudevices_are_listed_from_the_moment_it_is_made() -> None:
    api = cluster()
    listed = threading.Event()
    real = api.list_objects

    def list_objects(**kw: Any) -> list[dict[str, Any]]:
        items = real(**kw)
        if kw["plural"] == "vgpudevices":
            listed.set()
        return items

    api.list_objects = list_objects  # type: ignore[method-assign]
    reader = FleetReader(api)
    # Read before observe is called (the caller reads its desired state meanwhile): nothing
    # but the VGPUDevices.
    assert listed.wait(10)
    assert [c[1] for c in api.calls] == ["vgpudevices"]
    result = reader.observe([NODE])
    assert sorted(c[1] for c in api.calls).count("vgpudevices") == 1
    seen = result[NODE]
    assert not isinstance(seen, ObserveError)
    assert sorted(seen[1].vgpu_devices) == [
        object_name(NODE, "0000:08:00.4"),
        object_name(NODE, "0000:08:00.5"),
    ]


def test_what_the_background_list_raises_observe_raises() -> None:
    api = cluster()
    api.fail["vgpudevices"] = ForbiddenError("vgpudevices: forbidden (403)")
    reader = FleetReader(api)
    with pytest.raises(ForbiddenError, match="vgpudevices: forbidden"):
        reader.observe([NODE])


def test_a_fleet_reader_given_up_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    # A server that accepts the connection and never answers: the list waits (its 10 s
    # timeout); the program gives the reader up at once (its desired state invalid, say) and
    # exits.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.getsockname()[1]}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        )
        program = (
            "import sys, time\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "from pathlib import Path\n"
            "from reconciler.kube import connect\n"
            "from reconciler.observe import FleetReader\n"
            f"reader = FleetReader(connect(Path({str(config)!r})))\n"
            "time.sleep(0.5)\n"
            "print('given up', flush=True)\n"
        )
        started = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
        )
        took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert res.stdout == "given up\n"
    assert took < 8  # not the list's 10 s timeout


def test_many_nodes_cost_one_list_per_kind() -> None:
    api = cluster(
        vmis=[
            vmi("a", "vmi-a", node=NODE, gpus=("nvidia.com/NVIDIA_A2-4Q",), pods={"p": NODE}),
            vmi("b", "vmi-b", node="elsewhere", gpus=("nvidia.com/NVIDIA_A2-4Q",)),
        ],
    )
    seed = case_inventory("seed-already-applied")
    for obj in contract_objects(NODE, seed)[-1:] + contract_objects(OTHER, seed)[-1:]:
        # The summaries say what each host has; the profiles which are configured.
        raw = obj.to_json()
        raw["status"]["profiles"] = (
            [{"name": "NVIDIA A2-4Q", "wanted": 1, "vgpus": 1}]
            if obj.name == NODE
            else [{"name": "NVIDIA A2-8Q", "wanted": 1, "vgpus": 0}]
        )
        raw["metadata"]["resourceVersion"] = "9"
        api.seed("vgpunodestates", [raw])
    nodes = [NODE, OTHER, "harvester-empty"]
    result = observe_nodes_from_cluster(api, nodes)
    # One list of each kind, in no fixed order: the VGPUDevices are listed on a thread of their
    # own (FleetReader).
    assert sorted(c[1] for c in api.calls) == [
        "kubevirts",
        "sriovgpudevices",
        "vgpudevices",
        "vgpunodestates",
        "virtualmachineinstances",
    ]
    assert list(result) == nodes
    seen = result[NODE]
    assert not isinstance(seen, ObserveError)
    inv, state = seen
    assert [str(g.address) for g in inv.gpus] == ["0000:08:00.0"]
    assert sorted(state.vgpu_devices) == [
        object_name(NODE, "0000:08:00.4"),
        object_name(NODE, "0000:08:00.5"),
    ]
    assert state.profiles_elsewhere == frozenset({ConfiguredProfile("NVIDIA A2-8Q")})
    assert state.vmi_resources == {"default/a": ("nvidia.com/NVIDIA_A2-4Q",)}
    other = result[OTHER]
    assert not isinstance(other, ObserveError)
    other_inv, other_state = other
    assert other_state.profiles_elsewhere == frozenset({ConfiguredProfile("NVIDIA A2-4Q")})
    assert other_state.vmi_resources == {}
    assert len(other_inv.gpus) == 1
    # A node vgpuctl never reconciled: no summary, so nothing to plan from.
    empty = result["harvester-empty"]
    assert isinstance(empty, ObserveError) and "has no VGPUNodeState" in empty.message


def test_a_summary_names_the_type_ids_of_its_vfio_gpus_and_nothing_else() -> None:
    """What a node's VGPUNodeState tells of its vfio GPUs' types (a lost record's stand-in):
    each vfio GPU's type set by id; an mdev GPU's ids mean nothing on vfio; entries that are
    not a PCI address, a decimal id and a driver's type name are untrusted and skipped."""
    l40s = [
        {"id": "1156", "name": "NVIDIA L40S-48Q"},
        {"id": "1155", "name": "NVIDIA L40S-24Q"},
        {"id": "x1", "name": "NVIDIA L40S-1Q"},
        {"id": "1152", "name": "NVIDIA L40S-8Q\u001b[2J"},
        {"id": "1153", "name": 7},
    ]
    state = {
        "metadata": {"name": "n1", "labels": {"nodename": "n1"}},
        "status": {
            "gpus": [
                {"address": "0000:08:00.0", "interface": "vfio", "typeSet": 0},
                {"address": "0000:41:00.0", "interface": "mdev", "typeSet": 1},
                {"address": "not-an-address", "interface": "vfio", "typeSet": 0},
                {"address": "0000:81:00.0", "interface": "vfio", "typeSet": 9},
            ],
            "typeSets": [l40s, [{"id": "nvidia-746", "name": "NVIDIA A2-4Q"}]],
        },
    }
    api = FakeCluster(read_only=True)
    api.seed("vgpunodestates", [state])
    gpu = PciAddress.parse("0000:08:00.0")
    assert summary_type_names(api, "n1") == {
        (gpu, "1156"): "NVIDIA L40S-48Q",
        (gpu, "1155"): "NVIDIA L40S-24Q",
    }
    assert summary_type_names(api, "n2") == {}  # no summary: nothing to name by
