"""Renders the simulated sysfs tree: the kernel's layout (docs/domain.md §1, §3), not its rules.

Devices live under ``devices/pci<dom>:00/<root port>/<addr>/``; ``bus/pci/devices``,
``class/mdev_bus``, ``bus/mdev/devices``, ``virtfn<N>``/``physfn``, ``driver`` and
``iommu_group`` are relative symlinks, spelt as the kernel spells them (``virtfn0 ->
../0000:08:00.4``). Files hold what the kernel prints (``0x10de``, ``16``) with its modes
(attributes 0444, ``create``/``remove`` 0200).

Readers must never see half a change: a VF or mdev directory is complete before any link to it
appears, an mdev directory appears by one rename, and rewritten attributes are replaced
atomically. Only the emulated driver (``driver.py``) and host creation call this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence

from reconciler.model import PciAddress
from reconciler.model.record import field, record
from reconciler.sim.rules import SimModel, SimType

RO = 0o444
RW = 0o644
WO = 0o200

NVIDIA_DRIVER = "bus/pci/drivers/nvidia"
MDEV_DRIVER = "bus/mdev/drivers/nvidia-vgpu-vfio"
DRIVER_VERSION = "550.127.06"
VGPU_CLASS = 0x030200  # 3D controller: how NVIDIA data-centre GPUs and their VFs report
#: The vfio cdev's major number: dynamic on a real host (``vfio-dev`` in /proc/devices).
VFIO_CDEV_MAJOR = 511


def relative(link: str, target: str) -> str:
    """The shortest relative path from the directory holding ``link`` to ``target``."""
    a = link.split("/")[:-1]
    b = target.split("/")
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return "/".join([".."] * (len(a) - i) + b[i:])


def host_bridge_dir(address: PciAddress) -> str:
    return f"devices/pci{address.domain:04x}:00"


def device_dir(address: str, root_port: str) -> str:
    """Where a function lives: below its root port, or directly below the host bridge."""
    a = PciAddress.parse(address)
    if not root_port:
        return f"{host_bridge_dir(a)}/{address}"
    return f"{host_bridge_dir(a)}/{root_port}/{address}"


def numa_node(address: PciAddress) -> int:
    # Two sockets, each with half the buses: enough for NUMA-aware code to have work to do.
    return 0 if address.bus < 0x80 else 1


@record(frozen=True, slots=True)
class PciFunction:
    """One PCI function to render: ids, driver, IOMMU group and any extra files or links."""

    address: str
    root_port: str  # "" for a root port (it hangs off the host bridge)
    vendor: int
    device: int
    class_code: int
    subsystem_vendor: int
    subsystem_device: int
    revision: int
    driver: str  # sysfs path of the driver dir, e.g. "bus/pci/drivers/nvidia"; "" for none
    iommu_group: int
    files: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # name → (text, mode)
    links: Mapping[str, str] = field(default_factory=dict)  # name → target (root-relative)

    @property
    def dir(self) -> str:
        return device_dir(self.address, self.root_port)


class SysfsTree:
    """File operations on one simulated root, with paths relative to it (``/``-separated)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    def abs(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    # --- primitives -----------------------------------------------------------------------

    def mkdir(self, rel: str) -> None:
        os.makedirs(self.abs(rel), exist_ok=True)

    def put(self, rel: str, text: str, mode: int = RO) -> None:
        write_file(self.abs(rel), text, mode)

    def replace(self, rel: str, text: str, mode: int = RO) -> None:
        """Rewrite a file atomically, so a concurrent reader sees the old or the new text."""
        path = self.abs(rel)
        head, tail = os.path.split(path)
        tmp = f"{head}/.{tail}.{os.getpid()}.tmp"
        write_file(tmp, text, mode)
        os.replace(tmp, path)

    def link(self, rel: str, target: str, *, at: str | None = None) -> None:
        """Make ``rel`` a relative symlink to root-relative ``target``."""
        path = at or self.abs(rel)
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(relative(rel, target), path)

    def unlink(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.abs(rel))

    def rmtree(self, rel: str) -> None:
        """Remove a directory so that it vanishes at once: rename it away, then delete."""
        path = self.abs(rel)
        if not os.path.lexists(path):
            return
        head, tail = os.path.split(path)
        gone = f"{head}/.{tail}.{os.getpid()}.gone"
        os.rename(path, gone)
        shutil.rmtree(gone)

    # --- skeleton and plain functions -----------------------------------------------------

    def skeleton(self, drivers: Sequence[str], *, mdev: bool = True) -> None:
        """The host's fixed directories. ``mdev``: the kernel's mdev core is loaded (its bus
        and class), as when a GPU shows the mdev interface; a host whose GPUs all show NVIDIA's
        vendor-specific VFIO interface does without it."""
        for rel in (
            "bus/pci/devices",
            *(("bus/mdev/devices", MDEV_DRIVER, "class/mdev_bus") if mdev else ()),
            "class/vfio-dev",
            "kernel/iommu_groups",
            "module/nvidia",
            "module/nvidia_vgpu_vfio",
            *drivers,
        ):
            self.mkdir(rel)
        self.put("module/nvidia/version", f"{DRIVER_VERSION}\n")

    def iommu_group(self, number: int, member: str, member_dir: str) -> None:
        group = f"kernel/iommu_groups/{number}"
        self.mkdir(f"{group}/devices")
        self.link(f"{group}/devices/{member}", member_dir)

    def drop_iommu_group(self, number: int) -> None:
        self.rmtree(f"kernel/iommu_groups/{number}")

    def function(self, fn: PciFunction, *, pci_link: bool = True) -> None:
        """Render a PCI function's directory, then the links that make it visible."""
        d = fn.dir
        self.mkdir(d)
        for name, (text, mode) in (
            ("vendor", (f"0x{fn.vendor:04x}\n", RO)),
            ("device", (f"0x{fn.device:04x}\n", RO)),
            ("subsystem_vendor", (f"0x{fn.subsystem_vendor:04x}\n", RO)),
            ("subsystem_device", (f"0x{fn.subsystem_device:04x}\n", RO)),
            ("class", (f"0x{fn.class_code:06x}\n", RO)),
            ("revision", (f"0x{fn.revision:02x}\n", RO)),
            ("numa_node", (f"{numa_node(PciAddress.parse(fn.address))}\n", RO)),
            *fn.files.items(),
        ):
            self.put(f"{d}/{name}", text, mode)
        self.link(f"{d}/subsystem", "bus/pci")
        self.link(f"{d}/iommu_group", f"kernel/iommu_groups/{fn.iommu_group}")
        for name, target in fn.links.items():
            self.link(f"{d}/{name}", target)
        self.iommu_group(fn.iommu_group, fn.address, d)
        if fn.driver:
            self.link(f"{d}/driver", fn.driver)
            self.link(f"{fn.driver}/{fn.address}", d)
        if pci_link:
            self.link(f"bus/pci/devices/{fn.address}", d)

    def rebind(self, address: str, root_port: str, *, old: str, new: str) -> None:
        """Unbind a function from driver ``old`` and bind it to ``new`` (driver names)."""
        d = device_dir(address, root_port)
        self.unlink(f"bus/pci/drivers/{old}/{address}")
        self.link(f"{d}/driver", f"bus/pci/drivers/{new}")
        self.link(f"bus/pci/drivers/{new}/{address}", d)

    def drop_function(self, fn_dir: str, address: str, driver: str) -> None:
        """Remove a function: links to it first, then its directory."""
        self.unlink(f"bus/pci/devices/{address}")
        if driver:
            self.unlink(f"{driver}/{address}")
        self.rmtree(fn_dir)

    # --- GPUs -----------------------------------------------------------------------------

    def gpu_pf(
        self,
        address: str,
        root_port: str,
        model: SimModel,
        iommu_group: int,
        *,
        driver: str = "nvidia",
        vgpu_vfs: bool = True,
    ) -> None:
        """A GPU's PF, bound to ``driver`` (``vfio-pci``: passed through whole);
        ``vgpu_vfs`` False makes its ``sriov_vf_device`` 0 (SR-IOV, but no vGPU VFs)."""
        self.function(
            PciFunction(
                address=address,
                root_port=root_port,
                vendor=model.vendor,
                device=model.device,
                class_code=VGPU_CLASS,
                subsystem_vendor=model.subsystem_vendor,
                subsystem_device=model.subsystem_device,
                revision=0xA1,
                driver=f"bus/pci/drivers/{driver}",
                iommu_group=iommu_group,
                files={
                    "sriov_totalvfs": (f"{model.vfs}\n", RO),
                    "sriov_numvfs": ("0\n", RW),
                    "sriov_offset": (f"{model.vf_offset}\n", RO),
                    "sriov_stride": (f"{model.vf_stride}\n", RO),
                    # The kernel prints this one as bare hex ("%x"), unlike vendor/device.
                    "sriov_vf_device": (f"{model.vf_device if vgpu_vfs else 0:x}\n", RO),
                },
            )
        )

    def gpu_vfs(
        self,
        *,
        pf: str,
        root_port: str,
        model: SimModel,
        vfs: Sequence[tuple[str, int]],
        interface: str,
        creatable: Mapping[str, frozenset[str]],
    ) -> None:
        """Enable SR-IOV: VF dirs, then their links, then ``virtfn<N>``, then ``sriov_numvfs``."""
        pf_dir = device_dir(pf, root_port)
        for address, group in vfs:
            fn = PciFunction(
                address=address,
                root_port=root_port,
                vendor=model.vendor,
                device=model.vf_device,
                class_code=VGPU_CLASS,
                subsystem_vendor=model.subsystem_vendor,
                subsystem_device=model.subsystem_device,
                revision=0xA1,
                driver=NVIDIA_DRIVER,
                iommu_group=group,
                links={"physfn": pf_dir},
            )
            # The VF's own content goes in before the function's links make it visible.
            vf_dir = fn.dir
            self.mkdir(vf_dir)
            if interface == "mdev":
                self.mdev_types(vf_dir, model, creatable[address])
            else:
                self.vfio_files(vf_dir, model, creatable[address], current=0)
            self.function(fn, pci_link=True)
            if interface == "mdev":
                self.link(f"class/mdev_bus/{address}", vf_dir)
        for i, (address, _) in enumerate(vfs):
            self.link(f"{pf_dir}/virtfn{i}", device_dir(address, root_port))
        self.replace(f"{pf_dir}/sriov_numvfs", f"{len(vfs)}\n", RW)

    def drop_gpu_vfs(self, *, pf: str, root_port: str, vfs: Sequence[tuple[str, int]]) -> None:
        """Disable SR-IOV: ``sriov_numvfs`` and the links go first, the VF dirs last."""
        pf_dir = device_dir(pf, root_port)
        self.replace(f"{pf_dir}/sriov_numvfs", "0\n", RW)
        for i in range(len(vfs)):
            self.unlink(f"{pf_dir}/virtfn{i}")
        for address, group in vfs:
            self.unlink(f"class/mdev_bus/{address}")
            self.drop_function(device_dir(address, root_port), address, NVIDIA_DRIVER)
            self.drop_iommu_group(group)

    def mdev_types(self, vf_dir: str, model: SimModel, open_types: frozenset[str]) -> None:
        base = self.abs(f"{vf_dir}/mdev_supported_types")
        os.mkdir(base)
        for t in model.types:
            d = f"{base}/{t.mdev_type}"
            os.mkdir(d)
            os.mkdir(f"{d}/devices")
            write_file(f"{d}/name", f"{t.name}\n", RO)
            write_file(f"{d}/description", f"{t.description}\n", RO)
            write_file(f"{d}/device_api", "vfio-pci\n", RO)
            write_file(f"{d}/available_instances", f"{int(t.name in open_types)}\n", RO)
            write_file(f"{d}/create", "", WO)

    def vfio_files(
        self, vf_dir: str, model: SimModel, open_types: frozenset[str], *, current: int
    ) -> None:
        self.mkdir(f"{vf_dir}/nvidia")
        self.put(f"{vf_dir}/nvidia/creatable_vgpu_types", creatable_text(model, open_types))
        self.put(f"{vf_dir}/nvidia/current_vgpu_type", f"{current}\n", RW)
        self.put(f"{vf_dir}/nvidia/placement_id", f"{NOT_APPLICABLE}\n")

    def vfio_placement_id(self, *, vf: str, root_port: str, placement: int | None) -> None:
        """``nvidia/placement_id``: the vGPU's placement ID, ``Not Applicable`` without one (the
        word machina's mdev reader expects; whether a VF prints it is not confirmed)."""
        text = NOT_APPLICABLE if placement is None else str(placement)
        path = f"{device_dir(vf, root_port)}/nvidia/placement_id"
        with open(self.abs(path), encoding="utf-8") as f:
            if f.read() == f"{text}\n":
                return
        self.replace(path, f"{text}\n")

    def vfio_placements(self, *, root_port: str, vfs: Sequence[str], text: str | None) -> None:
        """The model's ``nvidia/creatable_placements`` on every VF (``rules.placements_text``);
        removed (None) outside mixed-size mode."""
        for vf in vfs:
            path = f"{device_dir(vf, root_port)}/nvidia/creatable_placements"
            if text is None:
                self.unlink(path)
            else:
                self.replace(path, text)

    def update_creatable(
        self,
        *,
        root_port: str,
        model: SimModel,
        interface: str,
        before: Mapping[str, frozenset[str]],
        after: Mapping[str, frozenset[str]],
    ) -> None:
        """Rewrite only the ``available_instances`` (or type lists) that changed."""
        for vf, now in after.items():
            was = before.get(vf, frozenset())
            if now == was:
                continue
            vf_dir = device_dir(vf, root_port)
            if interface == "mdev":
                for t in model.types:
                    if (t.name in now) != (t.name in was):
                        self.replace(
                            f"{vf_dir}/mdev_supported_types/{t.mdev_type}/available_instances",
                            f"{int(t.name in now)}\n",
                        )
            else:
                self.replace(f"{vf_dir}/nvidia/creatable_vgpu_types", creatable_text(model, now))

    # --- vGPUs ----------------------------------------------------------------------------

    def mdev(
        self, *, vf: str, root_port: str, uuid: str, vgpu_type: SimType, group: int, cdev: int
    ) -> None:
        """Create an mdev: built in a hidden staging dir, renamed into place, then linked.

        Its vfio cdev appears as ``vfio-dev/vfio<cdev>`` (kernels with
        ``CONFIG_VFIO_DEVICE_CDEV``; opened as ``/dev/vfio/devices/vfio<cdev>``).
        """
        vf_dir = device_dir(vf, root_port)
        mdev_dir = f"{vf_dir}/{uuid}"
        stage = self.abs(f"{vf_dir}/.{uuid}.new")
        if os.path.lexists(stage):
            shutil.rmtree(stage)
        os.mkdir(stage)
        type_dir = f"{vf_dir}/mdev_supported_types/{vgpu_type.mdev_type}"
        # Links are computed for the final place; the staging dir sits at the same depth.
        self.link(f"{mdev_dir}/mdev_type", type_dir, at=f"{stage}/mdev_type")
        self.link(
            f"{mdev_dir}/iommu_group", f"kernel/iommu_groups/{group}", at=f"{stage}/iommu_group"
        )
        self.link(f"{mdev_dir}/driver", MDEV_DRIVER, at=f"{stage}/driver")
        self.link(f"{mdev_dir}/subsystem", "bus/mdev", at=f"{stage}/subsystem")
        write_file(f"{stage}/remove", "", WO)
        os.mkdir(f"{stage}/nvidia")
        write_file(f"{stage}/nvidia/vgpu_params", "\n", RW)
        os.makedirs(f"{stage}/vfio-dev/vfio{cdev}")
        write_file(f"{stage}/vfio-dev/vfio{cdev}/dev", f"{VFIO_CDEV_MAJOR}:{cdev}\n", RO)
        os.rename(stage, self.abs(mdev_dir))
        self.link(f"class/vfio-dev/vfio{cdev}", f"{mdev_dir}/vfio-dev/vfio{cdev}")
        self.iommu_group(group, uuid, mdev_dir)
        self.link(f"{type_dir}/devices/{uuid}", mdev_dir)
        self.link(f"{MDEV_DRIVER}/{uuid}", mdev_dir)
        self.link(f"bus/mdev/devices/{uuid}", mdev_dir)

    def detach_mdev(
        self, *, vf: str, root_port: str, uuid: str, vgpu_type: SimType | None, cdev: int | None
    ) -> None:
        """The first half of a removal, what the kernel has undone while the removal waits for
        a VM to let go (``mdev_device_remove`` → ``device_del`` → ``vfio_unregister_group_dev``):
        the ``remove`` attribute (self-removed), the ``mdev_type`` link and the type's
        ``devices/`` link, the bus and driver links, the vfio cdev. What stays: the directory
        under the VF, with its ``iommu_group`` link, until the removal completes."""
        vf_dir = device_dir(vf, root_port)
        mdev_dir = f"{vf_dir}/{uuid}"
        self.unlink(f"{mdev_dir}/remove")
        self.unlink(f"{mdev_dir}/mdev_type")
        if vgpu_type is not None:
            self.unlink(f"{vf_dir}/mdev_supported_types/{vgpu_type.mdev_type}/devices/{uuid}")
        self.unlink(f"{mdev_dir}/subsystem")
        self.unlink(f"bus/mdev/devices/{uuid}")
        self.unlink(f"{MDEV_DRIVER}/{uuid}")
        self.unlink(f"{mdev_dir}/driver")
        if cdev is not None:
            self.unlink(f"class/vfio-dev/vfio{cdev}")
            self.rmtree(f"{mdev_dir}/vfio-dev")

    def drop_mdev(
        self,
        *,
        vf: str,
        root_port: str,
        uuid: str,
        vgpu_type: SimType | None,
        group: int,
        cdev: int | None,
    ) -> None:
        vf_dir = device_dir(vf, root_port)
        self.unlink(f"bus/mdev/devices/{uuid}")
        if cdev is not None:
            self.unlink(f"class/vfio-dev/vfio{cdev}")
        self.unlink(f"{MDEV_DRIVER}/{uuid}")
        if vgpu_type is not None:
            self.unlink(f"{vf_dir}/mdev_supported_types/{vgpu_type.mdev_type}/devices/{uuid}")
        self.rmtree(f"{vf_dir}/{uuid}")
        self.drop_iommu_group(group)

    def vfio_current(self, *, vf: str, root_port: str, type_id: int) -> None:
        self.replace(f"{device_dir(vf, root_port)}/nvidia/current_vgpu_type", f"{type_id}\n", RW)


#: What ``nvidia/placement_id`` reads without a placement (gentlemanautomaton/machina's mdev
#: reader, ``filesystem/mdevfs/mediateddevice.go``).
NOT_APPLICABLE = "Not Applicable"


def write_file(path: str, text: str, mode: int) -> None:
    """Create (or truncate) a file with the given mode; sysfs attributes are tiny."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def creatable_text(model: SimModel, open_types: frozenset[str]) -> str:
    """``nvidia/creatable_vgpu_types`` as the vfio interface prints it (header only if none)."""
    lines = [f"{'ID':<6}: vGPU Name"]
    lines += [f"{t.type_id:<6}: {t.name}" for t in model.types if t.name in open_types]
    return "\n".join(lines) + "\n"
