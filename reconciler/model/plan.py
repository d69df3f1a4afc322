"""A plan: the ordered actions that take one node from observed to desired, and why.

Plans are data: one frozen dataclass per action kind, and one JSON form
(:mod:`reconciler.model.plan_json`, ``schemas/plan.schema.json``). ``plan`` renders one, ``apply``
executes one, and a saved plan carries the fingerprint of the host it was made from.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, Self

from reconciler.model.address import PciAddress
from reconciler.model.cluster import KubeObject
from reconciler.model.mode import VgpuMode
from reconciler.model.record import fields, record

FORMAT_VERSION = 2


class Phase(enum.StrEnum):
    """Where an action runs: the KubeVirt allow-list's additions first (before any vGPU of a
    type is created, KubeVirt's virt-handler must find the type allow-listed: docs/domain.md
    §10), then the host, then the cluster, then the device plugins."""

    ALLOW_LIST = "allow-list"
    HOST = "host"
    CLUSTER = "cluster"
    DEVICE_PLUGINS = "device-plugins"


class ActionKind(enum.StrEnum):
    """Action vocabulary, in the order actions run within a node plan."""

    #: Entries added to the KubeVirt allow-list before the host phase (never a removal).
    KUBEVIRT_ALLOW = "kubevirt-allow"
    VGPU_REMOVE = "vgpu-remove"
    SRIOV_DISABLE = "sriov-disable"
    SRIOV_ENABLE = "sriov-enable"
    VGPU_MODE = "vgpu-mode"
    VGPU_CREATE = "vgpu-create"
    CR_CREATE = "cr-create"
    CR_UPDATE = "cr-update"
    CR_DELETE = "cr-delete"
    KUBEVIRT_UPDATE = "kubevirt-update"
    # Delegate mode (docs/delegate.md): specs of Harvester's objects, in the order
    # pcidevices-controller needs them.
    VGPUDEVICE_DISABLE = "vgpudevice-disable"
    SRIOVGPUDEVICE_DISABLE = "sriovgpudevice-disable"
    SRIOVGPUDEVICE_ENABLE = "sriovgpudevice-enable"
    VGPUDEVICE_ENABLE = "vgpudevice-enable"
    DEVICE_PLUGIN_REFRESH = "device-plugin-refresh"

    @property
    def order(self) -> int:
        return _ORDER[self]

    @property
    def phase(self) -> Phase:
        return _PHASE[self]

    @property
    def is_host(self) -> bool:
        return _PHASE[self] is Phase.HOST


_ORDER = {k: i for i, k in enumerate(ActionKind)}
_PHASE = {
    ActionKind.KUBEVIRT_ALLOW: Phase.ALLOW_LIST,
    ActionKind.VGPU_REMOVE: Phase.HOST,
    ActionKind.SRIOV_DISABLE: Phase.HOST,
    ActionKind.SRIOV_ENABLE: Phase.HOST,
    ActionKind.VGPU_MODE: Phase.HOST,
    ActionKind.VGPU_CREATE: Phase.HOST,
    ActionKind.CR_CREATE: Phase.CLUSTER,
    ActionKind.CR_UPDATE: Phase.CLUSTER,
    ActionKind.CR_DELETE: Phase.CLUSTER,
    ActionKind.KUBEVIRT_UPDATE: Phase.CLUSTER,
    ActionKind.VGPUDEVICE_DISABLE: Phase.CLUSTER,
    ActionKind.SRIOVGPUDEVICE_DISABLE: Phase.CLUSTER,
    ActionKind.SRIOVGPUDEVICE_ENABLE: Phase.CLUSTER,
    ActionKind.VGPUDEVICE_ENABLE: Phase.CLUSTER,
    ActionKind.DEVICE_PLUGIN_REFRESH: Phase.DEVICE_PLUGINS,
}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_new = object.__new__
_set = object.__setattr__  # as a frozen dataclass's own __init__ sets its fields


@record(frozen=True, slots=True, kw_only=True)
class _Step:
    """What every action has: its place in the run (``seq``, 1-based; 0 before the planner
    numbers it, and on a blocked action), what it changes, and why (words for people).

    ``target`` is a PCI address for host actions (the VF for vgpu-*, the GPU for sriov-*), an
    object name for CR actions, ``kubevirt/<ns>/<name>`` for the KubeVirt CR, the extended
    resource for a device-plugin refresh. The JSON form is :mod:`reconciler.model.plan_json`.
    """

    kind: ClassVar[ActionKind]
    seq: int = 0
    target: str
    reason: str

    @property
    def phase(self) -> Phase:
        return self.kind.phase

    def numbered(self, seq: int) -> Self:
        """This action at place ``seq``: ``dataclasses.replace(self, seq=seq)`` at half the cost
        (the planner numbers every action of a plan once; a fleet plans hundreds of thousands).
        """
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.name != "seq")
        new = _new(cls)
        _set(new, "seq", seq)
        for name in names:
            _set(new, name, getattr(self, name))
        return new

    @property
    def is_replacement(self) -> bool:
        """Half of a profile change on one VF (a remove with ``replaced_by``, a create with
        ``replaces``)."""
        return False


@record(frozen=True, slots=True, kw_only=True)
class VgpuRemove(_Step):
    """Remove the vGPU ``uuid`` (of ``type_name``) on VF ``target``, index ``vf_index`` of
    ``gpu``. ``replaced_by``: on a replacement, the profile the vgpu-create after it puts there.
    """

    kind: ClassVar[ActionKind] = ActionKind.VGPU_REMOVE
    gpu: PciAddress
    vf_index: int
    type_name: str
    uuid: str
    replaced_by: str | None = None

    @property
    def is_replacement(self) -> bool:
        return self.replaced_by is not None


@record(frozen=True, slots=True, kw_only=True)
class SriovDisable(_Step):
    """``sriov-manage -d`` on GPU ``gpu`` (= ``target``)."""

    kind: ClassVar[ActionKind] = ActionKind.SRIOV_DISABLE
    gpu: PciAddress


@record(frozen=True, slots=True, kw_only=True)
class SriovEnable(_Step):
    """``sriov-manage -e`` on GPU ``gpu`` (= ``target``): ``num_vfs`` VFs appear."""

    kind: ClassVar[ActionKind] = ActionKind.SRIOV_ENABLE
    gpu: PciAddress
    num_vfs: int


@record(frozen=True, slots=True, kw_only=True)
class VgpuModeSet(_Step):
    """Put GPU ``gpu`` (= ``target``) in vGPU ``mode``: ``nvidia-smi vgpu -i <gpu> -shm 1``
    (mixed-size) or ``-shm 0`` (equal-size). The driver takes it only while SR-IOV is on and
    the GPU hosts no vGPU, so it runs after the removals and SR-IOV enables, before the first
    create (docs/domain.md §4). ``mode`` is never :attr:`VgpuMode.UNKNOWN`."""

    kind: ClassVar[ActionKind] = ActionKind.VGPU_MODE
    gpu: PciAddress
    mode: VgpuMode


@record(frozen=True, slots=True, kw_only=True)
class VgpuCreate(_Step):
    """Create a vGPU of ``type_name`` under ``uuid`` on VF ``target``, index ``vf_index`` of
    ``gpu``. ``replaces``: on a replacement, the profile the vgpu-remove before it took off."""

    kind: ClassVar[ActionKind] = ActionKind.VGPU_CREATE
    gpu: PciAddress
    vf_index: int
    type_name: str
    uuid: str
    replaces: str | None = None

    @property
    def is_replacement(self) -> bool:
        return self.replaces is not None


@record(frozen=True, slots=True, kw_only=True)
class CrCreate(_Step):
    """POST ``object`` (then its status through the status subresource)."""

    kind: ClassVar[ActionKind] = ActionKind.CR_CREATE
    object: KubeObject


@record(frozen=True, slots=True, kw_only=True)
class CrUpdate(_Step):
    """PUT ``object`` (the full intended body, planned from ``resource_version``) when
    ``spec_changed`` (spec or metadata differ), its status when ``status_changed``.
    ``changes``: every differing field; ``drift``: the stored spec was edited by hand (this
    resets it); ``adopt``: the object was another controller's (``--adopt``)."""

    kind: ClassVar[ActionKind] = ActionKind.CR_UPDATE
    resource_version: str
    object: KubeObject
    spec_changed: bool
    status_changed: bool
    changes: tuple[FieldChange, ...] = ()
    drift: bool = False
    adopt: bool = False


@record(frozen=True, slots=True, kw_only=True)
class CrDelete(_Step):
    """DELETE the ``object_kind`` named ``target``, planned from ``resource_version``."""

    kind: ClassVar[ActionKind] = ActionKind.CR_DELETE
    object_kind: str
    resource_version: str


@record(frozen=True, slots=True)
class MediatedDevice:
    """A KubeVirt ``permittedHostDevices.mediatedDevices`` entry vgpuctl adds (always with
    ``externalResourceProvider: true``: vgpuctl's device plugin allocates)."""

    selector: str  # mdevNameSelector: the vGPU type name
    resource_name: str  # nvidia.com/<type name>

    def to_json(self) -> dict[str, Any]:
        return {
            "mdevNameSelector": self.selector,
            "resourceName": self.resource_name,
            "externalResourceProvider": True,
        }


@record(frozen=True, slots=True)
class PciHostDevice:
    """A KubeVirt ``permittedHostDevices.pciHostDevices`` entry vgpuctl adds for a profile
    configured on NVIDIA's vendor-specific VFIO interface, where the VF is the vGPU (always
    with ``externalResourceProvider: true``)."""

    selector: str  # pciVendorSelector: 10DE:<the VFs' device id>, e.g. 10DE:26B9
    resource_name: str  # nvidia.com/<type name>

    def to_json(self) -> dict[str, Any]:
        return {
            "pciVendorSelector": self.selector,
            "resourceName": self.resource_name,
            "externalResourceProvider": True,
        }


@record(frozen=True, slots=True, kw_only=True)
class KubevirtUpdate(_Step):
    """Add ``add`` to the mediated-devices allow-list of KubeVirt CR ``namespace``/``name``
    (each unless an entry for its selector is there), remove the entries of the ``remove``
    selectors and their retiring marks, mark the ``retire`` selectors retiring (the executor
    stamps the time it writes), clear the marks of the ``unmark`` selectors; ``owned`` are the
    selectors vgpuctl owns afterwards (``model.retiring``: an owned entry is marked before it
    is removed). The same for the PCI host devices allow-list, by resourceName: ``add_pci``,
    ``remove_pci``, ``owned_pci`` (not swept by virt-handler: removed without a mark)."""

    kind: ClassVar[ActionKind] = ActionKind.KUBEVIRT_UPDATE
    namespace: str
    name: str
    resource_version: str
    add: tuple[MediatedDevice, ...] = ()
    remove: tuple[str, ...] = ()
    owned: tuple[str, ...] = ()
    add_pci: tuple[PciHostDevice, ...] = ()
    remove_pci: tuple[str, ...] = ()
    owned_pci: tuple[str, ...] = ()
    retire: tuple[str, ...] = ()
    unmark: tuple[str, ...] = ()


@record(frozen=True, slots=True)
class WantedProfile:
    """A profile a run publishes its intent for: ``wanted`` VFs the desired state gives it."""

    name: str
    wanted: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "wanted": self.wanted}


@record(frozen=True, slots=True)
class Intent:
    """What a run publishes in its own VGPUNodeState (named ``node``) before the allow-list
    check: the mdev types it will create vGPUs of that the stored status does not show
    configured, each with its ``wanted`` count (``status.profiles``; every other field kept as
    stored). Another node's run that reads the summaries after this write keeps the types
    listed (docs/architecture.md, "The KubeVirt allow-list")."""

    node: str
    profiles: tuple[WantedProfile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "profiles": [p.to_json() for p in self.profiles]}


@record(frozen=True, slots=True, kw_only=True)
class KubevirtAllow(KubevirtUpdate):
    """A :class:`KubevirtUpdate` that only adds and unmarks (``remove``, ``remove_pci`` and
    ``retire`` empty), run in the allow-list phase, before any host action: KubeVirt's
    virt-handler removes every mdev whose type is not allow-listed (docs/domain.md §10), so a
    type is listed before its first vGPU is created. Every mdev type the host phase creates is
    in ``add`` and ``unmark`` even when listed and unmarked at plan time: at apply the step
    re-reads the CR, adds it if it went missing and clears a retiring mark another node wrote
    meanwhile, a write that makes that node's removal patch (which tests the mark) fail.
    Removals and marks wait for the cluster phase's ``kubevirt-update``.

    ``intent`` (None: none to publish): written in the node's VGPUNodeState before the CR is
    read; if that write fails, so does the step, and no host action runs."""

    kind: ClassVar[ActionKind] = ActionKind.KUBEVIRT_ALLOW
    intent: Intent | None = None


@record(frozen=True, slots=True, kw_only=True)
class _HarvesterGpuStep(_Step):
    """Set ``spec.enabled`` of the ``SRIOVGPUDevice`` named ``target`` (GPU ``gpu`` of node
    ``node``), written over ``resource_version`` (delegate mode: pcidevices-controller runs
    ``sriov-manage`` for it)."""

    node: str
    gpu: PciAddress
    resource_version: str


@record(frozen=True, slots=True, kw_only=True)
class SriovGpuDeviceEnable(_HarvesterGpuStep):
    """``spec.enabled: true``: done once the GPU's ``VGPUDevice`` objects exist."""

    kind: ClassVar[ActionKind] = ActionKind.SRIOVGPUDEVICE_ENABLE


@record(frozen=True, slots=True, kw_only=True)
class SriovGpuDeviceDisable(_HarvesterGpuStep):
    """``spec.enabled: false``, once none of its VFs hosts a vGPU."""

    kind: ClassVar[ActionKind] = ActionKind.SRIOVGPUDEVICE_DISABLE


@record(frozen=True, slots=True, kw_only=True)
class _HarvesterVfStep(_Step):
    """Set the spec of the ``VGPUDevice`` named ``target`` (VF ``vf``, index ``vf_index`` of GPU
    ``gpu`` on node ``node``), written over ``resource_version``: ``vGPUTypeName``
    ``type_name`` and ``enabled`` (delegate mode: pcidevices-controller makes or removes the
    vGPU)."""

    node: str
    gpu: PciAddress
    vf: PciAddress
    vf_index: int
    resource_version: str
    type_name: str
    #: The spec already says it, the status does not: nothing to write, only pcidevices-
    #: controller's work to wait for (apply waits again; a VF counts as hosting a profile only
    #: once its status says so).
    pending: bool = False


@record(frozen=True, slots=True, kw_only=True)
class VgpuDeviceEnable(_HarvesterVfStep):
    """``vGPUTypeName: type_name, enabled: true``; written once the VF's
    ``status.availableTypes`` lists the profile (what the webhook admits), done once its
    ``vGPUStatus`` says configured with that type. ``replaces``: half of a profile change (the
    profile the disable before it took off).

    ``object_exists`` False: planned ahead, on a GPU whose SR-IOV is off. Its ``VGPUDevice`` is
    made by pcidevices-controller only after the GPU's ``sriovgpudevice-enable`` (at its node
    resync), under the name and VF address it will have (``<node>-<VF address without ':' and
    '.'>``, pcidevices ``generateVGPUDevice``) and the VF index the catalogue's VF layout puts it
    at; ``resource_version`` is then "". Apply waits for the object and checks it is the one
    predicted before anything is written."""

    kind: ClassVar[ActionKind] = ActionKind.VGPUDEVICE_ENABLE
    replaces: str | None = None
    object_exists: bool = True

    @property
    def is_replacement(self) -> bool:
        return self.replaces is not None


@record(frozen=True, slots=True, kw_only=True)
class VgpuDeviceDisable(_HarvesterVfStep):
    """``enabled: false`` (``type_name``: the profile it has, kept); done once its
    ``vGPUStatus`` is empty. ``replaced_by``: half of a profile change."""

    kind: ClassVar[ActionKind] = ActionKind.VGPUDEVICE_DISABLE
    replaced_by: str | None = None

    @property
    def is_replacement(self) -> bool:
        return self.replaced_by is not None


@record(frozen=True, slots=True, kw_only=True)
class DevicePluginRefresh(_Step):
    """Profile ``type_name`` (resource ``resource``) is advertised as ``devices`` (UUIDs) once
    the host actions ran."""

    kind: ClassVar[ActionKind] = ActionKind.DEVICE_PLUGIN_REFRESH
    resource: str
    type_name: str
    devices: tuple[str, ...] = ()


#: One step of a plan; ``match`` on the type, read its fields.
Action = (
    VgpuRemove
    | SriovDisable
    | SriovEnable
    | VgpuModeSet
    | VgpuCreate
    | CrCreate
    | CrUpdate
    | CrDelete
    | KubevirtUpdate
    | VgpuDeviceDisable
    | SriovGpuDeviceDisable
    | SriovGpuDeviceEnable
    | VgpuDeviceEnable
    | DevicePluginRefresh
)
HostAction = VgpuRemove | SriovDisable | SriovEnable | VgpuModeSet | VgpuCreate
ClusterAction = CrCreate | CrUpdate | CrDelete | KubevirtUpdate
#: A delegate-mode step: a spec written for pcidevices-controller to act on.
DelegateAction = VgpuDeviceDisable | SriovGpuDeviceDisable | SriovGpuDeviceEnable | VgpuDeviceEnable
#: The action type of each kind.
ACTION_TYPES: Mapping[ActionKind, type[Action]] = MappingProxyType(
    {
        t.kind: t
        for t in (
            VgpuRemove,
            SriovDisable,
            SriovEnable,
            VgpuModeSet,
            VgpuCreate,
            CrCreate,
            CrUpdate,
            CrDelete,
            KubevirtAllow,
            KubevirtUpdate,
            VgpuDeviceDisable,
            SriovGpuDeviceDisable,
            SriovGpuDeviceEnable,
            VgpuDeviceEnable,
            DevicePluginRefresh,
        )
    }
)


@record(frozen=True, slots=True)
class Blocked:
    """An action that must not run now (a VM holds the vGPU), or one that depends on it: the
    host action as it would run (``seq`` 0), its reason saying why it waits. A GPU left alone
    as a whole (hands off) is one blocked entry: its first change. In delegate mode, the
    Harvester spec write that waits."""

    action: HostAction | DelegateAction

    @property
    def kind(self) -> ActionKind:
        return self.action.kind

    @property
    def target(self) -> str:
        return self.action.target

    @property
    def reason(self) -> str:
        return self.action.reason


@record(frozen=True, slots=True)
class Noop:
    """Something that needs nothing, and why (``VF hosts NVIDIA A2-4Q as desired``)."""

    target: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "reason": self.reason}


@record(frozen=True, slots=True)
class FieldChange:
    """One field of a cluster object that differs: ``spec.vGPUTypeName`` from X to Y.

    ``old``/``new`` are JSON values; None stands for absent as well as null.
    """

    path: str  # "spec.vGPUTypeName", 'status.availableTypes["NVIDIA A2-4Q"]'
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "from": self.old, "to": self.new}


@record(frozen=True, slots=True)
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


@record(frozen=True, slots=True)
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


#: The kinds counted as creates.
_CREATES = frozenset(
    {
        ActionKind.VGPU_CREATE,
        ActionKind.SRIOV_ENABLE,
        ActionKind.CR_CREATE,
        ActionKind.SRIOVGPUDEVICE_ENABLE,
        ActionKind.VGPUDEVICE_ENABLE,
    }
)
#: The removing halves of a change (counted on their create).
_REMOVES_OF_A_CHANGE = frozenset({ActionKind.VGPU_REMOVE, ActionKind.VGPUDEVICE_DISABLE})
#: The kinds counted as changes (besides a replacement).
_CHANGES = frozenset(
    {
        ActionKind.CR_UPDATE,
        ActionKind.KUBEVIRT_ALLOW,
        ActionKind.KUBEVIRT_UPDATE,
        ActionKind.VGPU_MODE,
    }
)


class Fingerprinted(Protocol):
    """An observation that can say its fingerprint (an :class:`~reconciler.model.Inventory`)."""

    def fingerprint(self) -> str: ...


class Observation:
    """What a plan was made from, as far as the plan keeps it: its fingerprint, which a saved plan
    carries and ``apply`` checks against a fresh observation.

    Made from the observation itself, the fingerprint is computed when first read, and the
    observation let go then: a digest of everything planning read (the SHA-256 of about 80 kB of
    canonical JSON for a node of 256 VFs) was a tenth of planning a fleet, whose text output
    never shows it. Equal when the fingerprints are equal, however each was made.
    """

    __slots__ = ("_of", "_value")

    def __init__(self, value: str | Fingerprinted) -> None:
        self._value = value if isinstance(value, str) else ""
        self._of: Fingerprinted | None = None if isinstance(value, str) else value

    @property
    def fingerprint(self) -> str:
        of = self._of
        if of is not None:  # two threads may both compute it: the same value
            self._value, self._of = of.fingerprint(), None
        return self._value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Observation):
            return NotImplemented
        return self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"Observation({self.fingerprint!r})"


@record(frozen=True, slots=True)
class Plan:
    node: str
    interface: str
    observed: Observation
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
    def observed_fingerprint(self) -> str:
        """The fingerprint of the host observation the plan was made from."""
        return self.observed.fingerprint

    @property
    def summary(self) -> Summary:
        """Terraform's counts: a replacement (remove + create on one VF) is one change.

        SR-IOV enable counts as a create and disable as a remove, a vGPU mode switch as a change
        (delegate mode: an enable of a Harvester object as a create, a disable as a remove);
        CR and KubeVirt writes count as creates, changes or removes by their kind. A
        device-plugin refresh is not counted: it follows from the vGPU changes already counted,
        and changes nothing by itself.
        """
        create = change = remove = 0
        for a in self.actions:
            if a.kind in _REMOVES_OF_A_CHANGE and a.is_replacement:
                continue  # counted once, on its create
            if a.kind is ActionKind.DEVICE_PLUGIN_REFRESH:
                continue
            if a.is_replacement or a.kind in _CHANGES:
                change += 1
            elif a.kind in _CREATES:
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
