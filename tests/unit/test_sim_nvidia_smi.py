"""The simulator's ``nvidia-smi vgpu -i <GPU> -shm 0|1``, run as the real one is: a subprocess
with an exit code; and what mixed-size mode lets the simulated driver create."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from reconciler.model.mode import VgpuMode
from reconciler.sim import SimHost, build_host, hold, init_host, reboot

PF = "0000:08:00.0"
VF0, VF1, VF2 = "0000:08:00.4", "0000:08:00.5", "0000:08:00.6"
#: The simulator's L40S type ids (from 1145, in the catalogue's order; README: 24Q is 1155).
L40S_8Q, L40S_16Q, L40S_24Q, L40S_4C = "1152", "1154", "1155", "1167"


def smi(host: SimHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(host.nvidia_smi), *args], check=False, capture_output=True, text=True, timeout=60
    )


def sriov_manage(host: SimHost, *args: str) -> None:
    subprocess.run([str(host.sriov_manage), *args], check=True, capture_output=True, timeout=60)


def mode(host: SimHost) -> VgpuMode:
    (gpu,) = host.gpus()
    return gpu.vgpu_mode


def current(vf: str) -> str:
    return f"bus/pci/devices/{vf}/nvidia/current_vgpu_type"


def creatable_names(host: SimHost, vf: str) -> set[str]:
    text = (host.sysfs_root / "bus/pci/devices" / vf / "nvidia/creatable_vgpu_types").read_text()
    return {line.split(":", 1)[1].strip() for line in text.splitlines()[1:]}


def errno_of(host: SimHost, path: str, value: str) -> int | None:
    try:
        host.writer().write(path, value)
    except OSError as exc:
        return exc.errno
    return None


@pytest.fixture
def l40s(tmp_path: Path) -> SimHost:
    """An L40S on the vfio interface, SR-IOV on, no vGPU."""
    host = init_host(tmp_path, [f"L40S@{PF}"], interface="vfio", extra_devices=False)
    sriov_manage(host, "-e", PF)
    return host


def test_the_script_sits_beside_sriov_manage(l40s: SimHost) -> None:
    assert l40s.nvidia_smi == l40s.directory / "bin" / "nvidia-smi"
    assert l40s.nvidia_smi.parent == l40s.sriov_manage.parent
    assert l40s.nvidia_smi.stat().st_mode & 0o111


def test_mixed_size_mode_lets_an_8q_and_a_16q_share_an_l40s(l40s: SimHost) -> None:
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    r = smi(l40s, "vgpu", "-i", PF, "-shm", "1")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert mode(l40s) is VgpuMode.MIXED_SIZE
    w = l40s.writer()
    w.write(current(VF0), L40S_8Q)
    w.write(current(VF1), L40S_16Q)
    assert (l40s.sysfs_root / current(VF1)).read_text() == f"{L40S_16Q}\n"
    # 8 + 16 of 48 GB used: 24 GB still fit, 48 GB no longer; 1 GB types still fit.
    names = creatable_names(l40s, VF2)
    assert {"NVIDIA L40S-24Q", "NVIDIA L40S-8Q", "NVIDIA L40S-1Q"} <= names
    assert "NVIDIA L40S-48Q" not in names
    w.write(current(VF2), L40S_24Q)  # 8 + 16 + 24 = 48: the GPU is full
    assert creatable_names(l40s, "0000:08:00.7") == set()


def test_in_equal_size_mode_the_16q_is_refused_after_the_8q(l40s: SimHost) -> None:
    l40s.writer().write(current(VF0), L40S_8Q)
    assert errno_of(l40s, current(VF1), L40S_16Q) == errno.EINVAL
    assert creatable_names(l40s, VF1) == {"NVIDIA L40S-8Q", "NVIDIA L40S-8A", "NVIDIA L40S-8C"}


def test_shm_is_refused_while_the_gpu_hosts_a_vgpu(l40s: SimHost) -> None:
    l40s.writer().write(current(VF0), L40S_8Q)
    r = smi(l40s, "vgpu", "-i", PF, "-shm", "1")
    assert r.returncode != 0
    assert r.stdout == ""
    assert f"GPU {PF} hosts 1 vGPU (the first on {VF0})" in r.stderr
    assert mode(l40s) is VgpuMode.EQUAL_SIZE


def test_shm_0_is_refused_too_while_a_vgpu_exists(l40s: SimHost) -> None:
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    l40s.writer().write(current(VF0), L40S_8Q)
    r = smi(l40s, "vgpu", "-i", PF, "-shm", "0")
    assert r.returncode != 0
    assert "hosts 1 vGPU" in r.stderr
    assert mode(l40s) is VgpuMode.MIXED_SIZE


def test_shm_is_refused_while_sriov_is_off(tmp_path: Path) -> None:
    host = init_host(tmp_path, [f"L40S@{PF}"], interface="vfio", extra_devices=False)
    r = smi(host, "vgpu", "-i", PF, "-shm", "1")
    assert r.returncode != 0
    assert "SR-IOV off" in r.stderr
    assert mode(host) is VgpuMode.EQUAL_SIZE


def test_shm_0_returns_to_equal_size_and_repeats_are_fine(l40s: SimHost) -> None:
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    assert mode(l40s) is VgpuMode.MIXED_SIZE
    assert smi(l40s, "vgpu", "-i", "00000000:08:00.0", "-shm", "0").returncode == 0
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    assert l40s.stats()["nvidiaSmiCalls"] == 3


def test_sriov_manage_disable_clears_the_mode(l40s: SimHost) -> None:
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    sriov_manage(l40s, "-d", PF)
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    sriov_manage(l40s, "-e", PF)
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    l40s.writer().write(current(VF0), L40S_8Q)
    assert errno_of(l40s, current(VF1), L40S_16Q) == errno.EINVAL


def test_a_failed_disable_keeps_the_mode(tmp_path: Path) -> None:
    host = build_host(
        tmp_path,
        {
            "extraDevices": False,
            "gpus": [
                {
                    "model": "L40S",
                    "address": PF,
                    "interface": "vfio",
                    "vgpuMode": "mixed-size",
                    "vgpus": {0: "L40S-8Q", 1: "L40S-16Q"},
                }
            ],
        },
    )
    hold(host.directory, VF0)
    r = subprocess.run([str(host.sriov_manage), "-d", PF], check=False, capture_output=True)
    assert r.returncode == 1
    assert mode(host) is VgpuMode.MIXED_SIZE


def test_reboot_clears_the_mode(l40s: SimHost) -> None:
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    reboot(l40s.directory)
    assert mode(l40s) is VgpuMode.EQUAL_SIZE


def test_the_mode_is_in_the_state_file_and_an_old_file_loads_equal_size(l40s: SimHost) -> None:
    state_file = l40s.sysfs_root / ".vgpuctl-sim/state.json"
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    raw = json.loads(state_file.read_text())
    assert [g["vgpuMode"] for g in raw["gpus"]] == ["mixed-size"]
    # A file from before the mode: no vgpuMode, no model framebuffer, no mixed-size maxima.
    for g in raw["gpus"]:
        del g["vgpuMode"]
    for m in raw["models"].values():
        del m["framebufferMiB"]
        for t in m["types"]:
            t.pop("mixedSizeMaxInstance", None)
    state_file.write_text(json.dumps(raw))
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    l40s.writer().write(current(VF0), L40S_8Q)  # the old host still works as before
    assert errno_of(l40s, current(VF1), L40S_16Q) == errno.EINVAL


def test_build_host_sets_the_mode_before_the_vgpus(tmp_path: Path) -> None:
    spec = {
        "extraDevices": False,
        "gpus": [
            {
                "model": "L40S",
                "address": PF,
                "vgpuMode": "mixed-size",
                "vgpus": {0: "L40S-8Q", 1: "L40S-16Q"},
            }
        ],
    }
    host = build_host(tmp_path, spec)  # mdev: sizes differ in mixed-size mode there too
    assert mode(host) is VgpuMode.MIXED_SIZE


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"model": "L40S", "vgpuMode": "mixed"}, r"gpus\[0\]\.vgpuMode: expected equal-size"),
        ({"model": "L40S", "vgpuMode": "mixed-size"}, r"mixed-size needs SR-IOV enabled"),
        (
            {"model": "L40S", "vgpus": {0: "L40S-8Q", 1: "L40S-16Q"}},
            r"gpus\[0\]\.vgpus\[1\]: NVIDIA L40S-16Q: .*equal-size mode",
        ),
    ],
)
def test_build_host_refuses_a_bad_mode(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_host(tmp_path, {"gpus": [entry]})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "only 'vgpu -i <GPU> -shm 0|1' is simulated"),
        (("-q",), "only 'vgpu -i <GPU> -shm 0|1' is simulated"),
        (("vgpu", "-shm", "1"), "-i <GPU PCI address> is required"),
        (("vgpu", "-i", PF), "-shm 0|1 is required"),
        (("vgpu", "-i", PF, "-shm", "2"), "-shm takes 0 or 1, not '2'"),
        (("vgpu", "-i", "0", "-shm", "1"), "invalid GPU '0'"),
        (("vgpu", "-i", PF, "-shm"), "-shm needs a value"),
        (("vgpu", "-i", PF, "-shm", "1", "-x"), "unknown option -x"),
    ],
)
def test_usage_errors_exit_2_and_change_nothing(
    l40s: SimHost, args: tuple[str, ...], message: str
) -> None:
    r = smi(l40s, *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "usage: nvidia-smi vgpu" in r.stderr
    assert mode(l40s) is VgpuMode.EQUAL_SIZE


def test_a_gpu_that_is_not_there_exits_2(l40s: SimHost) -> None:
    r = smi(l40s, "vgpu", "-i", "0000:09:00.0", "-shm", "1")
    assert r.returncode == 2
    assert "0000:09:00.0" in r.stderr


def test_four_c_stops_at_its_mixed_size_maximum(tmp_path: Path) -> None:
    """L40S-4C: 8 in mixed-size mode (12 in equal-size mode), though 8 × 4 GB leave 16 GB."""
    vgpus = dict.fromkeys(range(8), "L40S-4C")
    spec = {
        "extraDevices": False,
        "gpus": [
            {
                "model": "L40S",
                "address": PF,
                "interface": "vfio",
                "vgpuMode": "mixed-size",
                "vgpus": vgpus,
            }
        ],
    }
    host = build_host(tmp_path, spec)
    ninth = "0000:08:01.4"  # VF 8: routing id of 08:00.0 + 4 + 8
    names = creatable_names(host, ninth)
    assert "NVIDIA L40S-4C" not in names
    assert {"NVIDIA L40S-4Q", "NVIDIA L40S-16Q"} <= names  # no mixed-size maximum known there
    assert errno_of(host, current(ninth), L40S_4C) == errno.EINVAL
