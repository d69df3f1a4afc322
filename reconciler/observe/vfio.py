"""NVIDIA's vendor-specific VFIO interface (docs/domain.md §3b; vGPU 17+ on kernel 6.8+), read.

Each VF of such a GPU has ``nvidia/creatable_vgpu_types`` (a header ``ID    : vGPU Name``, then
``1147  : NVIDIA L40S-1Q`` lines: what can be created on it *now*) and
``nvidia/current_vgpu_type`` (``0``, or the id of the type it was given). There are no mdevs:
the VF itself is the vGPU, handed to a VM as a PCI device, so its address is its identity.

``apply.vfio`` drives it. The name of a type in use is not listed any more (the list narrows to
what can still be created), so it is resolved through the other VFs' lists, then through
``known_types`` (vgpuctl's record, and what the driver named when asked: ``cli/host.py``,
``observe/vgputypes.py``); one none of them names is shown by its id
(:func:`~reconciler.model.type_shown_by_id`), and the planner changes nothing on that GPU.
This interface publishes no ``description``: sizes and maxima come from the catalogue, or from
the name.

Mixed-size placements (docs/domain.md §4, docs/host.md): a VF's ``nvidia/placement_id`` (newer
drivers) is read where present: a decimal ID, or ``Not Applicable`` where the VF has none (the
word gentlemanautomaton/machina's mdev reader, ``filesystem/mdevfs/mediateddevice.go``, handles).
No public source shows where a host prints the creatable placements (NVML's
``nvmlDeviceGetVgpuTypeCreatablePlacements``: a placement size and IDs per type), so
``nvidia/creatable_placements`` is **vgpuctl's model**, written only by its simulator: a header,
then ``<type id> : <placement size> : <creatable IDs>`` per type. A host without it (every real
one we know of) has no placement facts, and its layouts are planned without a placement check;
one whose file or IDs read otherwise has facts marked unusable, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.catalog import Catalog, parse_profile_name
from reconciler.model import VGPU, Interface, TypeNames, VGPUType, type_shown_by_id
from reconciler.model.errors import excerpt
from reconciler.model.placement import HostedPlacement, PlacementFacts, TypePlacements
from reconciler.model.record import replace
from reconciler.observe.interfaces import GpuReading, VfReading, device_nodes
from reconciler.observe.parse import parse_creatable_types, parse_int, type_id_order
from reconciler.observe.pci import PhysicalFunction
from reconciler.observe.sysfs import SysfsTree

CREATABLE = "nvidia/creatable_vgpu_types"
CURRENT = "nvidia/current_vgpu_type"
PLACEMENT_ID = "nvidia/placement_id"
#: vgpuctl's model of a file no public source shows (see the module's docstring).
PLACEMENTS = "nvidia/creatable_placements"


class VendorVfioReader:
    """Reads GPUs whose VFs expose ``nvidia/creatable_vgpu_types``. One instance per scan."""

    def __init__(
        self, tree: SysfsTree, catalog: Catalog, known_types: TypeNames | None = None
    ) -> None:
        self._tree = tree
        self._catalog = catalog
        #: Type ids vgpuctl configured under the running driver, by GPU (its record).
        self._known = known_types or {}

    def read_gpu(self, pf: PhysicalFunction) -> GpuReading | None:
        tree = self._tree
        notes: list[str] = []
        lists: list[dict[str, str] | None] = []  # per VF: id → name offered now
        currents: list[str] = []  # per VF: "0" or a type id
        for vf in pf.vfs:
            creatable = f"{vf.path}/{CREATABLE}"
            if not tree.exists(creatable):
                lists.append(None)
                currents.append("0")
                continue
            entries, bad = parse_creatable_types(tree.read_text(creatable))
            for line in bad:
                notes.append(
                    f"VF {vf.address}: {tree.describe(creatable)}: cannot read the line "
                    f"'{excerpt(line)}'"
                )
            lists.append(dict(entries))
            current = f"{vf.path}/{CURRENT}"
            currents.append(str(parse_int(tree.read_text(current), source=tree.describe(current))))
        if all(offered is None for offered in lists):
            return None
        names: dict[str, str] = {}  # every id any VF lists → its name
        for offered in lists:
            names.update(offered or {})
        vfs: list[VfReading] = []
        for vf, offered, current in zip(pf.vfs, lists, currents, strict=True):
            vgpu = None
            if current != "0":
                name = names.get(current)
                if name is None and (known := self._known.get((pf.address, current))):
                    # Named by what vgpuctl recorded: one of the GPU's types, under its id (the
                    # node's summary then carries it, for a node whose record is lost).
                    name = names[current] = known
                if name is None:
                    name = type_shown_by_id(current)
                    notes.append(
                        f"VF {vf.address} has vGPU type {current}, which no VF lists any more, "
                        "vgpuctl has no record of and the driver did not name: shown by its id"
                    )
                vgpu = VGPU(uuid=str(vf.address), type_name=name)
            vfs.append(
                VfReading(
                    creatable=frozenset((offered or {}).values()),
                    vgpu=vgpu,
                    nodes=device_nodes(tree, vf.path) if vgpu is not None else VfReading().nodes,
                )
            )
        types = tuple(
            sorted(
                (self._type(type_id, name) for type_id, name in names.items()),
                key=lambda t: type_id_order(t.type_id),
            )
        )
        if any(current != "0" for current in currents):
            types += self._unlisted(pf, names.values())
        return GpuReading(
            Interface.VFIO,
            types=types,
            vfs=tuple(vfs),
            notes=tuple(notes),
            placements=self._placements(pf, lists, currents, names),
        )

    def _placements(
        self,
        pf: PhysicalFunction,
        lists: list[dict[str, str] | None],
        currents: list[str],
        names: dict[str, str],
    ) -> PlacementFacts | None:
        """The GPU's placement facts: the first VF's ``nvidia/creatable_placements`` (one GPU's
        answer, the same on each VF) and each configured VF's ``nvidia/placement_id``; None
        when the first VF has no such file."""
        tree = self._tree
        # One GPU's answer, the same on each VF: the first VF of the interface is asked (one
        # lookup per GPU on a host without the file, every real one we know of).
        first = next(
            (vf for vf, offered in zip(pf.vfs, lists, strict=True) if offered is not None), None
        )
        source = f"{first.path}/{PLACEMENTS}" if first is not None else None
        if source is None or not tree.exists(source):
            return None
        types, bad = _parse_placements(tree.read_text(source), names)
        if bad is not None:
            return PlacementFacts(unusable=f"{tree.describe(source)}: {bad}")
        sizes = {t.name: t.size for t in types}
        hosted: list[HostedPlacement] = []
        for vf, current in zip(pf.vfs, currents, strict=True):
            if current == "0":
                continue
            name = names.get(current) or type_shown_by_id(current)
            path = f"{vf.path}/{PLACEMENT_ID}"
            text = tree.read_text(path).strip() if tree.exists(path) else ""
            if not text.isdecimal() or not text.isascii():
                said = f"reads '{excerpt(text)}'" if text else "is absent"
                return PlacementFacts(
                    types=types,
                    unusable=f"VF {vf.address} hosts a vGPU but its {PLACEMENT_ID} {said}",
                )
            hosted.append(HostedPlacement(vf.index, name, int(text), sizes.get(name)))
        return PlacementFacts(types=types, hosted=tuple(hosted))

    def _unlisted(self, pf: PhysicalFunction, listed: Iterable[str]) -> tuple[VGPUType, ...]:
        """Once a vGPU is configured the lists narrow to what can still be created, so the
        GPU's other types are no longer listed anywhere: they are the catalogue's, with no id
        (an id is read off a list when one lists the type again; docs/domain.md §3b)."""
        model = self._catalog.model_for_ids(
            pf.vendor_id, pf.device_id, pf.subsystem_vendor_id, pf.subsystem_device_id
        )
        if model is None:
            return ()
        seen = set(listed)
        return tuple(p.vgpu_type() for p in model.time_sliced_profiles if p.name not in seen)

    def _type(self, type_id: str, name: str) -> VGPUType:
        """A listed type with the sizes the catalogue (or the name) gives; 0 where unknown."""
        known = self._catalog.profile(name)
        if known is not None:
            _, profile = known
            return replace(profile.vgpu_type(type_id), name=name)
        parsed = parse_profile_name(name)
        size = parsed.size_gb * 1024 if parsed is not None else 0
        return VGPUType(name=name, type_id=type_id, framebuffer_mib=size, max_instance=0)


#: At most this many placement IDs per type (a GPU has a few dozen slots).
_MAX_PLACEMENTS = 1024


def _parse_placements(
    text: str, names: dict[str, str]
) -> tuple[tuple[TypePlacements, ...], str | None]:
    """The types of ``nvidia/creatable_placements`` (the model's format, see the module's
    docstring) whose id a list names, and why the file cannot be used (None: it can). Any line
    not in that format makes the whole file unusable: a half-read answer is not a fact."""
    lines = text.splitlines()
    if not lines or not lines[0].replace(" ", "").startswith("ID:PlacementSize:"):
        return (), f"the header '{excerpt(lines[0] if lines else '')}' is not the one expected"
    types: list[TypePlacements] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(":")]
        if len(fields) != 3 or not all(_decimal(f) for f in fields[:2]):
            return (), f"cannot read the line '{excerpt(line)}'"
        ids = fields[2].split()
        if not all(_decimal(i) for i in ids) or len(ids) > _MAX_PLACEMENTS:
            return (), f"cannot read the line '{excerpt(line)}'"
        size = int(fields[1])
        if size < 1:
            return (), f"a placement size of 0 in '{excerpt(line)}'"
        name = names.get(str(int(fields[0])))
        if name is not None:
            types.append(TypePlacements(name, size, tuple(sorted({int(i) for i in ids}))))
    return tuple(types), None


def _decimal(text: str) -> bool:
    return text.isascii() and text.isdecimal() and len(text) <= 9
