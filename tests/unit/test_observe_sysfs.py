"""The observers' sysfs reads: confined to the root, bounded, and never blocking.

Each test runs twice: with ``openat2`` (the kernel refuses any link on the way) and with the
walk that stands in for it where the kernel or a seccomp profile does not offer it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.model import ObserveError
from reconciler.observe import sysfs as sysfs_module
from reconciler.observe.sysfs import MAX_ATTRIBUTE_BYTES, SysfsTree

#: What a file outside the root holds (a shadow line): no message may carry it.
OUTSIDE = "root:$6$saltsalt$0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    sysfs_module._bind()
    if request.param == "openat2" and sysfs_module._OPENAT2[0] is None:
        pytest.skip("this kernel does not offer openat2")
    if request.param == "walk":
        monkeypatch.setattr(sysfs_module, "_OPENAT2", [None])
        monkeypatch.setattr(
            sysfs_module,
            "_OPEN_READ",
            [lambda dirfd, rel: sysfs_module._walk(dirfd, rel, sysfs_module._READ_FLAGS)],
        )
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path, mode: str) -> Path:
    """``devices/d`` with attributes, ``class/vfio/7 -> ../../devices/d/vfio``, and a secret
    outside the root."""
    root = tmp_path / "sys"
    (root / "devices/d/vfio").mkdir(parents=True)
    (root / "devices/d/name").write_text("NVIDIA A2-4Q\n")
    (root / "devices/d/vfio/dev").write_text("511:7\n")
    (root / "class/vfio").mkdir(parents=True)
    (root / "class/vfio/7").symlink_to("../../devices/d/vfio")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "name").write_text(OUTSIDE + "\n")
    return root


def test_reads_an_attribute(root: Path) -> None:
    assert SysfsTree(root).read_text("devices/d/name") == "NVIDIA A2-4Q\n"


def test_a_link_on_the_way_is_followed_inside_the_root(root: Path) -> None:
    tree = SysfsTree(root)
    assert tree.read_text("class/vfio/7/dev") == "511:7\n"
    assert tree.list_dir("class/vfio/7") == ["dev"]
    assert tree.exists("class/vfio/7/dev")
    assert tree.real("class/vfio/7/dev") == "devices/d/vfio/dev"


@pytest.mark.parametrize("target", ["ABSOLUTE", "../../../outside"], ids=["absolute", "dotdot"])
def test_a_directory_link_leaving_the_root_is_refused_naming_it(
    root: Path, tmp_path: Path, target: str
) -> None:
    link = root / "devices/d/types"
    link.symlink_to(str(tmp_path / "outside") if target == "ABSOLUTE" else target)
    tree = SysfsTree(root)
    for read in (
        lambda: tree.read_text("devices/d/types/name"),
        lambda: tree.list_dir("devices/d/types"),
        lambda: tree.exists("devices/d/types/name"),
        lambda: tree.real("devices/d/types/name"),
    ):
        with pytest.raises(ObserveError) as info:
            read()
        assert f"{link} links to " in info.value.message
        assert "outside the sysfs root" in info.value.message
        assert "saltsalt" not in info.value.message


def test_the_attribute_itself_is_never_a_link(root: Path) -> None:
    (root / "devices/d/alias").symlink_to("name")
    with pytest.raises(OSError) as info:
        SysfsTree(root).read_text("devices/d/alias")
    assert info.value.errno == errno.ELOOP
    assert info.value.filename == f"{root}/devices/d/alias"


def test_a_fifo_is_refused_at_once(root: Path) -> None:
    os.mkfifo(root / "devices/d/fifo")
    done: list[BaseException] = []

    def read() -> None:
        try:
            SysfsTree(root).read_text("devices/d/fifo")
        except BaseException as exc:  # handed to the test's thread
            done.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # unblock it, then fail: the read must not wait for a writer
        with open(root / "devices/d/fifo", "w", encoding="ascii"):
            pass
        pytest.fail("reading a FIFO blocked")
    assert len(done) == 1 and isinstance(done[0], ObserveError)
    assert done[0].message == (f"{root}/devices/d/fifo is a FIFO, not a sysfs attribute: not read")


def test_more_than_an_attribute_can_hold_is_refused(root: Path) -> None:
    (root / "devices/d/big").write_text("x" * MAX_ATTRIBUTE_BYTES)
    assert len(SysfsTree(root).read_text("devices/d/big")) == MAX_ATTRIBUTE_BYTES
    (root / "devices/d/big").write_text("x" * (MAX_ATTRIBUTE_BYTES + 1))
    with pytest.raises(ObserveError, match=f"holds more than {MAX_ATTRIBUTE_BYTES} bytes"):
        SysfsTree(root).read_text("devices/d/big")


def test_a_directory_is_not_an_attribute(root: Path) -> None:
    with pytest.raises((ObserveError, IsADirectoryError)):
        SysfsTree(root).read_text("devices/d/vfio")


def test_links_are_read_and_resolved_inside_the_root(root: Path) -> None:
    tree = SysfsTree(root)
    assert tree.read_link("class/vfio/7") == "../../devices/d/vfio"
    assert tree.read_link("devices/d/name") is None
    assert tree.resolve("class/vfio/7") == "devices/d/vfio"
    with pytest.raises(FileNotFoundError):
        tree.read_link("devices/d/nothing")


def _outcome(call: Callable[[list[str]], object], rels: list[str]) -> object:
    try:
        return call(rels)
    except (OSError, ObserveError) as exc:
        return (type(exc), str(exc))


def test_resolving_many_links_at_once_is_resolving_each(root: Path) -> None:
    """The batch keeps each directory open across links: the answers, errors included, are
    those of one :meth:`resolve` per link."""
    links = root / "bus/links"
    links.mkdir(parents=True)
    (links / "plain").symlink_to("../../devices/d")
    (links / "chain").symlink_to("plain")  # a link to a link
    (links / "dangling").symlink_to("../../devices/gone")
    (links / "loop-a").symlink_to("loop-b")
    (links / "loop-b").symlink_to("loop-a")
    (links / "up").symlink_to("../../../outside")
    (links / "absolute").symlink_to(str(root / "devices/d"))
    (links / "file").write_text("x\n")
    cases = [
        ["bus/links/plain", "bus/links/chain", "bus/links/dangling", "bus/links/file"],
        ["class/vfio/7", "bus/links/plain", "devices/d/vfio"],
        *([name] for name in ("bus/links/loop-a", "bus/links/up", "bus/links/absolute")),
        ["bus/links/plain", "bus/links/missing"],
        ["bus/missing/x"],
    ]
    for rels in cases:
        tree = SysfsTree(root)
        one_by_one = _outcome(lambda rels: [tree.resolve(r) for r in rels], rels)  # noqa: B023
        assert _outcome(tree.resolve_many, rels) == one_by_one, rels
    assert SysfsTree(root).resolve_many(cases[0]) == [
        "devices/d", "devices/d", "devices/gone", "bus/links/file"
    ]  # fmt: skip
    # Nothing is left open: a tree that resolved many holds only its root.
    tree = SysfsTree(root)
    before = len(os.listdir("/proc/self/fd"))
    tree.resolve_many(cases[1])
    assert len(os.listdir("/proc/self/fd")) == before + 1  # the root, opened on first use


def test_a_missing_entry_does_not_exist(root: Path) -> None:
    tree = SysfsTree(root)
    assert not tree.exists("devices/d/nothing")
    assert not tree.exists("devices/nothing/name")
    assert not tree.exists("devices/d/name/below")  # below a file
    (root / "devices/d/dangling").symlink_to("nowhere")
    assert tree.exists("devices/d/dangling")  # a link counts, dangling or not


def test_open_beneath_follows_no_link(root: Path) -> None:
    with pytest.raises(OSError) as info:
        SysfsTree(root).open_beneath("class/vfio/7/dev", os.O_RDONLY)
    assert info.value.errno == errno.ELOOP
    os.close(SysfsTree(root).open_beneath("devices/d/vfio/dev", os.O_RDONLY))


def test_a_link_loop_is_an_error_not_a_hang(root: Path) -> None:
    (root / "devices/a").symlink_to("b")
    (root / "devices/b").symlink_to("a")
    with pytest.raises(ObserveError, match="too many levels of links"):
        SysfsTree(root).read_text("devices/a/name")


def test_a_root_replaced_is_seen_by_the_next_tree(root: Path, tmp_path: Path) -> None:
    tree = SysfsTree(root)
    assert tree.read_text("devices/d/name") == "NVIDIA A2-4Q\n"
    root.rename(tmp_path / "old")
    root.mkdir()
    (root / "devices").mkdir()
    (root / "devices/name").write_text("new\n")
    assert SysfsTree(root).read_text("devices/name") == "new\n"


def test_a_read_is_the_first_thing_a_process_does(root: Path) -> None:
    """The kernel's interface is looked up on first use: a fresh process whose first sysfs
    call is a read (``watch``'s fingerprint, the apply reader) must find it bound."""
    code = (
        "import sys; from pathlib import Path; from reconciler.observe.sysfs import SysfsTree; "
        "print(SysfsTree(Path(sys.argv[1])).read_text('devices/d/name'), end='')"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=False
    )
    assert (res.returncode, res.stdout, res.stderr) == (0, "NVIDIA A2-4Q\n", "")
