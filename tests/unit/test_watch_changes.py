"""The watch loop's change sources (host and cluster drift against a baseline) and its health
verdicts, each on its own with fake fingerprints and a fake clock."""

from __future__ import annotations

import logging

import pytest

from reconciler.model import ClusterUnavailableError, DesiredNode
from reconciler.watch.changes import ClusterDrift, HostDrift
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics


class Fingerprints:
    """A signature function whose answer the test sets (or makes fail)."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.down = False

    def __call__(self) -> str:
        if self.down:
            raise ClusterUnavailableError("cannot reach the Kubernetes API server")
        return self.value


def sample(metrics: WatchMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_host_drift_is_a_difference_from_the_adopted_baseline() -> None:
    metrics = WatchMetrics()
    host = Fingerprints("a")
    drift = HostDrift(host, metrics=metrics)
    assert drift.drifted()  # no baseline yet: anything is news
    drift.adopt(drift.take())
    assert drift.last == "a"
    assert not drift.drifted()
    host.value = "b"
    assert drift.drifted()
    assert drift.drifted()  # until a new baseline is adopted
    assert drift.last == "a"  # looking is not taking
    assert sample(metrics, "vgpuctl_drift_detected_total", source="host") == 3


def test_an_unreachable_cluster_is_no_drift_and_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = WatchMetrics()
    cluster = Fingerprints("rv1")
    drift = ClusterDrift(cluster, metrics=metrics)
    drift.adopt(drift.take())
    cluster.down = True
    with caplog.at_level(logging.INFO, logger="vgpuctl.watch"):
        assert not drift.drifted()
        assert not drift.drifted()
        assert drift.take() is None
        cluster.down = False
        assert not drift.drifted()
    assert sample(metrics, "vgpuctl_errors_total", kind="cluster") == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "cannot read our cluster objects: cannot reach the Kubernetes API server",
        "the cluster answers again",
    ]
    cluster.value = "rv2"
    assert drift.drifted()


def test_without_a_cluster_there_is_never_cluster_drift() -> None:
    drift = ClusterDrift(None, metrics=WatchMetrics())
    assert drift.take() is None
    assert not drift.drifted()


class Desired:
    current: DesiredNode | None = None
    invalid: tuple[str, ...] = ()


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_busy_worker_may_stay_silent_for_the_action_budget() -> None:
    clock = Clock()
    health = Health(desired=Desired(), stale_after=30.0, action_budget=480.0, clock=clock)
    assert health.alive().reason == "the watch loop is not running"
    with health.running():
        health.beat()
        clock.now += 31
        assert health.alive().reason == "stalled: no sign of life for 31 s (limit 30 s)"
        health.busy_since = clock.now
        assert health.alive().ok
        clock.now += 400  # silent for 431 s: one action may take that long
        assert health.alive().ok
        clock.now += 60
        assert health.alive().reason == "stalled: no sign of life for 491 s (limit 480 s)"
        health.beat()  # an action's outcome
        assert health.alive().ok
    assert not health.alive().ok


def test_readiness_follows_the_reconciles() -> None:
    desired = Desired()
    health = Health(desired=desired, stale_after=30.0, action_budget=480.0, clock=Clock())
    assert health.readiness().reason == "no desired state read yet"
    desired.invalid = ("desired.yaml:3:1: unknown key",)
    assert health.readiness().reason == "no valid desired state yet: desired.yaml:3:1: unknown key"
    desired.invalid = ()
    desired.current = DesiredNode("node-a")
    assert health.readiness().reason == "waiting for the first reconcile"
    health.failed("cannot reach the Kubernetes API server")
    assert health.readiness().reason == "not converged yet: cannot reach the Kubernetes API server"
    assert health.settled((), converged=True)  # news: the failure is over
    assert health.readiness().reason == "ready: converged"
    assert not health.settled((), converged=True)  # nothing new
    assert health.settled(("vgpu-remove x: held by a VM",), converged=False)
    assert health.readiness().reason == "ready: 1 change blocked: vgpu-remove x: held by a VM"
    health.failed("lock held")
    verdict = health.readiness()
    assert verdict.ok  # ready once settled, failing or not
    assert verdict.reason == "ready: the last reconcile failed: lock held"
