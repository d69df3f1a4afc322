"""The ``/proc`` hold probe on a fake process tree: which vGPUs a VM keeps open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.model import ObserveError
from reconciler.observe.holds import (
    HoldProbe,
    ProcfsHoldProbe,
    describe_holder,
    vfio_group_of,
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
    (root / "self").symlink_to("1")  # non-numeric entries are not processes
    (root / "sys").mkdir()
    process(root, 1, "systemd", {0: "/dev/null", 1: "socket:[1234]"})
    process(
        root,
        4242,
        "qemu-system-x86",
        {0: "/dev/null", 17: "/dev/vfio/vfio", 18: "/dev/vfio/45", 19: "anon_inode:[eventfd]"},
    )
    process(root, 5151, "qemu-kvm", {20: "/dev/vfio/46"})
    return root


def test_held_vgpus_are_named_with_their_process(proc: Path) -> None:
    probe: HoldProbe = ProcfsHoldProbe(proc)
    held = probe.held({"u45": "45", "u46": "46", "u47": "47", "u-none": None})
    assert held == {"u45": "pid 4242 (qemu-system-x86)", "u46": "pid 5151 (qemu-kvm)"}


def test_lowest_pid_is_reported_when_several_hold_a_group(proc: Path) -> None:
    process(proc, 99, "libvirtd", {3: "/dev/vfio/45"})
    assert ProcfsHoldProbe(proc).held({"u": "45"}) == {"u": "pid 99 (libvirtd)"}


def test_vanished_and_unreadable_processes_are_skipped(proc: Path) -> None:
    (proc / "7000").mkdir()  # exited between the listing and the read: no fd directory
    (proc / "7001").mkdir()
    (proc / "7001" / "fd").write_text("")  # not a directory: listing it fails
    process(proc, 7002, None, {3: "/dev/vfio/46"})  # comm unreadable
    process(proc, 4, "kworker", {})
    (proc / "4" / "fd").chmod(0)  # not ours to inspect (does not stop root)
    held = ProcfsHoldProbe(proc).held({"u46": "46", "u48": "48"})
    assert held == {"u46": "pid 5151 (qemu-kvm)"}


def test_process_without_comm_is_described_by_pid(proc: Path) -> None:
    process(proc, 8000, None, {3: "/dev/vfio/48"})
    assert ProcfsHoldProbe(proc).held({"u": "48"}) == {"u": "pid 8000"}


def test_fd_closing_during_the_scan_is_skipped(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_readlink = os.readlink

    def racing(path: str) -> str:
        if path.endswith("/4242/fd/18"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", racing)
    assert ProcfsHoldProbe(proc).held({"u45": "45", "u46": "46"}) == {"u46": "pid 5151 (qemu-kvm)"}


def test_nothing_to_ask_reads_nothing(tmp_path: Path) -> None:
    probe = ProcfsHoldProbe(tmp_path / "no-proc")
    assert probe.held({}) == {}
    assert probe.held({"u": None}) == {}


def test_missing_proc_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ObserveError, match=r"cannot read .*no-proc"):
        ProcfsHoldProbe(tmp_path / "no-proc").held({"u": "45"})


def test_default_proc_root() -> None:
    assert ProcfsHoldProbe().proc_root == Path("/proc")


@pytest.mark.parametrize(
    ("target", "group"),
    [
        ("/dev/vfio/45", "45"),
        ("/dev/vfio/vfio", None),  # the container, not a group
        ("/dev/vfio/devices/vfio0", None),  # iommufd character device
        ("/dev/vfio/45 (deleted)", None),
        ("/dev/null", None),
        ("socket:[1234]", None),
    ],
)
def test_vfio_group_of(target: str, group: str | None) -> None:
    assert vfio_group_of(target) == group


def test_describe_holder() -> None:
    assert describe_holder(1234, "qemu-system-x86\n") == "pid 1234 (qemu-system-x86)"
    assert describe_holder(1234, None) == "pid 1234"
    assert describe_holder(1234, "\n") == "pid 1234"
