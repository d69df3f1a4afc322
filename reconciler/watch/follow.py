"""File events where the desired state lives, through watchdog (inotify on Linux).

:class:`DesiredStateWatch` watches, non-recursively, the directories
:meth:`~reconciler.watch.source.DesiredSource.watch_points` names, and reports any change in
them to the loop, which debounces and reads the files again. The points are worked out again
on every :meth:`refresh` (the loop calls it after each burst of events and at every rescan):
after git-sync swaps its ``current`` link, the new checkout is watched and the old one, which
git-sync deletes, is dropped. A directory deleted and re-created under the same name is a new
inode and is watched afresh.

Only events that can change content are asked for: reading the files ourselves (open, close
without writing) must not look like a change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import ObservedWatch

from reconciler.watch.source import DesiredSource

log = logging.getLogger("vgpuctl.watch")

_CONTENT_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileClosedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirModifiedEvent,
    DirMovedEvent,
]

#: A watched directory: its real path and identity (device, inode).
_Point = tuple[str, int, int]


class _Events(FileSystemEventHandler):
    def __init__(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._on_change()


class DesiredStateWatch:
    """Calls ``on_change`` (from watchdog's thread) on any event where the desired state lives.

    :meth:`refresh` and :meth:`close` are for one thread (the loop's worker).
    """

    def __init__(self, source: DesiredSource, *, on_change: Callable[[], None]) -> None:
        self.source = source
        self._handler = _Events(on_change)
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.start()
        self._watches: dict[_Point, ObservedWatch] = {}

    @property
    def watched(self) -> frozenset[str]:
        """The directories watched now."""
        return frozenset(point[0] for point in self._watches)

    def refresh(self) -> None:
        wanted: set[_Point] = set()
        for path in self.source.watch_points():
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone since it was named: the next refresh names its ancestor
            wanted.add((path, st.st_dev, st.st_ino))
        for point in set(self._watches) - wanted:
            watch = self._watches.pop(point)
            try:
                self._observer.unschedule(watch)
            except Exception:  # its directory is gone and watchdog dropped it already
                log.debug("unwatching %s: already gone", point[0])
        for point in wanted - set(self._watches):
            try:
                self._watches[point] = self._observer.schedule(
                    self._handler, point[0], recursive=False, event_filter=_CONTENT_EVENTS
                )
            except OSError as exc:
                log.warning(
                    "cannot watch %s: %s (changes are still noticed at each rescan)",
                    point[0],
                    exc.strerror or exc,
                )
                continue
            log.debug("watching %s", point[0])

    def close(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
