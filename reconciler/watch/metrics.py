"""The watch loop's Prometheus metrics, in a registry of their own.

A registry per loop (not prometheus_client's global one): nothing else in the process can add
to what ``/metrics`` shows, and tests can build as many loops as they like. Label values known
in advance are created at start, so a counter reads 0 instead of being absent until it happens
(an alert on ``increase(vgpuctl_errors_total[5m]) > 0`` needs the series to exist).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from reconciler.model import ActionKind

#: ``vgpuctl_reconciles_total{result}``.
RESULTS = ("converged", "blocked", "failed")
#: ``vgpuctl_errors_total{kind}``: what failed (see ``WatchLoop`` for the mapping).
ERROR_KINDS = (
    "validation",
    "observe",
    "plan",
    "apply",
    "lock",
    "cluster",
    "not_converged",
    "deviceplugin",
    "refused",
    "lease",
    "internal",
)
#: ``vgpuctl_drift_detected_total{source}``.
DRIFT_SOURCES = ("desired", "host", "cluster")
#: ``vgpuctl_rollout_nodes{state}`` (delegate mode): ``engine/rollout.py`` ``NodeState``.
ROLLOUT_STATES = ("done", "in_flight", "waiting", "blocked", "failed")
#: ``vgpuctl_rollout_node_results_total{result}`` (delegate mode): how a node's part of a
#: rollout ended (``engine/delegate.py`` ``Result``).
NODE_RESULTS = (
    "converged",
    "blocked",
    "failed",
    "unplannable",
    "controller-silent",
    "not-converged",
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class WatchMetrics:
    """Every metric ``vgpuctl watch`` exports. Thread-safe (prometheus_client's metrics are)."""

    def __init__(self, *, delegate: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "vgpuctl_reconciles_total",
            "Reconciles run, by result: converged, blocked (changes wait for a VM), failed.",
            ["result"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "vgpuctl_reconcile_duration_seconds",
            "Time of one reconcile: observe, plan, apply and verify.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.actions_applied = Counter(
            "vgpuctl_actions_applied_total",
            "Actions carried out (not the ones found already done), by kind.",
            ["kind"],
            registry=r,
        )
        self.blocked_actions = Gauge(
            "vgpuctl_blocked_actions",
            "Changes the last reconcile could not make because a VM uses the vGPU.",
            registry=r,
        )
        self.errors = Counter(
            "vgpuctl_errors_total",
            "Errors by kind: validation (desired state invalid), observe, plan, apply, lock "
            "(another apply held the node lock), cluster, not_converged, deviceplugin, refused "
            "(Harvester's pcidevices-controller runs, or may: nothing was changed), lease "
            "(delegate mode: the Lease could not be read or renewed), internal.",
            ["kind"],
            registry=r,
        )
        self.drift = Counter(
            "vgpuctl_drift_detected_total",
            "Changes noticed that called for a reconcile, by source: desired (the desired-state "
            "files), host (sysfs), cluster (our objects or the KubeVirt CR).",
            ["source"],
            registry=r,
        )
        self.last_success = Gauge(
            "vgpuctl_last_success_timestamp_seconds",
            "Unix time of the end of the last reconcile that did not fail.",
            registry=r,
        )
        self.converged = Gauge(
            "vgpuctl_converged",
            "1 when the last reconcile left the node matching the desired state, else 0.",
            registry=r,
        )
        self.desired_valid = Gauge(
            "vgpuctl_desired_state_valid",
            "1 when the desired-state files as they are now are valid, 0 when the last valid "
            "state is kept in force because they are not.",
            registry=r,
        )
        self.rescan_duration = Histogram(
            "vgpuctl_rescan_duration_seconds",
            "Time of one periodic rescan (fingerprints of the host, the cluster and the "
            "desired-state files), without the reconcile it may start.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        #: Delegate mode's watch only (``watch --delegate harvester``): its leadership.
        self.leader: Gauge | None = None
        if delegate:
            self.leader = Gauge(
                "vgpuctl_leader",
                "1 while this replica holds the Lease and acts, 0 while it stands by.",
                registry=r,
            )
            self.leader.set(0)
        #: Delegate mode's watch only: its current rollout (or its last one).
        self.rollout_nodes: Gauge | None = None
        self.node_results: Counter | None = None
        if delegate:
            self.rollout_nodes = Gauge(
                "vgpuctl_rollout_nodes",
                "The nodes of the current rollout (or of the last one) by state: done "
                "(matches the desired state), in_flight, waiting (not started yet, or not "
                "started at all when the rollout stopped), blocked (only steps a VM or a driver "
                "pod holds up remain), failed.",
                ["state"],
                registry=r,
            )
            self.node_results = Counter(
                "vgpuctl_rollout_node_results_total",
                "Nodes whose part of a rollout ended, by result: converged, blocked, failed (a "
                "step failed), unplannable, controller-silent (no VGPUDevices in time), "
                "not-converged (steps left after the last round).",
                ["result"],
                registry=r,
            )
            for state in ROLLOUT_STATES:
                self.rollout_nodes.labels(state=state).set(0)
            for result in NODE_RESULTS:
                self.node_results.labels(result=result)
        for result in RESULTS:
            self.reconciles.labels(result=result)
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        for source in DRIFT_SOURCES:
            self.drift.labels(source=source)
        for action in ActionKind:
            self.actions_applied.labels(kind=action.value)

    def exposition(self) -> bytes:
        """The text format ``/metrics`` serves."""
        return generate_latest(self.registry)
