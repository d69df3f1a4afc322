"""The ``/proc`` hold probe on a fake process tree: which vGPUs a VM keeps open, and when the
probe must admit that it cannot see every process (then the observer fails closed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.observe.holds import (
    INIT_PID_NAMESPACE,
    DeviceNodes,
    HolderScan,
    HoldProbe,
    ProcfsHoldProbe,
    current_pid_namespace,
    describe_holder,
    pid_namespace_blindness,
)


def process(proc: Path, pid: int, comm: str | None, fds: dict[int, str]) -> Path:
    """``/proc/<pid>`` with ``comm`` and ``fd/<n> -> target`` links (targets need not exist)."""
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    if comm is not None:
        (d / "comm").write_text(comm + "\n")
    for fd, target in fds.items():
        os.symlink(target, d / "fd" / str(fd))
    return d


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    # /proc/self/ns/pid: a file whose inode the probe takes for the host's PID namespace
    # (each test's probe is told that inode, as a real probe knows 4026531836).
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").write_text("")
    (root / "sys").mkdir()
    process(root, 1, "systemd", {0: "/dev/null", 1: "socket:[1234]"})
    process(
        root,
        4242,
        "qemu-system-x86",
        {0: "/dev/null", 17: "/dev/vfio/vfio", 18: "/dev/vfio/45", 19: "anon_inode:[eventfd]"},
    )
    process(root, 5151, "qemu-kvm", {20: "/dev/vfio/46"})
    process(root, 6161, "qemu-kvm", {3: "/dev/vfio/devices/vfio7", 4: "/dev/iommu"})
    return root


def probe_of(proc: Path) -> ProcfsHoldProbe:
    """A probe that takes the fake tree's namespace for the host's."""
    return ProcfsHoldProbe(proc, host_namespace=os.stat(proc / "self/ns/pid").st_ino)


def group(n: str) -> DeviceNodes:
    return DeviceNodes(group=n)


def test_held_vgpus_are_named_with_their_process(proc: Path) -> None:
    probe: HoldProbe = probe_of(proc)
    scan = probe.scan({"u45": group("45"), "u46": group("46"), "u47": group("47")})
    assert scan == HolderScan(
        held={"u45": "pid 4242 (qemu-system-x86)", "u46": "pid 5151 (qemu-kvm)"}, blind=None
    )


def test_a_holder_of_the_iommufd_cdev_counts(proc: Path) -> None:
    """QEMU on the cdev path opens /dev/vfio/devices/vfioN, not the group node."""
    scan = probe_of(proc).scan({"u": DeviceNodes(group="99", cdev="vfio7")})
    assert scan.held == {"u": "pid 6161 (qemu-kvm)"}
    assert probe_of(proc).scan({"u": DeviceNodes(group="99", cdev="vfio8")}).held == {}


def test_a_holder_is_found_by_device_number_whatever_path_it_opened(proc: Path) -> None:
    """A container's own /dev may name the node otherwise: the device number still matches.
    /dev/null stands in for the vfio node (a real character device every host has)."""
    process(proc, 7070, "qemu-in-a-pod", {5: "/dev/null"})
    null = os.stat("/dev/null").st_rdev
    scan = probe_of(proc).scan({"u": DeviceNodes(group="99", numbers=frozenset({null}))})
    # pid 1 has /dev/null open too and is the lowest pid: the probe names the first holder.
    assert scan.held == {"u": "pid 1 (systemd)"}


def test_a_node_deleted_and_made_again_still_holds_the_group(proc: Path) -> None:
    process(proc, 8080, "qemu-kvm", {3: "/dev/vfio/48 (deleted)"})
    assert probe_of(proc).scan({"u": group("48")}).held == {"u": "pid 8080 (qemu-kvm)"}


def test_lowest_pid_is_reported_when_several_hold_a_group(proc: Path) -> None:
    process(proc, 99, "libvirtd", {3: "/dev/vfio/45"})
    assert probe_of(proc).scan({"u": group("45")}).held == {"u": "pid 99 (libvirtd)"}


def test_vanished_processes_are_skipped(proc: Path) -> None:
    (proc / "7000").mkdir()  # exited between the listing and the read: no fd directory
    (proc / "7001").mkdir()
    (proc / "7001" / "fd").write_text("")  # not a directory: exited, its pid reused
    process(proc, 7002, None, {3: "/dev/vfio/46"})  # comm unreadable
    scan = probe_of(proc).scan({"u46": group("46"), "u48": group("48")})
    assert scan == HolderScan(held={"u46": "pid 5151 (qemu-kvm)"})


def test_a_process_whose_files_cannot_be_read_makes_the_scan_blind(
    proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root (or a security module says no): that process might hold anything."""
    real_listdir = os.listdir

    def denied(path: str) -> list[str]:
        if str(path).endswith("/5151/fd"):
            raise PermissionError(13, "Permission denied", path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", denied)
    scan = probe_of(proc).scan({"u45": group("45"), "u46": group("46")})
    assert scan.held == {"u45": "pid 4242 (qemu-system-x86)"}
    assert scan.blind is not None
    assert "pid 5151 (qemu-kvm)" in scan.blind
    assert "Permission denied" in scan.blind


def test_process_without_comm_is_described_by_pid(proc: Path) -> None:
    process(proc, 8000, None, {3: "/dev/vfio/48"})
    assert probe_of(proc).scan({"u": group("48")}).held == {"u": "pid 8000"}


def test_fd_closing_during_the_scan_is_skipped(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_readlink = os.readlink

    def racing(path: str) -> str:
        if path.endswith("/4242/fd/18"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", racing)
    scan = probe_of(proc).scan({"u45": group("45"), "u46": group("46")})
    assert scan == HolderScan(held={"u46": "pid 5151 (qemu-kvm)"})


def test_nothing_to_ask_reads_nothing(tmp_path: Path) -> None:
    probe = ProcfsHoldProbe(tmp_path / "no-proc")
    assert probe.scan({}) == HolderScan()
    assert probe.scan({"u": DeviceNodes()}) == HolderScan()


def test_another_pid_namespace_makes_the_scan_blind(proc: Path) -> None:
    """The fake /proc's namespace is not the host's (4026531836): processes may be missing."""
    scan = ProcfsHoldProbe(proc).scan({"u45": group("45")})
    assert scan.held == {}
    mine = os.stat(proc / "self/ns/pid").st_ino
    assert scan.blind == (
        f"vgpuctl runs in PID namespace {mine}, not the host's (4026531836); "
        "in a pod, set hostPID: true"
    )


def test_an_unreadable_proc_makes_the_scan_blind(tmp_path: Path) -> None:
    scan = ProcfsHoldProbe(tmp_path / "no-proc").scan({"u": group("45")})
    assert scan.held == {}
    assert scan.blind is not None
    assert f"cannot read {tmp_path / 'no-proc'}/self/ns/pid" in scan.blind


def test_the_real_proc_of_this_test_run() -> None:
    """What the probe says of the machine running the tests, checked against /proc itself."""
    mine = os.stat("/proc/self/ns/pid").st_ino
    blind = pid_namespace_blindness(Path("/proc"), host_namespace=INIT_PID_NAMESPACE)
    assert (blind is None) == (mine == 4026531836)
    assert current_pid_namespace() == mine


def test_default_proc_root() -> None:
    probe = ProcfsHoldProbe()
    assert probe.proc_root == Path("/proc")
    assert probe.host_namespace == 4026531836


def test_describe_holder() -> None:
    assert describe_holder(1234, "qemu-system-x86\n") == "pid 1234 (qemu-system-x86)"
    assert describe_holder(1234, None) == "pid 1234"
    assert describe_holder(1234, "\n") == "pid 1234"
