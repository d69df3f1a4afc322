"""Raw, read-only access to a sysfs tree under a root (``/sys`` or a simulated tree).

This is the only I/O the host observers do; parsing lives in ``parse.py``. Paths are
relative, ``/``-separated strings joined under the root (plain strings: a host scan makes
thousands of reads, and ``pathlib`` costs more than the reads themselves).

Confinement: links are resolved *lexically* here, never by the OS, and a link whose target
leaves the root (absolute, or too many ``..``) is refused. Files are opened with
``O_NOFOLLOW``, so the last component is never a link the OS follows. The kernel's sysfs
has no linked directories on the device paths we build from resolved links, so every read
stays inside the tree.

Errors are the OS's (``FileNotFoundError`` when something vanished, ``PermissionError``…):
the caller decides whether to retry the scan or report (``host.py``).
"""

from __future__ import annotations

import errno
import os
import posixpath
from pathlib import Path

from reconciler.model import ObserveError

#: More hops than any real sysfs link chain (they are single links); guards against loops.
_MAX_LINK_HOPS = 8
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class SysfsTree:
    """A read-only view of the sysfs tree at ``root``."""

    __slots__ = ("_prefix", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        absolute = os.path.abspath(os.fspath(root))
        self._prefix = absolute if absolute.endswith("/") else absolute + "/"

    def path(self, rel: str) -> str:
        """The absolute path of ``rel``; refuses paths that would leave the root."""
        # Cheaper than splitting into components (this runs for every read), and stricter:
        # no sysfs name the observers build contains "..".
        if rel[:1] == "/" or ".." in rel:
            raise ObserveError(f"refusing to read {rel!r}: outside the sysfs root {self.root}")
        return self._prefix + rel

    def describe(self, rel: str) -> str:
        """How messages name a file: its path as the user would type it."""
        return self._prefix + rel

    def read_text(self, rel: str) -> str:
        """The content of a sysfs attribute (they are small: one page at most)."""
        fd = os.open(self.path(rel), _READ_FLAGS)
        try:
            data = os.read(fd, 65536)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def list_dir(self, rel: str) -> list[str]:
        return os.listdir(self.path(rel) if rel else self._prefix)

    def exists(self, rel: str) -> bool:
        """Whether an entry exists (a link counts even if dangling: it is never followed)."""
        return os.path.lexists(self.path(rel))

    def read_link(self, rel: str) -> str | None:
        """The raw target of the link at ``rel``; ``None`` if ``rel`` is not a link."""
        try:
            return os.readlink(self.path(rel))
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise

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
                raise ObserveError(
                    f"{self.describe(current)} links to {target}: outside the sysfs root"
                )
            current = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
            if current == ".." or current.startswith("../"):
                raise ObserveError(
                    f"{self.describe(rel)} links to {target}: outside the sysfs root"
                )
        raise ObserveError(f"{self.describe(rel)}: too many levels of links")
