"""What a host-interface reader returns for one GPU, and the port every such reader fills.

A GPU makes vGPUs through one host interface (docs/domain.md §3): mdev (``mdev.py``) or, later,
NVIDIA's vendor-specific VFIO (a ``vfio.py`` implementing :class:`InterfaceReader`). ``host.py``
asks each reader in turn; the first that recognises the GPU's VFs describes them.
"""

from __future__ import annotations

from typing import Protocol

from reconciler.model import VGPU, Interface, VGPUType
from reconciler.model.placement import PlacementFacts
from reconciler.model.record import field, record
from reconciler.observe.holds import DeviceNodes
from reconciler.observe.parse import link_basename, parse_device_number, vfio_cdev_name
from reconciler.observe.pci import PhysicalFunction
from reconciler.observe.sysfs import SysfsTree


@record(frozen=True, slots=True)
class VfReading:
    """One VF as an interface reader sees it."""

    #: Type names with ``available_instances`` > 0.
    creatable: frozenset[str] = frozenset()
    #: The vGPU on the VF (``in_use`` is filled in later, by the hold probe).
    vgpu: VGPU | None = None
    #: The device nodes through which a VM holds the vGPU (none when there is no vGPU).
    nodes: DeviceNodes = field(default_factory=DeviceNodes)


@record(frozen=True, slots=True)
class GpuReading:
    interface: Interface
    #: Offered types in the driver's numeric type-id order.
    types: tuple[VGPUType, ...] = ()
    #: One per VF of the PF, in the same (``virtfn``) order.
    vfs: tuple[VfReading, ...] = ()
    notes: tuple[str, ...] = ()
    #: Mixed-size placement facts, where the interface shows them (None: it shows none).
    placements: PlacementFacts | None = None


class InterfaceReader(Protocol):
    """Reads the vGPU side of one GPU for one host interface."""

    def read_gpu(self, pf: PhysicalFunction) -> GpuReading | None:
        """The GPU's types and per-VF state, or ``None`` if its VFs do not use this interface."""
        ...


def device_nodes(tree: SysfsTree, device: str) -> DeviceNodes:
    """The nodes through which a VM can hold the device at ``device`` (a resolved path): its
    ``iommu_group`` link (absent: no VFIO driver bound, nothing can open it; the group's node
    is ``class/vfio/<group>``), and the cdev listed under its ``vfio-dev/`` (absent on kernels
    without ``CONFIG_VFIO_DEVICE_CDEV``), each with the device number its ``dev`` file gives;
    and the device's own name, the last component of ``device`` (what a VFIO device fd's
    ``vfio-device-syspath`` ends in: ``holds.vfio_device_of``)."""
    try:
        target = tree.read_link(f"{device}/iommu_group")
    except FileNotFoundError:
        target = None
    group = link_basename(target) if target else None
    cdev = vfio_cdev(tree, device)
    numbers = set()
    for dev_file in (
        f"class/vfio/{group}/dev" if group is not None else None,
        f"{device}/vfio-dev/{cdev}/dev" if cdev is not None else None,
    ):
        if dev_file is not None:
            number = _device_number(tree, dev_file)
            if number is not None:
                numbers.add(number)
    return DeviceNodes(
        group=group, cdev=cdev, numbers=frozenset(numbers), device=link_basename(device) or None
    )


def vfio_cdev(tree: SysfsTree, device: str) -> str | None:
    """The vfio cdev of the device at ``device`` (a resolved path), as its ``vfio-dev/`` lists
    it (``vfio3``: ``/dev/vfio/devices/vfio3``; vfio_main.c names it ``"vfio%d"``, device_cdev.c
    puts its node at ``"vfio/devices/%s"``); None without one (no ``CONFIG_VFIO_DEVICE_CDEV``,
    or no VFIO driver). Entries of any other name are not cdevs."""
    try:
        names = tree.list_dir(f"{device}/vfio-dev")
    except (FileNotFoundError, NotADirectoryError):
        return None
    cdevs = sorted(n for n in names if vfio_cdev_name(n))
    return cdevs[0] if cdevs else None


def _device_number(tree: SysfsTree, rel: str) -> int | None:
    try:
        text = tree.read_text(rel)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return parse_device_number(text, source=tree.describe(rel))
