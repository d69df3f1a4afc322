"""A process that keeps a vGPU through its VFIO *device* fd alone (issue 28 item 7, issue 29
item 6).

QEMU gets a device fd from the group (``VFIO_GROUP_GET_DEVICE_FD``) and may then close
``/dev/vfio/<group>``: the device fd still holds the group (drivers/vfio/group.c), and
``/proc/<pid>/fd`` shows it only as ``anon_inode:[vfio-device]``. Removing that vGPU blocks
in the kernel and takes the VM's GPU away (docs/domain.md §9). Since Linux 6.18 the fd's
fdinfo names the device (``vfio-device-syspath``, vfio_main.c ``vfio_device_show_fdinfo``);
before, nothing does.

The attack, through the CLI on a simulated host whose ``/proc`` holds such a process
(``sim hold --device-fd``): ``apply`` must keep that vGPU, naming the process; where the fdinfo
names no device, or names it in a way that does not parse, every removal on the node is blocked
with the reason. The files read are the kernel's formats (fs/proc/fd.c ``seq_show`` and
``vfio_device_show_fdinfo``), read by the same code that reads a real ``/proc``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.sim import hold
from tests.simnode import SEED, SimNode, make_sim, run_vgpuctl

VF5, VF7 = "0000:08:00.5", "0000:08:00.7"
#: What the first simulated device-fd holder is: pid 4000, ``comm`` qemu-kvm (``procfs.py``).
HOLDER = "pid 4000 (qemu-kvm)"
FDINFO = "sys/.vgpuctl-sim/proc/4000/fdinfo/23"
ERASE = "\x1b[1A\x1b[2K"


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    """The seed's node with the seed applied: A2-4A on VFs .4 and .6, A2-4Q on .5 and .7."""
    n = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    n.ok("apply", SEED, "--yes")
    return n


@pytest.fixture
def all_4a(tmp_path: Path) -> Path:
    """The seed with every VF on A2-4A: the A2-4Q vGPUs on .5 and .7 are to be replaced."""
    path = tmp_path / "all-4a.yaml"
    path.write_text(SEED.read_text().replace("NVIDIA A2-4Q", "NVIDIA A2-4A"))
    return path


def vgpus(node: SimNode) -> dict[str, dict[str, object]]:
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    return {v["address"]: v["vgpu"] for v in inventory["gpus"][0]["vfs"] if v["vgpu"]}


def keep_device_fd(node: SimNode, uuid: str, fdinfo: str) -> None:
    res = run_vgpuctl("sim", "hold", node.dir, uuid, "--device-fd", fdinfo)
    assert res.returncode == 0, res.stderr


def test_a_vgpu_held_only_through_its_device_fd_is_kept_naming_the_process(
    node: SimNode, all_4a: Path
) -> None:
    before = vgpus(node)
    u5 = before[VF5]["uuid"]
    keep_device_fd(node, str(u5), "syspath")
    fdinfo = (node.dir / FDINFO).read_text()
    assert f"/{u5}\n" in fdinfo and fdinfo.startswith("pos:\t0\nflags:\t")
    # status names the process, as for a group-node holder.
    assert vgpus(node)[VF5]["holder"] == HOLDER

    res = node.run("apply", all_4a, "--yes", "--write-timeout", "2", timeout=60)

    assert res.returncode == 2, res.stdout + res.stderr  # work remains: one removal blocked
    assert f"VF {VF5} hosts NVIDIA A2-4Q, in use by {HOLDER}" in res.stdout
    after = vgpus(node)
    assert after[VF5] == before[VF5] | {"holder": HOLDER}  # kept, untouched
    # Only that vGPU: the scan attributed the fd, so the other A2-4Q was replaced.
    assert after[VF7]["type"] == "NVIDIA A2-4A"
    # The process exits: the vGPU is free, and the next apply converges.
    assert run_vgpuctl("sim", "release", node.dir, str(u5)).returncode == 0
    assert not (node.dir / FDINFO).exists()
    done = node.run("apply", all_4a, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert vgpus(node)[VF5]["type"] == "NVIDIA A2-4A"


def test_a_device_fd_an_older_kernel_does_not_name_blocks_every_removal(
    node: SimNode, all_4a: Path
) -> None:
    before = vgpus(node)
    u5 = str(before[VF5]["uuid"])
    keep_device_fd(node, u5, "no-syspath")
    assert "vfio-device-syspath" not in (node.dir / FDINFO).read_text()

    res = node.run("apply", all_4a, "--yes", "--write-timeout", "2", timeout=60)

    assert res.returncode == 2, res.stdout + res.stderr
    reason = (
        f"{HOLDER} holds a VFIO device fd vgpuctl cannot attribute (fd 23: its fdinfo names "
        "no device: Linux writes vfio-device-syspath there from 6.18 on)"
    )
    # Both A2-4Q vGPUs stay, the one on .7 too: the fd may be any vGPU's.
    for vf in (VF5, VF7):
        assert f"VF {vf} hosts NVIDIA A2-4Q, counted as in use: {reason}" in res.stdout
    assert "Plan: 0 to create, 0 to change, 0 to remove, 4 blocked." in res.stdout
    assert (
        f"Note: {reason}: it may hold any vGPU, so every vGPU counts as in use and none is "
        "removed or changed until it closes that fd"
    ) in res.stdout
    assert {vf: v["uuid"] for vf, v in vgpus(node).items()} == {
        vf: v["uuid"] for vf, v in before.items()
    }
    held_by = {vf: v["holder"] for vf, v in vgpus(node).items()}
    assert held_by == dict.fromkeys(before, f"unknown: {reason}")
    # Only the operator's word gets past it, and it is noted.
    unsafe = node.run("plan", all_4a, "--unsafe-assume-no-hidden-holders")
    assert unsafe.returncode == 0, unsafe.stderr
    assert "Plan: 0 to create, 2 to change, 0 to remove, 0 blocked." in unsafe.stdout
    assert f"Note: holders not fully checked ({reason}): assumed" in unsafe.stdout


def test_an_fdinfo_that_does_not_parse_makes_the_scan_blind(node: SimNode, all_4a: Path) -> None:
    before = vgpus(node)
    keep_device_fd(node, str(before[VF5]["uuid"]), "syspath")
    # A path that leaves /sys/devices: not what vfio_device_show_fdinfo prints for a device.
    fdinfo = node.dir / FDINFO
    text = fdinfo.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("vfio-device-syspath:"))
    fdinfo.write_text(text.replace(line, "vfio-device-syspath: /sys/devices/../../etc/passwd"))

    res = node.run("apply", all_4a, "--yes", "--write-timeout", "2", timeout=60)

    assert res.returncode == 2, res.stdout + res.stderr
    why = (
        f"{HOLDER} holds a VFIO device fd vgpuctl cannot attribute (fd 23: its "
        "vfio-device-syspath is not a device's sysfs path: '/sys/devices/../../etc/passwd')"
    )
    for vf in (VF5, VF7):
        assert f"VF {vf} hosts NVIDIA A2-4Q, counted as in use: {why}" in res.stdout
    assert {vf: v["uuid"] for vf, v in vgpus(node).items()} == {
        vf: v["uuid"] for vf, v in before.items()
    }


def test_the_holders_name_reaches_the_terminal_escaped(node: SimNode, all_4a: Path) -> None:
    u5 = str(vgpus(node)[VF5]["uuid"])
    hold(node.dir, u5, holder=f"qemu{ERASE}", device_fd="no-syspath")

    res = node.run("plan", all_4a)

    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert "pid 4000 (qemu\\x1b[1A\\x1b[2K) holds a VFIO device fd vgpuctl cannot" in res.stdout


def test_a_vendor_vfio_vf_held_through_its_device_fd_is_never_cleared(tmp_path: Path) -> None:
    """On NVIDIA's vendor-specific VFIO interface the VF is the vGPU: the syspath ends in the
    VF's address (docs/domain.md §3b)."""
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", "L40S@0000:08:00.0", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host")
    doc = SEED.read_text().split("spec:")[0] + (
        "spec:\n  nodes:\n    harvester-kgd9c:\n      gpus:\n"
        '        - address: "0000:08:00.0"\n          sriov: enabled\n          vgpus:\n'
    )
    one = tmp_path / "one.yaml"
    one.write_text(doc + '            "0000:08:00.4": NVIDIA L40S-8Q\n')
    none = tmp_path / "none.yaml"
    none.write_text(doc + "            {}\n")
    node.ok("apply", one, "--yes")
    keep_device_fd(node, "0000:08:00.4", "syspath")
    assert (node.dir / FDINFO).read_text().endswith("/0000:08:00.4\n")

    res = node.run("apply", none, "--yes", "--write-timeout", "2", timeout=60)

    assert res.returncode == 2, res.stdout + res.stderr
    assert f"VF 0000:08:00.4 hosts NVIDIA L40S-8Q, in use by {HOLDER}" in res.stdout
    current = next((node.dir / "sys").glob("devices/**/0000:08:00.4/nvidia/current_vgpu_type"))
    assert current.read_text().strip() != "0"


def test_doctor_says_that_a_device_fd_it_cannot_attribute_blocks_removals(
    node: SimNode,
) -> None:
    u5 = str(vgpus(node)[VF5]["uuid"])
    keep_device_fd(node, u5, "syspath")
    assert "FAIL  holders" not in node.run("doctor").stdout  # named: nothing to say
    keep_device_fd(node, u5, "no-syspath")

    res = node.run("doctor")

    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL  holders" in res.stdout
    assert f"{HOLDER} holds a VFIO device fd vgpuctl cannot attribute" in res.stdout
    assert "blocks removals until its process closes it" in res.stdout
