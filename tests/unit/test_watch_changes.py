"""The watch loop's change sources (host and cluster drift against a baseline) and its health
verdicts, each on its own with fake fingerprints and a fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reconciler.catalog import default_catalog
from reconciler.model import ClusterUnavailableError, DesiredNode
from reconciler.watch.changes import ClusterDrift, DesiredChange, DesiredFiles, HostDrift
from reconciler.watch.health import Health
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.source import DesiredSource


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


GROUPED = """apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {name: lab}
spec:
  nodeGroups:
    - name: vdi
      selector: {labels: {example.com/pool: vdi}}
      gpus:
        - match: {model: A2}
          sriov: enabled
          profiles: {A2-4Q: 4}
"""


class Labels:
    """The node's labels as the cluster has them (the test labels the node), each read
    counted; ``down`` makes the read fail as an unreachable API server does."""

    def __init__(self) -> None:
        self.value: dict[str, str] = {}
        self.reads = 0
        self.down = False

    def __call__(self) -> dict[str, str]:
        self.reads += 1
        if self.down:
            raise ClusterUnavailableError("cannot reach the Kubernetes API server")
        return dict(self.value)


def node_files(path: Path, labels: Labels | None) -> DesiredFiles[DesiredNode]:
    """Node vdi-1's desired state from ``path``, its labels read by ``labels`` (None: no
    cluster)."""
    return DesiredFiles.for_node(
        DesiredSource.at(path),
        node="vdi-1",
        catalog=default_catalog(),
        metrics=WatchMetrics(),
        events=lambda: None,
        labels=labels,
    )


def test_labelling_the_node_changes_its_desired_state(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(GROUPED)
    labels = Labels()
    files = node_files(tmp_path / "fleet.yaml", labels)
    assert files.check() is DesiredChange.FIRST
    assert files.current is not None and files.current.matched == ()  # not labelled: nothing
    assert files.check() is DesiredChange.NONE
    labels.value = {"example.com/pool": "vdi"}
    assert files.changed_unread()
    assert files.check() is DesiredChange.CHANGED
    assert [e.group for e in files.current.matched] == ["vdi"]
    assert files.check() is DesiredChange.NONE
    # An unreachable cluster keeps the desired state in force and reads again next time.
    labels.down = True
    assert files.check() is DesiredChange.NONE
    assert [e.group for e in files.current.matched] == ["vdi"]
    labels.down = False
    labels.value = {}
    assert files.check() is DesiredChange.CHANGED
    assert files.current.matched == ()


def test_without_label_groups_the_node_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(
        GROUPED.replace("labels: {example.com/pool: vdi}", 'names: ["vdi-*"]')
    )
    labels = Labels()
    files = node_files(tmp_path / "fleet.yaml", labels)
    assert files.check() is DesiredChange.FIRST
    assert files.check() is DesiredChange.NONE
    assert files.current is not None and [e.group for e in files.current.matched] == ["vdi"]
    assert labels.reads == 0


def test_label_groups_without_a_cluster_are_an_invalid_desired_state(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(GROUPED)
    files = node_files(tmp_path / "fleet.yaml", None)
    assert files.check() is DesiredChange.NONE
    assert files.current is None
    assert len(files.invalid) == 1
    assert "selects nodes by labels, and node vdi-1's labels are not known" in files.invalid[0]
