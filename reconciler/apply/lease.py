"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``
does it: for delegate mode's watch, which must act from one replica at a time
(docs/delegate.md).

One candidate holds the Lease (``spec.holderIdentity``) and renews it (``spec.renewTime``) well
within ``spec.leaseDurationSeconds``. Another takes it over only once it has seen the record
unchanged for a whole lease duration **on its own clock** (client-go's ``observedTime``): the
times written in the Lease are other machines' and are never compared with ours, so clock skew
cannot make two leaders. Every write carries the ``resourceVersion`` it was planned from: a
candidate that loses a race gets a conflict and is not leader. Lease contents are untrusted: a
record that cannot be read counts as held by someone, until it has been seen unchanged for a
lease duration. Its text fields are read within bounds (``model.clustertext``): a holder that is
not a string of at most :data:`MAX_HOLDER` characters is someone else, shown as
:data:`UNREADABLE_HOLDER` (never quoted whole into a log line or a probe's answer); a
``renewTime`` or ``acquireTime`` that is not a string of at most :data:`MAX_TIME` characters is
no time (the record is still told apart by its resourceVersion, so it expires as any other).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.model import ConflictError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.clustertext import ClusterTextError, bounded_text
from reconciler.model.record import record

GROUP = "coordination.k8s.io"
VERSION = "v1"
PLURAL = "leases"
#: client-go's defaults: a lease of 15 s, renewed every 2 s, given up after 10 s of failures.
DEFAULT_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0
#: The longest holder identity read (ours is a pod name, at most 253 characters, and a
#: client-go holder adds a ``_`` and a UUID).
MAX_HOLDER = 512
#: The longest time read (a MicroTime is 27 characters).
MAX_TIME = 64
#: The holder shown for one that cannot be read (it counts as someone else).
UNREADABLE_HOLDER = "(a holder that cannot be read)"


@record
class LeaderLease:
    """One candidate for the Lease ``namespace``/``name``."""

    api: ClusterApi
    namespace: str
    name: str
    identity: str
    duration: float = DEFAULT_DURATION
    #: Our own clock, for how long a record has been seen unchanged (monotonic).
    clock: Callable[[], float] = time.monotonic
    #: The wall clock written into the Lease (for people and for client-go tools).
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    #: The holder the last round read ("" when none), for logs and the readiness probe.
    seen_holder: str = ""
    _observed: tuple[str, str, str] | None = None  # holder, renewTime, resourceVersion
    _observed_at: float = 0.0
    _renewed_at: float | None = None

    def try_acquire_or_renew(self) -> bool:
        """One round: create the Lease, renew ours, or take over an expired one. True when we
        hold it afterwards."""
        current = self.api.get_object(
            group=GROUP, version=VERSION, plural=PLURAL, name=self.name, namespace=self.namespace
        )
        return self.acquire_or_renew_seen(current)

    def acquire_or_renew_seen(self, current: Mapping[str, Any] | None) -> bool:
        """:meth:`try_acquire_or_renew` from the Lease as the caller just read it (None: there
        is none), e.g. an item of a list of Leases (``slots.py`` reads every slot at once)."""
        stamp = _micro(self.now())
        if current is None:
            body = self._body(stamp, acquired=stamp, transitions=0)
            try:
                self.api.create_object(
                    group=GROUP, version=VERSION, plural=PLURAL, body=body,
                    namespace=self.namespace,
                )  # fmt: skip
            except ConflictError:
                return False  # another candidate created it first
            return self._won()
        spec = _mapping(current.get("spec"))
        metadata = _mapping(current.get("metadata"))
        holder = _holder(spec.get("holderIdentity"))
        self.seen_holder = holder
        record = (holder, _time(spec.get("renewTime")), str(metadata.get("resourceVersion", "")))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        mine = holder == self.identity
        if not mine and holder and self.clock() - self._observed_at < self.duration:
            return False  # held, and renewed within a lease duration as far as we have seen
        transitions = spec.get("leaseTransitions")
        count = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        acquired = _time(spec.get("acquireTime")) if mine else stamp
        body = self._body(
            stamp,
            acquired=acquired or stamp,
            transitions=count if mine else count + 1,
        )
        if not self._replace(body, record[2]):
            return False  # it changed under us: someone else renewed or took it
        return self._won()

    def holds(self, within: float | None = None) -> bool:
        """Whether we renewed within ``within`` seconds (the lease duration by default): else
        we must stop acting. The watch passes client-go's renew deadline, shorter than the
        duration, so a leader stops before any other candidate may take over."""
        limit = self.duration if within is None else min(within, self.duration)
        return self._renewed_at is not None and self.clock() - self._renewed_at < limit

    def release(self) -> bool:
        """Give the Lease up (client-go's ``ReleaseOnCancel``): an empty holder that any
        candidate takes at once, so a replica stopping hands over without a lease duration's
        wait. Only a Lease we hold, from the version we read: never another's. True when
        released."""
        self._renewed_at = None
        current = self.api.get_object(
            group=GROUP, version=VERSION, plural=PLURAL, name=self.name, namespace=self.namespace
        )
        if current is None:
            return False
        spec = _mapping(current.get("spec"))
        if spec.get("holderIdentity") != self.identity:
            return False
        metadata = _mapping(current.get("metadata"))
        stamp = _micro(self.now())
        transitions = spec.get("leaseTransitions")
        body = self._body(
            stamp,
            acquired=stamp,
            transitions=transitions if isinstance(transitions, int) else 0,
            released=True,
        )
        return self._replace(body, str(metadata.get("resourceVersion", "")))

    def _replace(self, body: dict[str, Any], version: str) -> bool:
        """Write ``body`` over the Lease as read at ``version``; False on a conflict."""
        body["metadata"]["resourceVersion"] = version
        try:
            self.api.replace_object(
                group=GROUP, version=VERSION, plural=PLURAL, name=self.name, body=body,
                namespace=self.namespace,
            )  # fmt: skip
        except ConflictError:
            return False
        return True

    def _won(self) -> bool:
        self.seen_holder = self.identity
        self._renewed_at = self.clock()
        self._observed = None
        return True

    def _body(
        self, stamp: str, *, acquired: str, transitions: int, released: bool = False
    ) -> dict[str, Any]:
        """The Lease as we write it; ``released``: client-go's release() — no holder and a
        1 s duration, so any candidate takes it at once."""
        spec: dict[str, Any] = {
            "leaseDurationSeconds": 1 if released else max(1, round(self.duration)),
            "acquireTime": acquired,
            "renewTime": stamp,
            "leaseTransitions": transitions,
        }
        if not released:
            spec["holderIdentity"] = self.identity
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }


def _holder(value: object) -> str:
    """``spec.holderIdentity``: "" when nobody holds the Lease (absent or empty), else the
    holder, or :data:`UNREADABLE_HOLDER` when it is not a string of at most
    :data:`MAX_HOLDER` characters (held by someone else: never taken over early)."""
    if value is None or value == "":
        return ""
    try:
        return bounded_text(value, limit=MAX_HOLDER)
    except ClusterTextError:
        return UNREADABLE_HOLDER


def _time(value: object) -> str:
    """A time of the Lease as written: "" when absent or not a string of at most
    :data:`MAX_TIME` characters."""
    if value is None:
        return ""
    try:
        return bounded_text(value, limit=MAX_TIME)
    except ClusterTextError:
        return ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _micro(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
