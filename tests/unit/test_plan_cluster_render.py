"""render_objects: the node's CRs as they should be, checked against the seed's own examples."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.model import (
    VGPU,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    PciAddress,
    Vf,
    VGPUType,
)
from reconciler.model.cluster import KubeObject
from reconciler.plan.assign import assign_counts
from reconciler.plan.render import LAST_APPLIED_ANNOTATION, canonical_json, render_objects

REPO = Path(__file__).resolve().parents[2]
NODE = "harvester-kgd9c"
A2 = PciAddress.parse("0000:08:00.0")
CATALOG = default_catalog()


def _seed_objects() -> dict[str, KubeObject]:
    desired = load_desired([REPO / "desired-state" / "harvester-kgd9c.yaml"], catalog=CATALOG)
    node = desired.node(NODE)
    assert node is not None
    observed = REPO / "tests" / "cases" / "seed-already-applied" / "observed.json"
    inventory = Inventory.from_json(json.loads(observed.read_text(encoding="utf-8")))
    return {o.name: o for o in render_objects(NODE, node, inventory)}


def test_the_seed_node_renders_the_seeds_sriovgpudevice() -> None:
    # The seed's example: name, label, spec; status lists 16 VGPUDevice names and VF addresses
    # (the seed lists them in glob order, virtfn0, virtfn1, virtfn10, …; we list them by index).
    pf = _seed_objects()["harvester-kgd9c-000008000"]
    assert pf.kind == "SRIOVGPUDevice"
    assert pf.labels["nodename"] == NODE
    assert dict(pf.spec) == {"address": "0000:08:00.0", "enabled": True, "nodeName": NODE}
    seed_vf_addresses = [
        "0000:08:00.4", "0000:08:00.5", "0000:08:01.6", "0000:08:01.7", "0000:08:02.0",
        "0000:08:02.1", "0000:08:02.2", "0000:08:02.3", "0000:08:00.6", "0000:08:00.7",
        "0000:08:01.0", "0000:08:01.1", "0000:08:01.2", "0000:08:01.3", "0000:08:01.4",
        "0000:08:01.5",
    ]  # fmt: skip
    assert sorted(pf.status["vfAddresses"]) == sorted(seed_vf_addresses)
    assert pf.status["vfAddresses"] == sorted(seed_vf_addresses, key=PciAddress.parse)
    assert pf.status["vGPUDevices"] == [
        f"{NODE}-{a.replace(':', '').replace('.', '')}" for a in pf.status["vfAddresses"]
    ]
    assert pf.status["vGPUDevices"][2] == "harvester-kgd9c-000008006"
    # Harvester's status fields and nothing else (its CRD prunes the rest: docs/domain.md §5).
    assert set(pf.status) == {"vfAddresses", "vGPUDevices"}


@pytest.mark.parametrize(
    ("address", "profile"),
    [
        ("0000:08:00.4", "NVIDIA A2-4A"),
        ("0000:08:00.5", "NVIDIA A2-4Q"),
        ("0000:08:00.6", "NVIDIA A2-4A"),
        ("0000:08:00.7", "NVIDIA A2-4Q"),
    ],
)
def test_the_seed_nodes_configured_vgpudevices_are_the_seeds(address: str, profile: str) -> None:
    vf = _seed_objects()[f"{NODE}-{address.replace(':', '').replace('.', '')}"]
    assert vf.kind == "VGPUDevice"
    assert vf.labels["harvesterhci.io/parentSRIOVGPUDevice"] == "harvester-kgd9c-000008000"
    assert vf.labels["nodename"] == NODE
    assert dict(vf.spec) == {
        "address": address,
        "enabled": True,
        "nodeName": NODE,
        "parentGPUDeviceAddress": "0000:08:00.0",
        "vGPUTypeName": profile,
    }
    assert vf.status["vGPUStatus"] == "vGPUConfigured"
    assert vf.status["configureVGPUTypeName"] == profile
    assert len(vf.status["uuid"]) == 36
    # Nothing more can be created on the seed's A2 (4 of 4 4 GB vGPUs): availableTypes is
    # empty, so left out, as Harvester's omitempty leaves it.
    assert set(vf.status) == {"vGPUStatus", "configureVGPUTypeName", "uuid"}


def test_the_seed_nodes_other_vfs_are_disabled_and_empty() -> None:
    objects = _seed_objects()
    vf = objects["harvester-kgd9c-000008010"]
    assert vf.spec["enabled"] is False and vf.spec["vGPUTypeName"] == ""
    # No vGPU, and four 4 GB vGPUs are the A2's maximum: nothing more can be created anywhere.
    # Every status field is empty, so none is written (Harvester's omitempty).
    assert dict(vf.status) == {}
    assert len(objects) == 17


def test_every_object_is_marked_ours_and_annotated_with_its_spec() -> None:
    for o in _seed_objects().values():
        assert o.labels["app.kubernetes.io/managed-by"] == "vgpuctl"
        assert o.annotations[LAST_APPLIED_ANNOTATION] == canonical_json(dict(o.spec))
        assert json.loads(o.annotations[LAST_APPLIED_ANNOTATION]) == dict(o.spec)


def test_the_annotation_is_the_specs_canonical_text_whatever_the_names_hold() -> None:
    """The VGPUDevices' annotations are written from their parts: the text is still the one
    the whole spec's canonical JSON gives, escapes and all."""
    desired = load_desired([REPO / "desired-state" / "harvester-kgd9c.yaml"], catalog=CATALOG)
    node = desired.node(NODE)
    assert node is not None
    observed = REPO / "tests" / "cases" / "seed-already-applied" / "observed.json"
    inventory = Inventory.from_json(json.loads(observed.read_text(encoding="utf-8")))
    odd_name = 'n\u00e9"\\\t1'  # é, a quote, a backslash and a tab
    odd_profile = 'NVIDIA A2-4Q "\u2603"'
    gpu = node.gpus[0]
    assert gpu.vgpus is not None
    first = next(iter(gpu.vgpus))
    odd = replace(node, gpus=(replace(gpu, vgpus={**gpu.vgpus, first: odd_profile}),))
    for name, wanted in ((NODE, node), (odd_name, odd)):
        objects = render_objects(name, wanted, inventory)
        assert len(objects) == 17
        if wanted is odd:
            assert any(o.spec.get("vGPUTypeName") == odd_profile for o in objects)
        for o in objects:
            text = o.annotations[LAST_APPLIED_ANNOTATION]
            assert text == json.dumps(dict(o.spec), sort_keys=True, separators=(",", ":"))


def test_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json({"b": True, "a": "x y"}) == '{"a":"x y","b":true}'


@pytest.mark.parametrize(
    "value",
    [
        {"address": "0000:08:00.4", "enabled": True, "nodeName": "n1", "vGPUTypeName": ""},
        {"z": [1, None, False, -7], "a": {"y": 'q"uote', "b": "back\\slash/"}},
        {"control": "tab\tnew\nline\u001f", "nested": [[{"k": "v"}], []]},
        {"non-ascii": "caf\u00e9 \u2603 \U0001f600", "ascii": "plain"},
        {"big": 2**70, "small": -(2**63)},
        [],
        "",
    ],
)
def test_canonical_json_is_the_text_vgpuctl_always_wrote(value: object) -> None:
    # The oracle: what json.dumps writes (every last-applied annotation and fingerprint so
    # far): a text that differed would show every stored object as changed.
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"))


def test_canonical_json_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError):
        canonical_json({"a": MappingProxyType({"b": 1})})


def _types() -> tuple[VGPUType, ...]:
    return (
        VGPUType("NVIDIA L40S-8Q", "nvidia-1150", 8192, 6),
        VGPUType("NVIDIA L40S-8A", "nvidia-1160", 8192, 6),
        VGPUType("NVIDIA L40S-4Q", "nvidia-1149", 4096, 12),
    )


def _l40s(vgpus: dict[int, str], creatable: frozenset[str] = frozenset()) -> Gpu:
    address = PciAddress.parse("0000:41:00.0")
    base = Gpu(address, "10de", "26b9", model="NVIDIA L40S", total_vfs=32, num_vfs=32, vf_offset=2)
    vfs = tuple(
        Vf(
            base.predicted_vf_address(i),
            i,
            VGPU(f"uuid-{i}", vgpus[i]) if i in vgpus else None,
            frozenset() if i in vgpus else creatable,
        )
        for i in range(32)
    )
    return Gpu(
        address,
        "10de",
        "26b9",
        model="NVIDIA L40S",
        interface=Interface.MDEV,
        total_vfs=32,
        num_vfs=32,
        vf_offset=2,
        vfs=tuple(reversed(vfs)),  # read in any order: rendered by index
        types=_types(),
    )


def test_count_form_specs_follow_the_host_planners_assignment() -> None:
    gpu = _l40s({7: "NVIDIA L40S-8Q", 9: "NVIDIA L40S-8Q"}, frozenset({"NVIDIA L40S-8Q"}))
    node = DesiredNode(NODE, (DesiredGpu(gpu.address, True, profiles={"NVIDIA L40S-8Q": 3}),))
    objects = render_objects(NODE, node, Inventory(NODE, (gpu,)))
    # VGPUDevices follow the GPU's in VF index order: VF i is at 0000:41:00.2 + i.
    by_index = {o.spec["address"]: o for o in objects[1:]}
    assert list(by_index) == [str(gpu.predicted_vf_address(i)) for i in range(32)]
    configured = {i for i, o in enumerate(objects[1:]) if o.spec["enabled"]}
    assert configured == set(assign_counts(gpu.vfs, {"NVIDIA L40S-8Q": 3})) == {0, 7, 9}
    assert all(
        o.spec["vGPUTypeName"] == ("NVIDIA L40S-8Q" if o.spec["enabled"] else "")
        for o in objects[1:]
    )


def test_available_types_map_names_to_type_ids_in_the_drivers_order() -> None:
    gpu = _l40s({}, frozenset({"NVIDIA L40S-4Q", "NVIDIA L40S-8Q"}))
    node = DesiredNode(NODE, (DesiredGpu(gpu.address, True, vgpus={}),))
    vf = render_objects(NODE, node, Inventory(NODE, (gpu,)))[1]
    assert list(vf.status["availableTypes"].items()) == [
        ("NVIDIA L40S-8Q", "nvidia-1150"),
        ("NVIDIA L40S-4Q", "nvidia-1149"),
    ]


def test_in_use_and_holder_are_not_harvesters_fields() -> None:
    """Harvester's VGPUDevice has no field for who uses a vGPU: the VGPUNodeState says it
    (tests/unit/test_node_state.py)."""
    gpu = _l40s({0: "NVIDIA L40S-8Q"})
    held = tuple(
        Vf(v.address, v.index, VGPU("u", "NVIDIA L40S-8Q", True, "VM default/a")) if v.vgpu else v
        for v in gpu.vfs
    )
    gpu = replace(gpu, vfs=held)
    node = DesiredNode(NODE, (DesiredGpu(gpu.address, True, vgpus={0: "NVIDIA L40S-8Q"}),))
    vf = render_objects(NODE, node, Inventory(NODE, (gpu,)))[1]
    assert dict(vf.status) == {
        "vGPUStatus": "vGPUConfigured",
        "uuid": "u",
        "configureVGPUTypeName": "NVIDIA L40S-8Q",
    }


def test_only_managed_gpus_are_rendered_and_sriov_off_means_no_vgpudevices() -> None:
    on = _l40s({})
    off = Gpu(PciAddress.parse("0000:08:00.0"), "10de", "25b6", model="NVIDIA A2", total_vfs=16)
    unmanaged = Gpu(PciAddress.parse("0000:09:00.0"), "10de", "27b8", total_vfs=32)
    missing = PciAddress.parse("0000:0a:00.0")
    node = DesiredNode(
        NODE,
        (
            DesiredGpu(on.address, False),
            DesiredGpu(off.address, True, vgpus={0: "NVIDIA A2-4Q"}),
            DesiredGpu(missing, True),
        ),
    )
    objects = render_objects(NODE, node, Inventory(NODE, (unmanaged, on, off)))
    kinds = [(o.kind, o.name) for o in objects]
    assert kinds[0] == ("SRIOVGPUDevice", "harvester-kgd9c-000008000")
    assert kinds[1] == ("SRIOVGPUDevice", "harvester-kgd9c-000041000")
    assert len(objects) == 2 + 32  # the A2 has no VFs yet, the L4 is not managed
    assert objects[0].spec["enabled"] is True and dict(objects[0].status) == {}
    assert objects[1].spec["enabled"] is False
    assert not any(o.spec["enabled"] for o in objects[2:])
