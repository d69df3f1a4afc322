"""The node agents' fleet budget: at most ``spec.rollout.maxParallel`` nodes change their hosts
at once, coordinated through the API server (issue 33; docs/architecture.md, "The node agents'
rollout budget").

A budget of *n* is *n* slots, each a ``coordination.k8s.io/v1`` Lease named
``vgpuctl-rollout-<i>`` (``0 <= i < n``) in the agents' namespace. A node agent about to change
its host (a plan with a host action) takes one: a slot it still holds (its own holder identity,
the node name: a restarted agent takes its slot back rather than a second), else the first one
that is absent, released or expired. Each slot is one :class:`~reconciler.apply.lease.LeaderLease`
and follows its rules (client-go's leaderelection): a holder renews it well within
``leaseDurationSeconds``; another node takes it over only after seeing it unchanged for a whole
lease duration **on its own clock** (a crashed holder's slot, after the duration); every write
carries the resourceVersion it was planned from (two nodes racing for one slot: one gets a
conflict and tries the next); contents are untrusted (bounded texts; a holder that cannot be read
is someone else). The agent renews its slot on a thread of its own while it applies, is
refused its next host action once it could not renew for the renew deadline (``guard``, the
host executor asks before each action), and releases it when done, whatever the outcome
(client-go's ``ReleaseOnCancel``: an empty holder any node takes at once).

One Lease per slot rather than one Lease holding a count: each slot is a plain Lease that
``kubectl get leases`` shows with its holder and client-go's rules apply to unchanged; nodes
taking different slots never write the same object (a count would make every node's renewal a
write of one shared object, conflicting with each other's); and the admission policy can judge
each write from the Lease alone (the holder before and after against the node the token was
issued on), which a count's list of holders kept in an annotation would not let CEL do.

The slots read in one list of the namespace's Leases (one request per try, whatever the
budget). At most :data:`MAX_SLOTS` slots are used, whatever ``maxParallel`` says: fewer nodes at
once than allowed is within the budget, and it keeps the names few enough for RBAC to grant
``get`` and ``update`` by name (deploy/rbac.yaml lists them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.apply.lease import (
    DEFAULT_DURATION,
    GROUP,
    PLURAL,
    UNREADABLE_HOLDER,
    VERSION,
    LeaderLease,
)
from reconciler.model import ReconcilerError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.clustertext import ClusterTextError, bounded_text
from reconciler.model.errors import printable
from reconciler.model.record import record

log = logging.getLogger("vgpuctl.slots")

#: A slot's Lease is this followed by its index.
SLOT_PREFIX = "vgpuctl-rollout-"
#: The most slots used (deploy/rbac.yaml grants get and update on these names alone).
MAX_SLOTS = 32
#: Where the slots live when neither an option nor the pod says (deploy/namespace.yaml).
DEFAULT_NAMESPACE = "vgpuctl-system"
#: How many holders a waiting message names before "…".
HOLDERS_SHOWN = 5
#: The longest name of a listed Lease read (an object name is at most 253 characters).
_MAX_NAME = 253


def slot_name(index: int) -> str:
    return f"{SLOT_PREFIX}{index}"


def slot_count(max_parallel: int) -> int:
    """How many slots a budget of ``max_parallel`` uses."""
    return max(1, min(max_parallel, MAX_SLOTS))


class SlotUnavailableError(ReconcilerError):
    """No rollout slot is free: this node does not change its host now. Transient: a slot
    frees when another node is done (or its holder's Lease expires)."""

    transient = True

    def __init__(self, busy: SlotsBusy, *, waited: float | None = None) -> None:
        message = busy.message
        if waited is not None:
            message = (
                f"no rollout slot became free within {waited:g} s ({busy.held_text}): nothing "
                "was changed; run again later, or give a longer --slot-timeout"
            )
        super().__init__(message)
        self.busy = busy


class SlotLostError(ReconcilerError):
    """The slot could not be renewed for the renew deadline: another node may take it over
    soon, so this one stops before its next host action."""

    transient = True


@record(frozen=True, slots=True)
class SlotsBusy:
    """What a try that found no free slot saw."""

    #: The budget's slots.
    slots: int
    #: Who holds them (each printable, at most 512 characters), in slot order.
    holders: tuple[str, ...]

    @property
    def held_text(self) -> str:
        shown = ", ".join(self.holders[:HOLDERS_SHOWN])
        more = "…" if len(self.holders) > HOLDERS_SHOWN else ""
        return f"{len(self.holders)} of {self.slots} held by: {shown}{more}"

    @property
    def message(self) -> str:
        return f"waiting for a rollout slot ({self.held_text})"


class HeldSlot:
    """A slot this node holds: renewed on a thread of its own until :meth:`release`."""

    def __init__(
        self,
        lease: LeaderLease,
        *,
        retry_period: float,
        renew_deadline: float,
        waited: bool,
    ) -> None:
        self.lease = lease
        self.retry_period = retry_period
        self.renew_deadline = renew_deadline
        #: Whether the node waited for it (the engine then plans again before acting).
        self.waited = waited
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="vgpuctl-slot", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self.lease.name

    def guard(self) -> None:
        """Raise :class:`SlotLostError` unless the slot was renewed within the renew deadline."""
        if not self.lease.holds(within=self.renew_deadline):
            raise SlotLostError(
                f"the rollout slot {self.lease.namespace}/{self.lease.name} could not be renewed "
                f"for {self.renew_deadline:g} s: stopped before the next host action (another "
                "node may take the slot over)"
            )

    def release(self) -> None:
        """Stop renewing and give the slot up (an empty holder: the next node takes it at
        once). A failure is logged: the slot then expires after its lease duration."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.lease.duration)
        try:
            released = self.lease.release()
        except ReconcilerError as exc:
            log.warning(
                "could not release the rollout slot %s/%s: %s (it expires after %g s)",
                self.lease.namespace,
                self.lease.name,
                exc.message,
                self.lease.duration,
            )
            return
        if released:
            log.info("released the rollout slot %s/%s", self.lease.namespace, self.lease.name)

    def _renew(self) -> None:
        failing = False
        while not self._stopping.wait(self.retry_period):
            try:
                ok = self.lease.try_acquire_or_renew()
            except ReconcilerError as exc:
                if not failing:
                    log.warning("cannot renew the rollout slot %s: %s", self.name, exc.message)
                failing = True
                continue
            except Exception:  # a bug must not end the renewals silently
                log.exception("internal error renewing the rollout slot %s", self.name)
                continue
            if not ok:
                log.warning("lost the rollout slot %s to another node", self.name)
                return
            failing = False


class SlotBudget:
    """This node's way to the fleet's rollout slots in ``namespace``. Keep one for the life of
    the process: a slot another node holds is taken over only once this object has seen it
    unchanged for a lease duration (its own clock), across tries."""

    def __init__(
        self,
        api: ClusterApi,
        namespace: str,
        identity: str,
        *,
        duration: float = DEFAULT_DURATION,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.duration = duration
        self._clock = clock
        self._now = now
        self._leases: dict[str, LeaderLease] = {}

    @property
    def retry_period(self) -> float:
        """client-go's ratio: 2 s for a 15 s lease."""
        return self.duration / 7.5

    @property
    def renew_deadline(self) -> float:
        """client-go's ratio: 10 s for a 15 s lease."""
        return self.duration * 2 / 3

    def try_take(self, max_parallel: int, *, waited: bool = False) -> HeldSlot | SlotsBusy:
        """One try: a slot this node holds, else a free or expired one; what was seen when
        none is."""
        count = slot_count(max_parallel)
        names = [slot_name(i) for i in range(count)]
        seen = self._read(set(names))
        # Our own first: a restarted agent takes its slot back rather than a second one.
        ours = [n for n in names if n in seen and _holder(seen[n]) == self.identity]
        for name in ours + [n for n in names if n not in ours]:
            if not self._lease(name).acquire_or_renew_seen(seen.get(name)):
                continue
            try:
                log.info(
                    "took the rollout slot %s/%s (%d slot(s), spec.rollout.maxParallel %d)",
                    self.namespace,
                    name,
                    count,
                    max_parallel,
                )
                return HeldSlot(
                    self._lease(name),
                    retry_period=self.retry_period,
                    renew_deadline=self.renew_deadline,
                    waited=waited,
                )
            except BaseException:  # SIGTERM's SystemExit before the caller has it: give it up
                self._lease(name).release()
                raise
        holders = tuple(
            printable(self._lease(n).seen_holder) or "(being taken)" for n in names if n in seen
        )
        return SlotsBusy(count, holders)

    def take(
        self,
        max_parallel: int,
        *,
        timeout: float,
        on_wait: Callable[[SlotsBusy], None] = lambda _: None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> HeldSlot:
        """Try until a slot is taken, every retry period, for at most ``timeout`` seconds
        (``on_wait`` told of each busy try); then :class:`SlotUnavailableError`."""
        deadline = self._clock() + timeout
        waited = False
        while True:
            got = self.try_take(max_parallel, waited=waited)
            if isinstance(got, HeldSlot):
                return got
            left = deadline - self._clock()
            if left <= 0:
                raise SlotUnavailableError(got, waited=timeout)
            on_wait(got)
            waited = True
            sleep(min(self.retry_period, left))

    def _lease(self, name: str) -> LeaderLease:
        lease = self._leases.get(name)
        if lease is None:
            lease = LeaderLease(
                self.api,
                self.namespace,
                name,
                self.identity,
                duration=self.duration,
                clock=self._clock,
                now=self._now,
            )
            self._leases[name] = lease
        return lease

    def _read(self, names: set[str]) -> dict[str, Mapping[str, Any]]:
        """The slots among the namespace's Leases, by name (an item that is not an object
        with a readable name is no slot)."""
        items = self.api.list_objects(
            group=GROUP, version=VERSION, plural=PLURAL, namespace=self.namespace
        )
        out: dict[str, Mapping[str, Any]] = {}
        for item in items:
            if not isinstance(item, Mapping):
                continue
            metadata = item.get("metadata")
            if not isinstance(metadata, Mapping):
                continue
            try:
                name = bounded_text(metadata.get("name"), limit=_MAX_NAME)
            except ClusterTextError:
                continue
            if name in names:
                out[name] = item
        return out


def _holder(item: Mapping[str, Any]) -> str:
    spec = item.get("spec")
    value = spec.get("holderIdentity") if isinstance(spec, Mapping) else None
    if value is None or value == "":
        return ""
    try:
        return bounded_text(value, limit=512)
    except ClusterTextError:
        return UNREADABLE_HOLDER


class NodeBudget:
    """The engine's port (``engine.ports.RolloutBudget``) over :class:`SlotBudget`: ``apply``
    waits for a slot up to ``wait`` seconds; ``watch`` (``wait`` None) does not wait, and
    requeues on :class:`SlotUnavailableError`."""

    def __init__(
        self,
        slots: SlotBudget,
        *,
        wait: float | None = None,
        on_wait: Callable[[SlotsBusy], None] = lambda _: None,
    ) -> None:
        self.slots = slots
        self.wait = wait
        self.on_wait = on_wait

    def acquire(self, max_parallel: int) -> HeldSlot:
        if self.wait is None:
            got = self.slots.try_take(max_parallel)
            if isinstance(got, SlotsBusy):
                raise SlotUnavailableError(got)
            return got
        return self.slots.take(max_parallel, timeout=self.wait, on_wait=self.on_wait)
