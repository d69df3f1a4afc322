"""Delegate mode's leadership (``watch/leader.py``): the Lease's rounds, and the guard before
every write. client-go's rules are the oracle: a leader stops acting once it has not renewed
within the renew deadline (10 s of a 15 s lease by default), before any other candidate may take
over; renewing again makes it leader again."""

from __future__ import annotations

import pytest

from reconciler.apply.delegate import DelegateExecutor
from reconciler.apply.executor import OutcomeStatus
from reconciler.apply.lease import LeaderLease
from reconciler.model import Observation, Plan
from reconciler.watch.leader import Leadership, NotLeaderError
from tests.doubles.cluster import FakeCluster
from tests.harvester_objects import NODE, enable, vf_object

NS, NAME = "vgpuctl-delegate", "vgpuctl-delegate"


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def leadership(
    api: FakeCluster, clock: Clock, changes: list[bool], errors: list[int]
) -> Leadership:
    lease = LeaderLease(api, NS, NAME, "pod-a", duration=15.0, clock=clock)
    return Leadership(
        lease,
        retry_period=2.0,
        renew_deadline=10.0,
        on_change=changes.append,
        on_error=lambda: errors.append(1),
    )


def test_a_leader_stops_at_the_renew_deadline_and_leads_again_once_it_renews() -> None:
    api, clock, changes, errors = FakeCluster(), Clock(), [], []
    lead = leadership(api, clock, changes, errors)
    assert not lead.looked
    lead.round()
    assert changes == [True] and lead.leading() and lead.holder == "pod-a" and lead.looked
    lead.guard()  # may write

    api.down = True  # the API server does not answer: renewals fail
    clock.t += 2
    lead.round()
    assert errors == [1] and changes == [True]  # 2 s without renewal: still leading
    assert lead.failure is not None and "cannot reach the Kubernetes API server" in lead.failure
    clock.t += 8.5  # 10.5 s since the last renewal
    assert not lead.leading()
    with pytest.raises(NotLeaderError, match="pod-a no longer holds the Lease"):
        lead.guard()
    lead.round()
    assert changes == [True, False] and len(errors) == 2

    api.down = False  # back: the Lease still names us, so we renew it
    clock.t += 2
    lead.round()
    assert changes == [True, False, True] and lead.leading() and lead.failure is None


def test_a_standby_never_leads_while_the_holder_renews() -> None:
    api, clock, changes, errors = FakeCluster(), Clock(), [], []
    other = LeaderLease(api, NS, NAME, "pod-b", duration=15.0, clock=clock)
    assert other.try_acquire_or_renew()
    lead = leadership(api, clock, changes, errors)
    for _ in range(30):
        lead.round()
        clock.t += 2
        assert other.try_acquire_or_renew()
    assert changes == [] and not lead.leading() and lead.holder == "pod-b"


def test_the_timings_must_leave_the_leader_time_to_stop_first() -> None:
    lease = LeaderLease(FakeCluster(), NS, NAME, "pod-a", duration=15.0)
    for retry, deadline in ((2.0, 16.0), (10.0, 10.0), (0.0, 10.0)):
        with pytest.raises(ValueError, match="retry period < renew deadline <= lease duration"):
            Leadership(lease, retry_period=retry, renew_deadline=deadline, on_change=print)


def test_the_guard_stops_a_run_before_its_write() -> None:
    # A replica that never won the Lease (or lost it): the executor asks before the patch.
    api, clock = FakeCluster(), Clock()
    api.seed("vgpudevices", [vf_object(False, "", configured=False)])
    lead = leadership(api, clock, [], [])
    executor = DelegateExecutor(
        api, used_by=dict, timeout=5, poll=1, clock=clock, sleep=lambda s: None, guard=lead.guard
    )
    plan = Plan(
        NODE, "harvester", Observation("sha256:x"), actions=(enable("NVIDIA A2-4Q").numbered(1),)
    )
    result = executor.run(plan)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert "no longer holds the Lease" in outcome.message
    assert api.patches == []
