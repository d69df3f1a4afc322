"""The cluster observer against an in-memory ClusterApi: which calls, and what it makes of them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.model import (
    ForbiddenError,
    Inventory,
    ObserveError,
    ResourceMissingError,
)
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    PARENT_LABEL,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    DeviceUse,
    KubeObject,
    object_name,
)
from reconciler.observe.checkpoint import checkpoint_file
from reconciler.observe.cluster import (
    inventory_from_crs,
    observe_cluster,
    observe_nodes_from_cluster,
)
from tests.doubles.cluster import FakeCluster, ListCall

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


def test_a_node_without_vms_costs_four_list_calls() -> None:
    api = cluster()
    state = observe_cluster(api, node=NODE)
    assert api.calls == [
        ("list", "sriovgpudevices", None),
        ("list", "vgpudevices", None),
        ("list", "kubevirts", None),
        ("list", "virtualmachineinstances", None),
    ]
    assert api.lists == [
        ListCall(GROUP, "v1beta1", "sriovgpudevices", None, f"nodename={NODE}", ""),
        ListCall(GROUP, "v1beta1", "vgpudevices", None, "", ""),
        ListCall("kubevirt.io", "v1", "kubevirts", None, "", ""),
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


def test_profiles_elsewhere_come_from_other_nodes_managed_enabled_objects() -> None:
    state = observe_cluster(cluster(), node=NODE)
    # Not this node's A2-4Q, not the unmanaged A2-2B, not the disabled VF.
    assert state.profiles_elsewhere == frozenset({"NVIDIA A2-8Q"})


def test_kubevirt_allow_list_and_owned_annotation() -> None:
    kv = observe_cluster(cluster(), node=NODE).kubevirt
    assert kv is not None
    assert (kv.namespace, kv.name, kv.resource_version) == ("harvester-system", "kubevirt", "42")
    assert [e["mdevNameSelector"] for e in kv.mediated_devices] == ["NVIDIA A2-4Q"]
    assert kv.owned == frozenset({"NVIDIA A2-4Q", "NVIDIA A2-8Q"})


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


# -- inventory from CR status -------------------------------------------------------------------


def contract_objects(node: str, inventory: Inventory) -> list[KubeObject]:
    """The CRs per the object shapes in contracts-cluster.md, written independently of the
    planner's renderer."""
    out = []
    for gpu in inventory.gpus:
        pf_name = object_name(node, str(gpu.address))
        vf_names = [object_name(node, str(v.address)) for v in gpu.vfs]
        out.append(
            KubeObject(
                kind=SRIOV_GPU_KIND,
                name=pf_name,
                labels={NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
                spec={"address": str(gpu.address), "nodeName": node, "enabled": True},
                status={
                    "vfAddresses": [str(v.address) for v in gpu.vfs],
                    "vGPUDevices": vf_names,
                    "model": gpu.model,
                    "vendorId": gpu.vendor_id,
                    "deviceId": gpu.device_id,
                    "subsystemVendorId": gpu.subsystem_vendor_id,
                    "subsystemDeviceId": gpu.subsystem_device_id,
                    "interface": gpu.interface.value,
                    "driver": gpu.driver,
                    "totalVFs": gpu.total_vfs,
                    "numVFs": gpu.num_vfs,
                    "vfOffset": gpu.vf_offset,
                    "vfStride": gpu.vf_stride,
                    "vgpuTypes": [t.to_json() for t in gpu.types],
                },
            )
        )
        ids = {t.name: t.type_id for t in gpu.types}
        for vf, name in zip(gpu.vfs, vf_names, strict=True):
            vg = vf.vgpu
            out.append(
                KubeObject(
                    kind=VGPU_KIND,
                    name=name,
                    labels={NODE_LABEL: node, PARENT_LABEL: pf_name, MANAGED_BY_LABEL: MANAGED_BY},
                    spec={"address": str(vf.address), "enabled": False, "nodeName": node},
                    status={
                        "vGPUStatus": "vGPUConfigured" if vg else "",
                        "uuid": vg.uuid if vg else "",
                        "configureVGPUTypeName": vg.type_name if vg else "",
                        "availableTypes": {n: ids.get(n, "") for n in sorted(vf.creatable)},
                        "vfIndex": vf.index,
                        "inUse": bool(vg and vg.in_use),
                        "holder": vg.holder if vg else "",
                    },
                )
            )
    return out


def case_inventory(case: str) -> Inventory:
    return Inventory.from_json(json.loads((CASES / case / "observed.json").read_text()))


def comparable(inventory: Inventory) -> dict[str, Any]:
    doc = inventory.to_json()
    doc.pop("sysfsRoot")
    return doc


CASES_WITH_HOSTS = [
    "seed-already-applied",  # an A2 with four vGPUs
    "a16-four-gpus",  # SR-IOV on and off on one board
    "in-use-blocks-replacement",  # a vGPU in use, with its holder
    "unknown-gpu-model-sriov-off",  # a GPU the catalogue does not know
]


@pytest.mark.parametrize("case", CASES_WITH_HOSTS)
def test_inventory_round_trips_through_cr_status(case: str) -> None:
    inventory = case_inventory(case)
    objects = contract_objects(inventory.node, inventory)
    # Other nodes' objects in the same lists are ignored.
    other = contract_objects(OTHER, case_inventory("seed-already-applied"))
    sriov = [o for o in objects + other if o.kind == SRIOV_GPU_KIND]
    vgpus = [o for o in other + objects if o.kind == VGPU_KIND]
    again = inventory_from_crs(inventory.node, sriov, vgpus)
    assert comparable(again) == comparable(inventory)
    assert again.fingerprint() == inventory.fingerprint()


@pytest.mark.parametrize("case", CASES_WITH_HOSTS)
def test_inventory_round_trips_through_the_planners_renderer(case: str) -> None:
    from reconciler.model import DesiredGpu
    from reconciler.plan.render import render_with

    inventory = case_inventory(case)
    desired = [DesiredGpu(address=g.address, sriov=g.sriov_enabled) for g in inventory.gpus]
    objects = render_with(inventory.node, desired, inventory, {})
    # Through JSON, as the API server hands them back.
    stored = [KubeObject.from_json(json.loads(json.dumps(o.to_json()))) for o in objects]
    again = inventory_from_crs(
        inventory.node,
        [o for o in stored if o.kind == SRIOV_GPU_KIND],
        [o for o in stored if o.kind == VGPU_KIND],
    )
    assert comparable(again) == comparable(inventory)


def test_a_gpu_object_without_status_is_sriov_off() -> None:
    obj = KubeObject.from_json(sriov_device(NODE))
    inventory = inventory_from_crs(NODE, [obj], [])
    (gpu,) = inventory.gpus
    assert (str(gpu.address), gpu.sriov_enabled, gpu.vfs, gpu.model) == (
        "0000:08:00.0",
        False,
        (),
        None,
    )


def test_a_vf_without_its_object_is_known_by_address_only() -> None:
    inventory = case_inventory("seed-already-applied")
    objects = [o for o in contract_objects(NODE, inventory) if o.kind == SRIOV_GPU_KIND]
    (gpu,) = inventory_from_crs(NODE, objects, []).gpus
    assert len(gpu.vfs) == 16
    assert all(v.vgpu is None and not v.creatable for v in gpu.vfs)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ({"vfAddresses": ["0000:08:00.4", "nope"]}, "status.vfAddresses[1] is not a PCI address"),
        ({"totalVFs": "16"}, "status.totalVFs is not an integer: '16'"),
        ({"interface": "sriov"}, "status.interface is not mdev, vfio or none: 'sriov'"),
        ({"vgpuTypes": [{"name": "NVIDIA A2-4Q"}]}, "status.vgpuTypes[0] is malformed"),
        ({"vfAddresses": "0000:08:00.4"}, "status.vfAddresses is not a list"),
    ],
)
def test_malformed_status_names_object_and_field(status: dict[str, Any], message: str) -> None:
    raw = sriov_device(NODE)
    raw["status"] = status
    with pytest.raises(ObserveError) as err:
        inventory_from_crs(NODE, [KubeObject.from_json(raw)], [])
    assert err.value.message.startswith(f"SRIOVGPUDevice {object_name(NODE, '0000:08:00.0')}: ")
    assert message in err.value.message


# -- many nodes ---------------------------------------------------------------------------------


def test_many_nodes_cost_one_list_per_kind() -> None:
    api = cluster(
        vmis=[
            vmi("a", "vmi-a", node=NODE, gpus=("nvidia.com/NVIDIA_A2-4Q",), pods={"p": NODE}),
            vmi("b", "vmi-b", node="elsewhere", gpus=("nvidia.com/NVIDIA_A2-4Q",)),
        ],
    )
    nodes = [NODE, OTHER, "harvester-empty"]
    result = observe_nodes_from_cluster(api, nodes)
    assert [c[1] for c in api.calls] == [
        "sriovgpudevices",
        "vgpudevices",
        "kubevirts",
        "virtualmachineinstances",
    ]
    assert list(result) == nodes
    inv, state = result[NODE]
    assert [str(g.address) for g in inv.gpus] == ["0000:08:00.0"]
    assert sorted(state.vgpu_devices) == [
        object_name(NODE, "0000:08:00.4"),
        object_name(NODE, "0000:08:00.5"),
    ]
    assert state.profiles_elsewhere == frozenset({"NVIDIA A2-8Q"})
    assert state.vmi_resources == {"default/a": ("nvidia.com/NVIDIA_A2-4Q",)}
    other_inv, other_state = result[OTHER]
    assert other_state.profiles_elsewhere == frozenset({"NVIDIA A2-4Q"})
    assert other_state.vmi_resources == {}
    assert len(other_inv.gpus) == 1
    empty_inv, empty_state = result["harvester-empty"]
    assert (empty_inv.gpus, dict(empty_state.vgpu_devices)) == ((), {})
