"""The simulator's ``nvidia-smi vgpu -i <GPU> -shm 0|1`` and ``nvidia-smi -q [-i <GPU>]``, run
as the real one is: a subprocess with an exit code; and what mixed-size mode lets the simulated
driver create."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from reconciler.model.mode import VgpuMode
from reconciler.sim import SimHost, build_host, hold, init_host, reboot
from reconciler.sim.nvidia_smi import SIMULATED
from reconciler.sim.state import load_state

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


def placement_id(vf: str) -> str:
    return f"bus/pci/devices/{vf}/nvidia/placement_id"


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
    assert (
        "only 'vgpu -i <GPU> -shm 0|1', 'vgpu -s -v -i <GPU>', '-q [-i <GPU>]', "
        "'-i <GPU> --query-gpu=mig.mode.current --format=csv,noheader', '-i <GPU> -mig 0|1' and "
        "'mig -i <GPU> -lgip|-lgi'"
    ) in l40s.nvidia_smi.read_text()


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
    # 8 + 16 of 48 GB used, at the lowest placements (the model, rules.py): the 8Q at slots
    # 0-7, the 16Q at 16-31. 24 GB are free but not at a 24Q's placements (0, 24): refused
    # by fragmentation; a 16Q still fits at 32, an 8Q at 8, 1 GB types anywhere free.
    names = creatable_names(l40s, VF2)
    assert {"NVIDIA L40S-16Q", "NVIDIA L40S-8Q", "NVIDIA L40S-1Q"} <= names
    assert "NVIDIA L40S-24Q" not in names and "NVIDIA L40S-48Q" not in names
    assert errno_of(l40s, current(VF2), L40S_24Q) == errno.EINVAL
    assert (l40s.sysfs_root / placement_id(VF1)).read_text() == "16\n"
    w.write(current(VF2), L40S_16Q)  # slots 32-47
    w.write(current("0000:08:00.7"), L40S_8Q)  # slots 8-15: 8 + 16 + 16 + 8 = 48, full
    assert (l40s.sysfs_root / placement_id("0000:08:00.7")).read_text() == "8\n"
    assert creatable_names(l40s, "0000:08:01.0") == set()


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
        ((), f"only {SIMULATED} are simulated, not 'nothing'"),
        (("-i", PF), f"only {SIMULATED} are simulated, not '-i'"),
        (("vgpu", "-s", "-i", PF), "only 'vgpu -s -v -i <GPU>' is simulated"),
        (("vgpu", "-s", "-v"), "-i <GPU PCI address> is required"),
        (("vgpu", "-s", "-v", "-i", PF, "-shm", "1"), "-s does not combine with -shm"),
        (("vgpu", "-s", "-v", "-i", "0"), "invalid GPU '0'"),
        (("vgpu", "-shm", "1"), "-i <GPU PCI address> is required"),
        (("vgpu", "-i", PF), "-shm 0|1 is required"),
        (("vgpu", "-i", PF, "-shm", "2"), "-shm takes 0 or 1, not '2'"),
        (("vgpu", "-i", "0", "-shm", "1"), "invalid GPU '0'"),
        (("vgpu", "-i", PF, "-shm"), "-shm needs a value"),
        (("vgpu", "-i", PF, "-shm", "1", "-x"), "unknown option -x"),
        (("-q", "-shm", "1"), "-q does not combine with 'vgpu' or -shm"),
        (("-q", "-i", PF, "-shm", "1"), "-q does not combine with 'vgpu' or -shm"),
        (("-q", "vgpu", "-i", PF, "-shm", "1"), "-q does not combine with 'vgpu' or -shm"),
        (("vgpu", "-i", PF, "-shm", "1", "-q"), "-q does not combine with 'vgpu' or -shm"),
        (("-q", "-i", "0"), "invalid GPU '0'"),
        (("-q", "-i"), "-i needs a value"),
        (("-q", "-i", PF, "-i", PF), "give -i once"),
        (("-q", "-q"), "give -q once"),
        (("-q", "-x"), "unknown option -x"),
        (("-q", PF), f"unexpected argument {PF}"),
    ],
)
def test_usage_errors_exit_2_and_change_nothing(
    l40s: SimHost, args: tuple[str, ...], message: str
) -> None:
    r = smi(l40s, *args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert message in r.stderr
    assert "usage: nvidia-smi vgpu -i <GPU PCI address> -shm <0|1>\n" in r.stderr
    assert "       nvidia-smi -q [-i <GPU PCI address>]\n" in r.stderr
    assert mode(l40s) is VgpuMode.EQUAL_SIZE  # SR-IOV is on: a -shm 1 run would have set it
    assert l40s.stats()["nvidiaSmiCalls"] == 0
    assert load_state(l40s.sysfs_root).counters.get("nvidiaSmiQueries", 0) == 0


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


# --- nvidia-smi -q: the query of the mode -------------------------------------------------------

PF_AF = "0000:af:00.0"  # a bus with hex letters: nvidia-smi prints them upper-case

#: The header of ``nvidia-smi -q`` (real captures: a blank line before the banner; keys padded to
#: column 42), the timestamp replaced by ``<time>``.
HEADER_1_GPU = (
    "\n"
    "==============NVSMI LOG==============\n"
    "\n"
    "Timestamp                                 : <time>\n"
    "Driver Version                            : 550.127.06\n"
    "CUDA Version                              : Not Found\n"
    "\n"
    "Attached GPUs                             : 1\n"
)
HEADER_2_GPUS = HEADER_1_GPU.replace(
    "Attached GPUs                             : 1\n",
    "Attached GPUs                             : 2\n",
)
L40S_08_EQUAL = (
    "GPU 00000000:08:00.0\n"
    "    Product Name                          : NVIDIA L40S\n"
    "    GPU Virtualization Mode\n"
    "        Virtualization Mode               : Host VGPU\n"
    "        Host VGPU Mode                    : SR-IOV\n"
    "        vGPU Heterogeneous Mode           : Disabled\n"
    "\n"
)
L40S_08_MIXED = (
    "GPU 00000000:08:00.0\n"
    "    Product Name                          : NVIDIA L40S\n"
    "    GPU Virtualization Mode\n"
    "        Virtualization Mode               : Host VGPU\n"
    "        Host VGPU Mode                    : SR-IOV\n"
    "        vGPU Heterogeneous Mode           : Enabled\n"
    "\n"
)
A2_AF_EQUAL = (
    "GPU 00000000:AF:00.0\n"
    "    Product Name                          : NVIDIA A2\n"
    "    GPU Virtualization Mode\n"
    "        Virtualization Mode               : Host VGPU\n"
    "        Host VGPU Mode                    : SR-IOV\n"
    "        vGPU Heterogeneous Mode           : Disabled\n"
    "\n"
)

#: ``Timestamp: Wed Dec  2 12:26:04 2026``, as ctime(3) writes it.
TIMESTAMP = re.compile(
    r"^Timestamp {33}: [A-Z][a-z]{2} [A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d \d{4}$", re.MULTILINE
)


def query(host: SimHost, *args: str) -> str:
    """``nvidia-smi -q ARGS``'s stdout (a success, nothing on stderr), the time as ``<time>``."""
    r = smi(host, "-q", *args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    text, found = TIMESTAMP.subn("Timestamp                                 : <time>", r.stdout)
    assert found == 1, r.stdout
    return text


def queries(host: SimHost) -> int:
    return load_state(host.sysfs_root).counters.get("nvidiaSmiQueries", 0)


@pytest.fixture
def two_gpus(tmp_path: Path) -> SimHost:
    """An A2 at af:00.0 (given first) and an L40S at 08:00.0, SR-IOV on both, no vGPU; the
    L40S in mixed-size mode."""
    host = init_host(tmp_path, [f"A2@{PF_AF}", f"L40S@{PF}"], interface="vfio", extra_devices=False)
    sriov_manage(host, "-e", PF_AF)
    sriov_manage(host, "-e", PF)
    assert smi(host, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    return host


def test_query_shows_every_gpu_in_address_order(two_gpus: SimHost) -> None:
    out = query(two_gpus)
    assert out == HEADER_2_GPUS + L40S_08_MIXED + A2_AF_EQUAL
    # The layout of real captures: a value at column 42 on every line that has one.
    for line in out.splitlines():
        if ": " in line:
            assert line.index(": ") == 42, line


def test_query_sorts_the_gpus_whatever_the_state_files_order(two_gpus: SimHost) -> None:
    state_file = two_gpus.sysfs_root / ".vgpuctl-sim/state.json"
    raw = json.loads(state_file.read_text())
    raw["gpus"].reverse()
    assert [g["address"] for g in raw["gpus"]] == [PF_AF, PF]
    state_file.write_text(json.dumps(raw))
    assert query(two_gpus) == HEADER_2_GPUS + L40S_08_MIXED + A2_AF_EQUAL


def test_query_with_i_shows_only_that_gpu(two_gpus: SimHost) -> None:
    assert query(two_gpus, "-i", PF_AF) == HEADER_2_GPUS + A2_AF_EQUAL
    assert query(two_gpus, "-i", PF) == HEADER_2_GPUS + L40S_08_MIXED
    r = smi(two_gpus, "-i", PF, "-q")  # -i before -q
    assert r.returncode == 0, r.stderr
    assert TIMESTAMP.sub("Timestamp                                 : <time>", r.stdout) == (
        HEADER_2_GPUS + L40S_08_MIXED
    )


@pytest.mark.parametrize("gpu", ["00000000:AF:00.0", "00000000:af:00.0", "0000:AF:00.0"])
def test_query_takes_nvidia_smis_bus_id_form(two_gpus: SimHost, gpu: str) -> None:
    assert query(two_gpus, "-i", gpu) == HEADER_2_GPUS + A2_AF_EQUAL


def test_query_of_a_gpu_that_is_not_there_exits_2(two_gpus: SimHost) -> None:
    r = smi(two_gpus, "-q", "-i", "00000000:09:00.0")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == "No GPU with the PCI bus id 0000:09:00.0 is found.\n"


def test_query_with_shm_exits_2_and_sets_nothing(l40s: SimHost) -> None:
    r = smi(l40s, "-q", "-i", PF, "-shm", "1")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "nvidia-smi: -q does not combine with 'vgpu' or -shm" in r.stderr
    assert mode(l40s) is VgpuMode.EQUAL_SIZE
    assert l40s.stats()["nvidiaSmiCalls"] == 0


def tree_snapshot(host: SimHost) -> dict[str, tuple[int, int, str]]:
    """Every path of the sysfs tree but the simulator's own directory: (mode, mtime, link)."""
    snapshot: dict[str, tuple[int, int, str]] = {}
    for directory, dirs, files in os.walk(host.sysfs_root):
        dirs[:] = [d for d in dirs if d != ".vgpuctl-sim"]
        for name in [*dirs, *files]:
            path = Path(directory, name)
            st = path.lstat()
            link = os.readlink(path) if path.is_symlink() else ""
            snapshot[str(path.relative_to(host.sysfs_root))] = (st.st_mode, st.st_mtime_ns, link)
    return snapshot


def test_query_changes_nothing_but_its_counter(two_gpus: SimHost) -> None:
    state_file = two_gpus.sysfs_root / ".vgpuctl-sim/state.json"
    before = json.loads(state_file.read_text())
    tree_before = tree_snapshot(two_gpus)
    stats_before = two_gpus.stats()
    assert "nvidiaSmiQueries" not in before["counters"]
    query(two_gpus)
    query(two_gpus, "-i", PF)
    assert smi(two_gpus, "-q", "-i", "0000:09:00.0").returncode == 2  # counted too
    after = json.loads(state_file.read_text())
    assert after["counters"].pop("nvidiaSmiQueries") == 3
    assert after == before
    assert tree_snapshot(two_gpus) == tree_before
    assert (
        two_gpus.stats()
        == stats_before
        == {
            "writes": 0,
            "sriovManageCalls": 2,
            "nvidiaSmiCalls": 1,
        }
    )
    assert [g.vgpu_mode for g in two_gpus.gpus()] == [VgpuMode.MIXED_SIZE, VgpuMode.EQUAL_SIZE]


def test_query_after_sriov_manage_disable_shows_disabled(l40s: SimHost) -> None:
    assert query(l40s) == HEADER_1_GPU + L40S_08_EQUAL
    assert smi(l40s, "vgpu", "-i", PF, "-shm", "1").returncode == 0
    assert query(l40s, "-i", PF) == HEADER_1_GPU + L40S_08_MIXED
    sriov_manage(l40s, "-d", PF)
    assert query(l40s) == HEADER_1_GPU + L40S_08_EQUAL
    assert queries(l40s) == 3


def test_query_reports_the_driver_version_the_module_shows(l40s: SimHost) -> None:
    version = l40s.sysfs_root / "module/nvidia/version"
    assert version.read_text() == "550.127.06\n"
    version.unlink()
    version.write_text("550.90.05\n")
    out = query(l40s)
    assert "Driver Version                            : 550.90.05\n" in out
    version.unlink()  # no version file: the simulator's own
    assert query(l40s) == HEADER_1_GPU + L40S_08_EQUAL


def test_help_names_the_query(l40s: SimHost) -> None:
    r = smi(l40s, "-h")
    assert r.returncode == 0
    assert r.stdout == (
        "usage: nvidia-smi vgpu -i <GPU PCI address> -shm <0|1>\n"
        "       nvidia-smi vgpu -s -v -i <GPU PCI address>\n"
        "       nvidia-smi -q [-i <GPU PCI address>]\n"
        "       nvidia-smi -i <GPU PCI address> --query-gpu=mig.mode.current "
        "--format=csv,noheader\n"
        "       nvidia-smi -i <GPU PCI address> -mig <0|1>\n"
        "       nvidia-smi mig -i <GPU PCI address> -lgip|-lgi\n"
    )


# -- vgpu -s -v -i <GPU>: the GPU's supported types ------------------------------------------


def test_supported_types_name_every_id_the_vfs_write_even_at_the_maximum(l40s: SimHost) -> None:
    """``vgpu -s -v`` lists every type of the GPU whatever it hosts, in the public capture's
    layout, its ids in hex: read back with vgpuctl's own parser they are the ids sysfs
    prints, even once no VF lists the one in use (one L40S-48Q: every list a header only)."""
    from reconciler.model import PciAddress
    from reconciler.observe.parse import parse_creatable_types
    from reconciler.observe.vgputypes import parse_supported_types

    text = (l40s.sysfs_root / "bus/pci/devices" / VF0 / "nvidia/creatable_vgpu_types").read_text()
    listed = dict(parse_creatable_types(text)[0])
    before = smi(l40s, "vgpu", "-s", "-v", "-i", "00000000:08:00.0")
    assert before.returncode == 0, before.stderr
    lines = before.stdout.splitlines()
    assert lines[0] == "GPU 00000000:08:00.0"
    assert lines[1] == "    vGPU Type ID                          : 0x479"  # 1145
    assert lines[2] == "        Name                              : NVIDIA L40S-1B"
    answer = parse_supported_types(before.stdout, PciAddress.parse(PF))
    assert answer.problem is None
    assert dict(answer.names) == listed
    l40s.writer().write(current(VF0), answer_id(answer.names, "NVIDIA L40S-48Q"))
    assert creatable_names(l40s, VF1) == set()
    after = smi(l40s, "vgpu", "-s", "-v", "-i", PF)
    assert after.returncode == 0
    assert after.stdout == before.stdout  # supported, not creatable: nothing narrows
    assert load_state(l40s.sysfs_root).counters["nvidiaSmiTypeQueries"] == 2


def answer_id(names: Mapping[str, str], name: str) -> str:
    (type_id,) = [t for t, n in names.items() if n == name]
    return type_id


def test_supported_types_of_an_unknown_gpu_exit_2(l40s: SimHost) -> None:
    r = smi(l40s, "vgpu", "-s", "-v", "-i", "0000:09:00.0")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "No GPU with the PCI bus id 0000:09:00.0 is found." in r.stderr
