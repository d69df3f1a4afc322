"""What a host is observed to have: GPUs, their VFs, vGPU types and existing vGPUs.

An :class:`Inventory` is built by ``observe`` (from sysfs) or loaded from inventory JSON
(``schemas/inventory.schema.json``). It is immutable; its :meth:`Inventory.fingerprint` lets a
saved plan detect that the host changed since it was made.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii as _encode
from operator import attrgetter
from typing import Any

from reconciler.model.address import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.model.placement import PlacementFacts
from reconciler.model.record import field, record


class Interface(enum.StrEnum):
    """How vGPUs are made on a GPU (docs/domain.md §3)."""

    MDEV = "mdev"
    VFIO = "vfio"  # NVIDIA vendor-specific VFIO (vGPU 17+, kernel 6.8+)
    NONE = "none"  # SR-IOV is off: no VF exposes an interface yet


@record(frozen=True, slots=True)
class VGPUType:
    """A vGPU type as the driver offers it on a GPU (same on every VF of that GPU)."""

    name: str  # "NVIDIA A2-4Q": the stable key; type ids vary by driver branch
    type_id: str  # "nvidia-745" (mdev) or "745" (vfio)
    framebuffer_mib: int
    max_instance: int  # per physical GPU
    num_heads: int = 0
    max_resolution: str = ""
    frl_config: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.type_id,
            "framebufferMiB": self.framebuffer_mib,
            "maxInstances": self.max_instance,
            "numHeads": self.num_heads,
            "maxResolution": self.max_resolution,
            "frlConfig": self.frl_config,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> VGPUType:
        return cls(
            name=str(raw["name"]),
            type_id=str(raw.get("id", "")),
            framebuffer_mib=int(raw["framebufferMiB"]),
            max_instance=int(raw["maxInstances"]),
            num_heads=int(raw.get("numHeads", 0)),
            max_resolution=str(raw.get("maxResolution", "")),
            frl_config=int(raw.get("frlConfig", 0)),
        )


#: How a holder starts when vgpuctl could not see who holds the vGPU, only that something may
#: (``unknown: cannot see the host's processes (…why…)``): it counts as in use all the same.
UNKNOWN_HOLDER = "unknown"
#: The type of a vGPU whose type cannot be read (its type link is gone: a removal under way).
UNKNOWN_TYPE = "unknown"
_BY_ID = re.compile(r"type ([0-9]{1,9})")


#: Names of vGPU type ids on NVIDIA's vendor-specific VFIO interface, per GPU: (GPU, type id)
#: → type name. Ids are a driver branch's, so such a mapping holds for the running driver only.
TypeNames = Mapping[tuple[PciAddress, str], str]


def type_shown_by_id(type_id: str) -> str:
    """How a vGPU is named whose type id (vfio's ``current_vgpu_type``) no list and no record
    names: ``type 1147``. Such a vGPU is shown, never planned as absent or changed blindly."""
    return f"type {type_id}"


def unresolved_type_id(type_name: str) -> str | None:
    """The type id of a name made by :func:`type_shown_by_id`, else None (a driver's type
    names start with the vendor: ``NVIDIA …``, ``GRID …``)."""
    m = _BY_ID.fullmatch(type_name)
    return m[1] if m else None


@record(frozen=True, slots=True)
class VGPU:
    """A vGPU that exists on a VF (an mdev, or a configured VF on the vfio interface)."""

    uuid: str  # mdev UUID; on vfio the VF address stands in
    type_name: str
    in_use: bool = False  # held by a VM: never removed
    #: Who holds it: a VM name, a process, or ``unknown: …why…`` (counted as in use anyway).
    holder: str = ""
    #: The vGPU's IOMMU group: a VM opens ``/dev/vfio/<group>`` (the device plugin hands it
    #: out). Empty when not known (e.g. an inventory rebuilt from the cluster).
    iommu_group: str = ""
    #: A removal is under way: the kernel waits for whatever holds it to let go. Nothing can be
    #: done on its VF until that happens; it is ``in_use`` all along.
    removing: bool = False


@record(frozen=True, slots=True)
class Vf:
    """A virtual function of a GPU, in numeric ``virtfn`` order."""

    address: PciAddress
    index: int
    vgpu: VGPU | None = None
    #: Names of the types that can be created on this VF now (``available_instances`` > 0).
    creatable: frozenset[str] = frozenset()


@record(frozen=True, slots=True)
class Gpu:
    """An NVIDIA physical function that supports SR-IOV vGPU."""

    address: PciAddress
    vendor_id: str  # "10de"
    device_id: str  # "25b6"
    subsystem_vendor_id: str = ""
    subsystem_device_id: str = ""
    model: str | None = None  # "NVIDIA A2" when the catalogue knows the ids
    interface: Interface = Interface.NONE
    total_vfs: int = 0
    num_vfs: int = 0
    vf_offset: int = 0
    vf_stride: int = 1
    vfs: tuple[Vf, ...] = ()
    #: The types the driver offers on this GPU's VFs (empty while SR-IOV is off).
    types: tuple[VGPUType, ...] = ()
    #: The kernel driver bound to the PF: ``nvidia``, or another one (``vfio-pci``: the GPU is
    #: passed through whole), or "" (none).
    driver: str = ""
    #: ``sriov_vf_device``: the device id its VFs will have; ``0000`` when the GPU makes no vGPU
    #: VFs (SR-IOV present but not for vGPU, a T4 say); "" when the file is absent.
    vf_device: str = ""
    #: The vGPU framebuffer mode (``nvidia-smi vgpu -shm``), as observed: sysfs does not show
    #: it, so the default unless a query said otherwise (``UNKNOWN``: it could not be read on a
    #: GPU that hosts vGPUs). Written to JSON only when not equal-size.
    vgpu_mode: VgpuMode = VgpuMode.EQUAL_SIZE
    #: Mixed-size placement facts the host shows (vendor-specific VFIO: ``nvidia/placement_id``
    #: and ``nvidia/creatable_placements``, observe/vfio.py); None: it shows none. Not in JSON.
    placements: PlacementFacts | None = None

    @property
    def sriov_enabled(self) -> bool:
        return self.num_vfs > 0

    @property
    def vgpu_vfs(self) -> bool:
        """Whether this GPU's VFs can host vGPUs (``sriov_vf_device`` is not 0)."""
        return self.vf_device != "0000"

    def type_named(self, name: str) -> VGPUType | None:
        for t in self.types:
            if t.name == name:
                return t
        return None

    def vf(self, key: PciAddress | int) -> Vf | None:
        if isinstance(key, int):
            for v in self.vfs:
                if v.index == key:
                    return v
            return None
        for v in self.vfs:
            if v.address == key:
                return v
        return None

    def predicted_vf_address(self, index: int) -> PciAddress:
        """Where VF ``index`` will appear, from the PF's ``sriov_offset``/``sriov_stride``.

        This is the kernel's own computation; the executor still re-reads the ``virtfn`` link
        after enabling and refuses to act if the two disagree.
        """
        return PciAddress.from_routing_id(
            self.address.domain, self.address.routing_id + self.vf_offset + index * self.vf_stride
        )


@record(frozen=True, slots=True)
class Inventory:
    """Everything observed on one node's host."""

    node: str
    gpus: tuple[Gpu, ...] = ()
    sysfs_root: str = "/sys"
    #: Extra facts that do not affect planning (driver version, notes); not fingerprinted.
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: Whether the host has the mdev bus (``bus/mdev``: the kernel's mdev core is loaded).
    #: Without it no GPU can make mdevs, so a GPU whose VFs are not up yet will show NVIDIA's
    #: vendor-specific VFIO interface (docs/domain.md §3b). In the JSON only when false.
    mdev_bus: bool = True
    #: Whether each mdev VF's ``creatable`` was read (``available_instances`` of every type on
    #: every free VF: most of a scan). False for a scan made for a plan with no cluster, which
    #: consults none of it (only the cluster's objects and the node summary show it); the mdev
    #: VFs' ``creatable`` sets are then empty. In the JSON only when false.
    vf_availability: bool = True

    def gpu(self, address: PciAddress) -> Gpu | None:
        for g in self.gpus:
            if g.address == address:
                return g
        return None

    def to_json(self) -> dict[str, Any]:
        """The inventory contract (``schemas/inventory.schema.json``)."""
        doc: dict[str, Any] = {
            "node": self.node,
            "sysfsRoot": self.sysfs_root,
            "gpus": [_gpu_json(g) for g in self.gpus],
        }
        if not self.mdev_bus:
            doc["mdevBus"] = False
        if not self.vf_availability:
            doc["vfAvailability"] = False
        return doc

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Inventory:
        return cls(
            node=str(raw["node"]),
            sysfs_root=str(raw.get("sysfsRoot", "/sys")),
            gpus=tuple(_gpu_from_json(g) for g in raw.get("gpus", [])),
            mdev_bus=raw.get("mdevBus", True) is not False,
            vf_availability=raw.get("vfAvailability", True) is not False,
        )

    def fingerprint(self) -> str:
        """A digest of everything planning depends on (not the sysfs root's path).

        The SHA-256 of the inventory JSON without ``sysfsRoot``, keys sorted, no spaces
        (``json.dumps(doc, sort_keys=True, separators=(",", ":"))``), written here piece by
        piece: a fleet's planning fingerprints every node, and the general encoder spent more
        time on it than the planning itself. A test holds the two encodings equal.
        """
        digest = hashlib.sha256(b'{"gpus":[')
        for i, g in enumerate(self.gpus):
            if i:
                digest.update(b",")
            digest.update(_gpu_canonical(g).encode())
        bus = "" if self.mdev_bus else '"mdevBus":false,'
        availability = "" if self.vf_availability else ',"vfAvailability":false'
        digest.update(f'],{bus}"node":{json.dumps(self.node)}{availability}}}'.encode())
        return "sha256:" + digest.hexdigest()


def gpu_facts_json(g: Gpu) -> dict[str, Any]:
    """``g``'s inventory JSON without its VFs: what it is, its SR-IOV state, its vGPU types."""
    return {**_gpu_json_scalars(g), "vgpuTypes": [t.to_json() for t in g.types]}


def _mode_json(g: Gpu) -> dict[str, Any]:
    return {} if g.vgpu_mode is VgpuMode.EQUAL_SIZE else {"vgpuMode": g.vgpu_mode.value}


def _gpu_json(g: Gpu) -> dict[str, Any]:
    return {
        **_gpu_json_scalars(g),
        **_mode_json(g),
        "vgpuTypes": [t.to_json() for t in g.types],
        "vfs": [
            {
                "address": str(v.address),
                "index": v.index,
                "vgpu": None if v.vgpu is None else _vgpu_json(v.vgpu),
                "creatableTypes": sorted(v.creatable),
                "inUse": bool(v.vgpu and v.vgpu.in_use),
            }
            for v in g.vfs
        ],
    }


def _gpu_canonical(g: Gpu) -> str:
    """``g``'s inventory JSON in the fingerprint's canonical form (sorted keys, no spaces)."""
    head = _gpu_head_canonical(g)
    known = _canonical_vfs  # a free VF's text, by the VF (looked up here: most VFs are free)
    vfs = ",".join(
        [
            (
                entry[1]
                if (entry := known.get(id(v))) is not None and entry[0] is v
                else _free_vf_canonical(v)
            )
            if v.vgpu is None
            else _vf_canonical(v, v.vgpu)
            for v in g.vfs
        ]
    )
    # "vfs", "vgpuMode" (written only when not the default) and "vgpuTypes" sort after every
    # other key of a GPU.
    mode = "" if g.vgpu_mode is VgpuMode.EQUAL_SIZE else f'"vgpuMode":"{g.vgpu_mode.value}",'
    return f'{head[:-1]},"vfs":[{vfs}],{mode}"vgpuTypes":{_types_canonical(g.types)}}}'


def _gpu_json_scalars(g: Gpu) -> dict[str, Any]:
    return {
        "address": str(g.address),
        "vendorId": g.vendor_id,
        "deviceId": g.device_id,
        "subsystemVendorId": g.subsystem_vendor_id,
        "subsystemDeviceId": g.subsystem_device_id,
        "model": g.model,
        "interface": g.interface.value,
        "driver": g.driver,
        "sriov": _sriov_json(g),
    }


def _gpu_head_canonical(g: Gpu) -> str:
    """``g``'s scalars, canonical: remembered by their values when each is a plain ``str`` or
    ``int`` as its field (then what equals them encodes the same)."""
    key = (
        g.address, g.vendor_id, g.device_id, g.subsystem_vendor_id, g.subsystem_device_id,
        g.model, g.interface, g.driver, g.vf_device,
        g.total_vfs, g.num_vfs, g.vf_offset, g.vf_stride,
    )  # fmt: skip
    text = _canonical_heads.get(key)
    if text is None:
        text = json.dumps(_gpu_json_scalars(g), sort_keys=True, separators=(",", ":"))
        plain = (
            type(g.address) is PciAddress
            and all(type(x) is str for x in key[1:5])
            and (g.model is None or type(g.model) is str)
            and type(g.interface) is Interface
            and type(g.driver) is str
            and type(g.vf_device) is str
            and all(type(x) is int for x in key[9:])
        )
        if plain:
            if len(_canonical_heads) >= _SHARED_LIMIT:
                _canonical_heads.clear()
            _canonical_heads[key] = text
    return text


def _free_vf_canonical(v: Vf) -> str:
    """A VF with no vGPU, canonical; remembered by identity, like type lists (parsing shares
    such VFs)."""
    # A VF's keys in sorted order: address, creatableTypes, inUse, index, vgpu. A PCI address's
    # text needs no escaping (hex digits, ':' and '.').
    text = (
        f'{{"address":"{v.address}","creatableTypes":{_creatable_canonical(v.creatable)},'
        f'"inUse":false,"index":{v.index:d},"vgpu":null}}'
    )
    if len(_canonical_vfs) >= _SHARED_VFS_LIMIT:
        _canonical_vfs.clear()
    _canonical_vfs[id(v)] = (v, text)
    return text


def _vf_canonical(v: Vf, vgpu: VGPU) -> str:
    in_use = "true" if vgpu.in_use else "false"
    holder, group, name, uuid = vgpu.holder, vgpu.iommu_group, vgpu.type_name, vgpu.uuid
    if type(holder) is str and type(group) is str and type(name) is str and type(uuid) is str:
        # Sorted keys: holder, iommuGroup, removing, type, uuid; strings as json.dumps writes
        # them (ASCII, escaped).
        body = "".join(
            [
                '{"holder":',
                _encode(holder),
                f',"iommuGroup":{_encode(group)}' if group else "",
                ',"removing":true' if vgpu.removing else "",
                ',"type":',
                _encode(name),
                ',"uuid":',
                _encode(uuid),
                "}",
            ]
        )
    else:
        body = json.dumps(_vgpu_json(vgpu), sort_keys=True, separators=(",", ":"))
    return (
        f'{{"address":"{v.address}","creatableTypes":{_creatable_canonical(v.creatable)},'
        f'"inUse":{in_use},"index":{v.index:d},"vgpu":{body}}}'
    )


def _creatable_canonical(names: frozenset[str]) -> str:
    text = _canonical_creatable.get(names)
    if text is None:
        text = json.dumps(sorted(names), separators=(",", ":"))
        if all(type(name) is str for name in names):  # what equals it encodes the same
            if len(_canonical_creatable) >= _SHARED_LIMIT:
                _canonical_creatable.clear()
            _canonical_creatable[names] = text
    return text


def _types_canonical(types: tuple[VGPUType, ...]) -> str:
    # By identity: parsing shares one tuple among equal type lists, so a fleet encodes each
    # list once. The entry holds the tuple, so its id cannot be reused while it is there.
    entry = _canonical_types.get(id(types))
    if entry is not None and entry[0] is types:
        return entry[1]
    text = json.dumps([t.to_json() for t in types], sort_keys=True, separators=(",", ":"))
    if len(_canonical_types) >= _SHARED_LISTS_LIMIT:
        _canonical_types.clear()
    _canonical_types[id(types)] = (types, text)
    return text


def _sriov_json(g: Gpu) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "totalVFs": g.total_vfs,
        "numVFs": g.num_vfs,
        "vfOffset": g.vf_offset,
        "vfStride": g.vf_stride,
    }
    if g.vf_device:
        doc["vfDevice"] = g.vf_device
    return doc


def _vgpu_json(vgpu: VGPU) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": vgpu.type_name, "uuid": vgpu.uuid, "holder": vgpu.holder}
    if vgpu.iommu_group:
        doc["iommuGroup"] = vgpu.iommu_group
    if vgpu.removing:
        doc["removing"] = True
    return doc


def _gpu_from_json(raw: Mapping[str, Any]) -> Gpu:
    sriov = raw.get("sriov", {})
    vfs = []
    parse = PciAddress.parse
    shared_vfs = _shared_vfs
    for v in raw.get("vfs", []):
        vg = v.get("vgpu")
        if vg is None:
            # A VF with no vGPU is its address, index and creatable set: a fleet's nodes repeat
            # them, so one made from the same plain values (a str, an int, strs) is shared.
            try:
                key = (v["address"], v["index"], *v.get("creatableTypes", ()))
                vf = shared_vfs.get(key)
            except (KeyError, TypeError):
                key, vf = None, None
            if vf is not None:
                vfs.append(vf)
                continue
            vf = Vf(
                parse(v["address"]),
                int(v["index"]),
                None,
                _creatable_from_json(v.get("creatableTypes", [])),
            )
            if (
                key is not None
                and all(type(k) is str for k in key[2:])
                and (type(key[0]) is str and type(key[1]) is int)
            ):
                if len(shared_vfs) >= _SHARED_VFS_LIMIT:
                    shared_vfs.clear()
                shared_vfs[key] = vf
            vfs.append(vf)
            continue
        vfs.append(
            Vf(
                parse(v["address"]),
                int(v["index"]),
                None
                if vg is None
                else VGPU(
                    uuid=str(vg["uuid"]),
                    type_name=str(vg["type"]),
                    in_use=bool(v.get("inUse", False)),
                    holder=str(vg.get("holder", "")),
                    iommu_group=str(vg.get("iommuGroup", "")),
                    removing=bool(vg.get("removing", False)),
                ),
                _creatable_from_json(v.get("creatableTypes", [])),
            )
        )
    vfs.sort(key=_by_index)
    return Gpu(
        address=PciAddress.parse(raw["address"]),
        vendor_id=str(raw.get("vendorId", "10de")),
        device_id=str(raw.get("deviceId", "")),
        subsystem_vendor_id=str(raw.get("subsystemVendorId", "")),
        subsystem_device_id=str(raw.get("subsystemDeviceId", "")),
        model=raw.get("model"),
        interface=Interface(raw.get("interface", "none")),
        driver=str(raw.get("driver", "")),
        vf_device=str(sriov.get("vfDevice", "")),
        total_vfs=int(sriov.get("totalVFs", 0)),
        num_vfs=int(sriov.get("numVFs", 0)),
        vf_offset=int(sriov.get("vfOffset", 0)),
        vf_stride=int(sriov.get("vfStride", 1)),
        vfs=tuple(vfs),
        types=_types_from_json(raw.get("vgpuTypes", [])),
        vgpu_mode=VgpuMode(raw.get("vgpuMode", VgpuMode.EQUAL_SIZE.value)),
    )


_by_index = attrgetter("index")

# Parsing shares equal immutable values instead of making each anew: a node's GPUs of one model
# list the same types, its VFs hold a few distinct creatable sets, and a fleet's inventories
# repeat both node after node (a 1,000-node fleet: 8,000 type lists, all equal). Only values
# read as they are (strings and integers, no conversion) are shared, so a shared value is
# exactly the one the input would have made. Bounded: each table is emptied when full.
_SHARED_LIMIT = 1024
_SHARED_LISTS_LIMIT = 64  # type lists: a few per driver branch and GPU model
#: Type lists as read (copies: the caller's may change), with the types made of them.
_shared_types: list[tuple[list[dict[str, Any]], tuple[VGPUType, ...]]] = []
_shared_creatable: dict[tuple[str, ...], frozenset[str]] = {}
#: VFs with no vGPU, by (address, index, *creatable names) as read.
_SHARED_VFS_LIMIT = 1 << 14  # a node has up to a few thousand VFs
_shared_vfs: dict[tuple[Any, ...], Vf] = {}
#: The fingerprint's encodings of shared values (see :meth:`Inventory.fingerprint`).
_canonical_creatable: dict[frozenset[str], str] = {}
_canonical_types: dict[int, tuple[tuple[VGPUType, ...], str]] = {}
_canonical_vfs: dict[int, tuple[Vf, str]] = {}
_canonical_heads: dict[tuple[Any, ...], str] = {}


def _types_from_json(raw: Any) -> tuple[VGPUType, ...]:
    # Compared with the lists read before, as they were read (a plain list of objects of plain
    # values compares in C; making a hashable key of every type cost more than the rest).
    if type(raw) is list:
        for seen, shared in _shared_types:
            if raw == seen:
                return shared
    types = tuple(VGPUType.from_json(t) for t in raw)
    if (
        type(raw) is list
        and all(type(t) is dict for t in raw)
        and all(_as_read(t, made) for t, made in zip(raw, types, strict=True))
    ):
        if len(_shared_types) >= _SHARED_LISTS_LIMIT:
            _shared_types.clear()
        _shared_types.append(([dict(t) for t in raw], types))
    return types


def _as_read(raw: Mapping[str, Any], made: VGPUType) -> bool:
    """Whether ``made`` holds ``raw``'s values unconverted (each a ``str`` or an ``int`` as its
    field): then any input equal to ``raw`` makes an equal type, and may share ``made``."""
    doc = made.to_json()
    return all(k not in doc or (type(v) is type(doc[k]) and v == doc[k]) for k, v in raw.items())


def _creatable_from_json(raw: Any) -> frozenset[str]:
    try:
        key = tuple(raw)
        shared = _shared_creatable.get(key)
    except TypeError:
        key, shared = None, None
    if shared is not None:
        return shared
    creatable = frozenset(raw if key is None else key)
    if key is not None and all(type(name) is str for name in key):
        if len(_shared_creatable) >= _SHARED_LIMIT:
            _shared_creatable.clear()
        _shared_creatable[key] = creatable
    return creatable
