"""The simulator's ``sriov-manage``, run as the real script is: a subprocess with an exit code."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from reconciler.sim import SimHost, build_host, hold, init_host

A2 = "0000:08:00.0"
L4 = "0000:18:00.0"


def run(host: SimHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(host.sriov_manage), *args], check=False, capture_output=True, text=True, timeout=60
    )


def numvfs(host: SimHost, pf: str) -> int:
    return int((host.sysfs_root / "bus/pci/devices" / pf / "sriov_numvfs").read_text())


def virtfn_count(host: SimHost, pf: str) -> int:
    pf_dir = host.sysfs_root / "bus/pci/devices" / pf
    return sum(1 for n in os.listdir(pf_dir) if n.startswith("virtfn"))


def mdevs(host: SimHost) -> list[str]:
    return sorted(os.listdir(host.sysfs_root / "bus/mdev/devices"))


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    return init_host(tmp_path, [f"A2@{A2}", f"L4@{L4}"])


def test_enable_one_gpu_makes_all_its_vfs_at_once(host: SimHost) -> None:
    r = run(host, "-e", A2)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Enabling VFs on {A2}\n"
    assert (numvfs(host, A2), virtfn_count(host, A2)) == (16, 16)
    assert (numvfs(host, L4), virtfn_count(host, L4)) == (0, 0)


def test_enable_is_idempotent(host: SimHost) -> None:
    run(host, "-e", A2)
    vf = host.sysfs_root / "bus/pci/devices/0000:08:00.4"
    group = os.readlink(vf / "iommu_group")
    r = run(host, "-e", A2)
    assert r.returncode == 0
    assert r.stdout == f"GPU at {A2} already has VFs enabled.\n"
    assert os.readlink(vf / "iommu_group") == group  # the VFs were left alone
    assert numvfs(host, A2) == 16


def test_enable_all_and_disable_all(host: SimHost) -> None:
    r = run(host, "-e", "ALL")
    assert r.returncode == 0
    assert r.stdout.splitlines() == [f"Enabling VFs on {A2}", f"Enabling VFs on {L4}"]
    assert numvfs(host, A2) == 16
    assert numvfs(host, L4) == virtfn_count(host, L4) == 32
    r = run(host, "-d", "ALL")
    assert r.returncode == 0
    assert (numvfs(host, A2), numvfs(host, L4)) == (0, 0)
    assert os.listdir(host.sysfs_root / "class/mdev_bus") == []
    left = sorted(p for p in os.listdir(host.sysfs_root / "bus/pci/devices") if "0000:08:" in p)
    assert left == ["0000:08:00.0", "0000:08:00.1"]  # the PF and its audio function remain


def test_disable_removes_unheld_vgpus_first(tmp_path: Path) -> None:
    host = build_host(tmp_path, {"gpus": [{"model": "A2", "address": A2, "vgpus": {0: "A2-4Q"}}]})
    assert len(mdevs(host)) == 1
    r = run(host, "-d", A2)
    assert r.returncode == 0, r.stderr
    assert mdevs(host) == []
    assert numvfs(host, A2) == 0


def test_disable_fails_while_a_vm_holds_a_vgpu(tmp_path: Path) -> None:
    host = build_host(
        tmp_path, {"gpus": [{"model": "A2", "address": A2, "vgpus": {0: "A2-4Q", 1: "A2-4Q"}}]}
    )
    held = mdevs(host)[0]
    hold(host.directory, held)
    r = run(host, "-d", A2)
    assert r.returncode == 1
    assert "in use" in r.stderr
    assert held in r.stderr
    assert numvfs(host, A2) == 16
    assert len(mdevs(host)) == 2  # nothing was removed: all or nothing


def test_disabling_a_disabled_gpu_is_fine(host: SimHost) -> None:
    r = run(host, "-d", A2)
    assert r.returncode == 0
    assert "already has VFs disabled" in r.stdout


def test_reset_flag_is_accepted_with_enable(host: SimHost) -> None:
    r = run(host, "-e", "-r", "1", A2)
    assert r.returncode == 0, r.stderr
    assert numvfs(host, A2) == 16


@pytest.mark.parametrize(
    "args",
    [(), ("-e",), ("-x", A2), ("-e", A2, "-d", A2), ("-d", "-r", "1", A2), ("-e", A2, "extra")],
)
def test_usage_errors_exit_1_with_a_usage_line(host: SimHost, args: tuple[str, ...]) -> None:
    r = run(host, *args)
    assert r.returncode == 1
    assert "usage: sriov-manage" in r.stderr
    assert numvfs(host, A2) == 0


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("08:00.0", "Invalid GPU address"),
        ("0000:09:00.0", "No NVIDIA"),
        ("0000:08:00.1", "No NVIDIA"),
    ],
)
def test_unknown_or_invalid_address_exits_1(host: SimHost, target: str, message: str) -> None:
    r = run(host, "-e", target)
    assert r.returncode == 1
    assert message in r.stderr
    assert r.stdout == ""


def test_calls_are_counted(host: SimHost) -> None:
    run(host, "-e", A2)
    run(host, "-e", A2)
    run(host, "-d", "0000:09:00.0")
    assert host.stats()["sriovManageCalls"] == 3
    assert host.stats()["writes"] == 0


def test_a_vanished_tree_is_a_message_not_a_traceback(host: SimHost) -> None:
    away = host.sysfs_root.with_name("sys.away")
    host.sysfs_root.rename(away)
    try:
        r = run(host, "-e", A2)
    finally:
        away.rename(host.sysfs_root)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith(f"sriov-manage: cannot read {host.sysfs_root}")
    assert numvfs(host, A2) == 0


def test_enable_takes_a_pf_from_another_driver_as_nvidias_script_does(tmp_path: Path) -> None:
    """NVIDIA's script unbinds a PF from whatever driver has it, vfio-pci included (a VM's
    whole GPU), and asks nothing: the model keeps that, so tests can prove vgpuctl never asks."""
    host = init_host(tmp_path, [f"A2@{A2}", f"L4@{L4}"], passthrough=[L4])
    pf = host.sysfs_root / "bus/pci/devices" / L4
    assert os.readlink(pf / "driver").endswith("/vfio-pci")
    r = run(host, "-e", L4)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Unbinding {L4} from vfio-pci\nEnabling VFs on {L4}\n"
    assert os.readlink(pf / "driver").endswith("/nvidia")
    assert numvfs(host, L4) == 32


def test_enable_does_nothing_on_a_gpu_without_vgpu_vfs(tmp_path: Path) -> None:
    """sriov_vf_device 0: the script exits 0 having done nothing (docs/domain.md §2)."""
    host = build_host(tmp_path, {"gpus": [{"model": "A2", "address": A2, "vgpuVfs": False}]})
    pf = host.sysfs_root / "bus/pci/devices" / A2
    assert (pf / "sriov_vf_device").read_text() == "0\n"
    r = run(host, "-e", A2)
    assert (r.returncode, r.stdout) == (0, "")
    assert numvfs(host, A2) == 0


def test_a_passthrough_address_must_name_a_gpu_given(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"passthrough 0000:09:00.0: no GPU given"):
        init_host(tmp_path, [f"A2@{A2}"], passthrough=["0000:09:00.0"])
