"""Sysfs writes that cannot hang vgpuctl: each runs in a writer process, waited for a bounded
time. A named pipe with no reader stands in for an attribute whose write blocks in the kernel
(removing a vGPU a hidden VM holds): opening it for writing does not return. The tree is
``tests/sysfs_devices``'s: a GPU, its VF with a vGPU, and a NIC, in the kernel's layout."""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.apply import BoundedWriter, PathEscapeError, WriteTimeoutError
from reconciler.model import ApplyError
from tests.sysfs_devices import (
    CREATE,
    NIC_DIR,
    REMOVE,
    THE_VF,
    THE_VGPU,
    TYPE,
    UUID,
    VF_DIR,
    VGPU_DIR,
    device_tree,
    link,
)

WRITER = [sys.executable, "-m", "reconciler.cli.sysfs_writer"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return device_tree(tmp_path / "sys")


@pytest.fixture
def writer(root: Path) -> Iterator[BoundedWriter]:
    w = BoundedWriter([*WRITER, "--root", str(root)], timeout=2.0, root=root)
    yield w
    w.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here (its parent has not reaped it yet).
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_write_reaches_the_file(writer: BoundedWriter, root: Path) -> None:
    writer.write(REMOVE, "1", device=THE_VGPU)
    writer.write(REMOVE, "1\n", device=THE_VGPU)  # the same writer process, reused
    assert (root / VGPU_DIR / "remove").read_text() == "1\n"


def test_the_kernels_errno_comes_back_as_it_was(writer: BoundedWriter, root: Path) -> None:
    (root / VGPU_DIR / "remove").unlink()
    with pytest.raises(FileNotFoundError) as info:
        writer.write(REMOVE, "1", device=THE_VGPU)
    assert info.value.errno == errno.ENOENT
    (root / VGPU_DIR / "remove").mkdir()
    with pytest.raises(IsADirectoryError):
        writer.write(REMOVE, "1", device=THE_VGPU)


def test_a_refused_path_comes_back_refused(writer: BoundedWriter, root: Path) -> None:
    with pytest.raises(PathEscapeError, match=r"'\.\.' is not allowed"):
        writer.write("../../etc/passwd", "x", device=THE_VGPU)
    link(root, f"{VGPU_DIR}/remove", f"{NIC_DIR}/remove")
    with pytest.raises(PathEscapeError, match="is a link"):
        writer.write(REMOVE, "1", device=THE_VGPU)
    assert (root / NIC_DIR / "remove").read_text() == ""


def test_a_write_that_blocks_times_out_naming_the_file(root: Path) -> None:
    fifo = root / VGPU_DIR / "remove"
    fifo.unlink()
    os.mkfifo(fifo)
    w = BoundedWriter([*WRITER, "--root", str(root)], timeout=1.0, root=root)
    started = time.monotonic()
    with pytest.raises(WriteTimeoutError) as info:
        w.write(REMOVE, "1", device=THE_VGPU)
    took = time.monotonic() - started
    assert took < 5.0  # the timeout, plus starting the writer process
    assert f"{root}/{REMOVE}" in info.value.message
    assert "did not return within 1 s" in info.value.message
    assert info.value.transient
    stuck = info.value.pid
    assert stuck is not None and alive(stuck), "the writer is left to finish on its own"
    # The next write gets a fresh writer process: the stuck one does not hold anything up.
    w.write(CREATE, UUID, device=THE_VF)
    assert (root / VF_DIR / f"mdev_supported_types/{TYPE}/create").read_text() == UUID
    # Once the kernel lets it go (a reader opens the pipe), the stuck writer finishes and exits.
    with open(fifo, encoding="ascii") as reader:
        assert reader.read() == "1"
    deadline = time.monotonic() + 10
    while alive(stuck):
        assert time.monotonic() < deadline, "the abandoned writer did not exit"
        time.sleep(0.05)
    w.close()


def test_the_writer_process_exits_when_let_go(root: Path) -> None:
    w = BoundedWriter([*WRITER, "--root", str(root)], timeout=2.0, root=root)
    w.write(REMOVE, "1", device=THE_VGPU)
    pid = w.writer_pid
    assert pid is not None and alive(pid)
    w.close()
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the writer process outlived its BoundedWriter"
        time.sleep(0.05)


def test_a_timeout_must_be_positive(root: Path) -> None:
    with pytest.raises(ValueError, match="positive"):
        BoundedWriter([*WRITER, "--root", str(root)], timeout=0, root=root)


def test_a_writer_that_never_starts_is_a_clear_error_not_a_timeout(root: Path) -> None:
    """A slow start is not the kernel holding a write: it has its own, separate limit."""
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    w = BoundedWriter(silent, timeout=30.0, root=root, start_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ApplyError, match=r"did not start within 0\.5 s") as info:
        w.write(REMOVE, "1", device=THE_VGPU)
    assert not isinstance(info.value, WriteTimeoutError)
    assert time.monotonic() - started < 10
