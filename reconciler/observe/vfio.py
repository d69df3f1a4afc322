"""NVIDIA's vendor-specific VFIO interface (docs/domain.md §3b; vGPU 17+ on kernel 6.8+), read.

Each VF of such a GPU has ``nvidia/creatable_vgpu_types`` (a header ``ID    : vGPU Name``, then
``1147  : NVIDIA L40S-1Q`` lines: what can be created on it *now*) and
``nvidia/current_vgpu_type`` (``0``, or the id of the type it was given). There are no mdevs:
the VF itself is the vGPU, handed to a VM as a PCI device, so its address is its identity.

``apply.vfio`` drives it. The name of a type in use is not listed any more (the list narrows to
what can still be created), so it is resolved through the other VFs' lists; one no list names is
shown by its id (:func:`~reconciler.model.type_shown_by_id`), and the planner changes nothing on
that GPU. This interface publishes no ``description``: sizes and maxima come from the catalogue,
or from the name.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.catalog import Catalog, parse_profile_name
from reconciler.model import VGPU, Interface, TypeNames, VGPUType, type_shown_by_id
from reconciler.model.errors import excerpt
from reconciler.model.record import replace
from reconciler.observe.interfaces import GpuReading, VfReading, device_nodes
from reconciler.observe.parse import parse_creatable_types, parse_int, type_id_order
from reconciler.observe.pci import PhysicalFunction
from reconciler.observe.sysfs import SysfsTree

CREATABLE = "nvidia/creatable_vgpu_types"
CURRENT = "nvidia/current_vgpu_type"


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
                        f"VF {vf.address} has vGPU type {current}, which no VF lists any more "
                        "and vgpuctl has no record of: shown by its id"
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
        return GpuReading(Interface.VFIO, types=types, vfs=tuple(vfs), notes=tuple(notes))

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
