"""One test, two API servers: the emulator (``tests/doubles/emulator.py``) and the real
kube-apiserver (``tests/real_apiserver.py``), behind the same small interface, so a test asserts
the same thing of both and any disagreement between the model and the real thing shows.

The ``api_server`` fixture (``tests/conftest.py``) runs a test once per server; the real one is
marked ``realapi`` (``just test-real`` selects those) and skipped, with the reason printed, where
its binaries are not built. The emulator is a fresh one per test; the real server is one per
test process, so a test's objects are deleted after it (:meth:`Served.clean`) and the CRDs
stay installed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.cluster_node import HARVESTER_CRDS as HARVESTER_KINDS
from tests.cluster_node import NODE_STATE_CRD, ClusterNode, kubevirt_cr
from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.kubevirt_crd import kubevirt_crd
from tests.real_apiserver import IDENTITIES, RealApiServer
from tests.simnode import NODE, make_sim

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
#: Harvester's real CRDs, as its charts install them (the READMEs beside them say from where).
HARVESTER_CRDS = (
    *sorted((FIXTURES / "harvester-crds").glob("*.yaml")),
    *sorted((FIXTURES / "harvester-addon").glob("*.yaml")),
    *sorted((FIXTURES / "harvester-pcidevices").glob("*.yaml")),
)
#: How long a CRD may take to be served by the real server.
ESTABLISHED_S = 60.0
# The client is only partly typed: its untyped entry points are used as Any
new_client_from_config: Any = config.new_client_from_config


def crd_manifests() -> list[dict[str, Any]]:
    """Harvester's CRDs, parsed."""
    return [yaml.safe_load(path.read_text()) for path in HARVESTER_CRDS]


@dataclass
class Served:
    """An API server a test talks to through the unmodified ``kubernetes`` client as an admin."""

    name: str  # "emulator" or "real"
    api: Any  # kubernetes.client.ApiClient
    kubeconfig_path: Path
    emulator: ApiServerEmulator | None = None
    real: RealApiServer | None = None
    _crds: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Install a CRD and wait until its resource is served."""
        self._crds.append(crd)
        if self.emulator is not None:
            self.emulator.register_crd(crd)
            return
        extensions = client.ApiextensionsV1Api(self.api)
        try:
            extensions.create_custom_resource_definition(dict(crd))
        except client.ApiException as error:
            if error.status != 409:  # installed by an earlier test of this process
                raise
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        deadline = time.monotonic() + ESTABLISHED_S
        while True:
            try:
                self.custom.list_cluster_custom_object(
                    spec["group"], version, spec["names"]["plural"], limit=1
                )
                return
            except client.ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def clean(self) -> None:
        """Delete every object of the CRDs this test installed (the real server is shared by
        the tests of a process; the CRDs themselves stay)."""
        for crd in self._crds:
            spec = crd["spec"]
            plural = spec["names"]["plural"]
            for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
                listed = self.custom.list_cluster_custom_object(spec["group"], version, plural)
                for item in listed["items"]:
                    meta = item["metadata"]
                    try:
                        if "namespace" in meta:
                            self.custom.delete_namespaced_custom_object(
                                spec["group"], version, meta["namespace"], plural, meta["name"]
                            )
                        else:
                            self.custom.delete_cluster_custom_object(
                                spec["group"], version, plural, meta["name"]
                            )
                    except client.ApiException as error:
                        if error.status != 404:
                            raise


def served_emulator(directory: Path) -> tuple[ApiServerEmulator, Served]:
    """A fresh emulator (started: the caller stops it) and its :class:`Served`."""
    # Its default token is an admin's, as the real server's admin kubeconfig is (the
    # emulator's own default is the agent's service account, which deploy/'s policy judges).
    emulator = ApiServerEmulator(user=IDENTITIES["admin"][0])
    emulator.start()
    path = emulator.kubeconfig(directory / "kubeconfig-emulator")
    api = new_client_from_config(config_file=str(path))
    return emulator, Served("emulator", api, path, emulator=emulator)


def served_real(server: RealApiServer, directory: Path) -> Served:
    """The process's real API server, as its admin."""
    path = server.kubeconfig(directory / "kubeconfig-real")
    api = new_client_from_config(config_file=str(path))
    return Served("real", api, path, real=server)


def preserving_crd(group: str, version: str, plural: str, kind: str) -> dict[str, Any]:
    """A namespaced CRD that keeps whatever is written (``x-kubernetes-preserve-unknown-fields``),
    with a status subresource: what the emulator's ``register`` serves without a schema."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "kind": kind},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def create_ignoring_conflict(create: Any, *args: Any) -> Any:
    """``create(*args)``; an object already there (the real server is shared by a process's
    tests) is kept: None."""
    try:
        return create(*args)
    except client.ApiException as error:
        if error.status != 409:
            raise
        return None


def agent_pod_token(served: Served, node: str) -> str:
    """A token of the node agent's service account bound to a pod on ``node``, as the kubelet
    asks for its projected volume: the API server puts the pod's node in the token
    (``authentication.kubernetes.io/node-name`` in the user's extra, kubernetes
    pkg/serviceaccount/claims.go, ServiceAccountTokenPodNodeInfo). The real server only: the
    Node, ServiceAccount and Pod objects are created as its admin (nothing runs the pod)."""
    core = client.CoreV1Api(served.api)
    create_ignoring_conflict(core.create_namespace, {"metadata": {"name": "vgpuctl-system"}})
    create_ignoring_conflict(
        core.create_namespaced_service_account, "vgpuctl-system", {"metadata": {"name": "vgpuctl"}}
    )
    create_ignoring_conflict(core.create_node, {"metadata": {"name": node}})
    pod = {
        "metadata": {"name": f"vgpuctl-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "vgpuctl",
            "containers": [{"name": "vgpuctl", "image": "ghcr.io/vgpuctl/vgpuctl:0.1.0"}],
        },
    }
    create_ignoring_conflict(core.create_namespaced_pod, "vgpuctl-system", pod)
    uid = core.read_namespaced_pod(f"vgpuctl-{node}", "vgpuctl-system").metadata.uid
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=f"vgpuctl-{node}", uid=uid
            ),
            expiration_seconds=3600,
        )
    )
    answer = core.create_namespaced_service_account_token("vgpuctl", "vgpuctl-system", request)
    token: str = answer.status.token
    return token


def harvester_cluster(served: Served) -> None:
    """Harvester's CRDs for its two kinds, ours for the VGPUNodeState, KubeVirt's CRD and CR
    (with someone else's allow-list entry), and VirtualMachineInstances (none running)."""
    for path in sorted(HARVESTER_KINDS.glob("*.yaml")):
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
    core = client.CoreV1Api(served.api)
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        if doc["kind"] == "ServiceAccount":  # its tokens are the static ones (IDENTITIES)
            continue
        if doc["kind"] == "Namespace":  # made below, for the objects in it
            continue
        namespace = doc["metadata"].get("namespace")
        if namespace is not None:  # a Role in the agents' own namespace (its rollout slots)
            create_ignoring_conflict(core.create_namespace, {"metadata": {"name": namespace}})
        try:
            create[doc["kind"]](doc)
        except client.ApiException as error:
            if error.status != 409:
                raise


#: The tests' own resource, served by the real server without a watch cache
#: (real_apiserver.UNCACHED): (group, version, plural).
WATCH_PROBES = ("realapi.vgpuctl.invalid", "v1", "watchprobes")


class PolicedAgent:
    """deploy/rbac.yaml's role and deploy/admission-policy.yaml's policy in force, and a
    kubeconfig of the node agent for ``node``: on the real server its service account's token
    bound to a pod on ``node`` (:func:`agent_pod_token`), on the emulator the identity
    ``tests/agent_cluster.py`` gives such a token. Entered once the real server's authorizer
    lets the agent read and its policy judges the agent's writes (both load from informers);
    at exit the policy is taken away again and no longer judges (the real server is shared by
    a process's tests: a later one may use the agent's static token, which has no node claim).
    Needs Harvester's VGPUDevice CRD (:func:`harvester_cluster`)."""

    def __init__(self, served: Served, directory: Path, node: str = NODE) -> None:
        self.served, self.directory, self.node = served, directory, node
        self._installed: list[dict[str, Any]] = []
        self._agent: Any = None

    def __enter__(self) -> Path:
        from tests import rbac
        from tests.agent_cluster import AGENT, POLICY_KINDS, agent, shipped

        served = self.served
        self.directory.mkdir(parents=True, exist_ok=True)
        if served.emulator is not None:
            for doc in shipped(POLICY_KINDS):
                served.emulator.seed(doc)
            granted = rbac.grants()
            served.emulator.authorize_with(
                lambda request, user: user.username != AGENT or rbac.allows(granted, request)
            )
            return served.emulator.kubeconfig(
                self.directory / "agent-kubeconfig", user=agent(self.node)
            )
        assert served.real is not None
        install_rbac(served, rbac.RBAC)
        admission = client.AdmissionregistrationV1Api(served.api)
        policy, binding = shipped(POLICY_KINDS)
        if create_ignoring_conflict(admission.create_validating_admission_policy, policy):
            self._installed.append(policy)  # installed here: taken away at exit
        if create_ignoring_conflict(admission.create_validating_admission_policy_binding, binding):
            self._installed.append(binding)
        path = served.real.kubeconfig(
            self.directory / "agent-kubeconfig", "agent", token=agent_pod_token(served, self.node)
        )
        self._agent = new_client_from_config(config_file=str(path))
        _wait_for_policy(served, client.CustomObjectsApi(self._agent), self.node, judging=True)
        return path

    def __exit__(self, *exc: object) -> None:
        if self._agent is None:
            return
        admission = client.AdmissionregistrationV1Api(self.served.api)
        try:
            for doc in reversed(self._installed):
                if doc["kind"] == "ValidatingAdmissionPolicyBinding":
                    admission.delete_validating_admission_policy_binding(doc["metadata"]["name"])
                else:
                    admission.delete_validating_admission_policy(doc["metadata"]["name"])
            if self._installed:
                _wait_for_policy(
                    self.served, client.CustomObjectsApi(self._agent), self.node, judging=False
                )
        finally:
            self._agent.close()


def _wait_for_policy(served: Served, agent: Any, node: str, *, judging: bool) -> None:
    """Until the agent may read VGPUDevices and the policy refuses (``judging``) or lets in
    (not) its create of another node's VGPUDevice, a probe deleted again."""
    group, version, plural = "devices.harvesterhci.io", "v1beta1", "vgpudevices"
    other = f"{node}-other"
    probe = {
        "apiVersion": f"{group}/{version}",
        "kind": "VGPUDevice",
        "metadata": {"name": f"{node}-policy-probe", "labels": {"nodename": other}},
        "spec": {"address": "0000:08:00.4", "enabled": False, "nodeName": other},
    }
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, (
            f"the agent's policy never {'judged' if judging else 'went'}"
        )
        try:
            agent.list_cluster_custom_object(group, version, plural)
            agent.create_cluster_custom_object(group, version, plural, probe)
        except client.ApiException as error:
            if (
                judging
                and error.status == 422
                and "may write only its own node" in (error.body or "")
            ):
                return  # read allowed, another node's write refused by the policy
        else:  # the policy does not judge: the probe got in
            served.custom.delete_cluster_custom_object(
                group, version, plural, probe["metadata"]["name"]
            )
            if not judging:
                return
        time.sleep(0.2)


def agent_mark(served: Served) -> int:
    """Where the record of requests ends now: :func:`agent_requests` ``since`` it."""
    if served.emulator is not None:
        return len(served.emulator.calls)
    assert served.real is not None
    return served.real.audit_mark()


def agent_requests(
    served: Served, since: int = 0
) -> list[tuple[str, str, str, str | None, str | None, str | None]]:
    """The node agent's requests since ``since`` (:func:`agent_mark`): (verb, group, resource,
    subresource, namespace, name), from the emulator's record or the real server's audit log."""
    if served.emulator is not None:
        from tests.agent_cluster import AGENT

        return [tuple(c.request) for c in served.emulator.calls[since:] if c.user == AGENT]  # type: ignore[misc]
    assert served.real is not None
    return served.real.requests("agent", since)


def reapply_crd(served: Served, plural: str) -> None:
    """Change the spec of the installed CRD of ``plural`` (one more category), as an
    installer re-applying a changed CRD does (Harvester's pcidevices-controller re-applies its
    own at every start): the API server rebuilds the resource's storage and watch cache
    (k8s.io/apiextensions-apiserver customresource_handler.go updateCustomResourceDefinition),
    its open watches end and a watch from an older resourceVersion is 410 Gone."""
    crd = next(c for c in served._crds if c["spec"]["names"]["plural"] == plural)
    name = f"{plural}.{crd['spec']['group']}"
    if served.emulator is not None:
        changed = yaml.safe_load(yaml.safe_dump(dict(crd)))
        names = changed["spec"]["names"]
        categories = list(names.get("categories") or [])
        names["categories"] = [*categories, f"reapplied{len(categories)}"]
        served.emulator.register_crd(changed)
        served._crds[served._crds.index(crd)] = changed
        return
    extensions = client.ApiextensionsV1Api(served.api)
    stored = extensions.read_custom_resource_definition(name)
    categories = list(stored.spec.names.categories or [])
    stored.spec.names.categories = [*categories, f"reapplied{len(categories)}"]
    extensions.replace_custom_resource_definition(name, stored)
