"""Sysfs access for host drivers: the one confined writer, and a small reader.

:class:`ConfinedSysfsWriter` is the only code in the product that writes to a real sysfs tree.
It refuses any path that could leave the configured root and never creates files (sysfs
attributes exist or the kernel does not offer them). :class:`SysfsReader` gives drivers the
plain reads they need to re-check preconditions and verify effects.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePosixPath

from reconciler.apply.errors import PathEscapeError
from reconciler.model import ApplyError


class ConfinedSysfsWriter:
    """Writes values to existing files under ``root``, and nowhere else."""

    def __init__(self, root: Path) -> None:
        self._root = os.path.realpath(root)

    @property
    def root(self) -> Path:
        return Path(self._root)

    def write(self, path: str, value: str) -> None:
        target = self._confine(path)
        # No O_CREAT: a missing attribute means the kernel does not offer it, and creating a
        # regular file in its place would make a later read lie. O_NOFOLLOW: the path is
        # already resolved, so a link appearing now is a swap we refuse.
        fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = value.encode()
            # One write(2): sysfs hands each call to the driver's store() as a whole value,
            # so a retry of the remainder would be a second, different store.
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", target)
        finally:
            os.close(fd)

    def _confine(self, path: str) -> str:
        if not path or os.path.isabs(path):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: not a path relative to the root"
            )
        if ".." in PurePosixPath(path).parts:
            raise PathEscapeError(f"refusing sysfs write to {path!r}: '..' is not allowed")
        resolved = os.path.realpath(os.path.join(self._root, path))
        if not resolved.startswith(self._root.rstrip(os.sep) + os.sep):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: it resolves to {resolved}, "
                f"outside the sysfs root {self._root}"
            )
        return resolved


class SysfsReader:
    """Plain reads under a sysfs root; unreadable → ``ApplyError`` naming the file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.root / rel)

    def text(self, rel: str) -> str:
        """The attribute's value without the trailing newline the kernel prints."""
        try:
            return (self.root / rel).read_text(encoding="utf-8", errors="replace").strip()
        except OSError as e:
            raise ApplyError(f"cannot read {self.root / rel}: {e.strerror or e}") from e

    def integer(self, rel: str) -> int:
        raw = self.text(rel)
        try:
            return int(raw, 0)
        except ValueError:
            raise ApplyError(f"{self.root / rel} holds {raw!r}, not a number") from None

    def check_root(self) -> None:
        """Raise ``ApplyError`` when the root itself is gone: then nothing under it is merely
        absent, and no absence may pass for an effect (a vGPU removed, VFs disabled)."""
        if not os.path.isdir(self.root):
            raise ApplyError(f"the sysfs root {self.root} does not exist (gone, or not mounted)")

    def entries(self, rel: str) -> list[str]:
        """Names in a directory, sorted; a missing directory has none (a missing root raises)."""
        try:
            return sorted(os.listdir(self.root / rel))
        except FileNotFoundError:
            self.check_root()
            return []
        except OSError as e:
            raise ApplyError(f"cannot list {self.root / rel}: {e.strerror or e}") from e

    def link_name(self, rel: str) -> str:
        """The last component a symlink points to (``virtfn3`` → ``0000:08:00.7``)."""
        try:
            return PurePosixPath(os.readlink(self.root / rel)).name
        except OSError as e:
            raise ApplyError(f"cannot read link {self.root / rel}: {e.strerror or e}") from e

    def resolved(self, rel: str) -> Path:
        return Path(os.path.realpath(self.root / rel))
