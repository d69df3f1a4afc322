"""The simulator's MIG commands, the ones Harvester's pcidevices-controller runs
(pkg/util/gpuhelper/mig.go, bdd8025): ``--query-gpu=mig.mode.current``, ``-mig 1``,
``mig -lgip`` and ``mig -lgi``, run as subprocesses. Expected output written from pcidevices'
own capture of an A100 40GB (mig_test.go ``availableProfiles``) and NVIDIA's MIG user guide
(the A100 40GB's GPU instance profiles: 1g.5gb id 19 ×7 … 7g.40gb id 0 ×1); a GPU in MIG mode
offers MIG-backed types only, for GPU instances that exist (docs/domain.md §10)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reconciler.sim import SimHost, init_host, reboot

A100, A2 = "0000:08:00.0", "0000:18:00.0"
A100_VF0 = "0000:08:00.4"
QUERY = ("--query-gpu=mig.mode.current", "--format=csv,noheader")
#: pcidevices' capture of ``nvidia-smi mig -i 00000000:01:00.0 -lgip`` on an A100 40GB.
LGIP = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.5gb+me     20     1/1        4.75       No     14     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb       15     4/4        9.75       No     14     1     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.10gb       14     3/3        9.75       No     28     1     0   |
|                                                             2     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.20gb        9     2/2        19.62      No     42     2     0   |
|                                                             3     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 4g.20gb        5     1/1        19.62      No     56     2     0   |
|                                                             4     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.40gb        0     1/1        39.50      No     98     5     0   |
|                                                             7     1     1   |
+-----------------------------------------------------------------------------+
"""
#: The A100 40GB's time-sliced types (GRID A100-4C … 40C; the simulator's ids from 468).
A100_TIME_SLICED = {
    "GRID A100-4C",
    "GRID A100-5C",
    "GRID A100-8C",
    "GRID A100-10C",
    "GRID A100-20C",
    "GRID A100-40C",
}


def smi(host: SimHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(host.nvidia_smi), *args], check=False, capture_output=True, text=True, timeout=60
    )


def sriov_manage(host: SimHost, *args: str) -> None:
    subprocess.run([str(host.sriov_manage), *args], check=True, capture_output=True, timeout=60)


def creatable_names(host: SimHost, vf: str) -> set[str]:
    text = (host.sysfs_root / "bus/pci/devices" / vf / "nvidia/creatable_vgpu_types").read_text()
    return {line.split(":", 1)[1].strip() for line in text.splitlines()[1:]}


@pytest.fixture
def host(tmp_path: Path) -> SimHost:
    """An A100 40GB and an A2 on the vfio interface, SR-IOV off."""
    return init_host(tmp_path, [f"A100@{A100}", f"A2@{A2}"], interface="vfio", extra_devices=False)


def test_the_mig_mode_query_says_na_for_a_gpu_without_mig(host: SimHost) -> None:
    assert smi(host, "-i", A100, *QUERY).stdout == "Disabled\n"
    assert smi(host, "-i", A2, *QUERY).stdout == "[N/A]\n"


def test_mig_1_turns_mig_mode_on_and_the_vfs_offer_no_time_sliced_type(host: SimHost) -> None:
    sriov_manage(host, "-e", A100)
    assert creatable_names(host, A100_VF0) == A100_TIME_SLICED
    done = smi(host, "-i", A100, "-mig", "1")
    assert done.returncode == 0, done.stderr
    assert smi(host, "-i", A100, *QUERY).stdout == "Enabled\n"
    # No GPU instance exists: no MIG-backed type either.
    assert creatable_names(host, A100_VF0) == set()
    assert smi(host, "vgpu", "-s", "-v", "-i", A100).stdout == "GPU 00000000:08:00.0\n"
    with pytest.raises(OSError, match="MIG mode"):
        host.writer().write(f"bus/pci/devices/{A100_VF0}/nvidia/current_vgpu_type", "471")
    # Kept across sriov-manage -d/-e (nvidia-smi's setting lasts until changed or reset).
    sriov_manage(host, "-d", A100)
    sriov_manage(host, "-e", A100)
    assert creatable_names(host, A100_VF0) == set()
    # A reboot clears it (on a vGPU host MIG mode does not survive one).
    reboot(host.directory)
    assert smi(host, "-i", A100, *QUERY).stdout == "Disabled\n"


def test_an_a2_refuses_mig_mode(host: SimHost) -> None:
    refused = smi(host, "-i", A2, "-mig", "1")
    assert refused.returncode != 0
    assert smi(host, "-i", A2, *QUERY).stdout == "[N/A]\n"


def test_the_gpu_instance_profiles_are_the_a100s_and_there_are_no_instances(
    host: SimHost,
) -> None:
    assert smi(host, "mig", "-i", A100, "-lgip").returncode != 0  # not in MIG mode yet
    assert smi(host, "-i", A100, "-mig", "1").returncode == 0
    assert smi(host, "mig", "-i", A100, "-lgip").stdout == LGIP
    listed = smi(host, "mig", "-i", A100, "-lgi")
    assert listed.returncode == 6  # pcidevices runs it with "|| exit 0"
    assert "No GPU instances found" in listed.stdout + listed.stderr
