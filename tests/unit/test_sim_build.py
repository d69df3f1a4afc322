"""``build_host``: a host in a given state, straight from a spec, under the driver's rules."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from reconciler.sim import SimHost, build_host
from tests.holds import asked

PF = "0000:08:00.0"
HELD = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
SEED_SPEC: dict[str, Any] = {
    "gpus": [
        {
            "model": "A2",
            "address": PF,
            "sriov": "enabled",
            "vgpus": {
                0: "NVIDIA A2-4Q",
                5: {"type": "NVIDIA A2-4A", "uuid": HELD, "held": True},
            },
        }
    ]
}


def snapshot(root: Path) -> dict[str, str]:
    """Every entry below ``root``: link target, file text or "dir" (the lock file aside)."""
    out: dict[str, str] = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif n != "lock":
                out[rel] = p.read_text()
    return out


def mdev_of(host: SimHost, vf: str) -> tuple[str, str] | None:
    """(uuid, type name) of the mdev on a VF, read from the tree."""
    vf_dir = host.sysfs_root / "bus/pci/devices" / vf
    for entry in os.listdir(vf_dir):
        if (vf_dir / entry / "mdev_type").exists():
            return entry, (vf_dir / entry / "mdev_type" / "name").read_text().strip()
    return None


def test_the_seed_node_is_built_as_specified(tmp_path: Path) -> None:
    host = build_host(tmp_path, SEED_SPEC)
    default = str(uuid.uuid5(uuid.NAMESPACE_URL, "sim/0000:08:00.4"))
    assert mdev_of(host, "0000:08:00.4") == (default, "NVIDIA A2-4Q")
    assert mdev_of(host, "0000:08:01.1") == (HELD, "NVIDIA A2-4A")
    assert mdev_of(host, "0000:08:00.5") is None
    assert host.hold_probe().scan(asked(default, HELD)).held == {HELD: "simulated VM"}
    types = host.sysfs_root / "bus/pci/devices/0000:08:00.5/mdev_supported_types"
    open_types = {
        (d / "name").read_text().strip()
        for d in types.iterdir()
        if (d / "available_instances").read_text() == "1\n"
    }
    assert open_types == {"NVIDIA A2-4Q", "NVIDIA A2-4A", "NVIDIA A2-4C"}
    assert host.stats() == {"writes": 0, "sriovManageCalls": 0, "nvidiaSmiCalls": 0}


def test_build_is_deterministic(tmp_path: Path) -> None:
    spec = {
        "gpus": [
            *SEED_SPEC["gpus"],
            {"model": "L40S", "vgpus": dict.fromkeys(range(0, 12, 2), "L40S-8Q")},
            {"model": "A16", "address": "0000:41:00.0", "sriov": "enabled"},
        ]
    }
    one = build_host(tmp_path / "one", spec)
    two = build_host(tmp_path / "two", spec)
    a, b = snapshot(one.sysfs_root), snapshot(two.sysfs_root)
    assert a == b
    assert len(a) > 10_000


def test_a16_board_entry_covers_all_four_gpus(tmp_path: Path) -> None:
    host = build_host(
        tmp_path,
        {
            "gpus": [
                {
                    "model": "A16",
                    "address": "0000:41:00.0",
                    "vgpus": {0: "A16-2Q", "0000:43:00.5": "A16-16Q"},
                }
            ]
        },
    )
    assert [str(g.address) for g in host.gpus()] == [
        "0000:41:00.0",
        "0000:42:00.0",
        "0000:43:00.0",
        "0000:44:00.0",
    ]
    assert all(g.sriov_enabled for g in host.gpus())
    assert mdev_of(host, "0000:41:00.4") is not None
    assert mdev_of(host, "0000:43:00.5") is not None
    # Each GPU of the board has its own framebuffer: 2 GB and 16 GB vGPUs coexist on the board.
    assert mdev_of(host, "0000:43:00.5")[1] == "NVIDIA A16-16Q"  # type: ignore[index]


def test_sriov_enabled_by_default_only_when_vgpus_are_given(tmp_path: Path) -> None:
    host = build_host(tmp_path, {"gpus": [{"model": "A2"}, {"model": "L4", "vgpus": {0: "L4-4Q"}}]})
    assert [g.sriov_enabled for g in host.gpus()] == [False, True]


def test_built_host_works_with_sriov_manage(tmp_path: Path) -> None:
    host = build_host(tmp_path, SEED_SPEC)
    r = subprocess.run(
        [str(host.sriov_manage), "-e", PF], check=False, capture_output=True, text=True
    )
    assert r.returncode == 0
    assert "already has VFs enabled" in r.stdout
    r = subprocess.run(
        [str(host.sriov_manage), "-d", PF], check=False, capture_output=True, text=True
    )
    assert r.returncode == 1  # the held vGPU


def test_vfio_spec_uses_the_vf_as_the_vgpu(tmp_path: Path) -> None:
    host = build_host(
        tmp_path,
        {
            "interface": "vfio",
            "gpus": [{"model": "A2", "address": PF, "vgpus": {1: {"type": "A2-2Q", "held": True}}}],
        },
    )
    current = host.sysfs_root / "bus/pci/devices/0000:08:00.5/nvidia/current_vgpu_type"
    assert current.read_text() == "745\n"
    assert host.hold_probe().scan(asked("0000:08:00.5")).held == {"0000:08:00.5": "simulated VM"}


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"model": "A2", "vgpus": {0: "A2-4Q", 1: "A2-2Q"}}, "equal-size"),
        ({"model": "A2", "vgpus": dict.fromkeys(range(5), "A2-4Q")}, "max_instance=4"),
        ({"model": "A2", "vgpus": {0: "L4-4Q"}}, "does not offer"),
        ({"model": "A100", "vgpus": {0: "A100-1-5C"}}, "does not offer"),  # MIG-backed
        ({"model": "A2", "vgpus": {16: "A2-1Q"}}, "out of range"),
        ({"model": "A2", "vgpus": {"0000:09:00.4": "A2-1Q"}}, "not a VF"),
        ({"model": "A2", "sriov": "disabled", "vgpus": {0: "A2-1Q"}}, "SR-IOV"),
        ({"model": "A2", "sriov": "maybe"}, "enabled or disabled"),
        ({"model": "A2", "vgpus": {0: {"type": "A2-1Q", "uuid": "nope"}}}, "not a UUID"),
        ({"model": "A2", "vgpus": {0: {"profile": "A2-1Q"}}}, "unknown keys"),
        ({"model": "A2", "vfs": 3}, "unknown keys"),
        ({"model": "Z9"}, "unknown GPU model"),
        ({"address": PF}, "'model' is required"),
        ({"model": "A2", "interface": "sriov"}, r"gpus\[0\]\.interface: expected one of mdev"),
        ({"model": "A2", "interface": None}, r"gpus\[0\]\.interface: expected one of mdev"),
        (
            {"model": "A2", "interface": "vfio", "vgpus": {0: {"type": "A2-1Q", "uuid": HELD}}},
            "the vfio interface has no UUIDs",
        ),
    ],
)
def test_impossible_specs_are_refused(tmp_path: Path, gpu: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_host(tmp_path, {"gpus": [gpu]})
    assert not (tmp_path / "sys").exists()  # nothing half-built is left behind
    assert not (tmp_path / "bin" / "sriov-manage").exists()


def test_an_unknown_top_level_interface_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="simulator spec interface: expected one of mdev, vfio"):
        build_host(tmp_path, {"interface": "pci", "gpus": [{"model": "A2"}]})
    assert not (tmp_path / "sys").exists()


def test_duplicate_uuids_in_a_spec_are_refused(tmp_path: Path) -> None:
    vgpu = {"type": "A2-1Q", "uuid": HELD}
    with pytest.raises(ValueError, match="already exists"):
        build_host(tmp_path, {"gpus": [{"model": "A2", "vgpus": {0: vgpu, 1: vgpu}}]})


def test_unknown_top_level_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        build_host(tmp_path, {"gpus": [], "gpu": []})


def test_state_file_holds_what_sysfs_cannot(tmp_path: Path) -> None:
    host = build_host(tmp_path, SEED_SPEC)
    state = json.loads((host.sysfs_root / ".vgpuctl-sim/state.json").read_text())
    assert state["formatVersion"] == 1
    assert "interface" not in state  # per GPU now
    assert [g["model"] for g in state["gpus"]] == ["NVIDIA A2"]
    assert [g["interface"] for g in state["gpus"]] == ["mdev"]
    assert len(state["gpus"][0]["vfs"]) == 16
    assert state["vgpus"][HELD]["type"] == "NVIDIA A2-4A"
    assert state["held"] == {HELD: "simulated VM"}
    assert state["faults"] == {"writes": 0, "sriovManage": None, "crashAfter": None}
    assert state["counters"] == {"writes": 0, "sriovManageCalls": 0}
    groups = state["iommuGroups"]
    assert groups[str(state["vgpus"][HELD]["iommuGroup"])] == HELD
    assert sorted(map(int, groups)) == list(range(len(groups)))  # lowest free numbers


@pytest.mark.slow
def test_eight_l40s_with_sriov_on(tmp_path: Path) -> None:
    """256 VFs × 29 types (about 55,000 files); its build time is in `just bench`."""
    spec = {"gpus": [{"model": "L40S", "sriov": "enabled"} for _ in range(8)]}
    host = build_host(tmp_path, spec)
    assert sum(1 for g in host.gpus() if g.sriov_enabled) == 8


# --- an interface per GPU ------------------------------------------------------------------------

PF2 = "0000:09:00.0"
MIXED_SPEC: dict[str, Any] = {
    "interface": "vfio",  # the default: the second GPU takes it
    "extraDevices": False,
    "gpus": [
        {"model": "A2", "address": PF, "interface": "mdev", "vgpus": {0: "A2-4Q"}},
        {"model": "A2", "address": PF2, "vgpus": {1: {"type": "A2-2Q", "held": True}}},
    ],
}


def test_each_gpu_entry_may_have_its_own_interface(tmp_path: Path) -> None:
    host = build_host(tmp_path, MIXED_SPEC)
    devices = host.sysfs_root / "bus/pci/devices"
    assert [(str(g.address), g.interface) for g in host.gpus()] == [(PF, "mdev"), (PF2, "vfio")]
    assert host.interface == "mixed"
    # The mdev GPU: its vGPU is an mdev with the default UUID, on the mdev bus.
    default = str(uuid.uuid5(uuid.NAMESPACE_URL, "sim/0000:08:00.4"))
    assert mdev_of(host, "0000:08:00.4") == (default, "NVIDIA A2-4Q")
    assert os.listdir(host.sysfs_root / "bus/mdev/devices") == [default]
    assert not (devices / "0000:08:00.4/nvidia").exists()
    # The vfio GPU: the VF is the vGPU (A2-2Q is id 745), no mdev directories.
    assert (devices / "0000:09:00.5/nvidia/current_vgpu_type").read_text() == "745\n"
    assert (devices / "0000:09:00.4/nvidia/current_vgpu_type").read_text() == "0\n"
    assert not (devices / "0000:09:00.5/mdev_supported_types").exists()
    assert mdev_of(host, "0000:09:00.5") is None
    # class/mdev_bus lists the mdev GPU's 16 VFs only.
    parents = sorted(os.listdir(host.sysfs_root / "class/mdev_bus"))
    assert len(parents) == 16
    assert all(p.startswith("0000:08:") for p in parents)
    # Holds name the mdev by its UUID, the vfio vGPU by its VF.
    probe = host.hold_probe()
    assert probe.scan(asked(default, "0000:09:00.5")).held == {"0000:09:00.5": "simulated VM"}


def test_the_state_file_keeps_each_gpus_interface(tmp_path: Path) -> None:
    host = build_host(tmp_path, MIXED_SPEC)
    state = json.loads((host.sysfs_root / ".vgpuctl-sim/state.json").read_text())
    assert [(g["address"], g["interface"]) for g in state["gpus"]] == [(PF, "mdev"), (PF2, "vfio")]
    assert set(state["vgpus"]) == {
        str(uuid.uuid5(uuid.NAMESPACE_URL, "sim/0000:08:00.4")),
        "0000:09:00.5",
    }


def test_a_host_whose_gpus_all_use_vfio_has_no_mdev_bus(tmp_path: Path) -> None:
    spec = {
        "gpus": [
            {"model": "A2", "address": PF, "interface": "vfio", "sriov": "enabled"},
            {"model": "L4", "interface": "vfio", "sriov": "enabled"},
        ]
    }
    host = build_host(tmp_path, spec)
    assert host.interface == "vfio"
    for gone in ("bus/mdev", "class/mdev_bus"):
        assert not (host.sysfs_root / gone).exists()


def test_one_mdev_gpu_among_vfio_ones_brings_the_mdev_bus(tmp_path: Path) -> None:
    spec = {
        "interface": "vfio",
        "gpus": [{"model": "A2", "address": PF}, {"model": "L4", "interface": "mdev"}],
    }
    host = build_host(tmp_path, spec)
    for there in ("bus/mdev/devices", "bus/mdev/drivers/nvidia-vgpu-vfio", "class/mdev_bus"):
        assert (host.sysfs_root / there).is_dir()


def _as_written_before_gpus_had_an_interface(root: Path, interface: str) -> None:
    """Rewrite the state file as the simulator wrote it with one host-level interface."""
    path = root / ".vgpuctl-sim/state.json"
    state = json.loads(path.read_text())
    for g in state["gpus"]:
        del g["interface"]
    state["interface"] = interface
    path.write_text(json.dumps(state))


def test_a_state_file_with_one_host_level_interface_still_loads(tmp_path: Path) -> None:
    vfio = build_host(
        tmp_path / "vfio",
        {"interface": "vfio", "gpus": [{"model": "A2", "address": PF, "sriov": "enabled"}]},
    )
    _as_written_before_gpus_had_an_interface(vfio.sysfs_root, "vfio")
    assert [g.interface for g in vfio.gpus()] == ["vfio"]
    current = "bus/pci/devices/0000:08:00.4/nvidia/current_vgpu_type"
    vfio.writer().write(current, "746")  # NVIDIA A2-4Q
    assert (vfio.sysfs_root / current).read_text() == "746\n"
    state = json.loads((vfio.sysfs_root / ".vgpuctl-sim/state.json").read_text())
    assert [g["interface"] for g in state["gpus"]] == ["vfio"]  # written back per GPU

    mdev = build_host(tmp_path / "mdev", {"gpus": [{"model": "A2", "address": PF}]})
    _as_written_before_gpus_had_an_interface(mdev.sysfs_root, "mdev")
    assert [g.interface for g in mdev.gpus()] == ["mdev"]
    r = subprocess.run(
        [str(mdev.sriov_manage), "-e", PF], check=False, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    vf = mdev.sysfs_root / "bus/pci/devices/0000:08:00.4"
    assert (vf / "mdev_supported_types").is_dir()
    assert not (vf / "nvidia").exists()
