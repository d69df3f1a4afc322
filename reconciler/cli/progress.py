"""A delegate rollout's progress, as ``apply --delegate harvester`` shows it (docs/delegate.md
"Progress"): the engine's events (``engine/rollout.py``) rendered three ways.

- :class:`TtyProgress`, on a terminal: a block redrawn in place at each event and twice a
  second, one line per node in flight (its current step and how long it has run) and a bar for
  the fleet (done / in flight / waiting / blocked / failed, elapsed, ETA); each node that ends
  leaves a line above the block. ANSI cursor movement only (``CSI n F``: to the start of the
  line ``n`` up; ``CSI J``: erase to the end of the screen), no curses.
- :class:`LineProgress`, for CI and logs: one line per node when it ends (its result, time,
  steps applied, why it failed), after its steps' lines, and a last line for the fleet.
- :class:`JsonProgress` (``-o json``): one JSON object per event on stdout, JSON Lines,
  schemas/rollout-event.schema.json.

Everything a node line shows that came from the cluster (node and object names, a webhook's
message) goes through :func:`~reconciler.cli.render.safe`: a control character in a name is
shown escaped, never sent to the terminal (a node named with an ESC must not move its cursor).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from reconciler.cli.render import PLAIN, Style, safe
from reconciler.engine.rollout import (
    InFlight,
    NodeEnded,
    NodeStarted,
    NodeState,
    NodeWaiting,
    RolloutEnded,
    RolloutEvent,
    RolloutStarted,
    RolloutTally,
    StepEnded,
    StepStarted,
    Tally,
)

#: ``--progress``'s choices.
MODES = ("auto", "tty", "lines", "none")
#: The JSON events' format version (schemas/rollout-event.schema.json).
EVENTS_VERSION = 1


class Progress(Protocol):
    def __call__(self, event: RolloutEvent) -> None: ...

    def close(self) -> None: ...


def choose(mode: str | None, stream: TextIO, environ: dict[str, str] | None = None) -> str:
    """``--progress``'s mode made definite: ``auto`` is ``tty`` when ``stream`` is a terminal
    and this is not CI (``CI`` unset, empty, ``0`` or ``false``, as GitHub Actions, GitLab CI
    and most others set it ``true``) and ``TERM`` is not ``dumb``; else ``lines``."""
    env = os.environ if environ is None else environ
    if mode not in (None, "auto"):
        return mode
    ci = env.get("CI", "").strip().lower() not in ("", "0", "false")
    terminal = _isatty(stream) and env.get("TERM", "") != "dumb"
    return "tty" if terminal and not ci else "lines"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- what the renderers share ---------------------------------------------------------------


def counts_text(t: Tally) -> str:
    c = t.counts
    return (
        f"{c[NodeState.DONE]} done, {c[NodeState.IN_FLIGHT]} in flight, "
        f"{c[NodeState.WAITING]} waiting, {c[NodeState.BLOCKED]} blocked, "
        f"{c[NodeState.FAILED]} failed"
    )


def duration(seconds: float) -> str:
    """``4.2 s`` under a minute, ``3m05s`` under an hour, ``2h03m`` beyond."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def node_line(event: NodeEnded, t: Tally, style: Style = PLAIN) -> str:
    """``[2/4] node node-b: failed in 3.1 s, 1 step applied: <why>``: a node that ended."""
    finished = t.total - t.counts[NodeState.WAITING] - t.counts[NodeState.IN_FLIGHT]
    paint = {
        NodeState.DONE: style.green,
        NodeState.BLOCKED: style.yellow,
        NodeState.FAILED: style.red,
    }.get(event.state, str)
    n = event.applied
    why = f": {safe(event.message)}" if event.message else ""
    return (
        f"[{finished}/{t.total}] node {safe(event.node)}: {paint(event.result)} in "
        f"{duration(event.seconds)}, {n} step{'s' * (n != 1)} applied{why}"
    )


def fleet_line(t: Tally, seconds: float) -> str:
    return f"Fleet: {counts_text(t)} ({duration(seconds)})."


# -- lines ----------------------------------------------------------------------------------


class LineProgress:
    """One line per node as it ends, then the fleet's counts (CI, logs)."""

    def __init__(
        self, write: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.write = write
        self.clock = clock
        self.tally = RolloutTally()

    def __call__(self, event: RolloutEvent) -> None:
        self.tally.add(event)
        match event:
            case NodeEnded():
                self.write(node_line(event, self.tally.snapshot()))
            case RolloutEnded():
                t = self.tally.snapshot()
                if t.started_at is not None:
                    self.write(fleet_line(t, event.at - t.started_at))

    def close(self) -> None:
        pass


class NoProgress:
    def __call__(self, event: RolloutEvent) -> None:
        pass

    def close(self) -> None:
        pass


# -- a terminal -----------------------------------------------------------------------------

#: The fleet bar's width in cells.
BAR = 24
#: How often the block is redrawn between events (elapsed times and the ETA move on).
TICK = 0.5


class TtyProgress:
    """The live block on a terminal (module docstring). The engine's events and the ticker
    come from several threads: every write to the terminal is made under one lock."""

    def __init__(
        self,
        stream: TextIO,
        *,
        style: Style = PLAIN,
        clock: Callable[[], float] = time.monotonic,
        size: Callable[[], os.terminal_size] | None = None,
        tick: float = TICK,
    ) -> None:
        self.stream = stream
        self.style = style
        self.clock = clock
        self.size = size or (lambda: shutil.get_terminal_size(fallback=(80, 24)))
        self.tick = tick
        self.tally = RolloutTally()
        self.lock = threading.Lock()
        self.drawn = 0
        self.ended_at: float | None = None
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def __call__(self, event: RolloutEvent) -> None:
        self.tally.add(event)
        above: list[str] = []
        match event:
            case RolloutStarted():
                self._start_ticker()
            case NodeEnded():
                above.append(node_line(event, self.tally.snapshot(), self.style))
            case RolloutEnded():
                self.ended_at = event.at
        self.draw(above)
        if isinstance(event, RolloutEnded):
            self.close()

    def close(self) -> None:
        self.stop.set()
        ticker, self.ticker = self.ticker, None
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join()

    def _start_ticker(self) -> None:
        if self.ticker is not None or self.tick <= 0:
            return
        self.stop.clear()
        self.ticker = threading.Thread(target=self._run, name="vgpuctl-progress", daemon=True)
        self.ticker.start()

    def _run(self) -> None:
        while not self.stop.wait(self.tick):
            self.draw([])

    def draw(self, above: list[str]) -> None:
        """The block again, with ``above`` written first (lines that stay)."""
        with self.lock:
            t = self.tally.snapshot()
            if t.started_at is None:
                return
            width, height = self.size()
            width = max(20, width)
            lines = self.block(t, width, max(1, height - 2))
            out = [f"\x1b[{self.drawn}F\x1b[J" if self.drawn else ""]
            out.extend(line + "\n" for line in above)
            out.extend(line + "\n" for line in lines)
            self.drawn = len(lines)
            try:
                self.stream.write("".join(out))
                self.stream.flush()
            except (OSError, ValueError):  # the terminal went away: nothing more to show
                self.stop.set()

    def block(self, t: Tally, width: int, room: int) -> list[str]:
        """The lines redrawn: a line per node in flight (as many as the screen holds), then
        the bar. Each fits the width (a wrapped line would throw the cursor movement off)."""
        now = self.clock() if self.ended_at is None else self.ended_at
        flying = sorted(t.in_flight, key=lambda f: f.since)
        shown = flying if len(flying) <= room - 1 else flying[: max(0, room - 2)]
        lines = [_fit(self._flight_line(f, now, flying), width) for f in shown]
        if len(shown) < len(flying):
            lines.append(_fit(f"  … and {len(flying) - len(shown)} more in flight", width))
        lines.append(_fit(self._bar(t, now), width))
        return lines

    def _flight_line(self, f: InFlight, now: float, flying: list[InFlight]) -> str:
        name_width = min(32, max(len(safe(g.node)) for g in flying))
        name = safe(f.node).ljust(name_width)
        if f.waiting:
            what = safe(f.waiting)
        elif f.step is None:
            what = "planning"
        else:
            planned = max(f.planned, f.number)
            what = f"step {f.number}/{planned} {f.step.kind.value} {safe(f.step.target)}"
        return f"  {name}  {what}  {duration(now - f.since)}"

    def _bar(self, t: Tally, now: float) -> str:
        c = t.counts
        total = max(1, t.total)
        finished = c[NodeState.DONE] + c[NodeState.BLOCKED] + c[NodeState.FAILED]
        full = BAR * finished // total
        flying = min(BAR - full, BAR * (finished + c[NodeState.IN_FLIGHT]) // total - full)
        bar = "█" * full + "▒" * flying + "░" * (BAR - full - flying)
        started = t.started_at if t.started_at is not None else now
        eta = t.eta()
        tail = f"{duration(now - started)}"
        if not t.ended:
            tail += f", ETA {duration(eta)}" if eta is not None else ", ETA …"
        return f"[{bar}] {finished}/{t.total}: {counts_text(t)} · {tail}"


def _fit(line: str, width: int) -> str:
    return line if len(line) < width else line[: width - 2] + "…"


# -- JSON Lines -----------------------------------------------------------------------------


class JsonProgress:
    """Each event as one JSON object on a line (schemas/rollout-event.schema.json)."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.write = write
        self.wall_clock = wall_clock
        self.started_at: float | None = None
        self.tally = RolloutTally()

    def __call__(self, event: RolloutEvent) -> None:
        self.tally.add(event)
        if isinstance(event, RolloutStarted):
            self.started_at = event.at
        doc = {
            "version": EVENTS_VERSION,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall_clock())),
            "elapsed": round(event.at - self.started_at, 3) if self.started_at is not None else 0,
            **event_json(event),
        }
        if isinstance(event, RolloutEnded):
            c = self.tally.snapshot().counts
            doc["counts"] = {
                "done": c[NodeState.DONE],
                "inFlight": c[NodeState.IN_FLIGHT],
                "waiting": c[NodeState.WAITING],
                "blocked": c[NodeState.BLOCKED],
                "failed": c[NodeState.FAILED],
            }
        self.write(json.dumps(doc, ensure_ascii=False) + "\n")

    def close(self) -> None:
        pass


def event_json(event: RolloutEvent) -> dict[str, Any]:
    """An event's own fields, as the schema names them."""
    match event:
        case RolloutStarted():
            return {
                "event": "rollout-started",
                "nodes": [{"node": n, "steps": s} for n, s in event.nodes],
                "maxParallel": event.parallel,
                "canary": event.canary,
                "maxFailedNodes": event.max_failed_nodes,
            }
        case NodeStarted():
            return {"event": "node-started", "node": event.node, "canary": event.canary}
        case StepStarted():
            a = event.action
            return {
                "event": "step-started",
                "node": event.node,
                "round": event.round,
                "seq": a.seq,
                "kind": a.kind.value,
                "target": a.target,
            }
        case StepEnded():
            return {"event": "step-ended", "node": event.node, **event.outcome.to_json()}
        case NodeWaiting():
            return {"event": "node-waiting", "node": event.node, "reason": event.reason}
        case NodeEnded():
            return {
                "event": "node-ended",
                "node": event.node,
                "result": event.result,
                "state": event.state.value,
                "seconds": round(event.seconds, 3),
                "applied": event.applied,
                "message": event.message,
            }
        case RolloutEnded():
            return {
                "event": "rollout-ended",
                "result": event.result,
                "message": event.message,
                "stopped": event.stopped,
                "notStarted": list(event.not_started),
            }
