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


# --- a VFIO device fd kept alone (anon_inode:[vfio-device]) -------------------------------------

#: What fs/proc/fd.c ``seq_show`` prints for every fd, before the file's own ``show_fdinfo``.
SEQ_SHOW = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n"
VF_SYSPATH = "/sys/devices/pci0000:00/0000:00:03.1/0000:08:00.4"
UUID = "5ed3b3e8-ffe3-55db-be73-567bd703a205"


def device_fd_holder(proc: Path, pid: int, fdinfo: str | bytes, fd: int = 23) -> None:
    """A process keeping only a VFIO device fd, with ``fdinfo`` as its fdinfo file."""
    d = process(proc, pid, "qemu-kvm", {fd: "anon_inode:[vfio-device]"})
    (d / "fdinfo").mkdir()
    data = fdinfo.encode() if isinstance(fdinfo, str) else fdinfo
    (d / "fdinfo" / str(fd)).write_bytes(data)


def mdev(uuid: str = UUID) -> DeviceNodes:
    return DeviceNodes(group="99", device=uuid)


def test_a_device_fd_is_matched_through_the_syspath_its_fdinfo_names(proc: Path) -> None:
    device_fd_holder(proc, 7100, f"{SEQ_SHOW}vfio-device-syspath: {VF_SYSPATH}/{UUID}\n")
    scan = probe_of(proc).scan({"m": mdev(), "other": mdev("0" * 8 + UUID[8:])})
    assert scan == HolderScan(held={"m": "pid 7100 (qemu-kvm)"})


def test_a_vendor_vfio_vf_is_matched_by_its_pci_address(proc: Path) -> None:
    device_fd_holder(proc, 7100, f"{SEQ_SHOW}vfio-device-syspath: {VF_SYSPATH}\n")
    vf = DeviceNodes(group="200", device="0000:08:00.4")
    assert probe_of(proc).scan({"0000:08:00.4": vf}).held == {"0000:08:00.4": "pid 7100 (qemu-kvm)"}


def test_a_device_fd_of_another_device_holds_none_of_ours(proc: Path) -> None:
    """A NIC VF passed to a VM: named, so the scan is not blind, and it holds no vGPU."""
    nic = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.1"
    device_fd_holder(proc, 7100, f"{SEQ_SHOW}vfio-device-syspath: {nic}\n")
    assert probe_of(proc).scan({"m": mdev()}) == HolderScan()
    assert probe_of(proc).blindness() is None


def test_a_device_fd_an_older_kernel_does_not_name_makes_the_scan_blind(proc: Path) -> None:
    device_fd_holder(proc, 7100, SEQ_SHOW)
    scan = probe_of(proc).scan({"m": mdev()})
    why = (
        "pid 7100 (qemu-kvm) holds a VFIO device fd vgpuctl cannot attribute (fd 23: its "
        "fdinfo names no device: Linux writes vfio-device-syspath there from 6.18 on)"
    )
    assert scan == HolderScan(blind=why, unattributed=True)
    assert probe_of(proc).blindness() == why


def test_device_fds_beside_as_many_open_groups_are_those_groups_devices(proc: Path) -> None:
    """QEMU keeps a group's fd while any device of it is in use (hw/vfio/container.c
    ``vfio_put_group``): on a kernel that names no device in fdinfo, its device fds are those of
    its open groups, which the group nodes match. A VM with a vGPU (group 71) and a NIC VF
    (group 80) does not blind the scan."""
    fds = {
        20: "/dev/vfio/vfio",
        21: "/dev/vfio/71",
        22: "/dev/vfio/80 (deleted)",
        23: "anon_inode:[vfio-device]",
        24: "anon_inode:[vfio-device]",
    }
    d = process(proc, 7100, "qemu-kvm", fds)
    (d / "fdinfo").mkdir()
    for fd in (23, 24):
        (d / "fdinfo" / str(fd)).write_text(SEQ_SHOW)
    scan = probe_of(proc).scan({"u71": group("71"), "u72": group("72")})
    assert scan == HolderScan(held={"u71": "pid 7100 (qemu-kvm)"})
    assert probe_of(proc).blindness() is None


def test_more_unnamed_device_fds_than_open_groups_make_the_scan_blind(proc: Path) -> None:
    """Two device fds, one open group: one is a device of a group the process closed (any
    vGPU, perhaps): blind, never guessed."""
    fds = {21: "/dev/vfio/71", 23: "anon_inode:[vfio-device]", 24: "anon_inode:[vfio-device]"}
    d = process(proc, 7100, "qemu-kvm", fds)
    (d / "fdinfo").mkdir()
    for fd in (23, 24):
        (d / "fdinfo" / str(fd)).write_text(SEQ_SHOW)
    scan = probe_of(proc).scan({"u71": group("71"), "u72": group("72")})
    assert scan.unattributed is True
    assert scan.held == {"u71": "pid 7100 (qemu-kvm)"}
    assert scan.blind == (
        "pid 7100 (qemu-kvm) holds 2 VFIO device fds vgpuctl cannot attribute beside 1 open "
        "VFIO group (fd 23: its fdinfo names no device: Linux writes vfio-device-syspath there "
        "from 6.18 on)"
    )


def test_a_process_the_probe_cannot_read_outweighs_an_unattributed_fd(
    proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device_fd_holder(proc, 7100, SEQ_SHOW)
    real_listdir = os.listdir

    def denied(path: str) -> list[str]:
        if str(path).endswith("/5151/fd"):
            raise PermissionError(13, "Permission denied", path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", denied)
    scan = probe_of(proc).scan({"m": mdev()})
    assert scan.unattributed is False
    assert scan.blind is not None and "pid 5151 (qemu-kvm)" in scan.blind


@pytest.mark.parametrize(
    ("fdinfo", "why"),
    [
        pytest.param(
            f"{SEQ_SHOW}vfio-device-syspath: {VF_SYSPATH}\nvfio-device-syspath: {VF_SYSPATH}\n",
            "its fdinfo has more than one vfio-device-syspath",
            id="two-lines",
        ),
        pytest.param(
            f"{SEQ_SHOW}vfio-device-syspath: /sys/devices/../../etc/passwd\n",
            "its vfio-device-syspath is not a device's sysfs path: '/sys/devices/../../etc/passwd'",
            id="dot-dot",
        ),
        pytest.param(
            f"{SEQ_SHOW}vfio-device-syspath: 0000:08:00.4\n",
            "its vfio-device-syspath is not a device's sysfs path: '0000:08:00.4'",
            id="relative",
        ),
        pytest.param(
            f"{SEQ_SHOW}vfio-device-syspath: /sys/devices/\n",
            "its vfio-device-syspath is not a device's sysfs path: '/sys/devices/'",
            id="no-device",
        ),
        pytest.param(
            f"{SEQ_SHOW}vfio-device-syspath: /sys/devices/pci0000:00/a b\x1b[2K\n",
            "its vfio-device-syspath is not a device's sysfs path: "
            "'/sys/devices/pci0000:00/a b\\x1b[2K'",
            id="control-characters-escaped",
        ),
        pytest.param(
            SEQ_SHOW.encode() + b"vfio-device-syspath: /sys/devices/\xff\n",
            "its fdinfo is not text: '" + SEQ_SHOW.replace("\t", "\\t").replace("\n", "\\n"),
            id="not-utf8",
        ),
        pytest.param(
            SEQ_SHOW + "x" * 20000,
            "its fdinfo is not a regular file of at most 16384 bytes",
            id="too-long",
        ),
    ],
)
def test_an_fdinfo_that_does_not_parse_makes_the_scan_blind(
    proc: Path, fdinfo: str | bytes, why: str
) -> None:
    device_fd_holder(proc, 7100, fdinfo)
    scan = probe_of(proc).scan({"m": mdev(), "v": DeviceNodes(group="45")})
    assert scan.held == {"v": "pid 4242 (qemu-system-x86)"}
    assert scan.unattributed is True
    assert scan.blind is not None
    assert scan.blind.startswith("pid 7100 (qemu-kvm) holds a VFIO device fd vgpuctl cannot")
    assert f"(fd 23: {why}" in scan.blind


def test_an_fdinfo_that_is_a_fifo_neither_blocks_nor_is_trusted(proc: Path) -> None:
    d = process(proc, 7100, "qemu-kvm", {23: "anon_inode:[vfio-device]"})
    (d / "fdinfo").mkdir()
    os.mkfifo(d / "fdinfo" / "23")  # opening it for reading without O_NONBLOCK would hang
    scan = probe_of(proc).scan({"m": mdev()})
    assert scan.unattributed is True
    assert "not a regular file" in (scan.blind or "")


def test_an_fdinfo_that_is_a_link_is_not_followed(proc: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(f"{SEQ_SHOW}vfio-device-syspath: {VF_SYSPATH}/{UUID}\n")
    d = process(proc, 7100, "qemu-kvm", {23: "anon_inode:[vfio-device]"})
    (d / "fdinfo").mkdir()
    os.symlink(elsewhere, d / "fdinfo" / "23")
    scan = probe_of(proc).scan({"m": mdev()})
    assert scan.held == {}
    assert scan.blind is not None  # ELOOP: neither trusted nor skipped as gone


def test_a_device_fd_closed_before_its_fdinfo_is_read_is_skipped(proc: Path) -> None:
    """The fd (or the process) went between the link and the fdinfo: it holds nothing now."""
    process(proc, 7100, "qemu-kvm", {23: "anon_inode:[vfio-device]"})  # no fdinfo/23
    assert probe_of(proc).scan({"m": mdev()}) == HolderScan()


def test_the_device_name_is_matched_whatever_its_case(proc: Path) -> None:
    device_fd_holder(proc, 7100, f"{SEQ_SHOW}vfio-device-syspath: {VF_SYSPATH}/{UUID}\n")
    assert probe_of(proc).scan({"M": mdev(UUID.upper())}).held == {"M": "pid 7100 (qemu-kvm)"}


def test_every_vgpu_held_stops_the_scan_before_an_unattributed_fd(proc: Path) -> None:
    """Found held everything asked: an fd of a later process cannot change the answer."""
    device_fd_holder(proc, 9100, SEQ_SHOW)
    assert probe_of(proc).scan({"u45": group("45")}) == HolderScan(
        held={"u45": "pid 4242 (qemu-system-x86)"}
    )
