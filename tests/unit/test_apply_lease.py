"""Leader election through a Lease (``apply/lease.py``), as client-go's ``leaderelection`` does
it: expiry is judged on the candidate's own clock from when it last saw the record change,
never from the times written in the Lease; every write is planned from a resourceVersion."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from reconciler.apply.lease import UNREADABLE_HOLDER, LeaderLease
from tests.doubles.cluster import FakeCluster

NS, NAME = "vgpuctl-delegate", "vgpuctl-delegate"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def candidate(api: FakeCluster, identity: str, clock: Clock) -> LeaderLease:
    return LeaderLease(
        api,
        NS,
        NAME,
        identity,
        duration=15.0,
        clock=clock,
        now=lambda: datetime(2026, 12, 2, 14, 0, 0, 123456, tzinfo=UTC),
    )


def stored(api: FakeCluster) -> dict[str, Any]:
    return api.store[("leases", NS, NAME)]


def test_the_first_candidate_creates_the_lease_and_holds_it() -> None:
    api, clock = FakeCluster(), Clock()
    a = candidate(api, "pod-a", clock)
    assert a.try_acquire_or_renew() and a.holds()
    assert stored(api)["spec"] == {
        "holderIdentity": "pod-a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-02T14:00:00.123456Z",
        "renewTime": "2026-12-02T14:00:00.123456Z",
        "leaseTransitions": 0,
    }
    clock.t += 16  # not renewed for a whole lease: it must stop acting
    assert not a.holds()


def test_a_renewed_lease_is_never_taken_over() -> None:
    api, clock = FakeCluster(), Clock()
    a, b = candidate(api, "pod-a", clock), candidate(api, "pod-b", clock)
    assert a.try_acquire_or_renew()
    for _ in range(20):  # a minute: A renews every 3 s, B tries as often
        clock.t += 3
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert stored(api)["spec"]["holderIdentity"] == "pod-a"
    assert stored(api)["spec"]["leaseTransitions"] == 0


def test_a_lease_left_alone_for_a_whole_duration_is_taken_over() -> None:
    api, clock = FakeCluster(), Clock()
    a, b = candidate(api, "pod-a", clock), candidate(api, "pod-b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # B first sees the record now
    clock.t += 14.9
    assert not b.try_acquire_or_renew()  # unchanged, but not yet for a whole duration
    clock.t += 0.2
    assert b.try_acquire_or_renew()
    spec = stored(api)["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("pod-b", 1)
    # A comes back: the record changed (B's), so A waits a whole duration before anything.
    assert not a.try_acquire_or_renew()


def test_the_times_written_in_the_lease_are_never_compared_with_ours() -> None:
    # A holder whose clock is hours behind keeps renewing: its renewTime looks ancient, but the
    # record changes at every renewal, so no other candidate takes it over.
    api, clock = FakeCluster(), Clock()
    b = candidate(api, "pod-b", clock)
    for i in range(10):
        api.put(
            "leases",
            {"metadata": {"name": NAME, "namespace": NS},
             "spec": {"holderIdentity": "pod-skewed", "leaseDurationSeconds": 15,
                      "renewTime": f"2001-01-01T00:00:{i:02d}.000000Z"}},
            NS,
        )  # fmt: skip
        assert not b.try_acquire_or_renew()
        clock.t += 10


def test_two_candidates_racing_for_an_expired_lease_make_one_leader() -> None:
    api, clock = FakeCluster(), Clock()
    a, b, c = (candidate(api, n, clock) for n in ("pod-a", "pod-b", "pod-c"))
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.t += 20
    # B and C both judge it expired from the same record; B writes first, C's write is planned
    # from the old resourceVersion and conflicts.
    original = api.get_object

    def stale_get(**kw: Any) -> Any:
        return snapshot if kw.get("plural") == "leases" else original(**kw)

    snapshot = original(group="coordination.k8s.io", version="v1", plural="leases", name=NAME,
                        namespace=NS)  # fmt: skip
    assert b.try_acquire_or_renew()
    api.get_object = stale_get  # type: ignore[method-assign]
    assert not c.try_acquire_or_renew()
    assert stored(api)["spec"]["holderIdentity"] == "pod-b"


def test_a_released_lease_is_free_and_an_odd_one_waits_a_duration() -> None:
    # client-go releases a lease by emptying holderIdentity: free at once.
    api, clock = FakeCluster(), Clock()
    api.put("leases", {"metadata": {"name": NAME, "namespace": NS},
                       "spec": {"holderIdentity": "", "leaseDurationSeconds": 15}}, NS)  # fmt: skip
    b = candidate(api, "pod-b", clock)
    assert b.try_acquire_or_renew()
    assert stored(api)["spec"]["holderIdentity"] == "pod-b"
    # A holder with a renewTime that means nothing: held, until unchanged for a duration.
    api2 = FakeCluster()
    odd = {"holderIdentity": "pod-x", "renewTime": "garbage"}
    api2.put("leases", {"metadata": {"name": NAME, "namespace": NS}, "spec": odd}, NS)
    c = candidate(api2, "pod-c", clock)
    assert not c.try_acquire_or_renew()
    clock.t += 15.1
    assert c.try_acquire_or_renew()
    assert api2.store[("leases", NS, NAME)]["spec"]["leaseTransitions"] == 1


def test_a_holder_too_long_to_read_is_someone_else_and_never_quoted() -> None:
    api, clock = FakeCluster(), Clock()
    huge = {"holderIdentity": "h" * (1 << 20), "renewTime": "[" * 200_000}
    api.put("leases", {"metadata": {"name": NAME, "namespace": NS}, "spec": huge}, NS)
    c = candidate(api, "pod-c", clock)
    assert not c.try_acquire_or_renew()  # held: by someone whose name cannot be read
    assert c.seen_holder == UNREADABLE_HOLDER
    clock.t += 15.1  # unchanged for a lease duration: expired, as any other
    assert c.try_acquire_or_renew()
    assert stored(api)["spec"]["holderIdentity"] == "pod-c"


def test_two_candidates_over_http_make_one_leader(emu: Any, tmp_path: Any) -> None:
    # The real client against the emulator: the Lease is a namespaced built-in resource (served
    # with no CRD, as by every API server since 1.14), its
    # create and resourceVersion-checked replace go through the kube adapter as any other.
    from reconciler.kube import connect

    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    api = connect(emu.kubeconfig(tmp_path / "kubeconfig"), timeout=5)
    clock = Clock()
    a, b = candidate(api, "pod-a", clock), candidate(api, "pod-b", clock)  # type: ignore[arg-type]
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.t += 16
    assert b.try_acquire_or_renew()
    lease = emu.get_object("coordination.k8s.io", "v1", "leases", NAME, NS)
    assert lease["spec"]["holderIdentity"] == "pod-b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_a_leader_stops_acting_at_the_renew_deadline_before_anyone_may_take_over() -> None:
    api, clock = FakeCluster(), Clock()
    a, b = candidate(api, "pod-a", clock), candidate(api, "pod-b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.t += 10.5  # renewals failed for 10.5 s: past client-go's renew deadline of 10 s
    assert not a.holds(within=10.0)
    assert a.holds()  # within the duration: but the leader must already have stopped
    assert not b.try_acquire_or_renew()  # and nobody else acts for 4.5 s more
    clock.t += 5  # 15.5 s: a longer "within" is capped at the lease duration
    assert not a.holds(within=60.0)


def test_release_hands_the_lease_over_at_once_and_never_releases_anothers() -> None:
    api, clock = FakeCluster(), Clock()
    a, b = candidate(api, "pod-a", clock), candidate(api, "pod-b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert not a.holds()
    spec = stored(api)["spec"]
    assert "holderIdentity" not in spec
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert b.try_acquire_or_renew()  # no wait: the record has no holder
    assert stored(api)["spec"]["holderIdentity"] == "pod-b"
    assert stored(api)["spec"]["leaseTransitions"] == 1
    assert not a.release()  # pod-b holds it now: A writes nothing
    assert stored(api)["spec"]["holderIdentity"] == "pod-b"
