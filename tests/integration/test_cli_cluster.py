"""Cluster integration through the CLI: a simulated host and an emulated API server.

``vgpuctl`` runs as a subprocess with ``--kubeconfig``; the unmodified ``kubernetes`` client in it
talks HTTP to the emulator running in this test process. Scenarios: the seed's node end to end,
a hand edit reset, a 409 race, vGPUs in use per the kubelet checkpoint and per a running VMI,
cluster-only planning of three nodes, and what RBAC must allow (recorded, not guessed).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.model.cluster import GROUP
from tests import rbac
from tests.cluster_node import (
    KUBEVIRTS,
    NODE_STATES,
    SRIOV,
    VGPUS,
    VMIS,
    ClusterNode,
    cluster_node,
    register_crds,
    stored,
)
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.doubles.kubevirt_crd import kubevirt_crd
from tests.simnode import NODE, REPO, SEED, SimNode, make_sim, run_vgpuctl

#: Every scenario runs with our CRDs and with Harvester's own (what pcidevices-controller
#: installs): vgpuctl must converge under either.
CRD_SETS = ("ours", "harvester")

SEED_FIXTURES = REPO / "tests" / "fixtures" / "crds"


def _kubevirt(emu: ApiServerEmulator) -> dict[str, Any]:
    kv = emu.get_object(*KUBEVIRTS, "kubevirt", "harvester-system")
    assert kv is not None
    return kv


def _mediated(emu: ApiServerEmulator) -> list[dict[str, Any]]:
    kv = emu.get_object(*KUBEVIRTS, "kubevirt", "harvester-system")
    assert kv is not None
    return kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]  # type: ignore[no-any-return]


def test_seed_node_end_to_end(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    plan = node.ok("plan", SEED)
    assert "# Cluster objects" in plan.stdout
    assert "+ SRIOVGPUDevice harvester-kgd9c-000008000" in plan.stdout
    assert "~ KubeVirt harvester-system/kubevirt" in plan.stdout
    applied = node.ok("apply", SEED, "--yes")
    assert "Converged" in applied.stdout

    # The objects match the seed's examples (the UUID is ours: deterministic, not theirs).
    seed_sriov = yaml.safe_load((SEED_FIXTURES / "seed-sriovgpudevice.yaml").read_text())
    seed_vgpu = yaml.safe_load((SEED_FIXTURES / "seed-vgpudevice.yaml").read_text())
    sriov = stored(emu, SRIOV, "harvester-kgd9c-000008000")
    assert sriov["spec"] == seed_sriov["spec"]
    assert sriov["metadata"]["labels"]["nodename"] == NODE
    assert sorted(sriov["status"]["vfAddresses"]) == sorted(seed_sriov["status"]["vfAddresses"])
    assert sorted(sriov["status"]["vGPUDevices"]) == sorted(seed_sriov["status"]["vGPUDevices"])
    vgpu = stored(emu, VGPUS, "harvester-kgd9c-000008004")
    assert vgpu["spec"] == seed_vgpu["spec"]
    for label, value in seed_vgpu["metadata"]["labels"].items():
        assert vgpu["metadata"]["labels"][label] == value
    assert vgpu["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "vgpuctl"
    assert vgpu["status"]["vGPUStatus"] == "vGPUConfigured"
    assert vgpu["status"]["configureVGPUTypeName"] == "NVIDIA A2-4A"
    status = json.loads(node.ok("status", "-o", "json").stdout)
    assert vgpu["status"]["uuid"] == status["gpus"][0]["vfs"][0]["vgpu"]["uuid"]
    disabled = stored(emu, VGPUS, "harvester-kgd9c-000008010")
    # No vGPU, none creatable (4 of 4 4 GB vGPUs): every status field empty, so none written.
    assert disabled["spec"]["enabled"] is False and disabled.get("status", {}) == {}
    assert len(emu.objects(*VGPUS)) == 16

    # The node's summary: everything beyond Harvester's fields.
    summary = stored(emu, NODE_STATES, NODE)
    assert summary["metadata"]["labels"] == {
        "nodename": NODE,
        "app.kubernetes.io/managed-by": "vgpuctl",
    }
    assert summary["status"]["counts"] == {
        "gpus": 1, "managedGPUs": 1, "vfs": 16, "vgpus": 4, "inUse": 0, "blocked": 0,
    }  # fmt: skip
    by_vf = {v["vf"]: v for v in summary["status"]["vgpus"]}
    assert by_vf["0000:08:00.4"]["uuid"] == vgpu["status"]["uuid"]
    assert by_vf["0000:08:00.4"]["profile"] == "NVIDIA A2-4A"
    assert [(c["type"], c["status"]) for c in summary["status"]["conditions"]] == [
        ("Converged", "True"),
        ("Blocked", "False"),
        ("Degraded", "False"),
    ]
    change = summary["status"]["lastChange"]
    assert change["result"].startswith("applied ") and "1 sriov-enable" in change["result"]
    stamped = [change["time"], *(c["lastTransitionTime"] for c in summary["status"]["conditions"])]
    for text in stamped:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text), text

    entries = {e["mdevNameSelector"]: e for e in _mediated(emu)}
    assert entries["NVIDIA A2-4Q"] == {
        "mdevNameSelector": "NVIDIA A2-4Q",
        "resourceName": "nvidia.com/NVIDIA_A2-4Q",
        "externalResourceProvider": True,
    }
    assert "NVIDIA A2-4A" in entries and "GRID T4-2Q" in entries

    events = emu.objects("", "v1", "events", "default")
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
    assert ("harvester-kgd9c-000008004", "VGPUCreated") in reasons

    # Nothing differs any more, whichever CRDs pruned what was written; a no-op reconcile
    # writes nothing.
    assert node.run("plan", SEED, "--detailed-exitcode").returncode == 0
    emu.requests.clear()
    again = node.run("apply", SEED, "--yes")
    assert again.returncode == 0 and "No changes." in again.stdout
    assert {r.verb for r in emu.requests} <= {"get", "list"}, emu.requests


def _vfio_node(tmp_path: Path, emu: ApiServerEmulator) -> ClusterNode:
    """An L40S on NVIDIA's vendor-specific VFIO interface (no mdev bus: docs/domain.md §3b)."""
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", "L40S@0000:08:00.0", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = ClusterNode(tmp_path / "host", NODE)
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def _vfio_desired(tmp_path: Path, profiles: dict[str, int], name: str) -> Path:
    gpu: dict[str, Any] = {"address": "0000:08:00.0", "sriov": "enabled", "profiles": profiles}
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "vfio"},
        "spec": {"nodes": {NODE: {"gpus": [gpu]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_vfio_node_allow_lists_its_profiles_as_pci_host_devices(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """On the vfio interface the VF itself is the vGPU, handed to a VM as a PCI device: KubeVirt
    allow-lists it under pciHostDevices (10DE:<the VFs' device id>), not mediatedDevices; the
    entries someone else added (an A10's, a T4's mdev) stay, and the CR is served with the
    schema KubeVirt's CRD gives permittedHostDevices."""
    emu.register_crd(kubevirt_crd())
    node = _vfio_node(tmp_path, emu)
    two = _vfio_desired(tmp_path, {"NVIDIA L40S-8Q": 2}, "two.yaml")
    plan = node.ok("plan", two)
    assert "+ pciHostDevices: nvidia.com/NVIDIA_L40S-8Q (10DE:26B9)" in plan.stdout
    assert "mediatedDevices:" not in plan.stdout
    node.ok("apply", two, "--yes")

    kv = _kubevirt(emu)
    permitted = kv["spec"]["configuration"]["permittedHostDevices"]
    assert permitted["pciHostDevices"] == [
        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/A10"},
        {
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
            "externalResourceProvider": True,
        },
    ]
    assert [e["mdevNameSelector"] for e in permitted["mediatedDevices"]] == ["GRID T4-2Q"]
    annotations = kv["metadata"]["annotations"]
    assert annotations["vgpu.reconciler.dev/pci-host-devices"] == "nvidia.com/NVIDIA_L40S-8Q"
    assert "vgpu.reconciler.dev/mediated-devices" not in annotations
    # The node's summary tells the other nodes which kind each GPU is.
    (gpu,) = stored(emu, NODE_STATES, NODE)["status"]["gpus"]
    assert (gpu["interface"], gpu["sriov"]["vfDevice"]) == ("vfio", "26b9")
    assert node.run("plan", two, "--detailed-exitcode").returncode == 0

    # Another profile instead: the new entry comes, vgpuctl's old one goes, the A10's stays.
    other = _vfio_desired(tmp_path, {"NVIDIA L40S-4Q": 2}, "other.yaml")
    node.ok("apply", other, "--yes")
    kv = _kubevirt(emu)
    pci = kv["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert [e["resourceName"] for e in pci] == ["nvidia.com/A10", "nvidia.com/NVIDIA_L40S-4Q"]
    assert (
        kv["metadata"]["annotations"]["vgpu.reconciler.dev/pci-host-devices"]
        == "nvidia.com/NVIDIA_L40S-4Q"
    )


def test_hand_edit_is_reported_then_reset(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    edited = stored(emu, VGPUS, "harvester-kgd9c-000008005")
    edited["spec"]["vGPUTypeName"] = "NVIDIA A2-4C"
    # Another controller's finalizer and owner: the reset's PUT must carry them over.
    finalizers = ["example.com/audit"]
    owners = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "audit", "uid": "u-1"}]
    edited["metadata"]["finalizers"] = finalizers
    edited["metadata"]["ownerReferences"] = owners
    emu.seed(edited)

    plan = node.run("plan", SEED, "--detailed-exitcode")
    assert plan.returncode == 2
    assert "Changed outside vgpuctl" in plan.stdout
    assert '~ spec.vGPUTypeName: "NVIDIA A2-4C" → "NVIDIA A2-4Q"' in plan.stdout
    node.ok("apply", SEED, "--yes")
    reset = stored(emu, VGPUS, "harvester-kgd9c-000008005")
    assert reset["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert reset["metadata"]["finalizers"] == finalizers
    assert reset["metadata"]["ownerReferences"] == owners
    assert node.run("plan", SEED, "--detailed-exitcode").returncode == 0


def test_conflict_is_replanned_not_overwritten(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    target = "harvester-kgd9c-000008005"
    edited = stored(emu, VGPUS, target)
    edited["spec"]["vGPUTypeName"] = "NVIDIA A2-4C"
    emu.seed(edited)

    raced = []

    def race(request: Request) -> None:
        # Someone else writes the object between our read and our write, once.
        if request.verb == "update" and request.name == target and not raced:
            raced.append(request)
            current = stored(emu, VGPUS, target)
            current["metadata"].setdefault("annotations", {})["example.com/touched"] = "yes"
            emu.seed(current)

    emu.on_before_write(race)
    res = node.run("apply", SEED, "--yes")
    emu.on_before_write(None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert raced, "the race never happened"
    final = stored(emu, VGPUS, target)
    assert final["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
    # The other writer's change survived: we re-read and re-planned instead of overwriting.
    assert final["metadata"]["annotations"]["example.com/touched"] == "yes"


CHANGED = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: changed}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {{"0000:08:00.4": A2-4A, "0000:08:00.6": A2-4A}}
"""


def _vgpu_uuid(node: SimNode, vf: str) -> str:
    inv = json.loads(node.ok("status", "-o", "json").stdout)
    for vf_doc in inv["gpus"][0]["vfs"]:
        if vf_doc["address"] == vf:
            return str(vf_doc["vgpu"]["uuid"])
    raise AssertionError(vf)


def test_in_use_per_kubelet_checkpoint_blocks_removal(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    uuid = _vgpu_uuid(node, "0000:08:00.5")
    pod_uid = "9f1c7d1e-0000-4000-8000-000000000001"
    emu.seed(
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "win11", "namespace": "default", "uid": "vmi-uid-1",
                "labels": {"kubevirt.io/nodeName": NODE},
            },
            "spec": {"domain": {"devices": {"gpus": [
                {"name": "gpu1", "deviceName": "nvidia.com/NVIDIA_A2-4Q"}]}}},
            # KubeVirt's VirtualMachineInstanceStatus.ActivePods: launcher pod UID → node.
            "status": {"phase": "Running", "nodeName": NODE, "activePods": {pod_uid: NODE}},
        }
    )  # fmt: skip
    checkpoint = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": pod_uid, "ContainerName": "compute",
                 "ResourceName": "nvidia.com/NVIDIA_A2-4Q", "DeviceIDs": {"-1": [uuid]},
                 "AllocResp": ""},
            ],
            "RegisteredDevices": {"nvidia.com/NVIDIA_A2-4Q": [uuid]},
        },
        "Checksum": 1,
    }  # fmt: skip
    (node.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint").write_text(
        json.dumps(checkpoint)
    )
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    plan = node.run("plan", desired, "--detailed-exitcode")
    assert plan.returncode == 2
    assert "! vgpu-remove 0000:08:00.5" in plan.stdout
    assert f"in use by VM default/win11 (pod {pod_uid})" in plan.stdout
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert _vgpu_uuid(node, "0000:08:00.5") == uuid  # still there
    blocked = [
        e for e in emu.objects("", "v1", "events", "default")
        if e["reason"] == "VGPURemovalBlocked"
    ]  # fmt: skip
    assert blocked and blocked[0]["involvedObject"]["name"] == "harvester-kgd9c-000008005"


def _vmi(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "labels": {"kubevirt.io/nodeName": NODE}},
        "spec": {"domain": {"devices": {"gpus": [
            {"name": "gpu1", "deviceName": "nvidia.com/NVIDIA_A2-4Q"}]}}},
        "status": {"phase": "Running", "nodeName": NODE, "activePods": {f"pod-{uid}": NODE}},
    }  # fmt: skip


def test_in_use_per_running_vmi_without_checkpoint(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    emu.seed(_vmi("db", "prod", "vmi-uid-2"))
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    plan = node.run("plan", desired)
    assert "! vgpu-remove 0000:08:00.5" in plan.stdout
    assert "prod/db" in plan.stdout


def test_cluster_only_planning_of_three_nodes(tmp_path: Path, emu: ApiServerEmulator) -> None:
    names = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    lines = ["apiVersion: vgpu.reconciler.dev/v1alpha1", "kind: VGPUDesiredState",
             "metadata: {name: fleet}", "spec:", "  nodes:"]  # fmt: skip
    for name in names:
        lines += [f"    {name}:", "      gpus:", '        - address: "0000:08:00.0"',
                  "          sriov: enabled", "          profiles: {A2-4Q: 2}"]  # fmt: skip
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("\n".join(lines) + "\n")
    for name in names:
        cluster_node(tmp_path, emu, name).ok("apply", fleet, "--yes")

    changed = tmp_path / "fleet-changed.yaml"
    changed.write_text(fleet.read_text().replace("{A2-4Q: 2}", "{A2-4Q: 3}", 1))
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    emu.requests.clear()
    res = run_vgpuctl(
        "plan", changed, "--observed", "cluster", "--kubeconfig", kubeconfig,
        "--detailed-exitcode", "--sysfs-root", tmp_path / "no-such-host",
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.count("=== node") == 3
    assert "Cluster plan: 3 nodes, 1 with changes" in res.stdout
    assert {r.verb for r in emu.requests} <= {"get", "list"}

    doc = json.loads(
        run_vgpuctl(
            "plan", changed, "--observed", "cluster", "--kubeconfig", kubeconfig, "-o", "json"
        ).stdout
    )
    assert [p["node"] for p in doc["plans"]] == names
    assert doc["summary"]["nodesWithChanges"] == 1
    first = doc["plans"][0]
    assert [a["kind"] for a in first["actions"]].count("vgpu-create") == 1
    assert all(not p["actions"] for p in doc["plans"][1:])

    # The same plan for a pull request: one section for the changed node, the others folded.
    md = run_vgpuctl(
        "plan", changed, "--observed", "cluster", "--kubeconfig", kubeconfig, "-o", "markdown"
    ).stdout  # fmt: skip
    assert md.startswith("## vgpuctl plan\n\n**3 nodes, 1 with changes: ")
    assert "(observed: cluster)" in md.splitlines()[2]
    assert md.count("### Node ") == 1
    # The heading counts the table's row apart from the objects written (KubeVirt, VGPUDevice,
    # VGPUNodeState).
    assert "### Node gpu-node-1: 1 GPU step (1 to create) · 3 cluster writes (3 to change)\n" in md
    assert "<summary>2 nodes without changes</summary>\n\ngpu-node-2, gpu-node-3\n" in md
    assert "<summary>Cluster objects</summary>" in md

    # The example CI identity (examples/gitops/ci-rbac.yaml) may make that plan, and no more.
    role = rbac.enforce(emu, rbac.CI_RBAC, rbac.CI_ACCOUNT)
    ci = emu.kubeconfig(tmp_path / "ci.kubeconfig", user=role.user)
    res = run_vgpuctl("plan", changed, "--observed", "cluster", "--kubeconfig", ci)
    assert res.returncode == 0, res.stdout + res.stderr
    # The same fleet as a node group: the plan lists the cluster's Nodes to select from.
    for name in names:
        emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text("\n".join(lines[:4]) + (
        '\n  nodeGroups:\n    - name: all\n      selector: {names: ["gpu-node-*"]}\n'
        "      gpus: [{match: {model: A2}, sriov: enabled, profiles: {A2-4Q: 2}}]\n"))  # fmt: skip
    res = run_vgpuctl("plan", grouped, "--observed", "cluster", "--kubeconfig", ci)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Cluster plan: 3 nodes, " in res.stdout
    assert role.refused() == []
    assert rbac.unused(role.granted, role.requests) == set()


def test_rbac_role_allows_exactly_what_the_code_uses(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Every request the code makes in a full life cycle, checked against deploy/rbac.yaml."""
    node = cluster_node(tmp_path, emu)
    emu.requests.clear()
    node.ok("apply", SEED, "--yes")  # creates, status writes, KubeVirt update, events
    emu.seed(_vmi("db", "prod", "vmi-uid-2"))  # a running VM, joined to the checkpoint
    # Hand edits of both kinds, and another writer racing each update once: spec updates,
    # 409s, re-reads.
    for res, name, field, value in (
        (VGPUS, "harvester-kgd9c-000008005", "vGPUTypeName", "NVIDIA A2-4C"),
        (SRIOV, "harvester-kgd9c-000008000", "enabled", False),
        (NODE_STATES, "harvester-kgd9c", "nodeName", "someone-else"),
    ):
        edited = stored(emu, res, name)
        edited["spec"][field] = value
        emu.seed(edited)
    raced: set[str] = set()
    by_plural = {res[2]: res for res in (SRIOV, VGPUS, NODE_STATES)}

    def race(request: Request) -> None:
        if request.verb == "update" and request.name not in raced:
            raced.add(request.name)
            res = by_plural.get(request.resource)
            if res is not None:
                emu.seed(
                    stored(emu, res, request.name)
                    | {
                        "metadata": {
                            **stored(emu, res, request.name)["metadata"],
                            "annotations": {"x": "y"},
                        }
                    }
                )

    emu.on_before_write(race)
    node.ok("apply", SEED, "--yes")
    emu.on_before_write(None)
    node.run("plan", SEED, "--observed", "cluster")
    emu.delete_object(*VMIS, "db", "prod")  # the VM is gone: its vGPUs may go too
    disabled = tmp_path / "disabled.yaml"
    # Under a rollout budget of one (spec.rollout.maxParallel): the host change takes, renews
    # and releases a slot, a Lease in the agents' namespace.
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vgpuctl-system"}})
    disabled.write_text(SEED.read_text().replace("sriov: enabled", "sriov: disabled").split(
        "vgpus:")[0] + "\n  rollout:\n    maxParallel: 1\n")  # fmt: skip
    node.ok("apply", disabled, "--yes")  # VGPUDevices deleted, KubeVirt entries removed
    dropped = tmp_path / "dropped.yaml"
    dropped.write_text(SEED.read_text().split("gpus:")[0] + "gpus: []\n")
    node.ok("apply", dropped, "--yes")  # the GPU is no longer managed: its object stays
    assert stored(emu, SRIOV, "harvester-kgd9c-000008000")["spec"]["enabled"] is False
    # The GPU leaves the host (the node now runs on a host with another GPU only): its object
    # is deleted.
    pulled = ClusterNode(make_sim(tmp_path / "host-pulled", ["A2@0000:09:00.0"]).dir, NODE)
    pulled.kubeconfig, pulled.kubelet_dir = node.kubeconfig, node.kubelet_dir
    pulled.ok("apply", dropped, "--yes")
    node = pulled
    # A node group that selects by labels: the agent reads its own Node (one get).
    emu.seed({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": NODE, "labels": {"example.com/pool": "vdi"}}})  # fmt: skip
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(SEED.read_text().split("spec:")[0] + (
        "spec:\n  nodeGroups:\n    - name: vdi\n      selector: {labels: {example.com/pool: vdi}}\n"
        '      gpus: [{match: {address: "0000:41:00.0"}, sriov: disabled}]\n'))  # fmt: skip
    # The group wants a GPU the node does not have: an error for the node, nothing written.
    res = node.run("apply", grouped, "--yes")
    assert res.returncode == 1 and "none of its GPU entries matches a GPU there" in res.stderr
    assert not emu.objects(*SRIOV)
    granted = rbac.grants()
    denied = sorted({rbac.needed(r) for r in emu.requests if not rbac.allows(granted, r)})
    assert not denied, f"the code needs more than the role grants: {denied}"
    # The watch verbs are the watch mode's: tests/integration/test_watch_cluster.py records a
    # watch agent's requests and checks it watches exactly those resources.
    unused = {g for g in rbac.unused(granted, emu.requests) if g.verb != "watch"}
    # One slot is used: the other 31 are granted the same verbs by name.
    unused -= {g for g in unused if g.resource == "leases" and g.name != "vgpuctl-rollout-0"}
    assert not unused, f"the role grants what no code uses: {unused}"
    # Reads are narrow: no pods (VMIs and the kubelet checkpoint serve), Events only where
    # vgpuctl records them.
    assert not [r for r in emu.requests if r.resource == "pods"]
    assert {r.namespace for r in emu.requests if r.resource == "events"} == {"default"}


@pytest.mark.parametrize(
    ("setup", "fragments"),
    [
        ("stopped", ["cannot reach the Kubernetes API server"]),
        ("no-crds", ["does not serve", "CRDs"]),
        ("forbidden", ["RBAC denies list on", "vgpudevices.devices.harvesterhci.io"]),
    ],
)
def test_cluster_errors_stop_before_the_host_is_touched(
    tmp_path: Path, setup: str, fragments: list[str]
) -> None:
    with ApiServerEmulator() as emu:
        if setup != "no-crds":
            register_crds(emu)
        if setup == "forbidden":
            emu.deny("list", GROUP, "vgpudevices")
        node = cluster_node(tmp_path, emu)
        if setup == "stopped":
            emu.stop()
        res = node.run("apply", SEED, "--yes")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        for fragment in fragments:
            assert fragment in res.stderr, res.stderr
        status = node.ok("status", "-o", "json")
        inv = json.loads(status.stdout)
        assert inv["gpus"][0]["sriov"]["numVFs"] == 0, "host actions ran without the cluster"
        if setup == "stopped":
            # status only reads: with --delegate auto and no cluster it shows the host, and
            # says why; asked for Harvester's objects, it fails as every command does.
            assert "cannot tell whether pcidevices-controller runs" in status.stderr
            res = node.run("status", "--delegate", "harvester")
            assert res.returncode == 1 and "Traceback" not in res.stderr
            assert "cannot reach the Kubernetes API server" in res.stderr


def test_malformed_checkpoint_is_a_clear_error(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    bad = node.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint"
    bad.write_text("{not json")
    res = node.run("plan", SEED)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert str(bad) in res.stderr


def test_missing_kubevirt_cr_is_a_clear_skip(tmp_path: Path) -> None:
    with ApiServerEmulator() as emu:
        register_crds(emu)
        node = cluster_node(tmp_path, emu)
        res = node.ok("apply", SEED, "--yes")
        assert "KubeVirt CR not found" in res.stdout
        assert len(emu.objects(*VGPUS)) == 16


def test_status_crds_prints_the_objects(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "h", ["A2@0000:08:00.0"])
    sim.ok("apply", SEED, "--yes")
    docs = [d for d in yaml.safe_load_all(sim.ok("status", "-o", "crds").stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("SRIOVGPUDevice") == 1 and kinds.count("VGPUDevice") == 16
    vgpu = next(d for d in docs if d["metadata"]["name"] == "harvester-kgd9c-000008004")
    assert vgpu["spec"]["vGPUTypeName"] == "NVIDIA A2-4A"
    # Last, the node's summary: its four vGPUs, converged.
    assert kinds[-1] == "VGPUNodeState" and docs[-1]["metadata"]["name"] == NODE
    summary = docs[-1]["status"]
    assert summary["counts"]["vgpus"] == 4
    converged = summary["conditions"][0]
    assert (converged["type"], converged["status"]) == ("Converged", "True")
    assert all(c["lastTransitionTime"] for c in summary["conditions"])


def test_no_cluster_plan_says_cluster_actions_skipped(a2_node: SimNode) -> None:
    res = a2_node.ok("plan", SEED)
    assert "cluster actions skipped: no cluster configured" in res.stdout


def test_checkpoint_alone_marks_in_use_without_a_cluster(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "h", ["A2@0000:08:00.0"])
    sim.ok("apply", SEED, "--yes")
    uuid = _vgpu_uuid(sim, "0000:08:00.5")
    kubelet = tmp_path / "kubelet"
    (kubelet / "device-plugins").mkdir(parents=True)
    (kubelet / "device-plugins" / "kubelet_internal_checkpoint").write_text(json.dumps({
        "Data": {"PodDeviceEntries": [{"PodUID": "p1", "ContainerName": "compute",
                 "ResourceName": "nvidia.com/NVIDIA_A2-4Q", "DeviceIDs": {"0": [uuid]},
                 "AllocResp": ""}], "RegisteredDevices": {}}, "Checksum": 1}))  # fmt: skip
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    res = sim.run("plan", desired, "--kubelet-dir", kubelet)
    assert "! vgpu-remove 0000:08:00.5" in res.stdout and "pod p1" in res.stdout


def test_a_simulated_host_reads_its_own_kubelet_checkpoint_not_the_machines(
    tmp_path: Path,
) -> None:
    """Without --kubelet-dir a simulated host's checkpoint is DIR/kubelet's (as its state
    directory is DIR/state): a test, or a demo, on a machine that runs a kubelet never reads
    that kubelet's allocations."""
    sim = make_sim(tmp_path / "h", ["A2@0000:08:00.0"])
    sim.ok("apply", SEED, "--yes")
    uuid = _vgpu_uuid(sim, "0000:08:00.5")
    plugins = sim.dir / "kubelet" / "device-plugins"
    plugins.mkdir(parents=True)
    (plugins / "kubelet_internal_checkpoint").write_text(json.dumps({
        "Data": {"PodDeviceEntries": [{"PodUID": "p1", "ContainerName": "compute",
                 "ResourceName": "nvidia.com/NVIDIA_A2-4Q", "DeviceIDs": {"0": [uuid]},
                 "AllocResp": ""}], "RegisteredDevices": {}}, "Checksum": 1}))  # fmt: skip
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    res = sim.run("plan", desired)
    assert "! vgpu-remove 0000:08:00.5" in res.stdout and "pod p1" in res.stdout
    # An explicit --kubelet-dir still wins.
    empty = tmp_path / "no-kubelet"
    res = sim.run("plan", desired, "--kubelet-dir", empty)
    assert "! vgpu-remove" not in res.stdout


def test_cluster_flags_are_documented() -> None:
    res = subprocess.run(["vgpuctl", "plan", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--kubeconfig", "--observed", "--adopt", "--kubelet-dir", "--kubevirt-namespace"):
        assert flag in res.stdout


def test_a_lost_record_of_vfio_types_is_made_good_from_the_nodes_summary(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """One L40S-48Q: every list is a header only, so only vgpuctl's record names its type id.
    With the state directory lost and a driver that cannot say (nvidia-smi fails), the node's
    VGPUNodeState (which lists the GPU's types with their ids) names it: nothing is blocked,
    and the plan has no change."""
    node = _vfio_node(tmp_path, emu)
    whole = _vfio_desired(tmp_path, {"NVIDIA L40S-48Q": 1}, "whole.yaml")
    node.ok("apply", whole, "--yes")
    assert node.run("plan", whole, "--detailed-exitcode").returncode == 0
    (gpu,) = stored(emu, NODE_STATES, NODE)["status"]["gpus"]
    assert gpu["interface"] == "vfio"
    shutil.rmtree(node.dir / "state")  # the record with it
    mute = ["--nvidia-smi", "/bin/false"]  # the driver's answer: none
    status = json.loads(node.ok("status", "-o", "json", *mute).stdout)
    hosted = [v["vgpu"]["type"] for v in status["gpus"][0]["vfs"] if v["vgpu"]]
    assert hosted == ["NVIDIA L40S-48Q"]
    res = node.run("plan", whole, "--detailed-exitcode", *mute)
    assert res.returncode == 0, res.stdout + res.stderr
    # Without the cluster nor the driver there is nothing left to name it by: shown by its
    # id, and blocked; the simulated driver's nvidia-smi names it again.
    local = [a for a in node.flags if a not in (str(node.kubeconfig), "--kubeconfig")]
    res = run_vgpuctl("plan", whole, "-o", "json", *local, *mute)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["applyable"] is False
    res = run_vgpuctl("plan", whole, "--detailed-exitcode", *local)
    assert res.returncode == 0, res.stdout + res.stderr
