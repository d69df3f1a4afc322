"""The seed's node end to end through the CLI with ``--kubeconfig``, against the emulator and
against the real kube-apiserver (the ``api_server`` fixture; the real one is ``just test-real``):
plan, apply, the objects Harvester's own CRDs keep, and a re-plan with nothing to do; and the
same as the node agent's account with only its shipped role (deploy/rbac.yaml), which the real
server's RBAC authorizer enforces."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests import rbac
from tests.api_servers import Served, preserving_crd
from tests.cluster_node import HARVESTER_CRDS, NODE_STATE_CRD, ClusterNode, kubevirt_cr
from tests.doubles.kubevirt_crd import kubevirt_crd
from tests.simnode import NODE, REPO, SEED, make_sim

SEED_FIXTURES = REPO / "tests" / "fixtures" / "crds"
GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"


def harvester_cluster(served: Served) -> None:
    """Harvester's CRDs for its two kinds, ours for the VGPUNodeState, KubeVirt's CRD and CR
    (with someone else's allow-list entry), and VirtualMachineInstances (none running)."""
    for path in sorted(HARVESTER_CRDS.glob("*.yaml")):
        served.install_crd(yaml.safe_load(path.read_text()))
    served.install_crd(yaml.safe_load(NODE_STATE_CRD.read_text()))
    served.install_crd(kubevirt_crd())
    served.install_crd(
        preserving_crd("kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance")
    )
    core = client.CoreV1Api(served.api)
    try:
        core.create_namespace({"metadata": {"name": "harvester-system"}})
    except client.ApiException as error:
        if error.status != 409:  # the real server is shared by the tests of a process
            raise
    served.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", "harvester-system", "kubevirts", kubevirt_cr()
    )


def node_of(tmp_path: Path, served: Served) -> ClusterNode:
    sim = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    node = ClusterNode(sim.dir, NODE)
    node.kubeconfig = served.kubeconfig_path
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


def cluster_object(served: Served, plural: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = served.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    return found


def install_rbac(served: Served, path: Path) -> None:
    """The shipped RBAC objects, created as the admin (already there: kept)."""
    api = client.RbacAuthorizationV1Api(served.api)
    create = {
        "ClusterRole": api.create_cluster_role,
        "ClusterRoleBinding": api.create_cluster_role_binding,
        "Role": lambda body: api.create_namespaced_role(body["metadata"]["namespace"], body),
        "RoleBinding": lambda body: api.create_namespaced_role_binding(
            body["metadata"]["namespace"], body
        ),
    }
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        try:
            create[doc["kind"]](doc)
        except client.ApiException as error:
            if error.status != 409:
                raise


def test_the_seed_node_plans_applies_and_converges(tmp_path: Path, api_server: Served) -> None:
    harvester_cluster(api_server)
    node = node_of(tmp_path, api_server)
    plan = node.ok("plan", SEED)
    assert "+ SRIOVGPUDevice harvester-kgd9c-000008000" in plan.stdout
    assert "~ KubeVirt harvester-system/kubevirt" in plan.stdout
    assert "Converged" in node.ok("apply", SEED, "--yes").stdout

    seed_sriov = yaml.safe_load((SEED_FIXTURES / "seed-sriovgpudevice.yaml").read_text())
    seed_vgpu = yaml.safe_load((SEED_FIXTURES / "seed-vgpudevice.yaml").read_text())
    sriov = cluster_object(api_server, "sriovgpudevices", "harvester-kgd9c-000008000")
    assert sriov["spec"] == seed_sriov["spec"]
    assert sorted(sriov["status"]["vfAddresses"]) == sorted(seed_sriov["status"]["vfAddresses"])
    vgpu = cluster_object(api_server, "vgpudevices", "harvester-kgd9c-000008004")
    assert vgpu["spec"] == seed_vgpu["spec"]
    assert vgpu["status"]["vGPUStatus"] == "vGPUConfigured"
    listed = api_server.custom.list_cluster_custom_object(GROUP, VERSION, "vgpudevices")
    assert len(listed["items"]) == 16
    kubevirt = api_server.custom.get_namespaced_custom_object(
        "kubevirt.io", "v1", "harvester-system", "kubevirts", "kubevirt"
    )
    mediated = kubevirt["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    selectors = {e["mdevNameSelector"] for e in mediated}
    assert selectors == {"GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"}

    again = node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes." in again.stdout


def test_the_agents_shipped_role_is_enough_for_the_seed(tmp_path: Path, api_server: Served) -> None:
    """The node agent's account with deploy/rbac.yaml alone plans, applies and re-plans the
    seed: against the emulator by tests/rbac.py's model of RBAC, against the real server by its
    RBAC authorizer (a static token as the agent's service account)."""
    harvester_cluster(api_server)
    node = node_of(tmp_path, api_server)
    if api_server.emulator is not None:
        role = rbac.enforce(api_server.emulator)
        node.kubeconfig = api_server.emulator.kubeconfig(tmp_path / "agent", user=role.user)
    else:
        assert api_server.real is not None
        install_rbac(api_server, rbac.RBAC)
        node.kubeconfig = api_server.real.kubeconfig(tmp_path / "agent", "agent")
        deadline = time.monotonic() + 30  # the authorizer's informers see the new bindings
        path = f"/apis/{GROUP}/{VERSION}/vgpudevices"
        while api_server.real.get(path, identity="agent")[0] != 200:
            assert time.monotonic() < deadline, "the agent's ClusterRoleBinding never applied"
            time.sleep(0.1)
    assert "Converged" in node.ok("apply", SEED, "--yes").stdout
    again = node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    if api_server.emulator is not None:
        assert role.refused() == []
