"""Delegate mode across a fleet (issue 33): ``apply --delegate harvester`` changes several nodes
at once under a rollout policy (``--max-parallel``, ``--canary``, ``--max-failed-nodes``, or the
desired state's ``spec.rollout``), against the API-server emulator with one double of
pcidevices-controller per node (``tests/harvester_node.py`` ``harvester_fleet``).

Concurrency is read from the emulator's request log, never from the clock: a node's writes
span from its first JSON patch to its last (the SR-IOV enable, then its four VFs' enables,
each waited for); two nodes changed side by side have overlapping spans, one after the other
disjoint ones.

A node is made to fail the way a host can make it: its controller's ``enableVGPU`` write of
``current_vgpu_type`` is refused (``refuse_enable``, tests/doubles/pcidevices.py), so the
controller retries and never reports the vGPU, and vgpuctl's wait for it times out.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.pcidevices import vm
from tests.harvester_node import VFS, Fleet, harvester_fleet, in_flight_at_once
from tests.watch_agent import Watch, wait_for

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)

#: The seed's four vGPUs as the simulated A2 reports their types (its type ids: A2-4A 751,
#: A2-4Q 746).
SEED_TYPES = {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}


@pytest.fixture
def fleet4(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Fleet]:
    with harvester_fleet(emu, tmp_path, ["node-a", "node-b", "node-c", "node-d"]) as fleet:
        yield fleet


@pytest.fixture
def fleet3(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Fleet]:
    with harvester_fleet(emu, tmp_path, ["node-a", "node-b", "node-c"]) as fleet:
        yield fleet


def _spans(fleet: Fleet) -> list[tuple[int, int]]:
    spans = []
    for node in fleet.nodes:
        writes = fleet.writes(node)
        assert writes, f"{node} was not written"
        spans.append((writes[0], writes[-1]))
    return spans


def _failing(fleet: Fleet, *nodes: str) -> None:
    for node in nodes:
        fleet.nodes[node].ctl.refuse_enable = errno.EIO


def test_nodes_change_side_by_side_at_most_max_parallel_at_once(
    fleet4: Fleet, tmp_path: Path
) -> None:
    desired = fleet4.desired(tmp_path / "fleet.yaml")
    res = fleet4.run("apply", desired, "--yes", "--max-parallel", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    for node, cluster in fleet4.nodes.items():
        assert cluster.types() == SEED_TYPES, node
    # Each node's steps: its SR-IOV enable and four VF enables, one patch each.
    assert [len(fleet4.writes(n)) for n in fleet4.nodes] == [5, 5, 5, 5]
    # Two nodes at a time, never three: some spans overlap, no three share a moment.
    assert in_flight_at_once(_spans(fleet4)) == 2
    # A node's lines come together, never interleaved with another node's.
    lines = [line for line in res.stderr.splitlines() if line.startswith(("node ", "  "))]
    heads = [line for line in lines if line.startswith("node ")]
    assert sorted(heads) == [f"node node-{x}, round 1:" for x in "abcd"], res.stderr


def test_one_at_a_time_the_nodes_follow_each_other_in_node_order(
    fleet3: Fleet, tmp_path: Path
) -> None:
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    res = fleet3.run("apply", desired, "--yes", "--max-parallel", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    a, b, c = _spans(fleet3)  # node-a's, node-b's, node-c's
    assert a[1] < b[0] and b[1] < c[0]


def test_a_failed_canary_stops_the_rollout_before_another_node_starts(
    fleet3: Fleet, tmp_path: Path
) -> None:
    _failing(fleet3, "node-a")
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    res = fleet3.run(
        "apply", desired, "--yes", "--canary", "1", "--max-parallel", "3", "--timeout", "2"
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert fleet3.writes("node-a")
    assert fleet3.writes("node-b") == [] and fleet3.writes("node-c") == []
    assert "Rollout stopped: the canary node node-a: node-a failed." in res.stderr
    assert "Not started (2): node-b, node-c." in res.stderr
    assert fleet3.nodes["node-b"].types() == {} and fleet3.nodes["node-c"].types() == {}


def test_past_max_failed_nodes_no_new_node_starts(fleet4: Fleet, tmp_path: Path) -> None:
    _failing(fleet4, "node-a", "node-b")
    desired = fleet4.desired(tmp_path / "fleet.yaml")
    res = fleet4.run(
        "apply",
        desired,
        "--yes",
        "--max-parallel",
        "1",
        "--max-failed-nodes",
        "1",
        "--timeout",
        "2",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    # One failure is tolerated (node-b starts after node-a failed); the second stops the rest.
    assert fleet4.writes("node-a") and fleet4.writes("node-b")
    assert fleet4.writes("node-c") == [] and fleet4.writes("node-d") == []
    assert "Rollout stopped: 2 nodes failed, more than --max-failed-nodes 1." in res.stderr
    assert "Not started (2): node-c, node-d." in res.stderr
    assert "Failed nodes (2): node-a, node-b." in res.stderr


def test_spec_rollout_paces_the_apply_and_a_flag_given_wins(fleet3: Fleet, tmp_path: Path) -> None:
    _failing(fleet3, "node-a")
    desired = fleet3.desired(tmp_path / "fleet.yaml", rollout={"canary": 1, "maxParallel": 3})
    res = fleet3.run("apply", desired, "--yes", "--timeout", "2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Not started (2): node-b, node-c." in res.stderr
    assert fleet3.writes("node-b") == [] and fleet3.writes("node-c") == []
    # The command line overrides the file's canary: node-a fails again (the controller still
    # refuses), and past it the other two change, side by side.
    # (A longer wait here: node-b and node-c must converge, and the double's informers follow
    # the API server by watch, which a loaded machine slows.)
    res = fleet3.run(
        "apply", desired, "--yes", "--timeout", "4", "--canary", "0", "--max-failed-nodes", "1"
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Not started" not in res.stderr
    assert fleet3.nodes["node-b"].types() == SEED_TYPES
    assert fleet3.nodes["node-c"].types() == SEED_TYPES
    b, c = fleet3.writes("node-b"), fleet3.writes("node-c")
    assert in_flight_at_once([(b[0], b[-1]), (c[0], c[-1])]) == 2


def test_a_node_a_vm_blocks_is_no_failure_and_holds_nothing_up(
    fleet3: Fleet, tmp_path: Path
) -> None:
    seed = fleet3.desired(tmp_path / "seed.yaml")
    res = fleet3.run("apply", seed, "--yes", "--max-parallel", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    # A running VM on node-a holds its first VF's 4A vGPU.
    held = "node-a-000008004"
    fleet3.emu.seed(vm("win11", "default", hostdevices={"nvidia.com/NVIDIA_A2-4A": [held]}))
    # Every node: the first VF 4Q (node-a: blocked by the VM), the second 4A (free everywhere).
    changed = fleet3.desired(
        tmp_path / "changed.yaml",
        {
            VFS[0]: "NVIDIA A2-4Q",
            VFS[1]: "NVIDIA A2-4A",
            VFS[2]: "NVIDIA A2-4A",
            VFS[3]: "NVIDIA A2-4Q",
        },
    )
    before = {n: len(fleet3.writes(n)) for n in fleet3.nodes}
    res = fleet3.run("apply", changed, "--yes", "--canary", "1", "--max-parallel", "1")
    # The canary, node-a, ends blocked (exit 2 as any blocked run): not a failure, so the
    # others are started and change.
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Not started" not in res.stderr and "Rollout stopped" not in res.stderr
    assert fleet3.nodes["node-a"].types() == {**SEED_TYPES, VFS[1]: "751"}
    for node in ("node-b", "node-c"):
        assert fleet3.nodes[node].types() == {**SEED_TYPES, VFS[0]: "746", VFS[1]: "751"}
        assert len(fleet3.writes(node)) > before[node]


@dataclass
class _Replica:
    flags: list[str]
    dir: Path


def test_the_delegate_watch_follows_spec_rollout(fleet3: Fleet, tmp_path: Path) -> None:
    _failing(fleet3, "node-a")
    desired = tmp_path / "desired"
    desired.mkdir()
    fleet3.desired(desired / "fleet.yaml", rollout={"canary": 1, "maxParallel": 3})
    home = tmp_path / "replica"
    home.mkdir()
    watch = Watch(
        _Replica(["--kubeconfig", str(fleet3.kubeconfig)], home),
        desired,
        "--delegate",
        "harvester",
        "--lease-namespace",
        "default",
        "--timeout",
        "2",
        "--qps",
        "1000",
        "--burst",
        "1000",
    )
    try:
        failed = watch.wait_log(
            lambda d: str(d.get("msg", "")).startswith("reconcile failed"), "a failure", 120
        )
        # The canary failed: the other two nodes were not started.
        assert "node-a" in str(failed["msg"]), failed
        assert fleet3.writes("node-a")
        assert fleet3.writes("node-b") == [] and fleet3.writes("node-c") == []
        # The host lets the canary's vGPUs be made: a retry converges it, then the others.
        fleet3.nodes["node-a"].ctl.refuse_enable = None
        wait_for(
            lambda: all(c.types() == SEED_TYPES for c in fleet3.nodes.values()),
            "every node converged",
            180,
        )
    finally:
        watch.stop()


def test_a_watch_asked_to_stop_starts_no_other_node(fleet4: Fleet, tmp_path: Path) -> None:
    for cluster in fleet4.nodes.values():
        cluster.ctl.informer_lag = 1.0  # each step waits a second or more for the controller
    desired = tmp_path / "desired"
    desired.mkdir()
    fleet4.desired(desired / "fleet.yaml", rollout={"maxParallel": 2})
    home = tmp_path / "replica"
    home.mkdir()
    watch = Watch(
        _Replica(["--kubeconfig", str(fleet4.kubeconfig)], home),
        desired,
        "--delegate",
        "harvester",
        "--lease-namespace",
        "default",
        "--qps",
        "1000",
        "--burst",
        "1000",
    )
    try:
        wait_for(lambda: bool(fleet4.writes("node-a")), "node-a's first write", 60)
    finally:
        assert watch.stop() == 0
    # The two nodes under way stopped before their next write (the guard every worker asks);
    # the other two were never started.
    assert fleet4.writes("node-c") == [] and fleet4.writes("node-d") == []
    messages = [str(d.get("msg", "")) for d in watch.logs()]
    assert any(m.startswith("stopped between two steps") for m in messages), messages
