"""The GitOps example's pull-request comment always arrives, and is one (issue 34, item 1).

Before: a node that could not be planned made ``vgpuctl plan`` exit 1, the step failed, and
the job stopped before posting, so the CAUTION callout made for reviewers was never seen; every
push added one more comment (``gh pr comment``); and a fleet's comment was over GitHub's limit
(65,536 characters), so it was refused. Here the example's own steps (tests/gitops_workflow.py:
its ``run:`` scripts in bash, as a runner runs them) plan against the API-server emulator (in
the test's process, or as ``vgpuctl sim cluster`` ships it, a process of its own) and post to a
fake GitHub API (tests/fake_github.py) that records the comments: the comment is posted
whatever the plan's exit code and the job fails after; a second push marks the comment
outdated, then updates that same comment; a 1,000-node first rollout on ``vgpuctl sim cluster``
fits the limit with every blocked step and every node's counts in it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.cluster_node import NODE_STATES, cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.fake_github import BOT, TOKEN, FakeGitHub, fake_github
from tests.gitops_workflow import gitops_repository, run_job
from tests.sim_cluster import Running, start_sim_cluster, stop_sim_cluster
from tests.simnode import run_vgpuctl

MARKER = "<!-- vgpuctl-plan -->"
SHA1 = "1111111111111111111111111111111111111111"
SHA2 = "2222222222222222222222222222222222222222"
HEAD = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: fleet}\nspec:\n  nodes:\n"  # noqa: E501


def _node(name: str, profiles: str = "{A2-4Q: 2}") -> str:
    return (
        f'    {name}:\n      gpus:\n        - address: "0000:08:00.0"\n'
        f"          sriov: enabled\n          profiles: {profiles}\n"
    )


def _values(emu_kubeconfig: Path, sha: str) -> dict[str, str]:
    return {
        "secrets.VGPUCTL_KUBECONFIG": emu_kubeconfig.read_text(),
        "github.token": TOKEN,
        "github.event.pull_request.number": "7",
        "github.event.pull_request.head.sha": sha,
        "github.repository": "acme/fleet",
        "github.run_id": "4242",
    }


def _push(
    repo: Path, kubeconfig: Path, github: FakeGitHub, sha: str
) -> tuple[Any, Any]:  # (supersede, plan) runs
    values = _values(kubeconfig, sha)
    supersede = run_job("supersede", repo, values, github_api=github.url)
    assert not supersede.failed, supersede.logs
    return supersede, run_job("plan", repo, values, github_api=github.url)


def test_a_plan_that_exits_1_still_yields_the_comment_then_the_job_fails(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    fleet = HEAD + _node("gpu-node-1") + _node("gpu-node-9")  # gpu-node-9: never reported
    cluster_node(tmp_path, emu, "gpu-node-1").ok("apply", _desired(tmp_path, fleet), "--yes")
    repo = gitops_repository(tmp_path / "repo", fleet.replace("{A2-4Q: 2}", "{A2-4Q: 3}", 1))
    kubeconfig = emu.kubeconfig(tmp_path / "ci.kubeconfig")
    with fake_github() as github:
        _, plan = _push(repo, kubeconfig, github, SHA1)
        (comment,) = github.comments
    assert plan.failed, plan.logs
    # The plan step failed (exit 1), after it the artifact and the comment steps ran.
    assert [code for _, code in plan.ran] == [1, 0], plan.logs
    assert [p.name for p in plan.artifacts] == ["plan.json"]
    body = comment["body"]
    assert comment["user"]["login"] == BOT
    assert body.startswith(f"{MARKER}\n<!-- commit: {SHA1} -->\n> [!CAUTION]\n")
    assert "> `vgpuctl plan` exited 1: the job fails; its plan is below" in body
    assert "> [!CAUTION]\n> Could not be planned: gpu-node-9.\n" in body
    assert "### Node gpu-node-9: cannot be planned" in body
    # The node that could be planned is there with its change, counted apart from its writes.
    assert "### Node gpu-node-1: 1 GPU step (1 to create) · " in body
    assert "[workflow run](https://github.example/acme/fleet/actions/runs/4242)" in body


def test_a_second_push_marks_then_updates_the_same_comment(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    fleet = HEAD + _node("gpu-node-1")
    cluster_node(tmp_path, emu, "gpu-node-1").ok("apply", _desired(tmp_path, fleet), "--yes")
    repo = gitops_repository(tmp_path / "repo", fleet.replace("{A2-4Q: 2}", "{A2-4Q: 3}"))
    kubeconfig = emu.kubeconfig(tmp_path / "ci.kubeconfig")
    with fake_github() as github:
        # Someone else's comment with the marker: not ours, left alone; then a long discussion,
        # so that ours is on the second page of the listing (100 a page).
        github.add(f"{MARKER}\nlooks like a plan", login="mallory")
        for i in range(120):
            github.add(f"comment {i}", login="alice")
        supersede, plan = _push(repo, kubeconfig, github, SHA1)
        assert not plan.failed, plan.logs
        assert len(github.comments) == 122
        ours = github.comments[121]
        first = ours["body"]
        assert first.startswith(f"{MARKER}\n<!-- commit: {SHA1} -->\n## vgpuctl plan\n")
        assert "1 to create" in first
        # The second push: the comment is marked outdated at once (the plan job may wait).
        (repo / "desired-state" / "fleet.yaml").write_text(
            fleet.replace("{A2-4Q: 2}", "{A2-4Q: 4}")
        )
        values = _values(kubeconfig, SHA2)
        supersede = run_job("supersede", repo, values, github_api=github.url)
        assert not supersede.failed, supersede.logs
        assert len(github.comments) == 122 and github.comments[121]["id"] == ours["id"]
        marked = ours["body"]
        assert marked.startswith(
            f"{MARKER}\n<!-- commit: {SHA1} -->\n> [!IMPORTANT]\n> **Outdated:** this plan is "
            f"of commit {SHA1[:12]}; commit {SHA2[:12]} has been pushed since"
        )
        assert first.split("\n", 2)[2] in marked  # the old plan, still there below
        # Then its plan replaces it: the same comment, no new one.
        plan = run_job("plan", repo, values, github_api=github.url)
        assert not plan.failed, plan.logs
        assert len(github.comments) == 122 and github.comments[121]["id"] == ours["id"]
        second = ours["body"]
        assert second.startswith(f"{MARKER}\n<!-- commit: {SHA2} -->\n## vgpuctl plan\n")
        assert "Outdated" not in second and "2 to create" in second
        assert github.comments[0]["body"] == f"{MARKER}\nlooks like a plan"
        creates = [r for r in github.requests if r[0] == "POST"]
        assert len(creates) == 1


def _desired(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"applied-{len(list(tmp_path.glob('applied-*')))}.yaml"
    path.write_text(text)
    return path


#: One A2 a node (docs/domain.md §1: 16 VFs), the first rollout of four 4Q vGPUs.
ROLLOUT = "{A2-4Q: 4}"
NODES = 1000
BLOCKED = ("node-100", "node-500", "node-999")
# The client is only partly typed: its untyped entry points are used as Any
new_client_from_config: Any = config.new_client_from_config
PLURALS = {
    "SRIOVGPUDevice": "sriovgpudevices",
    "VGPUDevice": "vgpudevices",
    "VGPUNodeState": "vgpunodestates",
}


def test_a_1000_node_first_rollout_fits_with_every_blocked_step_and_node_count(
    tmp_path: Path,
) -> None:
    """A thousand nodes of a running ``vgpuctl sim cluster`` whose agents have reported their A2
    (SR-IOV off, no vGPU yet), three of them already running two 4A and two 4Q vGPUs, their 4A
    ones in use by VMs (the rollout's 4Q there is blocked). The first node and the three are
    applied on their simulated hosts; the other nodes' objects are the first's, written through
    the API as their agents would have written them."""
    running = start_sim_cluster(tmp_path / "sim", "--nodes", str(NODES))
    try:
        _a_1000_node_first_rollout(tmp_path, running)
    finally:
        code, err = stop_sim_cluster(running)
    assert code == 0, err


def _a_1000_node_first_rollout(tmp_path: Path, running: Running) -> None:
    names = [f"node-{i}" for i in range(1, NODES + 1)]
    kubeconfig = running.kubeconfig

    def apply_on(name: str, desired: str) -> None:
        host = running.dir / "nodes" / name / "sys"
        res = run_vgpuctl(
            "apply", _desired(tmp_path, desired), "--yes", "--node", name,
            "--sysfs-root", host, "--kubeconfig", kubeconfig,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr

    template_node = names[0]
    apply_on(
        template_node,
        HEAD + _node(template_node, "{}").replace("sriov: enabled", "sriov: disabled"),
    )
    api = new_client_from_config(config_file=str(kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        listed = [
            item
            for group, version, plural in _resources()
            for item in custom.list_cluster_custom_object(group, version, plural)["items"]
        ]
        template = json.dumps([o for o in listed if template_node in json.dumps(o)])
        for name in names[1:]:
            if name in BLOCKED:
                continue
            # Each name its own: "node-1" is a prefix of "node-10" and of "node-100".
            text = re.sub(r"\bnode-1\b", name, template)
            for obj in json.loads(text):
                _strip(obj)
                group, version = obj["apiVersion"].split("/")
                plural = PLURALS[obj["kind"]]
                made = custom.create_cluster_custom_object(group, version, plural, obj)
                if obj.get("status"):
                    made["status"] = obj["status"]
                    custom.replace_cluster_custom_object_status(
                        group, version, plural, obj["metadata"]["name"], made
                    )
        for name in BLOCKED:
            apply_on(name, HEAD + _node(name, "{A2-4A: 2, A2-4Q: 2}"))
            group, version, plural = NODE_STATES
            state = custom.get_cluster_custom_object(group, version, plural, name)
            for vgpu in state["status"]["vgpus"]:
                if vgpu["profile"] == "NVIDIA A2-4A":
                    vgpu["inUse"] = True
            custom.replace_cluster_custom_object_status(group, version, plural, name, state)
    finally:
        api.close()
    fleet = HEAD + "".join(_node(name, ROLLOUT) for name in names)
    repo = gitops_repository(tmp_path / "repo", fleet)
    with fake_github() as github:
        _, plan = _push(repo, kubeconfig, github, SHA1)
        (comment,) = github.comments
    assert not plan.failed, plan.logs
    body = comment["body"]
    assert len(body) <= 65_536 and len(body.encode()) <= 61_000
    doc = json.loads((repo / "plan.json").read_text())
    # On each of the three nodes four steps are blocked: the removals of the two 4A vGPUs in
    # use, and the two 4Q creates that wait for their room (the A2's 16 GB is four 4 GB).
    assert doc["summary"]["nodes"] == NODES and doc["summary"]["blocked"] == 12
    rows = [line for line in body.splitlines() if line.startswith("| ⛔ |")]
    assert len(rows) == 12
    assert sum("**blocked: vgpu-remove " in row for row in rows) == 6
    assert sum("**blocked: vgpu-create " in row for row in rows) == 6
    for name in BLOCKED:
        assert f"### Node {name}: " in body
    # Every node's counts: a heading, or its name on the line of its counts.
    counted = set(re.findall(r"### Node (node-\d+): ", body))
    for line in body.splitlines():
        if line.startswith("- ") and " GPU step" in line and ": node-" in line:
            counted |= set(line.split(": ", 1)[1].split(", "))
    assert counted == set(names)
    # A rollout node: SR-IOV enable and four creates on the GPU; its cluster writes apart.
    assert "- 5 GPU steps (5 to create) · " in body
    assert "> [!NOTE]\n> Shortened to fit its size: left out " in body
    assert "The full plan: the JSON plan, artifact vgpuctl-plan of this workflow run." in body


def _resources() -> list[tuple[str, str, str]]:
    from tests.cluster_node import SRIOV, VGPUS

    return [SRIOV, VGPUS, NODE_STATES]


def _strip(obj: dict[str, Any]) -> None:
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        obj["metadata"].pop(key, None)


def test_a_plan_that_writes_nothing_still_yields_a_comment_saying_so(tmp_path: Path) -> None:
    """vgpuctl fails before any plan (the API server does not answer): the comment says the
    plan failed and where to read why, and the job fails."""
    repo = gitops_repository(tmp_path / "repo", HEAD + _node("gpu-node-1"))
    kubeconfig = tmp_path / "dead.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    with fake_github() as github:
        _, plan = _push(repo, kubeconfig, github, SHA1)
        (comment,) = github.comments
    assert plan.failed and [code for _, code in plan.ran][-1] == 0, plan.logs
    assert comment["body"].startswith(
        f"{MARKER}\n<!-- commit: {SHA1} -->\n> [!CAUTION]\n> `vgpuctl plan` exited 1: the job "
        "fails; it wrote no plan: the job's log says why.\n"
    )


def test_the_workflow_against_vgpuctl_sim_cluster(tmp_path: Path) -> None:
    """Issue 34's acceptance, as a new user tries it: ``vgpuctl sim cluster`` running as its own
    process, node-1 applied on its simulated host, then the example's steps on a pull request
    that changes node-1 and names node-9, which the cluster does not have: the plan exits 1,
    the comment arrives with the CAUTION for node-9 and node-1's change, and the job fails;
    the next push updates that same comment."""
    running = start_sim_cluster(tmp_path / "sim", "--nodes", "1")
    try:
        applied = HEAD + _node("node-1")
        host = running.dir / "nodes" / "node-1" / "sys"
        res = run_vgpuctl(
            "apply", _desired(tmp_path, applied), "--yes", "--node", "node-1",
            "--sysfs-root", host, "--kubeconfig", running.kubeconfig,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        fleet = HEAD + _node("node-1", "{A2-4Q: 3}") + _node("node-9")
        repo = gitops_repository(tmp_path / "repo", fleet)
        with fake_github() as github:
            _, plan = _push(repo, running.kubeconfig, github, SHA1)
            assert plan.failed, plan.logs
            assert [code for _, code in plan.ran] == [1, 0], plan.logs
            (comment,) = github.comments
            body = comment["body"]
            assert body.startswith(f"{MARKER}\n<!-- commit: {SHA1} -->\n> [!CAUTION]\n")
            assert "> [!CAUTION]\n> Could not be planned: node-9.\n" in body
            assert "no Node named 'node-9' in the cluster; did you mean 'node-1'?" in body
            assert "### Node node-1: 1 GPU step (1 to create) · " in body
            # The second push: the same comment, now of the new commit.
            (repo / "desired-state" / "fleet.yaml").write_text(
                HEAD + _node("node-1", "{A2-4Q: 4}") + _node("node-9")
            )
            _, plan = _push(repo, running.kubeconfig, github, SHA2)
            assert plan.failed, plan.logs
            assert len(github.comments) == 1 and github.comments[0]["id"] == comment["id"]
            second = github.comments[0]["body"]
            assert second.startswith(f"{MARKER}\n<!-- commit: {SHA2} -->\n")
            assert "### Node node-1: 2 GPU steps (2 to create) · " in second
            assert [r[0] for r in github.requests].count("POST") == 1
    finally:
        code, err = stop_sim_cluster(running)
    assert code == 0, err
