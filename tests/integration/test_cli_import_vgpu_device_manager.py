"""``vgpuctl import vgpu-device-manager`` as a user runs it: vgpu-device-manager's own example
configs (tests/fixtures/vgpu-device-manager, fetched at commit acb7270) converted, the result
accepted by ``vgpuctl validate``, and ``validate --explain`` naming, for each GPU of a
hand-written inventory, the entry the config meant for it.

Expected entries are written by hand from the example files: ``default`` gives 0x25B610DE
``A16-8Q: 2`` and ``A2-8Q: 2`` (the A2 and the A16 share that ID: docs/domain.md §4, subsystem
157e = A2, 14a9 = A16), 0x223610DE (A10) ``A10-12Q: 2``, 0x26B910DE (L40S) ``L40S-24Q: 2``;
``T4-small`` gives GPU 0 ``T4-1Q: 16`` and GPU 1 ``T4-2Q: 8``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.simnode import run_vgpuctl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vgpu-device-manager"


def _gpu(address: str, device: str, subsystem: str, model: str) -> dict[str, object]:
    return {
        "address": address,
        "vendorId": "10de",
        "deviceId": device,
        "subsystemVendorId": "10de",
        "subsystemDeviceId": subsystem,
        "model": model,
        "interface": "none",
        "driver": "nvidia",
        "sriov": {"totalVFs": 16, "numVFs": 0, "vfOffset": 4, "vfStride": 1, "vfDevice": device},
        "vgpuTypes": [],
        "vfs": [],
    }


def _inventory(path: Path, *gpus: dict[str, object]) -> Path:
    path.write_text(json.dumps({"node": "n1", "sysfsRoot": "/sys", "gpus": list(gpus)}))
    return path


A2 = _gpu("0000:08:00.0", "25b6", "157e", "NVIDIA A2")
A16 = _gpu("0000:09:00.0", "25b6", "14a9", "NVIDIA A16")
A10 = _gpu("0000:41:00.0", "2236", "1482", "NVIDIA A10")
L40S = _gpu("0000:81:00.0", "26b9", "1851", "NVIDIA L40S")


def _gpu_lines(stdout: str) -> list[str]:
    """The explanation's per-GPU lines, without the file:line:col of the entry."""
    lines = stdout.split("  its GPUs (", 1)[1].splitlines()[1:]
    return [re.sub(r" \([^()]*\.yaml:\d+:\d+\)", "", line) for line in lines]


def test_the_example_config_round_trips_and_explain_names_each_gpus_entry(
    tmp_path: Path,
) -> None:
    out = tmp_path / "desired"
    out.mkdir()
    res = run_vgpuctl("import", "vgpu-device-manager", FIXTURES / "config-example.yaml", "-o", out)
    # The two 0x1E7810DE entries (Quadro RTX 8000/6000 passive) are refused: exit 1, the
    # other 711 configs written all the same.
    assert res.returncode == 1, res.stderr
    assert res.stdout == ""
    assert res.stderr.splitlines()[-1] == "711 configs converted; 1 refusal"
    assert "refused: the entries at line 2868 (RTX8000P) and line 2872 (RTX6000P)" in res.stderr
    assert "config 'A2-4Q' is node group 'a2-4q'" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "vgpu-device-manager-1.yaml",
        "vgpu-device-manager-2.yaml",
        "vgpu-device-manager-3.yaml",
    ]
    res = run_vgpuctl("validate", out)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "711 node groups" in res.stdout

    inventory = _inventory(tmp_path / "inv.json", A2, A16, A10, L40S)
    res = run_vgpuctl(
        "validate", out, "--explain", "n1", "--labels", "nvidia.com/vgpu.config=default",
        "--inventory", inventory,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert _gpu_lines(res.stdout) == [
        "    GPU 0000:08:00.0 (NVIDIA A2): node group 'default': SR-IOV enabled; NVIDIA A2-8Q × 2",
        "    GPU 0000:09:00.0 (NVIDIA A16): node group 'default': SR-IOV enabled; "
        "NVIDIA A16-8Q × 2",
        "    GPU 0000:41:00.0 (NVIDIA A10): node group 'default': SR-IOV enabled; "
        "NVIDIA A10-12Q × 2",
        "    GPU 0000:81:00.0 (NVIDIA L40S): node group 'default': SR-IOV enabled; "
        "NVIDIA L40S-24Q × 2",
    ]
    # A per-type config: devices: all → every GPU of the node.
    res = run_vgpuctl(
        "validate", out, "--explain", "n1", "--labels", "nvidia.com/vgpu.config=A16-4C",
        "--inventory", _inventory(tmp_path / "a16.json", A16),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert _gpu_lines(res.stdout) == [
        "    GPU 0000:09:00.0 (NVIDIA A16): node group 'a16-4c': SR-IOV enabled; NVIDIA A16-4C × 4",
    ]


def test_the_t4_example_maps_gpu_indices_to_the_addresses_given(tmp_path: Path) -> None:
    config = FIXTURES / "config-t4.yaml"
    res = run_vgpuctl("import", "vgpu-device-manager", config)
    assert res.returncode == 1
    assert f"{config}:31:16: refused: GPU index 0: " in res.stderr
    assert res.stderr.splitlines()[-1] == "5 configs converted; 9 refusals"

    desired = tmp_path / "t4.yaml"
    res = run_vgpuctl(
        "import", "vgpu-device-manager", config, "-o", desired,
        "--gpu-address", "0=0000:08:00.0", "--gpu-address", "1=0000:09:00.0",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[-1] == "8 configs converted"
    assert run_vgpuctl("validate", desired).returncode == 0
    # Any two GPUs at those addresses: the T4 profiles are checked against the host at plan
    # time, explain says which entry each GPU gets.
    inventory = _inventory(tmp_path / "inv.json", A2, A16)
    res = run_vgpuctl(
        "validate", desired, "--explain", "n1", "--labels", "nvidia.com/vgpu.config=T4-small",
        "--inventory", inventory,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert _gpu_lines(res.stdout) == [
        "    GPU 0000:08:00.0 (NVIDIA A2): node group 't4-small': SR-IOV enabled; "
        "NVIDIA T4-1Q × 16",
        "    GPU 0000:09:00.0 (NVIDIA A16): node group 't4-small': SR-IOV enabled; "
        "NVIDIA T4-2Q × 8",
    ]


def test_more_groups_than_a_file_holds_need_a_directory(tmp_path: Path) -> None:
    res = run_vgpuctl("import", "vgpu-device-manager", FIXTURES / "config-example.yaml")
    assert res.returncode == 1
    assert res.stdout == ""
    assert "711 node groups are more than one file holds (256): give -o DIR" in res.stderr
    res = run_vgpuctl(
        "import", "vgpu-device-manager", FIXTURES / "config-example.yaml",
        "--config", "A2-4Q", "--config", "A16-4C",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[-1] == "2 configs converted"
    assert re.findall(r"^  - name: (.*)$", res.stdout, re.MULTILINE) == ["a2-4q", "a16-4c"]


def test_a_file_that_is_not_a_config_is_a_located_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nvgpu-configs:\n  a:\n    - devices: all\n")
    res = run_vgpuctl("import", "vgpu-device-manager", bad)
    assert res.returncode == 1
    assert res.stdout == ""
    assert res.stderr.strip() == f"{bad}:4:7: missing required field 'vgpu-devices'"
    res = run_vgpuctl("import", "vgpu-device-manager", tmp_path / "missing.yaml")
    assert res.returncode == 1
    assert "cannot read" in res.stderr


def test_a_link_planted_at_the_output_path_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("secret\n")
    planted = tmp_path / "out.yaml"
    planted.symlink_to(victim)
    res = run_vgpuctl(
        "import", "vgpu-device-manager", FIXTURES / "config-t4.yaml", "--config", "T4-1Q",
        "-o", planted,
    )  # fmt: skip
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"error: cannot write {planted}: it is a symbolic link, which vgpuctl neither follows "
        "nor replaces (remove it, or write elsewhere)"
    )
    assert victim.read_text() == "secret\n" and planted.is_symlink()
