"""The node agent in a cluster that holds exactly what deploy/ ships: the API-server emulator
with deploy/'s RBAC (enforced per request for the agent's service account) and its
ValidatingAdmissionPolicy (evaluated by cel-python), and vgpuctl run with a node's token.

Shared by the security tests of the cluster (tests/security/test_cluster_privilege.py,
test_admission_allow_list.py, test_peer_node_states.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from reconciler.kube import connect
from tests import rbac
from tests.cluster_node import ClusterNode
from tests.doubles import jsonpatch
from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, REPO, make_sim

DEPLOY = REPO / "deploy"
AGENT = "system:serviceaccount:vgpuctl-system:vgpuctl"
CLAIM = "authentication.kubernetes.io/node-name"
KUBEVIRTS = ("kubevirt.io", "v1", "kubevirts")
KV_NS = "harvester-system"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def agent(node: str | None = NODE) -> UserInfo:
    """The agent's identity as the API server authenticates its pod's bound token."""
    extra = {CLAIM: (node,), "authentication.kubernetes.io/pod-name": ("vgpuctl-x7k2p",)}
    if node is None:
        extra = {}
    groups = ("system:serviceaccounts", "system:serviceaccounts:vgpuctl-system")
    return UserInfo(AGENT, groups=(*groups, "system:authenticated"), extra=extra)


def shipped(kinds: tuple[str, ...], *, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The objects of these kinds that deploy/ ships (with the components' JSON patches)."""
    docs = [
        d
        for path in sorted(DEPLOY.glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text("utf-8"))
        if d and d.get("kind") in kinds
    ]
    for component in components:
        (kustomization,) = yaml.safe_load_all(
            (DEPLOY / component / "kustomization.yaml").read_text()
        )
        for patch in kustomization["patches"]:
            target = patch["target"]
            docs = [
                jsonpatch.apply(d, yaml.safe_load(patch["patch"]))
                if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])
                else d
                for d in docs
            ]
    return docs


def kubevirt() -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {
            "name": "kubevirt",
            "namespace": KV_NS,
            "annotations": {"kubevirt.io/latest-observed-api-version": "v1"},
        },
        "spec": {
            "imageRegistry": "registry.suse.com/suse/sles/15.5",
            "imageTag": "1.1.0",
            "configuration": {
                "developerConfiguration": {"featureGates": ["LiveMigration", "HostDevices"]},
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/A10"}
                    ],
                    "mediatedDevices": [
                        # Someone else's entry: vgpuctl must never touch it.
                        {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/T4-2Q"}
                    ],
                },
            },
        },
    }


@contextmanager
def policed_emulator() -> Iterator[ApiServerEmulator]:
    """The emulator with deploy/'s CRDs, KubeVirt, and deploy/'s RBAC and admission policy."""
    with ApiServerEmulator(user=AGENT) as server:
        for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
            server.register_crd(yaml.safe_load(path.read_text()))
        server.register("kubevirt.io", "v1", "kubevirts", "KubeVirt", True, True)
        server.register(
            "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True, True
        )
        server.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KV_NS}})
        server.seed(kubevirt())
        for doc in shipped(POLICY_KINDS):
            server.seed(doc)
        granted = rbac.grants()
        server.authorize_with(
            lambda request, user: user.username != AGENT or rbac.allows(granted, request)
        )
        yield server


#: A simulated node driven with an agent's kubeconfig: the cluster tests' node, flags and all.
AgentNode = ClusterNode


def agent_node(
    tmp_path: Path, emu: ApiServerEmulator, *, node: str = NODE, token_node: str | None = NODE
) -> AgentNode:
    """A simulated host for ``node`` whose vgpuctl holds the token of ``token_node``'s pod."""
    sim = make_sim(tmp_path / f"host-{node}", ["A2@0000:08:00.0"], node=node)
    out = AgentNode(sim.dir, node)
    out.kubeconfig = emu.kubeconfig(tmp_path / f"kubeconfig-{node}", user=agent(token_node))
    out.kubelet_dir = tmp_path / f"kubelet-{node}"
    (out.kubelet_dir / "device-plugins").mkdir(parents=True)
    return out


def as_user(emu: ApiServerEmulator, tmp_path: Path, user: UserInfo, name: str) -> Any:
    return connect(emu.kubeconfig(tmp_path / f"kubeconfig-{name}", user=user), timeout=10)


def stored_kubevirt(emu: ApiServerEmulator) -> dict[str, Any]:
    found = emu.get_object(*KUBEVIRTS, "kubevirt", KV_NS)
    assert found is not None
    return found


def permitted(emu: ApiServerEmulator) -> dict[str, Any]:
    """The stored KubeVirt CR's ``spec.configuration.permittedHostDevices``."""
    out: dict[str, Any] = stored_kubevirt(emu)["spec"]["configuration"]["permittedHostDevices"]
    return out
