"""Recorded load (issue 12, item 6): every API request of a 50-node fleet's agents over an idle
minute, and of one ``plan --observed cluster`` of the fleet, recorded by the API-server emulator
with its sender and query string, and counted.

The fleet: 50 nodes, each the seed's node (one A2, four vGPUs, 16 VFs) as vgpuctl leaves it:
its SRIOVGPUDevice, 16 VGPUDevices and VGPUNodeState, written from a plan of the seed's desired
state on the seed's applied host (tests/cases/seed-already-applied). 850 objects in all.

Each agent is what a ``vgpuctl watch`` of a converged node does with the cluster, in process
(50 processes would not fit the suite's budget): one reconcile's reads (``observe_cluster``),
then :class:`~reconciler.watch.clusterwatch.ClusterWatch` following the cluster, asked for its
signature once a second as the watch loop's rescans do. Each agent has its own identity (a
bearer token), so every request is attributed to its node.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.kube import KubernetesApi, connect
from reconciler.kube.api import PAGE
from reconciler.model import CrCreate, Inventory
from reconciler.model.cluster import ClusterState, ConfiguredProfile
from reconciler.model.nodestate import stamped
from reconciler.observe.cluster import observe_cluster
from reconciler.plan import plan_node
from reconciler.watch.clusterwatch import ClusterWatch
from tests.cluster_node import kubevirt_cr, register_crds
from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator, Call
from tests.simnode import REPO, run_vgpuctl

NODES = [f"gpu-node-{i:02d}" for i in range(50)]
IDLE_S = 60.0
RESCAN_S = 1.0
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
APPLIED = REPO / "tests" / "cases" / "seed-already-applied" / "observed.json"


def fleet_file(tmp_path: Path) -> Path:
    """The seed's node's desired state for every node of the fleet, in one file."""
    text = SEED.read_text()
    head, _, body = text.partition("    harvester-kgd9c:\n")
    nodes = "".join(f"    {n}:\n{body}" for n in NODES)
    path = tmp_path / "fleet.yaml"
    path.write_text(head + nodes)
    return path


def written_objects() -> list[dict[str, object]]:
    """Every object vgpuctl leaves for the fleet, as the API server would hold them."""
    catalog = default_catalog()
    desired = load_desired([SEED], catalog=catalog).node("harvester-kgd9c")
    assert desired is not None
    raw = APPLIED.read_text()
    out = []
    for node in NODES:
        inventory = Inventory.from_json(json.loads(raw.replace("harvester-kgd9c", node)))
        plan = plan_node(
            replace(desired, name=node), inventory, catalog=catalog, cluster=ClusterState(node)
        )
        for action in plan.actions:
            if isinstance(action, CrCreate):
                body = action.object.to_json()
                body["status"] = stamped(body["status"], "2026-12-01T00:00:00Z")
                out.append(body)
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServerEmulator, Path]]:
    directory = tmp_path_factory.mktemp("fleet")
    with ApiServerEmulator() as emu:
        register_crds(emu)
        emu.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        kubevirt = kubevirt_cr()
        kubevirt["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] += [
            {"mdevNameSelector": p, "resourceName": "nvidia.com/" + p.replace(" ", "_"),
             "externalResourceProvider": True}
            for p in ("NVIDIA A2-4A", "NVIDIA A2-4Q")
        ]  # fmt: skip
        kubevirt["metadata"]["annotations"] = {
            "vgpu.reconciler.dev/mediated-devices": "NVIDIA A2-4A,NVIDIA A2-4Q"
        }
        emu.seed(kubevirt)
        for obj in written_objects():
            emu.seed(obj)
        yield emu, directory


def agent_identity(node: str) -> UserInfo:
    return UserInfo(f"system:serviceaccount:vgpuctl-system:vgpuctl:{node}")


def by_user(calls: list[Call], user: str) -> list[Call]:
    return [c for c in calls if c.user == user]


def test_fifty_idle_agents_make_no_request_in_a_minute(
    fleet: tuple[ApiServerEmulator, Path],
) -> None:
    emu, directory = fleet
    start = len(emu.calls)
    clients: list[KubernetesApi] = []
    agents: list[ClusterWatch] = []
    try:
        for node in NODES:
            kubeconfig = emu.kubeconfig(directory / f"{node}.kubeconfig", user=agent_identity(node))
            api = connect(kubeconfig, timeout=10.0)
            clients.append(api)
            state = observe_cluster(api, node=node)  # the reconcile that converged it
            assert len(state.vgpu_devices) == 16 and state.node_state is not None
            # Every other node shows A2-4A and A2-4Q configured.
            assert state.profiles_elsewhere == {
                ConfiguredProfile("NVIDIA A2-4A"),
                ConfiguredProfile("NVIDIA A2-4Q"),
            }
            agent = ClusterWatch(api, node=node)
            agent.start(wait=30.0)
            agents.append(agent)
        started = len(emu.calls)
        baselines = [a.signature() for a in agents]

        # The idle minute: a rescan a second on every node.
        deadline = time.monotonic() + IDLE_S
        rescans = 0
        while time.monotonic() < deadline:
            assert [a.signature() for a in agents] == baselines
            rescans += 1
            time.sleep(RESCAN_S)
        idle = emu.calls[started:]
    finally:
        for agent in agents:
            agent.stop()
        for api in clients:
            api.close()

    assert rescans >= 50
    # Not one request from any agent in the idle minute: no list, no get, no write.
    assert idle == [], Counter((c.user, c.request.verb, c.request.resource) for c in idle)

    # What each agent asked at start, and how: its reconcile's reads and its watches.
    for node in NODES:
        calls = by_user(emu.calls[start:started], agent_identity(node).username)
        counted = Counter((c.request.verb, c.request.resource) for c in calls)
        assert counted == {
            # observe_cluster, then ClusterWatch's list of the same collection.
            ("list", "sriovgpudevices"): 2,
            ("list", "vgpudevices"): 2,
            ("list", "vgpunodestates"): 2,
            ("list", "kubevirts"): 2,
            ("list", "virtualmachineinstances"): 1,
            ("watch", "sriovgpudevices"): 1,
            ("watch", "vgpudevices"): 1,
            ("watch", "vgpunodestates"): 1,
            ("watch", "kubevirts"): 1,
        }, node
        for c in calls:
            selector = c.query.get("labelSelector", "")
            if c.request.resource in ("sriovgpudevices", "vgpudevices"):
                # Never an unselected list or watch of Harvester's objects: this node's only.
                assert selector == f"nodename={node}", c
            if c.request.verb == "list":
                assert c.query.get("limit") == str(PAGE), c  # every list is paginated


def test_one_cluster_plan_of_the_fleet_costs_one_list_per_kind(
    fleet: tuple[ApiServerEmulator, Path],
) -> None:
    emu, directory = fleet
    planner = UserInfo("system:serviceaccount:ci:vgpuctl-plan")
    kubeconfig = emu.kubeconfig(directory / "ci.kubeconfig", user=planner)
    start = len(emu.calls)
    result = run_vgpuctl(
        "plan", fleet_file(directory), "--observed", "cluster", "--kubeconfig", kubeconfig,
        "--detailed-exitcode",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Cluster plan: 50 nodes, 0 with changes" in result.stdout
    calls = by_user(emu.calls[start:], planner.username)
    counted = Counter((c.request.verb, c.request.resource) for c in calls)
    # 800 VGPUDevices in pages of PAGE (2,000: one request); every other kind fits one page.
    # And one get each of what says whether Harvester's pcidevices-controller runs, by name.
    assert counted == {
        ("list", "sriovgpudevices"): 1,
        ("list", "vgpudevices"): -(-800 // PAGE),
        ("list", "vgpunodestates"): 1,
        ("list", "kubevirts"): 1,
        ("list", "virtualmachineinstances"): 1,
        ("get", "addons"): 1,
        ("get", "daemonsets"): 1,
        ("get", "validatingwebhookconfigurations"): 1,
    }
    pages = [c for c in calls if c.request.resource == "vgpudevices"]
    assert "continue" not in pages[0].query
    assert all(page.query.get("continue") for page in pages[1:])
