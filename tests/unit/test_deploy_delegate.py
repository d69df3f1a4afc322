"""deploy/harvester/ runs ``vgpuctl watch --delegate harvester`` (docs/delegate.md): a Deployment
that needs nothing privileged (Pod Security "restricted", which its namespace enforces), whose
arguments parse as the CLI's own, whose Lease is the one its Role names, and whose desired state
is the node agent's example. Expectations from the Pod Security Standards' "restricted" profile
(kubernetes.io/docs/concepts/security/pod-security-standards) and the code's defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from reconciler.cli.main import build_parser
from tests.kustomize import IMAGE, kustomize
from tests.rbac import DELEGATE_ACCOUNT, DELEGATE_RBAC, Grant, grants

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
HARVESTER = DEPLOY / "harvester"


def _one(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text("utf-8")) if d and d["kind"] == kind]
    return dict(doc)


DEPLOYMENT = _one(HARVESTER / "deployment.yaml", "Deployment")
POD = DEPLOYMENT["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]


def test_two_replicas_under_the_delegate_account_in_its_namespace() -> None:
    assert DEPLOYMENT["spec"]["replicas"] == 2
    assert DEPLOYMENT["metadata"]["namespace"] == DELEGATE_ACCOUNT["namespace"]
    assert POD["serviceAccountName"] == DELEGATE_ACCOUNT["name"]
    namespace = _one(HARVESTER / "namespace.yaml", "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_nothing_privileged_no_host_access_as_restricted_requires() -> None:
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        assert not POD.get(key), key
    assert all("hostPath" not in v for v in POD["volumes"])
    assert POD["securityContext"]["runAsNonRoot"] is True
    assert POD["securityContext"]["runAsUser"] != 0
    assert POD["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = CONTAINER["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert "privileged" not in context
    assert all("hostPort" not in p for p in CONTAINER["ports"])


def test_the_args_are_watch_in_delegate_mode_and_the_probes_reach_its_endpoint() -> None:
    ns = build_parser().parse_args(CONTAINER["args"])
    assert ns.command == "watch"
    assert ns.delegate == "harvester"
    host, port = ns.listen.rsplit(":", 1)
    assert host == "0.0.0.0"  # noqa: S104 (the pod IP, so the kubelet can probe it)
    (named,) = [p for p in CONTAINER["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == int(port)
    assert CONTAINER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert CONTAINER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    (mount,) = [m for m in CONTAINER["volumeMounts"] if m["name"] == "desired-state"]
    assert ns.path == mount["mountPath"] and mount["readOnly"] is True


def test_the_lease_is_the_one_the_role_lets_it_update() -> None:
    """The CLI's defaults (name; namespace from POD_NAMESPACE) against the Role's grants."""
    ns = build_parser().parse_args(CONTAINER["args"])
    env = {e["name"]: e.get("valueFrom") for e in CONTAINER["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert ns.lease_namespace is None  # so POD_NAMESPACE: the Deployment's namespace
    namespace = DEPLOYMENT["metadata"]["namespace"]
    granted = grants(DELEGATE_RBAC, DELEGATE_ACCOUNT)
    lease = ("coordination.k8s.io", "leases")
    assert {g for g in granted if (g.group, g.resource) == lease} == {
        Grant(*lease, "create", namespace),
        Grant(*lease, "get", namespace, ns.lease_name),
        Grant(*lease, "update", namespace, ns.lease_name),
    }


def test_the_node_agent_never_turns_into_a_delegate_candidate() -> None:
    daemonset = _one(DEPLOY / "daemonset.yaml", "DaemonSet")
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(agent["args"]).delegate == "none"


def test_the_example_desired_state_is_the_node_agents() -> None:
    ours = _one(HARVESTER / "configmap.yaml", "ConfigMap")
    agents = _one(DEPLOY / "configmap.yaml", "ConfigMap")
    assert ours["data"] == agents["data"]
    assert ours["metadata"]["namespace"] == DEPLOYMENT["metadata"]["namespace"]
    (volume,) = [v for v in POD["volumes"] if v["name"] == "desired-state"]
    assert volume["configMap"]["name"] == ours["metadata"]["name"]


def test_pods_are_only_listed_and_only_where_the_driver_pods_run() -> None:
    """The NVIDIA driver pods pcidevices-controller follows are in harvester-system
    (pcidevices v1beta1 ``DefaultNamespace``): the role lists pods there, nowhere else, and
    reads no single pod, nor their logs or exec."""
    granted = grants(DELEGATE_RBAC, DELEGATE_ACCOUNT)
    assert {g for g in granted if g.group == "" and g.resource.startswith("pods")} == {
        Grant("", "pods", "list", "harvester-system")
    }


def test_kustomize_builds_the_delegate_install() -> None:
    built = {(d["kind"], d["metadata"]["name"]) for d in kustomize(HARVESTER)}
    assert built == {
        ("Namespace", "vgpuctl-delegate"),
        ("ServiceAccount", "vgpuctl-delegate"),
        ("ClusterRole", "vgpuctl-delegate"),
        ("ClusterRoleBinding", "vgpuctl-delegate"),
        ("Role", "vgpuctl-delegate-lease"),
        ("RoleBinding", "vgpuctl-delegate-lease"),
        ("Role", "vgpuctl-delegate-events"),
        ("RoleBinding", "vgpuctl-delegate-events"),
        ("Role", "vgpuctl-delegate-driver-pods"),
        ("RoleBinding", "vgpuctl-delegate-driver-pods"),
        ("ConfigMap", "vgpuctl-desired-state"),
        ("Deployment", "vgpuctl-delegate"),
        ("NetworkPolicy", "vgpuctl-delegate"),
    }
    assert CONTAINER["image"] == IMAGE


def test_only_prometheus_reaches_the_replicas_and_the_policy_covers_them() -> None:
    """The node agent's rule (deploy/networkpolicy.yaml) for the delegate pods: one peer, both
    selectors (Prometheus pods in the monitoring namespace), on the port the probes use."""
    policy = _one(HARVESTER / "networkpolicy.yaml", "NetworkPolicy")
    agents = _one(DEPLOY / "networkpolicy.yaml", "NetworkPolicy")
    assert policy["metadata"]["namespace"] == DEPLOYMENT["metadata"]["namespace"]
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == labels
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == agents["spec"]["ingress"]
    (rule,) = policy["spec"]["ingress"]
    (port,) = rule["ports"]
    assert port["port"] in [p["name"] for p in CONTAINER["ports"]]
