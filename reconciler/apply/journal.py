"""The apply journal: a JSON Lines record of what each run meant to do and did, kept bounded.

One file per node, ``<state_dir>/<node>.journal.jsonl``, opened as ``state.py`` says (in a
directory only vgpuctl's user can write, never through a link); each record is flushed to disk
(``fsync``) before the step it describes goes on, so after a crash the last run's records say
which action was under way (an ``intent`` with no outcome). Running ``apply`` again repairs
that, because every step re-checks its precondition; the journal is what lets a person, or a
later run's report, say what happened.

Record: ``{"ts", "run", "seq", "kind", "target", "phase", "message"}``. ``seq``/``kind``/
``target`` are the plan action's; a run opens with ``kind: "run", phase: "start"`` and closes
with ``phase: "end"`` (``seq`` 0, ``target`` the node). A vGPU removal that was done and seen
gone also carries ``"removed": {"vf", "uuid", "type"}`` (:class:`Removal`; ``type`` only when
the plan named it): what ``vgpuctl device-plugin`` reads to drop that vGPU instead of calling
it Unhealthy. The message is for people and is never parsed; a record without ``removed`` is
not a removal (journals written before the field existed included).

Bounded: before a record is appended to a file that already holds :data:`ROTATE_BYTES`
(1 MiB), the file is renamed ``<node>.journal.1.jsonl`` (replacing the previous generation)
and a new one is started, at most once per run (a run's records are never split over three
generations, so a rotation never drops the running one's). A message is cut at
:data:`MESSAGE_CHARS` characters. So the two files hold at most about 2 MiB, whatever the
number of runs, plus whatever one run writes beyond the limit (three short records per
action). The rename is atomic and made in the directory through its descriptor: a crash
during rotation loses at most the old generation (the current one is either still in place
or already ``.1``), and the next record starts the new file.

Reading is bounded too: :class:`JournalReader` reads only what was appended since its last
read (following a rotation: the rest of the old generation, then the new file from its
start), in chunks of :data:`READ_CHUNK`, at most :data:`READ_BUDGET` bytes a call; a line
longer than :data:`LINE_BYTES` is skipped. :meth:`Journal.records` reads both generations,
at most the last :data:`WHOLE_READ_BYTES` of each.
"""

from __future__ import annotations

import enum
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.apply.state import (
    node_file,
    open_node_file,
    open_state_dir,
    replace_node_file,
)
from reconciler.model import ApplyError, PciAddress
from reconciler.model.errors import excerpt
from reconciler.model.record import record

RUN_KIND = "run"

#: A file holding this many bytes is rotated before the next record (once per run).
ROTATE_BYTES = 1 << 20
#: A record's message is cut to this many characters (``…`` marks the cut).
MESSAGE_CHARS = 4096
#: Bytes read from the file at a time.
READ_CHUNK = 64 << 10
#: A line longer than this is not a record vgpuctl wrote: skipped.
LINE_BYTES = 64 << 10
#: At most this many bytes are read by one :meth:`JournalReader.read_new` (the rest next time).
READ_BUDGET = 4 << 20
#: :meth:`Journal.records` reads at most the last this many bytes of each generation.
WHOLE_READ_BYTES = 8 << 20

#: A vGPU UUID as the kernel names an mdev (and vgpuctl creates one): canonical lower case.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: A vGPU type name as the driver and the catalogue spell it ("NVIDIA A2-4Q").
_TYPE_CHARS = 100


class Phase(enum.StrEnum):
    START = "start"  # a run begins (kind "run")
    INTENT = "intent"  # an action is about to be attempted
    DONE = "done"  # its effect was made and verified
    NOOP = "noop"  # its effect was already there
    FAILED = "failed"  # it failed; the run stops here
    SKIPPED = "skipped"  # not this executor's kind of action
    END = "end"  # a run finished (kind "run"), message = counts


OUTCOME_PHASES = frozenset({Phase.DONE, Phase.NOOP, Phase.FAILED, Phase.SKIPPED})


class JournalFormatError(ValueError):
    """A journal line is not a record vgpuctl writes; the message names the field."""


@record(frozen=True, slots=True)
class Removal:
    """A vGPU the executor removed and saw gone: its VF, its UUID and (when the plan named it)
    its type. Read back from the file, every field is checked (:meth:`from_json`)."""

    vf: PciAddress
    uuid: str
    type_name: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"vf": str(self.vf), "uuid": self.uuid}
        if self.type_name is not None:
            out["type"] = self.type_name
        return out

    @classmethod
    def from_json(cls, raw: object) -> Removal:
        """The removal ``raw`` describes; raises :class:`JournalFormatError` naming the field."""
        if not isinstance(raw, dict):
            raise JournalFormatError("field 'removed' is not an object")
        vf = raw.get("vf")
        try:
            address = PciAddress.parse(vf) if isinstance(vf, str) else None
        except ValueError:
            address = None
        if address is None or str(address) != vf:
            raise JournalFormatError(
                f"field 'removed.vf' {_quoted(vf)} is not a PCI address such as 0000:08:00.4"
            )
        uuid = raw.get("uuid")
        if not isinstance(uuid, str) or not _UUID.fullmatch(uuid):
            raise JournalFormatError(
                f"field 'removed.uuid' {_quoted(uuid)} is not a vGPU UUID in canonical "
                "lower-case form"
            )
        type_name = raw.get("type")
        if type_name is not None and (
            not isinstance(type_name, str)
            or not 0 < len(type_name) <= _TYPE_CHARS
            or not type_name.isprintable()
        ):
            raise JournalFormatError(
                f"field 'removed.type' {_quoted(type_name)} is not a vGPU type name"
            )
        return cls(vf=address, uuid=uuid, type_name=type_name)


def _quoted(value: object) -> str:
    return excerpt(json.dumps(value, ensure_ascii=False)) if value is not None else "(missing)"


@record(frozen=True, slots=True)
class JournalRecord:
    ts: str
    run: str
    seq: int
    kind: str
    target: str
    phase: Phase
    message: str
    removed: Removal | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ts": self.ts,
            "run": self.run,
            "seq": self.seq,
            "kind": self.kind,
            "target": self.target,
            "phase": self.phase.value,
            "message": self.message,
        }
        if self.removed is not None:
            out["removed"] = self.removed.to_json()
        return out

    @classmethod
    def from_json(cls, raw: object) -> JournalRecord:
        """The record ``raw`` describes; raises :class:`JournalFormatError` naming the field."""
        if not isinstance(raw, Mapping):
            raise JournalFormatError("not a JSON object")
        for name in ("ts", "run", "seq", "kind", "target", "phase"):
            if name not in raw:
                raise JournalFormatError(f"field {name!r} is missing")
        seq = raw["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise JournalFormatError(f"field 'seq' {_quoted(seq)} is not an integer")
        try:
            phase = Phase(raw["phase"])
        except ValueError:
            raise JournalFormatError(
                f"field 'phase' {_quoted(raw['phase'])} is not a journal phase"
            ) from None
        removed = raw.get("removed")
        return cls(
            ts=str(raw["ts"]),
            run=str(raw["run"]),
            seq=seq,
            kind=str(raw["kind"]),
            target=str(raw["target"]),
            phase=phase,
            message=str(raw.get("message", "")),
            removed=None if removed is None else Removal.from_json(removed),
        )


@record(frozen=True, slots=True)
class SkippedLine:
    """A journal line that is not a record (cut short by a crash, or not vgpuctl's)."""

    path: Path
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


@record(frozen=True, slots=True)
class JournalRead:
    """What one read found: the records, oldest first, and the lines skipped."""

    records: tuple[JournalRecord, ...]
    skipped: tuple[SkippedLine, ...]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Journal:
    """Appends records for one node (rotating the file as the module says) and reads back the
    last run."""

    def __init__(
        self,
        state_dir: Path,
        node: str,
        *,
        now: Callable[[], datetime] = _utc_now,
        rotate_bytes: int = ROTATE_BYTES,
    ) -> None:
        self.node = node
        self.state_dir = Path(state_dir)
        self.path = node_file(state_dir, node, ".journal.jsonl")
        #: The previous generation, renamed from :attr:`path` when that passed ``rotate_bytes``.
        self.rotated_path = node_file(state_dir, node, ".journal.1.jsonl")
        self.rotate_bytes = rotate_bytes
        self._now = now
        self._rotated_in: str | None = None  # the run during which this object rotated

    def new_run_id(self) -> str:
        """Sortable by start time, unique across hosts: ``20260114T093012Z-3f9a1c2e``."""
        return f"{self._now().astimezone(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"

    def record(
        self,
        *,
        run: str,
        seq: int,
        kind: str,
        target: str,
        phase: Phase,
        message: str,
        removed: Removal | None = None,
    ) -> JournalRecord:
        if len(message) > MESSAGE_CHARS:
            message = message[: MESSAGE_CHARS - 1] + "…"
        rec = JournalRecord(
            ts=self._now().astimezone(UTC).isoformat(timespec="milliseconds"),
            run=run,
            seq=seq,
            kind=kind,
            target=target,
            phase=Phase(phase),
            message=message,
            removed=removed,
        )
        line = json.dumps(rec.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        dir_fd = open_state_dir(self.state_dir)
        try:
            fd, created = open_node_file(dir_fd, self.path, flags)
            try:
                st = os.fstat(fd)
                if st.st_size >= self.rotate_bytes and self._rotated_in != run:
                    replace_node_file(dir_fd, self.path, self.rotated_path, opened=st)
                    self._rotated_in = run
                    os.close(fd)
                    fd = -1
                    fd, created = open_node_file(dir_fd, self.path, flags)
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                if fd >= 0:
                    os.close(fd)
            if created:
                # A new file's directory entry is durable only once the directory is synced.
                os.fsync(dir_fd)
        except OSError as e:
            raise ApplyError(f"cannot write the journal {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
        return rec

    def records(self) -> list[JournalRecord]:
        """Every readable record of both generations, oldest first (at most the last
        :data:`WHOLE_READ_BYTES` of each).

        A line cut short by a crash (or otherwise unreadable) is skipped, not fatal: the
        journal is evidence, and the rest of it is still good.
        """
        try:
            dir_fd = open_state_dir(self.state_dir, create=False)
        except FileNotFoundError:
            return []
        out: list[JournalRecord] = []
        try:
            for path in (self.rotated_path, self.path):
                fd = _open_for_reading(dir_fd, path)
                if fd is None:
                    continue
                try:
                    size = os.fstat(fd).st_size
                    cursor = _Cursor(path=path)
                    if size > WHOLE_READ_BYTES:
                        cursor.offset = size - WHOLE_READ_BYTES
                        cursor.discarding = ""  # from the middle of a line: to its end
                    found = cursor.read(fd, budget=WHOLE_READ_BYTES, final=True)
                finally:
                    os.close(fd)
                out.extend(found.records)
        except OSError as e:
            raise ApplyError(f"cannot read the journal {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
        return out

    def last_run(self) -> list[JournalRecord]:
        """The records of the most recent run (runs never interleave: the node lock)."""
        records = self.records()
        if not records:
            return []
        run = records[-1].run
        return [r for r in records if r.run == run]

    def interrupted(self) -> list[JournalRecord]:
        """Intents of the last run that have no outcome: what a crash cut short."""
        records = self.last_run()
        settled = {(r.seq, r.kind, r.target) for r in records if r.phase in OUTCOME_PHASES}
        return [
            r
            for r in records
            if r.phase is Phase.INTENT and (r.seq, r.kind, r.target) not in settled
        ]


def _open_for_reading(dir_fd: int, path: Path) -> int | None:
    try:
        fd, _ = open_node_file(dir_fd, path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    return fd


class JournalReader:
    """Reads the records appended to a journal since the previous read.

    It keeps where it stopped (the file's identity, the offset after the last whole line): a
    line still being written is left for next time. When the file it was reading has been
    rotated since, it finishes that generation (now :attr:`Journal.rotated_path`) from where it
    stopped, then reads the new file from its start; a generation rotated away twice between
    two reads is missed. A file that shrank was replaced, and is read from its start.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._cursor: _Cursor | None = None
        #: The rotated generation that was there when a read found no file (already old).
        self._rotated_when_missing: tuple[int, int] | None = None
        self._caught_up = False  # the last read reached the end of the journal

    def skip_to_end(self) -> None:
        """Start after what is there now: the next read returns only later records (a line
        being written is left for it)."""
        self.read_new()
        while not self._caught_up:
            self.read_new()

    def read_new(self) -> JournalRead:
        """The records appended since the last read (at most :data:`READ_BUDGET` bytes of
        them: the rest come next time) and the lines skipped. Raises ``ApplyError`` when the
        state directory or a journal file is refused (see ``state.py``)."""
        journal = self.journal
        self._caught_up = False
        try:
            dir_fd = open_state_dir(journal.state_dir, create=False)
        except FileNotFoundError:
            # Whatever appears later is new.
            self._cursor = _Cursor(path=journal.path)
            self._rotated_when_missing = None
            self._caught_up = True
            return JournalRead((), ())
        records: list[JournalRecord] = []
        skipped: list[SkippedLine] = []
        try:
            current = _open_for_reading(dir_fd, journal.path)
            try:
                identity = _identity(current) if current is not None else None
                budget = READ_BUDGET
                cursor = self._cursor
                if cursor is not None and (cursor.identity != identity or identity is None):
                    # Rotated (or replaced) since: finish the old generation where it went.
                    found = self._finish_rotated(dir_fd, cursor, budget)
                    if found is not None:
                        records.extend(found.records)
                        skipped.extend(found.skipped)
                        if not found.complete:
                            return JournalRead(tuple(records), tuple(skipped))
                        budget -= found.consumed
                    cursor = self._cursor = None
                if current is None or identity is None:
                    # No file (yet, or between a rotation and the next record): whatever
                    # appears is new, and so is an old generation other than today's.
                    self._cursor = _Cursor(path=journal.path)
                    self._rotated_when_missing = _name_identity(dir_fd, journal.rotated_path)
                    self._caught_up = True
                else:
                    if cursor is None or os.fstat(current).st_size < cursor.offset:
                        cursor = self._cursor = _Cursor(path=journal.path, identity=identity)
                    found = cursor.read(current, budget=budget, final=False)
                    records.extend(found.records)
                    skipped.extend(found.skipped)
                    self._caught_up = found.complete
            finally:
                if current is not None:
                    os.close(current)
        except OSError as e:
            raise ApplyError(f"cannot read the journal {journal.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
        return JournalRead(tuple(records), tuple(skipped))

    def _finish_rotated(self, dir_fd: int, cursor: _Cursor, budget: int) -> _Found | None:
        """Read the rest of the generation ``cursor`` was reading, now the rotated one; or all
        of a rotated generation made since a read found no file. ``None`` when it is neither
        (rotated away twice, or replaced: what was in it is missed)."""
        old = _open_for_reading(dir_fd, self.journal.rotated_path)
        if old is None:
            return None
        try:
            old_identity = _identity(old)
            if cursor.identity is None and old_identity != self._rotated_when_missing:
                cursor = _Cursor(path=self.journal.path, identity=old_identity)
            elif old_identity != cursor.identity:
                return None
            cursor.path = self.journal.rotated_path
            self._cursor = cursor  # if the budget runs out, go on from here next time
            return cursor.read(old, budget=budget, final=True)
        finally:
            os.close(old)


def _name_identity(dir_fd: int, path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


@record(frozen=True, slots=True)
class _Found:
    records: tuple[JournalRecord, ...]
    skipped: tuple[SkippedLine, ...]
    consumed: int  # bytes read
    complete: bool  # read to the end of the file


@record(slots=True)
class _Cursor:
    """Where reading one generation stopped: after a whole line (``offset``, ``line``)."""

    path: Path
    identity: tuple[int, int] | None = None
    offset: int = 0
    line: int = 0
    #: Inside a line being dropped up to its end: why (to report it), or ``""`` when reading
    #: began in the middle of it (nothing to report); ``None`` when not.
    discarding: str | None = None

    def read(self, fd: int, *, budget: int, final: bool) -> _Found:
        """Read whole lines from ``offset`` on, at most ``budget`` bytes; with ``final`` (no
        more will be written: a rotated generation) a last line without its newline is skipped
        rather than left for later."""
        records: list[JournalRecord] = []
        skipped: list[SkippedLine] = []
        buf = b""
        consumed = 0
        complete = False
        while True:
            if consumed >= budget:
                break
            chunk = os.pread(fd, min(READ_CHUNK, budget - consumed), self.offset + len(buf))
            if not chunk:
                complete = True
                break
            consumed += len(chunk)
            buf += chunk
            start = 0
            while (end := buf.find(b"\n", start)) >= 0:
                self.line += 1
                if self.discarding is not None:
                    if self.discarding:
                        skipped.append(self._skip(self.discarding))
                    self.discarding = None
                else:
                    self._take(buf[start:end], records, skipped)
                start = end + 1
            self.offset += start
            buf = buf[start:]
            if len(buf) > LINE_BYTES and self.discarding is None:
                self.discarding = f"longer than {LINE_BYTES} bytes"
            if self.discarding is not None:
                self.offset += len(buf)
                buf = b""
        if complete and final and (buf or self.discarding is not None):
            self.line += 1
            skipped.append(self._skip(self.discarding or "cut short (no end of line)"))
            self.offset += len(buf)
            self.discarding = None
        return _Found(tuple(records), tuple(skipped), consumed, complete)

    def _take(self, text: bytes, records: list[JournalRecord], skipped: list[SkippedLine]) -> None:
        if not text.strip():
            return
        try:
            records.append(JournalRecord.from_json(json.loads(text)))
        except JournalFormatError as e:
            skipped.append(self._skip(str(e)))
        except (ValueError, RecursionError):
            skipped.append(self._skip("not a JSON record"))

    def _skip(self, why: str) -> SkippedLine:
        return SkippedLine(self.path, self.line, why)
