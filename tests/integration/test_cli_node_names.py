"""Nodes that are not there (issue 34, item 3), through the CLI as a user runs it.

With a cluster, a node that node groups may select must be a Node of it: ``--node node-cc``
(a typo for node-c) is admitted by the glob ``node-*``, and was planned as that group's node
on node-c's host, whose own entry in the file says something else. Without a cluster,
``--labels`` stands for the node's labels. ``plan --observed cluster`` names a node of the
files the cluster has no Node for as that, not as one vgpuctl has not reconciled yet.

Expected outputs are written by hand from the desired states below.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client

from reconciler.model.cluster import GROUP, VERSION
from tests import oracle
from tests.api_servers import Served, create_ignoring_conflict, harvester_cluster
from tests.cluster_node import ClusterNode, cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import make_sim, run_vgpuctl

HEADER = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: lab}\n"

#: Every A2 of a node-* node gets four A2-4Q, but node-c's own entry gives it two A2-8Q.
FLEET = (
    HEADER
    + """spec:
  nodeGroups:
    - name: workers
      selector:
        names: ["node-*"]
      gpus:
        - match: {model: A2}
          sriov: enabled
          profiles: {A2-4Q: 4}
  nodes:
    node-c:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          profiles: {A2-8Q: 2}
"""
)

#: Nodes labelled pool=vdi get eight A2-2Q on their A2 at 08:00.0.
BY_LABELS = (
    HEADER
    + """spec:
  nodeGroups:
    - name: vdi
      selector:
        labels: {example.com/pool: vdi}
      gpus:
        - match: {address: "0000:08:00.0"}
          sriov: enabled
          profiles: {A2-2Q: 8}
"""
)


def _write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _nodes(emu: ApiServerEmulator, *names: str) -> None:
    for name in names:
        emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def _node_requests(emu: ApiServerEmulator) -> list[tuple[str, str | None]]:
    return [(r.verb, r.name) for r in emu.requests if r.resource == "nodes"]


@contextmanager
def _cluster_nodes(served: Served, *names: str) -> Iterator[None]:
    """Nodes ``names`` in the cluster while the block runs (the real server's outlive a test)."""
    core = client.CoreV1Api(served.api)
    for name in names:
        create_ignoring_conflict(core.create_node, {"metadata": {"name": name}})
    try:
        yield
    finally:
        for name in names:
            core.delete_node(name)


def _host(tmp_path: Path, served: Served, name: str) -> ClusterNode:
    """A host with one A2 at 08:00.0 whose vgpuctl is told ``--node name``."""
    sim = make_sim(tmp_path / f"host-{name}", ["A2@0000:08:00.0"], node=name)
    node = ClusterNode(sim.dir, name)
    node.kubeconfig = served.kubeconfig_path
    node.kubelet_dir = tmp_path / f"kubelet-{name}"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def test_a_mistyped_node_a_glob_admits_is_an_error_naming_the_close_node(
    tmp_path: Path, api_server: Served
) -> None:
    """node-c's host, its agent told --node node-cc: nothing is planned, nothing written."""
    harvester_cluster(api_server)
    node = _host(tmp_path, api_server, "node-cc")
    fleet = _write(tmp_path, FLEET)
    before = oracle.snapshot(node.dir / "sys")
    with _cluster_nodes(api_server, "node-a", "node-b", "node-c"):
        for command in (["plan", fleet], ["apply", fleet, "--yes"]):
            res = node.run(*command)
            assert res.returncode == 1, res.stdout + res.stderr
            assert res.stderr == (
                "error: no Node named 'node-cc' in the cluster; did you mean 'node-c'? (node "
                "groups select among the cluster's Nodes: pass --node NAME or set NODE_NAME)\n"
            )
            assert res.stdout == ""
        # No close name: the error says only that.
        far = _host(tmp_path, api_server, "gpu-zz")
        res = far.run("plan", _write(tmp_path, FLEET.replace('"node-*"', '"*"'), "all.yaml"))
    assert res.returncode == 1
    assert "error: no Node named 'gpu-zz' in the cluster (node groups select" in res.stderr
    assert oracle.snapshot(node.dir / "sys") == before
    listed = api_server.custom.list_cluster_custom_object(GROUP, VERSION, "sriovgpudevices")
    assert listed["items"] == []


def test_a_node_of_the_cluster_that_a_glob_selects_is_planned_after_one_get(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """node-b is a Node: the group's four A2-4Q are planned. A node's own entry is planned as
    written, and reads no Node (no group has a say on it)."""
    _nodes(emu, "node-a", "node-b", "node-c")
    fleet = _write(tmp_path, FLEET)
    emu.requests.clear()
    res = cluster_node(tmp_path, emu, "node-b").ok("plan", fleet)
    assert _vgpus(res.stdout) == ["NVIDIA A2-4Q"] * 4
    assert f"Note: node group 'workers' ({fleet}:10:11) configures GPU 0000:08:00.0" in res.stdout
    assert _node_requests(emu) == [("get", "node-b")]
    emu.requests.clear()
    res = cluster_node(tmp_path, emu, "node-c").ok("plan", fleet)
    assert _vgpus(res.stdout) == ["NVIDIA A2-8Q"] * 2
    assert "node group" not in res.stdout
    assert _node_requests(emu) == []


def _vgpus(plan: str) -> list[str]:
    """The profiles of the vGPUs a plan's text creates."""
    return [line.split()[3] + " " + line.split()[4] for line in plan.splitlines()
            if line.startswith("    + vgpu ")]  # fmt: skip


def test_labels_stand_for_the_clusters_without_one(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2@0000:08:00.0"], node="vdi-1")
    fleet = _write(tmp_path, BY_LABELS)
    before = oracle.snapshot(sim.dir / "sys")
    res = sim.ok("plan", fleet, "--labels", "example.com/pool=vdi,zone=a")
    assert "Plan: 9 to create, 0 to change, 0 to remove, 0 blocked." in res.stdout
    res = sim.run("plan", fleet, "--labels", "example.com/pool=db")
    assert res.returncode == 1
    assert "node 'vdi-1' is not in" in res.stderr
    assert "no node group selects it (1 in all)" in res.stderr
    res = sim.run("plan", fleet, "--labels", "pool")
    assert (res.returncode, res.stderr) == (1, "error: --labels: 'pool' is not KEY=VALUE\n")
    sim.ok("apply", fleet, "--labels", "example.com/pool=vdi", "--yes")
    expected = {
        "spec": {
            "nodes": {
                "vdi-1": {
                    "gpus": [
                        {"address": "0000:08:00.0", "sriov": "enabled", "profiles": {"A2-2Q": 8}}
                    ]
                }
            }
        }
    }
    assert oracle.judge(sim.dir / "sys", expected, "vdi-1", before=before) == []


def test_labels_with_a_cluster_or_a_saved_plan_are_usage_errors(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    _nodes(emu, "vdi-1")
    node = cluster_node(tmp_path, emu, "vdi-1")
    fleet = _write(tmp_path, BY_LABELS)
    for command in (["plan", fleet], ["apply", fleet, "--yes"]):
        res = node.run(*command, "--labels", "example.com/pool=vdi")
        assert (res.returncode, res.stderr) == (
            1,
            "error: --labels stands for a node's labels where there is no cluster; with a "
            "cluster, its Node's labels decide (label the Node instead)\n",
        )
    sim = make_sim(tmp_path / "host", ["A2@0000:08:00.0"], node="vdi-2")
    sim.ok("plan", fleet, "--labels", "example.com/pool=vdi", "--out", tmp_path / "plan.json")
    res = sim.run("apply", tmp_path / "plan.json", "--labels", "example.com/pool=vdi", "--yes")
    assert (res.returncode, res.stderr) == (
        1,
        "error: --labels goes with a desired state: a saved plan carries its GPUs\n",
    )


def test_a_cluster_plan_says_which_nodes_of_the_files_the_cluster_has_not(
    tmp_path: Path, api_server: Served
) -> None:
    """node-cc (a typo) and spare-9 are no Nodes; node-c is one, vgpuctl has not reconciled
    it. With node groups (the Nodes listed for them) and without (listed for the errors)."""
    harvester_cluster(api_server)
    own = (
        HEADER
        + "spec:\n  nodes:\n"
        + "".join(
            f"    {name}:\n      gpus:\n"
            '        - {address: "0000:08:00.0", sriov: enabled, profiles: {A2-4Q: 4}}\n'
            for name in ("node-cc", "node-c", "spare-9")
        )
    )
    grouped = own.replace(
        "spec:\n",
        'spec:\n  nodeGroups:\n    - name: none\n      selector: {names: ["cpu-*"]}\n'
        "      gpus: [{match: {model: A2}, sriov: disabled}]\n",
    )
    with _cluster_nodes(api_server, "node-a", "node-b", "node-c"):
        docs = [
            run_vgpuctl(
                "plan",
                fleet,
                "--observed",
                "cluster",
                "-o",
                "json",
                "--kubeconfig",
                api_server.kubeconfig_path,
            )
            for fleet in (_write(tmp_path, own, "own.yaml"), _write(tmp_path, grouped, "g.yaml"))
        ]
    for res in docs:
        assert res.returncode == 1, res.stdout + res.stderr
        doc = json.loads(res.stdout)
        assert doc["errors"] == {
            "node-c": [
                "node node-c has no VGPUNodeState: vgpuctl has not reconciled it yet, so the "
                "cluster does not say what its host has (run vgpuctl apply or watch on it)"
            ],
            "node-cc": [
                "no Node named 'node-cc' in the cluster; did you mean 'node-c'? (the desired "
                "state names it: a mistyped name, or a node not joined yet)"
            ],
            "spare-9": [
                "no Node named 'spare-9' in the cluster (the desired state names it: a "
                "mistyped name, or a node not joined yet)"
            ],
        }
        assert doc["summary"]["nodes"] == 3
