"""``vgpuctl sim init`` with an interface per GPU, run as a user runs it (subprocesses).

A host may have GPUs of both kinds (docs/domain.md §3: detect per GPU): an mdev GPU's VFs are
mdev parents (``mdev_supported_types/``, ``class/mdev_bus/<VF>``), a vfio GPU's VFs carry
``nvidia/creatable_vgpu_types`` and ``nvidia/current_vgpu_type`` instead. The mdev bus exists
while the kernel's mdev core is loaded: with at least one mdev GPU, not when all use vfio.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.simnode import run_vgpuctl

MDEV_GPU, VFIO_GPU = "0000:08:00.0", "0000:09:00.0"


def sim_init(directory: Path, *args: str) -> Path:
    res = run_vgpuctl("sim", "init", directory, *args)
    assert res.returncode == 0, res.stderr
    return directory / "sys"


def enable_all(directory: Path) -> None:
    res = subprocess.run(
        [str(directory / "bin" / "sriov-manage"), "-e", "ALL"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def vfs_of(sys_root: Path, pf: str) -> list[Path]:
    """A PF's VFs, through its ``virtfn<N>`` links, in order."""
    pf_dir = sys_root / "bus/pci/devices" / pf
    names = sorted(
        (n for n in os.listdir(pf_dir) if n.startswith("virtfn")), key=lambda n: int(n[6:])
    )
    return [(pf_dir / n).resolve() for n in names]


def test_two_a2s_one_per_interface_side_by_side(tmp_path: Path) -> None:
    host = tmp_path / "host"
    root = sim_init(host, "--gpu", f"A2@{MDEV_GPU}", "--gpu", f"A2@{VFIO_GPU}:vfio")
    assert (root / "bus/mdev").is_dir()
    enable_all(host)
    mdev_vfs, vfio_vfs = vfs_of(root, MDEV_GPU), vfs_of(root, VFIO_GPU)
    assert len(mdev_vfs) == len(vfio_vfs) == 16  # an A2's sriov_totalvfs
    assert mdev_vfs[0].name == "0000:08:00.4"
    assert vfio_vfs[0].name == "0000:09:00.4"
    for vf in mdev_vfs:
        assert (vf / "mdev_supported_types").is_dir()
        assert not (vf / "nvidia/creatable_vgpu_types").exists()
    for vf in vfio_vfs:
        assert (vf / "nvidia/creatable_vgpu_types").is_file()
        assert (vf / "nvidia/current_vgpu_type").read_text() == "0\n"
        assert not (vf / "mdev_supported_types").exists()
    assert (root / "bus/mdev/devices").is_dir()
    assert sorted(os.listdir(root / "class/mdev_bus")) == sorted(vf.name for vf in mdev_vfs)

    # A reboot (another process) keeps each GPU's interface.
    res = run_vgpuctl("sim", "reboot", host)
    assert res.returncode == 0, res.stderr
    assert vfs_of(root, MDEV_GPU) == vfs_of(root, VFIO_GPU) == []
    enable_all(host)
    assert (root / "bus/pci/devices/0000:08:00.4/mdev_supported_types").is_dir()
    assert (root / "bus/pci/devices/0000:09:00.4/nvidia/current_vgpu_type").is_file()


def test_an_all_vfio_host_has_no_mdev_bus(tmp_path: Path) -> None:
    host = tmp_path / "host"
    root = sim_init(host, "--gpu", f"A2@{MDEV_GPU}:vfio", "--gpu", f"A2@{VFIO_GPU}:vfio")
    enable_all(host)
    assert not (root / "bus/mdev").exists()
    assert not (root / "class/mdev_bus").exists()
    for pf in (MDEV_GPU, VFIO_GPU):
        assert all((vf / "nvidia/creatable_vgpu_types").is_file() for vf in vfs_of(root, pf))


def test_interface_is_the_default_a_suffix_overrides(tmp_path: Path) -> None:
    host = tmp_path / "host"
    root = sim_init(
        host, "--interface", "vfio", "--gpu", f"A2@{MDEV_GPU}:mdev", "--gpu", f"A2@{VFIO_GPU}"
    )
    enable_all(host)
    assert (root / "bus/pci/devices/0000:08:00.4/mdev_supported_types").is_dir()
    assert (root / "bus/pci/devices/0000:09:00.4/nvidia/creatable_vgpu_types").is_file()


def test_a_suffix_that_is_no_interface_is_refused(tmp_path: Path) -> None:
    res = run_vgpuctl("sim", "init", tmp_path / "host", "--gpu", f"A2@{MDEV_GPU}:sriov")
    assert res.returncode != 0
    assert f"invalid PCI address '{MDEV_GPU}:sriov'" in res.stderr
    assert "MODEL[@ADDRESS][:mdev|:vfio]" in res.stderr
    assert not (tmp_path / "host" / "sys").exists()
