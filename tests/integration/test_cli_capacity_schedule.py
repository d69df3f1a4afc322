"""``vgpuctl capacity`` answering the scheduling question (issue 34, item 5), through the CLI
against the API-server emulator: ``--require`` with the profile names the desired state takes,
several requirements on one node at once (``--any-node``: each alone), a profile configured but
not advertised flagged, a vGPU held on the host without a pod not free, and ``--desired FILE``:
the capacity once a desired state has landed, read from the nodes' VGPUNodeStates, written by
a real ``apply`` on simulated A2 hosts. Every expected number is worked out by hand below."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_node import NODE_STATES, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import run_vgpuctl

Q, A, Q2 = "nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-4A", "nvidia.com/NVIDIA_A2-2Q"
HEADER = ["NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE"]


def node(name: str, allocatable: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "8", **allocatable}}}  # fmt: skip


def pod(name: str, node_name: str, asks: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "vms"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "image": "x", "resources": {"requests": asks, "limits": asks}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def vgpu_device(node_name: str, fn: int, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1", "kind": "VGPUDevice",
        "metadata": {"name": f"{node_name}-00000800{fn}", "labels": {"nodename": node_name}},
        "spec": {"address": f"0000:08:00.{fn}", "enabled": True, "nodeName": node_name,
                 "parentGPUDeviceAddress": "0000:08:00.0", "vGPUTypeName": profile},
        "status": {"configureVGPUTypeName": profile, "vGPUStatus": "vGPUConfigured",
                   "uuid": f"u{fn}"},
    }  # fmt: skip


def rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()]


@pytest.fixture
def two_nodes(emu: ApiServerEmulator, tmp_path: Path) -> Path:
    """node-a: two A2-4Q free, no A2-4A; node-b: one A2-4Q and one A2-4A free (each node's
    allocatable, no pod): one VM needing an A2-4Q and an A2-4A fits node-b only."""
    emu.seed(node("node-a", {Q: "2"}))
    emu.seed(node("node-b", {Q: "1", A: "1"}))
    return emu.kubeconfig(tmp_path / "kubeconfig")


def test_require_takes_the_profile_names_the_desired_state_takes(two_nodes: Path) -> None:
    """``A2-4Q`` and ``NVIDIA A2-4Q`` are the desired state's names of nvidia.com/NVIDIA_A2-4Q;
    the old code took the resource name only (exit 1, a usage error)."""
    for name in ("A2-4Q", "NVIDIA A2-4Q", Q):
        res = run_vgpuctl("capacity", "--kubeconfig", two_nodes, "--require", f"{name}=2")
        assert (res.returncode, res.stderr.strip()) == (
            0,
            f"node node-a has 2 {Q} free (needed 2)",
        ), name
    bad = run_vgpuctl("capacity", "--kubeconfig", two_nodes, "--require", "A2/4Q=1")
    assert bad.returncode == 1
    assert "'A2/4Q' is neither a vGPU profile name" in bad.stderr


def test_several_requirements_must_fit_on_one_node_at_once(two_nodes: Path) -> None:
    """An A2-4Q and an A2-4A together: node-b has both (node-a has no A2-4A). Two A2-4Q and an
    A2-4A: node-a is short of the A2-4A, node-b of one A2-4Q (each short by 1, each with 2 of
    them free): the first by name is named. The old code checked the last --require alone."""
    kc = two_nodes
    # (Resource names, which the old code took too: it answered for the last --require alone.)
    short = run_vgpuctl("capacity", "--kubeconfig", kc, "-o", "json", "--require", f"{Q}=2",
                        "--require", f"{A}=1")  # fmt: skip
    assert short.returncode == 2
    assert json.loads(short.stdout)["require"] == {
        "mode": "joint",
        "satisfied": False,
        "requirements": [
            {"resource": Q, "count": 2, "node": "node-a", "free": 2, "satisfied": True},
            {"resource": A, "count": 1, "node": "node-a", "free": 0, "satisfied": False},
        ],
        "messages": [
            f"no node has 2 {Q} and 1 {A} free at once: the best, node-a, has 2 {Q} and 0 {A} "
            f"(short by 1 {A})"
        ],
    }
    both = run_vgpuctl("capacity", "--kubeconfig", kc, "--require", "A2-4Q=1", "--require",
                       "A2-4A=1")  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert both.stderr.strip() == (
        f"node node-b has them all free at once: 1 {Q} (needed 1), 1 {A} (needed 1)"
    )
    # Each alone: two A2-4Q on node-a, an A2-4A on node-b.
    each = run_vgpuctl("capacity", "--kubeconfig", kc, "--any-node", "--require", "A2-4Q=2",
                       "--require", "A2-4A=1")  # fmt: skip
    assert each.returncode == 0, each.stderr
    assert each.stderr.splitlines() == [
        f"node node-a has 2 {Q} free (needed 2)",
        f"node node-b has 1 {A} free (needed 1)",
    ]
    # One resource named twice, in two spellings: three A2-4Q, which no node has.
    twice = run_vgpuctl("capacity", "--kubeconfig", kc, "--require", "A2-4Q=1", "--require",
                        f"{Q}=2")  # fmt: skip
    assert (twice.returncode, twice.stderr.strip()) == (
        2,
        f"no node has 3 {Q} free: the best, node-a, has 2 (short by 1)",
    )


def test_configured_but_not_allocatable_is_flagged(emu: ApiServerEmulator, tmp_path: Path) -> None:
    """node-c's VGPUDevices say two A2-4Q, its allocatable none (the device plugin has not
    registered the resource): nothing is free, and capacity says why."""
    emu.seed(node("node-c", {}))
    for fn in (4, 5):
        emu.seed(vgpu_device("node-c", fn, "NVIDIA A2-4Q"))
    kc = emu.kubeconfig(tmp_path / "kubeconfig")
    res = run_vgpuctl("capacity", "--kubeconfig", kc)
    assert res.returncode == 0, res.stderr
    assert rows(res.stdout) == [
        HEADER,
        ["node-c", Q, "2", "0", "0", "0", "0"],
        ["(cluster)", Q, "2", "0", "0", "0", "0"],
    ]
    warning = (
        f"node node-c: 2 {Q} configured but none allocatable: its device plugin has not "
        "registered it, so no pod can be given one"
    )
    assert res.stderr.splitlines() == [f"warning: {warning}"]
    doc = json.loads(run_vgpuctl("capacity", "--kubeconfig", kc, "-o", "json").stdout)
    assert doc["warnings"] == [warning]


def test_a_vgpu_held_on_the_host_without_a_pod_is_not_free(
    emu: ApiServerEmulator, tmp_path: Path
) -> None:
    """node-h's summary lists five A2-4Q, all advertised. In use: one by a QEMU no pod was
    allocated (``pid …``), one the agent could not attribute (``unknown: …``: counted, failing
    closed), one by vm1's launcher pod (the kubelet's allocation names it: that pod's request
    counts it already), one by a VM whose allocation is unknown (its pod's request, likewise).
    vm1's pod asks one. Free: 5 - 1 requested - 2 held = 2; the old code said 4."""
    emu.seed(node("node-h", {Q: "5"}))
    holders = [
        "pid 4242 (qemu-system-x86)",
        "unknown: cannot see the host's processes (PID namespace 4026532000)",
        "VM vms/vm1 (pod uid-1)",
        "VM vms/vm2 (allocation unknown)",
        None,
    ]
    vgpus = [
        {"gpu": "0000:08:00.0", "vf": f"0000:08:00.{4 + i}", "vfIndex": i,
         "profile": "NVIDIA A2-4Q", "uuid": f"uuid-{i}", "inUse": holder is not None,
         **({"holder": holder} if holder else {})}
        for i, holder in enumerate(holders)
    ]  # fmt: skip
    emu.seed({
        "apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "VGPUNodeState",
        "metadata": {"name": "node-h"}, "spec": {"nodeName": "node-h"},
        "status": {"vgpus": vgpus, "profiles": [
            {"name": "NVIDIA A2-4Q", "resourceName": Q, "wanted": 5, "vgpus": 5, "inUse": 4,
             "creatable": 0}]},
    })  # fmt: skip
    emu.seed(pod("vm1", "node-h", {Q: "1"}))
    kc = emu.kubeconfig(tmp_path / "kubeconfig")
    res = run_vgpuctl("capacity", "--kubeconfig", kc, "--require", f"{Q}=3")
    assert res.returncode == 2
    assert rows(res.stdout) == [
        HEADER,
        ["node-h", Q, "5", "5", "1", "2", "2"],
        ["(cluster)", Q, "5", "5", "1", "2", "2"],
    ]
    assert res.stderr.strip() == f"no node has 3 {Q} free: the best, node-h, has 2 (short by 1)"


FLEET = """\
apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {name: fleet}
spec:
  nodes:
    gpu-1:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          profiles: {GPU1}
    gpu-2:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          profiles: {GPU2}
"""


def fleet(path: Path, gpu1: str, gpu2: str) -> Path:
    path.write_text(FLEET.replace("{GPU1}", gpu1).replace("{GPU2}", gpu2))
    return path


def test_desired_answers_once_the_change_has_landed(emu: ApiServerEmulator, tmp_path: Path) -> None:
    """Two simulated A2 hosts applied by vgpuctl: gpu-1 two A2-4Q, gpu-2 one; both advertised.
    On gpu-1 a pod asks one, and a process no pod was allocated holds another (set in its
    VGPUNodeState as the agent records it). Now: gpu-1 free 2 - 1 - 1 = 0, gpu-2 free 1.

    The change: gpu-1 four A2-4Q (its two kept, the held one still held: free 4 - 1 - 1 = 2),
    gpu-2 two A2-2Q instead of its A2-4Q (the A2-4Q gone: no row; two A2-2Q free). Three
    A2-4Q on one node: not now (the best has 1), not after either (gpu-1 has 2); two A2-4Q and
    two A2-2Q, each alone, after: yes. Nothing is written."""
    for name in ("gpu-1", "gpu-2"):
        cluster_node(tmp_path, emu, name).ok(
            "apply", fleet(tmp_path / "now.yaml", "{A2-4Q: 2}", "{A2-4Q: 1}"), "--yes"
        )
    emu.seed(node("gpu-1", {Q: "2"}))
    emu.seed(node("gpu-2", {Q: "1"}))
    emu.seed(pod("vm1", "gpu-1", {Q: "1"}))
    state = stored(emu, NODE_STATES, "gpu-1")
    held = state["status"]["vgpus"][0]
    held["inUse"], held["holder"] = True, "pid 4242 (qemu-system-x86)"
    emu.seed(state)
    kc = emu.kubeconfig(tmp_path / "kubeconfig")

    now = run_vgpuctl("capacity", "--kubeconfig", kc, "--require", "A2-4Q=3")
    assert now.returncode == 2
    assert rows(now.stdout) == [
        HEADER,
        ["gpu-1", Q, "2", "2", "1", "1", "0"],
        ["gpu-2", Q, "1", "1", "0", "0", "1"],
        ["(cluster)", Q, "3", "3", "1", "1", "1"],
    ]

    change = fleet(tmp_path / "change.yaml", "{A2-4Q: 4}", "{A2-2Q: 2}")
    emu.requests.clear()
    after = run_vgpuctl("capacity", "--kubeconfig", kc, "--desired", change, "--require",
                        "A2-4Q=3")  # fmt: skip
    assert after.returncode == 2, after.stderr
    assert rows(after.stdout) == [
        HEADER,
        ["gpu-1", Q, "4", "4", "1", "1", "2"],
        ["gpu-2", Q2, "2", "2", "0", "0", "2"],
        ["(cluster)", Q2, "2", "2", "0", "0", "2"],
        ["(cluster)", Q, "4", "4", "1", "1", "2"],
    ]
    assert after.stderr.strip().endswith(
        f"no node has 3 {Q} free: the best, gpu-1, has 2 (short by 1)"
    )
    assert {r.verb for r in emu.requests} <= {"get", "list"}
    each = run_vgpuctl("capacity", "--kubeconfig", kc, "--desired", change, "--any-node",
                       "--require", "A2-4Q=2", "--require", "A2-2Q=2")  # fmt: skip
    assert each.returncode == 0, each.stderr
    assert each.stderr.splitlines()[-2:] == [
        f"node gpu-1 has 2 {Q} free (needed 2)",
        f"node gpu-2 has 2 {Q2} free (needed 2)",
    ]


def test_desired_names_a_node_it_cannot_plan(emu: ApiServerEmulator, tmp_path: Path) -> None:
    """gpu-2 has no VGPUNodeState (vgpuctl never ran there): the cluster does not say what its
    host has, so what it will have cannot be said: an error naming it, exit 1; gpu-1 is
    answered. Its pods ask four A2-4Q, the change leaves three: a warning (the change cannot
    land while they keep them). A desired state that cannot be read is said before the
    cluster is read."""
    cluster_node(tmp_path, emu, "gpu-1").ok(
        "apply", fleet(tmp_path / "now.yaml", "{A2-4Q: 4}", "{A2-4Q: 1}"), "--yes"
    )
    emu.seed(pod("vm1", "gpu-1", {Q: "4"}))
    kc = emu.kubeconfig(tmp_path / "kubeconfig")
    res = run_vgpuctl(
        "capacity", "--kubeconfig", kc, "--desired",
        fleet(tmp_path / "change.yaml", "{A2-4Q: 3}", "{A2-4Q: 1}"),
    )  # fmt: skip
    assert res.returncode == 1
    assert rows(res.stdout) == [
        HEADER,
        ["gpu-1", Q, "3", "3", "4", "0", "0"],
        ["(cluster)", Q, "3", "3", "4", "0", "0"],
    ]
    assert res.stderr.splitlines() == [
        f"warning: node gpu-1: 4 {Q} requested by its pods but 3 once the change has landed: "
        "it cannot land while they keep them",
        "error: node gpu-2: node gpu-2 has no VGPUNodeState: vgpuctl has not reconciled it yet, "
        "so the cluster does not say what its host has (run vgpuctl apply or watch on it)",
    ]
    emu.requests.clear()
    missing = run_vgpuctl("capacity", "--kubeconfig", kc, "--desired", tmp_path / "none.yaml")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        == f"error: {tmp_path / 'none.yaml'}: cannot read: No such file or directory"
    )
    assert emu.requests == []
