"""deploy/ is how vgpuctl runs in a cluster: the manifests parse, kustomize sees every one of them,
the CRDs are the canonical ones, the DaemonSet gives the code what it reads and writes (checked
through the CLI's own option parsing), and the ClusterRole grants only the recorded verbs.

``kubectl kustomize`` is run when kubectl is installed (it needs no cluster; CI installs
Debian's ``kubernetes-client`` where there is none); the rest runs without it. The optional
components (git-sync, no-node-claim) need kubectl 1.21 or newer.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from tests.doubles import jsonpatch
from tests.kustomize import IMAGE, kustomize, kustomize_with_component
from tests.rbac import Grant, grants

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAMESPACE = "vgpuctl-system"
DESIRED_CONFIGMAP = "vgpuctl-desired-state"

# The requests vgpuctl makes, as RBAC sees them: (apiGroup, resource, verb, namespace; None for
# everywhere; and the object's name where the rule names it). The RBAC recording tests check
# them against the requests recorded by the API-server emulator in a full life cycle.
EXPECTED_GRANTS = {
    *(
        Grant("devices.harvesterhci.io", resource, verb, None)
        for resource in ("sriovgpudevices", "vgpudevices")
        for verb in ("get", "list", "watch", "create", "update", "delete")
    ),
    Grant("devices.harvesterhci.io", "sriovgpudevices/status", "update", None),
    Grant("devices.harvesterhci.io", "vgpudevices/status", "update", None),
    # vgpuctl's per-node summary: never deleted (it outlives a reconcile; a node's removal is
    # the operator's to clean up).
    *(
        Grant("vgpu.reconciler.dev", "vgpunodestates", verb, None)
        for verb in ("get", "list", "watch", "create", "update")
    ),
    Grant("vgpu.reconciler.dev", "vgpunodestates/status", "update", None),
    Grant("kubevirt.io", "kubevirts", "get", None),
    Grant("kubevirt.io", "kubevirts", "list", None),
    Grant("kubevirt.io", "kubevirts", "watch", None),
    Grant("kubevirt.io", "kubevirts", "patch", None),
    Grant("kubevirt.io", "virtualmachineinstances", "list", None),
    # The agent's own Node (its labels decide which node groups configure it): get, never list.
    Grant("", "nodes", "get", None),
    # Whether Harvester's pcidevices-controller runs: one get each, by name, wherever.
    Grant("harvesterhci.io", "addons", "get", None, "pcidevices-controller"),
    Grant("apps", "daemonsets", "get", None, "harvester-pcidevices-controller"),
    Grant(
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        "get",
        None,
        "pcidevices-validator",
    ),
    Grant("", "events", "create", "default"),
    # The node agents' rollout slots (spec.rollout.maxParallel), in the agents' namespace: one
    # list per try and a create of a missing slot (neither can be limited to names), get and
    # update of the 32 slots by name.
    Grant("coordination.k8s.io", "leases", "list", NAMESPACE),
    Grant("coordination.k8s.io", "leases", "create", NAMESPACE),
    *(
        Grant("coordination.k8s.io", "leases", verb, NAMESPACE, f"vgpuctl-rollout-{i}")
        for verb in ("get", "update")
        for i in range(32)
    ),
}
# Verbs a node agent may ever hold; escalate, bind, impersonate and deletecollection are never
# needed. patch only for the KubeVirt CR (a JSON patch naming our entries); our own objects are
# written with full PUTs carrying the resourceVersion they were planned from.
ALLOWED_VERBS = {"get", "list", "watch", "create", "update", "delete"}
PATCHED = {("kubevirt.io", "kubevirts")}
AGENT = f"system:serviceaccount:{NAMESPACE}:vgpuctl"


def _docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text("utf-8")) if d is not None]
    assert all(isinstance(d, dict) for d in docs), path
    return docs


def _manifests() -> Iterator[Path]:
    yield from sorted(DEPLOY.rglob("*.yaml"))


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for path in DEPLOY.glob("*.yaml")
        for doc in _docs(path)
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


DAEMONSET = _one("DaemonSet", "vgpuctl")
POD = DAEMONSET["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]


# --- every manifest, and what kustomize builds from them ------------------------------------------


@pytest.mark.parametrize("path", list(_manifests()), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_parses(path: Path) -> None:
    docs = _docs(path)
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), path


def _typed_round_trip(doc: Mapping[str, Any]) -> Any:
    """``doc`` read into the kubernetes client's typed model and written back: a misspelled or
    misplaced field (``hostPid``, ``readonly``) is dropped on the way, so the two differ."""
    from kubernetes.client import ApiClient

    client: Any = ApiClient()
    # The client's own JSON-to-model step; its public wrapper's signature varies by release.
    model = client._ApiClient__deserialize(doc, f"V1{doc['kind']}")
    return client.sanitize_for_serialization(model)


#: Optional kustomize components: directories of their own, not in the base's resources.
COMPONENTS = ("git-sync", "no-node-claim")
#: Installs of their own, beside the base: delegate mode, and monitoring (whose kinds are the
#: Prometheus Operator's, unknown to the kubernetes client: tests/unit/test_monitoring.py).
SEPARATE = ("harvester", "monitoring")


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in _manifests()
        if p.name != "kustomization.yaml" and p.parent.name not in (*COMPONENTS, "monitoring")
    ],
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_every_field_is_one_kubernetes_knows(path: Path) -> None:
    for doc in _docs(path):
        assert _typed_round_trip(doc) == doc


def _kustomization(directory: Path) -> dict[str, Any]:
    (doc,) = _docs(directory / "kustomization.yaml")
    return doc


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    listed = _kustomization(DEPLOY)["resources"]
    on_disk = sorted(
        str(p.relative_to(DEPLOY))
        for p in _manifests()
        if p.name != "kustomization.yaml" and p.parent.name not in (*COMPONENTS, *SEPARATE)
    )
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed))


def test_the_delegate_kustomization_lists_every_manifest_of_its_directory() -> None:
    # deploy/harvester/ is its own install (kubectl apply -k deploy/harvester/), not part of
    # the node agent's.
    directory = DEPLOY / "harvester"
    listed = _kustomization(directory)["resources"]
    on_disk = sorted(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


def test_the_git_sync_component_lists_its_patches() -> None:
    component = _kustomization(DEPLOY / "git-sync")
    assert component["kind"] == "Component"
    files = sorted(p["path"] for p in component["patches"] if "path" in p)
    on_disk = sorted(p.name for p in (DEPLOY / "git-sync").glob("*.yaml"))
    assert [*files, "kustomization.yaml"] == sorted(on_disk)
    # Each patch targets an object of the base, by kind, name and namespace (a JSON patch by
    # its target, which kustomize requires).
    base = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        for p in DEPLOY.glob("*.yaml")
        if p.name != "kustomization.yaml"
        for d in _docs(p)
    }
    kinds_names = {(kind, name) for kind, name, _ in base}
    for patch in component["patches"]:
        if "path" in patch:
            (doc,) = _docs(DEPLOY / "git-sync" / patch["path"])
            meta = doc["metadata"]
            assert (doc["kind"], meta["name"], meta.get("namespace")) in base, patch
        else:
            target = patch["target"]
            assert (target["kind"], target["name"]) in kinds_names, patch


def test_deploy_crds_are_the_canonical_crds_byte_for_byte() -> None:
    canonical = {p.name: p.read_bytes() for p in (REPO / "schemas" / "crds").iterdir()}
    copies = {p.name: p.read_bytes() for p in (DEPLOY / "crds").iterdir()}
    assert sorted(copies) == sorted(canonical)
    stale = [name for name in canonical if copies[name] != canonical[name]]
    assert stale == [], f"copy schemas/crds/{stale} to deploy/crds/"


def test_namespaced_objects_are_in_the_agents_namespace() -> None:
    assert _one("Namespace")["metadata"]["name"] == NAMESPACE
    for kind in ("ServiceAccount", "ConfigMap", "DaemonSet"):
        assert _one(kind)["metadata"]["namespace"] == NAMESPACE, kind


def test_kustomize_builds_the_base() -> None:
    built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(DEPLOY)}
    assert sorted(built) == [
        ("ClusterRole", "vgpuctl"),
        ("ClusterRoleBinding", "vgpuctl"),
        ("ConfigMap", DESIRED_CONFIGMAP),
        ("CustomResourceDefinition", "sriovgpudevices.devices.harvesterhci.io"),
        ("CustomResourceDefinition", "vgpudevices.devices.harvesterhci.io"),
        ("CustomResourceDefinition", "vgpunodestates.vgpu.reconciler.dev"),
        ("DaemonSet", "vgpuctl"),
        ("Namespace", NAMESPACE),
        ("NetworkPolicy", "vgpuctl"),
        ("Role", "vgpuctl-events"),
        ("Role", "vgpuctl-rollout"),
        ("RoleBinding", "vgpuctl-events"),
        ("RoleBinding", "vgpuctl-rollout"),
        ("ServiceAccount", "vgpuctl"),
        ("ValidatingAdmissionPolicy", "vgpuctl-agent"),
        ("ValidatingAdmissionPolicyBinding", "vgpuctl-agent"),
    ]
    for path in sorted((REPO / "schemas" / "crds").iterdir()):
        (crd,) = _docs(path)
        assert built[("CustomResourceDefinition", crd["metadata"]["name"])] == crd
    (container,) = built[("DaemonSet", "vgpuctl")]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE


def test_kustomize_builds_the_git_sync_variant(tmp_path: Path) -> None:
    built = kustomize_with_component(tmp_path, "git-sync")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert ("ConfigMap", DESIRED_CONFIGMAP) not in kinds
    (ds,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert sorted(containers) == ["git-sync", "vgpuctl"]
    assert [c["name"] for c in pod["initContainers"]] == ["git-sync-init"]
    assert "--one-time" in pod["initContainers"][0]["args"]
    assert _typed_round_trip(ds) == ds
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["desired-state"] == {"name": "desired-state", "emptyDir": {}}
    # vgpuctl reads the checkout git-sync publishes, through the same volume; the rest of its
    # arguments are the base's (tests/security/test_git_sync_component.py).
    vgpuctl = containers["vgpuctl"]
    assert [*vgpuctl["args"][:1], *vgpuctl["args"][2:]] == [
        *CONTAINER["args"][:1],
        *CONTAINER["args"][2:],
    ]
    watched = PurePosixPath(vgpuctl["args"][1])
    mount = next(m for m in vgpuctl["volumeMounts"] if m["name"] == "desired-state")
    assert watched.is_relative_to(mount["mountPath"]) and mount["readOnly"]
    # git-sync needs no privilege.
    for c in [containers["git-sync"], *pod["initContainers"]]:
        ctx = c["securityContext"]
        assert ctx["runAsNonRoot"] and not ctx["allowPrivilegeEscalation"], c["name"]
        assert not ctx.get("privileged")
        assert c["envFrom"][0]["configMapRef"]["name"].startswith("vgpuctl-git-sync")


# --- the DaemonSet gives the code what it needs ---------------------------------------------------


def _env() -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in CONTAINER["env"]}


def _host_path(container_path: Path | str) -> tuple[str, bool]:
    """Where a path in the container lives on the host (via a hostPath volume), and whether
    the container can write there."""
    path = PurePosixPath(container_path)
    mounts = [m for m in CONTAINER["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mounts, f"{path} is not mounted"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in POD["volumes"] if v["name"] == mount["name"]]
    assert "hostPath" in volume, f"{path} is not on the host"
    host = PurePosixPath(volume["hostPath"]["path"]) / path.relative_to(mount["mountPath"])
    return str(host), not mount.get("readOnly", False)


@pytest.fixture
def options(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI's global options as the container's environment sets them."""
    from reconciler.cli.options import GlobalOptions, add_global_options

    for name in list(os.environ):
        if name.startswith("VGPUCTL_") or name in ("NODE_NAME", "NO_COLOR"):
            monkeypatch.delenv(name)
    for name, value in _env().items():
        if isinstance(value, Mapping):
            # The downward API: the kubelet fills in the pod's node.
            assert value == {"fieldRef": {"fieldPath": "spec.nodeName"}}, name
        monkeypatch.setenv(name, "node-a" if isinstance(value, Mapping) else value)
    parser = argparse.ArgumentParser()
    add_global_options(parser, suppress=False)
    return GlobalOptions.from_namespace(parser.parse_args([]))


def test_node_name_comes_from_the_downward_api(options: Any) -> None:
    assert _env()["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert options.node == "node-a"


def test_the_hosts_sysfs_is_writable_where_vgpuctl_looks(options: Any) -> None:
    assert _host_path(options.sysfs_root) == ("/sys", True)


def test_state_dir_is_on_the_host_and_writable(options: Any) -> None:
    # On the host, so the lock is shared with an operator's `vgpuctl apply` on the node and the
    # journal survives the pod.
    assert options.state_dir is not None
    assert _host_path(options.state_dir) == ("/var/lib/vgpuctl", True)


def test_kubelet_checkpoint_and_device_plugin_dir_are_the_hosts(options: Any) -> None:
    assert options.kubelet_dir is not None  # set, not left to the default
    plugins = options.kubelet_dir / "device-plugins"
    assert _host_path(plugins) == ("/var/lib/kubelet/device-plugins", True)
    checkpoint = plugins / "kubelet_internal_checkpoint"
    # The whole directory is mounted, not the file: the kubelet replaces the file by rename.
    assert (
        _host_path(checkpoint)[0] == "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )
    assert all(m["mountPath"] != str(checkpoint) for m in CONTAINER["volumeMounts"])


def test_sriov_manage_runs_inside_the_hosts_root(options: Any) -> None:
    argv = shlex.split(options.sriov_manage)
    assert argv == ["chroot", "/host", "/usr/lib/nvidia/sriov-manage"]
    # The host's root, read-only: sriov-manage writes only under /host/sys, which is the host's
    # own (writable) sysfs mount.
    assert _host_path(argv[1]) == ("/", False)


def test_every_vgpuctl_variable_is_one_the_cli_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.cli.options import GlobalOptions, add_global_options

    parser = argparse.ArgumentParser()
    add_global_options(parser, suppress=False)
    names = [n for n in _env() if n.startswith("VGPUCTL_")]
    assert names
    for name in names:
        monkeypatch.setenv(name, "/probe/value")
        opts = GlobalOptions.from_namespace(parser.parse_args([]))
        monkeypatch.delenv(name)
        assert "/probe/value" in repr(opts), f"the CLI does not read {name}"


def test_the_desired_state_configmap_is_what_watch_reads() -> None:
    assert CONTAINER["command"] == ["vgpuctl"]
    assert CONTAINER["args"][:2] == ["watch", "/etc/vgpuctl/desired-state"]
    assert not {"sh", "bash", "-c"} & {PurePosixPath(a).name for a in CONTAINER["args"]}
    (mount,) = [m for m in CONTAINER["volumeMounts"] if m["mountPath"] == CONTAINER["args"][1]]
    assert mount["readOnly"]
    (volume,) = [v for v in POD["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == DESIRED_CONFIGMAP
    assert _one("ConfigMap", DESIRED_CONFIGMAP)["metadata"]["namespace"] == NAMESPACE


def test_the_example_desired_state_is_the_seeds_and_valid(tmp_path: Path) -> None:
    data = _one("ConfigMap", DESIRED_CONFIGMAP)["data"]
    seed_file = REPO / "desired-state" / "harvester-kgd9c.yaml"
    assert yaml.safe_load(data["harvester-kgd9c.yaml"]) == yaml.safe_load(seed_file.read_text())
    for key, text in data.items():
        (tmp_path / key).write_text(text, "utf-8")
    desired = load_desired(sorted(tmp_path.iterdir()), catalog=default_catalog())
    assert sorted(desired.nodes) == ["harvester-kgd9c"]


def test_the_agent_is_privileged_and_sees_host_processes() -> None:
    ctx = CONTAINER["securityContext"]
    assert ctx["privileged"] is True
    assert ctx["runAsUser"] == 0
    # The in-use probe (observe/holds.py) reads /proc/*/fd of QEMU processes on the host.
    assert POD["hostPID"] is True
    assert not POD.get("hostNetwork", False)
    assert ctx["readOnlyRootFilesystem"] is True
    # /tmp (the root filesystem is read-only) is the pod's own, never the host's.
    (tmp,) = [v for v in POD["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp


def test_the_agent_runs_as_the_service_account_with_the_placeholder_image() -> None:
    sa = _one("ServiceAccount")
    assert POD["serviceAccountName"] == sa["metadata"]["name"]
    assert POD.get("automountServiceAccountToken", True) is True
    assert CONTAINER["image"] == IMAGE
    assert CONTAINER["resources"]["requests"]
    selector = DAEMONSET["spec"]["selector"]["matchLabels"]
    labels = DAEMONSET["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


# --- RBAC -----------------------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for kind in ("ClusterRole", "Role")
        for path in DEPLOY.glob("*.yaml")
        for doc in _docs(path)
        if doc["kind"] == kind
        for rule in doc["rules"]
    ]


def test_the_roles_grant_exactly_the_recorded_requests() -> None:
    assert grants(DEPLOY / "rbac.yaml") == EXPECTED_GRANTS


def test_the_slots_granted_by_name_are_the_slots_the_code_uses() -> None:
    from reconciler.apply.slots import MAX_SLOTS, slot_name

    named = {g.name for g in grants(DEPLOY / "rbac.yaml") if g.resource == "leases" and g.name}
    assert named == {slot_name(i) for i in range(MAX_SLOTS)}
    # The admission policy's pattern of the names an agent may write admits exactly those.
    policy = (DEPLOY / "admission-policy.yaml").read_text("utf-8")
    (pattern,) = re.findall(r"request\.name\.matches\('([^']*)'\)", policy)
    admitted = {
        f"vgpuctl-rollout-{i}" for i in range(100) if re.fullmatch(pattern, f"vgpuctl-rollout-{i}")
    }
    assert admitted == named
    assert not re.fullmatch(pattern, "vgpuctl-rollout-01")


def test_the_roles_have_no_wildcards_and_no_dangerous_verbs() -> None:
    for rule in _rules():
        values = [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
        assert not any("*" in v for v in values), rule
        patched = {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
        allowed = ALLOWED_VERBS | ({"patch"} if patched <= PATCHED else set())
        assert set(rule["verbs"]) <= allowed, rule
        assert "nonResourceURLs" not in rule


def test_no_access_to_pods_or_secrets_and_events_only_in_their_namespace() -> None:
    granted = grants(DEPLOY / "rbac.yaml")
    assert not [g for g in granted if g.resource in ("pods", "secrets", "configmaps")]
    assert {g.namespace for g in granted if g.resource == "events"} == {"default"}


def test_the_bindings_give_the_roles_to_the_service_account() -> None:
    sa = _one("ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    binding = _one("ClusterRoleBinding", "vgpuctl")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": _one("ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [subject]
    events = _one("RoleBinding", "vgpuctl-events")
    role = _one("Role", "vgpuctl-events")
    assert events["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert events["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert events["subjects"] == [subject]


def test_events_are_allowed_where_the_recorder_writes_them() -> None:
    from reconciler.kube import EVENT_NAMESPACE

    assert _one("Role", "vgpuctl-events")["metadata"]["namespace"] == EVENT_NAMESPACE


def test_the_reads_of_harvesters_controller_are_gets_of_the_names_the_code_reads() -> None:
    """Only ``get`` (``list`` cannot be limited by name), only of the objects
    ``observe/harvester.py`` reads, and from the ClusterRole: no Role in ``harvester-system``,
    a namespace a cluster without Harvester does not have."""
    from reconciler.observe.harvester import READS

    read = {(r.group, r.plural, r.name) for r in READS}
    assert len(read) == 3
    rules = [
        rule
        for rule in _rules()
        if any((g, res) in {(r[0], r[1]) for r in read} for g in rule["apiGroups"]
               for res in rule["resources"])
    ]  # fmt: skip
    assert rules
    for rule in rules:
        assert rule["verbs"] == ["get"], rule
        assert rule.get("resourceNames"), rule
    granted = {(g.group, g.resource, g.name) for g in grants(DEPLOY / "rbac.yaml")}
    assert read <= granted
    assert not [
        d for p in DEPLOY.glob("*.yaml") for d in _docs(p)
        if (d.get("metadata") or {}).get("namespace") == "harvester-system"
    ]  # fmt: skip


# --- the admission policy ----------------------------------------------------------------------


def test_the_admission_policy_applies_to_the_agents_service_account_only() -> None:
    policy = _one("ValidatingAdmissionPolicy", "vgpuctl-agent")
    sa = _one("ServiceAccount")
    assert f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}" == AGENT
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{AGENT}'"
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = _one("ValidatingAdmissionPolicyBinding", "vgpuctl-agent")
    assert binding["spec"] == {"policyName": "vgpuctl-agent", "validationActions": ["Deny"]}


def test_the_admission_policy_covers_every_write_the_role_grants() -> None:
    """Every resource the agent may write is matched by the policy, for every operation."""
    rules = _one("ValidatingAdmissionPolicy", "vgpuctl-agent")["spec"]["matchConstraints"][
        "resourceRules"
    ]
    matched = {
        (group, resource, operation)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for operation in rule["operations"]
    }
    operations = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
    for g in grants(DEPLOY / "rbac.yaml"):
        if g.verb not in operations or g.resource == "events":
            continue
        for operation in ("CREATE", "UPDATE", "DELETE"):
            assert (g.group, g.resource, operation) in matched, (g, operation)


def test_the_annotation_the_policy_allows_is_vgpuctls() -> None:
    from reconciler.model.cluster import (
        KUBEVIRT_OWNED_ANNOTATION,
        KUBEVIRT_OWNED_PCI_ANNOTATION,
        NODE_LABEL,
    )

    text = (DEPLOY / "admission-policy.yaml").read_text("utf-8")
    # Twice in the annotations it may change, four times where the owned names are read.
    assert text.count(f"'{KUBEVIRT_OWNED_ANNOTATION}'") == 6
    assert text.count(f"'{KUBEVIRT_OWNED_PCI_ANNOTATION}'") == 6
    assert f"'{NODE_LABEL}' in object.metadata.labels" in text


def _no_node_claim_patch() -> list[dict[str, Any]]:
    (patch,) = _kustomization(DEPLOY / "no-node-claim")["patches"]
    assert patch["target"] == {
        "group": "admissionregistration.k8s.io",
        "version": "v1",
        "kind": "ValidatingAdmissionPolicy",
        "name": "vgpuctl-agent",
    }
    ops: list[dict[str, Any]] = yaml.safe_load(patch["patch"])
    return ops


def test_the_no_node_claim_component_removes_only_the_claim_requirement() -> None:
    policy = _one("ValidatingAdmissionPolicy", "vgpuctl-agent")
    patched = jsonpatch.apply(policy, _no_node_claim_patch())
    before, after = policy["spec"]["validations"], patched["spec"]["validations"]
    assert after == before[:-1]
    assert before[-1]["expression"] == "variables.kubevirt || size(variables.claim) > 0"


def test_kustomize_builds_the_no_node_claim_variant(tmp_path: Path) -> None:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "resources: [../deploy]\ncomponents: [../deploy/no-node-claim]\n", "utf-8"
    )
    built = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(overlay)}
    policy = built[("ValidatingAdmissionPolicy", "vgpuctl-agent")]
    assert policy == jsonpatch.apply(
        _one("ValidatingAdmissionPolicy", "vgpuctl-agent"), _no_node_claim_patch()
    )


def test_the_probes_reach_the_watch_endpoint() -> None:
    """watch listens on the pod IP at the port the probes name; the args parse as the CLI's."""
    from reconciler.cli.main import build_parser

    ns = build_parser().parse_args(CONTAINER["args"])
    host, port = ns.listen.rsplit(":", 1)
    assert host == "0.0.0.0"  # noqa: S104 (the pod IP, so the kubelet can probe it)
    (named,) = [p for p in CONTAINER["ports"] if p["name"] == "metrics"]
    assert named["containerPort"] == int(port)
    assert CONTAINER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert CONTAINER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


# --- the NetworkPolicy: who may reach the operations endpoint -------------------------------------

NETWORK_POLICY = _one("NetworkPolicy", "vgpuctl")
POD_LABELS = DAEMONSET["spec"]["template"]["metadata"]["labels"]
#: The labels the Prometheus Operator puts on every Prometheus pod (pkg/prometheus/server/
#: statefulset.go: podSelectorLabels), for rancher-monitoring's Prometheus.
PROMETHEUS_POD = {
    "app.kubernetes.io/name": "prometheus",
    "app.kubernetes.io/managed-by": "prometheus-operator",
    "app.kubernetes.io/instance": "rancher-monitoring-prometheus",
    "prometheus": "rancher-monitoring-prometheus",
    "operator.prometheus.io/name": "rancher-monitoring-prometheus",
    "operator.prometheus.io/shard": "0",
}
#: Every namespace carries its name as this label (set by the API server since 1.22).
MONITORING_NAMESPACE = {"kubernetes.io/metadata.name": "cattle-monitoring-system"}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels, as the API defines it (an empty selector selects all)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]:
            return False
    return True


def _container_port(port: int | str) -> int:
    """A NetworkPolicy port (a number or a container port's name) as the agent's port number."""
    if isinstance(port, int):
        return port
    (named,) = [p for p in CONTAINER["ports"] if p["name"] == port]
    return int(named["containerPort"])


def _ingress_allowed(
    namespace_labels: Mapping[str, str], pod_labels: Mapping[str, str], port: int
) -> bool:
    """Whether the policy lets a pod (in a namespace with ``namespace_labels``) connect to the
    agent's TCP ``port``; the pod's own namespace is ``vgpuctl-system`` when its labels say so."""
    same_namespace = namespace_labels.get("kubernetes.io/metadata.name") == NAMESPACE
    for rule in NETWORK_POLICY["spec"].get("ingress", []):
        ports = rule.get("ports")
        if ports is not None and not any(
            p.get("protocol", "TCP") == "TCP" and _container_port(p["port"]) == port for p in ports
        ):
            continue
        peers = rule.get("from")
        if peers is None:
            return True
        for peer in peers:
            assert "ipBlock" not in peer  # pods only: the node is allowed by NetworkPolicy itself
            ns_ok = (
                _selects(peer["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in peer
                else same_namespace
            )
            if ns_ok and _selects(peer.get("podSelector", {}), pod_labels):
                return True
    return False


def _endpoint_port() -> int:
    from reconciler.cli.main import build_parser

    return int(build_parser().parse_args(CONTAINER["args"]).listen.rsplit(":", 1)[1])


def test_the_network_policy_covers_the_agents_pods_and_nothing_else_in_the_namespace() -> None:
    assert NETWORK_POLICY["metadata"]["namespace"] == NAMESPACE
    selector = NETWORK_POLICY["spec"]["podSelector"]
    assert _selects(selector, POD_LABELS)
    assert selector == DAEMONSET["spec"]["selector"]  # the DaemonSet's own pods, exactly
    assert not _selects(selector, {"app.kubernetes.io/name": "something-else"})


def test_prometheus_may_scrape_the_endpoint_and_nobody_else_may_connect() -> None:
    port = _endpoint_port()
    assert _ingress_allowed(MONITORING_NAMESPACE, PROMETHEUS_POD, port)
    # Not on another port of the pod, not Prometheus in another namespace, not another pod
    # of the monitoring namespace, not the agent's own neighbours, not anyone in kube-system.
    assert not _ingress_allowed(MONITORING_NAMESPACE, PROMETHEUS_POD, port + 1)
    default = {"kubernetes.io/metadata.name": "default"}
    assert not _ingress_allowed(default, PROMETHEUS_POD, port)
    grafana = {"app.kubernetes.io/name": "grafana"}
    assert not _ingress_allowed(MONITORING_NAMESPACE, grafana, port)
    own = {"kubernetes.io/metadata.name": NAMESPACE}
    assert not _ingress_allowed(own, {"app": "debug"}, port)
    kube_system = {"kubernetes.io/metadata.name": "kube-system"}
    assert not _ingress_allowed(kube_system, {"k8s-app": "kube-dns"}, port)


def test_the_policy_restricts_ingress_only_and_names_the_probed_port() -> None:
    spec = NETWORK_POLICY["spec"]
    # Egress stays open: the API server and git-sync's repository are cluster-specific
    # addresses (deploy/README.md).
    assert spec["policyTypes"] == ["Ingress"]
    assert "egress" not in spec
    (rule,) = spec["ingress"]
    assert [_container_port(p["port"]) for p in rule["ports"]] == [_endpoint_port()]
    # The probes go to the same port (allowed from the node by NetworkPolicy itself).
    assert CONTAINER["livenessProbe"]["httpGet"]["port"] == rule["ports"][0]["port"]
    assert CONTAINER["readinessProbe"]["httpGet"]["port"] == rule["ports"][0]["port"]
