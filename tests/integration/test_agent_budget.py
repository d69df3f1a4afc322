"""The node agents' fleet budget (issue 33, item 5), from outside: node agents run as
subprocesses with their own node's token against the API-server emulator holding deploy/'s RBAC
(enforced per request) and admission policy (cel-python), each on a simulated host whose
``sriov-manage`` is slowed down by a wrapper that logs when each call starts and ends. With
``spec.rollout.maxParallel: 2`` and four nodes changed by one desired-state change, the host
changes (the calls' intervals) never overlap more than two at a time, and every node converges.

Expected values are the budget's definition (at most maxParallel nodes change their hosts at
once) and the Lease rules of client-go's leaderelection that reconciler/apply/lease.py follows
(a holder's slot is taken over only after it was seen unrenewed for a lease duration, 15 s by
default; a released slot has no holder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_cluster import AgentNode, agent_node, policed_emulator
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import run_vgpuctl
from tests.watch_agent import Watch, vgpus, wait_for

LEASES = ("coordination.k8s.io", "v1", "leases")
NAMESPACE = "vgpuctl-system"
NODES = ("node-a", "node-b", "node-c", "node-d")
#: How long each slowed sriov-manage call takes (long enough for the runs to overlap).
SLOW = 1.5
#: The seed's layout: SR-IOV on, four 4 GB vGPUs.
LAYOUT = """\
        - address: "0000:08:00.0"
          model: NVIDIA A2
          sriov: enabled
          vgpus:
            "0000:08:00.4": NVIDIA A2-4A
            "0000:08:00.5": NVIDIA A2-4Q
            "0000:08:00.6": NVIDIA A2-4A
            "0000:08:00.7": NVIDIA A2-4Q
"""
#: SR-IOV off, as a fresh simulated A2 is: nothing to change on the host.
IDLE = """\
        - address: "0000:08:00.0"
          model: NVIDIA A2
          sriov: disabled
"""


def desired(nodes: tuple[str, ...], layout: str, *, max_parallel: int | None) -> str:
    rollout = f"  rollout:\n    maxParallel: {max_parallel}\n" if max_parallel else ""
    entries = "".join(f"    {n}:\n      gpus:\n{layout}" for n in nodes)
    return (
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        f"metadata:\n  name: fleet\nspec:\n{rollout}  nodes:\n{entries}"
    )


@pytest.fixture
def cluster() -> Iterator[ApiServerEmulator]:
    with policed_emulator() as emu:
        emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield emu


def slowed(tmp_path: Path, emu: ApiServerEmulator, name: str, calls: Path) -> AgentNode:
    """``name``'s simulated host and agent; its sriov-manage takes :data:`SLOW` seconds and
    logs ``start|end <node> <unix time>`` to ``calls``."""
    node = agent_node(tmp_path, emu, node=name, token_node=name)
    calls.touch()
    real = node.dir / "bin" / "sriov-manage"
    wrapper = node.dir / "bin" / "slow-sriov-manage"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "start {name} $(date +%s.%N)" >> "{calls}"\n'
        f"sleep {SLOW}\n"
        f'"{real}" "$@"\nrc=$?\n'
        f'echo "end {name} $(date +%s.%N)" >> "{calls}"\n'
        "exit $rc\n"
    )
    wrapper.chmod(0o755)
    return node


def slow_flags(node: AgentNode) -> list[str]:
    return [*node.flags, "--sriov-manage", str(node.dir / "bin" / "slow-sriov-manage")]


def intervals(calls: Path) -> dict[str, list[tuple[float, float]]]:
    """Each node's sriov-manage calls, (start, end)."""
    started: dict[str, float] = {}
    out: dict[str, list[tuple[float, float]]] = {}
    for line in calls.read_text().splitlines():
        what, node, when = line.split()
        if what == "start":
            started[node] = float(when)
        else:
            out.setdefault(node, []).append((started.pop(node), float(when)))
    assert started == {}, f"calls that never ended: {started}"
    return out


def most_at_once(spans: dict[str, list[tuple[float, float]]]) -> int:
    """The most nodes whose calls overlap at one moment."""
    edges = sorted(
        (t, step) for calls in spans.values() for s, e in calls for t, step in ((s, 1), (e, -1))
    )  # an end sorts before a start at the same moment
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def slots(emu: ApiServerEmulator) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o["spec"]
        for o in emu.objects(*LEASES, namespace=NAMESPACE)
        if o["metadata"]["name"].startswith("vgpuctl-rollout-")
    }


def vgpu_count(node: AgentNode) -> int:
    return len(vgpus(node))


def test_four_watch_agents_change_at_most_two_hosts_at_once(
    tmp_path: Path, cluster: ApiServerEmulator
) -> None:
    calls = tmp_path / "calls.log"
    nodes = [slowed(tmp_path, cluster, name, calls) for name in NODES]
    state = tmp_path / "desired"
    state.mkdir()
    target = state / "fleet.yaml"
    target.write_text(desired(NODES, IDLE, max_parallel=2))
    watches: list[Watch] = []
    try:
        for node in nodes:
            watches.append(Watch(node, state, "--sriov-manage", slow_flags(node)[-1]))
        # Nothing to change on the hosts: each agent writes its objects, taking no slot.
        for watch in watches:
            wait_for(watch.ready, "every agent converged on the idle state", timeout=60)
        assert slots(cluster) == {}
        # One change for the whole fleet.
        target.write_text(desired(NODES, LAYOUT, max_parallel=2))
        waiting_seen = {"readyz": False, "metric": False}

        def converged() -> bool:
            for watch in watches:
                _, body = watch.get("/readyz")
                if "waiting for a rollout slot (2 of 2 held by: node-" in body:
                    waiting_seen["readyz"] = True
                if watch.metric("vgpuctl_rollout_slot_waiting") == 1:
                    waiting_seen["metric"] = True
            return all(vgpu_count(n) == 4 for n in nodes) and all(
                "converged" in w.get("/readyz")[1] for w in watches
            )

        wait_for(converged, "all four hosts converged", timeout=120)
    finally:
        codes = [w.stop() for w in watches]
    assert codes == [0] * len(watches)
    spans = intervals(calls)
    assert sorted(spans) == sorted(NODES)  # every host changed
    # Never more than the budget at once, and the budget used: two at a time, not one.
    assert most_at_once(spans) == 2, spans
    waits = [
        line["msg"]
        for w in watches
        for line in w.logs()
        if str(line.get("msg", "")).startswith("waiting for a rollout slot (2 of 2 held by: node-")
    ]
    assert waits, "no agent said it waited for a rollout slot"
    assert waiting_seen == {"readyz": True, "metric": True}
    # The slots the fleet used, released: held by nobody.
    held = slots(cluster)
    assert set(held) == {"vgpuctl-rollout-0", "vgpuctl-rollout-1"}
    assert [spec.get("holderIdentity", "") for spec in held.values()] == ["", ""]


def apply(
    node: AgentNode, path: Path, *extra: str, slow: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    flags = slow_flags(node) if slow else node.flags
    return run_vgpuctl("apply", path, "--yes", *flags, *extra, timeout=timeout)


def without_cluster(flags: list[str]) -> list[str]:
    cut = flags.index("--kubeconfig")
    return flags[:cut] + flags[cut + 2 :]


def held_slot(emu: ApiServerEmulator, name: str, holder: str) -> None:
    """``name`` held by ``holder``, renewed just now (as a live agent elsewhere would)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    emu.seed(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
    )


def test_apply_waits_for_a_slot_and_gives_up_with_its_own_exit_code(
    tmp_path: Path, cluster: ApiServerEmulator
) -> None:
    calls = tmp_path / "calls.log"
    node = slowed(tmp_path, cluster, "node-a", calls)
    path = tmp_path / "fleet.yaml"
    path.write_text(desired(("node-a",), LAYOUT, max_parallel=1))
    held_slot(cluster, "vgpuctl-rollout-0", "node-z")
    before = cluster.get_object(*LEASES, "vgpuctl-rollout-0", NAMESPACE)
    started = time.monotonic()
    res = apply(node, path, "--slot-timeout", "3")
    assert res.returncode == 75, res.stderr
    assert time.monotonic() - started >= 3
    assert "Waiting for a rollout slot (1 of 1 held by: node-z)" in res.stderr
    assert "no rollout slot became free within 3 s (1 of 1 held by: node-z)" in res.stderr
    # Nothing changed: not the host, not the slot.
    assert not calls.read_text()
    assert vgpu_count(node) == 0
    assert cluster.get_object(*LEASES, "vgpuctl-rollout-0", NAMESPACE) == before


def test_a_crashed_holders_slot_is_taken_over_after_the_lease_duration(
    tmp_path: Path, cluster: ApiServerEmulator
) -> None:
    calls = tmp_path / "calls.log"
    first = slowed(tmp_path, cluster, "node-a", calls)
    second = slowed(tmp_path, cluster, "node-b", calls)
    path = tmp_path / "fleet.yaml"
    path.write_text(desired(("node-a", "node-b"), LAYOUT, max_parallel=1))
    # node-a's apply hangs in sriov-manage, holding the one slot, and is killed (no release).
    assert run_vgpuctl("sim", "fail", first.dir, "--sriov", "hang").returncode == 0
    crashed = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "apply", str(path), "--yes", *first.flags],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "crashed.log").open("w"),
        start_new_session=True,  # its hung sriov-manage is killed with it
    )
    try:
        wait_for(
            lambda: slots(cluster).get("vgpuctl-rollout-0", {}).get("holderIdentity") == "node-a",
            f"node-a holding the slot; {tmp_path / 'crashed.log'}",
            timeout=30,
        )
    finally:
        os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(timeout=10)
    started = time.monotonic()
    res = apply(second, path, "--slot-timeout", "60")
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert "Waiting for a rollout slot (1 of 1 held by: node-a)" in res.stderr
    assert "Converged" in res.stdout
    assert vgpu_count(second) == 4
    # Taken over only once seen unrenewed for the lease duration (15 s) on node-b's clock.
    assert took >= 15
    slot = slots(cluster)["vgpuctl-rollout-0"]
    assert slot.get("holderIdentity", "") == ""  # node-b released it when done
    assert slot["leaseTransitions"] == 1  # node-a's, then node-b's


def test_a_node_with_nothing_to_change_on_its_host_takes_no_slot(
    tmp_path: Path, cluster: ApiServerEmulator
) -> None:
    calls = tmp_path / "calls.log"
    node = slowed(tmp_path, cluster, "node-a", calls)
    path = tmp_path / "fleet.yaml"
    # The host already has the layout (applied node-locally); the cluster has none of its
    # objects yet: the plan is cluster writes alone.
    local = tmp_path / "local.yaml"
    local.write_text(desired(("node-a",), LAYOUT, max_parallel=None))
    ok = run_vgpuctl("apply", local, "--yes", *without_cluster(node.flags))
    assert ok.returncode == 0, ok.stderr
    assert vgpu_count(node) == 4
    path.write_text(desired(("node-a",), LAYOUT, max_parallel=1))
    held_slot(cluster, "vgpuctl-rollout-0", "node-z")
    before = cluster.get_object(*LEASES, "vgpuctl-rollout-0", NAMESPACE)
    res = apply(node, path, "--slot-timeout", "2")
    assert res.returncode == 0, res.stderr
    assert "Converged" in res.stdout
    assert "rollout slot" not in res.stderr
    assert cluster.get_object(*LEASES, "vgpuctl-rollout-0", NAMESPACE) == before
    assert cluster.get_object("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates", "node-a")


def test_without_a_cluster_there_is_no_budget(tmp_path: Path, cluster: ApiServerEmulator) -> None:
    calls = tmp_path / "calls.log"
    node = slowed(tmp_path, cluster, "node-a", calls)
    path = tmp_path / "fleet.yaml"
    path.write_text(desired(("node-a",), LAYOUT, max_parallel=1))
    held_slot(cluster, "vgpuctl-rollout-0", "node-z")
    # The simulated host alone (no --kubeconfig): it applies at once.
    res = run_vgpuctl(
        "apply", path, "--yes", *without_cluster(slow_flags(node)), "--slot-timeout", "1"
    )
    assert res.returncode == 0, res.stderr
    assert "Converged" in res.stdout
    assert vgpu_count(node) == 4


def test_sigterm_ends_apply_and_releases_its_slot(
    tmp_path: Path, cluster: ApiServerEmulator
) -> None:
    calls = tmp_path / "calls.log"
    node = slowed(tmp_path, cluster, "node-a", calls)
    path = tmp_path / "fleet.yaml"
    path.write_text(desired(("node-a",), LAYOUT, max_parallel=1))
    assert run_vgpuctl("sim", "fail", node.dir, "--sriov", "hang").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "apply", str(path), "--yes", *slow_flags(node)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # In the host phase: its sriov-manage call started (and hangs).
        wait_for(lambda: calls.read_text().startswith("start node-a"), "the host phase", 30)
        assert slots(cluster)["vgpuctl-rollout-0"]["holderIdentity"] == "node-a"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # what is left of the hung sriov-manage
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated: stopping (the node lock and any rollout slot are released)" in err
    # Released on the way out: the next node need not wait out the lease.
    assert slots(cluster)["vgpuctl-rollout-0"].get("holderIdentity", "") == "", err
