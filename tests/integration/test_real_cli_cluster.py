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
from tests.api_servers import (
    Served,
    create_ignoring_conflict,
    harvester_cluster,
    install_rbac,
    node_of,
)
from tests.doubles.emulator import Request
from tests.simnode import NODE, REPO, SEED, run_vgpuctl

SEED_FIXTURES = REPO / "tests" / "fixtures" / "crds"
GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"


DEVICES, NODE_STATES = "devices.harvesterhci.io", "vgpu.reconciler.dev"
#: What the agent's first apply of the seed and its re-plan ask for (verb, group, resource,
#: subresource), each a use deploy/rbac.yaml's comments give: the pcidevices-controller guard's
#: three gets, the lists of its node's objects, the KubeVirt CR and VMIs, its objects created and
#: their status written through the subresource, the allow-list JSON patch, an Event.
SEED_REQUESTS = {
    ("get", "harvesterhci.io", "addons", None),
    ("get", "apps", "daemonsets", None),
    ("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None),
    ("list", DEVICES, "sriovgpudevices", None),
    ("list", DEVICES, "vgpudevices", None),
    ("list", NODE_STATES, "vgpunodestates", None),
    ("list", "kubevirt.io", "kubevirts", None),
    ("list", "kubevirt.io", "virtualmachineinstances", None),
    ("get", "kubevirt.io", "kubevirts", None),
    ("get", NODE_STATES, "vgpunodestates", None),
    ("create", DEVICES, "sriovgpudevices", None),
    ("create", DEVICES, "vgpudevices", None),
    ("create", NODE_STATES, "vgpunodestates", None),
    ("update", DEVICES, "sriovgpudevices", "status"),
    ("update", DEVICES, "vgpudevices", "status"),
    ("update", NODE_STATES, "vgpunodestates", "status"),
    ("patch", "kubevirt.io", "kubevirts", None),
    ("create", "", "events", None),
}


def cluster_object(served: Served, plural: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = served.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    return found


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
    mark = 0
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
        mark = api_server.real.audit_mark()
    assert "Converged" in node.ok("apply", SEED, "--yes").stdout
    again = node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    # What the agent asked for, as the emulator records it and as the real server's audit log
    # does (the two agree): every request allowed by the shipped role.
    if api_server.emulator is not None:
        made = [tuple(r) for r in role.requests]
    else:
        assert api_server.real is not None
        made = list(api_server.real.requests("agent", since=mark))
    granted = rbac.grants()
    assert [r for r in made if not rbac.allows(granted, Request(*r))] == []
    assert {r[:4] for r in made} == SEED_REQUESTS


#: What CI's two plans ask for (verb, group, resource, subresource), each a rule of
#: examples/gitops/ci-rbac.yaml: the pcidevices-controller guard's three gets, the lists of
#: the device objects, the summaries, the KubeVirt CR and VMIs, and (the node group) the Nodes.
CI_REQUESTS = {
    ("get", "harvesterhci.io", "addons", None),
    ("get", "apps", "daemonsets", None),
    ("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None),
    ("list", DEVICES, "sriovgpudevices", None),
    ("list", DEVICES, "vgpudevices", None),
    ("list", NODE_STATES, "vgpunodestates", None),
    ("list", "kubevirt.io", "kubevirts", None),
    ("list", "kubevirt.io", "virtualmachineinstances", None),
    ("list", "", "nodes", None),
}
#: The seed's layout as a node group that selects the node by its name: CI's plan of it lists
#: the cluster's Nodes to expand the group (examples/gitops/ci-rbac.yaml's ``nodes`` rule).
GROUPED = (
    "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
    "metadata: {name: lab}\nspec:\n  nodeGroups:\n    - name: a2\n"
    '      selector: {names: ["harvester-*"]}\n'
    '      gpus:\n        - match: {address: "0000:08:00.0"}\n          sriov: enabled\n'
    '          vgpus: {"0000:08:00.4": NVIDIA A2-4A, "0000:08:00.5": NVIDIA A2-4Q,\n'
    '                  "0000:08:00.6": NVIDIA A2-4A, "0000:08:00.7": NVIDIA A2-4Q}\n'
)


def test_the_ci_identity_plans_from_the_cluster_with_only_its_role(
    tmp_path: Path, api_server: Served
) -> None:
    """After the seed's apply, CI's ``plan --observed cluster`` (examples/gitops/ci-rbac.yaml's
    read-only identity, no host; examples/gitops/.github/workflows/vgpuctl.yml runs it, and
    ``validate``, which reads nothing) finds nothing to do, of the seed's file and of the same
    layout as a node group, reading only: every request is one the role grants, and together
    they use every rule it grants (on the real server, as its audit log records them)."""
    harvester_cluster(api_server)
    node_of(tmp_path, api_server).ok("apply", SEED, "--yes")
    core = client.CoreV1Api(api_server.api)
    create_ignoring_conflict(core.create_node, {"metadata": {"name": NODE}})
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(GROUPED)
    if api_server.emulator is not None:
        role = rbac.enforce(api_server.emulator, rbac.CI_RBAC, rbac.CI_ACCOUNT)
        kubeconfig = api_server.emulator.kubeconfig(tmp_path / "ci", user=role.user)
    else:
        assert api_server.real is not None
        install_rbac(api_server, rbac.CI_RBAC)
        kubeconfig = api_server.real.kubeconfig(tmp_path / "ci", "ci")
        deadline = time.monotonic() + 30  # the authorizer's informers see the new binding
        while api_server.real.get(f"/apis/{GROUP}/{VERSION}/vgpudevices", identity="ci")[0] != 200:
            assert time.monotonic() < deadline, "the CI ClusterRoleBinding never applied"
            time.sleep(0.1)
        mark = api_server.real.audit_mark()
    try:
        plans = {}
        for desired in (SEED, grouped):
            plans[desired] = run_vgpuctl(
                "plan", desired, "--observed", "cluster", "--kubeconfig", kubeconfig,
                "--detailed-exitcode", "--sysfs-root", tmp_path / "no-such-host",
            )  # fmt: skip
    finally:
        core.delete_node(NODE)
    res = plans[SEED]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No changes." in res.stdout
    # The group gives the GPU the seed's vGPUs; only the summary's fingerprint of the desired
    # state changes (another file, with a match instead of the model, configures it now).
    res = plans[grouped]
    assert res.returncode == 2, res.stdout + res.stderr
    assert "node group 'a2' (" in res.stdout
    assert "Cluster plan: 1 node, 1 with changes; 0 to create, 1 to change, 0 to remove" in (
        res.stdout
    )
    assert "~ status.desiredFingerprint: " in res.stdout
    if api_server.emulator is not None:
        made = [tuple(r) for r in role.requests]
    else:
        assert api_server.real is not None
        made = list(api_server.real.requests("ci", since=mark))
    assert made and {r[0] for r in made} <= {"get", "list"}
    granted = rbac.grants(rbac.CI_RBAC, rbac.CI_ACCOUNT)
    assert [r for r in made if not rbac.allows(granted, Request(*r))] == []
    assert rbac.unused(granted, [Request(*r) for r in made]) == set()
    assert {r[:4] for r in made} == CI_REQUESTS
