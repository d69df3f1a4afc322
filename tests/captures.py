"""Sysfs trees rebuilt from public captures of real NVIDIA vGPU hosts (``tests/fixtures/hosts``).

A umockdev record (``umockdev-record``'s text format: ``P:`` device path, ``A:`` attribute,
``L:`` link, ``E:`` uevent property, ``N:`` device node) is turned back into the directories,
files and symlinks it was read from, plus the class and bus links the kernel keeps for each
device (``bus/pci/devices``, ``bus/mdev/devices``, ``class/vfio``). This is test scaffolding,
deliberately independent of the simulator: the observer under test meets the real layout.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

HOSTS = Path(__file__).resolve().parent / "fixtures" / "hosts"


@dataclass
class Record:
    path: str  # "/devices/pci0000:00/0000:00:03.0/0000:08:00.0"
    attributes: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)


def _unescape(value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_umockdev(text: str) -> list[Record]:
    records: list[Record] = []
    for block in text.split("\n\n"):
        record: Record | None = None
        for line in block.splitlines():
            kind, _, rest = line.partition(": ")
            if kind == "P":
                record = Record(rest)
                records.append(record)
            elif record is None:
                continue
            elif kind == "A":
                name, _, value = rest.partition("=")
                record.attributes[name] = _unescape(value)
            elif kind == "L":
                name, _, target = rest.partition("=")
                record.links[name] = target
            elif kind == "E":
                key, _, value = rest.partition("=")
                record.properties[key] = value
    return records


def build_umockdev_tree(records: list[Record], root: Path) -> None:
    """Write ``records`` under ``root`` (a sysfs root), with the bus and class links."""
    for rel in ("bus/pci/devices", "bus/mdev/devices", "class/vfio", "kernel/iommu_groups"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    for record in records:
        device = root / record.path.lstrip("/")
        device.mkdir(parents=True, exist_ok=True)
        for name, value in record.attributes.items():
            file = device / name
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(value)
        for name, target in record.links.items():
            os.symlink(target, device / name)
            if name in ("driver", "iommu_group"):
                # The link's target (a driver's or group's directory) exists on a real host.
                (device / target).resolve().mkdir(parents=True, exist_ok=True)
        name = device.name
        rel_device = record.path.lstrip("/")
        subsystem = record.properties.get("SUBSYSTEM")
        if subsystem == "pci":
            os.symlink(f"../../../{rel_device}", root / "bus/pci/devices" / name)
        elif subsystem == "mdev":
            os.symlink(f"../../../{rel_device}", root / "bus/mdev/devices" / name)
        elif subsystem == "vfio":
            os.symlink(f"../../{rel_device}", root / "class/vfio" / name)


def offer_mdev_types(root: Path, vf_path: str, types: Path, *, hosts_vgpu: bool) -> None:
    """Give a VF the ``mdev_supported_types`` captured on one VF of the same GPU.

    The driver offers the same types on every VF of a GPU: names and descriptions are copied
    as captured. ``available_instances`` is copied too, except on a VF that hosts a vGPU,
    where the driver shows 0 for every type (one vGPU per VF, docs/domain.md §3a).
    """
    base = root / vf_path.lstrip("/") / "mdev_supported_types"
    shutil.copytree(types, base)
    for type_dir in base.iterdir():
        (type_dir / "devices").mkdir()
        (type_dir / "create").write_text("")
        if hosts_vgpu:
            (type_dir / "available_instances").write_text("0\n")


def harvester_a2_host(root: Path) -> list[Record]:
    """The A2 node of ``fixtures/hosts/harvester-a2`` as a sysfs tree at ``root``."""
    capture = HOSTS / "harvester-a2"
    records = parse_umockdev((capture / "vgpu-node.umockdev").read_text())
    build_umockdev_tree(records, root)
    mdevs = [r for r in records if r.properties.get("SUBSYSTEM") == "mdev"]
    parents = {os.path.dirname(r.path) for r in mdevs}
    for record in records:
        if "physfn" in record.links:  # a VF
            offer_mdev_types(
                root,
                record.path,
                capture / "mdev_supported_types",
                hosts_vgpu=record.path in parents,
            )
    for mdev in mdevs:
        uuid = os.path.basename(mdev.path)
        type_dir = (root / mdev.path.lstrip("/") / mdev.links["mdev_type"]).resolve()
        os.symlink(f"../../../{uuid}", type_dir / "devices" / uuid)
        (root / mdev.path.lstrip("/") / "remove").write_text("")
    return records


L40S_PF = "0000:26:00.0"


def l40s_vfio_host(root: Path, *, configured: dict[int, str] | None = None) -> list[str]:
    """An L40S on the vendor-specific VFIO interface around the VF files Harvester captured.

    The PF and its 32 VFs are built from docs/domain.md §1/§4 (``10de:26b9``, ``sriov_offset`` 4,
    bound to ``nvidia``); each VF gets the captured ``nvidia/creatable_vgpu_types`` and
    ``nvidia/current_vgpu_type`` byte for byte. ``configured`` (VF index → type id) sets some
    VFs' ``current_vgpu_type``, and narrows every list the way the driver does: nothing on a
    configured VF, only the types of that framebuffer size elsewhere (the equal-size rule;
    sizes from the names). Returns the VF addresses in index order.
    """
    capture = HOSTS / "harvester-l40s-vfio" / "nvidia"
    creatable = (capture / "creatable_vgpu_types").read_text()
    configured = configured or {}
    header, *entries = creatable.splitlines(keepends=True)
    sizes = {line.split(":")[0].strip(): _gb(line) for line in entries}
    in_use = {sizes.get(type_id) for type_id in configured.values()}

    bridge = root / "devices/pci0000:20/0000:20:01.0"
    pf = bridge / L40S_PF
    pf.mkdir(parents=True)
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "bus/pci/drivers/nvidia").mkdir(parents=True, exist_ok=True)
    (root / "kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
    attributes = {
        "vendor": "0x10de\n",
        "device": "0x26b9\n",
        "subsystem_vendor": "0x10de\n",
        "subsystem_device": "0x1851\n",
        "class": "0x030200\n",
        "sriov_totalvfs": "32\n",
        "sriov_numvfs": "32\n",
        "sriov_offset": "4\n",
        "sriov_stride": "1\n",
        "sriov_vf_device": "26b9\n",
    }
    for name, value in attributes.items():
        (pf / name).write_text(value)
    os.symlink("../../../../bus/pci/drivers/nvidia", pf / "driver")
    os.symlink(
        f"../../../devices/pci0000:20/0000:20:01.0/{L40S_PF}", root / "bus/pci/devices" / L40S_PF
    )
    addresses = []
    for index in range(32):
        function = 4 + index
        address = f"0000:26:{function // 8:02x}.{function % 8}"
        addresses.append(address)
        vf = bridge / address
        (vf / "nvidia").mkdir(parents=True)
        for name, value in {
            **attributes,
            "device": "0x26b9\n",
            "subsystem_device": "0x0000\n",
        }.items():
            if not name.startswith("sriov"):
                (vf / name).write_text(value)
        os.symlink(f"../{L40S_PF}", vf / "physfn")
        os.symlink("../../../../bus/pci/drivers/nvidia", vf / "driver")
        group = root / "kernel/iommu_groups" / str(200 + index)
        group.mkdir()
        os.symlink(f"../../../kernel/iommu_groups/{200 + index}", vf / "iommu_group")
        os.symlink(f"../{address}", pf / f"virtfn{index}")
        os.symlink(
            f"../../../devices/pci0000:20/0000:20:01.0/{address}",
            root / "bus/pci/devices" / address,
        )
        if index in configured:
            (vf / "nvidia/current_vgpu_type").write_text(f"{configured[index]}\n")
            (vf / "nvidia/creatable_vgpu_types").write_text(header)
        elif configured:
            narrowed = [line for line in entries if _gb(line) in in_use]
            (vf / "nvidia/creatable_vgpu_types").write_text(header + "".join(narrowed))
        else:
            shutil.copyfile(capture / "creatable_vgpu_types", vf / "nvidia/creatable_vgpu_types")
        if index not in configured:
            shutil.copyfile(capture / "current_vgpu_type", vf / "nvidia/current_vgpu_type")
    return addresses


def _gb(line: str) -> int | None:
    """The framebuffer size a creatable_vgpu_types line's name gives (``…-8Q`` → 8)."""
    tail = line.rsplit("-", 1)[-1].strip()
    digits = "".join(ch for ch in tail if ch.isdigit())
    return int(digits) if digits else None
