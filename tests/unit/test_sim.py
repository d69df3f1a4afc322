"""The simulator's sysfs layout: what ``init_host`` builds and ``sriov-manage -e`` adds.

These facts are the real kernel's (docs/domain.md §1, §3a); the observer is written against them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from reconciler.catalog import Catalog, default_catalog
from reconciler.sim import SimHost, init_host

A2_VFS = [
    "0000:08:00.4",
    "0000:08:00.5",
    "0000:08:00.6",
    "0000:08:00.7",
    "0000:08:01.0",
    "0000:08:01.1",
    "0000:08:01.2",
    "0000:08:01.3",
    "0000:08:01.4",
    "0000:08:01.5",
    "0000:08:01.6",
    "0000:08:01.7",
    "0000:08:02.0",
    "0000:08:02.1",
    "0000:08:02.2",
    "0000:08:02.3",
]


def read(path: Path) -> str:
    return path.read_text().strip()


def enable(host: SimHost, target: str = "ALL") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(host.sriov_manage), "-e", target], capture_output=True, text=True, check=True
    )


def pci(host: SimHost, address: str) -> Path:
    return host.sysfs_root / "bus" / "pci" / "devices" / address


def virtfns(pf: Path) -> list[str]:
    names = [n for n in os.listdir(pf) if n.startswith("virtfn")]
    names.sort(key=lambda n: int(n[len("virtfn") :]))
    return [os.readlink(pf / n) for n in names]


@pytest.fixture
def a2(tmp_path: Path) -> SimHost:
    return init_host(tmp_path, ["A2@0000:08:00.0"])


# --- PF files and links ------------------------------------------------------------------


def test_a2_pf_files_say_what_the_kernel_prints(a2: SimHost) -> None:
    pf = pci(a2, "0000:08:00.0")
    assert (pf / "vendor").read_text() == "0x10de\n"
    assert (pf / "device").read_text() == "0x25b6\n"
    assert (pf / "class").read_text() == "0x030200\n"
    assert (pf / "subsystem_vendor").read_text() == "0x10de\n"
    assert (pf / "subsystem_device").read_text() == "0x157e\n"
    assert (pf / "sriov_totalvfs").read_text() == "16\n"
    assert (pf / "sriov_numvfs").read_text() == "0\n"
    assert (pf / "sriov_offset").read_text() == "4\n"
    assert (pf / "sriov_stride").read_text() == "1\n"
    # The kernel prints sriov_vf_device with "%x": no 0x prefix, unlike vendor/device.
    assert (pf / "sriov_vf_device").read_text() == "25b6\n"
    assert not (pf / "physfn").exists()
    assert virtfns(pf) == []


def test_pf_links_are_relative_symlinks_into_devices(a2: SimHost) -> None:
    link = a2.sysfs_root / "bus/pci/devices/0000:08:00.0"
    assert link.is_symlink()
    assert os.readlink(link).startswith("../../../devices/pci0000:00/")
    pf = link.resolve()
    assert pf.parent.parent.name == "pci0000:00"
    assert pf.is_relative_to(a2.sysfs_root.resolve() / "devices")
    assert os.readlink(pf / "driver") == "../../../../bus/pci/drivers/nvidia"
    group = os.readlink(pf / "iommu_group")
    assert re.fullmatch(r"\.\./\.\./\.\./\.\./kernel/iommu_groups/\d+", group)
    assert (pf / "iommu_group" / "devices" / "0000:08:00.0").resolve() == pf
    assert (a2.sysfs_root / "bus/pci/drivers/nvidia/0000:08:00.0").resolve() == pf


def test_every_bus_entry_is_a_symlink_into_devices(a2: SimHost) -> None:
    enable(a2)
    devices = a2.sysfs_root.resolve() / "devices"
    for base in ("bus/pci/devices", "class/mdev_bus"):
        entries = list((a2.sysfs_root / base).iterdir())
        assert entries
        for e in entries:
            assert e.is_symlink(), e
            assert e.resolve().is_relative_to(devices), e
            assert e.resolve().name == e.name


# --- VFs -----------------------------------------------------------------------------------


def test_a2_vfs_appear_where_the_seed_saw_them(a2: SimHost) -> None:
    enable(a2, "0000:08:00.0")
    pf = pci(a2, "0000:08:00.0")
    assert (pf / "sriov_numvfs").read_text() == "16\n"
    # virtfn<N> sorted numerically, not as a glob sorts them (virtfn10 after virtfn1).
    assert virtfns(pf) == [f"../{a}" for a in A2_VFS]
    for a in A2_VFS:
        vf = pci(a2, a)
        assert os.readlink(vf / "physfn") == "../0000:08:00.0"
        assert vf.resolve().parent == pf.resolve().parent  # a sibling of its PF
        assert read(vf / "vendor") == "0x10de"
        assert read(vf / "device") == "0x25b6"
        assert read(vf / "class") == "0x030200"
        assert not (vf / "sriov_totalvfs").exists()
        assert os.readlink(vf / "driver") == "../../../../bus/pci/drivers/nvidia"
        assert os.readlink(a2.sysfs_root / "class/mdev_bus" / a) == (
            f"../../devices/pci0000:00/{pf.resolve().parent.name}/{a}"
        )
    groups = {os.readlink(pci(a2, a) / "iommu_group") for a in [*A2_VFS, "0000:08:00.0"]}
    assert len(groups) == 17  # every VF is its own IOMMU group


def test_vf_offers_every_time_sliced_profile_of_the_catalogue(a2: SimHost) -> None:
    enable(a2)
    types = pci(a2, "0000:08:00.4") / "mdev_supported_types"
    model = default_catalog().model("A2")
    assert model is not None
    # The simulator numbers the A2's types from 742, as the A2 branch captured by Harvester.
    expected = {f"nvidia-{742 + i}": p for i, p in enumerate(model.profiles) if not p.mig}
    assert sorted(os.listdir(types)) == sorted(expected)
    for type_id, profile in expected.items():
        d = types / type_id
        assert (d / "name").read_text() == f"{profile.name}\n"
        assert (d / "device_api").read_text() == "vfio-pci\n"
        assert (d / "available_instances").read_text() == "1\n"
        assert (d / "create").exists()
        assert (d / "devices").is_dir()
        assert list((d / "devices").iterdir()) == []
    q4 = next(t for t, p in expected.items() if p.name == "NVIDIA A2-4Q")
    assert (types / q4 / "description").read_text() == (
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4\n"
    )


def test_mig_backed_profiles_are_not_offered(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A100"])
    enable(host)
    vf = pci(host, "0000:08:00.4")
    names = {read(d / "name") for d in (vf / "mdev_supported_types").iterdir()}
    assert "GRID A100-4C" in names  # the A100 family's driver prints GRID names
    assert not any(re.search(r"-\d-\d+C", n) for n in names)


def test_l40s_vfs_start_at_function_four(tmp_path: Path) -> None:
    """As on the L40S hosts captured (VF 0000:26:00.4, 0000:3d:00.4): sriov_offset 4."""
    host = init_host(tmp_path, ["L40S@0000:41:00.0"])
    enable(host)
    pf = pci(host, "0000:41:00.0")
    links = virtfns(pf)
    assert read(pf / "sriov_offset") == "4"
    assert len(links) == 32
    assert links[0] == "../0000:41:00.4"
    assert links[31] == "../0000:41:04.3"


# --- distractors -----------------------------------------------------------------------------


def test_an_sriov_nic_and_an_nvidia_audio_function_sit_beside_the_gpu(a2: SimHost) -> None:
    devices = {p.name: p for p in (a2.sysfs_root / "bus/pci/devices").iterdir()}
    nics = [
        p for p in devices.values() if read(p / "class") == "0x020000" and (p / "virtfn0").exists()
    ]
    assert len(nics) == 1
    nic = nics[0]
    assert read(nic / "vendor") == "0x8086"
    assert read(nic / "sriov_numvfs") == "2"
    nic_vfs = virtfns(nic)
    assert len(nic_vfs) == 2
    for link in nic_vfs:
        vf = (nic / link).resolve()
        assert os.readlink(vf / "physfn") == f"../{nic.name}"
        assert read(vf / "vendor") == "0x8086"

    audio = devices["0000:08:00.1"]
    assert read(audio / "vendor") == "0x10de"
    assert read(audio / "class") == "0x040300"
    assert not (audio / "sriov_totalvfs").exists()
    assert not (audio / "physfn").exists()
    # Same slot as the GPU, so the same IOMMU group.
    assert os.readlink(audio / "iommu_group") == os.readlink(
        devices["0000:08:00.0"] / "iommu_group"
    )


def test_no_extra_devices_means_only_gpus_and_their_root_ports(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2"], extra_devices=False)
    names = sorted(p.name for p in (host.sysfs_root / "bus/pci/devices").iterdir())
    assert names == ["0000:00:01.0", "0000:08:00.0"]
    assert read(pci(host, "0000:00:01.0") / "class") == "0x060400"


def test_audio_function_is_left_out_where_a_vf_would_sit(tmp_path: Path) -> None:
    raw = json.loads((resources.files("reconciler.catalog") / "catalog.json").read_text())
    a2 = next(m for m in raw["models"] if m["short"] == "A2")
    a2["vfOffset"] = 1  # VF0 at function 1: where the audio function would go
    host = init_host(tmp_path, ["A2"], catalog=Catalog.from_json(raw))
    assert not pci(host, "0000:08:00.1").exists()
    enable(host)
    assert os.readlink(pci(host, "0000:08:00.0") / "virtfn0") == "../0000:08:00.1"


# --- placement ----------------------------------------------------------------------------


def _gpu_addresses(host: SimHost) -> list[str]:
    return [str(g.address) for g in host.gpus()]


def test_default_addresses_are_deterministic_and_skip_taken_buses(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2", "L40S@0000:18:00.0", "L4"])
    assert _gpu_addresses(host) == ["0000:08:00.0", "0000:18:00.0", "0000:28:00.0"]
    assert [g.model for g in host.gpus()] == ["NVIDIA A2", "NVIDIA L40S", "NVIDIA L4"]


def test_defaults_roll_over_to_the_next_domain(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2"] * 17, extra_devices=False)
    addresses = _gpu_addresses(host)
    assert addresses[15] == "0000:f8:00.0"
    assert addresses[16] == "0001:08:00.0"
    pf = pci(host, "0001:08:00.0").resolve()
    assert pf.parent.parent.name == "pci0001:00"


def test_an_a16_board_is_four_gpus_on_consecutive_buses(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A16@0000:41:00.0", "A16"])
    assert _gpu_addresses(host) == [
        "0000:08:00.0",
        "0000:09:00.0",
        "0000:0a:00.0",
        "0000:0b:00.0",
        "0000:41:00.0",
        "0000:42:00.0",
        "0000:43:00.0",
        "0000:44:00.0",
    ]
    for address in _gpu_addresses(host):
        assert read(pci(host, address) / "subsystem_device") == "0x14a9"
    enable(host)
    assert virtfns(pci(host, "0000:43:00.0"))[0] == "../0000:43:00.4"


def test_model_names_and_aliases_resolve(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["NVIDIA A10", "a100-80gb", "H100"])
    assert [g.model for g in host.gpus()] == ["NVIDIA A10", "NVIDIA A100 80GB", "NVIDIA H100 80GB"]


def test_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown GPU model 'T4'.*A2.*L40S"):
        init_host(tmp_path, ["T4"])
    assert not (tmp_path / "sys").exists()


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (["A2@0000:08:00.0", "L4@0000:08:00.0"], "duplicate address 0000:08:00.0"),
        (["A2@0000:08:00.0", "L4@0000:08:01.0"], "overlaps"),  # A2 VF4 is 08:01.0
        (["A16@0000:41:00.0", "A2@0000:43:00.0"], "duplicate address 0000:43:00.0"),
        (["A2@0000:00:05.0"], "bus 00"),
        (["A2@08:00.0"], "invalid PCI address"),
        (["A16@0000:fe:00.0"], "past bus ff"),
    ],
)
def test_bad_addresses_are_refused(tmp_path: Path, gpus: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        init_host(tmp_path, gpus)


def test_an_existing_tree_is_not_overwritten(tmp_path: Path) -> None:
    init_host(tmp_path, ["A2"])
    with pytest.raises(FileExistsError):
        init_host(tmp_path, ["L4"])
    assert SimHost.open(tmp_path / "sys") is not None


def test_unknown_interface_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interface"):
        init_host(tmp_path, ["A2"], interface="sriov")


# --- the handle and the script ---------------------------------------------------------------


def test_open_recognises_only_simulated_trees(tmp_path: Path, a2: SimHost) -> None:
    opened = SimHost.open(tmp_path / "sys")
    assert opened == a2
    assert opened is not None
    assert opened.directory == tmp_path
    (tmp_path / "plain").mkdir()
    assert SimHost.open(tmp_path / "plain") is None
    assert SimHost.open(tmp_path / "missing") is None


def test_sriov_manage_script_runs_with_this_interpreter(a2: SimHost) -> None:
    script = a2.sriov_manage
    assert script == a2.directory / "bin" / "sriov-manage"
    assert os.access(script, os.X_OK)
    shebang = script.read_text().splitlines()[0]
    assert shebang == f"#!{Path(sys.executable).absolute()} -I"
    assert Path(shebang[2:].split()[0]).is_absolute()


def test_script_finds_its_tree_through_a_symlink(tmp_path: Path, a2: SimHost) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "sriov-manage").symlink_to(a2.sriov_manage)
    subprocess.run([str(elsewhere / "sriov-manage"), "-e", "ALL"], check=True, capture_output=True)
    assert read(pci(a2, "0000:08:00.0") / "sriov_numvfs") == "16"


# --- vfio interface ----------------------------------------------------------------------------


def test_vfio_interface_lists_creatable_types_per_vf(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2"], interface="vfio")
    enable(host)
    vf = pci(host, "0000:08:00.4")
    assert not (vf / "mdev_supported_types").exists()
    assert not (host.sysfs_root / "class/mdev_bus/0000:08:00.4").exists()
    lines = (vf / "nvidia/creatable_vgpu_types").read_text().splitlines()
    assert lines[0] == "ID    : vGPU Name"
    assert lines[1] == "742   : NVIDIA A2-1B"
    assert len(lines) == 1 + 15
    assert (vf / "nvidia/current_vgpu_type").read_text() == "0\n"


# --- an interface per GPU ----------------------------------------------------------------------

A2_VFS_BUS9 = [vf.replace("0000:08:", "0000:09:") for vf in A2_VFS]


def test_a_gpu_suffix_picks_its_interface_beside_the_default(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2@0000:08:00.0", "A2@0000:09:00.0:vfio"])
    assert [(str(g.address), g.interface) for g in host.gpus()] == [
        ("0000:08:00.0", "mdev"),
        ("0000:09:00.0", "vfio"),
    ]
    assert host.interface == "mixed"
    assert (host.sysfs_root / "bus/mdev/devices").is_dir()  # before SR-IOV too
    enable(host)
    for vf in A2_VFS:
        assert (pci(host, vf) / "mdev_supported_types/nvidia-746/create").exists()
        assert not (pci(host, vf) / "nvidia").exists()
    for vf in A2_VFS_BUS9:
        assert read(pci(host, vf) / "nvidia/current_vgpu_type") == "0"
        assert len(read(pci(host, vf) / "nvidia/creatable_vgpu_types").splitlines()) == 1 + 15
        assert not (pci(host, vf) / "mdev_supported_types").exists()
    assert sorted(os.listdir(host.sysfs_root / "class/mdev_bus")) == A2_VFS
    assert virtfns(pci(host, "0000:09:00.0"))[0].endswith("/0000:09:00.4")


@pytest.mark.parametrize(
    ("gpus", "interface", "expected"),
    [
        (["A2:vfio", "L4"], "mdev", ["vfio", "mdev"]),
        (["A2:mdev", "L4"], "vfio", ["mdev", "vfio"]),
        (["A2@0000:08:00.0:mdev", "L4@0000:41:00.0:vfio"], "mdev", ["mdev", "vfio"]),
        (["A16@0000:41:00.0:vfio"], "mdev", ["vfio"] * 4),  # the whole board
    ],
)
def test_the_interface_suffix_with_and_without_an_address(
    tmp_path: Path, gpus: list[str], interface: str, expected: list[str]
) -> None:
    host = init_host(tmp_path, gpus, interface=interface)
    assert [g.interface for g in host.gpus()] == expected


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ("A2@0000:08:00.0:sriov", "invalid PCI address '0000:08:00.0:sriov'"),
        ("A2@0000:08:00.0:VFIO", "invalid PCI address '0000:08:00.0:VFIO'"),
        ("A2:VFIO", "unknown GPU model 'A2:VFIO'"),
        ("A2@0000:08:00.0:vfio:mdev", "invalid PCI address '0000:08:00.0:vfio'"),
    ],
)
def test_only_an_exact_suffix_is_an_interface(tmp_path: Path, gpu: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        init_host(tmp_path, [gpu])
    assert not (tmp_path / "sys").exists()


def test_a_host_of_vfio_gpus_only_has_no_mdev_core(tmp_path: Path) -> None:
    for i, (gpus, interface) in enumerate([(["A2:vfio", "L4:vfio"], "mdev"), (["A2"], "vfio")]):
        host = init_host(tmp_path / str(i), gpus, interface=interface)
        enable(host)
        for gone in ("bus/mdev", "class/mdev_bus"):
            assert not (host.sysfs_root / gone).exists()
        assert (pci(host, "0000:08:00.4") / "nvidia/creatable_vgpu_types").is_file()


def test_the_nic_moves_off_buses_the_gpus_take(tmp_path: Path) -> None:
    host = init_host(tmp_path, ["A2@0000:03:00.0"])
    nic = [
        p
        for p in (host.sysfs_root / "bus/pci/devices").iterdir()
        if read(p / "vendor") == "0x8086"
        and read(p / "class") == "0x020000"
        and (p / "sriov_totalvfs").exists()
    ]
    assert [p.name for p in nic] == ["0000:04:00.0"]
