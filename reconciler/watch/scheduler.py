"""When the watch loop reconciles: triggers, the periodic rescan, the debounce of file events,
retries after a failure, and stopping.

The worker thread alone drives a :class:`Scheduler`: it asks what is due, does it, and sleeps in
:meth:`Scheduler.wait` until the next thing is. Other threads only call
:meth:`Scheduler.desired_changed` (a file event), :meth:`Scheduler.want_soon` (delegate mode's
leadership won) and :meth:`Scheduler.stop`. Every decision is
a function of the clock the scheduler is given, so its pacing is tested with a fake clock.

What is due, in the order the worker looks:

- reading the desired state again, ``debounce`` seconds after the last file event of a burst
  (:class:`~reconciler.watch.timing.Debounce`);
- the rescan, every ``rescan_interval`` seconds counted from the end of the previous one (a
  slow rescan never makes them pile up);
- a reconcile, once something asked for one (:meth:`Scheduler.want`, with its
  :class:`Trigger`) and its time has come.

Retry policy after a failed reconcile (:meth:`Scheduler.failed`). An error says whether it is
transient (:attr:`ReconcilerError.transient <reconciler.model.ReconcilerError.transient>`:
running again later may succeed with the same inputs):

- **transient** (the API server unreachable, a write conflict, the node lock held by an apply,
  a sysfs write or ``sriov-manage`` that timed out, ``sriov-manage`` exiting non-zero, a
  device busy, a driver I/O error, an effect not visible yet, the host changed under the
  plan, the tree changing under a scan): retried after an exponential backoff with jitter
  (``Backoff``: for the n-th failure in a row, between half and all of 1 s doubling up to
  60 s). Until then drift is not looked for: the retry looks at everything anyway.
- **permanent** (a desired state the host cannot reach, a mandate refusal, a driver refusing
  a write (permission, an invalid value), RBAC denying a request, CRDs not installed, a sysfs
  tree that cannot be read, a program missing): the same inputs would fail the same way, so
  there is no retry on a timer. The next try comes when an input changes — the desired-state
  files (read and reconciled at once, as always), the host or our cluster objects (their
  fingerprints, compared at each rescan with the ones the failed reconcile took last) — or at
  the latest ``resync_interval`` seconds later (default 300 s), for the changes no
  fingerprint sees (an RBAC rule granted, a CRD installed, a program installed).
- an error that is not a :class:`~reconciler.model.ReconcilerError` (a bug, an ``OSError``
  nobody wrapped) is unknown: treated as transient, since retrying is an agent's safer default
  and the backoff's cap bounds it to about one try a minute.

Whatever the failure, a change of the desired state is reconciled at once, and the first
success ends the streak of failures (the next failure backs off from 1 s again).
"""

from __future__ import annotations

import enum
import math
import queue
import random
import threading
import time
from collections.abc import Callable

from reconciler.model import ReconcilerError
from reconciler.model.record import record
from reconciler.watch.timing import Backoff, Debounce


class Trigger(enum.StrEnum):
    """Why a reconcile runs (the ``reason`` field of its log lines)."""

    START = "start"
    DESIRED = "desired"
    HOST = "host"
    CLUSTER = "cluster"
    BLOCKED = "blocked"
    RETRY = "retry"
    #: Delegate mode's watch: this replica became the leader.
    LEADER = "leader"
    #: The node agent waits for a rollout slot (``apply/slots.py``): it tries again.
    SLOT = "slot"


def is_transient(error: BaseException | None) -> bool:
    """Whether a reconcile that failed on ``error`` is retried on a timer (see the module
    docstring): a :class:`ReconcilerError` says so itself; anything else is unknown, and
    retried."""
    if isinstance(error, ReconcilerError):
        return error.transient
    return True


@record(frozen=True, slots=True)
class Retry:
    """When a failed reconcile is tried again."""

    #: Failed reconciles in a row, this one included.
    failures: int
    transient: bool
    #: Seconds until the retry at the latest (an input changing may bring it sooner).
    delay: float

    @property
    def when(self) -> str:
        """The end of the failure's log line."""
        if self.transient:
            return f"retrying in {round(self.delay, 2)} s"
        return (
            "retrying when the desired state, the host or the cluster changes, "
            f"or in {self.delay:g} s"
        )


_DESIRED_EVENT = "desired"
_WAKE = "wake"
_WANT = "want:"


class Scheduler:
    """Decides when the worker reads the desired state, rescans and reconciles. See the module
    docstring."""

    def __init__(
        self,
        *,
        rescan_interval: float,
        debounce: float,
        backoff: Backoff,
        resync_interval: float,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.rescan_interval = rescan_interval
        self.resync_interval = resync_interval
        self._backoff = backoff
        self._clock = clock
        self._rng = rng
        self._debounce = Debounce(debounce)
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._next_rescan = clock() + rescan_interval
        # What the next reconcile is for, and when it is due (None: nothing to do).
        self._pending: set[Trigger] = set()
        self._due: float | None = None
        self._failures = 0
        self._transient = False

    # -- from any thread -----------------------------------------------------------------------

    def desired_changed(self) -> None:
        """A file event where the desired state lives."""
        self._inbox.put(_DESIRED_EVENT)

    def want_soon(self, trigger: Trigger) -> None:
        """Ask for a reconcile now, from another thread (the worker takes it when it wakes)."""
        self._inbox.put(_WANT + trigger.value)

    def stop(self) -> None:
        """Make :attr:`stopping` true and wake the worker."""
        self._stopping.set()
        self._inbox.put(_WAKE)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- the desired state ---------------------------------------------------------------------

    def read_desired_soon(self) -> None:
        """Read the desired state once it has been quiet for the debounce (as after an event)."""
        self._debounce.poke(self._clock())

    @property
    def desired_pending(self) -> bool:
        """A burst of file events is waiting for its quiet period."""
        return self._debounce.pending

    def desired_due(self) -> bool:
        """True once the desired state is to be read again (and forget the burst)."""
        return self._debounce.take(self._clock())

    # -- rescans -------------------------------------------------------------------------------

    def rescan_due(self) -> bool:
        return self._clock() >= self._next_rescan

    def rescanned(self) -> None:
        """The rescan is over (or the loop starts): the next one is an interval from now."""
        self._next_rescan = self._clock() + self.rescan_interval

    @property
    def looks_for_drift(self) -> bool:
        """Whether a rescan compares the host and the cluster with their baselines: not while
        a transient failure waits for its retry (the retry looks at everything)."""
        return self._failures == 0 or not self._transient

    @property
    def failing(self) -> bool:
        """The last reconcile failed."""
        return self._failures > 0

    # -- reconciles ----------------------------------------------------------------------------

    def want(self, trigger: Trigger, *, at: float | None = None) -> None:
        """Ask for a reconcile at ``at`` (now by default); the earliest wish wins."""
        when = self._clock() if at is None else at
        self._pending.add(trigger)
        self._due = when if self._due is None else min(self._due, when)

    def reconcile_due(self) -> bool:
        return self._due is not None and self._clock() >= self._due

    def take(self) -> str:
        """The reconcile starts: why (the triggers, comma-separated), and nothing is due now."""
        triggers = ",".join(sorted(self._pending))
        self._pending.clear()
        self._due = None
        return triggers

    def succeeded(self) -> None:
        """A reconcile ended without failing: the streak of failures is over."""
        self._failures = 0
        self._transient = False

    def failed(self, *, transient: bool) -> Retry:
        """A reconcile failed: schedule its retry by the policy of the module docstring."""
        self._failures += 1
        self._transient = transient
        if transient:
            delay = self._backoff.delay(self._failures, rng=self._rng)
        else:
            delay = self.resync_interval
        self.want(Trigger.RETRY, at=self._clock() + delay)
        return Retry(failures=self._failures, transient=transient, delay=delay)

    # -- sleeping ------------------------------------------------------------------------------

    def wake_at(self) -> float:
        """When the next thing falls due (the next rescan at the latest)."""
        return min(
            self._next_rescan,
            math.inf if self._debounce.deadline is None else self._debounce.deadline,
            math.inf if self._due is None else self._due,
        )

    def wait(self) -> None:
        """Sleep until :meth:`wake_at`, a file event or :meth:`stop`, whichever comes first;
        every item waiting in the inbox is taken (a burst of events is one debounce)."""
        try:
            item = self._inbox.get(timeout=max(0.0, self.wake_at() - self._clock()))
        except queue.Empty:
            return
        while True:
            if item == _DESIRED_EVENT:
                self._debounce.poke(self._clock())
            elif item.startswith(_WANT):
                self.want(Trigger(item.removeprefix(_WANT)))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
