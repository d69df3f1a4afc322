"""What the cluster holds for vGPUs: Harvester-compatible CRs, the KubeVirt allow-list, and who
uses which vGPU (kubelet allocations, running VMIs).

Produced by the cluster observer (``observe.cluster``) from the API server and the kubelet's
checkpoint; consumed by the pure cluster planner. Objects are plain mappings as the API returns
them (``spec``/``status`` bodies), wrapped with what the planner needs to diff them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from reconciler.model.inventory import Interface
from reconciler.model.record import field, record

#: The Harvester CRDs (docs/domain.md §5): group, version, kinds, plurals.
GROUP = "devices.harvesterhci.io"
VERSION = "v1beta1"
SRIOV_GPU_KIND = "SRIOVGPUDevice"
SRIOV_GPU_PLURAL = "sriovgpudevices"
VGPU_KIND = "VGPUDevice"
VGPU_PLURAL = "vgpudevices"
#: vgpuctl's own per-node summary (docs/architecture.md "The node's summary"): one
#: cluster-scoped object per node, named after it, holding everything vgpuctl knows beyond
#: Harvester's fields.
NODE_STATE_GROUP = "vgpu.reconciler.dev"
NODE_STATE_VERSION = "v1alpha1"
NODE_STATE_KIND = "VGPUNodeState"
NODE_STATE_PLURAL = "vgpunodestates"
PLURALS = {
    SRIOV_GPU_KIND: SRIOV_GPU_PLURAL,
    VGPU_KIND: VGPU_PLURAL,
    NODE_STATE_KIND: NODE_STATE_PLURAL,
}
#: Each kind's API group and version.
GROUP_VERSIONS = {
    SRIOV_GPU_KIND: (GROUP, VERSION),
    VGPU_KIND: (GROUP, VERSION),
    NODE_STATE_KIND: (NODE_STATE_GROUP, NODE_STATE_VERSION),
}

#: The fields Harvester's CRDs declare (harvester/pcidevices ``charts/templates/crds.yaml``,
#: from ``pkg/apis/devices.harvesterhci.io/v1beta1``): the API server prunes every other field,
#: so these are all vgpuctl writes to and compares of Harvester's two kinds. Spec fields
#: are always written; status fields only when not empty (Harvester's ``omitempty``).
HARVESTER_SPEC: Mapping[str, tuple[tuple[str, type], ...]] = MappingProxyType(
    {
        SRIOV_GPU_KIND: (("address", str), ("enabled", bool), ("nodeName", str)),
        VGPU_KIND: (
            ("address", str),
            ("enabled", bool),
            ("nodeName", str),
            ("parentGPUDeviceAddress", str),
            ("vGPUTypeName", str),
        ),
    }
)
HARVESTER_STATUS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        SRIOV_GPU_KIND: ("vfAddresses", "vGPUDevices"),
        VGPU_KIND: ("vGPUStatus", "uuid", "configureVGPUTypeName", "availableTypes"),
    }
)

#: Labels Harvester sets and readers (UI, Rancher, kubectl) select on.
NODE_LABEL = "nodename"
PARENT_LABEL = "harvesterhci.io/parentSRIOVGPUDevice"
#: Marks what vgpuctl owns; objects another controller manages are left alone unless adopted.
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "vgpuctl"

#: KubeVirt (docs/domain.md §8).
KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
KUBEVIRT_PLURAL = "kubevirts"
#: Annotation on the KubeVirt CR listing the mediatedDevices entries vgpuctl added (by
#: mdevNameSelector), so entries someone else added are never removed.
KUBEVIRT_OWNED_ANNOTATION = "vgpu.reconciler.dev/mediated-devices"
#: The same for the pciHostDevices entries vgpuctl added (vGPUs on NVIDIA's vendor-specific
#: VFIO interface, docs/domain.md §3b), by resourceName: their pciVendorSelector is shared by
#: every profile of a GPU model, so it cannot say which entry is whose. Comma-separated too.
KUBEVIRT_OWNED_PCI_ANNOTATION = "vgpu.reconciler.dev/pci-host-devices"
#: NVIDIA's PCI vendor id as KubeVirt's pciVendorSelector writes it (``10DE:2236``).
NVIDIA_PCI_VENDOR = "10DE"
#: The prefix of the Kubernetes resource names vGPUs are advertised as.
RESOURCE_PREFIX = "nvidia.com/"
#: What a vGPU type's name may be: it becomes a Kubernetes resource name (``NVIDIA A2-4Q`` →
#: ``nvidia.com/NVIDIA_A2-4Q``, each run of spaces made one ``_``, each ``/`` and ``.`` a ``_``:
#: :func:`resource_name`), whose name part must be a
#: qualified name: at most 63 characters, letters, digits, ``-``, ``_`` and ``.``, a letter or
#: digit at each end. NVIDIA's names (``NVIDIA A2-4Q``, ``GRID A100D-4C``, ``NVIDIA L40S-3B``)
#: all are; anything else is a name vgpuctl will not publish to the kubelet or KubeVirt.
#: deploy/admission-policy.yaml says the same in CEL (tests/security/
#: test_admission_allow_list.py holds the two equal).
_TYPE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 ._/-]{0,61}[A-Za-z0-9])?")
#: What Go's ``strings.TrimSpace`` trims (``unicode.IsSpace``: Latin-1's ``\t\n\v\f\r``,
#: space, U+0085 and U+00A0, and Unicode's White_Space above it). Python's ``str.strip()``
#: also trims U+001C-U+001F, which Go does not: :func:`resource_name` uses this set.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
#: A run of what Go's ``regexp`` calls ``\s`` (RE2's Perl class ``[\t\n\f\r ]``: no ``\v``).
_GO_SPACE_RUN = re.compile(r"[\t\n\f\r ]+")
#: pcidevices' last regexp, ``^a-zA-Z0-9_-.]+``, as Go reads it: ``]`` outside a class is a
#: literal, so this is the text ``a-zA-Z0-9_-``, any character but ``\n``, then ``]`` (one or
#: more).
_HARVESTER_PREFIX = re.compile(r"\Aa-zA-Z0-9_-.\]+")
#: A PCI device id as a VGPUNodeState's ``sriov.vfDevice`` holds it (``26b9``).
_PCI_DEVICE_ID = re.compile(r"[0-9a-fA-F]{4}")
#: Metadata other controllers may put on an object that a PUT without them would drop: every
#: update carries them over as stored.
RETAINED_METADATA = ("finalizers", "ownerReferences")


_EMPTY: Mapping[str, Any] = MappingProxyType({})
_MAPPING_FIELDS = ("labels", "annotations", "spec", "status", "retained")


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of ``m``; a read-only view is kept as it is (who made it gave up the
    mapping behind it: :meth:`KubeObject.from_json`, the renderers), so no mapping of a
    fleet's objects is copied twice."""
    if type(m) is MappingProxyType:
        return m
    return MappingProxyType(dict(m)) if m else _EMPTY


@record(frozen=True, slots=True)
class KubeObject:
    """One of our custom resources as the API server has it (or as the planner renders it)."""

    kind: str  # SRIOVGPUDevice | VGPUDevice
    name: str
    # An empty mapping is the one shared read-only view (nothing can write through it): a fleet
    # renders a quarter of a million objects, none with finalizers or owner references.
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    spec: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    status: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: Empty for a rendered (not yet stored) object.
    resource_version: str = ""
    #: :data:`RETAINED_METADATA` fields as stored (finalizers, ownerReferences).
    retained: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        proxy = MappingProxyType
        if (
            type(self.labels) is proxy
            and type(self.annotations) is proxy
            and type(self.spec) is proxy
            and type(self.status) is proxy
            and type(self.retained) is proxy
        ):
            return  # read-only views are kept as they are (_frozen): a fleet makes 500,000
        for name in _MAPPING_FIELDS:
            value = getattr(self, name)
            if type(value) is not proxy:
                object.__setattr__(self, name, _frozen(value))

    @property
    def managed_by_us(self) -> bool:
        return self.labels.get(MANAGED_BY_LABEL) == MANAGED_BY

    @property
    def plural(self) -> str:
        return PLURALS[self.kind]

    @property
    def api_version(self) -> str:
        group, version = GROUP_VERSIONS.get(self.kind, (GROUP, VERSION))
        return f"{group}/{version}"

    def to_json(self) -> dict[str, Any]:
        """The full API body (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``)."""
        metadata: dict[str, Any] = {"name": self.name, "labels": dict(self.labels)}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if self.resource_version:
            metadata["resourceVersion"] = self.resource_version
        metadata.update(_plain(self.retained))
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": metadata,
            "spec": _plain(self.spec),
            "status": _plain(self.status),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, take: bool = False) -> KubeObject:
        """The object of an API body. Its top-level mappings are copied once (``raw`` stays
        the caller's); values below them are shared with ``raw``. With ``take``, ``raw`` is
        given up (a list item just decoded): its ``dict`` mappings are kept behind read-only
        views instead of copied (read-only views as they are), and the caller must not change
        ``raw`` afterwards."""
        own = _taken if take else _owned
        meta = raw.get("metadata") or {}
        get = meta.get
        retained = _EMPTY  # most objects have none: no mapping made for them
        if get("finalizers") or get("ownerReferences"):  # RETAINED_METADATA
            retained = MappingProxyType({k: meta[k] for k in RETAINED_METADATA if get(k)})
        return cls(  # positional: a fleet reads a quarter of a million objects
            str(raw.get("kind", "")),
            str(get("name", "")),
            own(get("labels")),
            own(get("annotations")),
            own(raw.get("spec")),
            own(raw.get("status")),
            str(get("resourceVersion", "")),
            retained,
        )


def _owned(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy made here, which :func:`_frozen` keeps as it is."""
    return MappingProxyType(dict(m)) if m else _EMPTY


def _taken(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only view of ``m`` when it is a ``dict`` given up by its owner, or ``m`` itself
    when it is a read-only view already (a list reader shares one among objects: the labels of
    a GPU's VGPUDevices, ``observe.cluster``); a copy else."""
    if type(m) is dict:
        return MappingProxyType(m) if m else _EMPTY
    if type(m) is MappingProxyType:
        return m
    return _owned(m)


def harvester_view(obj: KubeObject) -> KubeObject:
    """``obj`` as Harvester's schema lets the API server keep it, read as Harvester's Go types
    read it: every spec field (a missing or null string is empty, a missing bool false), and
    the status fields Harvester declares that are not empty. Other kinds are returned as they
    are. The planner compares what is stored through this view: a field the server would prune
    is never a difference, and neither is an absent field Go reads as its zero value."""
    spec_fields = HARVESTER_SPEC.get(obj.kind)
    if spec_fields is None:
        return obj
    # Most stored objects are in the view already (vgpuctl wrote them so): every spec field
    # there and not null, and no other; only declared status fields, none empty.
    if (
        obj.spec.keys() == _SPEC_KEYS[obj.kind]
        and None not in obj.spec.values()
        and obj.status.keys() <= _STATUS_KEYS[obj.kind]
        and all(obj.status.values())  # truthy: none of _EMPTY_VALUES (else: the long way)
    ):
        return obj
    spec = {name: _zero_if_null(obj.spec.get(name), kind) for name, kind in spec_fields}
    status = {
        name: obj.status[name]
        for name in HARVESTER_STATUS[obj.kind]
        if obj.status.get(name) not in _EMPTY_VALUES
    }
    if spec == obj.spec and status == obj.status:
        return obj
    return KubeObject(
        kind=obj.kind,
        name=obj.name,
        labels=obj.labels,
        annotations=obj.annotations,
        spec=MappingProxyType(spec),
        status=MappingProxyType(status),
        resource_version=obj.resource_version,
        retained=obj.retained,
    )


#: What Harvester's ``omitempty`` leaves out (and a nullable field may hold instead).
_EMPTY_VALUES: tuple[Any, ...] = (None, "", [], {})
_SPEC_KEYS = {kind: frozenset(name for name, _ in spec) for kind, spec in HARVESTER_SPEC.items()}
_STATUS_KEYS = {kind: frozenset(names) for kind, names in HARVESTER_STATUS.items()}


def _zero_if_null(value: Any, kind: type) -> Any:
    if value is None:
        return kind()
    return value


def _plain(value: Any) -> Any:
    """Deep-copy mappings (including read-only proxies) and sequences into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@record(frozen=True, slots=True)
class KubeVirtConfig:
    """The KubeVirt CR's allow-lists (mediated devices, PCI host devices), wherever the CR
    lives."""

    namespace: str
    name: str
    resource_version: str
    #: ``spec.configuration.permittedHostDevices.mediatedDevices`` entries, as stored.
    mediated_devices: tuple[Mapping[str, Any], ...] = ()
    #: mdevNameSelectors vgpuctl added (from :data:`KUBEVIRT_OWNED_ANNOTATION`).
    owned: frozenset[str] = frozenset()
    #: ``spec.configuration.permittedHostDevices.pciHostDevices`` entries, as stored.
    pci_host_devices: tuple[Mapping[str, Any], ...] = ()
    #: resourceNames of the pciHostDevices entries vgpuctl added
    #: (from :data:`KUBEVIRT_OWNED_PCI_ANNOTATION`).
    owned_pci: frozenset[str] = frozenset()
    #: mdevNameSelector → RFC 3339 time it was marked retiring
    #: (``model.retiring.KUBEVIRT_RETIRING_ANNOTATION``; none when it cannot be read: a note
    #: says so, and no entry is then removed before it is marked again).
    retiring: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "retiring", MappingProxyType(dict(self.retiring)))

    @property
    def target(self) -> str:
        """How plans name this CR: ``kubevirt/<namespace>/<name>``."""
        return f"kubevirt/{self.namespace}/{self.name}"

    def lists_external(self, profile: str) -> bool:
        """Whether a ``mediatedDevices`` entry already does what vgpuctl's entry for ``profile``
        would (:func:`lists_external`)."""
        return lists_external(self.mediated_devices, profile)

    def served_by_kubevirt(self, profile: str) -> Mapping[str, Any] | None:
        """The ``mediatedDevices`` entry through which KubeVirt serves ``profile`` itself
        (:func:`served_by_kubevirt`), None when there is none."""
        return served_by_kubevirt(self.mediated_devices, profile)

    def to_json(self) -> dict[str, Any]:
        """The PCI fields only when not empty (a document of an older vgpuctl has none)."""
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "name": self.name,
            "resourceVersion": self.resource_version,
            "mediatedDevices": [_plain(e) for e in self.mediated_devices],
            "owned": sorted(self.owned),
        }
        if self.pci_host_devices:
            out["pciHostDevices"] = [_plain(e) for e in self.pci_host_devices]
        if self.owned_pci:
            out["ownedPci"] = sorted(self.owned_pci)
        if self.retiring:
            out["retiring"] = dict(sorted(self.retiring.items()))
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KubeVirtConfig:
        return cls(
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            resource_version=str(raw.get("resourceVersion", "")),
            mediated_devices=tuple(dict(e) for e in raw.get("mediatedDevices", [])),
            owned=frozenset(str(s) for s in raw.get("owned", [])),
            pci_host_devices=tuple(dict(e) for e in raw.get("pciHostDevices", [])),
            owned_pci=frozenset(str(s) for s in raw.get("ownedPci", [])),
            retiring={str(k): str(v) for k, v in (raw.get("retiring") or {}).items()},
        )


@record(frozen=True, slots=True)
class ConfiguredProfile:
    """A profile configured on a node, and on which kind of GPU: it decides the KubeVirt
    allow-list entry (docs/domain.md §8). On an mdev GPU (or one whose interface is not
    known: a summary of an older vgpuctl) a ``mediatedDevices`` entry by name; on NVIDIA's
    vendor-specific VFIO interface a ``pciHostDevices`` entry selecting the VFs' PCI device id
    ``vf_device`` (``sriov_vf_device``, ``26b9``; "" when not known).

    Any interface but vfio is mdev, with no device id: one profile on mdev GPUs of different
    device ids is one entry.
    """

    name: str
    interface: Interface = Interface.MDEV
    vf_device: str = ""

    def __post_init__(self) -> None:
        if self.interface is not Interface.VFIO:
            object.__setattr__(self, "interface", Interface.MDEV)
            object.__setattr__(self, "vf_device", "")
        else:
            object.__setattr__(self, "vf_device", self.vf_device.strip().lower())

    @property
    def vfio(self) -> bool:
        return self.interface is Interface.VFIO

    @property
    def resource_name(self) -> str:
        return resource_name(self.name)

    @property
    def pci_vendor_selector(self) -> str:
        """``10DE:26B9`` (upper case, as KubeVirt's docs write it; KubeVirt compares without
        case); "" when the device id is not known or not a vfio profile."""
        if not self.vfio or not self.vf_device:
            return ""
        return f"{NVIDIA_PCI_VENDOR}:{self.vf_device.upper()}"

    def sort_key(self) -> tuple[str, str, str]:
        return (self.name, self.interface.value, self.vf_device)

    def to_json(self) -> str | dict[str, str]:
        """An mdev profile is its name (as documents of older vgpuctl versions have it); a
        vfio one ``{name, interface: vfio, vfDevice}``."""
        if not self.vfio:
            return self.name
        return {"name": self.name, "interface": self.interface.value, "vfDevice": self.vf_device}

    @classmethod
    def from_json(cls, raw: object) -> ConfiguredProfile:
        if isinstance(raw, Mapping):
            interface = Interface.VFIO if raw.get("interface") == "vfio" else Interface.MDEV
            return cls(str(raw["name"]), interface, str(raw.get("vfDevice") or ""))
        return cls(str(raw))


@record(frozen=True, slots=True)
class DeviceUse:
    """A vGPU (by device ID = mdev UUID) handed to a pod by the kubelet, and who has it."""

    device_id: str
    resource_name: str  # nvidia.com/NVIDIA_A2-4Q
    holder: str  # "VM default/win11 (pod <uid>)" or "pod <uid>"

    def to_json(self) -> dict[str, str]:
        return {
            "deviceId": self.device_id,
            "resourceName": self.resource_name,
            "holder": self.holder,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeviceUse:
        return cls(
            device_id=str(raw["deviceId"]),
            resource_name=str(raw.get("resourceName", "")),
            holder=str(raw.get("holder", "")),
        )


@record(frozen=True, slots=True)
class ClusterState:
    """Everything the cluster says about one node's vGPUs, plus the cluster-wide facts the
    KubeVirt allow-list depends on."""

    node: str
    #: Our CRs for this node (label ``nodename``), by object name.
    sriov_gpu_devices: Mapping[str, KubeObject] = field(
        default_factory=lambda: MappingProxyType({})
    )
    vgpu_devices: Mapping[str, KubeObject] = field(default_factory=lambda: MappingProxyType({}))
    #: This node's VGPUNodeState, None when there is none yet.
    node_state: KubeObject | None = None
    #: Profiles the OTHER nodes' VGPUNodeStates show configured (wanted or existing vGPUs), and
    #: on which kind of GPU: an allow-list entry stays while any node still has its profile on
    #: that kind. (A bare name given here is an mdev profile, as older documents have it.)
    profiles_elsewhere: frozenset[ConfiguredProfile] = frozenset()
    kubevirt: KubeVirtConfig | None = None
    #: Allocated vGPUs (kubelet checkpoint, joined with running VMIs), by device ID.
    device_uses: Mapping[str, DeviceUse] = field(default_factory=lambda: MappingProxyType({}))
    #: Resources a running VMI on this node requests whose device IDs are unknown (no
    #: checkpoint entry): every vGPU of such a profile counts as possibly in use.
    vmi_resources: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Why parts could not be read (e.g. "KubeVirt CR not found"): shown in the plan's notes.
    notes: tuple[str, ...] = ()
    #: When the other nodes' VGPUNodeStates were read (RFC 3339; "" when not known: no
    #: retiring mark is then old enough): taken after the KubeVirt CR was read and before the
    #: summaries were, so no later than they were; the time retiring marks are judged against
    #: (``model.retiring``), so the planner never reads a clock.
    observed_at: str = ""

    def __post_init__(self) -> None:
        for name in ("sriov_gpu_devices", "vgpu_devices", "device_uses", "vmi_resources"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        elsewhere: Any = self.profiles_elsewhere
        if not all(type(p) is ConfiguredProfile for p in elsewhere):
            object.__setattr__(
                self,
                "profiles_elsewhere",
                frozenset(
                    p if isinstance(p, ConfiguredProfile) else ConfiguredProfile.from_json(p)
                    for p in elsewhere
                ),
            )

    def to_json(self) -> dict[str, Any]:
        """A JSON document of everything above (golden test cases keep it as ``cluster.json``).

        Objects are full API bodies, sorted by name; ``vmiResources`` maps a VMI
        (``namespace/name``) to the resource names it requests; ``profilesElsewhere`` holds
        each profile as :meth:`ConfiguredProfile.to_json` writes it (an mdev one: its name).
        """
        return {
            "node": self.node,
            "sriovGPUDevices": [
                self.sriov_gpu_devices[n].to_json() for n in sorted(self.sriov_gpu_devices)
            ],
            "vgpuDevices": [self.vgpu_devices[n].to_json() for n in sorted(self.vgpu_devices)],
            "nodeState": None if self.node_state is None else self.node_state.to_json(),
            "profilesElsewhere": [
                p.to_json() for p in sorted(self.profiles_elsewhere, key=ConfiguredProfile.sort_key)
            ],
            "kubevirt": None if self.kubevirt is None else self.kubevirt.to_json(),
            "deviceUses": [self.device_uses[d].to_json() for d in sorted(self.device_uses)],
            "vmiResources": {k: list(self.vmi_resources[k]) for k in sorted(self.vmi_resources)},
            "notes": list(self.notes),
            **({"observedAt": self.observed_at} if self.observed_at else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ClusterState:
        sriov = (KubeObject.from_json(o) for o in raw.get("sriovGPUDevices", []))
        vgpus = (KubeObject.from_json(o) for o in raw.get("vgpuDevices", []))
        uses = (DeviceUse.from_json(u) for u in raw.get("deviceUses", []))
        kubevirt = raw.get("kubevirt")
        node_state = raw.get("nodeState")
        return cls(
            node=str(raw["node"]),
            sriov_gpu_devices={o.name: o for o in sriov},
            vgpu_devices={o.name: o for o in vgpus},
            node_state=None if node_state is None else KubeObject.from_json(node_state),
            profiles_elsewhere=frozenset(
                ConfiguredProfile.from_json(p) for p in raw.get("profilesElsewhere", [])
            ),
            kubevirt=None if kubevirt is None else KubeVirtConfig.from_json(kubevirt),
            device_uses={u.device_id: u for u in uses},
            vmi_resources={
                str(k): tuple(str(r) for r in v) for k, v in (raw.get("vmiResources") or {}).items()
            },
            notes=tuple(str(n) for n in raw.get("notes", [])),
            observed_at=str(raw.get("observedAt") or ""),
        )


def object_name(node: str, address: str) -> str:
    """Harvester's object name: ``<node>-<PCI address without ':' and '.'>``."""
    return f"{node}-{address.replace(':', '').replace('.', '')}"


def is_type_name(name: str) -> bool:
    """Whether ``name`` may be a vGPU type's name (vgpuctl's name check, :data:`_TYPE_NAME`):
    ``NVIDIA A2-4Q`` is, ``NVIDIA A2-4Q\\n``, ``-x`` or 64 characters are not."""
    return _TYPE_NAME.fullmatch(name) is not None


def is_resource_name(name: str) -> bool:
    """Whether ``name`` is the resource name of a vGPU type name that passes vgpuctl's name
    check: ``nvidia.com/`` and a type name :func:`resource_name` leaves as it is (no space,
    ``/`` or ``.``), so ``nvidia.com/NVIDIA_A2-4Q`` is, ``nvidia.com/x:y`` is not."""
    if not name.startswith(RESOURCE_PREFIX):
        return False
    rest = name[len(RESOURCE_PREFIX) :]
    return is_type_name(rest) and resource_name(rest) == name


def is_pci_device_id(text: str) -> bool:
    """Whether ``text`` is a PCI device id of four hex digits (``26b9``), nothing around it."""
    return _PCI_DEVICE_ID.fullmatch(text) is not None


def kubevirt_selector(type_name: str) -> str:
    """A vGPU type's name as KubeVirt's virt-handler compares it with an ``mdevNameSelector``
    (both sides alike): every space turned into ``_``, then surrounding whitespace trimmed
    (kubevirt pkg/virt-handler/device-manager/device_controller.go ``removeSelectorSpaces``,
    mediated_devices_types.go ``shouldRemoveMDEV``). ``NVIDIA A2-4Q`` and ``NVIDIA_A2-4Q``
    select the same mdevs."""
    return type_name.replace(" ", "_").strip()


def lists_external(entries: Sequence[Mapping[str, Any]], profile: str) -> bool:
    """Whether ``entries`` (a KubeVirt CR's ``mediatedDevices``) hold an entry that does what
    vgpuctl's entry for ``profile`` does: ``externalResourceProvider: true`` (virt-handler
    spares the type's mdevs and runs no device plugin of its own for them), a selector that
    selects ``profile`` as KubeVirt compares them, and vgpuctl's resourceName (the one its
    device plugin advertises, which KubeVirt must permit a VM to ask for). Whoever wrote it."""
    wanted = kubevirt_selector(profile)
    resource = resource_name(profile)
    return any(
        e.get("externalResourceProvider") is True
        and isinstance(e.get("mdevNameSelector"), str)
        and kubevirt_selector(e["mdevNameSelector"]) == wanted
        and e.get("resourceName") == resource
        for e in entries
    )


def served_by_kubevirt(
    entries: Sequence[Mapping[str, Any]], profile: str
) -> Mapping[str, Any] | None:
    """The first of ``entries`` (a KubeVirt CR's ``mediatedDevices``) that selects ``profile``
    without ``externalResourceProvider: true``, None when there is none.

    Such an entry hands the type to KubeVirt: virt-handler runs its own device plugin for
    those mdevs (device_controller.go ``updatePermittedHostDevicePlugins``: a plugin for every
    entry that is not external) and its sweep spares them only when
    ``mediatedDevicesConfiguration`` asks for the type. Another vgpuctl entry beside it would
    have two device plugins hand out the same vGPUs: vgpuctl does not manage such a type."""
    wanted = kubevirt_selector(profile)
    for e in entries:
        selector = e.get("mdevNameSelector")
        if (
            isinstance(selector, str)
            and kubevirt_selector(selector) == wanted
            and e.get("externalResourceProvider") is not True
        ):
            return e
    return None


def resource_name(type_name: str) -> str:
    r"""``NVIDIA A2-4Q`` → ``nvidia.com/NVIDIA_A2-4Q`` (docs/domain.md §7): the resource name
    Harvester gives a vGPU type, which VMs on Harvester ask for, by its rule as its code has it
    (harvester/pcidevices ``pkg/util/common/common.go`` ``GeneratevGPUDeviceName``, bdd8025):

    1. surrounding whitespace trimmed (``strings.TrimSpace``: Go's ``unicode.IsSpace``);
    2. each ``/`` made ``_``, then each ``.``;
    3. each *run* of whitespace made one ``_`` (``regexp`` ``\s+``: Go's ``\s`` is the ASCII
       ``[\t\n\f\r ]``), so ``NVIDIA  A2-4Q`` (two spaces) is ``nvidia.com/NVIDIA_A2-4Q``
       too, and ``a / b`` is ``a___b`` (the ``/`` was made ``_`` first);
    4. a leading ``a-zA-Z0-9_-``, any one character and one or more ``]`` removed: written
       ``^a-zA-Z0-9_-.]+``, the regexp is a character class missing its ``[``, so it matches
       only that literal text, never in a name vgpuctl's name check passes;

    no upper-casing. For every name that passes vgpuctl's name check (:func:`is_type_name`,
    the only names vgpuctl publishes to the kubelet or KubeVirt) the result is Harvester's
    exactly, and a valid resource name. Harvester's rule alone is not always one: a ``\v``, a
    no-break space or another non-ASCII space inside a name is no ``\s`` to Go and stays in
    its result (as does any other character). vgpuctl keeps its own safety there, as before:
    any whitespace left after the four steps is made ``_``, one per character, so no resource
    name it computes holds whitespace (such a name fails the name check anyway)."""
    name = type_name.strip(_GO_SPACE)
    name = name.replace("/", "_").replace(".", "_")
    name = _GO_SPACE_RUN.sub("_", name)
    name = _HARVESTER_PREFIX.sub("", name, count=1)
    return RESOURCE_PREFIX + "".join("_" if ch.isspace() else ch for ch in name)
