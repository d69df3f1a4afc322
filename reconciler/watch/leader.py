"""Delegate mode's leadership: one replica of ``watch --delegate harvester`` acts at a time.

:class:`Leadership` runs the Lease's rounds (``apply/lease.py``, client-go's rules) on a thread
of its own, every ``retry_period`` seconds, whatever the worker is doing: a leader waiting
minutes for pcidevices-controller keeps renewing. The worker asks :meth:`Leadership.leading`
before a reconcile and, through :meth:`Leadership.guard`, before every write: a leader that has
not renewed within ``renew_deadline`` (shorter than the lease duration, as client-go's 10 s
against 15 s) stops before its next write, so it has stopped before any other replica may take
over. Winning the Lease asks the worker for a reconcile (the new leader looks at everything);
stopping releases it, so the standby takes over at once instead of after a lease duration.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from reconciler.apply.lease import LeaderLease
from reconciler.model import ReconcilerError
from reconciler.model.errors import printable

log = logging.getLogger("vgpuctl.watch")


class NotLeaderError(ReconcilerError):
    """This replica no longer holds the Lease: it writes nothing more (the leader carries on)."""

    transient = True


class Leadership:
    """Keeps trying to hold ``lease``; tells ``on_change(leading)`` when that changes."""

    def __init__(
        self,
        lease: LeaderLease,
        *,
        retry_period: float,
        renew_deadline: float,
        on_change: Callable[[bool], None],
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        if not 0 < retry_period < renew_deadline <= lease.duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline <= lease duration: "
                f"{retry_period}, {renew_deadline}, {lease.duration}"
            )
        self.lease = lease
        self.retry_period = retry_period
        self.renew_deadline = renew_deadline
        self._on_change = on_change
        self._on_error = on_error
        self._stopping = threading.Event()
        self._leading = False
        self._failing = False
        #: Why the last round could not read or renew the Lease (None: it could).
        self.failure: str | None = None
        #: A round has run (until then nobody here knows who holds the Lease).
        self.looked = False
        self._thread = threading.Thread(target=self._run, name="vgpuctl-lease", daemon=True)

    # -- read by the worker and the probes -----------------------------------------------------

    def leading(self) -> bool:
        """Whether this replica may act now: it renewed within the renew deadline."""
        return self.lease.holds(within=self.renew_deadline)

    def guard(self) -> None:
        """Raise :class:`NotLeaderError` unless this replica may act now (before a write)."""
        if not self.leading():
            raise NotLeaderError(
                f"{self.lease.identity} no longer holds the Lease "
                f"{self.lease.namespace}/{self.lease.name}: stopped before the next write"
            )

    @property
    def holder(self) -> str:
        """Who held the Lease at the last round ("" when nobody, or it could not be read)."""
        return printable(self.lease.seen_holder)

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """End the rounds; with ``release``, give the Lease up if we hold it."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(self.lease.duration)
        self._leading = False
        if not release:
            return
        try:
            if self.lease.release():
                log.info("released the Lease %s/%s", self.lease.namespace, self.lease.name)
        except ReconcilerError as exc:
            log.warning("could not release the Lease: %s", exc.message)

    def round(self) -> None:
        """One try to acquire or renew, and what it changes (the thread's body; tests call it)."""
        try:
            self.lease.try_acquire_or_renew()
        except ReconcilerError as exc:
            self._on_error()
            if not self._failing:
                log.warning("cannot read or renew the Lease: %s (retrying)", exc.message)
            self._failing = True
            self.failure = exc.message
        else:
            if self._failing:
                log.info("the Lease can be read again")
            self._failing = False
            self.failure = None
        self.looked = True
        leading = self.leading()
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            log.info(
                "became the leader (Lease %s/%s): acting",
                self.lease.namespace,
                self.lease.name,
                extra={"identity": self.lease.identity},
            )
        else:
            log.warning(
                "lost the Lease %s/%s: standing by",
                self.lease.namespace,
                self.lease.name,
                extra={"identity": self.lease.identity},
            )
        self._on_change(leading)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.round()
            except Exception:  # a bug must not end the rounds silently: the leader would stop
                self._on_error()
                log.exception("internal error in leader election (it goes on)")
            self._stopping.wait(self.retry_period)
