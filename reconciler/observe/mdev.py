"""The mdev host interface (DOMAIN.md §3a): offered types, per-VF availability, existing vGPUs.

Reads, per VF, ``mdev_supported_types/<id>/available_instances``; per GPU and type id, the
``name`` and ``description`` once (the driver offers the same types on every VF of a GPU, so
re-reading them 32 times per GPU would be most of the scan's cost); and the existing mdevs once
per host from ``bus/mdev/devices`` (one listing, instead of listing every VF directory). An
mdev's type is resolved by *name* through its ``mdev_type`` link, because type ids vary by
driver branch.
"""

from __future__ import annotations

import errno
import posixpath
from dataclasses import dataclass

from reconciler.model import VGPU, Interface, VGPUType
from reconciler.observe.interfaces import GpuReading, VfReading
from reconciler.observe.parse import (
    is_mdev_uuid,
    link_basename,
    parse_description,
    parse_int,
    parse_type_name,
    type_id_order,
)
from reconciler.observe.pci import PhysicalFunction, VirtualFunction
from reconciler.observe.sysfs import SysfsTree

MDEV_DEVICES = "bus/mdev/devices"
SUPPORTED_TYPES = "mdev_supported_types"


@dataclass(frozen=True, slots=True)
class MdevDevice:
    uuid: str
    path: str  # resolved: "<VF path>/<uuid>"


class MdevReader:
    """Reads GPUs whose VFs are mdev parents. One instance per host scan."""

    def __init__(self, tree: SysfsTree, *, iommu_groups: bool = False) -> None:
        self._tree = tree
        self._iommu_groups = iommu_groups
        self._by_parent: dict[str, list[MdevDevice]] | None = None

    def read_gpu(self, pf: PhysicalFunction) -> GpuReading | None:
        tree = self._tree
        by_parent = self._mdevs_by_parent()
        types: dict[str, VGPUType] = {}  # type id → type: this GPU's cache
        notes: list[str] = []
        vfs: list[VfReading] = []
        exposes_types = False
        for vf in pf.vfs:
            types_dir = f"{vf.path}/{SUPPORTED_TYPES}"
            try:
                type_ids = tree.list_dir(types_dir)
            except FileNotFoundError:
                _raise_if_gone(tree, vf.path)
                type_ids = []  # not (yet) an mdev parent: nothing creatable here
            else:
                exposes_types = True
            creatable = set()
            for type_id in type_ids:
                known = types.get(type_id)
                if known is None:
                    known = types[type_id] = self._read_type(f"{types_dir}/{type_id}")
                available = f"{types_dir}/{type_id}/available_instances"
                if parse_int(tree.read_text(available), source=tree.describe(available)) > 0:
                    creatable.add(known.name)
            vgpu, group = self._vgpu_on(vf, by_parent.get(vf.path, ()), types, notes)
            vfs.append(VfReading(frozenset(creatable), vgpu, group))
        if not exposes_types and not any(v.vgpu for v in vfs):
            return None
        return GpuReading(
            interface=Interface.MDEV,
            types=tuple(sorted(types.values(), key=lambda t: type_id_order(t.type_id))),
            vfs=tuple(vfs),
            notes=tuple(notes),
        )

    def _read_type(self, type_dir: str) -> VGPUType:
        tree = self._tree
        name_file, description_file = f"{type_dir}/name", f"{type_dir}/description"
        name = parse_type_name(tree.read_text(name_file), source=tree.describe(name_file))
        d = parse_description(
            tree.read_text(description_file), source=tree.describe(description_file)
        )
        return VGPUType(
            name=name,
            type_id=link_basename(type_dir),
            framebuffer_mib=d.framebuffer_mib,
            max_instance=d.max_instance,
            num_heads=d.num_heads,
            max_resolution=d.max_resolution,
            frl_config=d.frl_config,
        )

    def _mdevs_by_parent(self) -> dict[str, list[MdevDevice]]:
        """Every mdev on the host keyed by its parent's resolved path (read once per scan)."""
        if self._by_parent is None:
            tree = self._tree
            try:
                names = tree.list_dir(MDEV_DEVICES)
            except FileNotFoundError:
                names = []  # the mdev bus exists only once an mdev parent driver is loaded
            by_parent: dict[str, list[MdevDevice]] = {}
            for name in sorted(names):
                if not is_mdev_uuid(name):
                    continue
                path = tree.resolve(f"{MDEV_DEVICES}/{name}")
                by_parent.setdefault(posixpath.dirname(path), []).append(MdevDevice(name, path))
            self._by_parent = by_parent
        return self._by_parent

    def _vgpu_on(
        self,
        vf: VirtualFunction,
        mdevs: list[MdevDevice] | tuple[()],
        types: dict[str, VGPUType],
        notes: list[str],
    ) -> tuple[VGPU | None, str | None]:
        if not mdevs:
            return None, None
        first, *others = mdevs
        if others:
            # The NVIDIA driver allows one vGPU per VF; the model holds one. Say so, loudly.
            extra = ", ".join(m.uuid for m in others)
            notes.append(f"VF {vf.address} has more than one mdev; ignoring {extra}")
        group = self._iommu_group(first) if self._iommu_groups else None
        return VGPU(uuid=first.uuid, type_name=self._type_name(vf, first, types, notes)), group

    def _type_name(
        self, vf: VirtualFunction, mdev: MdevDevice, types: dict[str, VGPUType], notes: list[str]
    ) -> str:
        tree = self._tree
        try:
            type_dir = tree.resolve(f"{mdev.path}/mdev_type")
        except FileNotFoundError:
            _raise_if_gone(tree, mdev.path)
            notes.append(f"vGPU {mdev.uuid} on VF {vf.address} has no mdev_type link")
            return "unknown"
        type_id = link_basename(type_dir)
        known = types.get(type_id)
        if known is not None:
            return known.name
        # A type id the VF does not list (another driver branch, a half-torn-down type):
        # its own directory still names it.
        name_file = f"{type_dir}/name"
        try:
            name = parse_type_name(tree.read_text(name_file), source=tree.describe(name_file))
        except FileNotFoundError:
            _raise_if_gone(tree, mdev.path)
            name = type_id
        notes.append(
            f"vGPU {mdev.uuid} on VF {vf.address} has type {type_id} ({name}), "
            "which the VF does not list"
        )
        return name

    def _iommu_group(self, mdev: MdevDevice) -> str | None:
        try:
            target = self._tree.read_link(f"{mdev.path}/iommu_group")
        except FileNotFoundError:
            return None  # not bound to a VFIO driver: no VM can have it open
        return link_basename(target) if target else None


def _raise_if_gone(tree: SysfsTree, path: str) -> None:
    """Tell a device removed mid-scan (retry the scan) from a file that is simply not there."""
    if not tree.exists(path):
        raise FileNotFoundError(errno.ENOENT, "vanished during the scan", tree.describe(path))
