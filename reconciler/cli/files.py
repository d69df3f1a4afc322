"""Files named on the command line that are not desired states: VM manifests (``lint-vm``), a
node's inventory (``validate --explain --inventory``), saved plans (``plan --out``).

vgpuctl runs as root, and a path it is given may be a link someone else planted. Such a file is
read as the desired state's files are (:func:`reconciler.desired.source.read_file`: a regular
file only, opened non-blocking, at most a bound's worth read: a link to ``/dev/zero`` or a FIFO
is refused at once), its nesting is bounded before anything recursive walks it
(:func:`nesting_depth`), and a file vgpuctl writes is a new one renamed into place
(:func:`replace_file`): whatever was at the path, a link too, is replaced, never written
through.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

#: File types by the word a message uses for them.
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_file(path: Path) -> str | None:
    """What ``path`` itself is (not followed) when it is there and not a regular file: ``a
    symbolic link``, ``a FIFO``, …; None when it is a regular file or absent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return next((word for test, word in _KINDS if test(mode)), None)


def replace_file(path: Path, text: str) -> None:
    """``text`` written to ``path`` atomically: into a new file beside it (``O_CREAT |
    O_EXCL | O_NOFOLLOW``, so nothing planted under its name is opened), flushed to disk,
    renamed over ``path``. A reader sees the old file or the new, never half; a link at
    ``path`` is replaced, not followed. A regular file replaced keeps its permissions; a new one
    is 0644 less the umask. Raises ``OSError`` (the new file removed)."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        old = None
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.vgpuctl")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as file:
            if old is not None and stat.S_ISREG(old.st_mode):
                os.fchmod(file.fileno(), stat.S_IMODE(old.st_mode))
            file.write(text.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    """The rename made durable (best effort: some file systems refuse a directory's fsync)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def nesting_depth(doc: object, limit: int) -> int:
    """How deep ``doc`` (parsed JSON) nests, counted iteratively (a deep document must not
    exhaust the stack), up to the first level past ``limit``."""
    deepest = 0
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest
