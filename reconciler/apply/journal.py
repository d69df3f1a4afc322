"""The apply journal: an append-only JSON Lines record of what each run meant to do and did.

One file per node, ``<state_dir>/<node>.journal.jsonl``, opened as ``state.py`` says (in a
directory only vgpuctl's user can write, never through a link); each record is flushed to disk
(``fsync``) before the step it describes goes on, so after a crash the last run's records say
which action was under way (an ``intent`` with no outcome). Running ``apply`` again repairs
that, because every step re-checks its precondition; the journal is what lets a person, or a
later run's report, say what happened.

Record: ``{"ts", "run", "seq", "kind", "target", "phase", "message"}``. ``seq``/``kind``/
``target`` are the plan action's; a run opens with ``kind: "run", phase: "start"`` and closes
with ``phase: "end"`` (``seq`` 0, ``target`` the node).
"""

from __future__ import annotations

import enum
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.apply.state import node_file, open_node_file, open_state_dir
from reconciler.model import ApplyError

RUN_KIND = "run"


class Phase(enum.StrEnum):
    START = "start"  # a run begins (kind "run")
    INTENT = "intent"  # an action is about to be attempted
    DONE = "done"  # its effect was made and verified
    NOOP = "noop"  # its effect was already there
    FAILED = "failed"  # it failed; the run stops here
    SKIPPED = "skipped"  # not this executor's kind of action
    END = "end"  # a run finished (kind "run"), message = counts


OUTCOME_PHASES = frozenset({Phase.DONE, Phase.NOOP, Phase.FAILED, Phase.SKIPPED})


@dataclass(frozen=True, slots=True)
class JournalRecord:
    ts: str
    run: str
    seq: int
    kind: str
    target: str
    phase: Phase
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "run": self.run,
            "seq": self.seq,
            "kind": self.kind,
            "target": self.target,
            "phase": self.phase.value,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> JournalRecord:
        return cls(
            ts=str(raw["ts"]),
            run=str(raw["run"]),
            seq=int(raw["seq"]),
            kind=str(raw["kind"]),
            target=str(raw["target"]),
            phase=Phase(raw["phase"]),
            message=str(raw.get("message", "")),
        )


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Journal:
    """Appends records for one node and reads back the last run."""

    def __init__(
        self, state_dir: Path, node: str, *, now: Callable[[], datetime] = _utc_now
    ) -> None:
        self.node = node
        self.state_dir = Path(state_dir)
        self.path = node_file(state_dir, node, ".journal.jsonl")
        self._now = now

    def new_run_id(self) -> str:
        """Sortable by start time, unique across hosts: ``20260114T093012Z-3f9a1c2e``."""
        return f"{self._now().astimezone(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"

    def record(
        self, *, run: str, seq: int, kind: str, target: str, phase: Phase, message: str
    ) -> JournalRecord:
        rec = JournalRecord(
            ts=self._now().astimezone(UTC).isoformat(timespec="milliseconds"),
            run=run,
            seq=seq,
            kind=kind,
            target=target,
            phase=Phase(phase),
            message=message,
        )
        line = json.dumps(rec.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"
        dir_fd = open_state_dir(self.state_dir)
        try:
            fd, created = open_node_file(dir_fd, self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
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
        """Every readable record, oldest first.

        A line cut short by a crash (or otherwise unreadable) is skipped, not fatal: the
        journal is evidence, and the rest of it is still good.
        """
        try:
            dir_fd = open_state_dir(self.state_dir, create=False)
        except FileNotFoundError:
            return []
        try:
            fd, _ = open_node_file(dir_fd, self.path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ApplyError(f"cannot read the journal {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
        out = []
        for line in text.splitlines():
            try:
                out.append(JournalRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
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
