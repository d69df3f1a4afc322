"""The node agents' rollout slots (``apply/slots.py``): one Lease per slot, taken by client-go's
leaderelection rules (a held slot is taken over only once seen unrenewed for a lease duration
on the taker's own clock; a released one at once), a node's own slot first, untrusted holders
never taken early; and the readiness probe's words while a node waits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from reconciler.apply.slots import (
    HeldSlot,
    NodeBudget,
    SlotBudget,
    SlotLostError,
    SlotsBusy,
    SlotUnavailableError,
)
from reconciler.watch.health import Health
from tests.doubles.cluster import FakeCluster

NS = "vgpuctl-system"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def budget(api: FakeCluster, node: str, clock: Clock) -> SlotBudget:
    # A long lease: the renewal thread (every duration/7.5 s of real time) stays out of the
    # test, whose own clock is the fake one.
    return SlotBudget(
        api, NS, node, duration=600.0, clock=clock, now=lambda: datetime(2026, 12, 8, tzinfo=UTC)
    )


def holder(api: FakeCluster, name: str) -> Any:
    return api.store[("leases", NS, name)]["spec"].get("holderIdentity", "")


def held(got: HeldSlot | SlotsBusy) -> HeldSlot:
    assert isinstance(got, HeldSlot), got
    return got


def crash(slot: HeldSlot) -> None:
    """The holder dies: no more renewals, no release."""
    slot._stopping.set()


def test_two_slots_go_to_the_first_two_nodes_and_the_third_waits() -> None:
    api, clock = FakeCluster(), Clock()
    a, b, c = (budget(api, n, clock) for n in ("node-a", "node-b", "node-c"))
    first, second = held(a.try_take(2)), held(b.try_take(2))
    assert (first.name, second.name) == ("vgpuctl-rollout-0", "vgpuctl-rollout-1")
    busy = c.try_take(2)
    assert busy == SlotsBusy(2, ("node-a", "node-b"))
    assert busy.message == "waiting for a rollout slot (2 of 2 held by: node-a, node-b)"
    second.release()
    assert holder(api, "vgpuctl-rollout-1") == ""
    # A released slot is taken at once (no lease duration's wait).
    third = held(c.try_take(2))
    assert third.name == "vgpuctl-rollout-1"
    assert holder(api, "vgpuctl-rollout-1") == "node-c"
    for slot in (first, third):
        slot.release()


def test_a_dead_holders_slot_is_taken_after_a_lease_duration_on_the_takers_clock() -> None:
    api, clock = FakeCluster(), Clock()
    a, b = budget(api, "node-a", clock), budget(api, "node-b", clock)
    crash(held(a.try_take(1)))
    assert isinstance(b.try_take(1), SlotsBusy)  # first seen now
    clock.t += 599.0
    assert isinstance(b.try_take(1), SlotsBusy)
    clock.t += 1.0
    taken = held(b.try_take(1))
    stored = api.store[("leases", NS, "vgpuctl-rollout-0")]["spec"]
    assert (stored["holderIdentity"], stored["leaseTransitions"]) == ("node-b", 1)
    taken.release()


def test_a_node_takes_back_the_slot_it_holds_before_a_free_one() -> None:
    api, clock = FakeCluster(), Clock()
    a = budget(api, "node-a", clock)
    b = budget(api, "node-b", clock)
    first, second = held(a.try_take(2)), held(b.try_take(2))
    first.release()  # slot 0 free
    crash(second)  # node-b restarts: a new process, the same node
    again = held(budget(api, "node-b", clock).try_take(2))
    assert again.name == "vgpuctl-rollout-1"
    assert holder(api, "vgpuctl-rollout-0") == ""
    again.release()


def test_a_holder_that_cannot_be_read_is_someone_else() -> None:
    api, clock = FakeCluster(), Clock()
    api.seed(
        "leases",
        [
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "vgpuctl-rollout-0", "namespace": NS},
                "spec": {"holderIdentity": "x" * 100_000, "leaseDurationSeconds": 15},
            }
        ],
    )
    busy = budget(api, "node-a", clock).try_take(1)
    assert busy == SlotsBusy(1, ("(a holder that cannot be read)",))


def test_the_budget_uses_at_most_32_slots() -> None:
    api, clock = FakeCluster(), Clock()
    taken = [held(budget(api, f"node-{i}", clock).try_take(1000)) for i in range(32)]
    busy = budget(api, "node-32", clock).try_take(1000)
    assert isinstance(busy, SlotsBusy)
    assert busy.message.startswith("waiting for a rollout slot (32 of 32 held by: node-0, ")
    assert busy.message.endswith("node-4…)")
    for slot in taken:
        slot.release()


def test_a_slot_not_renewed_for_the_renew_deadline_stops_the_next_host_action() -> None:
    api, clock = FakeCluster(), Clock()
    slot = held(budget(api, "node-a", clock).try_take(1))
    crash(slot)
    slot.guard()
    clock.t += 400.0  # the renew deadline: 2/3 of the 600 s lease
    with pytest.raises(SlotLostError, match="could not be renewed for 400 s"):
        slot.guard()


def test_watch_does_not_wait_and_apply_waits_then_gives_up() -> None:
    api, clock = FakeCluster(), Clock()
    theirs = held(budget(api, "node-a", clock).try_take(1))
    with pytest.raises(SlotUnavailableError) as caught:
        NodeBudget(budget(api, "node-b", clock)).acquire(1)
    assert caught.value.transient
    assert caught.value.message == "waiting for a rollout slot (1 of 1 held by: node-a)"
    told: list[SlotsBusy] = []

    def sleep(seconds: float) -> None:
        clock.t += seconds

    slots = budget(api, "node-b", clock)
    with pytest.raises(SlotUnavailableError) as caught:
        slots.take(1, timeout=300.0, on_wait=told.append, sleep=sleep)
    assert caught.value.message == (
        "no rollout slot became free within 300 s (1 of 1 held by: node-a): nothing was "
        "changed; run again later, or give a longer --slot-timeout"
    )
    assert len(told) == 4  # every retry period (80 s of a 600 s lease) until the deadline
    theirs.release()


class _Desired:
    current: object | None = object()
    invalid: tuple[str, ...] = ()


def test_readiness_says_the_node_waits_for_a_slot() -> None:
    probes = Health(desired=_Desired(), stale_after=30, action_budget=60)
    waiting = "waiting for a rollout slot (2 of 2 held by: node-a, node-b)"
    probes.wait_for_slot(waiting)
    assert probes.readiness().ok is False
    assert probes.readiness().reason == f"not converged yet: {waiting}"
    probes.settled((), converged=True)
    probes.wait_for_slot(waiting)  # a later change waits: still ready, saying why
    assert (probes.readiness().ok, probes.readiness().reason) == (True, f"ready: {waiting}")
    probes.settled((), converged=True)
    assert probes.readiness().reason == "ready: converged"
