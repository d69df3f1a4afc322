"""What a delegate rollout tells as it goes: typed events, and the tally of nodes they add up to
(docs/delegate.md "Progress").

:func:`reconciler.engine.delegate.converge` emits one :data:`RolloutEvent` at each turn of a
rollout, as it happens, one at a time (a lock orders the workers' events), through its
``on_event``: the rollout starts, a node starts, a step starts or ends, a node waits for
pcidevices-controller, a node ends, the rollout ends. The engine renders nothing: the CLI turns
the events into a terminal's live lines, a log's lines or JSON Lines (``cli/progress.py``), the
delegate watch into metrics and its readiness (``watch/delegate.py``); both count nodes with
:class:`RolloutTally`.

A node's state, for the tally: *waiting* (to be started), *in flight*, then *done* (it matches
the desired state), *blocked* (only steps a VM, or a driver pod not ready, holds up remain: no
failure) or *failed* (anything else: a failed step, a node that could not be planned again,
pcidevices-controller silent, steps left after the last round), the rollout's
``NodeRun.failed_node``.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping

from reconciler.apply.executor import Outcome, OutcomeStatus
from reconciler.model import Action
from reconciler.model.record import record


class NodeState(enum.StrEnum):
    """Where a node of a rollout is (the module docstring)."""

    DONE = "done"
    IN_FLIGHT = "in_flight"
    WAITING = "waiting"
    BLOCKED = "blocked"
    FAILED = "failed"


@record(frozen=True, slots=True)
class RolloutStarted:
    """The rollout begins: the nodes with steps, in the order they start (canaries first), each
    with its first round's steps, and the policy."""

    at: float
    nodes: tuple[tuple[str, int], ...]
    parallel: int
    canary: int
    max_failed_nodes: int


@record(frozen=True, slots=True)
class NodeStarted:
    at: float
    node: str
    #: One of the first ``canary`` nodes, which run before the others.
    canary: bool = False


@record(frozen=True, slots=True)
class StepStarted:
    """A step's checks, write and wait begin (a round's first step, or the one after)."""

    at: float
    node: str
    action: Action
    round: int = 1


@record(frozen=True, slots=True)
class StepEnded:
    at: float
    node: str
    outcome: Outcome


@record(frozen=True, slots=True)
class NodeWaiting:
    """The node's enabled GPU waits for pcidevices-controller to make its VGPUDevice objects
    (its VF steps are planned once they exist)."""

    at: float
    node: str
    reason: str


@record(frozen=True, slots=True)
class NodeEnded:
    at: float
    node: str
    #: ``Result`` of the node's rounds (``converged``, ``blocked``, ``failed``, ``unplannable``,
    #: ``controller-silent``, ``not-converged``).
    result: str
    state: NodeState
    seconds: float
    #: Steps carried out (not the ones found already done).
    applied: int
    #: One line: why it failed, or what blocks it ("" when it converged).
    message: str = ""


@record(frozen=True, slots=True)
class RolloutEnded:
    at: float
    #: ``Result`` of the whole rollout.
    result: str
    message: str
    #: Why no more nodes were started ("" when none was held back).
    stopped: str = ""
    not_started: tuple[str, ...] = ()


RolloutEvent = (
    RolloutStarted
    | NodeStarted
    | StepStarted
    | StepEnded
    | NodeWaiting
    | NodeEnded
    | (RolloutEnded)
)


@record(frozen=True, slots=True)
class InFlight:
    """A node under way: since when, and its current step (None between two rounds)."""

    node: str
    since: float
    step: Action | None = None
    #: The step's number among the node's steps so far, and the node's steps planned so far.
    number: int = 0
    planned: int = 0
    waiting: str = ""


@record(frozen=True, slots=True)
class Tally:
    """The nodes of a rollout by state, at one moment (:meth:`RolloutTally.snapshot`)."""

    counts: Mapping[NodeState, int]
    in_flight: tuple[InFlight, ...]
    #: How long each node that ended took, in the order they ended.
    durations: tuple[float, ...]
    parallel: int
    started_at: float | None
    ended: bool
    #: Failed nodes the rollout tolerates before it starts no other (``maxFailedNodes``).
    max_failed_nodes: int = 0
    canary: int = 0
    #: A canary failed (the rollout then starts no other node, whatever ``maxFailedNodes``).
    canary_failed: bool = False
    stopped: str = ""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def over_budget(self) -> bool:
        """More nodes failed than the rollout tolerates (or a canary did): it starts no other."""
        return self.canary_failed or self.counts[NodeState.FAILED] > self.max_failed_nodes

    def eta(self) -> float | None:
        """Seconds left, estimated: the finished nodes' mean time × the nodes left (waiting and
        in flight) / the nodes at once; None before a node finished, or when none is left."""
        left = self.counts[NodeState.WAITING] + self.counts[NodeState.IN_FLIGHT]
        if not self.durations or not left or self.ended:
            return None
        mean = sum(self.durations) / len(self.durations)
        return mean * left / max(1, min(self.parallel, left))


class RolloutTally:
    """Counts a rollout's nodes by state from its events. Thread-safe: the events come from the
    engine's workers, a snapshot may be read from any thread (a terminal's ticker, ``/readyz``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, NodeState] = {}
        self._flight: dict[str, InFlight] = {}
        self._steps: dict[str, int] = {}
        self._durations: list[float] = []
        self._canaries: set[str] = set()
        self._canary_failed = False
        self._parallel = 1
        self._canary = 0
        self._max_failed = 0
        self._started_at: float | None = None
        self._ended = False
        self._stopped = ""

    def add(self, event: RolloutEvent) -> None:
        with self._lock:
            self._add(event)

    def _add(self, event: RolloutEvent) -> None:
        match event:
            case RolloutStarted():
                self._states = {n: NodeState.WAITING for n, _ in event.nodes}
                self._steps = dict(event.nodes)
                self._flight.clear()
                self._durations.clear()
                self._canaries = {n for n, _ in event.nodes[: event.canary]}
                self._canary_failed = False
                self._parallel = event.parallel
                self._canary = event.canary
                self._max_failed = event.max_failed_nodes
                self._started_at = event.at
                self._ended = False
                self._stopped = ""
            case NodeStarted():
                self._states[event.node] = NodeState.IN_FLIGHT
                self._flight[event.node] = InFlight(
                    event.node, event.at, planned=self._steps.get(event.node, 0)
                )
            case StepStarted():
                now = self._flight.get(event.node)
                if now is not None:
                    planned = now.planned
                    if event.round > 1 and now.number >= planned:
                        planned = now.number + 1  # a later round's steps: one more at least
                    self._flight[event.node] = InFlight(
                        event.node, now.since, event.action, now.number + 1, planned
                    )
            case NodeWaiting():
                now = self._flight.get(event.node)
                if now is not None:
                    self._flight[event.node] = InFlight(
                        event.node, now.since, None, now.number, now.planned, event.reason
                    )
            case StepEnded():
                pass
            case NodeEnded():
                self._states[event.node] = event.state
                self._flight.pop(event.node, None)
                self._durations.append(event.seconds)
                if event.state is NodeState.FAILED and event.node in self._canaries:
                    self._canary_failed = True
            case RolloutEnded():
                self._ended = True
                self._stopped = event.stopped
                self._flight.clear()

    def snapshot(self) -> Tally:
        with self._lock:
            counts = dict.fromkeys(NodeState, 0)
            for state in self._states.values():
                counts[state] += 1
            return Tally(
                counts=counts,
                in_flight=tuple(self._flight.values()),
                durations=tuple(self._durations),
                parallel=self._parallel,
                started_at=self._started_at,
                ended=self._ended,
                max_failed_nodes=self._max_failed,
                canary=self._canary,
                canary_failed=self._canary_failed,
                stopped=self._stopped,
            )


def applied(outcomes: tuple[Outcome, ...]) -> int:
    return sum(o.status is OutcomeStatus.DONE for o in outcomes)


__all__ = [
    "InFlight",
    "NodeEnded",
    "NodeStarted",
    "NodeState",
    "NodeWaiting",
    "RolloutEnded",
    "RolloutEvent",
    "RolloutStarted",
    "RolloutTally",
    "StepEnded",
    "StepStarted",
    "Tally",
    "applied",
]
