"""A plan: the ordered actions that take one node from observed to desired, and why.

Plans are data (``schemas/plan.schema.json``): ``plan`` renders one, ``apply`` executes one, and
a saved plan carries the fingerprint of the host it was made from.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

FORMAT_VERSION = 1


class ActionKind(enum.StrEnum):
    """Action vocabulary, in the order actions run within a node plan."""

    VGPU_REMOVE = "vgpu-remove"
    SRIOV_DISABLE = "sriov-disable"
    SRIOV_ENABLE = "sriov-enable"
    VGPU_CREATE = "vgpu-create"
    CR_CREATE = "cr-create"
    CR_UPDATE = "cr-update"
    CR_DELETE = "cr-delete"
    KUBEVIRT_UPDATE = "kubevirt-update"
    DEVICE_PLUGIN_REFRESH = "device-plugin-refresh"

    @property
    def order(self) -> int:
        return _ORDER[self]

    @property
    def is_host(self) -> bool:
        return self in _HOST


_ORDER = {k: i for i, k in enumerate(ActionKind)}
_HOST = frozenset(
    {
        ActionKind.VGPU_REMOVE,
        ActionKind.SRIOV_DISABLE,
        ActionKind.SRIOV_ENABLE,
        ActionKind.VGPU_CREATE,
    }
)


def _frozen(params: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(params))


@dataclass(frozen=True, slots=True)
class Action:
    """One step. ``target`` is a PCI address for host actions, an object name for CR actions.

    Host action params (all strings unless said):
      sriov-enable / sriov-disable: ``gpu``, ``numVFs`` (int, enable only)
      vgpu-create: ``gpu``, ``vfIndex`` (int), ``type``, ``uuid``, ``replaces`` (old type, on
      a replacement)
      vgpu-remove: ``gpu``, ``vfIndex`` (int), ``type``, ``uuid``, ``replacedBy`` (new type, on
      a replacement)

    Cluster action params (``target`` is the object name, or ``kubevirt/<ns>/<name>``):
      cr-create: ``kind``, ``object`` (the full API body, ``KubeObject.to_json()``)
      cr-update: ``kind``, ``resourceVersion`` (planned from), ``object`` (the full intended
      body, resourceVersion set), ``specChanged`` (bool: spec or metadata differ, a PUT of the
      object), ``statusChanged`` (bool: a PUT of the status subresource), ``changes`` (list of
      ``{path, from, to}``), ``drift`` (bool: the stored spec was edited by hand), ``adopt``
      (true, only when the object was another controller's)
      cr-delete: ``kind``, ``resourceVersion``
      kubevirt-update: ``namespace``, ``name``, ``resourceVersion``, ``add`` (mediatedDevices
      entries), ``remove`` (mdevNameSelectors), ``owned`` (the selectors vgpuctl owns after it)
    """

    seq: int
    kind: ActionKind
    target: str
    reason: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))

    @property
    def is_replacement(self) -> bool:
        return "replaces" in self.params or "replacedBy" in self.params

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "kind": self.kind.value,
            "target": self.target,
            "params": dict(self.params),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Action:
        return cls(
            seq=int(raw["seq"]),
            kind=ActionKind(raw["kind"]),
            target=str(raw["target"]),
            reason=str(raw.get("reason", "")),
            params=dict(raw.get("params", {})),
        )


@dataclass(frozen=True, slots=True)
class Blocked:
    """An action that must not run now (a VM holds the vGPU), or one that depends on it."""

    kind: ActionKind
    target: str
    reason: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "target": self.target,
            "params": dict(self.params),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Blocked:
        return cls(
            kind=ActionKind(raw["kind"]),
            target=str(raw["target"]),
            reason=str(raw.get("reason", "")),
            params=dict(raw.get("params", {})),
        )


@dataclass(frozen=True, slots=True)
class Noop:
    """Something that needs nothing, and why (``VF hosts NVIDIA A2-4Q as desired``)."""

    target: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field of a cluster object that differs: ``spec.vGPUTypeName`` from X to Y.

    ``old``/``new`` are JSON values; None stands for absent as well as null.
    """

    path: str  # "spec.vGPUTypeName", 'status.availableTypes["NVIDIA A2-4Q"]'
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "from": self.old, "to": self.new}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FieldChange:
        return cls(path=str(raw["path"]), old=raw.get("from"), new=raw.get("to"))


@dataclass(frozen=True, slots=True)
class Drift:
    """A cluster object edited outside vgpuctl: its stored spec differs from the spec vgpuctl
    last wrote. ``changes`` go from what vgpuctl wrote to what is stored; the plan resets it."""

    target: str  # the object name
    kind: str  # SRIOVGPUDevice | VGPUDevice
    changes: tuple[FieldChange, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "changes": [c.to_json() for c in self.changes],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Drift:
        return cls(
            target=str(raw["target"]),
            kind=str(raw["kind"]),
            changes=tuple(FieldChange.from_json(c) for c in raw.get("changes", [])),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    create: int
    change: int
    remove: int
    blocked: int

    def to_json(self) -> dict[str, int]:
        return {
            "create": self.create,
            "change": self.change,
            "remove": self.remove,
            "blocked": self.blocked,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    node: str
    interface: str
    observed_fingerprint: str
    actions: tuple[Action, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    noops: tuple[Noop, ...] = ()
    #: Free-text notes for the reader (e.g. "cluster actions skipped: no cluster configured").
    notes: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION
    #: Cluster objects changed outside vgpuctl ("changed outside vgpuctl"); each has a cr-update
    #: with ``drift: true`` among the actions that resets it.
    drift: tuple[Drift, ...] = ()

    @property
    def summary(self) -> Summary:
        """Terraform's counts: a replacement (remove + create on one VF) is one change.

        SR-IOV enable counts as a create and disable as a remove; CR and KubeVirt writes count as
        creates, changes or removes by their kind. A device-plugin refresh is not counted: it
        follows from the vGPU changes already counted, and changes nothing by itself.
        """
        create = change = remove = 0
        for a in self.actions:
            if a.kind is ActionKind.VGPU_REMOVE and a.is_replacement:
                continue  # counted once, on its create
            if a.kind is ActionKind.DEVICE_PLUGIN_REFRESH:
                continue
            if a.is_replacement or a.kind in (ActionKind.CR_UPDATE, ActionKind.KUBEVIRT_UPDATE):
                change += 1
            elif a.kind in (ActionKind.VGPU_CREATE, ActionKind.SRIOV_ENABLE, ActionKind.CR_CREATE):
                create += 1
            else:
                remove += 1
        return Summary(create, change, remove, len(self.blocked))

    @property
    def has_changes(self) -> bool:
        return bool(self.actions or self.blocked)

    @property
    def applyable(self) -> bool:
        """True when applying this plan converges the node: nothing is blocked."""
        return not self.blocked

    def to_json(self) -> dict[str, Any]:
        """The plan contract (``schemas/plan.schema.json``)."""
        return {
            "formatVersion": self.format_version,
            "node": self.node,
            "interface": self.interface,
            "observedFingerprint": self.observed_fingerprint,
            "actions": [a.to_json() for a in self.actions],
            "blocked": [b.to_json() for b in self.blocked],
            "noops": [n.to_json() for n in self.noops],
            "drift": [d.to_json() for d in self.drift],
            "notes": list(self.notes),
            "summary": self.summary.to_json(),
            "applyable": self.applyable,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Plan:
        return cls(
            format_version=int(raw["formatVersion"]),
            node=str(raw["node"]),
            interface=str(raw["interface"]),
            observed_fingerprint=str(raw["observedFingerprint"]),
            actions=tuple(Action.from_json(a) for a in raw.get("actions", [])),
            blocked=tuple(Blocked.from_json(b) for b in raw.get("blocked", [])),
            noops=tuple(Noop(str(n["target"]), str(n["reason"])) for n in raw.get("noops", [])),
            notes=tuple(str(n) for n in raw.get("notes", [])),
            drift=tuple(Drift.from_json(d) for d in raw.get("drift", [])),
        )
