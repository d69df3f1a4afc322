"""Harvester's objects read for delegate mode (``observe/harvester_devices.py``). The objects
below are written by hand in the shape pcidevices' Go types give them
(``pkg/apis/devices.harvesterhci.io/v1beta1/sriovgpudevice.go``: ``omitempty`` status fields,
``vGPUTypeName`` possibly absent) and its VM annotation (``common.go`` ``AllocationDetails``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler.model import PciAddress
from reconciler.observe.harvester_devices import (
    ALLOCATION_ANNOTATION,
    ObjectError,
    allocated_devices,
    harvester_node,
    parse_gpu,
    parse_vf,
)

NODE = "harvester-kgd9c"
GPU = PciAddress.parse("0000:08:00.0")


def gpu_object(enabled: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1",
        "kind": "SRIOVGPUDevice",
        "metadata": {"name": f"{NODE}-000008000", "resourceVersion": "11",
                     "labels": {"nodename": NODE}},
        "spec": {"address": "0000:08:00.0", "nodeName": NODE, "enabled": enabled},
        "status": status,
    }  # fmt: skip


def vf_object(
    function: int, *, enabled: bool = False, type_name: str | None = None, **status: Any
) -> dict[str, Any]:
    address = f"0000:08:00.{function}"
    spec: dict[str, Any] = {"address": address, "enabled": enabled, "nodeName": NODE,
                            "parentGPUDeviceAddress": "0000:08:00.0"}  # fmt: skip
    if type_name is not None:
        spec["vGPUTypeName"] = type_name
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1",
        "kind": "VGPUDevice",
        "metadata": {"name": f"{NODE}-00000800{function}", "resourceVersion": f"2{function}",
                     "labels": {"nodename": NODE}},
        "spec": spec,
        "status": status,
    }  # fmt: skip


def vm(name: str, details: object) -> dict[str, Any]:
    text = details if isinstance(details, str) else json.dumps(details)
    return {"metadata": {"name": name, "namespace": "default",
                         "annotations": {ALLOCATION_ANNOTATION: text}}}  # fmt: skip


def test_a_gpu_object_reads_as_its_fields() -> None:
    gpu = parse_gpu(
        gpu_object(
            vfAddresses=["0000:08:00.4", "0000:08:00.5"],
            vGPUDevices=[f"{NODE}-000008004", f"{NODE}-000008005"],
        )
    )
    assert (gpu.name, gpu.resource_version, gpu.address, gpu.enabled) == (
        f"{NODE}-000008000",
        "11",
        GPU,
        True,
    )
    assert [str(a) for a in gpu.vf_addresses] == ["0000:08:00.4", "0000:08:00.5"]
    assert gpu.vgpu_devices == (f"{NODE}-000008004", f"{NODE}-000008005")
    # Harvester leaves empty status fields out, and a disabled GPU has none.
    off = parse_gpu(gpu_object(enabled=False))
    assert off.enabled is False and off.vf_addresses == () and off.vgpu_devices == ()


def test_a_vf_object_reads_as_its_fields() -> None:
    vf = parse_vf(
        vf_object(
            5,
            enabled=True,
            type_name="NVIDIA A2-4Q",
            vGPUStatus="vGPUConfigured",
            uuid="752",
            configureVGPUTypeName="NVIDIA A2-4Q",
            availableTypes={"NVIDIA A2-4Q": "nvidia-745"},
        )
    )
    assert vf.enabled and vf.configured and vf.configured_type == "NVIDIA A2-4Q"
    assert (str(vf.address), str(vf.parent), vf.uuid) == ("0000:08:00.5", "0000:08:00.0", "752")
    assert dict(vf.available) == {"NVIDIA A2-4Q": "nvidia-745"}
    # The UI leaves vGPUTypeName out: it reads as empty; an empty status as not configured.
    bare = parse_vf(vf_object(4))
    assert (bare.type_name, bare.configured, bare.enabled, dict(bare.available)) == (
        "",
        False,
        False,
        {},
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda o: o["spec"].update(address="08:00.5"), "spec.address is '08:00.5', not a PCI"),
        (lambda o: o["spec"].update(enabled="yes"), "spec.enabled is not true or false"),
        (lambda o: o["status"].update(vGPUStatus="busy"), "status.vGPUStatus is 'busy'"),
        (lambda o: o["status"].update(availableTypes=["x"]), "status.availableTypes is not a map"),
        (lambda o: o["metadata"].pop("resourceVersion"), "metadata.resourceVersion is missing"),
        (lambda o: o.update(spec="x"), "spec is not an object"),
    ],
)
def test_a_damaged_vf_object_is_refused_naming_the_field(damage: Any, message: str) -> None:
    raw = vf_object(5, vGPUStatus="")
    damage(raw)
    with pytest.raises(ObjectError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_vf(raw)


def test_the_allocation_annotation_lists_gpus_and_host_devices() -> None:
    details = {
        "gpus": {"nvidia.com/NVIDIA_A2-4Q": [f"{NODE}-000008005"]},
        "hostdevices": {"nvidia.com/NVIDIA_A2-4Q": [f"{NODE}-000008006"]},
    }
    assert allocated_devices(vm("win11", details)) == {f"{NODE}-000008005", f"{NODE}-000008006"}
    assert allocated_devices({"metadata": {"name": "plain"}}) == frozenset()
    for bad in ("{not json", json.dumps(["a"]), json.dumps({"gpus": {"r": "x"}})):
        with pytest.raises(ObjectError, match="VM default/bad: annotation"):
            allocated_devices(vm("bad", bad))


def _node(**kw: Any) -> Any:
    return harvester_node(
        NODE,
        [gpu_object(vfAddresses=["0000:08:00.4", "0000:08:00.5"])],
        [
            vf_object(
                4,
                enabled=True,
                type_name="NVIDIA A2-4Q",
                vGPUStatus="vGPUConfigured",
                configureVGPUTypeName="NVIDIA A2-4Q",
            ),
            vf_object(5, availableTypes={"NVIDIA A2-4Q": "nvidia-745"}),
        ],
        **kw,
    )


def test_a_node_names_who_uses_which_vf() -> None:
    details = {"gpus": {"nvidia.com/NVIDIA_A2-4Q": [f"{NODE}-000008004"]}}
    node = _node(vms=[vm("win11", details)])
    assert dict(node.used_by) == {f"{NODE}-000008004": "VM default/win11"}
    assert [str(v.address) for v in node.vfs_of(GPU)] == ["0000:08:00.4", "0000:08:00.5"]


def test_a_running_vmi_of_the_profile_may_hold_any_configured_vf_of_it() -> None:
    vmi = {
        "metadata": {"name": "db", "namespace": "prod"},
        "spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName":
                 "nvidia.com/NVIDIA_A2-4Q"}]}}},
        "status": {"phase": "Running", "nodeName": NODE},
    }  # fmt: skip
    node = _node(vmis=[vmi])
    assert dict(node.used_by) == {f"{NODE}-000008004": "VM prod/db (running; allocation unknown)"}
    elsewhere = {**vmi, "status": {"phase": "Running", "nodeName": "other-node"}}
    assert dict(_node(vmis=[elsewhere]).used_by) == {}


def test_a_running_vmi_holds_a_vf_whose_type_has_a_run_of_spaces_by_harvesters_name() -> None:
    """A type named ``NVIDIA  A2-4Q`` (two spaces) is the resource ``nvidia.com/NVIDIA_A2-4Q``
    on Harvester (pcidevices ``GeneratevGPUDeviceName``: a run of whitespace is one ``_``), and
    that is what a VMI asks for. vgpuctl compared with ``nvidia.com/NVIDIA__A2-4Q`` and missed
    the VMI: the VF counted as free, and could be disabled under the VM."""
    vmi = {
        "metadata": {"name": "db", "namespace": "prod"},
        "spec": {"domain": {"devices": {"hostDevices": [{"name": "g", "deviceName":
                 "nvidia.com/NVIDIA_A2-4Q"}]}}},
        "status": {"phase": "Running", "nodeName": NODE},
    }  # fmt: skip
    node = harvester_node(
        NODE,
        [gpu_object(vfAddresses=["0000:08:00.4", "0000:08:00.5"])],
        [
            vf_object(
                4,
                enabled=True,
                type_name="NVIDIA  A2-4Q",
                vGPUStatus="vGPUConfigured",
                configureVGPUTypeName="NVIDIA  A2-4Q",
            ),
            vf_object(5),
        ],
        vmis=[vmi],
    )
    assert dict(node.used_by) == {f"{NODE}-000008004": "VM prod/db (running; allocation unknown)"}


def test_an_unreadable_annotation_counts_every_configured_vf_as_used() -> None:
    node = _node(vms=[vm("odd", "{not json")])
    held = "VM default/odd (allocation annotation unreadable)"
    assert dict(node.used_by) == {f"{NODE}-000008004": held}
    # Said in one line naming the VM and the annotation; the node is not blocked for it.
    assert node.notes == ()
    (line,) = node.unread_holders
    assert line.startswith(f"VM default/odd: annotation {ALLOCATION_ANNOTATION} is not JSON: ")


def test_an_unreadable_annotation_holds_only_what_its_vm_could_hold() -> None:
    deep = vm("deep", "[" * 200_000)
    assert "nests deeper than 32 levels" in _node(vms=[deep]).unread_holders[0]

    def requesting(resource: str) -> dict[str, Any]:
        devices = {"hostDevices": [{"name": "g", "deviceName": resource}]}
        return {**deep, "spec": {"template": {"spec": {"domain": {"devices": devices}}}}}

    # Its template asks for this node's configured profile: those VFs; for another: none.
    held = _node(vms=[requesting("nvidia.com/NVIDIA_A2-4Q")])
    assert list(held.used_by) == [f"{NODE}-000008004"]
    other = _node(vms=[requesting("nvidia.com/NVIDIA_A2-8Q")])
    assert (dict(other.used_by), other.unread_holders) == ({}, ())
    # Its VMI runs on another node: its devices are there.
    vmi = {"metadata": {"name": "deep", "namespace": "default"},
           "status": {"phase": "Running", "nodeName": "other-node"}}  # fmt: skip
    elsewhere = _node(vms=[deep], vmis=[vmi])
    assert (dict(elsewhere.used_by), elsewhere.unread_holders) == ({}, ())


def test_a_damaged_object_is_left_out_with_a_note() -> None:
    broken = vf_object(6)
    broken["spec"]["parentGPUDeviceAddress"] = 7
    node = harvester_node(NODE, [gpu_object()], [broken])
    assert node.vfs == ()
    assert node.notes == (
        f"VGPUDevice {NODE}-000008006: spec.parentGPUDeviceAddress is not a PCI address",
    )


def test_every_node_is_read_from_six_lists_whatever_their_number() -> None:
    from reconciler.observe.delegate import observe_harvester_nodes
    from tests.doubles.cluster import FakeCluster

    api = FakeCluster(read_only=True)  # delegate observation only reads
    other = "harvester-other"
    theirs = gpu_object()
    theirs["metadata"] = {**theirs["metadata"], "name": f"{other}-000008000",
                          "labels": {"nodename": other}}  # fmt: skip
    api.seed("sriovgpudevices", [gpu_object(), theirs])
    api.seed("vgpudevices", [vf_object(4, enabled=True, type_name="NVIDIA A2-4Q",
                                       vGPUStatus="vGPUConfigured",
                                       configureVGPUTypeName="NVIDIA A2-4Q")])  # fmt: skip
    details = {"gpus": {"nvidia.com/NVIDIA_A2-4Q": [f"{NODE}-000008004"]}}
    api.seed("virtualmachines", [vm("win11", details)])
    api.seed("virtualmachineinstances", [])
    api.seed(
        "pcidevices",
        [{"metadata": {"name": f"{NODE}-000008000"},
          "status": {"address": "0000:08:00.0", "vendorId": "10de", "deviceId": "25B6",
                     "nodeName": NODE}}],
    )  # fmt: skip
    # pcidevices names a MigConfiguration as its GPU's SRIOVGPUDevice (gpu_controller.go
    # setupMigConfiguration), with no nodename label: the other node's GPU has one here; an
    # object without a name says nothing.
    api.seed("migconfigurations", [{"metadata": {"name": f"{other}-000008000"}},
                                   {"metadata": {"name": 7}}])  # fmt: skip
    nodes = observe_harvester_nodes(api, [NODE, other, "empty-node"])
    assert sorted(nodes) == ["empty-node", NODE, other]
    assert [g.name for g in nodes[NODE].gpus] == [f"{NODE}-000008000"]
    assert [g.name for g in nodes[other].gpus] == [f"{other}-000008000"]
    assert nodes["empty-node"].gpus == () and nodes["empty-node"].vfs == ()
    assert dict(nodes[NODE].used_by) == {f"{NODE}-000008004": "VM default/win11"}
    assert dict(nodes[NODE].pci_ids) == {GPU: ("10de", "25b6")}
    assert dict(nodes[other].pci_ids) == {}
    assert nodes[other].mig_configured == {f"{other}-000008000"}
    assert nodes[NODE].mig_configured == frozenset()
    assert sorted(c.plural for c in api.lists) == [
        "migconfigurations",
        "pcidevices",
        "pods",  # the NVIDIA driver pods: one list, in harvester-system (issue 30)
        "sriovgpudevices",
        "vgpudevices",
        "virtualmachineinstances",
        "virtualmachines",
    ]
    assert {verb for verb, _, _ in api.calls} == {"list"}


def test_who_uses_a_device_now_is_three_lists_not_the_whole_observation() -> None:
    # Asked right before every disable: the node's VGPUDevices (by label), the VMs, the VMIs.
    from reconciler.observe.delegate import devices_in_use
    from tests.doubles.cluster import FakeCluster

    api = FakeCluster(read_only=True)
    api.seed("vgpudevices", [vf_object(4, enabled=True, type_name="NVIDIA A2-4Q",
                                       vGPUStatus="vGPUConfigured",
                                       configureVGPUTypeName="NVIDIA A2-4Q")])  # fmt: skip
    api.seed("virtualmachines", [vm("win11", {"hostdevices": {"r": [f"{NODE}-000008004"]}})])
    api.seed("virtualmachineinstances", [])
    assert dict(devices_in_use(api, NODE)) == {f"{NODE}-000008004": "VM default/win11"}
    assert sorted(c.plural for c in api.lists) == [
        "vgpudevices",
        "virtualmachineinstances",
        "virtualmachines",
    ]
    assert [c.label_selector for c in api.lists if c.plural == "vgpudevices"] == [
        f"nodename={NODE}"
    ]
