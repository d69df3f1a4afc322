"""The pace of a delegate rollout (issue 33): client-go's token bucket in front of the cluster
API (``apply/throttle.py``), and the rollout policy's layers (``model.desired.Rollout``,
``engine.delegate.pace``). Time is a fake clock that only sleeping moves."""

from __future__ import annotations

import threading

import pytest

from reconciler.apply.throttle import DEFAULT_BURST, DEFAULT_QPS, RateLimitedApi, TokenBucket
from reconciler.engine.delegate import Pace, pace
from reconciler.model.desired import Rollout


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_kube_controller_managers_defaults() -> None:
    # k8s.io/kubernetes pkg/controller/apis/config/v1alpha1/defaults.go:
    # obj.Generic.ClientConnection.QPS = 20.0, Burst = 30.
    assert (DEFAULT_QPS, DEFAULT_BURST) == (20.0, 30)


def test_a_burst_then_qps_a_second() -> None:
    clock = FakeClock()
    bucket = TokenBucket(5.0, 10, clock=clock, sleep=clock.sleep)
    times = []
    for _ in range(30):
        bucket.take()
        times.append(round(clock.now, 6))
    # The first 10 at once (the burst), then one every 1/5 s: the 11th at 0.2 s, the 30th
    # at 20 × 0.2 = 4 s.
    assert times[:10] == [0.0] * 10
    assert times[10:] == [round(0.2 * k, 6) for k in range(1, 21)]
    # Over any second after the burst, at most 5 requests.
    late = [t for t in times if t > 0]
    assert max(sum(s < t <= s + 1.0 for t in late) for s in late) == 5


def test_an_idle_bucket_refills_to_its_burst_not_beyond() -> None:
    clock = FakeClock()
    bucket = TokenBucket(5.0, 10, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        bucket.take()
    clock.now += 60.0  # a minute idle: 300 tokens' worth, but only 10 are kept
    waits = [bucket.take() for _ in range(11)]
    assert waits[:10] == [0.0] * 10
    assert waits[10] == pytest.approx(0.2)


def test_workers_share_one_bucket() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, 1, clock=clock, sleep=lambda s: None)
    waits: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            w = bucket.take()
            with lock:
                waits.append(w)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The clock stands still (sleep does not move it): each of the 20 reservations is due
    # 1/2 s after the one before, whichever worker took it.
    assert sorted(waits) == [0.5 * k for k in range(20)]


class _Api:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_object(self, **kw: object) -> None:
        self.calls.append(str(kw["name"]))


def test_every_request_takes_a_token() -> None:
    clock = FakeClock()
    api = _Api()
    limited = RateLimitedApi(api, TokenBucket(1.0, 1, clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    for name in "abc":
        limited.get_object(group="g", version="v", plural="p", name=name)
    assert api.calls == ["a", "b", "c"]
    assert clock.now == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("qps", "burst"), [(0.0, 10), (-1.0, 10), (5.0, 0)], ids=["zero", "negative", "no-burst"]
)
def test_a_bucket_that_could_never_serve_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(qps, burst)


def test_a_flag_given_wins_over_spec_rollout_which_wins_over_the_default() -> None:
    spec = Rollout(max_parallel=3, canary=1, location="fleet.yaml:5:3")
    flags = Rollout(canary=0, max_failed_nodes=2)
    assert flags.over(spec) == Rollout(
        max_parallel=3, canary=0, max_failed_nodes=2, location="fleet.yaml:5:3"
    )
    assert flags.over(None) == flags
    # Not given anywhere: the defaults.
    assert pace(Rollout().over(None), 40) == Pace(parallel=10, canary=0, max_failed_nodes=0)


@pytest.mark.parametrize(
    ("nodes", "parallel"), [(1, 1), (3, 1), (4, 1), (5, 2), (40, 10), (1000, 250)]
)
def test_by_default_a_quarter_of_the_nodes_change_at_once(nodes: int, parallel: int) -> None:
    # A Deployment's rolling update: maxUnavailable 25 % by default, rounded up, at least 1.
    assert pace(None, nodes).parallel == parallel
