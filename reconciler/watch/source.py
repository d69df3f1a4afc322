"""Where the desired state comes from while watching: a file or a directory, read afresh.

The path given is kept as written and resolved again on every look, because what it names
changes under us: an editor writes a temporary file and renames it over the original, the
kubelet swaps a ConfigMap volume's ``..data`` link, git-sync swaps a ``current`` link to a new
checkout. A directory's entries are read as loading reads them: links followed only to files
inside the directory. :meth:`DesiredSource.fingerprint` says cheaply whether the content changed;
:meth:`DesiredSource.watch_points` names the directories whose events can announce a change.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from reconciler.catalog import Catalog
from reconciler.desired import directory_files, load_desired
from reconciler.desired.loader import MAX_FILES
from reconciler.desired.source import MAX_BYTES, read_file, read_within
from reconciler.model import Desired, DesiredNode
from reconciler.model.record import record


@record(frozen=True, slots=True)
class DesiredSource:
    """A desired-state file or directory (``vgpuctl watch FILE|DIR``)."""

    path: Path

    @classmethod
    def at(cls, path: Path) -> DesiredSource:
        # Absolute but not resolved: the links along the way are what gets swapped.
        return cls(Path(os.path.abspath(path)))

    def files(self) -> list[Path]:
        """The files the desired state is read from now (raises ``OSError``)."""
        if self.path.is_dir():
            return directory_files(self.path)
        return [self.path]

    def fingerprint(self) -> str:
        """A digest of the names and bytes of the files now, or of why they cannot be read.

        Reading a few kilobytes is cheaper than any doubt about a modification time: a
        ConfigMap update can keep sizes and a checkout can keep times.
        """
        digest = hashlib.blake2b(digest_size=16)
        try:
            files = self.files()
            directory = self.path if self.path.is_dir() else None
        except OSError as exc:
            digest.update(f"unlistable:{exc.strerror}".encode())
            return digest.hexdigest()
        # Bounded like the loader: past MAX_BYTES the desired state is refused whatever the
        # rest says, so the rest need not be read (a huge file is not read every rescan).
        budget = MAX_BYTES + 1
        for file in files[: MAX_FILES + 1]:
            digest.update(os.fsencode(file) + b"\0")
            try:
                # A directory's entries as loading reads them: links only to files inside it.
                if directory is not None:
                    content = read_within(directory, file.name, limit=budget)
                else:
                    content = read_file(file, limit=budget)
            except OSError as exc:
                digest.update(f"\0unreadable:{exc.strerror}".encode())
            else:
                budget = max(0, budget - len(content))
                digest.update(f"{len(content)}\0".encode() + content)
            digest.update(b"\0\0")
        digest.update(str(len(files)).encode())
        return digest.hexdigest()

    def load(
        self, *, catalog: Catalog, node: str, labels: Mapping[str, str] | None = None
    ) -> DesiredNode | None:
        """This node's desired state (None: neither the files nor their node groups name the
        node; ``labels``: the node's, as :meth:`Desired.node` takes them).

        Raises :class:`~reconciler.model.ValidationError` with every located problem.
        """
        return self.load_all(catalog=catalog).node(node, labels)

    def load_all(self, *, catalog: Catalog) -> Desired:
        """Every node's desired state (delegate mode's watch). Raises as :meth:`load`."""
        return load_desired([self.path], catalog=catalog, directories=True)

    def watch_points(self) -> frozenset[str]:
        """Directories (real paths) whose entries changing may change what :meth:`files` reads.

        - the directory holding the files (the path itself when it is a directory);
        - the path's parent: the file is replaced by rename, the directory swapped as a whole;
        - the parent of every link along the path: swapping the link (git-sync's ``current``)
          changes what the path means without any event below it.
        A directory that does not exist (yet) is replaced by its nearest existing ancestor, so
        the path appearing is noticed too.
        """
        wanted: set[Path] = {self.path.parent}
        if self.path.is_dir():
            wanted.add(self.path)
        walked = Path(self.path.anchor)
        for part in self.path.parts[1:]:
            walked = walked / part
            if walked.is_symlink():
                wanted.add(walked.parent)
        return frozenset(_existing_real_dir(p) for p in wanted)


def _existing_real_dir(path: Path) -> str:
    probe = path
    while not probe.is_dir() and probe != probe.parent:
        probe = probe.parent
    return os.path.realpath(probe)
