"""Raw, read-only access to a sysfs tree under a root (``/sys`` or a simulated tree).

This is the only I/O the host observers do; parsing lives in ``parse.py``. Paths are
relative, ``/``-separated strings joined under the root (plain strings: a host scan makes
thousands of reads, and ``pathlib`` costs more than the reads themselves).

Confinement: every open is made below a descriptor of the root and follows no link at all
(``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``: the kernel enforces it, so a link
swapped in mid-scan cannot redirect a read; where ``openat2`` is missing, a walk that opens
each directory with ``O_NOFOLLOW``). The real kernel's sysfs has no links on the device paths
the observers build from resolved links, so that is the fast path. Links the observers do
pass through (``bus/pci/devices/<address>``, ``class/vfio/<group>``) are resolved *lexically*
here, never by the OS, and one whose target leaves the root (absolute, or too many ``..``)
is refused naming it.

Attributes are small (the kernel prints at most a page): a read takes at most
:data:`MAX_ATTRIBUTE_BYTES`, opens with ``O_NONBLOCK`` and refuses anything but a regular
file, so a FIFO or a device node planted in a tree can neither hang a scan nor feed it
without end.

Errors are the OS's (``FileNotFoundError`` when something vanished, ``PermissionError``…),
or :class:`ObserveError` for what the tree must not hold: the caller decides whether to
retry the scan or report (``host.py``).
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from reconciler.model import ObserveError
from reconciler.model.errors import printable
from reconciler.model.links import LeavesRootError, TooManyLinksError, resolve_beneath

#: More links than any real sysfs path passes through (one or two); guards against loops.
_MAX_LINK_HOPS = 8
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | _CLOEXEC
_PARENT_FLAGS = os.O_PATH | os.O_DIRECTORY | _CLOEXEC
#: sysfs prints an attribute into one page (``sysfs_kf_seq_show`` cuts it at PAGE_SIZE - 1).
_PAGE = max(os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096, 4096)
#: The most a read takes: more than any attribute holds, so more is not a sysfs attribute.
MAX_ATTRIBUTE_BYTES = _PAGE
_READ_LIMIT = MAX_ATTRIBUTE_BYTES + 1
_S_IFMT, _S_IFREG = stat.S_IFMT(0o177777), stat.S_IFREG
_fstat, _read, _close = os.fstat, os.read, os.close

#: ``openat2(dirfd, path, flags)`` confined below ``dirfd`` and following no link, or None.
OpenBeneath = Callable[[int, str, int], int]


class SysfsTree:
    """A read-only view of the sysfs tree at ``root``.

    Holds a descriptor of the root from the first read until it is collected: make one per
    scan (a root replaced meanwhile is seen by the next tree).
    """

    __slots__ = ("_fd", "_parents", "_prefix", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        absolute = os.path.abspath(os.fspath(root))
        self._prefix = absolute if absolute.endswith("/") else absolute + "/"
        self._fd = -1
        #: During :meth:`resolve_many`: the directories links were read in, by path, kept open.
        self._parents: dict[str, int] | None = None

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def path(self, rel: str) -> str:
        """The absolute path of ``rel``; refuses paths that would leave the root."""
        _check(rel, self.root)
        return self._prefix + rel

    def describe(self, rel: str) -> str:
        """How messages name a file: its path as the user would type it."""
        return self._prefix + rel

    # -- reads ---------------------------------------------------------------------------------

    def read_text(self, rel: str) -> str:
        """The content of a sysfs attribute (at most :data:`MAX_ATTRIBUTE_BYTES`)."""
        # The hot path of a scan (thousands of reads): inlined, no call it can do without.
        if rel[:1] == "/" or ".." in rel:
            _check(rel, self.root)
        root = self._fd
        if root < 0:
            root = self._root_fd()  # binds _OPEN_READ on the process's first read
        try:
            fd = _OPEN_READ[0](root, rel)
        except OSError as exc:
            fd = self._open_again(rel, _READ_FLAGS, exc)
        try:
            mode = _fstat(fd).st_mode
            if mode & _S_IFMT != _S_IFREG:
                raise ObserveError(
                    f"{self.describe(rel)} is {_kind(mode)}, not a sysfs attribute: not read"
                )
            data = _read(fd, _READ_LIMIT)
        finally:
            _close(fd)
        if len(data) == _READ_LIMIT:
            raise ObserveError(
                f"{self.describe(rel)} holds more than {MAX_ATTRIBUTE_BYTES} bytes, more than "
                "any sysfs attribute: not read"
            )
        return data.decode("utf-8", "replace")

    def list_dir(self, rel: str) -> list[str]:
        """The names in a directory (a link to one is followed, inside the root only)."""
        _check(rel, self.root)
        try:
            fd = self._open_fast(rel or ".", _DIR_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            fd = self._open_fast(self.real(rel) or ".", _DIR_FLAGS)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def exists(self, rel: str) -> bool:
        """Whether an entry exists (a link counts even if dangling: it is never followed)."""
        _check(rel, self.root)
        try:
            os.close(self._open(rel, _PATH_FLAGS))
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def read_link(self, rel: str) -> str | None:
        """The raw target of the link at ``rel``; ``None`` if ``rel`` is not a link."""
        _check(rel, self.root)
        head, _, name = rel.rpartition("/")
        if not name:
            return None
        parents = self._parents
        parent = -1 if parents is None else parents.get(head, -1)
        if parent < 0:
            try:
                parent = self._open_fast(head or ".", _PARENT_FLAGS)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                parent = self._open_fast(self.real(head) or ".", _PARENT_FLAGS)
            if parents is not None:
                parents[head] = parent
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise _named(exc, self.describe(rel)) from None
        finally:
            if parents is None:
                os.close(parent)

    def resolve_many(self, rels: Iterable[str]) -> list[str]:
        """``[self.resolve(rel) for rel in rels]``, each directory a link is read in opened
        once for all of them (a host's PCI devices are hundreds of links in a few directories:
        one descriptor each instead of one per link)."""
        if self._parents is not None:
            return [self.resolve(rel) for rel in rels]
        parents: dict[str, int] = {}
        self._parents = parents
        try:
            return [self.resolve(rel) for rel in rels]
        finally:
            self._parents = None
            for fd in parents.values():
                os.close(fd)

    def resolve(self, rel: str) -> str:
        """Follow the link at ``rel`` (and any chain of them) to a path relative to the root.

        ``bus/pci/devices/0000:08:00.0`` → ``devices/pci0000:00/0000:00:03.0/0000:08:00.0``.
        A path that is not a link is returned unchanged; a missing ``rel`` raises
        ``FileNotFoundError``; a dangling link resolves to where it points.
        """
        current = rel
        for hop in range(_MAX_LINK_HOPS):
            try:
                target = self.read_link(current)
            except FileNotFoundError:
                if hop == 0:
                    raise
                return current  # a dangling link: its target is named, just not there
            if target is None:
                return current
            if target.startswith("/"):
                raise _outside(self.describe(current), target)
            current = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
            if current == ".." or current.startswith("../"):
                raise _outside(self.describe(rel), target)
        raise ObserveError(f"{self.describe(rel)}: too many levels of links")

    def real(self, rel: str) -> str:
        """``rel`` with every link along it resolved, lexically and inside the root: the path
        of what it names that passes through no link (``""`` is the root itself).

        Raises ``FileNotFoundError`` when a part of it is missing, :class:`ObserveError` when a
        link on the way leaves the root.
        """
        try:
            return resolve_beneath(rel, self.read_link, max_links=_MAX_LINK_HOPS)
        except LeavesRootError as exc:
            raise _outside(self.describe(exc.link), exc.target or rel) from None
        except TooManyLinksError:
            raise ObserveError(f"{self.describe(rel)}: too many levels of links") from None

    # -- opening below the root ----------------------------------------------------------------

    def open_beneath(self, rel: str, flags: int) -> int:
        """A descriptor for ``rel`` opened with ``flags``, below the root and through no link
        at all (``OSError`` ``ELOOP`` when one is on the way): for a write, whose path must
        already be :meth:`real`."""
        _check(rel, self.root)
        return self._open_fast(rel, flags)

    def _open(self, rel: str, flags: int) -> int:
        """Open ``rel`` (its last part never followed); links before it are resolved inside
        the root first, when there are any."""
        try:
            return self._open_fast(rel, flags)
        except OSError as exc:
            return self._open_again(rel, flags, exc)

    def _open_again(self, rel: str, flags: int, exc: OSError) -> int:
        """After ``exc`` opening ``rel``: when a link was on the way (``ELOOP``), resolve the
        links before its last part inside the root and open that; else raise it, named."""
        if exc.errno != errno.ELOOP:
            raise _named(exc, self.describe(rel)) from None
        head, _, name = rel.rpartition("/")
        real = self.real(head) if head else head
        if real == head:
            # The last part is the link, or the tree changed under us.
            raise _named(exc, self.describe(rel)) from None
        return self._open_fast(f"{real}/{name}" if real else name, flags)

    def _root_fd(self) -> int:
        if self._fd < 0:
            _bind()
            self._fd = os.open(self._prefix, _DIR_FLAGS)
        return self._fd

    def _open_fast(self, rel: str, flags: int) -> int:
        """Open ``rel`` below the root, following no link at all (``ELOOP`` if one is met)."""
        root = self._fd if self._fd >= 0 else self._root_fd()
        beneath = _OPENAT2[0]
        try:
            if beneath is not None:
                return beneath(root, rel, flags)
            return _walk(root, rel, flags)
        except OSError as exc:
            raise _named(exc, self.describe(rel)) from None


def _check(rel: str, root: Path) -> None:
    # Cheaper than splitting into components (this runs for every read), and stricter:
    # no sysfs name the observers build contains "..".
    if rel[:1] == "/" or ".." in rel:
        raise ObserveError(f"refusing to read {rel!r}: outside the sysfs root {root}")


def _outside(link: str, target: str) -> ObserveError:
    # A link's target is what whoever planted it wrote (at most PATH_MAX), not a file's
    # content: named whole, so the person fixing the tree knows which link it is.
    return ObserveError(f"{link} links to {printable(target)}: outside the sysfs root")


def _named(exc: OSError, path: str) -> OSError:
    """The same error naming the whole path (messages say which file)."""
    if exc.filename == path:
        return exc
    return type(exc)(exc.errno, exc.strerror, path)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _walk(dirfd: int, rel: str, flags: int) -> int:
    """What ``openat2`` does, one directory at a time: each opened with ``O_NOFOLLOW``, so a
    link anywhere gives ``ELOOP``, and the last part opened relative to the one before."""
    parts = [p for p in rel.split("/") if p not in ("", ".")] or ["."]
    current = dirfd
    try:
        for part in parts[:-1]:
            following = _open_at(current, part, _DIR_FLAGS | os.O_NOFOLLOW)
            if current != dirfd:
                os.close(current)
            current = following
        return _open_at(current, parts[-1], flags | os.O_NOFOLLOW)
    finally:
        if current != dirfd:
            os.close(current)


def _open_at(dirfd: int, name: str, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=dirfd)
    except NotADirectoryError:
        # O_NOFOLLOW with O_DIRECTORY calls a link "not a directory": say what it is.
        if stat.S_ISLNK(os.lstat(name, dir_fd=dirfd).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _openat2_binding() -> tuple[OpenBeneath, Callable[[int, str], int]] | None:
    """``openat2`` (Linux 5.6+) through ctypes, or None where the kernel (or a seccomp
    profile) does not offer it: then :func:`_walk` does the same job with more calls."""
    try:
        import ctypes
    except ImportError:  # pragma: no cover - CPython always has it
        return None

    class OpenHow(ctypes.Structure):
        _fields_ = (
            ("flags", ctypes.c_uint64),
            ("mode", ctypes.c_uint64),
            ("resolve", ctypes.c_uint64),
        )

    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
        return None
    syscall.restype = ctypes.c_long
    number = 437  # the same on every architecture: it was added after the tables were unified
    resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    hows: dict[int, object] = {}
    get_errno = ctypes.get_errno
    size = ctypes.sizeof(OpenHow)

    def beneath(dirfd: int, rel: str, flags: int) -> int:
        how = hows.get(flags)
        if how is None:
            how = hows[flags] = ctypes.byref(OpenHow(flags, 0, resolve))
        fd: int = syscall(number, dirfd, rel.encode(), how, size)
        if fd < 0:
            code = get_errno()
            raise OSError(code, os.strerror(code), rel)
        return fd

    read_how = ctypes.byref(OpenHow(_READ_FLAGS, 0, resolve))

    def reader(dirfd: int, rel: str) -> int:
        # beneath() with the read flags bound: one call fewer per attribute read.
        fd: int = syscall(number, dirfd, rel.encode(), read_how, size)
        if fd < 0:
            code = get_errno()
            raise OSError(code, os.strerror(code), rel)
        return fd

    try:
        os.close(beneath(_AT_FDCWD, ".", _DIR_FLAGS))
    except OSError:
        return None  # ENOSYS (before 5.6), EPERM (a seccomp profile that does not know it)
    return beneath, reader


_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
#: Bound on first use, not at import: ``vgpuctl validate`` never reads sysfs.
_OPENAT2: list[OpenBeneath | None] = []
#: ``(dirfd, rel) -> fd`` with the attribute-read flags: what :meth:`SysfsTree.read_text` calls.
_OPEN_READ: list[Callable[[int, str], int]] = []


def _bind() -> None:
    if _OPENAT2:
        return
    bound = _openat2_binding()
    if bound is not None:
        _OPENAT2.append(bound[0])
        _OPEN_READ.append(bound[1])
    else:
        _OPENAT2.append(None)
        _OPEN_READ.append(lambda dirfd, rel: _walk(dirfd, rel, _READ_FLAGS))
