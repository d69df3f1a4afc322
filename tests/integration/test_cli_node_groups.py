"""Node groups through the CLI, as a user runs it: ``validate --explain``, a node-local
plan/apply on a simulated host, a saved plan, ``plan --observed cluster`` against the API-server
emulator with labelled Nodes, and the node agent reading its own Node's labels.

Convergence is judged by the independent oracle (``tests/oracle.py``) against the layout each
group gives, written out here by hand as a node's own entry would say it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests import oracle, rbac
from tests.cluster_node import SRIOV, VGPUS, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import make_sim, run_vgpuctl

HEADER = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: lab}\n"

#: Two groups: every A2 of a "gpu-*" node gets four A2-4Q; nodes labelled pool=vdi get
#: eight A2-2Q on the A2 at 09:00.0 (and node n-special has an entry of its own).
FLEET = (
    HEADER
    + """spec:
  nodeGroups:
    - name: a2-workers
      selector:
        names: ["gpu-*"]
      gpus:
        - match: {model: A2}
          sriov: enabled
          profiles: {A2-4Q: 4}
    - name: vdi
      selector:
        labels: {example.com/pool: vdi}
      gpus:
        - match: {address: "0000:09:00.0"}
          sriov: enabled
          profiles: {A2-2Q: 8}
  nodes:
    n-special:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {0: A2-16Q}
"""
)


def _write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _as_listed(node: str, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """A desired state naming ``gpus`` under ``node``'s own entry, for the oracle."""
    return {"spec": {"nodes": {node: {"gpus": gpus}}}}


def test_validate_explain_output(tmp_path: Path) -> None:
    fleet = _write(tmp_path, FLEET)
    res = run_vgpuctl("validate", "fleet.yaml", "--explain", "gpu-3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        "fleet.yaml: valid (1 node, 1 GPU, 1 vGPU; 2 node groups with 2 GPU entries)\n"
        "Node gpu-3 (no labels given):\n"
        "  node group 'a2-workers' (fleet.yaml:6:7) selects it (names gpu-*)\n"
        "    GPUs matching model 'NVIDIA A2' (fleet.yaml:10:11): SR-IOV enabled; "
        "NVIDIA A2-4Q × 4\n"
        "  node group 'vdi' (fleet.yaml:13:7) may select it: its labels "
        "(example.com/pool=vdi) decide; pass --labels to say them\n"
        "  GPUs no entry matches are left alone; which GPUs an entry matches is known when "
        "the node is planned (--inventory: the node's GPUs, from 'vgpuctl status -o json')\n"
    )
    assert fleet.exists()
    res = run_vgpuctl("validate", "fleet.yaml", "--explain", "n-special", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1:] == [
        "Node n-special (no labels given):",
        "  configured by its own entry spec.nodes.n-special (fleet.yaml:21:5); node groups "
        "do not apply to it",
        "    GPU 0000:08:00.0 (fleet.yaml:23:11): SR-IOV enabled; VF 0 NVIDIA A2-16Q",
        "  node group 'vdi' (fleet.yaml:13:7) may select it (its labels decide): replaced by "
        "the node's own entry",
    ]


def test_validate_explain_reports_a_certain_conflict_for_the_node(tmp_path: Path) -> None:
    clash = FLEET.replace('match: {address: "0000:09:00.0"}', "match: {model: NVIDIA A2}")
    _write(tmp_path, clash)
    # Different selectors: the file is valid; a node both select cannot be planned.
    res = run_vgpuctl("validate", "fleet.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run_vgpuctl(
        "validate", "fleet.yaml", "--explain", "gpu-3", "--labels", "example.com/pool=vdi",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1
    assert (
        "  error: node groups 'a2-workers' (fleet.yaml:10:11) and 'vdi' (fleet.yaml:17:11) "
        "give the GPUs matching model 'NVIDIA A2' different layouts: planning this node fails\n"
    ) in res.stdout
    # Another node, not labelled: only a2-workers selects it.
    res = run_vgpuctl("validate", "fleet.yaml", "--explain", "gpu-3", "--labels", "", cwd=tmp_path)
    assert res.returncode == 0
    assert res.stdout.splitlines()[1] == "Node gpu-3 (no labels):"
    assert "does not select it: labels not present: example.com/pool=vdi" in res.stdout


def test_bad_labels_and_labels_without_explain_are_usage_errors(tmp_path: Path) -> None:
    _write(tmp_path, FLEET)
    res = run_vgpuctl("validate", "fleet.yaml", "--labels", "a=b", cwd=tmp_path)
    assert res.returncode == 1 and "--labels goes with --explain NODE" in res.stderr
    res = run_vgpuctl("validate", "fleet.yaml", "--explain", "x", "--labels", "nokey", cwd=tmp_path)
    assert res.returncode == 1 and "'nokey' is not KEY=VALUE" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_node_local_plan_and_apply_configure_the_gpus_a_group_matches(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2@0000:08:00.0", "A2@0000:09:00.0"], node="gpu-3")
    fleet = _write(tmp_path, FLEET.replace("labels: {example.com/pool: vdi}", "names: [vdi-*]"))
    before = oracle.snapshot(sim.dir / "sys")
    plan = sim.ok("plan", fleet, "--out", tmp_path / "plan.json")
    assert "Plan: 10 to create, 0 to change, 0 to remove, 0 blocked." in plan.stdout
    assert (
        f"Note: node group 'a2-workers' ({fleet}:10:11) configures GPUs 0000:08:00.0, "
        "0000:09:00.0\n"
    ) in plan.stdout
    # The saved plan carries the desired GPUs as planned: the group's entry at each address.
    saved = json.loads((tmp_path / "plan.json").read_text())
    gpus = saved["desiredState"]["spec"]["nodes"]["gpu-3"]["gpus"]
    assert [(g["address"], g["profiles"]) for g in gpus] == [
        ("0000:08:00.0", {"NVIDIA A2-4Q": 4}),
        ("0000:09:00.0", {"NVIDIA A2-4Q": 4}),
    ]
    sim.ok("apply", tmp_path / "plan.json", "--yes")
    expected = _as_listed(
        "gpu-3",
        [
            {"address": a, "sriov": "enabled", "profiles": {"A2-4Q": 4}}
            for a in ("0000:08:00.0", "0000:09:00.0")
        ],
    )
    assert oracle.judge(sim.dir / "sys", expected, "gpu-3", before=before) == []
    again = sim.ok("plan", fleet, "--detailed-exitcode")
    assert "No changes." in again.stdout


def test_a_node_no_group_selects_is_named_in_the_error(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2@0000:08:00.0"], node="cpu-1")
    res = sim.run(
        "plan", _write(tmp_path, FLEET.replace("labels: {example.com/pool: vdi}", "names: [vdi-*]"))
    )
    assert res.returncode == 1
    assert "node 'cpu-1' is not in" in res.stderr
    assert "no node group selects it (2 in all)" in res.stderr


def test_label_groups_without_a_cluster_fail_closed(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2@0000:09:00.0"], node="vdi-1")
    res = sim.run("apply", _write(tmp_path, FLEET), "--yes")
    assert res.returncode == 1
    assert (
        "node group 'vdi' (" in res.stderr
        and "fleet.yaml:13:7) selects nodes by labels, and node vdi-1's labels are not known "
        "here: vgpuctl reads them from the cluster (pass --kubeconfig)"
        in res.stderr
    )
    assert oracle.snapshot(sim.dir / "sys").gpus["0000:09:00.0"].num_vfs == 0


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_the_node_agent_reads_its_labels_from_its_node(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu, "vdi-1")
    fleet = _write(
        tmp_path,
        FLEET.replace('match: {address: "0000:09:00.0"}', 'match: {address: "0000:08:00.0"}'),
    )
    # Not labelled yet: no group selects vdi-1.
    emu.seed(_node("vdi-1", {"kubernetes.io/hostname": "vdi-1"}))
    emu.requests.clear()
    res = node.run("plan", fleet)
    assert res.returncode == 1 and "no node group selects it" in res.stderr
    assert [(r.verb, r.resource, r.name) for r in emu.requests if r.resource == "nodes"] == [
        ("get", "nodes", "vdi-1")
    ]
    emu.seed(_node("vdi-1", {"example.com/pool": "vdi"}))
    node.ok("apply", fleet, "--yes")
    sriov = stored(emu, SRIOV, "vdi-1-000008000")
    assert sriov["spec"]["enabled"] is True
    assert sum(1 for o in emu.objects(*VGPUS) if o["spec"].get("vGPUTypeName")) == 8


def test_the_node_agent_reads_its_node_only_where_a_group_may_select_it(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Groups by names only: the agent of a node a glob admits gets its Node (one get: it must
    be a Node of the cluster: README, "Node groups"); one with its own entry reads none."""
    emu.seed(_node("gpu-1", {}))
    node = cluster_node(tmp_path, emu, "gpu-1")
    fleet = _write(tmp_path, FLEET.replace("labels: {example.com/pool: vdi}", "names: [vdi-*]"))
    emu.requests.clear()
    node.ok("plan", fleet)
    assert [(r.verb, r.name) for r in emu.requests if r.resource == "nodes"] == [("get", "gpu-1")]
    emu.requests.clear()
    cluster_node(tmp_path, emu, "n-special").ok("plan", fleet)
    assert not [r for r in emu.requests if r.resource == "nodes"]


def test_a_cluster_plan_expands_groups_over_the_clusters_nodes(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Three nodes of the cluster: gpu-1 (a2-workers), vdi-1 (labelled: vdi), gpu-2 (both,
    which give its A2 at 09:00.0 two layouts: it alone fails), and cpu-1, which nothing
    selects and which is not planned."""
    clash = FLEET.replace("profiles: {A2-2Q: 8}", "profiles: {A2-2Q: 8}\n").replace(
        'match: {address: "0000:09:00.0"}', "match: {model: A2}"
    )
    fleet = _write(tmp_path, clash)
    for name, labels in (
        ("gpu-1", {}),
        ("vdi-1", {"example.com/pool": "vdi"}),
        ("gpu-2", {"example.com/pool": "vdi"}),
        ("cpu-1", {}),
    ):
        emu.seed(_node(name, labels))
    # Each agent has run once (its VGPUNodeState is what a cluster plan reads): four A2-4Q.
    setup = (
        HEADER
        + "spec:\n  nodes:\n"
        + "".join(
            f"    {name}:\n      gpus:\n"
            '        - {address: "0000:08:00.0", sriov: enabled, profiles: {A2-4Q: 4}}\n'
            for name in ("gpu-1", "vdi-1", "gpu-2")
        )
    )
    for name in ("gpu-1", "vdi-1", "gpu-2"):
        cluster_node(tmp_path, emu, name).ok(
            "apply", _write(tmp_path, setup, "setup.yaml"), "--yes"
        )
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    emu.requests.clear()
    res = run_vgpuctl(
        "plan", fleet, "--observed", "cluster", "--kubeconfig", kubeconfig, "-o", "json",
        "--sysfs-root", tmp_path / "no-such-host",
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert [p["node"] for p in doc["plans"]] == ["gpu-1", "vdi-1"]
    # a2-workers: four A2-4Q, as it has; only its summary's desired-state fingerprint changes
    # (another file now configures it).
    (only,) = doc["plans"][0]["actions"]
    assert (only["kind"], only["target"]) == ("cr-update", "gpu-1")
    assert [c["path"] for c in only["changes"]] == ["status.desiredFingerprint"]
    kinds = [a["kind"] for a in doc["plans"][1]["actions"]]  # vdi: eight A2-2Q instead
    assert (kinds.count("vgpu-remove"), kinds.count("vgpu-create")) == (4, 8)
    # n-special has no VGPUNodeState (no agent ran there); gpu-2 gets two layouts.
    assert sorted(doc["errors"]) == ["gpu-2", "n-special"]
    assert any(
        "GPU 0000:08:00.0 of node gpu-2 is matched by node group 'vdi'" in line
        and "which give it different layouts" in line
        for line in doc["errors"]["gpu-2"]
    ), doc["errors"]["gpu-2"]
    nodes_requests = [(r.verb, r.resource) for r in emu.requests if r.resource == "nodes"]
    assert nodes_requests == [("list", "nodes")]

    # The example CI identity may make that plan (it lists Nodes), and no more.
    role = rbac.enforce(emu, rbac.CI_RBAC, rbac.CI_ACCOUNT)
    ci = emu.kubeconfig(tmp_path / "ci.kubeconfig", user=role.user)
    res = run_vgpuctl("plan", fleet, "--observed", "cluster", "--kubeconfig", ci)
    assert res.returncode == 1, res.stdout + res.stderr
    assert role.refused() == []


def test_validate_explain_names_the_entry_of_each_gpu_of_an_inventory(tmp_path: Path) -> None:
    """With the node's GPUs (``vgpuctl status -o json``, taken on it), each GPU is named with
    the entry that configures it, matched as planning matches: by model, by address, or none;
    two entries with two layouts for one GPU are an error (exit 1)."""
    sim = make_sim(
        tmp_path / "host", ["A2@0000:08:00.0", "A2@0000:09:00.0", "L40S@0000:41:00.0"], node="x"
    )
    (tmp_path / "inventory.json").write_text(sim.ok("status", "-o", "json").stdout)
    _write(tmp_path, FLEET)
    res = run_vgpuctl(
        "validate", "fleet.yaml", "--explain", "gpu-3", "--labels", "example.com/pool=vdi",
        "--inventory", "inventory.json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines()[-4:] == [
        "  its GPUs (3):",
        "    GPU 0000:08:00.0 (NVIDIA A2): node group 'a2-workers' (fleet.yaml:10:11): "
        "SR-IOV enabled; NVIDIA A2-4Q × 4",
        "    GPU 0000:09:00.0 (NVIDIA A2): error: node groups 'a2-workers' (fleet.yaml:10:11) "
        "and 'vdi' (fleet.yaml:17:11) give it different layouts",
        "    GPU 0000:41:00.0 (NVIDIA L40S): no entry matches it: left alone",
    ]
    # Without the label, only a2-workers: both A2s are its, the L40S is left alone.
    res = run_vgpuctl(
        "validate", "fleet.yaml", "--explain", "gpu-3", "--labels", "",
        "--inventory", "inventory.json", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-3:-1] == [
        "    GPU 0000:08:00.0 (NVIDIA A2): node group 'a2-workers' (fleet.yaml:10:11): "
        "SR-IOV enabled; NVIDIA A2-4Q × 4",
        "    GPU 0000:09:00.0 (NVIDIA A2): node group 'a2-workers' (fleet.yaml:10:11): "
        "SR-IOV enabled; NVIDIA A2-4Q × 4",
    ]
    res = run_vgpuctl(
        "validate", "fleet.yaml", "--explain", "n-special", "--inventory", "inventory.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.stdout.splitlines()[-3:] == [
        "    GPU 0000:08:00.0 (NVIDIA A2): its own entry (fleet.yaml:23:11)",
        "    GPU 0000:09:00.0 (NVIDIA A2): not listed: left alone",
        "    GPU 0000:41:00.0 (NVIDIA L40S): not listed: left alone",
    ]


def test_an_inventory_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    _write(tmp_path, FLEET)
    (tmp_path / "bad.json").write_text('{"node": "x", "gpus": [{"address": 7}]}')
    (tmp_path / "text.json").write_text("not json")
    for name, words in (
        ("bad.json", "--inventory bad.json: not a vgpuctl inventory ('vgpuctl status -o json'): "),
        ("text.json", "--inventory text.json: not JSON: "),
        ("missing.json", "--inventory missing.json: cannot read: No such file or directory"),
    ):
        res = run_vgpuctl(
            "validate", "fleet.yaml", "--explain", "x", "--inventory", name, cwd=tmp_path
        )
        assert res.returncode == 1
        assert res.stderr.startswith("error: " + words), res.stderr
        assert "Traceback" not in res.stderr
