"""The simulated NVIDIA driver's rules, as pure functions: no files, no state.

Which vGPU types a GPU offers and under which ids, where its VFs appear (the kernel's routing-id
arithmetic), which types a VF can create now (equal-size mode: one framebuffer size and the
per-size maximum; mixed-size mode: the GPU's total framebuffer, the mixed-size maxima and the
placement slots below), and where simulated GPUs sit on the PCI buses.

Mixed-size placements are a **model**. What is confirmed (docs/domain.md §4): in that mode each
type has a placement size and each vGPU a placement ID; NVML's
``nvmlDeviceGetVgpuTypeCreatablePlacements`` returns, per type, ``placementSize`` ("the number of
slots occupied by the vGPU type") and the creatable ``placementIds``
(docs.nvidia.com/deploy/nvml-api, ``nvmlVgpuPlacementList_v2_t``,
``nvmlVgpuCreatablePlacementInfo_v1_t``); ``nvmlVgpuInstanceGetPlacementId`` gives a vGPU's;
an mdev's ``nvidia/placement_id`` reads an integer, or ``Not Applicable`` while the vGPU is not
in use, and takes a write (gentlemanautomaton/machina, ``filesystem/mdevfs/mediateddevice.go``);
placement IDs are fixed spots where a profile may begin, so free memory that is not aligned to
one cannot be used (F. Denneman, "Mixed Size vGPU Mode in Practice", frankdenneman.nl, 2026).
What is not confirmed, and is this simulator's choice: one slot per GiB of the GPU's
framebuffer; a type's placement size is its framebuffer in GiB (a published mixed-size
maximum, L40S-4C: 8, stays a separate count); its placement IDs are the multiples of that size;
a vGPU occupies the slots [ID, ID + size); the driver gives a new vGPU the lowest creatable ID,
at create time. Real placement sizes are read from the
host, never taken from here. The writer, ``sriov-manage`` and ``build_host`` all ask
these same functions, so a spec that ``build_host`` accepts is one the writer would also accept.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from reconciler.catalog import GpuModel
from reconciler.model import PciAddress
from reconciler.model.mode import VgpuMode
from reconciler.model.record import record

#: Where the simulator starts numbering a model's vGPU types. Type ids belong to a driver branch,
#: not to a GPU model (docs/domain.md §4), so the catalogue has none and the simulator invents them;
#: where a public capture shows one branch's ids, it starts where that branch does.
TYPE_ID_BASES = {
    "NVIDIA A2": 742,  # harvester/pcidevices' A2 capture: nvidia-742 (A2-1B) … 756
    "NVIDIA A16": 709,
    "NVIDIA A10": 588,
    "NVIDIA L40S": 1145,  # harvester/pcidevices' L40S capture: 1145 (L40S-1B) …
    "NVIDIA A100 40GB": 468,  # Open-ForBC's A100 capture: 468 (GRID A100-4C) …
    "NVIDIA A100X": 457,
    "NVIDIA A100 80GB": 692,
    "NVIDIA A100DX": 615,
}
DEFAULT_TYPE_ID_BASE = 1000
#: Where VF 0 sits for a model whose offset no real host has shown yet: function 4, as on every
#: A-series and L40S host captured (docs/domain.md §1).
DEFAULT_VF_OFFSET = 4


@record(frozen=True, slots=True)
class SimType:
    """A vGPU type as the simulated driver offers it on every VF of a GPU."""

    type_id: int  # 745: the mdev type dir is ``nvidia-745``, the vfio id is ``745``
    name: str  # "NVIDIA A2-4Q"
    framebuffer_mib: int
    max_instance: int  # per physical GPU
    num_heads: int
    frl_config: int
    max_resolution: str
    #: The per-GPU maximum in mixed-size mode where the catalogue has NVIDIA's (L40S-4C: 8);
    #: None: ``max_instance`` bounds it there too.
    mixed_max_instance: int | None = None

    def limit(self, mode: VgpuMode) -> int:
        """How many vGPUs of this type's framebuffer size the GPU may host in ``mode``."""
        if mode is VgpuMode.MIXED_SIZE and self.mixed_max_instance is not None:
            return self.mixed_max_instance
        return self.max_instance

    @property
    def mdev_type(self) -> str:
        return f"nvidia-{self.type_id}"

    @property
    def description(self) -> str:
        """The one line the driver prints in ``mdev_supported_types/<type>/description``."""
        return (
            f"num_heads={self.num_heads}, frl_config={self.frl_config}, "
            f"framebuffer={self.framebuffer_mib}M, max_resolution={self.max_resolution}, "
            f"max_instance={self.max_instance}"
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.type_id,
            "name": self.name,
            "framebufferMiB": self.framebuffer_mib,
            "maxInstance": self.max_instance,
            "numHeads": self.num_heads,
            "frlConfig": self.frl_config,
            "maxResolution": self.max_resolution,
        }
        if self.mixed_max_instance is not None:  # only where known: other types' JSON unchanged
            out["mixedSizeMaxInstance"] = self.mixed_max_instance
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SimType:
        mixed = raw.get("mixedSizeMaxInstance")
        return cls(
            type_id=int(raw["id"]),
            name=str(raw["name"]),
            framebuffer_mib=int(raw["framebufferMiB"]),
            max_instance=int(raw["maxInstance"]),
            num_heads=int(raw["numHeads"]),
            frl_config=int(raw["frlConfig"]),
            max_resolution=str(raw["maxResolution"]),
            mixed_max_instance=None if mixed is None else int(mixed),
        )


@record(frozen=True, slots=True)
class SimModel:
    """What the simulator needs of a catalogue model, copied into the state file.

    Copying it makes a simulated host self-contained: a later catalogue edit does not change
    the hardware of a tree that already exists.
    """

    name: str  # "NVIDIA A2"
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    vf_device: int  # NVIDIA VFs report the PF's device id
    vfs: int
    vf_offset: int
    vf_stride: int
    gpus_per_board: int
    types: tuple[SimType, ...]
    #: The GPU's framebuffer (MiB): what mixed-size mode's vGPUs share.
    framebuffer_mib: int
    #: MIG-capable (the catalogue lists MIG-backed profiles for the model): ``nvidia-smi -mig 1``
    #: turns MIG mode on, and ``--query-gpu=mig.mode.current`` answers Disabled/Enabled, not
    #: ``[N/A]``. Its GPU instance profiles are :data:`GPU_INSTANCE_PROFILES`'.
    mig: bool = False

    @classmethod
    def from_catalog(cls, model: GpuModel) -> SimModel:
        ids = model.pci_ids[0]
        device = int(ids.device, 16)
        first_id = TYPE_ID_BASES.get(model.name, DEFAULT_TYPE_ID_BASE)
        # MIG-backed profiles are never offered: no simulated GPU has a GPU instance (in MIG
        # mode it offers nothing). Ids still count every catalogue profile, so an id names the
        # same profile whatever is offered.
        types = tuple(
            SimType(
                type_id=first_id + i,
                name=p.name,
                framebuffer_mib=p.framebuffer_mib,
                max_instance=p.max_instances,
                num_heads=p.num_heads,
                frl_config=p.frl_config,
                max_resolution=p.max_resolution,
                mixed_max_instance=p.mixed_size_max_instances,
            )
            for i, p in enumerate(model.profiles)
            if not p.mig
        )
        return cls(
            name=model.name,
            vendor=int(ids.vendor, 16),
            device=device,
            subsystem_vendor=int(ids.subsystem_vendor or ids.vendor, 16),
            subsystem_device=int(ids.subsystem_device or "0", 16),
            vf_device=device,
            vfs=model.vfs,
            vf_offset=model.vf_offset if model.vf_offset is not None else DEFAULT_VF_OFFSET,
            vf_stride=model.vf_stride,
            gpus_per_board=model.gpus_per_board,
            types=types,
            framebuffer_mib=model.framebuffer_mib,
            mig=any(p.mig for p in model.profiles),
        )

    def type_named(self, name: str) -> SimType | None:
        for t in self.types:
            if t.name == name:
                return t
        return None

    def type_with_id(self, type_id: int) -> SimType | None:
        for t in self.types:
            if t.type_id == type_id:
                return t
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vendor": self.vendor,
            "device": self.device,
            "subsystemVendor": self.subsystem_vendor,
            "subsystemDevice": self.subsystem_device,
            "vfDevice": self.vf_device,
            "vfs": self.vfs,
            "vfOffset": self.vf_offset,
            "vfStride": self.vf_stride,
            "gpusPerBoard": self.gpus_per_board,
            "types": [t.to_json() for t in self.types],
            "framebufferMiB": self.framebuffer_mib,
            **({"mig": True} if self.mig else {}),  # only where true: other models' JSON unchanged
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SimModel:
        """A state file from before mixed-size mode has no ``framebufferMiB``: the largest
        type's is the GPU's (its full-size profile: 48Q on an L40S)."""
        types = tuple(SimType.from_json(t) for t in raw["types"])
        total = raw.get("framebufferMiB")
        return cls(
            name=str(raw["name"]),
            vendor=int(raw["vendor"]),
            device=int(raw["device"]),
            subsystem_vendor=int(raw["subsystemVendor"]),
            subsystem_device=int(raw["subsystemDevice"]),
            vf_device=int(raw["vfDevice"]),
            vfs=int(raw["vfs"]),
            vf_offset=int(raw["vfOffset"]),
            vf_stride=int(raw["vfStride"]),
            gpus_per_board=int(raw["gpusPerBoard"]),
            types=types,
            framebuffer_mib=(
                int(total)
                if total is not None
                else max((t.framebuffer_mib for t in types), default=0)
            ),
            mig=raw.get("mig") is True,
        )


@record(frozen=True, slots=True)
class GpuInstanceProfile:
    """One row of ``nvidia-smi mig -lgip``: a GPU instance profile of a MIG-capable model."""

    name: str  # "1g.5gb" (printed as "MIG 1g.5gb")
    profile_id: int
    instances: int  # Free/Total on a GPU without instances: instances/instances
    memory_gib: str  # "4.75"
    #: SM, DEC, ENC (the row's first line), CE, JPEG, OFA (its second line).
    engines: tuple[int, int, int, int, int, int]


#: The GPU instance profiles of the MIG-capable models the tests use: NVIDIA's MIG user guide
#: ("Supported MIG Profiles", A100-SXM4-40GB: 1g.5gb ×7, 1g.5gb+me ×1, 1g.10gb ×4, 2g.10gb ×3,
#: 3g.20gb ×2, 4g.20gb ×1, 7g.40gb ×1, with these profile ids), in the row layout and with the
#: values of harvester/pcidevices' capture of ``nvidia-smi mig -lgip`` on an A100 40GB
#: (pkg/util/gpuhelper/mig_test.go ``availableProfiles``). A MIG-capable model not here lists
#: no profile (only the models tests need are kept).
GPU_INSTANCE_PROFILES: dict[str, tuple[GpuInstanceProfile, ...]] = {
    "NVIDIA A100 40GB": (
        GpuInstanceProfile("1g.5gb", 19, 7, "4.75", (14, 0, 0, 1, 0, 0)),
        GpuInstanceProfile("1g.5gb+me", 20, 1, "4.75", (14, 1, 0, 1, 1, 1)),
        GpuInstanceProfile("1g.10gb", 15, 4, "9.75", (14, 1, 0, 1, 0, 0)),
        GpuInstanceProfile("2g.10gb", 14, 3, "9.75", (28, 1, 0, 2, 0, 0)),
        GpuInstanceProfile("3g.20gb", 9, 2, "19.62", (42, 2, 0, 3, 0, 0)),
        GpuInstanceProfile("4g.20gb", 5, 1, "19.62", (56, 2, 0, 4, 0, 0)),
        GpuInstanceProfile("7g.40gb", 0, 1, "39.50", (98, 5, 0, 7, 1, 1)),
    ),
}


def vf_addresses(pf: PciAddress, *, total: int, offset: int, stride: int) -> tuple[PciAddress, ...]:
    """Where the kernel places VF 0..total-1: routing id of the PF + offset + index × stride."""
    return tuple(
        PciAddress.from_routing_id(pf.domain, pf.routing_id + offset + i * stride)
        for i in range(total)
    )


def model_vf_addresses(pf: PciAddress, model: SimModel) -> tuple[PciAddress, ...]:
    return vf_addresses(pf, total=model.vfs, offset=model.vf_offset, stride=model.vf_stride)


def creatable(
    model: SimModel,
    hosted: Mapping[str, str | None],
    *,
    mode: VgpuMode = VgpuMode.EQUAL_SIZE,
    placed: Iterable[tuple[str, int]] = (),
    mig: bool = False,
) -> dict[str, frozenset[str]]:
    """Per VF of one GPU, the names of the types whose ``available_instances`` is 1 now.

    In MIG mode (``mig``) none: a GPU in MIG mode offers MIG-backed types only, for the GPU
    instances that exist, and no simulated GPU has one (docs/domain.md §10).

    ``hosted`` maps every VF address of the GPU to the type name of its vGPU (or None). A type
    is creatable on a VF iff the VF hosts nothing and fewer vGPUs of the type's framebuffer size
    exist on the GPU than its limit (:meth:`SimType.limit`: in mixed-size mode its mixed-size
    maximum where known), and: in equal-size mode, the GPU hosts nothing or only vGPUs of that
    size; in mixed-size mode, the hosted vGPUs' framebuffer and the type's fit the GPU's.
    """
    if mig:
        return {vf: frozenset() for vf in hosted}
    by_name = {t.name: t for t in model.types}
    sizes: dict[int, int] = {}
    for type_name in hosted.values():
        if type_name is not None:
            size = by_name[type_name].framebuffer_mib if type_name in by_name else -1
            sizes[size] = sizes.get(size, 0) + 1
    if -1 in sizes:
        open_types: frozenset[str] = frozenset()  # a type it does not know: nothing is judged
    elif mode is VgpuMode.MIXED_SIZE:
        used = sum(size * n for size, n in sizes.items())
        placed = tuple(placed)
        open_types = frozenset(
            t.name
            for t in model.types
            if used + t.framebuffer_mib <= model.framebuffer_mib
            and sizes.get(t.framebuffer_mib, 0) < t.limit(mode)
            and creatable_placements(model, t, placed)
        )
    elif len(sizes) > 1:
        open_types = frozenset()  # mixed sizes: only a mixed-size host does this
    else:
        hosted_size = next(iter(sizes), None)
        open_types = frozenset(
            t.name
            for t in model.types
            if (hosted_size is None or t.framebuffer_mib == hosted_size)
            and sizes.get(t.framebuffer_mib, 0) < t.limit(mode)
        )
    return {
        vf: (open_types if type_name is None else frozenset()) for vf, type_name in hosted.items()
    }


# --- mixed-size placement slots (a model: see the module's docstring) -------------------------

#: The framebuffer one placement slot stands for, in this model.
SLOT_MIB = 1024


def placement_slots(model: SimModel) -> int:
    """The GPU's placement slots (the model's: one per GiB of framebuffer)."""
    return model.framebuffer_mib // SLOT_MIB


def placement_size(model: SimModel, t: SimType) -> int:
    """The slots one vGPU of ``t`` occupies (the model's)."""
    return max(1, -(-t.framebuffer_mib // SLOT_MIB))


def supported_placements(model: SimModel, t: SimType) -> range:
    """Where a vGPU of ``t`` may begin: the multiples of its size that fit the slots."""
    size = placement_size(model, t)
    return range(0, placement_slots(model) - size + 1, size)


def occupied_slots(model: SimModel, placed: Iterable[tuple[str, int]]) -> set[int]:
    """The slots the placed vGPUs (type name, placement ID) occupy."""
    taken: set[int] = set()
    for type_name, start in placed:
        t = model.type_named(type_name)
        if t is not None:
            taken.update(range(start, start + placement_size(model, t)))
    return taken


def creatable_placements(
    model: SimModel, t: SimType, placed: Iterable[tuple[str, int]]
) -> tuple[int, ...]:
    """The placement IDs at which a vGPU of ``t`` can be created now: every slot it would
    occupy is free."""
    taken = occupied_slots(model, placed)
    size = placement_size(model, t)
    return tuple(p for p in supported_placements(model, t) if taken.isdisjoint(range(p, p + size)))


def placements_text(model: SimModel, placed: Iterable[tuple[str, int]]) -> str:
    """The simulator's ``nvidia/creatable_placements`` (a file of this model, not one a real
    host is known to have): per type, NVML's creatable-placement answer as a line,
    ``<type id> : <placement size> : <creatable placement IDs>`` (none: nothing after the
    last colon), under a header; every type is listed, so the sizes of hosted ones show."""
    placed = tuple(placed)
    lines = [f"{'ID':<6}: Placement Size : Creatable Placement IDs"]
    for t in model.types:
        ids = " ".join(str(p) for p in creatable_placements(model, t, placed))
        lines.append(f"{t.type_id:<6}: {placement_size(model, t)} : {ids}".rstrip())
    return "\n".join(lines) + "\n"


def create_refusal(
    model: SimModel,
    hosted: Mapping[str, str | None],
    vf: str,
    type_name: str,
    *,
    mode: VgpuMode = VgpuMode.EQUAL_SIZE,
    placed: Iterable[tuple[str, int]] = (),
    mig: bool = False,
) -> str | None:
    """Why the driver would refuse to create ``type_name`` on ``vf`` now; None if it would not
    (``placed``: in mixed-size mode, the hosted vGPUs' type and placement ID; ``mig``: the GPU
    is in MIG mode)."""
    t = model.type_named(type_name)
    if t is None:
        return f"{model.name} does not offer vGPU type {type_name!r}"
    if mig:
        return (
            f"the GPU is in MIG mode: it offers MIG-backed vGPU types only, for GPU instances "
            f"that exist, and has none ({type_name} is time-sliced)"
        )
    if vf not in hosted:
        return f"{vf} is not a VF of this {model.name}"
    current = hosted[vf]
    if current is not None:
        return f"VF {vf} already hosts a {current} vGPU (one vGPU per VF)"
    by_name = {x.name: x for x in model.types}
    others = [by_name[n] for n in hosted.values() if n is not None and n in by_name]
    sizes = {o.framebuffer_mib for o in others}
    if mode is VgpuMode.MIXED_SIZE:
        used = sum(o.framebuffer_mib for o in others)
        if used + t.framebuffer_mib > model.framebuffer_mib:
            return (
                f"{type_name} has {t.framebuffer_mib} MiB of framebuffer but only "
                f"{model.framebuffer_mib - used} of the GPU's {model.framebuffer_mib} MiB are "
                "free (mixed-size mode)"
            )
    elif sizes and sizes != {t.framebuffer_mib}:
        size = min(sizes)
        return (
            f"{type_name} has {t.framebuffer_mib} MiB of framebuffer but the GPU already hosts "
            f"{size} MiB vGPUs (equal-size mode)"
        )
    same = sum(1 for o in others if o.framebuffer_mib == t.framebuffer_mib)
    limit = t.limit(mode)
    if same >= limit:
        which = "mixed-size maximum" if limit != t.max_instance else "max_instance"
        return (
            f"{type_name}: the GPU already hosts {same} vGPUs of {t.framebuffer_mib} MiB "
            f"({which}={limit})"
        )
    if mode is VgpuMode.MIXED_SIZE:
        placed = tuple(placed)
        if not creatable_placements(model, t, placed):
            size = placement_size(model, t)
            starts = ", ".join(str(p) for p in supported_placements(model, t))
            return (
                f"{type_name} occupies {size} placement slots, at one of {starts}: each of them "
                f"overlaps slots taken by the GPU's vGPUs (mixed-size mode: fragmentation)"
            )
    return None


# --- where simulated devices sit on the PCI buses -------------------------------------------

#: Buses handed out to GPUs given without an address: 0x08, 0x18, …, 0xf8, then the next domain.
DEFAULT_BUS_FIRST = 0x08
DEFAULT_BUS_STEP = 0x10
#: Buses tried, in order, for the distractor NIC (domain 0).
NIC_BUSES = (0x03, 0x04, 0x05, 0x06, 0x07, 0x02, 0x01, *range(0x09, 0x100))


@record(frozen=True, slots=True)
class GpuRequest:
    """One ``MODEL[@ADDRESS]`` asked for; a multi-GPU board expands to several GPUs."""

    model: SimModel
    address: PciAddress | None = None
    #: The driver its PF is bound to: ``vfio-pci`` for a GPU passed through whole.
    driver: str = "nvidia"
    #: False: its ``sriov_vf_device`` reads 0 (SR-IOV, but it makes no vGPU VFs).
    vgpu_vfs: bool = True
    #: The vGPU host interface its VFs show: ``mdev`` or ``vfio`` (NVIDIA's vendor-specific).
    interface: str = "mdev"


@record(frozen=True, slots=True)
class PlacedGpu:
    model: SimModel
    address: PciAddress
    board: int  # index of the request that produced it
    driver: str = "nvidia"
    vgpu_vfs: bool = True
    interface: str = "mdev"


def _board_addresses(first: PciAddress, count: int) -> list[PciAddress]:
    if first.bus + count - 1 > 0xFF:
        raise ValueError(f"a {count}-GPU board at {first} would run past bus ff")
    return [
        PciAddress(first.domain, first.bus + k, first.slot, first.function) for k in range(count)
    ]


def _default_bases() -> Iterator[tuple[int, int]]:
    for domain in range(0x10000):
        for bus in range(DEFAULT_BUS_FIRST, 0x100, DEFAULT_BUS_STEP):
            yield domain, bus


def place_gpus(requests: Sequence[GpuRequest]) -> list[PlacedGpu]:
    """Give every GPU an address: requested ones first, the rest on free default buses.

    Raises ValueError for a duplicate address, a GPU on bus 00 (the root complex here) or
    functions that would overlap (a PF or one of its VFs landing on another device).
    """
    out: dict[int, list[PlacedGpu]] = {}
    taken: dict[PciAddress, str] = {}  # every function a placed GPU uses, PF and VFs
    pfs: dict[PciAddress, str] = {}
    buses: set[tuple[int, int]] = set()

    def claim(gpus: list[PlacedGpu]) -> None:
        for g in gpus:
            if g.address.bus == 0:
                raise ValueError(
                    f"GPU address {g.address}: bus 00 holds the simulated root ports; "
                    "use another bus"
                )
            if g.address in pfs:
                raise ValueError(f"duplicate address {g.address}: already used by {pfs[g.address]}")
            functions = [g.address, *model_vf_addresses(g.address, g.model)]
            for a in functions:
                if a in taken:
                    raise ValueError(
                        f"{g.model.name} at {g.address}: function {a} overlaps {taken[a]}"
                    )
            pfs[g.address] = f"{g.model.name} at {g.address}"
            for i, a in enumerate(functions):
                taken[a] = f"{g.model.name} at {g.address}" + ("" if i == 0 else f" (VF {i - 1})")
                buses.add((a.domain, a.bus))

    for i, req in enumerate(requests):
        if req.address is not None:
            gpus = [
                PlacedGpu(req.model, a, i, req.driver, req.vgpu_vfs, req.interface)
                for a in _board_addresses(req.address, req.model.gpus_per_board)
            ]
            claim(gpus)
            out[i] = gpus
    bases = _default_bases()
    for i, req in enumerate(requests):
        if req.address is not None:
            continue
        n = req.model.gpus_per_board
        for domain, bus in bases:
            if bus + n - 1 > 0xFF:
                continue
            if all((domain, bus + k) not in buses for k in range(n)):
                gpus = [
                    PlacedGpu(req.model, a, i, req.driver, req.vgpu_vfs, req.interface)
                    for a in _board_addresses(PciAddress(domain, bus, 0, 0), n)
                ]
                claim(gpus)
                out[i] = gpus
                break
        else:  # pragma: no cover - 65536 domains
            raise ValueError("no free PCI bus left for another GPU")
    return [g for i in range(len(requests)) for g in out[i]]


def occupied(gpus: Iterable[PlacedGpu]) -> set[PciAddress]:
    """Every function a set of GPUs uses or will use once SR-IOV is on."""
    out: set[PciAddress] = set()
    for g in gpus:
        out.add(g.address)
        out.update(model_vf_addresses(g.address, g.model))
    return out


def root_port_address(domain: int, index: int) -> PciAddress:
    """The ``index``-th simulated root port of a domain: ``dddd:00:01.0``, ``dddd:00:02.0``, …"""
    slot = 1 + index % 31
    function = index // 31
    if function > 7:
        raise ValueError(f"more than {31 * 8} devices in PCI domain {domain:04x}")
    return PciAddress(domain, 0, slot, function)
