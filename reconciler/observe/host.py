"""Observe one host: sysfs (and the hold probe) in, an :class:`Inventory` out.

Composes the PF discovery (``pci.py``), the interface readers (``mdev.py``, and ``vfio.py`` for
NVIDIA's vendor-specific interface, read only) and the hold probe (``holds.py``), and turns
every OS error into one clear :class:`ObserveError` line. A device removed while we scan
(``sriov-manage`` running concurrently) makes a file vanish: the scan is retried once, then
reported.
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.catalog import Catalog
from reconciler.model import (
    UNKNOWN_HOLDER,
    VGPU,
    Gpu,
    Interface,
    Inventory,
    ObserveError,
    PciAddress,
    TypeNames,
    Vf,
)
from reconciler.model.record import replace
from reconciler.observe.holds import DeviceNodes, HolderScan, HoldProbe
from reconciler.observe.interfaces import GpuReading, InterfaceReader, VfReading, device_nodes
from reconciler.observe.mdev import MdevReader
from reconciler.observe.parse import is_mdev_uuid
from reconciler.observe.pci import PCI_DEVICES, PhysicalFunction, find_vgpu_pfs
from reconciler.observe.sysfs import SysfsTree
from reconciler.observe.vfio import VendorVfioReader

#: vGPU id → the device nodes a VM could hold it through: what the hold probe is asked about.
VgpuNodes = dict[str, DeviceNodes]


class SysfsChangedError(ObserveError):
    """The tree changed under two scans in a row; running again later should succeed."""

    transient = True


def observe_host(
    sysfs_root: Path,
    *,
    node: str,
    catalog: Catalog,
    hold_probe: HoldProbe | None = None,
    assume_no_hidden_holders: bool = False,
    known_types: TypeNames | None = None,
    availability: bool = True,
) -> Inventory:
    """Every NVIDIA SR-IOV vGPU GPU under ``sysfs_root``, with its VFs, types and vGPUs.

    Without ``availability`` the mdev VFs' creatable sets are not read
    (:attr:`Inventory.vf_availability`): for a plan that has no cluster to show them to.

    ``known_types`` names the vfio type ids vgpuctl configured under the running driver (its
    record in the state directory): a type in use that no VF lists any more is named from it.

    Without a ``hold_probe`` no vGPU is reported in use: callers on a real host pass
    ``ProcfsHoldProbe()``, the simulator passes its own. When the probe cannot see every
    process of the host, or one it sees keeps a VFIO device fd whose device it cannot tell
    (``HolderScan.unattributed``: Linux before 6.18), every vGPU a process could hold counts
    as in use by an unknown holder (the reason in the holder), unless
    ``assume_no_hidden_holders``: the operator's word that no process vgpuctl cannot see (or
    attribute) holds one (``--unsafe-assume-no-hidden-holders``), kept as a note.
    """
    vanished: OSError | None = None
    for _attempt in range(2):
        try:
            # A tree per attempt: it holds the root open, and the root may have been replaced.
            inventory, nodes = _scan(
                _open_tree(sysfs_root),
                node=node,
                catalog=catalog,
                known_types=known_types or {},
                availability=availability,
            )
            break
        except (FileNotFoundError, NotADirectoryError) as exc:
            vanished = exc
        except PermissionError as exc:
            raise ObserveError(f"permission denied reading {exc.filename} (run as root?)") from None
        except OSError as exc:
            raise ObserveError(f"cannot read {exc.filename}: {exc.strerror}") from None
    else:
        what = vanished.filename if vanished is not None else sysfs_root
        raise SysfsChangedError(
            f"{what} disappeared while scanning {sysfs_root}, twice: devices are changing "
            "(is sriov-manage running?); try again"
        )
    if hold_probe is None:
        return inventory
    openable = {vgpu_id: n for vgpu_id, n in nodes.items() if n.openable}
    if not openable:
        return inventory
    scan = hold_probe.scan(openable)
    if scan.blind is not None:
        if assume_no_hidden_holders:
            note = (
                f"holders not fully checked ({scan.blind}): assumed that no process vgpuctl "
                "cannot see holds a vGPU (--unsafe-assume-no-hidden-holders)"
            )
            scan = HolderScan(held=scan.held)
        elif scan.unattributed:
            note = (
                f"{scan.blind}: it may hold any vGPU, so every vGPU counts as in use and none "
                "is removed or changed until it closes that fd (Linux 6.18 and later name the "
                "device there); pass --unsafe-assume-no-hidden-holders if it holds no vGPU"
            )
        else:
            note = (
                f"vgpuctl cannot see every process of the host ({scan.blind}): every vGPU "
                "counts as in use, so none is removed or changed; run vgpuctl in the host's PID "
                "namespace, or pass --unsafe-assume-no-hidden-holders if no VM can hide from it"
            )
        inventory = replace(inventory, notes=(*inventory.notes, note))
    return _mark_held(inventory, scan, openable)


def vgpu_holder(
    sysfs_root: Path,
    *,
    vf: PciAddress,
    uuid: str,
    hold_probe: HoldProbe,
    assume_no_hidden_holders: bool = False,
) -> str | None:
    """Which process holds the vGPU ``uuid`` on ``vf`` now, for the executor to ask right before
    it removes that vGPU: one vGPU's device nodes and one probe scan, never a host scan.
    ``uuid`` is an mdev UUID, or on NVIDIA's vendor-specific VFIO interface the VF's address:
    the VF is the vGPU there, held through the VF's own group or cdev (docs/domain.md §3b, §9).

    ``unknown: …`` (it counts as held) when the probe cannot see every process of the host, or
    one keeps a VFIO device fd it cannot attribute, unless ``assume_no_hidden_holders``, as
    :func:`observe_host` decides. None when no process
    holds it, when nothing could open it, or when it is gone.
    """
    whole_vf = uuid == str(vf)
    if not whole_vf and not is_mdev_uuid(uuid):
        raise ObserveError(f"not an mdev UUID, nor the VF's address: {uuid!r}")
    tree = SysfsTree(sysfs_root)
    try:
        device = tree.resolve(f"{PCI_DEVICES}/{vf}")
        if not whole_vf:
            device = f"{device}/{uuid}"
        if not tree.exists(device):
            return None
        nodes = device_nodes(tree, device)
    except (FileNotFoundError, NotADirectoryError):
        return None  # removed meanwhile: nothing can hold it any more
    except OSError as exc:
        raise ObserveError(
            f"cannot read the device nodes of vGPU {uuid} on {vf}: {exc.strerror or exc}"
        ) from None
    if not nodes.openable:
        return None
    scan = hold_probe.scan({uuid: nodes})
    holder = scan.held.get(uuid)
    if holder is None and scan.blind is not None and not assume_no_hidden_holders:
        holder = unknown_holder(scan)
    return holder


def unknown_holder(scan: HolderScan) -> str:
    """The holder of a vGPU a blind scan did not find held: ``unknown: …why…``."""
    if scan.unattributed:
        return f"{UNKNOWN_HOLDER}: {scan.blind}"
    return f"{UNKNOWN_HOLDER}: cannot see the host's processes ({scan.blind})"


def _open_tree(sysfs_root: Path) -> SysfsTree:
    if not os.path.exists(sysfs_root):
        raise ObserveError(f"sysfs root {sysfs_root} does not exist")
    if not os.path.isdir(sysfs_root):
        raise ObserveError(f"sysfs root {sysfs_root} is not a directory")
    try:
        os.listdir(sysfs_root)
    except PermissionError:
        raise ObserveError(f"cannot read sysfs root {sysfs_root}: permission denied") from None
    except OSError as exc:
        raise ObserveError(f"cannot read sysfs root {sysfs_root}: {exc.strerror}") from None
    tree = SysfsTree(sysfs_root)
    if not os.path.isdir(tree.path(PCI_DEVICES)):
        raise ObserveError(f"{sysfs_root} does not look like a sysfs tree: it has no {PCI_DEVICES}")
    return tree


def _scan(
    tree: SysfsTree, *, node: str, catalog: Catalog, known_types: TypeNames, availability: bool
) -> tuple[Inventory, VgpuNodes]:
    readers = _interface_readers(tree, catalog, known_types, availability)
    gpus: list[Gpu] = []
    notes: list[str] = []
    nodes: VgpuNodes = {}
    for pf in find_vgpu_pfs(tree):
        reading = _read_interfaces(readers, pf)
        notes.extend(f"GPU {pf.address}: {n}" for n in reading.notes)
        if pf.num_vfs != len(pf.vfs):
            notes.append(
                f"GPU {pf.address}: sriov_numvfs is {pf.num_vfs} but {len(pf.vfs)} virtfn "
                "links exist (VFs still appearing or going away?)"
            )
        for vf in reading.vfs:
            if vf.vgpu is not None:
                nodes[vf.vgpu.uuid] = vf.nodes
        gpus.append(_gpu(pf, reading, catalog))
    inventory = Inventory(
        node=node,
        gpus=tuple(gpus),
        sysfs_root=str(tree.root),
        notes=tuple(notes),
        mdev_bus=tree.exists("bus/mdev"),
        vf_availability=availability,
    )
    return inventory, nodes


def _interface_readers(
    tree: SysfsTree, catalog: Catalog, known_types: TypeNames, availability: bool
) -> tuple[InterfaceReader, ...]:
    """One reader per host interface, asked in this order; the first that knows a GPU wins.
    (The vfio interface reads its creatable lists whatever ``availability`` says: they are
    where its types are named.)"""
    return (
        MdevReader(tree, availability=availability),
        VendorVfioReader(tree, catalog, known_types),
    )


def _read_interfaces(readers: tuple[InterfaceReader, ...], pf: PhysicalFunction) -> GpuReading:
    for reader in readers:
        reading = reader.read_gpu(pf)
        if reading is not None:
            return reading
    notes: tuple[str, ...] = ()
    if pf.vfs:
        # VFs exist but expose neither interface: the vGPU manager is not running, or the VFs
        # were enabled a moment ago and the driver has not set them up yet.
        notes = (
            "its VFs expose no vGPU interface (no mdev_supported_types, no "
            "nvidia/creatable_vgpu_types): is the NVIDIA vGPU manager running?",
        )
    return GpuReading(Interface.NONE, vfs=tuple(VfReading() for _ in pf.vfs), notes=notes)


def _gpu(pf: PhysicalFunction, reading: GpuReading, catalog: Catalog) -> Gpu:
    model = catalog.model_for_ids(
        pf.vendor_id, pf.device_id, pf.subsystem_vendor_id, pf.subsystem_device_id
    )
    return Gpu(
        address=pf.address,
        vendor_id=pf.vendor_id,
        device_id=pf.device_id,
        subsystem_vendor_id=pf.subsystem_vendor_id,
        subsystem_device_id=pf.subsystem_device_id,
        model=model.name if model else None,
        interface=reading.interface,
        total_vfs=pf.total_vfs,
        num_vfs=pf.num_vfs,
        vf_offset=pf.vf_offset,
        vf_stride=pf.vf_stride,
        vfs=tuple(
            Vf(
                address=vf.address,
                index=vf.index,
                vgpu=replace(r.vgpu, iommu_group=r.nodes.group or "") if r.vgpu else None,
                creatable=r.creatable,
            )
            for vf, r in zip(pf.vfs, reading.vfs, strict=True)
        ),
        types=reading.types,
        driver=pf.driver,
        vf_device=pf.vf_device,
        placements=reading.placements,
    )


def _mark_held(inventory: Inventory, scan: HolderScan, openable: VgpuNodes) -> Inventory:
    """Mark the held vGPUs; when the scan is blind, every openable one it did not find held."""
    if not scan.held and scan.blind is None:
        return inventory
    unknown = unknown_holder(scan)

    def holder(vgpu: VGPU) -> str | None:
        found = scan.held.get(vgpu.uuid)
        if found is None and not vgpu.in_use and scan.blind is not None and vgpu.uuid in openable:
            return unknown
        return found

    gpus = []
    for gpu in inventory.gpus:
        vfs = []
        for vf in gpu.vfs:
            who = holder(vf.vgpu) if vf.vgpu is not None else None
            if vf.vgpu is not None and who is not None:
                vfs.append(replace(vf, vgpu=replace(vf.vgpu, in_use=True, holder=who)))
            else:
                vfs.append(vf)
        gpus.append(replace(gpu, vfs=tuple(vfs)))
    return replace(inventory, gpus=tuple(gpus))
