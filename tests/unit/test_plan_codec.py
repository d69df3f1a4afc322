"""The plan codec (``reconciler.model.plan_json``) against the plan schema, and on bad input.

``schemas/plan.schema.json`` is written by hand; these tests hold it to what the codec writes:
for every action kind, the schema's definition has exactly the fields the codec writes (all of
them when every optional field is set) and requires exactly those it always writes; plans built
by hypothesis from every action type validate and come back unchanged through the codec. A
damaged document is one :class:`PlanFormatError` line naming the field, never another exception.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.model import (
    ACTION_TYPES,
    ActionKind,
    Blocked,
    CrCreate,
    CrDelete,
    CrUpdate,
    DevicePluginRefresh,
    Intent,
    KubevirtAllow,
    KubevirtUpdate,
    MediatedDevice,
    Noop,
    Observation,
    PciAddress,
    PciHostDevice,
    Phase,
    Plan,
    SriovDisable,
    SriovEnable,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
    VgpuCreate,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
    WantedProfile,
)
from reconciler.model.cluster import KubeObject, object_name
from reconciler.model.plan import Drift, FieldChange
from reconciler.model.plan_json import (
    PlanFormatError,
    action_from_json,
    action_to_json,
    blocked_to_json,
    plan_from_json,
    plan_to_json,
)

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json").read_text("utf-8")
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
DEFS = SCHEMA["$defs"]

GPU = PciAddress.parse("0000:08:00.0")
UUID = "5adb8e42-c29a-5705-8ae0-584ba08668b0"
OBJECT = KubeObject(
    kind="VGPUDevice",
    name="node-1-000008004",
    labels={"nodename": "node-1", "app.kubernetes.io/managed-by": "vgpuctl"},
    annotations={"vgpu.reconciler.dev/last-applied-spec": "{}"},
    spec={"address": "0000:08:00.4", "nodeName": "node-1", "vGPUTypeName": "NVIDIA A2-4Q"},
    status={"configureStatus": "Configured"},
    resource_version="41",
    retained={"finalizers": ["wrangler.cattle.io/x"]},
)
CHANGE = FieldChange("spec.vGPUTypeName", "NVIDIA A2-4A", "NVIDIA A2-4Q")

#: Per kind: an action with every optional field set, and one with none.
FULL = {
    ActionKind.VGPU_REMOVE: VgpuRemove(
        seq=1, target="0000:08:00.4", reason="r", gpu=GPU, vf_index=0,
        type_name="NVIDIA A2-4A", uuid=UUID, replaced_by="NVIDIA A2-4Q",
    ),
    ActionKind.SRIOV_DISABLE: SriovDisable(seq=1, target=str(GPU), reason="r", gpu=GPU),
    ActionKind.SRIOV_ENABLE: SriovEnable(seq=1, target=str(GPU), reason="r", gpu=GPU, num_vfs=16),
    ActionKind.VGPU_MODE: VgpuModeSet(
        seq=1, target=str(GPU), reason="r", gpu=GPU, mode=VgpuMode.MIXED_SIZE
    ),
    ActionKind.VGPU_CREATE: VgpuCreate(
        seq=1, target="0000:08:00.4", reason="r", gpu=GPU, vf_index=0,
        type_name="NVIDIA A2-4Q", uuid=UUID, replaces="NVIDIA A2-4A",
    ),
    ActionKind.CR_CREATE: CrCreate(seq=1, target=OBJECT.name, reason="r", object=OBJECT),
    ActionKind.CR_UPDATE: CrUpdate(
        seq=1, target=OBJECT.name, reason="r", resource_version="41", object=OBJECT,
        spec_changed=True, status_changed=True, changes=(CHANGE,), drift=True, adopt=True,
    ),
    ActionKind.CR_DELETE: CrDelete(
        seq=1, target=OBJECT.name, reason="r", object_kind="VGPUDevice", resource_version="41"
    ),
    ActionKind.KUBEVIRT_ALLOW: KubevirtAllow(
        seq=1, target="kubevirt/harvester-system/kubevirt", reason="r",
        namespace="harvester-system", name="kubevirt", resource_version="7",
        add=(MediatedDevice("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),), owned=("NVIDIA A2-4Q",),
        add_pci=(PciHostDevice("10DE:26B9", "nvidia.com/NVIDIA_L40S-8Q"),),
        owned_pci=("nvidia.com/NVIDIA_L40S-8Q",), unmark=("NVIDIA A2-4Q",),
        intent=Intent("node-1", (WantedProfile("NVIDIA A2-4Q", 2),)),
    ),
    ActionKind.KUBEVIRT_UPDATE: KubevirtUpdate(
        seq=1, target="kubevirt/harvester-system/kubevirt", reason="r",
        namespace="harvester-system", name="kubevirt", resource_version="7",
        add=(MediatedDevice("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),),
        remove=("NVIDIA A2-4A",), owned=("NVIDIA A2-4Q",),
        add_pci=(PciHostDevice("10DE:26B9", "nvidia.com/NVIDIA_L40S-8Q"),),
        remove_pci=("nvidia.com/NVIDIA_L40S-4Q",), owned_pci=("nvidia.com/NVIDIA_L40S-8Q",),
        retire=("NVIDIA A2-8Q",), unmark=("NVIDIA A2-2Q",),
    ),
    ActionKind.VGPUDEVICE_DISABLE: VgpuDeviceDisable(
        seq=1, target="n1-000008004", reason="r", node="n1", gpu=GPU,
        vf=PciAddress.parse("0000:08:00.4"), vf_index=0, resource_version="12",
        type_name="NVIDIA A2-4A", replaced_by="NVIDIA A2-4Q", pending=True,
    ),
    ActionKind.SRIOVGPUDEVICE_DISABLE: SriovGpuDeviceDisable(
        seq=1, target="n1-000008000", reason="r", node="n1", gpu=GPU, resource_version="9",
    ),
    ActionKind.SRIOVGPUDEVICE_ENABLE: SriovGpuDeviceEnable(
        seq=1, target="n1-000008000", reason="r", node="n1", gpu=GPU, resource_version="9",
    ),
    ActionKind.VGPUDEVICE_ENABLE: VgpuDeviceEnable(
        seq=1, target="n1-000008004", reason="r", node="n1", gpu=GPU,
        vf=PciAddress.parse("0000:08:00.4"), vf_index=0, resource_version="",
        type_name="NVIDIA A2-4Q", replaces="NVIDIA A2-4A", pending=True, object_exists=False,
    ),
    ActionKind.DEVICE_PLUGIN_REFRESH: DevicePluginRefresh(
        seq=1, target="nvidia.com/NVIDIA_A2-4Q", reason="r", resource="nvidia.com/NVIDIA_A2-4Q",
        type_name="NVIDIA A2-4Q", devices=(UUID,),
    ),
}  # fmt: skip
#: The optional fields, each kind's: unset in the minimal action.
OPTIONAL: dict[ActionKind, dict[str, Any]] = {
    ActionKind.VGPU_REMOVE: {"replaced_by": None},
    ActionKind.VGPU_CREATE: {"replaces": None},
    ActionKind.CR_UPDATE: {"adopt": False},
    ActionKind.KUBEVIRT_UPDATE: {
        "add_pci": (),
        "remove_pci": (),
        "owned_pci": (),
        "retire": (),
        "unmark": (),
    },
    ActionKind.KUBEVIRT_ALLOW: {"add_pci": (), "owned_pci": (), "unmark": (), "intent": None},
    ActionKind.VGPUDEVICE_DISABLE: {"replaced_by": None, "pending": False},
    # An object that exists has a resourceVersion (one not made yet has "").
    ActionKind.VGPUDEVICE_ENABLE: {
        "replaces": None,
        "pending": False,
        "object_exists": True,
        "resource_version": "12",
    },
}


def _schema_def(kind: ActionKind) -> dict[str, Any]:
    """The definition ``action`` uses for ``kind`` (through its if/then on kind)."""
    for branch in DEFS["action"]["allOf"]:
        if branch["if"]["properties"]["kind"]["const"] == kind.value:
            ref = branch["then"]["$ref"].removeprefix("#/$defs/")
            definition: dict[str, Any] = DEFS[ref]
            return definition
    raise AssertionError(f"the schema has no definition for {kind}")


def test_every_kind_has_one_type_and_an_example() -> None:
    assert set(ACTION_TYPES) == set(ActionKind) == set(FULL)
    for kind, action in FULL.items():
        assert type(action) is ACTION_TYPES[kind] and action.kind is kind


@pytest.mark.parametrize("kind", list(ActionKind))
def test_the_schema_definition_of_each_kind_has_the_fields_the_codec_writes(
    kind: ActionKind,
) -> None:
    definition = _schema_def(kind)
    full = action_to_json(FULL[kind])
    minimal = action_to_json(replace(FULL[kind], **OPTIONAL.get(kind, {})))
    assert definition["additionalProperties"] is False
    assert set(definition["properties"]) == set(full)
    assert set(definition["required"]) | {"seq"} == set(minimal)
    assert "seq" not in definition["required"]  # a blocked action has none; actions require it
    assert definition["properties"]["kind"] == {"const": kind.value}
    assert definition["properties"]["phase"] == {"const": kind.phase.value}
    assert full["phase"] == kind.phase.value


@pytest.mark.parametrize("kind", list(ActionKind))
def test_numbering_an_action_changes_its_seq_only(kind: ActionKind) -> None:
    action = replace(FULL[kind], seq=0)
    numbered = action.numbered(7)
    assert numbered == replace(action, seq=7) and type(numbered) is type(action)
    assert action.seq == 0  # a new action: the original is untouched


def test_the_phases_are_allow_list_then_host_then_cluster_then_device_plugins() -> None:
    phases = [k.phase for k in ActionKind]  # in run order
    order = [Phase.ALLOW_LIST, Phase.HOST, Phase.CLUSTER, Phase.DEVICE_PLUGINS]
    assert phases == sorted(phases, key=order.index)
    assert [k for k in ActionKind if k.phase is Phase.ALLOW_LIST] == [ActionKind.KUBEVIRT_ALLOW]
    assert {k for k in ActionKind if k.phase is Phase.HOST} == {
        ActionKind.VGPU_REMOVE,
        ActionKind.SRIOV_DISABLE,
        ActionKind.SRIOV_ENABLE,
        ActionKind.VGPU_MODE,
        ActionKind.VGPU_CREATE,
    }
    assert [k for k in ActionKind if k.phase is Phase.DEVICE_PLUGINS] == [
        ActionKind.DEVICE_PLUGIN_REFRESH
    ]


@pytest.mark.parametrize("kind", [k for k in ActionKind if k.is_host])
def test_a_blocked_host_action_is_the_action_without_seq(kind: ActionKind) -> None:
    blocked = Blocked(replace(FULL[kind], seq=0))
    doc = blocked_to_json(blocked)
    assert doc == {k: v for k, v in action_to_json(FULL[kind]).items() if k != "seq"}
    plan = Plan("n", "mdev", Observation("sha256:" + "0" * 64), blocked=(blocked,))
    VALIDATOR.validate(plan_to_json(plan))
    assert plan_from_json(plan_to_json(plan)) == plan


def test_a_kubevirt_update_of_an_older_vgpuctl_has_no_pci_side() -> None:
    """A plan written before the PCI host devices allow-list (no addPci, removePci, ownedPci)
    reads as changing mediatedDevices only; one with nothing on the PCI side is written so."""
    mdev_only = replace(
        FULL[ActionKind.KUBEVIRT_UPDATE],
        add_pci=(), remove_pci=(), owned_pci=(), retire=(), unmark=(),
    )  # fmt: skip
    old = {
        "seq": 1, "kind": "kubevirt-update", "phase": "cluster",
        "target": "kubevirt/harvester-system/kubevirt", "namespace": "harvester-system",
        "name": "kubevirt", "resourceVersion": "7",
        "add": [{"mdevNameSelector": "NVIDIA A2-4Q", "resourceName": "nvidia.com/NVIDIA_A2-4Q",
                 "externalResourceProvider": True}],
        "remove": ["NVIDIA A2-4A"], "owned": ["NVIDIA A2-4Q"], "reason": "r",
    }  # fmt: skip
    plan = plan_from_json({**_doc(), "actions": [old], "blocked": []})
    (action,) = plan.actions
    assert action == mdev_only
    assert isinstance(action, KubevirtUpdate) and action.add_pci == action.remove_pci == ()
    assert action_to_json(action) == old


def test_the_pci_side_of_a_kubevirt_update_round_trips() -> None:
    action = FULL[ActionKind.KUBEVIRT_UPDATE]
    doc = action_to_json(action)
    assert doc["addPci"] == [
        {
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
            "externalResourceProvider": True,
        }
    ]
    assert (doc["removePci"], doc["ownedPci"]) == (
        ["nvidia.com/NVIDIA_L40S-4Q"],
        ["nvidia.com/NVIDIA_L40S-8Q"],
    )
    plan = Plan("n", "vfio", Observation("sha256:" + "0" * 64), actions=(action,))
    VALIDATOR.validate(plan_to_json(plan))
    assert plan_from_json(json.loads(json.dumps(plan_to_json(plan)))) == plan


@pytest.mark.parametrize("selector", ["10de:26b9", "10DE:26B", "1AF4:1041", "10DE:26B9:0"], ids=str)
def test_the_schema_takes_only_an_nvidia_selector_in_upper_case(selector: str) -> None:
    plan = plan_to_json(
        Plan(
            "n",
            "vfio",
            Observation("sha256:" + "0" * 64),
            actions=(FULL[ActionKind.KUBEVIRT_UPDATE],),
        )
    )
    VALIDATOR.validate(plan)
    plan["actions"][0]["addPci"][0]["pciVendorSelector"] = selector
    assert not VALIDATOR.is_valid(plan)


# --- plans drawn by hypothesis ---------------------------------------------------------------

_names = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789- ", min_size=1, max_size=12).map(
    lambda s: "NVIDIA " + s.strip() + "Q"
)
_words = st.text(min_size=1, max_size=20)
_addresses = st.builds(
    PciAddress,
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFF),
    st.integers(0, 0x1F),
    st.integers(0, 7),
)
_uuids = st.uuids(version=5).map(str)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_changes = st.builds(FieldChange, _words, _json_values, _json_values)
_object_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
_versions = st.text("0123456789", min_size=1, max_size=6)
_node_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
_vf_devices = st.text("0123456789ABCDEF", min_size=4, max_size=4)


@st.composite
def _objects(draw: st.DrawFn, name: str) -> KubeObject:
    kind = draw(st.sampled_from(["SRIOVGPUDevice", "VGPUDevice"]))
    retained = draw(
        st.dictionaries(
            st.sampled_from(["finalizers"]), st.lists(st.text(max_size=5), min_size=1, max_size=2)
        )
    )
    return KubeObject(
        kind=kind,
        name=name,
        labels=draw(
            st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3)
        ),
        annotations=draw(
            st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=2)
        ),
        spec=draw(st.dictionaries(st.text(max_size=6), _json_values, max_size=3)),
        status=draw(st.dictionaries(st.text(max_size=6), _json_values, max_size=3)),
        resource_version=draw(st.just("") | _versions),
        retained=retained,
    )


@st.composite
def _actions(draw: st.DrawFn, kind: ActionKind, seq: int) -> Any:
    common = {"seq": seq, "reason": draw(_words)}
    gpu = draw(_addresses)
    match kind:
        case ActionKind.VGPU_REMOVE | ActionKind.VGPU_CREATE:
            other = draw(st.none() | _names)
            fields = (
                {"replaced_by": other} if kind is ActionKind.VGPU_REMOVE else {"replaces": other}
            )
            return ACTION_TYPES[kind](
                **common,
                target=str(draw(_addresses)),
                gpu=gpu,
                vf_index=draw(st.integers(0, 255)),
                type_name=draw(_names),
                uuid=draw(_uuids),
                **fields,
            )
        case ActionKind.SRIOV_DISABLE:
            return SriovDisable(**common, target=str(gpu), gpu=gpu)
        case ActionKind.SRIOV_ENABLE:
            return SriovEnable(**common, target=str(gpu), gpu=gpu, num_vfs=draw(st.integers(1, 64)))
        case ActionKind.VGPU_MODE:
            mode = draw(st.sampled_from([VgpuMode.EQUAL_SIZE, VgpuMode.MIXED_SIZE]))
            return VgpuModeSet(**common, target=str(gpu), gpu=gpu, mode=mode)
        case ActionKind.SRIOVGPUDEVICE_ENABLE | ActionKind.SRIOVGPUDEVICE_DISABLE:
            node = draw(_node_names)
            return ACTION_TYPES[kind](  # type: ignore[call-arg]
                **common,
                target=object_name(node, str(gpu)),
                node=node,
                gpu=gpu,
                resource_version=draw(_versions),
            )
        case ActionKind.VGPUDEVICE_ENABLE | ActionKind.VGPUDEVICE_DISABLE:
            node, vf = draw(_node_names), draw(_addresses)
            other = draw(st.none() | _names)
            half = (
                {"replaces": other}
                if kind is ActionKind.VGPUDEVICE_ENABLE
                else {"replaced_by": other}
            )
            return ACTION_TYPES[kind](  # type: ignore[call-arg]
                **common,
                target=object_name(node, str(vf)),
                node=node,
                gpu=gpu,
                vf=vf,
                vf_index=draw(st.integers(0, 255)),
                type_name=draw(_names),
                **half,
                **(
                    {"resource_version": "", "object_exists": False}
                    if kind is ActionKind.VGPUDEVICE_ENABLE and draw(st.booleans())
                    else {"resource_version": draw(_versions)}
                ),
            )
        case ActionKind.CR_CREATE:
            name = draw(_object_names)
            return CrCreate(**common, target=name, object=draw(_objects(name)))
        case ActionKind.CR_UPDATE:
            name = draw(_object_names)
            changes = draw(
                st.lists(st.builds(FieldChange, _words, _json_values, _json_values), max_size=3)
            )
            return CrUpdate(
                **common,
                target=name,
                resource_version=draw(_versions),
                object=draw(_objects(name)),
                spec_changed=draw(st.booleans()),
                status_changed=draw(st.booleans()),
                changes=tuple(changes),
                drift=draw(st.booleans()),
                adopt=draw(st.booleans()),
            )
        case ActionKind.CR_DELETE:
            return CrDelete(
                **common,
                target=draw(_object_names),
                object_kind=draw(st.sampled_from(["SRIOVGPUDevice", "VGPUDevice"])),
                resource_version=draw(_versions),
            )
        case ActionKind.KUBEVIRT_ALLOW:
            added = draw(st.lists(_names, max_size=3, unique=True))
            resources = _names.map(lambda n: "nvidia.com/" + n.replace(" ", "_"))
            pci = draw(st.lists(st.tuples(_vf_devices, resources), max_size=2))
            return KubevirtAllow(
                **common,
                target="kubevirt/harvester-system/kubevirt",
                namespace="harvester-system",
                name="kubevirt",
                resource_version=draw(_versions),
                add=tuple(MediatedDevice(n, "nvidia.com/" + n.replace(" ", "_")) for n in added),
                owned=tuple(draw(st.lists(_names, max_size=3, unique=True))),
                add_pci=tuple(PciHostDevice("10DE:" + d, r) for d, r in pci),
                owned_pci=tuple(draw(st.lists(resources, max_size=2, unique=True))),
                unmark=tuple(draw(st.lists(_names, max_size=2, unique=True))),
                intent=draw(
                    st.none()
                    | st.builds(
                        Intent,
                        _names,
                        st.lists(
                            st.builds(WantedProfile, _names, st.integers(1, 64)),
                            min_size=1,
                            max_size=2,
                        ).map(tuple),
                    )
                ),
            )
        case ActionKind.KUBEVIRT_UPDATE:
            added = draw(st.lists(_names, max_size=3, unique=True))
            resources = _names.map(lambda n: "nvidia.com/" + n.replace(" ", "_"))
            pci = draw(st.lists(st.tuples(_vf_devices, resources), max_size=2))
            return KubevirtUpdate(
                **common,
                target="kubevirt/harvester-system/kubevirt",
                namespace="harvester-system",
                name="kubevirt",
                resource_version=draw(_versions),
                add=tuple(MediatedDevice(n, "nvidia.com/" + n.replace(" ", "_")) for n in added),
                remove=tuple(draw(st.lists(_names, max_size=2))),
                owned=tuple(draw(st.lists(_names, max_size=3, unique=True))),
                add_pci=tuple(PciHostDevice("10DE:" + d, r) for d, r in pci),
                remove_pci=tuple(draw(st.lists(resources, max_size=2))),
                owned_pci=tuple(draw(st.lists(resources, max_size=2, unique=True))),
                retire=tuple(draw(st.lists(_names, max_size=2, unique=True))),
                unmark=tuple(draw(st.lists(_names, max_size=2, unique=True))),
            )
        case ActionKind.DEVICE_PLUGIN_REFRESH:
            name = draw(_names)
            resource = "nvidia.com/" + name.replace(" ", "_")
            return DevicePluginRefresh(
                **common,
                target=resource,
                resource=resource,
                type_name=name,
                devices=tuple(draw(st.lists(_uuids, max_size=3, unique=True))),
            )
    raise AssertionError(kind)  # fmt: skip


@st.composite
def _plans(draw: st.DrawFn) -> Plan:
    kinds = draw(st.lists(st.sampled_from(list(ActionKind)), max_size=8))
    actions = tuple(draw(_actions(k, i)) for i, k in enumerate(kinds, start=1))
    blocked_kinds = draw(
        st.lists(st.sampled_from([k for k in ActionKind if k.is_host]), max_size=3)
    )
    blocked = tuple(Blocked(draw(_actions(k, 0))) for k in blocked_kinds)
    drift = draw(
        st.lists(
            st.builds(
                Drift, _object_names, st.sampled_from(["SRIOVGPUDevice", "VGPUDevice"]),
                st.lists(_changes, min_size=1, max_size=2).map(tuple),
            ),
            max_size=2,
        )
    )  # fmt: skip
    return Plan(
        node=draw(_words),
        interface=draw(st.sampled_from(["mdev", "vfio", "none"])),
        observed=Observation(
            "sha256:" + draw(st.text("0123456789abcdef", min_size=64, max_size=64))
        ),
        actions=actions,
        blocked=blocked,
        noops=tuple(draw(st.lists(st.builds(Noop, _words, _words), max_size=2))),
        notes=tuple(draw(st.lists(_words, max_size=2))),
        drift=tuple(drift),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plans())
def test_plans_of_every_kind_validate_and_round_trip(plan: Plan) -> None:
    doc = plan_to_json(plan)
    VALIDATOR.validate(doc)
    assert plan_from_json(doc) == plan
    # Through text, as a saved plan is.
    assert plan_from_json(json.loads(json.dumps(doc))) == plan


# --- untrusted input -------------------------------------------------------------------------


def _doc() -> dict[str, Any]:
    plan = Plan(
        "n", "mdev", Observation("sha256:" + "0" * 64),
        actions=tuple(FULL.values()),
        blocked=(Blocked(VgpuRemove(
            target="0000:08:00.5", reason="in use", gpu=GPU, vf_index=1,
            type_name="NVIDIA A2-4Q", uuid=UUID,
        )),),
    )  # fmt: skip
    return plan_to_json(plan)


def _index(kind: ActionKind) -> int:
    return list(FULL).index(kind)


#: A damaged field and the one line that names it.
DAMAGED: dict[str, tuple[tuple[Any, ...], Any, str]] = {
    "format 1": (("formatVersion",), 1, "written by an older vgpuctl (plan format 1)"),
    "format 3": (("formatVersion",), 3, "formatVersion: expected 2, got the number 3"),
    "vfIndex as text": (
        ("actions", 0, "vfIndex"), "0", "actions[0].vfIndex: expected an integer, got text '0'"
    ),
    "vfIndex a boolean": (
        ("actions", 0, "vfIndex"), True, "actions[0].vfIndex: expected an integer"
    ),
    "negative vfIndex": (("actions", 0, "vfIndex"), -1, "actions[0].vfIndex: expected at least 0"),
    "gpu not an address": (
        ("actions", 0, "gpu"), "../../x", "actions[0].gpu: text '../../x' is not a PCI address"
    ),
    "unknown kind": (("actions", 0, "kind"), "rm-rf", "actions[0].kind: text 'rm-rf' is not"),
    "wrong phase": (
        ("actions", 0, "phase"), "cluster",
        "actions[0].phase: text 'cluster', but a vgpu-remove runs in the host phase",
    ),
    "format 1 params": (("actions", 1, "params"), {}, "actions[1]: unknown field params"),
    "seq 0": (("actions", 0, "seq"), 0, "actions[0].seq: expected at least 1"),
    "numVFs 0": (
        ("actions", _index(ActionKind.SRIOV_ENABLE), "numVFs"), 0, "numVFs: expected at least 1"
    ),
    "object named otherwise": (
        ("actions", _index(ActionKind.CR_CREATE), "object", "metadata", "name"), "other",
        "object.metadata.name: text 'other' is not the target",
    ),
    "object of another kind": (
        ("actions", _index(ActionKind.CR_UPDATE), "object", "kind"), "Pod",
        ".object.kind: text 'Pod' is not one of SRIOVGPUDevice, VGPUDevice",
    ),
    "adopt false": (
        ("actions", _index(ActionKind.CR_UPDATE), "adopt"), False, ".adopt: expected true"
    ),
    "change without to": (
        ("actions", _index(ActionKind.CR_UPDATE), "changes", 0), {"path": "x", "from": 1},
        ".changes[0]: missing required field to",
    ),
    "entry allocated by KubeVirt": (
        ("actions", _index(ActionKind.KUBEVIRT_UPDATE), "add", 0, "externalResourceProvider"),
        False, ".add[0].externalResourceProvider: expected true",
    ),
    "PCI entry allocated by KubeVirt": (
        ("actions", _index(ActionKind.KUBEVIRT_UPDATE), "addPci", 0, "externalResourceProvider"),
        False, ".addPci[0].externalResourceProvider: expected true",
    ),
    "PCI entry without a selector": (
        ("actions", _index(ActionKind.KUBEVIRT_UPDATE), "addPci", 0), {
            "resourceName": "nvidia.com/NVIDIA_L40S-8Q", "externalResourceProvider": True,
        },
        ".addPci[0]: missing required field pciVendorSelector",
    ),
    "PCI removal not a list": (
        ("actions", _index(ActionKind.KUBEVIRT_UPDATE), "removePci"), "x",
        ".removePci: expected a list, got text 'x'",
    ),
    "devices not a list": (
        ("actions", _index(ActionKind.DEVICE_PLUGIN_REFRESH), "devices"), "x",
        ".devices: expected a list, got text 'x'",
    ),
    "blocked with a seq": (("blocked", 0, "seq"), 3, "blocked[0]: unknown field seq"),
    "interface": (("interface",), "pci", "interface: text 'pci' is not one of mdev, vfio, none"),
    "escape in a kind": (("actions", 0, "kind"), "\x1b[2J", "\\x1b[2J"),
}  # fmt: skip


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_plan_is_one_line_naming_the_field(case: str) -> None:
    path, value, message = DAMAGED[case]
    doc = _doc()
    assert plan_from_json(copy.deepcopy(doc)) is not None  # the undamaged plan is fine
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(PlanFormatError) as info:
        plan_from_json(doc)
    assert message in info.value.message
    assert "\n" not in info.value.message and "\x1b" not in info.value.message


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "unknown", "mode: text 'unknown' is not a mode vgpuctl sets"),
        ("mode", "MIXED", "mode: text 'MIXED' is not a mode vgpuctl sets"),
        ("target", "0000:09:00.0", "target: text '0000:09:00.0' is not the action's gpu"),
    ],
)
def test_a_vgpu_mode_action_sets_a_known_mode_on_its_own_gpu(
    field: str, value: str, message: str
) -> None:
    # "unknown" is what an observation says, never what a GPU is put in; and the command
    # runs on gpu, so a target naming another device (an edited plan) is refused.
    doc = action_to_json(FULL[ActionKind.VGPU_MODE])
    doc[field] = value
    with pytest.raises(PlanFormatError) as info:
        action_from_json(doc)
    assert message in info.value.message


@pytest.mark.parametrize("kind", [ActionKind.VGPUDEVICE_ENABLE, ActionKind.SRIOVGPUDEVICE_DISABLE])
def test_a_delegate_step_writes_only_the_object_named_after_its_device(kind: ActionKind) -> None:
    # Harvester names the object <node>-<address>: an edited plan that points the write at
    # another object (another node's, or another VF's) is refused before anything runs.
    doc = action_to_json(FULL[kind])
    doc["target"] = "n1-000009004"
    with pytest.raises(PlanFormatError, match="target: text 'n1-000009004' is not n1-0000080"):
        action_from_json(doc)


@pytest.mark.parametrize(
    ("exists", "version", "message"),
    [
        (None, "", "resourceVersion: expected non-empty text"),
        (False, "12", 'resourceVersion: expected "" (objectExists is false: no object yet)'),
        (False, 12, "resourceVersion: expected text, got the number 12"),
    ],
)
def test_a_step_on_an_object_not_made_yet_has_no_resource_version(
    exists: bool | None, version: object, message: str
) -> None:
    """A vgpudevice-enable planned ahead (objectExists false) is written over no object: its
    resourceVersion is "", and only then (the schema says the same)."""
    ahead = action_to_json(FULL[ActionKind.VGPUDEVICE_ENABLE])
    assert (ahead["objectExists"], ahead["resourceVersion"]) == (False, "")
    assert action_from_json(ahead) == FULL[ActionKind.VGPUDEVICE_ENABLE]
    doc = {k: v for k, v in ahead.items() if k != "objectExists"}
    if exists is not None:
        doc["objectExists"] = exists
    doc["resourceVersion"] = version
    with pytest.raises(PlanFormatError) as info:
        action_from_json(doc)
    assert message in info.value.message
    assert VALIDATOR.is_valid({**_doc(), "actions": [ahead], "blocked": []})
    assert not VALIDATOR.is_valid({**_doc(), "actions": [doc], "blocked": []})


def test_a_blocked_cluster_action_is_refused() -> None:
    doc = _doc()
    delete = action_to_json(FULL[ActionKind.CR_DELETE])
    doc["blocked"][0] = {k: v for k, v in delete.items() if k != "seq"}
    with pytest.raises(
        PlanFormatError, match=r"blocked\[0\]\.kind: only host actions \(and delegate steps\)"
    ):
        plan_from_json(doc)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


_PATHS = [p for p in _paths(_doc()) if p]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_PATHS), _json_values | st.sampled_from([None, -1, "", [], {}]))
def test_any_damaged_field_is_a_plan_format_error_or_a_plan(
    path: tuple[Any, ...], value: Any
) -> None:
    """Whatever one field is replaced by, decoding gives a plan or one PlanFormatError line:
    never a KeyError, TypeError or any other exception."""
    doc = _doc()
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    try:
        plan_from_json(doc)
    except PlanFormatError as e:
        message = e.message
    else:
        return
    assert message and "\n" not in message
