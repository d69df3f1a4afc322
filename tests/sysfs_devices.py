"""Test helper: a small sysfs tree in the kernel's layout, for the confined writer's tests.

One NVIDIA GPU (PF ``0000:08:00.0``) with one VF (``0000:08:00.4``) that offers the mdev type
``nvidia-745`` and hosts the vGPU :data:`UUID`, and an Intel NIC (``0000:03:00.0``) beside it,
laid out as Linux lays them out: devices under ``devices/pci0000:00/<root port>/``,
``bus/pci/devices/<address> -> ../../../devices/…``, ``<VF>/physfn -> ../<PF>``, the vGPU a
directory under its VF reached through ``bus/mdev/devices/<uuid>``, and every PCI function
with the ``remove`` attribute pci-sysfs gives it (writing 1 there hot-unplugs the device).
"""

from __future__ import annotations

import os
from pathlib import Path

from reconciler.apply import SysfsDevice
from reconciler.model import PciAddress

GPU = PciAddress.parse("0000:08:00.0")
VF = PciAddress.parse("0000:08:00.4")
OTHER_VF = PciAddress.parse("0000:08:00.5")
NIC = PciAddress.parse("0000:03:00.0")
UUID = "5adb8e42-c29a-5705-8ae0-584ba08668af"
TYPE = "nvidia-745"

#: Where each device lives, relative to the root.
GPU_DIR = f"devices/pci0000:00/0000:00:02.0/{GPU}"
VF_DIR = f"devices/pci0000:00/0000:00:02.0/{VF}"
OTHER_VF_DIR = f"devices/pci0000:00/0000:00:02.0/{OTHER_VF}"
NIC_DIR = f"devices/pci0000:00/0000:00:01.0/{NIC}"
VGPU_DIR = f"{VF_DIR}/{UUID}"

REMOVE = f"bus/mdev/devices/{UUID}/remove"
CREATE = f"bus/pci/devices/{VF}/mdev_supported_types/{TYPE}/create"
#: The devices the two writes above are for.
THE_VGPU = SysfsDevice(GPU, VF, UUID)
THE_VF = SysfsDevice(GPU, VF)


def link(root: Path, at: str, target: str) -> None:
    """``root/at`` becomes a relative link to ``root/target`` (both relative to the root)."""
    path = root / at
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(os.path.relpath(root / target, path.parent))


def device_tree(root: Path) -> Path:
    """Build the tree under ``root`` (returned); every attribute empty."""
    for d in (GPU_DIR, VF_DIR, OTHER_VF_DIR, NIC_DIR):
        (root / d).mkdir(parents=True)
        (root / d / "remove").write_text("")
        link(root, f"bus/pci/devices/{Path(d).name}", d)
    for vf in (VF_DIR, OTHER_VF_DIR):
        link(root, f"{vf}/physfn", GPU_DIR)
        (root / vf / "mdev_supported_types" / TYPE).mkdir(parents=True)
        (root / vf / "mdev_supported_types" / TYPE / "create").write_text("")
    (root / VGPU_DIR).mkdir()
    (root / VGPU_DIR / "remove").write_text("")
    link(root, f"bus/mdev/devices/{UUID}", VGPU_DIR)
    return root
