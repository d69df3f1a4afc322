"""Find the NVIDIA SR-IOV vGPU physical functions on a host and read their PCI/SR-IOV facts.

Independent of the host interface (mdev or NVIDIA VFIO): the result, a :class:`PhysicalFunction`
per GPU with its VFs in ``virtfn`` order, is what each interface reader (``mdev.py``) starts from.
"""

from __future__ import annotations

from reconciler.model import ObserveError, PciAddress
from reconciler.model.errors import excerpt
from reconciler.model.record import record
from reconciler.observe.parse import (
    NVIDIA_VENDOR_ID,
    is_gpu_class,
    is_nvidia_sriov_gpu,
    link_basename,
    parse_class,
    parse_hex_id,
    parse_int,
    virtfn_links,
)
from reconciler.observe.sysfs import SysfsTree

PCI_DEVICES = "bus/pci/devices"


@record(frozen=True, slots=True)
class VirtualFunction:
    index: int  # N of the PF's virtfn<N> link
    address: PciAddress
    path: str  # resolved, relative to the sysfs root


@record(frozen=True, slots=True)
class PhysicalFunction:
    address: PciAddress
    path: str  # resolved, relative to the sysfs root
    vendor_id: str
    device_id: str
    subsystem_vendor_id: str
    subsystem_device_id: str
    driver: str  # "" when no driver is bound
    vf_device: str  # sriov_vf_device: "0000" when the GPU makes no vGPU VFs, "" when absent
    total_vfs: int
    num_vfs: int
    vf_offset: int
    vf_stride: int
    vfs: tuple[VirtualFunction, ...]


def find_vgpu_pfs(tree: SysfsTree) -> list[PhysicalFunction]:
    """Every NVIDIA GPU PF with SR-IOV under ``bus/pci/devices``, sorted by address.

    Also those that cannot host vGPUs as they are (bound to another driver: passed through
    whole; ``sriov_vf_device`` 0): the planner must see them to leave them alone, with a reason,
    rather than call them missing.
    """
    found = []
    names = [name for name in tree.list_dir(PCI_DEVICES) if PciAddress.is_valid(name)]
    paths = tree.resolve_many(f"{PCI_DEVICES}/{name}" for name in names)
    for name, path in zip(names, paths, strict=True):
        # A VF (it has physfn) is read through its PF: ruled out first, by one lookup, before
        # its vendor and class are read (a GPU host's devices are mostly VFs).
        if tree.exists(f"{path}/physfn"):
            continue
        if _hex(tree, f"{path}/vendor") != NVIDIA_VENDOR_ID:
            continue
        pci_class = parse_class(
            tree.read_text(f"{path}/class"), source=tree.describe(f"{path}/class")
        )
        if not is_gpu_class(pci_class):
            continue
        entries = set(tree.list_dir(path))
        total_vfs = _int(tree, f"{path}/sriov_totalvfs") if "sriov_totalvfs" in entries else None
        vf_device = _hex(tree, f"{path}/sriov_vf_device") if "sriov_vf_device" in entries else None
        if not is_nvidia_sriov_gpu(NVIDIA_VENDOR_ID, pci_class, False, total_vfs):
            continue
        found.append(
            _read_pf(
                tree,
                PciAddress.parse(name),
                path,
                entries,
                total_vfs=total_vfs or 0,
                vf_device=vf_device or "",
            )
        )
    found.sort(key=lambda pf: pf.address)
    return found


def _read_pf(
    tree: SysfsTree,
    address: PciAddress,
    path: str,
    entries: set[str],
    *,
    total_vfs: int,
    vf_device: str,
) -> PhysicalFunction:
    links = virtfn_links(list(entries))
    vf_paths = tree.resolve_many(f"{path}/{link}" for _, link in links)
    vfs = [
        VirtualFunction(index, _address(tree, vf_path, link=f"{path}/{link}"), vf_path)
        for (index, link), vf_path in zip(links, vf_paths, strict=True)
    ]
    driver = tree.read_link(f"{path}/driver") if "driver" in entries else None
    return PhysicalFunction(
        address=address,
        path=path,
        vendor_id=NVIDIA_VENDOR_ID,
        device_id=_hex(tree, f"{path}/device"),
        subsystem_vendor_id=_hex(tree, f"{path}/subsystem_vendor")
        if "subsystem_vendor" in entries
        else "",
        subsystem_device_id=_hex(tree, f"{path}/subsystem_device")
        if "subsystem_device" in entries
        else "",
        driver=link_basename(driver) if driver else "",
        vf_device=vf_device,
        total_vfs=total_vfs,
        num_vfs=_int(tree, f"{path}/sriov_numvfs") if "sriov_numvfs" in entries else len(vfs),
        vf_offset=_int(tree, f"{path}/sriov_offset") if "sriov_offset" in entries else 0,
        vf_stride=_int(tree, f"{path}/sriov_stride") if "sriov_stride" in entries else 1,
        vfs=tuple(vfs),
    )


def _address(tree: SysfsTree, path: str, *, link: str) -> PciAddress:
    name = link_basename(path)
    if not PciAddress.is_valid(name):
        raise ObserveError(
            f"{tree.describe(link)} links to '{excerpt(name)}', which is not a PCI address"
        )
    return PciAddress.parse(name)


def _hex(tree: SysfsTree, rel: str) -> str:
    return parse_hex_id(tree.read_text(rel), source=tree.describe(rel))


def _int(tree: SysfsTree, rel: str) -> int:
    return parse_int(tree.read_text(rel), source=tree.describe(rel))
