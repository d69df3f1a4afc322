"""The mdev host interface (docs/domain.md §3a): offered types, per-VF availability, existing vGPUs.

Reads, per VF with no live vGPU, ``mdev_supported_types/<id>/available_instances`` (a VF that
hosts one shows 0 for every type); per GPU and type id, the ``name`` and ``description`` once
(the driver offers the same types on every VF of a GPU, so re-reading them 32 times per GPU
would be most of the scan's cost); and per VF the mdev directories under it (a live mdev is also
listed under ``bus/mdev/devices``; one that is not is being removed, waiting for a VM to let go
of it). An mdev's type is resolved by *name* through its ``mdev_type`` link, because type ids
vary by driver branch.
"""

from __future__ import annotations

import errno

from reconciler.model import UNKNOWN_HOLDER, UNKNOWN_TYPE, VGPU, Interface, VGPUType
from reconciler.observe.holds import DeviceNodes
from reconciler.observe.interfaces import GpuReading, VfReading, device_nodes
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


class MdevReader:
    """Reads GPUs whose VFs are mdev parents. One instance per host scan.

    Without ``availability`` no ``available_instances`` is read and every VF's creatable set
    is left empty (:attr:`Inventory.vf_availability`): a plan with no cluster consults none of
    them, and on an 8-GPU node they are 6,000 of the scan's 7,400 reads.
    """

    def __init__(self, tree: SysfsTree, *, availability: bool = True) -> None:
        self._tree = tree
        self._availability = availability

    def read_gpu(self, pf: PhysicalFunction) -> GpuReading | None:
        tree = self._tree
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
            offered = []
            for type_id in type_ids:
                known = types.get(type_id)
                if known is None:
                    known = types[type_id] = self._read_type(f"{types_dir}/{type_id}")
                offered.append((type_id, known.name))
            vgpu, nodes = self._vgpu_on(vf, types, notes)
            creatable = set()
            # A VF that hosts a live vGPU shows 0 for every type (one vGPU per VF, docs/domain.md
            # §3a): its counts are not read. One whose vGPU is being removed is read as it is.
            free = vgpu is None or vgpu.removing
            for type_id, name in offered if free and self._availability else ():
                available = f"{types_dir}/{type_id}/available_instances"
                # The hot loop of a scan (every type on every free VF): the kernel prints 0 or
                # 1 on a VF; anything else goes through the full parse (and its located error).
                text = tree.read_text(available)
                if text == "1\n" or (
                    text != "0\n" and parse_int(text, source=tree.describe(available)) > 0
                ):
                    creatable.add(name)
            vfs.append(VfReading(frozenset(creatable), vgpu, nodes))
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

    def _vgpu_on(
        self, vf: VirtualFunction, types: dict[str, VGPUType], notes: list[str]
    ) -> tuple[VGPU | None, DeviceNodes]:
        """The vGPU on ``vf``: an mdev directory under it, live when the mdev bus lists it.

        One under the VF that the bus no longer lists is a removal in progress: the kernel
        unlinks an mdev from its bus before it waits for a VM to let go of it (``device_del``
        → ``vfio_unregister_group_dev``), and keeps its directory until the VM does.
        """
        tree = self._tree
        try:
            names = sorted(n for n in tree.list_dir(vf.path) if is_mdev_uuid(n))
        except FileNotFoundError:
            _raise_if_gone(tree, vf.path)
            names = []
        live = [n for n in names if tree.exists(f"{MDEV_DEVICES}/{n}")]
        # Not on the bus yet but with its remove file: still being created (the kernel adds the
        # bus link after the directory). Not a vGPU until it is on the bus, as before.
        removing = [n for n in names if n not in live and not tree.exists(f"{vf.path}/{n}/remove")]
        if not live and not removing:
            return None, DeviceNodes()
        first, *others = live or removing
        if others:
            # The NVIDIA driver allows one vGPU per VF; the model holds one. Say so, loudly.
            notes.append(f"VF {vf.address} has more than one mdev; ignoring {', '.join(others)}")
        path = f"{vf.path}/{first}"
        # Read always: a few links per vGPU; the hold probe and the device plugin need them.
        nodes = device_nodes(tree, path)
        if not live:
            vgpu = VGPU(
                uuid=first,
                type_name=UNKNOWN_TYPE,
                in_use=True,
                holder=f"{UNKNOWN_HOLDER}: its removal waits for the process that holds it",
                removing=True,
            )
            return vgpu, nodes
        if removing:
            notes.append(f"VF {vf.address}: the removal of {', '.join(removing)} is under way")
        return VGPU(uuid=first, type_name=self._type_name(vf, first, path, types, notes)), nodes

    def _type_name(
        self,
        vf: VirtualFunction,
        uuid: str,
        path: str,
        types: dict[str, VGPUType],
        notes: list[str],
    ) -> str:
        tree = self._tree
        try:
            type_dir = tree.resolve(f"{path}/mdev_type")
        except FileNotFoundError:
            _raise_if_gone(tree, path)
            notes.append(f"vGPU {uuid} on VF {vf.address} has no mdev_type link")
            return UNKNOWN_TYPE
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
            _raise_if_gone(tree, path)
            name = type_id
        notes.append(
            f"vGPU {uuid} on VF {vf.address} has type {type_id} ({name}), "
            "which the VF does not list"
        )
        return name


def _raise_if_gone(tree: SysfsTree, path: str) -> None:
    """Tell a device removed mid-scan (retry the scan) from a file that is simply not there."""
    if not tree.exists(path):
        raise FileNotFoundError(errno.ENOENT, "vanished during the scan", tree.describe(path))
