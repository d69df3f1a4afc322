"""The JSON form of plans (``schemas/plan.schema.json``): the one codec for actions, blocked
actions and plans, used by ``plan -o json``, ``plan --out`` and ``apply PLANFILE``.

Each action is one object: ``seq``, ``kind``, ``phase`` (allow-list, host, cluster,
device-plugins), ``target``, the fields of its kind (camelCase) and ``reason``. A blocked action
is the same without ``seq``.

Decoding is for untrusted input (a saved plan anyone may have edited): every field is checked
for its type, unknown and missing fields are refused, and any problem is one
:class:`PlanFormatError` line naming the field (``actions[3].vfIndex: expected an integer, got
text 'x'``), never a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reconciler.model.address import PciAddress
from reconciler.model.cluster import (
    GROUP_VERSIONS,
    PLURALS,
    RETAINED_METADATA,
    KubeObject,
    object_name,
)
from reconciler.model.errors import ValidationError, excerpt
from reconciler.model.mode import VgpuMode
from reconciler.model.plan import (
    FORMAT_VERSION,
    Action,
    ActionKind,
    Blocked,
    CrCreate,
    CrDelete,
    CrUpdate,
    DevicePluginRefresh,
    Drift,
    FieldChange,
    HostAction,
    Intent,
    KubevirtAllow,
    KubevirtUpdate,
    MediatedDevice,
    Noop,
    Observation,
    PciHostDevice,
    Plan,
    SriovDisable,
    SriovEnable,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
    VgpuCreate,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
    VgpuModeSet,
    VgpuRemove,
    WantedProfile,
)

#: The interfaces a plan may name.
#: A plan's ``interface``: how its node makes vGPUs; ``harvester`` in delegate mode
#: (pcidevices-controller makes them, docs/delegate.md).
INTERFACES = ("mdev", "vfio", "none", "harvester")


class PlanFormatError(ValidationError):
    """A plan document that is not one this vgpuctl writes (one line, naming the field)."""


# -- encoding -----------------------------------------------------------------------------------


def action_to_json(action: Action) -> dict[str, Any]:
    """``action`` as the plan's ``actions`` list holds it."""
    return _encode(action, with_seq=True)


def blocked_to_json(blocked: Blocked) -> dict[str, Any]:
    """``blocked`` as the plan's ``blocked`` list holds it: its action without ``seq``."""
    return _encode(blocked.action, with_seq=False)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan contract (``schemas/plan.schema.json``)."""
    return {
        "formatVersion": plan.format_version,
        "node": plan.node,
        "interface": plan.interface,
        "observedFingerprint": plan.observed_fingerprint,
        "actions": [_encode(a, with_seq=True) for a in plan.actions],
        "blocked": [_encode(b.action, with_seq=False) for b in plan.blocked],
        "noops": [n.to_json() for n in plan.noops],
        "drift": [d.to_json() for d in plan.drift],
        "notes": list(plan.notes),
        "summary": plan.summary.to_json(),
        "applyable": plan.applyable,
    }


def _encode(action: Action, *, with_seq: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": action.seq} if with_seq else {}
    out["kind"] = action.kind.value
    out["phase"] = action.phase.value
    out["target"] = action.target
    match action:
        case VgpuRemove():
            out["gpu"] = str(action.gpu)
            out["vfIndex"] = action.vf_index
            out["type"] = action.type_name
            out["uuid"] = action.uuid
            if action.replaced_by is not None:
                out["replacedBy"] = action.replaced_by
        case SriovDisable():
            out["gpu"] = str(action.gpu)
        case SriovEnable():
            out["gpu"] = str(action.gpu)
            out["numVFs"] = action.num_vfs
        case VgpuModeSet():
            out["gpu"] = str(action.gpu)
            out["mode"] = action.mode.value
        case VgpuCreate():
            out["gpu"] = str(action.gpu)
            out["vfIndex"] = action.vf_index
            out["type"] = action.type_name
            out["uuid"] = action.uuid
            if action.replaces is not None:
                out["replaces"] = action.replaces
        case CrCreate():
            out["object"] = action.object.to_json()
        case CrUpdate():
            out["resourceVersion"] = action.resource_version
            out["object"] = action.object.to_json()
            out["specChanged"] = action.spec_changed
            out["statusChanged"] = action.status_changed
            out["changes"] = [c.to_json() for c in action.changes]
            out["drift"] = action.drift
            if action.adopt:
                out["adopt"] = True
        case CrDelete():
            out["objectKind"] = action.object_kind
            out["resourceVersion"] = action.resource_version
        case KubevirtUpdate():
            out["namespace"] = action.namespace
            out["name"] = action.name
            out["resourceVersion"] = action.resource_version
            out["add"] = [e.to_json() for e in action.add]
            if not isinstance(action, KubevirtAllow):  # an allow step never removes
                out["remove"] = list(action.remove)
            out["owned"] = list(action.owned)
            # The PCI side only when there is one: a plan without it reads as before.
            if action.add_pci:
                out["addPci"] = [e.to_json() for e in action.add_pci]
            if action.remove_pci:
                out["removePci"] = list(action.remove_pci)
            if action.owned_pci:
                out["ownedPci"] = list(action.owned_pci)
            # The retiring marks only when there are some: a plan without them reads as before.
            if action.retire:
                out["retire"] = list(action.retire)
            if action.unmark:
                out["unmark"] = list(action.unmark)
            if isinstance(action, KubevirtAllow) and action.intent is not None:
                out["intent"] = action.intent.to_json()
        case SriovGpuDeviceEnable() | SriovGpuDeviceDisable():
            out["node"] = action.node
            out["gpu"] = str(action.gpu)
            out["resourceVersion"] = action.resource_version
        case VgpuDeviceEnable() | VgpuDeviceDisable():
            out["node"] = action.node
            out["gpu"] = str(action.gpu)
            out["vf"] = str(action.vf)
            out["vfIndex"] = action.vf_index
            out["resourceVersion"] = action.resource_version
            out["type"] = action.type_name
            if isinstance(action, VgpuDeviceEnable) and action.replaces is not None:
                out["replaces"] = action.replaces
            if isinstance(action, VgpuDeviceEnable) and not action.object_exists:
                out["objectExists"] = False
            if isinstance(action, VgpuDeviceDisable) and action.replaced_by is not None:
                out["replacedBy"] = action.replaced_by
            if action.pending:
                out["pending"] = True
        case DevicePluginRefresh():
            out["resource"] = action.resource
            out["type"] = action.type_name
            out["devices"] = list(action.devices)
    out["reason"] = action.reason
    return out


# -- decoding -----------------------------------------------------------------------------------


def plan_from_json(raw: object) -> Plan:
    """The plan ``raw`` (parsed JSON) describes; :class:`PlanFormatError` unless it is one."""
    doc = _mapping(raw, "the plan")
    version = doc.get("formatVersion")
    if type(version) is int and version < FORMAT_VERSION:
        raise PlanFormatError(
            f"written by an older vgpuctl (plan format {version}); run 'vgpuctl plan --out' again"
        )
    if type(version) is not int or version != FORMAT_VERSION:
        raise PlanFormatError(
            f"formatVersion: expected {FORMAT_VERSION}, got {_kind(version)} "
            "(written by another vgpuctl version: plan again with this one)"
        )
    _keys(
        doc,
        "the plan",
        required=(
            "formatVersion",
            "node",
            "interface",
            "observedFingerprint",
            "actions",
            "blocked",
            "noops",
            "notes",
            "summary",
            "applyable",
        ),
        optional=("drift",),
    )
    interface = _str(doc, "interface", "")
    if interface not in INTERFACES:
        raise PlanFormatError(
            f"interface: {_kind(interface)} is not one of {', '.join(INTERFACES)}"
        )
    summary = _mapping(doc["summary"], "summary")
    _keys(summary, "summary", required=("create", "change", "remove", "blocked"))
    for key in ("create", "change", "remove", "blocked"):
        _int(summary, key, "summary", minimum=0)
    _bool(doc, "applyable", "")
    return Plan(
        format_version=version,
        node=_str(doc, "node", ""),
        interface=interface,
        observed=Observation(_str(doc, "observedFingerprint", "")),
        actions=tuple(
            action_from_json(a, f"actions[{i}]") for i, a in enumerate(_list(doc, "actions", ""))
        ),
        blocked=tuple(
            blocked_from_json(b, f"blocked[{i}]") for i, b in enumerate(_list(doc, "blocked", ""))
        ),
        noops=tuple(_noop(n, f"noops[{i}]") for i, n in enumerate(_list(doc, "noops", ""))),
        notes=tuple(
            _text(n, f"notes[{i}]", empty=True) for i, n in enumerate(_list(doc, "notes", ""))
        ),
        drift=tuple(
            _drift(d, f"drift[{i}]") for i, d in enumerate(_list(doc, "drift", "", missing=[]))
        ),
    )


def action_from_json(raw: object, where: str = "action") -> Action:
    """One ``actions`` entry (``seq`` at least 1)."""
    doc = _mapping(raw, where)
    seq = _int(doc, "seq", where, minimum=1)
    return _decode(doc, where, seq)


def blocked_from_json(raw: object, where: str = "blocked") -> Blocked:
    """One ``blocked`` entry: a host action without ``seq``."""
    doc = _mapping(raw, where)
    if "seq" in doc:
        raise PlanFormatError(f"{where}: unknown field seq (a blocked action has no place)")
    action = _decode(doc, where, 0)
    if isinstance(action, VgpuRemove | SriovDisable | SriovEnable | VgpuModeSet | VgpuCreate):
        host: HostAction = action
        return Blocked(host)
    if isinstance(
        action, VgpuDeviceDisable | SriovGpuDeviceDisable | SriovGpuDeviceEnable | VgpuDeviceEnable
    ):
        return Blocked(action)
    raise PlanFormatError(
        f"{where}.kind: only host actions (and delegate steps) are blocked, not {action.kind}"
    )


def _decode(doc: Mapping[str, Any], where: str, seq: int) -> Action:
    kind_text = _str(doc, "kind", where)
    try:
        kind = ActionKind(kind_text)
    except ValueError:
        raise PlanFormatError(f"{where}.kind: {_kind(kind_text)} is not an action kind") from None
    required, optional, build = _DECODERS[kind]
    _keys(
        doc,
        where,
        required=("kind", "phase", "target", "reason", *required),
        optional=("seq", *optional),
    )
    phase = _str(doc, "phase", where)
    if phase != kind.phase.value:
        raise PlanFormatError(
            f"{where}.phase: {_kind(phase)}, but a {kind} runs in the {kind.phase} phase"
        )
    return build(
        _Read(doc, where),
        seq,
        _str(doc, "target", where),
        _str(doc, "reason", where),
    )


class _Read:
    """Typed reads of one action's fields."""

    __slots__ = ("doc", "where")

    def __init__(self, doc: Mapping[str, Any], where: str) -> None:
        self.doc = doc
        self.where = where

    def text(self, key: str) -> str:
        return _str(self.doc, key, self.where)

    def opt_text(self, key: str) -> str | None:
        return None if key not in self.doc else _str(self.doc, key, self.where)

    def integer(self, key: str, minimum: int) -> int:
        return _int(self.doc, key, self.where, minimum=minimum)

    def flag(self, key: str) -> bool:
        return _bool(self.doc, key, self.where)

    def opt_flag(self, key: str) -> bool:
        """An optional boolean: false when absent."""
        return key in self.doc and _bool(self.doc, key, self.where)

    def gpu(self) -> PciAddress:
        return self.address("gpu")

    def address(self, key: str) -> PciAddress:
        text = _str(self.doc, key, self.where)
        try:
            return PciAddress.parse(text)
        except ValueError:
            raise PlanFormatError(
                f"{self.where}.{key}: {_kind(text)} is not a PCI address such as 0000:08:00.0"
            ) from None

    def strings(self, key: str, *, optional: bool = False) -> tuple[str, ...]:
        """The list of non-empty texts ``key``; with ``optional``, an absent one is empty."""
        where = f"{self.where}.{key}"
        values = _list(self.doc, key, self.where, missing=[] if optional else None)
        return tuple(_text(v, f"{where}[{i}]") for i, v in enumerate(values))

    def object(self, target: str) -> KubeObject:
        return _kube_object(self.doc["object"], f"{self.where}.object", target)

    def changes(self) -> tuple[FieldChange, ...]:
        where = f"{self.where}.changes"
        return tuple(
            _field_change(c, f"{where}[{i}]")
            for i, c in enumerate(_list(self.doc, "changes", self.where))
        )

    def mediated_devices(self) -> tuple[MediatedDevice, ...]:
        out = []
        for i, raw in enumerate(_list(self.doc, "add", self.where)):
            where = f"{self.where}.add[{i}]"
            entry = _mapping(raw, where)
            _keys(
                entry,
                where,
                required=("mdevNameSelector", "resourceName", "externalResourceProvider"),
            )
            if entry["externalResourceProvider"] is not True:
                raise PlanFormatError(f"{where}.externalResourceProvider: expected true")
            out.append(
                MediatedDevice(
                    selector=_str(entry, "mdevNameSelector", where),
                    resource_name=_str(entry, "resourceName", where),
                )
            )
        return tuple(out)

    def intent(self) -> Intent | None:
        """``intent`` ({node, profiles: [{name, wanted}]}, at least one profile); absent is
        None."""
        if "intent" not in self.doc:
            return None
        where = f"{self.where}.intent"
        doc = _mapping(self.doc["intent"], where)
        _keys(doc, where, required=("node", "profiles"))
        profiles = []
        for i, raw in enumerate(_list(doc, "profiles", where)):
            at = f"{where}.profiles[{i}]"
            entry = _mapping(raw, at)
            _keys(entry, at, required=("name", "wanted"))
            profiles.append(
                WantedProfile(
                    name=_str(entry, "name", at), wanted=_int(entry, "wanted", at, minimum=1)
                )
            )
        if not profiles:
            raise PlanFormatError(f"{where}.profiles: expected at least one profile")
        return Intent(node=_str(doc, "node", where), profiles=tuple(profiles))

    def pci_host_devices(self) -> tuple[PciHostDevice, ...]:
        """``addPci``; absent (a plan with no PCI side) is empty."""
        out = []
        for i, raw in enumerate(_list(self.doc, "addPci", self.where, missing=[])):
            where = f"{self.where}.addPci[{i}]"
            entry = _mapping(raw, where)
            _keys(
                entry,
                where,
                required=("pciVendorSelector", "resourceName", "externalResourceProvider"),
            )
            if entry["externalResourceProvider"] is not True:
                raise PlanFormatError(f"{where}.externalResourceProvider: expected true")
            out.append(
                PciHostDevice(
                    selector=_str(entry, "pciVendorSelector", where),
                    resource_name=_str(entry, "resourceName", where),
                )
            )
        return tuple(out)


_Build = Callable[[_Read, int, str, str], Action]


def _vgpu_remove(r: _Read, seq: int, target: str, reason: str) -> Action:
    return VgpuRemove(
        seq=seq,
        target=target,
        reason=reason,
        gpu=r.gpu(),
        vf_index=r.integer("vfIndex", 0),
        type_name=r.text("type"),
        uuid=_vgpu_name(r, target),
        replaced_by=r.opt_text("replacedBy"),
    )


def _sriov_disable(r: _Read, seq: int, target: str, reason: str) -> Action:
    return SriovDisable(seq=seq, target=target, reason=reason, gpu=r.gpu())


def _sriov_enable(r: _Read, seq: int, target: str, reason: str) -> Action:
    return SriovEnable(
        seq=seq, target=target, reason=reason, gpu=r.gpu(), num_vfs=r.integer("numVFs", 1)
    )


def _vgpu_mode(r: _Read, seq: int, target: str, reason: str) -> Action:
    gpu = r.gpu()
    if target != str(gpu):
        # The command runs on gpu; a target naming another device would misreport what ran.
        raise PlanFormatError(f"{r.where}.target: {_kind(target)} is not the action's gpu {gpu}")
    text = r.text("mode")
    if text not in _SETTABLE_MODES:
        raise PlanFormatError(
            f"{r.where}.mode: {_kind(text)} is not a mode vgpuctl sets (equal-size or mixed-size)"
        )
    return VgpuModeSet(seq=seq, target=target, reason=reason, gpu=gpu, mode=VgpuMode(text))


#: The modes a vgpu-mode action may set (never "unknown": that is an observation).
_SETTABLE_MODES = frozenset({VgpuMode.EQUAL_SIZE.value, VgpuMode.MIXED_SIZE.value})


def _vgpu_create(r: _Read, seq: int, target: str, reason: str) -> Action:
    return VgpuCreate(
        seq=seq,
        target=target,
        reason=reason,
        gpu=r.gpu(),
        vf_index=r.integer("vfIndex", 0),
        type_name=r.text("type"),
        uuid=_vgpu_name(r, target),
        replaces=r.opt_text("replaces"),
    )


def _vgpu_name(r: _Read, target: str) -> str:
    """``uuid``: an mdev UUID, or on the vfio interface the VF's address, which can only be
    the action's own VF (the VF is the vGPU there)."""
    name = r.text("uuid")
    try:
        PciAddress.parse(name)
    except ValueError:
        return name
    if name != target:
        raise PlanFormatError(
            f"{r.where}.uuid: a VF address names the vGPU on that VF only: expected {target}"
        )
    return name


def _cr_create(r: _Read, seq: int, target: str, reason: str) -> Action:
    return CrCreate(seq=seq, target=target, reason=reason, object=r.object(target))


def _cr_update(r: _Read, seq: int, target: str, reason: str) -> Action:
    adopt = "adopt" in r.doc
    if adopt and r.doc["adopt"] is not True:
        raise PlanFormatError(f"{r.where}.adopt: expected true (or no adopt field)")
    return CrUpdate(
        seq=seq,
        target=target,
        reason=reason,
        resource_version=r.text("resourceVersion"),
        object=r.object(target),
        spec_changed=r.flag("specChanged"),
        status_changed=r.flag("statusChanged"),
        changes=r.changes(),
        drift=r.flag("drift"),
        adopt=adopt,
    )


def _cr_delete(r: _Read, seq: int, target: str, reason: str) -> Action:
    object_kind = r.text("objectKind")
    if object_kind not in PLURALS:
        raise PlanFormatError(
            f"{r.where}.objectKind: {_kind(object_kind)} is not one of {', '.join(sorted(PLURALS))}"
        )
    return CrDelete(
        seq=seq,
        target=target,
        reason=reason,
        object_kind=object_kind,
        resource_version=r.text("resourceVersion"),
    )


def _kubevirt_allow(r: _Read, seq: int, target: str, reason: str) -> Action:
    return KubevirtAllow(
        seq=seq,
        target=target,
        reason=reason,
        namespace=r.text("namespace"),
        name=r.text("name"),
        resource_version=r.text("resourceVersion"),
        add=r.mediated_devices(),
        owned=r.strings("owned"),
        add_pci=r.pci_host_devices(),
        owned_pci=r.strings("ownedPci", optional=True),
        unmark=r.strings("unmark", optional=True),
        intent=r.intent(),
    )


def _kubevirt_update(r: _Read, seq: int, target: str, reason: str) -> Action:
    return KubevirtUpdate(
        seq=seq,
        target=target,
        reason=reason,
        namespace=r.text("namespace"),
        name=r.text("name"),
        resource_version=r.text("resourceVersion"),
        add=r.mediated_devices(),
        remove=r.strings("remove"),
        owned=r.strings("owned"),
        add_pci=r.pci_host_devices(),
        remove_pci=r.strings("removePci", optional=True),
        owned_pci=r.strings("ownedPci", optional=True),
        retire=r.strings("retire", optional=True),
        unmark=r.strings("unmark", optional=True),
    )


def _device_plugin_refresh(r: _Read, seq: int, target: str, reason: str) -> Action:
    return DevicePluginRefresh(
        seq=seq,
        target=target,
        reason=reason,
        resource=r.text("resource"),
        type_name=r.text("type"),
        devices=r.strings("devices"),
    )


def _harvester_gpu(kind: type[SriovGpuDeviceEnable | SriovGpuDeviceDisable]) -> _Build:
    def build(r: _Read, seq: int, target: str, reason: str) -> Action:
        node, gpu = r.text("node"), r.gpu()
        _own_object(r, target, node, gpu)
        return kind(
            seq=seq,
            target=target,
            reason=reason,
            node=node,
            gpu=gpu,
            resource_version=r.text("resourceVersion"),
        )

    return build


def _vgpudevice_enable(r: _Read, seq: int, target: str, reason: str) -> Action:
    node, vf = r.text("node"), r.address("vf")
    _own_object(r, target, node, vf)
    # An object not made yet (planned ahead, objectExists false) has no resourceVersion: "".
    exists = "objectExists" not in r.doc or r.flag("objectExists")
    version = _text(r.doc.get("resourceVersion"), _at(r.where, "resourceVersion"), empty=True)
    if exists != bool(version):
        raise PlanFormatError(
            f"{_at(r.where, 'resourceVersion')}: expected "
            + ("non-empty text" if exists else '"" (objectExists is false: no object yet)')
        )
    return VgpuDeviceEnable(
        seq=seq,
        target=target,
        reason=reason,
        node=node,
        gpu=r.gpu(),
        vf=vf,
        vf_index=r.integer("vfIndex", 0),
        resource_version=version,
        type_name=r.text("type"),
        replaces=r.opt_text("replaces"),
        pending=r.opt_flag("pending"),
        object_exists=exists,
    )


def _vgpudevice_disable(r: _Read, seq: int, target: str, reason: str) -> Action:
    node, vf = r.text("node"), r.address("vf")
    _own_object(r, target, node, vf)
    return VgpuDeviceDisable(
        seq=seq,
        target=target,
        reason=reason,
        node=node,
        gpu=r.gpu(),
        vf=vf,
        vf_index=r.integer("vfIndex", 0),
        resource_version=r.text("resourceVersion"),
        type_name=r.text("type"),
        replaced_by=r.opt_text("replacedBy"),
        pending=r.opt_flag("pending"),
    )


def _own_object(r: _Read, target: str, node: str, address: PciAddress) -> None:
    """A delegate step writes the object Harvester names after its node and device: a target
    naming another object (an edited plan) is refused."""
    expected = object_name(node, str(address))
    if target != expected:
        raise PlanFormatError(
            f"{r.where}.target: {_kind(target)} is not {expected}, the object of {address} "
            f"on node {node}"
        )


_VGPU_FIELDS = ("gpu", "vfIndex", "type", "uuid")
_HARVESTER_VF_FIELDS = ("node", "gpu", "vf", "vfIndex", "resourceVersion", "type")
#: Per kind: its required fields, its optional ones, and how to build it.
_DECODERS: Mapping[ActionKind, tuple[tuple[str, ...], tuple[str, ...], _Build]] = {
    ActionKind.KUBEVIRT_ALLOW: (
        ("namespace", "name", "resourceVersion", "add", "owned"),
        ("addPci", "ownedPci", "unmark", "intent"),
        _kubevirt_allow,
    ),
    ActionKind.VGPU_REMOVE: (_VGPU_FIELDS, ("replacedBy",), _vgpu_remove),
    ActionKind.SRIOV_DISABLE: (("gpu",), (), _sriov_disable),
    ActionKind.SRIOV_ENABLE: (("gpu", "numVFs"), (), _sriov_enable),
    ActionKind.VGPU_MODE: (("gpu", "mode"), (), _vgpu_mode),
    ActionKind.VGPU_CREATE: (_VGPU_FIELDS, ("replaces",), _vgpu_create),
    ActionKind.CR_CREATE: (("object",), (), _cr_create),
    ActionKind.CR_UPDATE: (
        ("resourceVersion", "object", "specChanged", "statusChanged", "changes", "drift"),
        ("adopt",),
        _cr_update,
    ),
    ActionKind.CR_DELETE: (("objectKind", "resourceVersion"), (), _cr_delete),
    ActionKind.KUBEVIRT_UPDATE: (
        ("namespace", "name", "resourceVersion", "add", "remove", "owned"),
        ("addPci", "removePci", "ownedPci", "retire", "unmark"),
        _kubevirt_update,
    ),
    ActionKind.VGPUDEVICE_DISABLE: (
        _HARVESTER_VF_FIELDS,
        ("replacedBy", "pending"),
        _vgpudevice_disable,
    ),
    ActionKind.SRIOVGPUDEVICE_DISABLE: (
        ("node", "gpu", "resourceVersion"),
        (),
        _harvester_gpu(SriovGpuDeviceDisable),
    ),
    ActionKind.SRIOVGPUDEVICE_ENABLE: (
        ("node", "gpu", "resourceVersion"),
        (),
        _harvester_gpu(SriovGpuDeviceEnable),
    ),
    ActionKind.VGPUDEVICE_ENABLE: (
        _HARVESTER_VF_FIELDS,
        ("replaces", "pending", "objectExists"),
        _vgpudevice_enable,
    ),
    ActionKind.DEVICE_PLUGIN_REFRESH: (("resource", "type", "devices"), (), _device_plugin_refresh),
}

_METADATA = ("name", "labels", "annotations", "resourceVersion", *RETAINED_METADATA)


def _kube_object(raw: object, where: str, target: str) -> KubeObject:
    body = _mapping(raw, where)
    _keys(body, where, required=("apiVersion", "kind", "metadata", "spec", "status"))
    kind = _str(body, "kind", where)
    if kind not in PLURALS:
        raise PlanFormatError(
            f"{where}.kind: {_kind(kind)} is not one of {', '.join(sorted(PLURALS))}"
        )
    group, version = GROUP_VERSIONS[kind]
    if body["apiVersion"] != f"{group}/{version}":
        raise PlanFormatError(
            f"{where}.apiVersion: expected {group}/{version} for a {kind}, got "
            f"{_kind(body['apiVersion'])}"
        )
    meta_where = f"{where}.metadata"
    meta = _mapping(body["metadata"], meta_where)
    _keys(meta, meta_where, required=("name", "labels"), optional=_METADATA[2:])
    if _str(meta, "name", meta_where) != target:
        raise PlanFormatError(f"{meta_where}.name: {_kind(meta['name'])} is not the target")
    for key in ("labels", "annotations"):
        if key in meta:
            labels = _mapping(meta[key], f"{meta_where}.{key}")
            for k, v in labels.items():
                _text(v, f"{meta_where}.{key}.{excerpt(str(k), 40)}", empty=True)
    if "resourceVersion" in meta:
        _str(meta, "resourceVersion", meta_where)
    for key in RETAINED_METADATA:
        if key in meta:
            _list(meta, key, meta_where)
    _mapping(body["spec"], f"{where}.spec")
    _mapping(body["status"], f"{where}.status")
    return KubeObject.from_json(body)


def _field_change(raw: object, where: str) -> FieldChange:
    doc = _mapping(raw, where)
    _keys(doc, where, required=("path", "from", "to"))
    return FieldChange(path=_str(doc, "path", where), old=doc["from"], new=doc["to"])


def _noop(raw: object, where: str) -> Noop:
    doc = _mapping(raw, where)
    _keys(doc, where, required=("target", "reason"))
    return Noop(_str(doc, "target", where), _str(doc, "reason", where))


def _drift(raw: object, where: str) -> Drift:
    doc = _mapping(raw, where)
    _keys(doc, where, required=("target", "kind", "changes"))
    return Drift(
        target=_str(doc, "target", where),
        kind=_str(doc, "kind", where),
        changes=tuple(
            _field_change(c, f"{where}.changes[{i}]")
            for i, c in enumerate(_list(doc, "changes", where))
        ),
    )


# -- checked reads --------------------------------------------------------------------------------


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _mapping(raw: object, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise PlanFormatError(f"{where}: expected an object, got {_kind(raw)}")
    return raw


def _keys(
    doc: Mapping[str, Any],
    where: str,
    *,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> None:
    missing = [k for k in required if k not in doc]
    if missing:
        raise PlanFormatError(f"{where}: missing required field {', '.join(missing)}")
    allowed = {*required, *optional}
    unknown = [str(k) for k in doc if k not in allowed]
    if unknown:
        raise PlanFormatError(f"{where}: unknown field {excerpt(', '.join(unknown))}")


def _text(value: object, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise PlanFormatError(f"{where}: expected text, got {_kind(value)}")
    if not value and not empty:
        raise PlanFormatError(f"{where}: expected non-empty text")
    return value


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    return _text(doc.get(key), _at(where, key))


def _int(doc: Mapping[str, Any], key: str, where: str, *, minimum: int) -> int:
    value = doc.get(key)
    if type(value) is not int:  # a bool is an int to Python, not to a plan
        raise PlanFormatError(f"{_at(where, key)}: expected an integer, got {_kind(value)}")
    if value < minimum:
        raise PlanFormatError(f"{_at(where, key)}: expected at least {minimum}, got {value}")
    return value


def _bool(doc: Mapping[str, Any], key: str, where: str) -> bool:
    value = doc.get(key)
    if not isinstance(value, bool):
        raise PlanFormatError(f"{_at(where, key)}: expected true or false, got {_kind(value)}")
    return value


def _list(
    doc: Mapping[str, Any], key: str, where: str, *, missing: list[Any] | None = None
) -> list[Any]:
    value = doc.get(key, missing)
    if not isinstance(value, list):
        raise PlanFormatError(f"{_at(where, key)}: expected a list, got {_kind(value)}")
    return value


def value_in_words(value: object) -> str:
    """A value of an untrusted JSON document in words, with the value itself when short
    (escaped): ``text 'abc'``. Saved-plan reading (``cli/planfile.py``) uses it too."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {excerpt(str(value), 24)}"
    if isinstance(value, str):
        return f"text {excerpt(repr(value), 40)}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


_kind = value_in_words
