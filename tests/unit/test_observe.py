"""The host observer on small sysfs trees built in the kernel's layout (contracts.md).

Trees are built here from the text fixtures in ``tests/fixtures/sysfs/`` (never by the
simulator: the lead tests observer and simulator together).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import jsonschema
import pytest

from reconciler.catalog import default_catalog
from reconciler.model import VGPU, Interface, Inventory, ObserveError, PciAddress
from reconciler.observe import HoldProbe, SysfsChangedError, SysfsTree, observe_host
from reconciler.observe.holds import DeviceNodes, HolderScan
from tests.captures import l40s_vfio_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "inventory.schema.json"

A2 = "0000:08:00.0"
L40S = "0000:41:00.0"
T4 = "0000:3b:00.0"
AUDIO = "0000:65:00.1"
NIC = "0000:5e:00.0"
UUID_1 = "dd6772a8-7db8-4e96-9a73-f94c389d9bc3"
UUID_2 = "5b5b7326-6bb8-48cb-a321-8fa58ccbb38c"


# --- fixture text -------------------------------------------------------------------------


def function_fixture(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """``pci/<name>``: (attribute → value, link → target)."""
    attributes: dict[str, str] = {}
    links: dict[str, str] = {}
    for line in (FIXTURES / "pci" / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if " -> " in line:
            link, target = line.split(" -> ")
            links[link] = target
        else:
            key, _, value = line.partition(":")
            attributes[key] = value
    return attributes, links


def types_fixture(name: str) -> dict[str, dict[str, str]]:
    """``mdev-types/<name>``: type id → file → value."""
    types: dict[str, dict[str, str]] = {}
    for line in (FIXTURES / "mdev-types" / name).read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        path, _, value = line.partition(":")
        type_id, _, file = path.partition("/")
        types.setdefault(type_id, {})[file] = value
    return types


# --- tree builder -------------------------------------------------------------------------


class HostTree:
    """Builds a sysfs tree the way the kernel lays it out: device directories under
    ``devices/pci0000:00/<bridge>/``, reached through ``bus/pci/devices`` symlinks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("bus/pci/devices", "bus/pci/drivers", "bus/mdev/devices", "class/mdev_bus"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self._paths: dict[str, str] = {}  # address → path relative to root
        self._next_group = 100

    def path(self, address: str) -> Path:
        return self.root / self._paths[address]

    def function(
        self,
        address: str,
        fixture: str,
        *,
        bridge: str,
        attributes: Mapping[str, str] | None = None,
        links: Mapping[str, str] | None = None,
    ) -> Path:
        attrs, fixture_links = function_fixture(fixture)
        attrs.update(attributes or {})
        fixture_links.update(links or {})
        rel = f"devices/pci0000:00/{bridge}/{address}"
        self._paths[address] = rel
        device = self.root / rel
        device.mkdir(parents=True)
        for key, value in attrs.items():
            (device / key).write_text(value + "\n")
        if "iommu_group" in fixture_links:  # a fresh group per function, as the kernel does
            fixture_links["iommu_group"] = f"../../../../kernel/iommu_groups/{self._group()}"
        for link, target in fixture_links.items():
            (device / target).resolve().parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, device / link)
            if link in ("driver", "iommu_group"):
                (device / target).resolve().mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../{rel}", self.root / "bus/pci/devices" / address)
        return device

    def gpu(
        self,
        address: str,
        pf_fixture: str = "a2-pf.txt",
        *,
        vfs: int = 0,
        types: str = "a2-vf.txt",
        vf_fixture: str = "a2-vf.txt",
        bridge: str = "0000:00:03.0",
        attributes: Mapping[str, str] | None = None,
    ) -> list[str]:
        """A GPU PF with ``vfs`` VFs enabled (each an mdev parent offering ``types``)."""
        pf = self.function(address, pf_fixture, bridge=bridge, attributes=attributes)
        (pf / "sriov_numvfs").write_text(f"{vfs}\n")
        offset = int((pf / "sriov_offset").read_text())
        stride = int((pf / "sriov_stride").read_text())
        base = PciAddress.parse(address)
        addresses = [
            str(PciAddress.from_routing_id(base.domain, base.routing_id + offset + i * stride))
            for i in range(vfs)
        ]
        # Created last-first so that the directory order differs from the index order too.
        for index in reversed(range(vfs)):
            vf_address = addresses[index]
            vf = self.function(
                vf_address, vf_fixture, bridge=bridge, links={"physfn": f"../{address}"}
            )
            os.symlink(f"../{vf_address}", pf / f"virtfn{index}")
            if types:
                self.offer_types(vf_address, types)
            os.symlink(f"../../{self._paths[vf_address]}", self.root / "class/mdev_bus" / vf.name)
        return addresses

    def offer_types(self, vf_address: str, fixture: str) -> None:
        base = self.path(vf_address) / "mdev_supported_types"
        if base.exists():
            shutil.rmtree(base)
        for type_id, files in types_fixture(fixture).items():
            d = base / type_id
            (d / "devices").mkdir(parents=True)
            for file, value in files.items():
                (d / file).write_text(value + "\n")
            (d / "create").write_text("")

    def set_available(self, vf_address: str, type_id: str, count: int) -> None:
        path = self.path(vf_address) / "mdev_supported_types" / type_id / "available_instances"
        path.write_text(f"{count}\n")

    def mdev(self, vf_address: str, uuid: str, type_id: str, *, group: int | None = None) -> Path:
        """A created vGPU, as the driver leaves it after a write to ``create``."""
        vf_rel = self._paths[vf_address]
        d = self.root / vf_rel / uuid
        d.mkdir()
        os.symlink(f"../mdev_supported_types/{type_id}", d / "mdev_type")
        group = self._group() if group is None else group
        (self.root / "kernel/iommu_groups" / str(group)).mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../../../kernel/iommu_groups/{group}", d / "iommu_group")
        (d / "remove").write_text("")
        os.symlink(f"../../../{vf_rel}/{uuid}", self.root / "bus/mdev/devices" / uuid)
        types_dir = self.root / vf_rel / "mdev_supported_types"
        if (types_dir / type_id / "devices").is_dir():
            os.symlink(f"../../../{uuid}", types_dir / type_id / "devices" / uuid)
        for t in types_dir.iterdir() if types_dir.is_dir() else ():
            (t / "available_instances").write_text("0\n")
        return d

    def remove_vf(self, pf_address: str, index: int, vf_address: str) -> None:
        """What disabling one VF does (as if ``sriov-manage`` were racing the scan)."""
        shutil.rmtree(self.path(vf_address))
        (self.root / "bus/pci/devices" / vf_address).unlink()
        (self.path(pf_address) / f"virtfn{index}").unlink()

    def _group(self) -> int:
        self._next_group += 1
        return self._next_group


@pytest.fixture
def host(tmp_path: Path) -> HostTree:
    return HostTree(tmp_path / "sys")


def mixed_host(host: HostTree) -> list[str]:
    """The seed's node, plus everything that is not ours: returns the A2's VF addresses."""
    host.gpu(L40S, "l40s-pf.txt", vfs=0, types="", bridge="0000:40:01.0")  # SR-IOV off
    vfs = host.gpu(A2, vfs=16)
    host.function(T4, "t4-pf.txt", bridge="0000:3a:00.0")
    host.function(AUDIO, "ga102-audio.txt", bridge="0000:64:00.0")
    host.function(NIC, "x710-pf.txt", bridge="0000:5d:00.0")
    for i, nic_vf in enumerate(("0000:5e:02.0", "0000:5e:02.1", "0000:5e:02.2", "0000:5e:02.3")):
        host.function(nic_vf, "x710-vf.txt", bridge="0000:5d:00.0", links={"physfn": f"../{NIC}"})
        os.symlink(f"../{nic_vf}", host.path(NIC) / f"virtfn{i}")
    return vfs


def observe(host: HostTree, *, hold_probe: HoldProbe | None = None) -> Inventory:
    return observe_host(
        host.root, node="harvester-kgd9c", catalog=default_catalog(), hold_probe=hold_probe
    )


# --- discovery ----------------------------------------------------------------------------


def test_finds_only_nvidia_sriov_gpu_pfs_sorted_by_address(host: HostTree) -> None:
    mixed_host(host)
    inventory = observe(host)
    assert inventory.node == "harvester-kgd9c"
    assert inventory.sysfs_root == str(host.root)
    # Not the audio function, the NIC, or any VF. The T4 is listed, marked as making no vGPU
    # VFs (sriov_vf_device 0), so that a desired state naming it is told why it is left alone.
    assert [str(g.address) for g in inventory.gpus] == [A2, T4, L40S]
    a2, t4, l40s = inventory.gpus
    assert (a2.vf_device, a2.vgpu_vfs) == ("25b6", True)
    assert (t4.vf_device, t4.vgpu_vfs) == ("0000", False)
    assert l40s.vgpu_vfs


def test_vfs_follow_virtfn_numbers_not_name_order(host: HostTree) -> None:
    mixed_host(host)
    a2 = observe(host).gpus[0]
    expected = [f"0000:08:{slot:02x}.{fn}" for slot in range(3) for fn in range(8)][4:20]
    assert expected[0] == "0000:08:00.4"
    assert expected[-1] == "0000:08:02.3"
    assert [v.index for v in a2.vfs] == list(range(16))
    # A glob (virtfn0, virtfn1, virtfn10, …) would put 0000:08:01.6 third.
    assert [str(v.address) for v in a2.vfs] == expected


def test_gpu_facts(host: HostTree) -> None:
    mixed_host(host)
    a2, _, l40s = observe(host).gpus
    assert (a2.vendor_id, a2.device_id) == ("10de", "25b6")
    assert (a2.subsystem_vendor_id, a2.subsystem_device_id) == ("10de", "157e")
    assert a2.model == "NVIDIA A2"
    assert a2.interface is Interface.MDEV
    assert (a2.total_vfs, a2.num_vfs, a2.vf_offset, a2.vf_stride) == (16, 16, 4, 1)
    assert a2.driver == "nvidia"
    assert [a2.predicted_vf_address(v.index) for v in a2.vfs] == [v.address for v in a2.vfs]
    assert l40s.model == "NVIDIA L40S"
    assert l40s.interface is Interface.NONE
    assert (l40s.total_vfs, l40s.num_vfs, l40s.vf_offset) == (32, 0, 4)
    assert l40s.vfs == ()
    assert l40s.types == ()


def test_types_in_driver_id_order_with_description_fields(host: HostTree) -> None:
    host.gpu(A2, vfs=2)
    a2 = observe(host).gpus[0]
    fixture = types_fixture("a2-vf.txt")
    assert [t.type_id for t in a2.types] == sorted(fixture, key=lambda i: int(i.split("-")[1]))
    assert [t.name for t in a2.types] == [fixture[t.type_id]["name"] for t in a2.types]
    q4 = a2.type_named("NVIDIA A2-4Q")
    assert q4 is not None
    assert (q4.framebuffer_mib, q4.max_instance, q4.num_heads) == (4096, 4, 4)
    assert (q4.max_resolution, q4.frl_config) == ("7680x4320", 60)


def test_creatable_types_follow_available_instances(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=3)
    host.offer_types(vfs[2], "a2-vf-4gb-in-use.txt")
    host.set_available(vfs[0], "nvidia-742", 0)
    a2 = observe(host).gpus[0]
    all_names = {t.name for t in a2.types}
    assert a2.vfs[0].creatable == all_names - {"NVIDIA A2-1B"}
    assert a2.vfs[1].creatable == all_names
    assert a2.vfs[2].creatable == {"NVIDIA A2-4Q", "NVIDIA A2-4A", "NVIDIA A2-4C"}


def test_unknown_gpu_works_from_what_sysfs_reports(host: HostTree) -> None:
    host.gpu(A2, vfs=2, attributes={"device": "0x9999", "sriov_vf_device": "9999"})
    gpu = observe(host).gpus[0]
    assert gpu.model is None
    assert gpu.device_id == "9999"
    assert gpu.interface is Interface.MDEV
    assert len(gpu.types) == 15
    assert gpu.vfs[1].creatable


def test_enabled_vfs_without_mdev_types_read_as_no_interface(host: HostTree) -> None:
    host.gpu(A2, vfs=4, types="")
    inventory = observe(host)
    gpu = inventory.gpus[0]
    assert gpu.interface is Interface.NONE
    assert len(gpu.vfs) == 4
    assert gpu.types == ()
    assert any("mdev_supported_types" in n for n in inventory.notes)


# --- existing vGPUs -----------------------------------------------------------------------


def test_existing_vgpu_is_found_on_its_vf_with_its_type_name(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=16)
    host.mdev(vfs[1], UUID_1, "nvidia-746", group=77)  # NVIDIA A2-4Q
    a2 = observe(host).gpus[0]
    assert a2.vfs[1].vgpu == VGPU(uuid=UUID_1, type_name="NVIDIA A2-4Q", iommu_group="77")
    assert a2.vfs[1].creatable == frozenset()
    assert [v.index for v in a2.vfs if v.vgpu] == [1]


def test_vgpu_type_id_not_listed_by_the_vf_is_named_from_its_own_directory(
    host: HostTree,
) -> None:
    vfs = host.gpu(A2, vfs=2)
    mdev = host.mdev(vfs[0], UUID_1, "nvidia-746")
    retired = host.path(vfs[0]) / "retired-types" / "nvidia-999"
    retired.mkdir(parents=True)
    (retired / "name").write_text("NVIDIA A2-4Q\n")
    (mdev / "mdev_type").unlink()
    os.symlink("../retired-types/nvidia-999", mdev / "mdev_type")
    inventory = observe(host)
    vgpu = inventory.gpus[0].vfs[0].vgpu
    assert vgpu is not None
    assert vgpu.type_name == "NVIDIA A2-4Q"
    assert any("nvidia-999" in n for n in inventory.notes)


def test_vgpu_whose_type_directory_is_gone_keeps_the_type_id(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=2)
    mdev = host.mdev(vfs[0], UUID_1, "nvidia-746", group=12)
    (mdev / "mdev_type").unlink()
    os.symlink("../mdev_supported_types/nvidia-999", mdev / "mdev_type")
    vgpu = observe(host).gpus[0].vfs[0].vgpu
    assert vgpu == VGPU(uuid=UUID_1, type_name="nvidia-999", iommu_group="12")


def test_mdev_of_another_parent_is_ignored(host: HostTree) -> None:
    host.gpu(A2, vfs=2)
    # An Intel iGPU's GVT-g vGPU: an mdev too, on a parent that is none of our VFs.
    igpu = host.function(
        "0000:00:02.0",
        "ga102-audio.txt",
        bridge="0000:00:00.0",
        attributes={"vendor": "0x8086", "device": "0x3e92", "class": "0x030000"},
    )
    (igpu / UUID_2).mkdir()
    rel = igpu.relative_to(host.root)
    os.symlink(f"../../../{rel}/{UUID_2}", host.root / "bus/mdev/devices" / UUID_2)
    inventory = observe(host)
    assert [str(g.address) for g in inventory.gpus] == [A2]
    assert all(v.vgpu is None for v in inventory.gpus[0].vfs)


def test_second_mdev_on_one_vf_is_reported(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=2)
    host.mdev(vfs[0], UUID_2, "nvidia-746")
    host.mdev(vfs[0], UUID_1, "nvidia-746")
    inventory = observe(host)
    vgpu = inventory.gpus[0].vfs[0].vgpu
    assert vgpu is not None
    assert vgpu.uuid == UUID_2
    assert any(UUID_1 in n for n in inventory.notes)


class RecordingProbe:
    def __init__(self, holders: dict[str, str], *, blind: str | None = None) -> None:
        self.holders = holders
        self.blind = blind
        self.asked: dict[str, DeviceNodes] = {}

    def scan(self, vgpus: Mapping[str, DeviceNodes]) -> HolderScan:
        self.asked = dict(vgpus)
        held = {u: h for u, h in self.holders.items() if u in vgpus}
        return HolderScan(held=held, blind=self.blind)


def test_hold_probe_is_asked_with_iommu_groups_and_marks_vgpus_in_use(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=4)
    host.mdev(vfs[0], UUID_1, "nvidia-746", group=45)
    host.mdev(vfs[3], UUID_2, "nvidia-751", group=48)
    probe = RecordingProbe({UUID_1: "pid 4242 (qemu-system-x86)"})
    a2 = observe(host, hold_probe=probe).gpus[0]
    assert probe.asked == {
        UUID_1: DeviceNodes(group="45", device=UUID_1),
        UUID_2: DeviceNodes(group="48", device=UUID_2),
    }
    assert a2.vfs[0].vgpu == VGPU(
        UUID_1, "NVIDIA A2-4Q", True, "pid 4242 (qemu-system-x86)", iommu_group="45"
    )
    assert a2.vfs[3].vgpu == VGPU(UUID_2, "NVIDIA A2-4A", iommu_group="48")


def test_the_probe_is_told_the_cdev_and_the_device_numbers(host: HostTree) -> None:
    """On kernels with the vfio cdev, the mdev lists ``vfio-dev/vfioN``; ``dev`` files give
    the nodes' numbers (the group's through ``class/vfio/<group>``)."""
    vfs = host.gpu(A2, vfs=1)
    d = host.mdev(vfs[0], UUID_1, "nvidia-746", group=106)
    (d / "vfio-dev" / "vfio3").mkdir(parents=True)
    (d / "vfio-dev" / "vfio3" / "dev").write_text("511:3\n")
    (host.root / "class/vfio/106").mkdir(parents=True)
    (host.root / "class/vfio/106/dev").write_text("238:0\n")
    probe = RecordingProbe({})
    observe(host, hold_probe=probe)
    assert probe.asked == {
        UUID_1: DeviceNodes(
            group="106",
            cdev="vfio3",
            numbers=frozenset({os.makedev(238, 0), os.makedev(511, 3)}),
            device=UUID_1,
        )
    }


def test_vgpu_without_a_device_node_is_not_asked_about(host: HostTree) -> None:
    """No iommu_group link, no cdev: no VFIO driver bound, so no VM can have it open."""
    vfs = host.gpu(A2, vfs=1)
    (host.mdev(vfs[0], UUID_1, "nvidia-746") / "iommu_group").unlink()
    probe = RecordingProbe({}, blind="cannot see")
    vgpu = observe(host, hold_probe=probe).gpus[0].vfs[0].vgpu
    assert probe.asked == {}
    assert vgpu == VGPU(UUID_1, "NVIDIA A2-4Q")


def test_a_blind_probe_makes_every_vgpu_in_use_by_an_unknown_holder(host: HostTree) -> None:
    """Fail closed: a holder the probe cannot see would lose its GPU to a removal."""
    vfs = host.gpu(A2, vfs=4)
    host.mdev(vfs[0], UUID_1, "nvidia-746", group=45)
    host.mdev(vfs[3], UUID_2, "nvidia-751", group=48)
    why = "vgpuctl runs in PID namespace 4026532179, not the host's (4026531836)"
    probe = RecordingProbe({UUID_2: "pid 77 (qemu-kvm)"}, blind=why)
    inventory = observe(host, hold_probe=probe)
    a2 = inventory.gpus[0]
    assert a2.vfs[0].vgpu == VGPU(
        UUID_1,
        "NVIDIA A2-4Q",
        in_use=True,
        holder=f"unknown: cannot see the host's processes ({why})",
        iommu_group="45",
    )
    # A holder the probe did see is still named.
    assert a2.vfs[3].vgpu == VGPU(
        UUID_2, "NVIDIA A2-4A", in_use=True, holder="pid 77 (qemu-kvm)", iommu_group="48"
    )
    assert any("cannot see every process of the host" in n for n in inventory.notes)


def test_the_unsafe_flag_trusts_a_blind_probe_and_says_so(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=1)
    host.mdev(vfs[0], UUID_1, "nvidia-746", group=45)
    probe = RecordingProbe({}, blind="cannot read /proc/self/ns/pid: No such file or directory")
    inventory = observe_host(
        host.root,
        node="harvester-kgd9c",
        catalog=default_catalog(),
        hold_probe=probe,
        assume_no_hidden_holders=True,
    )
    assert inventory.gpus[0].vfs[0].vgpu == VGPU(UUID_1, "NVIDIA A2-4Q", iommu_group="45")
    assert inventory.notes == (
        "holders not fully checked (cannot read /proc/self/ns/pid: No such file or directory): "
        "assumed that no process vgpuctl cannot see holds a vGPU "
        "(--unsafe-assume-no-hidden-holders)",
    )


def test_an_mdev_the_bus_no_longer_lists_is_a_removal_under_way(host: HostTree) -> None:
    """The kernel unlinks an mdev (bus link, type link, remove file) before it waits for the VM
    that holds it; the directory under the VF stays until the VM lets go."""
    vfs = host.gpu(A2, vfs=2)
    d = host.mdev(vfs[1], UUID_1, "nvidia-746", group=45)
    (host.root / "bus/mdev/devices" / UUID_1).unlink()
    (d / "mdev_type").unlink()
    (d / "remove").unlink()
    vgpu = observe(host, hold_probe=RecordingProbe({})).gpus[0].vfs[1].vgpu
    assert vgpu == VGPU(
        UUID_1,
        "unknown",
        in_use=True,
        holder="unknown: its removal waits for the process that holds it",
        iommu_group="45",
        removing=True,
    )


def test_without_a_probe_nothing_is_in_use(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=1)
    host.mdev(vfs[0], UUID_1, "nvidia-746")
    vgpu = observe(host).gpus[0].vfs[0].vgpu
    assert vgpu is not None
    assert not vgpu.in_use


# --- cost ---------------------------------------------------------------------------------


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every attribute a scan reads from now on, in order."""
    reads: list[str] = []
    original = SysfsTree.read_text

    def counting(self: SysfsTree, rel: str) -> str:
        reads.append(rel.rpartition("/")[2])
        return original(self, rel)

    monkeypatch.setattr(SysfsTree, "read_text", counting)
    return reads


def test_type_name_and_description_are_read_once_per_gpu_and_counts_on_free_vfs(
    host: HostTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    vfs = host.gpu(A2, vfs=16)
    host.mdev(vfs[5], UUID_1, "nvidia-746")
    reads = _count_reads(monkeypatch)
    observe(host)
    assert reads.count("name") == 15
    assert reads.count("description") == 15
    # Counts on the 15 free VFs only: the VF that hosts a vGPU shows 0 for every type.
    assert reads.count("available_instances") == 15 * 15


def test_a_scan_without_availability_reads_no_count_and_says_so(
    host: HostTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    vfs = host.gpu(A2, vfs=4)
    host.mdev(vfs[1], UUID_1, "nvidia-746")
    full = observe(host)
    reads = _count_reads(monkeypatch)
    scanned = observe_host(
        host.root, node="harvester-kgd9c", catalog=default_catalog(), availability=False
    )
    assert "available_instances" not in reads
    assert reads.count("name") == 15  # the types are still read, once per GPU
    assert full.vf_availability and not scanned.vf_availability
    assert [vf.creatable for vf in scanned.gpus[0].vfs] == [frozenset()] * 4
    assert full.gpus[0].vfs[0].creatable  # what the full scan read on a free VF
    # Everything else is the full scan's: the types, the VFs and the vGPU on VF 1.
    assert scanned.gpus[0].types == full.gpus[0].types
    assert [vf.vgpu for vf in scanned.gpus[0].vfs] == [vf.vgpu for vf in full.gpus[0].vfs]
    doc = scanned.to_json()
    assert doc["vfAvailability"] is False and "vfAvailability" not in full.to_json()
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    assert Inventory.from_json(doc) == scanned


# --- errors -------------------------------------------------------------------------------


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(ObserveError, match="does not exist"):
        observe_host(tmp_path / "nope", node="n", catalog=default_catalog())


def test_root_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "sys").write_text("")
    with pytest.raises(ObserveError, match="not a directory"):
        observe_host(tmp_path / "sys", node="n", catalog=default_catalog())


def test_root_without_pci_devices(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class").mkdir(parents=True)
    with pytest.raises(ObserveError, match="has no bus/pci/devices"):
        observe_host(tmp_path / "sys", node="n", catalog=default_catalog())


def test_unreadable_root(host: HostTree, monkeypatch: pytest.MonkeyPatch) -> None:
    real_listdir = os.listdir

    def denied(path: str | os.PathLike[str] = ".") -> list[str]:
        if os.fspath(path) == os.fspath(host.root):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", denied)
    with pytest.raises(ObserveError, match="permission denied"):
        observe(host)


def test_unreadable_file_names_it(host: HostTree, monkeypatch: pytest.MonkeyPatch) -> None:
    vfs = host.gpu(A2, vfs=1)
    original = SysfsTree.read_text

    def denied(self: SysfsTree, rel: str) -> str:
        if rel.endswith("nvidia-746/available_instances"):
            raise PermissionError(13, "Permission denied", self.describe(rel))
        return original(self, rel)

    monkeypatch.setattr(SysfsTree, "read_text", denied)
    with pytest.raises(ObserveError, match=f"permission denied reading .*{vfs[0]}.*nvidia-746"):
        observe(host)


def test_malformed_description_names_the_file(host: HostTree) -> None:
    vfs = host.gpu(A2, vfs=1)
    description = host.path(vfs[0]) / "mdev_supported_types/nvidia-744/description"
    description.write_text("num_heads=4, frl_config=60, framebuffer=lots, max_instance=16\n")
    with pytest.raises(ObserveError, match=f"{description}: framebuffer"):
        observe(host)


def test_link_leaving_the_root_is_refused(host: HostTree, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "0000:09:00.0"
    outside.mkdir(parents=True)
    (outside / "vendor").write_text("0x10de\n")
    os.symlink("../../../../elsewhere/0000:09:00.0", host.root / "bus/pci/devices/0000:09:00.0")
    with pytest.raises(ObserveError, match="outside the sysfs root"):
        observe(host)


def test_absolute_link_is_refused(host: HostTree) -> None:
    os.symlink("/sys/devices/pci0000:00/0000:09:00.0", host.root / "bus/pci/devices/0000:09:00.0")
    with pytest.raises(ObserveError, match="outside the sysfs root"):
        observe(host)


def test_vf_removed_during_the_scan_is_retried(
    host: HostTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    vfs = host.gpu(A2, vfs=4)
    original = SysfsTree.list_dir
    raced: list[str] = []

    def racing(self: SysfsTree, rel: str) -> list[str]:
        if not raced and rel.endswith(f"{vfs[3]}/mdev_supported_types"):
            raced.append(rel)
            host.remove_vf(A2, 3, vfs[3])
        return original(self, rel)

    monkeypatch.setattr(SysfsTree, "list_dir", racing)
    a2 = observe(host).gpus[0]
    assert raced
    assert [str(v.address) for v in a2.vfs] == vfs[:3]


def test_files_vanishing_twice_is_a_clear_transient_error(
    host: HostTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    vfs = host.gpu(A2, vfs=2)
    original = SysfsTree.read_text

    def vanishing(self: SysfsTree, rel: str) -> str:
        if rel.endswith("nvidia-750/available_instances") and vfs[1] in rel:
            raise FileNotFoundError(2, "No such file or directory", self.describe(rel))
        return original(self, rel)

    monkeypatch.setattr(SysfsTree, "read_text", vanishing)
    with pytest.raises(SysfsChangedError, match="nvidia-750/available_instances disappeared") as e:
        observe(host)
    assert e.value.transient


# --- the inventory contract ---------------------------------------------------------------


def test_inventory_json_matches_schema_and_round_trips(host: HostTree) -> None:
    vfs = mixed_host(host)
    host.mdev(vfs[0], UUID_1, "nvidia-751")  # NVIDIA A2-4A
    host.mdev(vfs[1], UUID_2, "nvidia-746", group=61)
    inventory = observe(host, hold_probe=RecordingProbe({UUID_2: "pid 7 (qemu-kvm)"}))
    doc = inventory.to_json()
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(doc)))
    assert Inventory.from_json(doc) == inventory
    assert doc["gpus"][0]["vfs"][1]["vgpu"] == {
        "type": "NVIDIA A2-4Q",
        "uuid": UUID_2,
        "holder": "pid 7 (qemu-kvm)",
        "iommuGroup": "61",
    }
    assert doc["gpus"][0]["vfs"][1]["inUse"] is True


def test_schema_rejects_what_the_model_never_emits() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    good = Inventory(node="n").to_json()
    assert validator.is_valid(good)
    assert not validator.is_valid({**good, "gpus": [{"address": "08:00.0"}]})
    assert not validator.is_valid({**good, "extra": 1})


# --- NVIDIA's vendor-specific VFIO interface ------------------------------------------------


def test_a_list_that_cannot_be_read_is_a_note_naming_the_vf_and_file(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    vfs = l40s_vfio_host(root)
    bad = root / "bus/pci/devices" / vfs[2] / "nvidia/creatable_vgpu_types"
    bad.write_text(bad.read_text() + "1200 NVIDIA L40S-9Z\n")
    inventory = observe_host(root, node="n1", catalog=default_catalog())
    gpu = inventory.gpus[0]
    assert gpu.interface is Interface.VFIO
    resolved = root / "devices/pci0000:20/0000:20:01.0/0000:26:00.6/nvidia/creatable_vgpu_types"
    assert inventory.notes == (
        f"GPU 0000:26:00.0: VF 0000:26:00.6: {resolved}: cannot read the line "
        "'1200 NVIDIA L40S-9Z'",
    )


def test_a_configured_vf_is_held_through_its_own_device_nodes(tmp_path: Path) -> None:
    """On this interface the VF is the vGPU: a VM holds it through the VF's IOMMU group."""
    root = tmp_path / "sys"
    vfs = l40s_vfio_host(root, configured={0: "1152"})
    probe = RecordingProbe({vfs[0]: "pid 9 (qemu-kvm)"})
    inventory = observe_host(root, node="n1", catalog=default_catalog(), hold_probe=probe)
    assert probe.asked == {vfs[0]: DeviceNodes(group="200", device=vfs[0])}
    vgpu = inventory.gpus[0].vfs[0].vgpu
    assert vgpu == VGPU(vfs[0], "NVIDIA L40S-8Q", True, "pid 9 (qemu-kvm)", iommu_group="200")
    # The sizes this interface does not publish come from the catalogue.
    eight = inventory.gpus[0].type_named("NVIDIA L40S-8Q")
    assert eight is not None
    assert (eight.type_id, eight.framebuffer_mib, eight.max_instance) == ("1152", 8192, 6)
