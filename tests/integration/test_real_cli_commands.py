"""The cluster-reading commands through the CLI as a user runs them, ``--kubeconfig`` and all,
against the emulator and against the real kube-apiserver (the ``api_server`` fixture; the real
one is ``just test-real``): ``assert`` of the seed's node, ``capacity`` and ``lint-vm`` from the
cluster's Nodes, Pods and vgpuctl's and Harvester's objects, and ``plan --observed cluster`` of a
fleet of three nodes. Every object is written through the API as its admin (so the real server's
strategies apply: a Pod is created Pending and its phase written through ``/status``, a custom
resource's status through its subresource), and every expected line is worked out by hand from
what is written here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.api_servers import Served, create_ignoring_conflict, harvester_cluster, node_of
from tests.cluster_node import ClusterNode
from tests.simnode import NODE, REPO, SEED, make_sim, run_vgpuctl

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
STATES = ("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates")
Q, A = "nvidia.com/NVIDIA_A2-4Q", "nvidia.com/NVIDIA_A2-4A"
#: The namespace of the tests' Pods (the real server is shared by a process's tests: its Pods
#: are deleted after each test; the namespace stays, as no namespace controller runs).
VMS = "vms"


class Core:
    """Nodes and Pods a test creates as the admin, deleted again after it."""

    def __init__(self, served: Served) -> None:
        self.api = client.CoreV1Api(served.api)
        self.nodes: list[str] = []
        self.pods: list[str] = []
        create_ignoring_conflict(self.api.create_namespace, {"metadata": {"name": VMS}})
        if served.real is not None:
            # Its ServiceAccount admission plugin gives a Pod without one "default", and
            # refuses the Pod while that account does not exist (no controller manager makes
            # it here; the emulator serves no ServiceAccounts and admits the Pod).
            create_ignoring_conflict(
                self.api.create_namespaced_service_account, VMS, {"metadata": {"name": "default"}}
            )

    def node(self, name: str, status: dict[str, Any]) -> None:
        # A Node keeps the status it is created with (kubernetes pkg/registry/core/node/
        # strategy.go, nodeStrategy.PrepareForCreate clears nothing of it).
        self.api.create_node({"metadata": {"name": name}, "status": status})
        self.nodes.append(name)

    def pod(self, name: str, node: str | None, phase: str, spec: dict[str, Any]) -> None:
        body = {**spec, **({"nodeName": node} if node else {})}
        self.api.create_namespaced_pod(VMS, {"metadata": {"name": name}, "spec": body})
        self.pods.append(name)
        if phase != "Pending":  # created Pending (podStrategy.PrepareForCreate): as the kubelet
            made = self.api.read_namespaced_pod(name, VMS)
            made.status.phase = phase
            self.api.replace_namespaced_pod_status(name, VMS, made)

    def delete(self) -> None:
        for name in self.pods:  # at once: no kubelet confirms a graceful delete here
            self.api.delete_namespaced_pod(name, VMS, grace_period_seconds=0)
        for name in self.nodes:
            self.api.delete_node(name)


@pytest.fixture
def core(api_server: Served) -> Iterator[Core]:
    made = Core(api_server)
    try:
        yield made
    finally:
        made.delete()


def container(name: str, asks: dict[str, str], *, limits_only: bool = False) -> dict[str, Any]:
    """A container asking for vGPUs: requests equal to limits (an extended resource may not be
    overcommitted), or limits alone (the API server defaults the requests to them)."""
    resources = {"limits": asks} if limits_only else {"requests": asks, "limits": asks}
    return {"name": name, "image": "registry.example/vm:1", "resources": resources}


def create_status(served: Served, res: tuple[str, str, str], body: dict[str, Any]) -> None:
    """A cluster-scoped custom object, then its status through the subresource (create drops
    it: the CRDs have a status subresource)."""
    group, version, plural = res
    made = served.custom.create_cluster_custom_object(group, version, plural, body)
    made["status"] = body["status"]
    served.custom.replace_cluster_custom_object_status(
        group, version, plural, made["metadata"]["name"], made
    )


def vgpu_device(node: str, fn: int, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VGPUDevice",
        "metadata": {"name": f"{node}-00000800{fn}", "labels": {"nodename": node}},
        "spec": {"address": f"0000:08:00.{fn}", "enabled": True, "nodeName": node,
                 "parentGPUDeviceAddress": "0000:08:00.0", "vGPUTypeName": profile},
        "status": {"configureVGPUTypeName": profile, "vGPUStatus": "vGPUConfigured",
                   "uuid": f"00000000-0000-4000-8000-00000000000{fn}"},
    }  # fmt: skip


def node_state(name: str, profile: str, vgpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "VGPUNodeState",
        "metadata": {"name": name}, "spec": {"nodeName": name},
        "status": {"profiles": [
            {"name": profile, "resourceName": "nvidia.com/" + profile.replace(" ", "_"),
             "wanted": vgpus, "vgpus": vgpus, "inUse": 0, "creatable": 0}]},
    }  # fmt: skip


# -- assert -------------------------------------------------------------------------------------


def test_assert_with_a_kubeconfig_matches_then_names_a_hand_edit_on_the_cluster(
    tmp_path: Path, api_server: Served
) -> None:
    """The seed's node, applied: ``assert`` says it matches (exit 0). An admin then changes one
    VGPUDevice's profile on the cluster: ``assert`` (reading the cluster) says the node has
    drifted, exit 2, naming that object (and nothing is written: assert plans only)."""
    harvester_cluster(api_server)
    node = node_of(tmp_path, api_server)
    node.ok("apply", SEED, "--yes")
    matches = node.run("assert", SEED)
    assert (matches.returncode, matches.stdout) == (0, f"node {NODE} matches the desired state\n")

    name = f"{NODE}-000008005"
    edited = api_server.custom.get_cluster_custom_object(GROUP, VERSION, "vgpudevices", name)
    edited["spec"]["vGPUTypeName"] = "NVIDIA A2-4C"
    api_server.custom.replace_cluster_custom_object(GROUP, VERSION, "vgpudevices", name, edited)
    drift = node.run("assert", SEED)
    assert drift.returncode == 2, drift.stdout + drift.stderr
    # Two steps: that object's spec put back (the seed gives 0000:08:00.5 an A2-4Q), and the
    # node's summary, whose status reports the step still to take.
    assert drift.stdout.splitlines() == [
        f"node {NODE} has drifted: Plan: 0 to create, 2 to change, 0 to remove, 0 blocked.",
        f"  cr-update {name}: VGPUDevice for VF 0000:08:00.5: spec changed outside vgpuctl: reset",
        f"  cr-update {NODE}: VGPUNodeState for node {NODE}: status differs from the host",
    ]
    assert drift.stderr == ""
    after = api_server.custom.get_cluster_custom_object(GROUP, VERSION, "vgpudevices", name)
    assert after["spec"]["vGPUTypeName"] == "NVIDIA A2-4C"


# -- capacity -----------------------------------------------------------------------------------


def test_capacity_from_the_clusters_nodes_pods_and_objects(
    tmp_path: Path, api_server: Served, core: Core
) -> None:
    """cap-a: vgpuctl's agent runs there (a VGPUNodeState: four A2-4Q), four advertised; a
    running VM asks one, a pending one two (by its limit alone); a finished and a failed Pod
    ask nothing any more. cap-b: no summary, its VGPUDevices say two A2-4A and two A2-4Q, both
    advertised; a running Pod's sidecar holds one A2-4A and its init container asks one more
    while it runs: 2 at the peak. An unscheduled Pod asks nothing of a node."""
    harvester_cluster(api_server)
    core.node("cap-a", {"allocatable": {"cpu": "8", Q: "4"}, "capacity": {"cpu": "8", Q: "4"}})
    core.node(
        "cap-b",
        {"allocatable": {"cpu": "8", Q: "2", A: "2"}, "capacity": {"cpu": "8", Q: "2", A: "2"}},
    )
    create_status(api_server, STATES, node_state("cap-a", "NVIDIA A2-4Q", 4))
    for fn, profile in ((4, "NVIDIA A2-4A"), (5, "NVIDIA A2-4A"), (6, "NVIDIA A2-4Q"),
                        (7, "NVIDIA A2-4Q")):  # fmt: skip
        create_status(
            api_server, (GROUP, VERSION, "vgpudevices"), vgpu_device("cap-b", fn, profile)
        )
    core.pod("vm1", "cap-a", "Running", {"containers": [container("compute", {Q: "1"})]})
    core.pod(
        "vm2",
        "cap-a",
        "Pending",
        {"containers": [container("compute", {Q: "2"}, limits_only=True)]},
    )
    core.pod("done", "cap-a", "Succeeded", {"containers": [container("compute", {Q: "1"})]})
    core.pod("crashed", "cap-a", "Failed", {"containers": [container("compute", {Q: "1"})]})
    sidecar = {**container("sidecar", {A: "1"}), "restartPolicy": "Always"}
    core.pod(
        "vm3",
        "cap-b",
        "Running",
        {
            "initContainers": [sidecar, container("setup", {A: "1"})],
            "containers": [container("compute", {})],
        },
    )
    core.pod("unscheduled", None, "Pending", {"containers": [container("compute", {Q: "4"})]})

    kubeconfig = api_server.kubeconfig_path
    res = run_vgpuctl("capacity", "--kubeconfig", kubeconfig)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [line.split() for line in res.stdout.splitlines()] == [
        ["NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE"],
        ["cap-a", Q, "4", "4", "3", "0", "1"],
        ["cap-b", A, "2", "2", "2", "0", "0"],
        ["cap-b", Q, "2", "2", "0", "0", "2"],
        ["(cluster)", A, "2", "2", "2", "0", "0"],
        ["(cluster)", Q, "6", "6", "3", "0", "3"],
    ]
    doc = json.loads(
        run_vgpuctl("capacity", "--kubeconfig", kubeconfig, "-o", "json", "--require", f"{Q}=2")
        .stdout
    )  # fmt: skip
    assert doc["require"]["satisfied"] is True
    assert doc["require"]["messages"] == [f"node cap-b has 2 {Q} free (needed 2)"]
    short = run_vgpuctl("capacity", "--kubeconfig", kubeconfig, "--require", f"{Q}=3")
    assert short.returncode == 2, short.stdout + short.stderr
    assert short.stderr.strip() == f"no node has 3 {Q} free: the best, cap-b, has 2 (short by 1)"


def test_capacity_counts_a_vgpu_held_without_a_pod_and_checks_requirements_jointly(
    tmp_path: Path, api_server: Served, core: Core
) -> None:
    """hold-a's summary (its status written through /status, as the agent writes it) lists
    three A2-4Q and one A2-4A, all advertised: one A2-4Q held by a QEMU no pod was allocated
    (not free), one by vm1's launcher pod (its request counts it), vm1 asking one. A2-4Q free:
    3 - 1 requested - 1 held = 1; A2-4A free 1. An A2-4Q and an A2-4A fit at once (short
    names); two A2-4Q and an A2-4A do not (short by one A2-4Q)."""
    harvester_cluster(api_server)
    core.node(
        "hold-a",
        {"allocatable": {"cpu": "8", Q: "3", A: "1"}, "capacity": {"cpu": "8", Q: "3", A: "1"}},
    )
    holders = ["pid 4242 (qemu-system-x86)", "VM vms/vm1 (pod uid-1)", None, None]
    profiles = ["NVIDIA A2-4Q"] * 3 + ["NVIDIA A2-4A"]
    state = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "VGPUNodeState",
        "metadata": {"name": "hold-a"}, "spec": {"nodeName": "hold-a"},
        "status": {
            "vgpus": [
                {"gpu": "0000:08:00.0", "vf": f"0000:08:00.{4 + i}", "vfIndex": i,
                 "profile": profile, "uuid": f"uuid-{i}", "inUse": holder is not None,
                 **({"holder": holder} if holder else {})}
                for i, (holder, profile) in enumerate(zip(holders, profiles, strict=True))
            ],
            "profiles": [
                {"name": "NVIDIA A2-4A", "resourceName": A, "wanted": 1, "vgpus": 1,
                 "inUse": 0, "creatable": 0},
                {"name": "NVIDIA A2-4Q", "resourceName": Q, "wanted": 3, "vgpus": 3,
                 "inUse": 2, "creatable": 0},
            ],
        },
    }  # fmt: skip
    create_status(api_server, STATES, state)
    core.pod("vm1", "hold-a", "Running", {"containers": [container("compute", {Q: "1"})]})

    kubeconfig = api_server.kubeconfig_path
    fits = run_vgpuctl("capacity", "--kubeconfig", kubeconfig, "--require", "A2-4Q=1",
                       "--require", "NVIDIA A2-4A=1")  # fmt: skip
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert [line.split() for line in fits.stdout.splitlines()] == [
        ["NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE"],
        ["hold-a", A, "1", "1", "0", "0", "1"],
        ["hold-a", Q, "3", "3", "1", "1", "1"],
        ["(cluster)", A, "1", "1", "0", "0", "1"],
        ["(cluster)", Q, "3", "3", "1", "1", "1"],
    ]
    assert fits.stderr.strip() == (
        f"node hold-a has them all free at once: 1 {Q} (needed 1), 1 {A} (needed 1)"
    )
    short = run_vgpuctl("capacity", "--kubeconfig", kubeconfig, "--require", "A2-4Q=2",
                        "--require", "A2-4A=1")  # fmt: skip
    assert short.returncode == 2, short.stdout + short.stderr
    assert short.stderr.strip() == (
        f"no node has 2 {Q} and 1 {A} free at once: the best, hold-a, has 1 {Q} and 1 {A} "
        f"(short by 1 {Q})"
    )


# -- lint-vm ------------------------------------------------------------------------------------


def test_lint_vm_checks_what_the_clusters_nodes_offer(
    tmp_path: Path, api_server: Served, core: Core
) -> None:
    """lint-1 advertises A2-4Q as allocatable, lint-2 has A2-4A in its capacity only: both are
    on offer, the L40S-8Q is not. tests/fixtures/vms/two-gpus.yaml's findings are then the
    ones it has against the seed's desired state (which offers the same two)."""
    core.node("lint-1", {"allocatable": {"cpu": "8", Q: "2"}, "capacity": {"cpu": "8", Q: "2"}})
    core.node("lint-2", {"capacity": {"cpu": "8", A: "1"}})
    vms = tmp_path / "two-gpus.yaml"
    shutil.copy(REPO / "tests" / "fixtures" / "vms" / "two-gpus.yaml", vms)
    res = run_vgpuctl("lint-vm", vms, "--kubeconfig", api_server.kubeconfig_path)
    assert res.returncode == 1, res.stdout + res.stderr
    ramfb = (
        "has a display with ramFB, as an earlier GPU of this VM has: only one may (set "
        "virtualGPUOptions.display.ramFB.enabled: false, or run with --fix)"
    )
    series = "NVIDIA A2 allows several vGPUs in one VM only for series Q, not A"
    assert res.stderr.splitlines() == [  # by position (issue 34, item 6)
        f"{vms}:16:15: error: GPU gpu2 {ramfb}",
        f"{vms}:31:23: error: {A}: {series}",
        f"{vms}:36:23: error: {A}: {series}",
        f"{vms}:37:11: error: GPU c {ramfb}",
        f"{vms}:38:23: error: nvidia.com/NVIDIA_L40S-8Q is not on offer (offered: {A}, {Q})",
        f"{vms}:38:23: warning: nvidia.com/NVIDIA_L40S-8Q: whether NVIDIA L40S allows several "
        "vGPUs per VM is not known to the catalogue",
    ]


# -- plan --observed cluster of a fleet ---------------------------------------------------------


FLEET = ("fleet-1", "fleet-2", "fleet-3")


def fleet_file(path: Path, counts: dict[str, int]) -> Path:
    lines = ["apiVersion: vgpu.reconciler.dev/v1alpha1", "kind: VGPUDesiredState",
             "metadata: {name: fleet}", "spec:", "  nodes:"]  # fmt: skip
    for name in FLEET:
        lines += [
            f"    {name}:",
            "      gpus:",
            '        - address: "0000:08:00.0"',
            "          sriov: enabled",
            f"          profiles: {{A2-4Q: {counts[name]}}}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def fleet_agent(tmp_path: Path, served: Served, name: str) -> ClusterNode:
    sim = make_sim(tmp_path / f"host-{name}", ["A2@0000:08:00.0"], node=name)
    node = ClusterNode(sim.dir, name)
    node.kubeconfig = served.kubeconfig_path
    node.kubelet_dir = tmp_path / f"kubelet-{name}"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def test_plan_observed_cluster_of_three_nodes(tmp_path: Path, api_server: Served) -> None:
    """Three nodes' agents applied two A2-4Q each; CI's plan with no host, from the cluster
    alone: the file now wants three on fleet-2, so one vGPU to create there and nothing on the
    other two (exit 2), reading only."""
    harvester_cluster(api_server)
    applied = fleet_file(tmp_path / "fleet.yaml", dict.fromkeys(FLEET, 2))
    for name in FLEET:
        fleet_agent(tmp_path, api_server, name).ok("apply", applied, "--yes")
    changed = fleet_file(tmp_path / "changed.yaml", {"fleet-1": 2, "fleet-2": 3, "fleet-3": 2})
    if api_server.emulator is not None:
        api_server.emulator.requests.clear()
    args = ("plan", changed, "--observed", "cluster", "--kubeconfig", api_server.kubeconfig_path)
    res = run_vgpuctl(*args, "--detailed-exitcode", "--sysfs-root", tmp_path / "no-such-host")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.count("=== node") == 3
    assert "Cluster plan: 3 nodes, 1 with changes" in res.stdout
    doc = json.loads(run_vgpuctl(*args, "-o", "json").stdout)
    assert [p["node"] for p in doc["plans"]] == list(FLEET)
    assert doc["summary"]["nodesWithChanges"] == 1
    kinds = {p["node"]: [a["kind"] for a in p["actions"]] for p in doc["plans"]}
    assert kinds["fleet-1"] == [] and kinds["fleet-3"] == []
    assert kinds["fleet-2"].count("vgpu-create") == 1
    # Reading only (the emulator's record: the real server's audit log leaves out the admin's
    # requests; the CI identity's plans, test_real_cli_cluster.py, are audited on both).
    if api_server.emulator is not None:
        assert {r.verb for r in api_server.emulator.requests} <= {"get", "list"}
