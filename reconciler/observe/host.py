"""Observe one host: sysfs (and the hold probe) in, an :class:`Inventory` out.

Composes the PF discovery (``pci.py``), the interface readers (``mdev.py``; a ``vfio.py`` is
one more entry in :func:`_interface_readers`) and the hold probe (``holds.py``), and turns
every OS error into one clear :class:`ObserveError` line. A device removed while we scan
(``sriov-manage`` running concurrently) makes a file vanish: the scan is retried once, then
reported.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from reconciler.catalog import Catalog
from reconciler.model import Gpu, Interface, Inventory, ObserveError, Vf
from reconciler.observe.holds import HoldProbe
from reconciler.observe.interfaces import GpuReading, InterfaceReader, VfReading
from reconciler.observe.mdev import MdevReader
from reconciler.observe.pci import PCI_DEVICES, PhysicalFunction, find_vgpu_pfs
from reconciler.observe.sysfs import SysfsTree

#: uuid → IOMMU group (``None`` when the vGPU has none): what the hold probe is asked about.
IommuGroups = dict[str, str | None]


class SysfsChangedError(ObserveError):
    """The tree changed under two scans in a row; running again later should succeed."""

    transient = True


def observe_host(
    sysfs_root: Path,
    *,
    node: str,
    catalog: Catalog,
    hold_probe: HoldProbe | None = None,
) -> Inventory:
    """Every NVIDIA SR-IOV vGPU GPU under ``sysfs_root``, with its VFs, types and vGPUs.

    Without a ``hold_probe`` no vGPU is reported in use: callers on a real host pass
    ``ProcfsHoldProbe()``, the simulator passes its own.
    """
    tree = _open_tree(sysfs_root)
    vanished: OSError | None = None
    for _attempt in range(2):
        try:
            # IOMMU groups are read always: one link per vGPU, and the device plugin needs them.
            inventory, groups = _scan(tree, node=node, catalog=catalog, groups=True)
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
    if hold_probe is None or not groups:
        return inventory
    return _mark_held(inventory, hold_probe.held(groups))


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
    tree: SysfsTree, *, node: str, catalog: Catalog, groups: bool
) -> tuple[Inventory, IommuGroups]:
    readers = _interface_readers(tree, iommu_groups=groups)
    gpus: list[Gpu] = []
    notes: list[str] = []
    iommu_groups: IommuGroups = {}
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
                iommu_groups[vf.vgpu.uuid] = vf.iommu_group
        gpus.append(_gpu(pf, reading, catalog))
    inventory = Inventory(
        node=node, gpus=tuple(gpus), sysfs_root=str(tree.root), notes=tuple(notes)
    )
    return inventory, iommu_groups


def _interface_readers(tree: SysfsTree, *, iommu_groups: bool) -> tuple[InterfaceReader, ...]:
    """One reader per host interface, asked in this order; the first that knows a GPU wins."""
    return (MdevReader(tree, iommu_groups=iommu_groups),)


def _read_interfaces(readers: tuple[InterfaceReader, ...], pf: PhysicalFunction) -> GpuReading:
    for reader in readers:
        reading = reader.read_gpu(pf)
        if reading is not None:
            return reading
    notes: tuple[str, ...] = ()
    if pf.vfs:
        # VFs exist but expose no interface we read: the driver is still binding them, or they
        # use NVIDIA's vendor-specific VFIO interface, which this version does not read yet.
        notes = ("VFs expose no mdev_supported_types: no vGPU types can be read",)
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
                vgpu=replace(r.vgpu, iommu_group=r.iommu_group or "") if r.vgpu else None,
                creatable=r.creatable,
            )
            for vf, r in zip(pf.vfs, reading.vfs, strict=True)
        ),
        types=reading.types,
        driver=pf.driver,
    )


def _mark_held(inventory: Inventory, holders: dict[str, str]) -> Inventory:
    if not holders:
        return inventory
    gpus = []
    for gpu in inventory.gpus:
        vfs = tuple(
            replace(vf, vgpu=replace(vf.vgpu, in_use=True, holder=holders[vf.vgpu.uuid]))
            if vf.vgpu is not None and vf.vgpu.uuid in holders
            else vf
            for vf in gpu.vfs
        )
        gpus.append(replace(gpu, vfs=vfs))
    return replace(inventory, gpus=tuple(gpus))
