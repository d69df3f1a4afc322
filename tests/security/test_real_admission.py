"""deploy/'s ValidatingAdmissionPolicy judged by the real API server's CEL and by the emulator's
model of it (cel-python, tests/doubles/admission.py): the same test against each (the
``api_server`` fixture; the real one is ``just test-real``).

The agent's identity on the real server is its service account's token bound to a pod on its
node (a TokenRequest, as the kubelet makes for the pod's projected volume), which carries the
node's name in the user's extra; on the emulator, ``tests/agent_cluster.py``'s ``agent()``.

The attacks of tests/security/test_cluster_privilege.py (emulator-only there) run here on both
servers with the same expected outcome: whole-object writes and JSON patches of the KubeVirt CR
beyond its allow-lists, entries vgpuctl never writes (someone else's changed in place, another
vendor's, an internal provider's), a KubeVirt CR created or deleted (with the agent's role
widened, so the policy is what refuses), every write to another node's SRIOVGPUDevice,
VGPUDevice and VGPUNodeState, vgpuctl run as another node with this node's token, a token
without the node claim (the real server's static token has no extra) and the no-node-claim
fallback (deploy/no-node-claim/, installed and put back); and what must go through: the
agent's own allow-list patch, a vfio profile as a pciHostDevice, the retiring marks, other
users' writes. Kube-apiserver v1.37.2's CEL and cel-python's model agreed on every case.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from reconciler.kube import connect
from reconciler.model import ClusterError
from tests import rbac
from tests.agent_cluster import AGENT, KV_NS, POLICY_KINDS, agent, shipped
from tests.agent_cluster import kubevirt as agent_kubevirt
from tests.api_servers import (
    Served,
    agent_pod_token,
    create_ignoring_conflict,
    harvester_cluster,
    install_rbac,
    node_of,
)
from tests.cluster_node import ClusterNode
from tests.doubles.admission import UserInfo
from tests.real_apiserver import IDENTITIES, RealApiServer
from tests.simnode import NODE, SEED, make_sim

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
OTHER = "harvester-other"
POLICY = next(d for d in shipped(POLICY_KINDS) if d["kind"] == "ValidatingAdmissionPolicy")
#: The policy's own message for a write to another node's objects.
NOT_YOURS = next(
    v["message"] for v in POLICY["spec"]["validations"] if "own node's objects" in v["message"]
)
PERMITTED_KEY = "permittedHostDevices"
ADMIN = UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated"))
HARVESTER = UserInfo("system:serviceaccount:harvester-system:harvester")
# The client is only partly typed: its untyped entry points are used as Any
new_client_from_config: Any = config.new_client_from_config


def other_nodes_vgpu(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VGPUDevice",
        "metadata": {"name": name, "labels": {"nodename": OTHER}},
        "spec": {"address": "0000:08:00.4", "enabled": False, "nodeName": OTHER},
    }


def refused(name: str) -> str:
    """The API server's words for the policy's denial (k8s.io/apiserver
    admission/plugin/policy/validating/dispatcher.go: "is forbidden" on the resource)."""
    return (
        f'vgpudevices.devices.harvesterhci.io "{name}" is forbidden: ValidatingAdmissionPolicy '
        f"'vgpuctl-agent' with binding 'vgpuctl-agent' denied request: {NOT_YOURS}"
    )


#: The real servers this module put deploy/'s policy on (one per process).
_POLICED: list[RealApiServer] = []


@pytest.fixture(scope="module", autouse=True)
def _policy_removed_after_the_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The real server is shared by every test of the process: this module's policy, and the
    binding giving Harvester's account cluster-admin, go when it ends, so a later module's agent
    (the static token: no node claim) is not refused its device objects."""
    yield
    for server in _POLICED:
        _unpolice(server, tmp_path_factory.mktemp("unpoliced"))
    _POLICED.clear()


def _unpolice(server: RealApiServer, directory: Path) -> None:
    """deploy/'s policy and binding, and Harvester's test binding, deleted; waits until the
    agent's static token may create its own node's VGPUDevice again."""
    api = new_client_from_config(config_file=str(server.kubeconfig(directory / "admin")))
    agent_api = new_client_from_config(
        config_file=str(server.kubeconfig(directory / "agent", "agent"))
    )
    try:
        admission = client.AdmissionregistrationV1Api(api)
        for delete, name in (
            (admission.delete_validating_admission_policy_binding, "vgpuctl-agent"),
            (admission.delete_validating_admission_policy, "vgpuctl-agent"),
            (
                client.RbacAuthorizationV1Api(api).delete_cluster_role_binding,
                "vgpuctl-test-harvester",
            ),
        ):
            try:
                delete(name)
            except client.ApiException as error:
                if error.status != 404:
                    raise
        probe = node_object("vgpudevices", name=f"{NODE}-unpoliced", node=NODE)
        custom = client.CustomObjectsApi(agent_api)

        def admitted() -> bool:
            try:
                custom.create_cluster_custom_object(GROUP, VERSION, "vgpudevices", probe)
            except client.ApiException as error:
                if NO_CLAIM not in (error.body or ""):
                    raise
                return False
            client.CustomObjectsApi(api).delete_cluster_custom_object(
                GROUP, VERSION, "vgpudevices", probe["metadata"]["name"]
            )
            return True

        wait_until(admitted, "the policy never went")
    finally:
        api.close()
        agent_api.close()


def policed(served: Served, tmp_path: Path) -> Path:
    """deploy/'s RBAC and admission policy in force; the agent's kubeconfig for ``NODE``."""
    harvester_cluster(served)
    if served.emulator is not None:
        for doc in shipped(POLICY_KINDS):
            served.emulator.seed(doc)
        granted = rbac.grants()
        served.emulator.authorize_with(
            lambda request, user: user.username != AGENT or rbac.allows(granted, request)
        )
        return served.emulator.kubeconfig(tmp_path / "agent", user=agent(NODE))
    assert served.real is not None
    if served.real not in _POLICED:
        _POLICED.append(served.real)
    install_rbac(served, rbac.RBAC)
    admission = client.AdmissionregistrationV1Api(served.api)
    policy, binding = shipped(POLICY_KINDS)
    create_ignoring_conflict(admission.create_validating_admission_policy, policy)
    create_ignoring_conflict(admission.create_validating_admission_policy_binding, binding)
    path = served.real.kubeconfig(tmp_path / "agent", "agent", token=agent_pod_token(served, NODE))
    # The API server loads a new policy from its informer: until it judges, a probe gets in.
    api = new_client_from_config(config_file=str(path))
    try:
        probe = other_nodes_vgpu(f"{OTHER}-probe")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.CustomObjectsApi(api).create_cluster_custom_object(
                    GROUP, VERSION, "vgpudevices", probe
                )
            except client.ApiException as error:
                if NOT_YOURS in (error.body or ""):
                    return path
                if time.monotonic() > deadline:
                    raise
            else:
                served.custom.delete_cluster_custom_object(
                    GROUP, VERSION, "vgpudevices", probe["metadata"]["name"]
                )
            assert time.monotonic() < deadline, "the admission policy never judged"
            time.sleep(0.2)
    finally:
        api.close()


def test_the_policy_refuses_the_agent_another_nodes_objects(
    tmp_path: Path, api_server: Served
) -> None:
    kubeconfig = policed(api_server, tmp_path)
    theirs = api_server.custom.create_cluster_custom_object(
        GROUP, VERSION, "vgpudevices", other_nodes_vgpu(f"{OTHER}-000008004")
    )
    name = theirs["metadata"]["name"]
    api = new_client_from_config(config_file=str(kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        edited = {**theirs, "spec": {**theirs["spec"], "enabled": True}}
        attempts = {
            "create": lambda: custom.create_cluster_custom_object(
                GROUP, VERSION, "vgpudevices", other_nodes_vgpu(f"{OTHER}-000008005")
            ),
            "update": lambda: custom.replace_cluster_custom_object(
                GROUP, VERSION, "vgpudevices", name, edited
            ),
            "delete": lambda: custom.delete_cluster_custom_object(
                GROUP, VERSION, "vgpudevices", name
            ),
        }
        for what, attempt in attempts.items():
            with pytest.raises(client.ApiException) as caught:
                attempt()
            denied = yaml.safe_load(caught.value.body)
            wanted = f"{OTHER}-000008005" if what == "create" else name
            # A validation without a reason: Invalid (ValidatingAdmissionPolicy's API
            # reference: "If not set, StatusReasonInvalid is used").
            assert (caught.value.status, denied["reason"]) == (422, "Invalid"), what
            assert denied["message"] == refused(wanted), what
    finally:
        api.close()
    listed = api_server.custom.list_cluster_custom_object(GROUP, VERSION, "vgpudevices")
    assert [o["metadata"]["name"] for o in listed["items"]] == [name]


def test_the_agent_applies_its_own_node_under_the_policy(
    tmp_path: Path, api_server: Served
) -> None:
    """vgpuctl's own writes (its node's objects, the KubeVirt allow-list by JSON patch) pass
    the policy's CEL: the seed converges and re-plans to nothing."""
    node = node_of(tmp_path, api_server)
    node.kubeconfig = policed(api_server, tmp_path)
    assert "Converged" in node.ok("apply", SEED, "--yes").stdout
    again = node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


# -- the attacks of tests/security/test_cluster_privilege.py, on both servers --------------------

KV = {"group": "kubevirt.io", "version": "v1", "plural": "kubevirts", "namespace": KV_NS}
NODE_STATES = ("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates")
PERMITTED = "/spec/configuration/permittedHostDevices"
#: The policy's words (deploy/admission-policy.yaml), each as the API server's message begins
#: it (vgpuctl's adapter quotes at most 300 characters of a message).
BEYOND = "the vgpuctl agent may change only"
CR_LIFE = "the vgpuctl agent may not create or delete a KubeVirt CR"
NO_CLAIM = "carries no authentication.kubernetes.io/node-name claim"
WIDENED = "vgpuctl-test-widened"


def denied_by_policy(message: str, what: str) -> bool:
    """Whether ``message`` is the API server's denial by deploy/'s policy with ``what`` in it."""
    marker = "ValidatingAdmissionPolicy 'vgpuctl-agent' with binding 'vgpuctl-agent' denied "
    return marker in message and what in message


def stored_kubevirt(served: Served) -> dict[str, Any]:
    found: dict[str, Any] = served.custom.get_namespaced_custom_object(
        "kubevirt.io", "v1", KV_NS, "kubevirts", "kubevirt"
    )
    return found


def kubevirt_view(served: Served) -> dict[str, Any]:
    """The stored CR without what the server changes on every write (resourceVersion,
    generation, managedFields): what an attack must leave as it was."""
    found = copy.deepcopy(stored_kubevirt(served))
    for key in ("resourceVersion", "generation", "managedFields"):
        found["metadata"].pop(key, None)
    return found


def richer_kubevirt(served: Served) -> None:
    """The KubeVirt CR as tests/agent_cluster.py's ``kubevirt()`` has it (an image registry and
    tag, feature gates, KubeVirt's own annotation), written over the one harvester_cluster
    made, as the admin."""
    current = stored_kubevirt(served)
    wanted = agent_kubevirt()
    current["metadata"]["annotations"] = wanted["metadata"]["annotations"]
    current["spec"] = wanted["spec"]
    served.custom.replace_namespaced_custom_object(
        "kubevirt.io", "v1", KV_NS, "kubevirts", "kubevirt", current
    )


@contextmanager
def as_kubeconfig(path: Path) -> Iterator[Any]:
    """vgpuctl's own cluster adapter (reconciler/kube) with that kubeconfig's identity."""
    with connect(path, timeout=10) as api:
        yield api


def static_agent(served: Served, tmp_path: Path) -> Path:
    """The agent's identity without the node claim: on the real server its static token (the
    token file gives a user no extra), on the emulator ``agent(None)``."""
    if served.emulator is not None:
        return served.emulator.kubeconfig(tmp_path / "static", user=agent(None))
    assert served.real is not None
    return served.real.kubeconfig(tmp_path / "static", "agent")


def wait_until(probe: Any, what: str, timeout: float = 60) -> None:
    """Poll ``probe()`` until true: the real server's RBAC authorizer and policy plugin load
    new objects from their informers a moment after the write."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def agent_may(served: Served, verb: str) -> bool:
    """Whether the agent's account may ``verb`` the KubeVirt CR, as the real server's
    authorizer answers a SubjectAccessReview."""
    user, groups = IDENTITIES["agent"]
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=list(groups),
            resource_attributes=client.V1ResourceAttributes(
                group="kubevirt.io", resource="kubevirts", verb=verb, namespace=KV_NS
            ),
        )
    )
    answer = client.AuthorizationV1Api(served.api).create_subject_access_review(review)
    return bool(answer.status.allowed)


@contextmanager
def widened_rbac(served: Served) -> Iterator[None]:
    """The agent's role widened to create, update and delete KubeVirt CRs (a mistake in a
    cluster's RBAC): the policy is then what refuses. Narrowed again at the end."""
    if served.emulator is not None:
        served.emulator.authorize_with(None)
        yield
        return
    rbac_api = client.RbacAuthorizationV1Api(served.api)
    rbac_api.create_cluster_role({
        "metadata": {"name": WIDENED},
        "rules": [{"apiGroups": ["kubevirt.io"], "resources": ["kubevirts"],
                   "verbs": ["create", "update", "delete"]}],
    })  # fmt: skip
    rbac_api.create_cluster_role_binding({
        "metadata": {"name": WIDENED},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": WIDENED},
        "subjects": [{"kind": "ServiceAccount", "name": "vgpuctl",
                      "namespace": "vgpuctl-system"}],
    })  # fmt: skip
    try:
        wait_until(lambda: agent_may(served, "delete"), "the widened role never applied")
        yield
    finally:
        rbac_api.delete_cluster_role_binding(WIDENED)
        rbac_api.delete_cluster_role(WIDENED)
        wait_until(lambda: not agent_may(served, "delete"), "the widened role never went")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("spec", "imageRegistry"), "registry.attacker.example/kubevirt"),
        (("spec", "imageTag"), "backdoored"),
        (
            ("spec", "customizeComponents"),
            {"patches": [{"resourceName": "virt-handler", "resourceType": "DaemonSet",
                          "patch": '{"spec":{"template":{"spec":{"hostPID":true}}}}',
                          "type": "strategic"}]},
        ),
        (("spec", "configuration", "developerConfiguration", "featureGates"), ["Root"]),
        (("metadata", "annotations", "kubevirt.io/latest-observed-api-version"), "v9"),
        # vgpuctl's prefix does not open the metadata: only its three annotations are its own.
        (("metadata", "annotations", "vgpu.reconciler.dev/anything"), "x"),
    ],
    ids=lambda v: "/".join(v) if isinstance(v, tuple) else None,
)  # fmt: skip
def test_the_agents_token_cannot_change_the_kubevirt_cr_beyond_its_allow_list_on_both(
    tmp_path: Path, api_server: Served, field: tuple[str, ...], value: Any
) -> None:
    """A whole-object write (RBAC grants no update) and a JSON patch (RBAC grants patch; the
    policy refuses) of another field of the KubeVirt CR; nothing changes."""
    kubeconfig = policed(api_server, tmp_path)
    richer_kubevirt(api_server)
    before = kubevirt_view(api_server)
    changed = stored_kubevirt(api_server)
    target = changed
    for key in field[:-1]:
        target = target.setdefault(key, {})
    target[field[-1]] = value
    pointer = "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in field)
    with as_kubeconfig(kubeconfig) as api:
        with pytest.raises(ClusterError) as put:
            api.replace_object(**KV, name="kubevirt", body=changed)
        with pytest.raises(ClusterError) as patch:
            api.patch_object(
                **KV, name="kubevirt", patch=[{"op": "add", "path": pointer, "value": value}]
            )
    assert "RBAC denies update on kubevirts.kubevirt.io" in put.value.message
    assert denied_by_policy(patch.value.message, BEYOND), patch.value.message
    assert kubevirt_view(api_server) == before


def test_a_whole_object_write_or_a_new_cr_is_refused_even_where_rbac_allows_it(
    tmp_path: Path, api_server: Served
) -> None:
    """Were the agent's role widened, the policy still refuses a whole-object update that
    changes the image registry, the KubeVirt CR's delete, and a second CR's create."""
    kubeconfig = policed(api_server, tmp_path)
    richer_kubevirt(api_server)
    before = kubevirt_view(api_server)
    with widened_rbac(api_server), as_kubeconfig(kubeconfig) as api:
        changed = stored_kubevirt(api_server)
        changed["spec"]["imageRegistry"] = "registry.attacker.example/kubevirt"
        with pytest.raises(ClusterError) as put:
            api.replace_object(**KV, name="kubevirt", body=changed)
        assert denied_by_policy(put.value.message, BEYOND), put.value.message
        with pytest.raises(ClusterError) as delete:
            api.delete_object(**KV, name="kubevirt")
        assert denied_by_policy(delete.value.message, CR_LIFE), delete.value.message
        second = agent_kubevirt()
        second["metadata"]["name"] = "evil"
        with pytest.raises(ClusterError) as create:
            api.create_object(**KV, body=second)
        assert denied_by_policy(create.value.message, CR_LIFE), create.value.message
    assert kubevirt_view(api_server) == before
    listed = api_server.custom.list_namespaced_custom_object(
        "kubevirt.io", "v1", KV_NS, "kubevirts"
    )
    assert [o["metadata"]["name"] for o in listed["items"]] == ["kubevirt"]


GOOD_MDEV = {
    "mdevNameSelector": "NVIDIA A2-4Q",
    "resourceName": "nvidia.com/NVIDIA_A2-4Q",
    "externalResourceProvider": True,
}
GOOD_PCI = {
    "pciVendorSelector": "10DE:26B9",
    "resourceName": "nvidia.com/NVIDIA_L40S-24Q",
    "externalResourceProvider": True,
}


def test_the_agents_own_allow_list_patch_goes_through_and_is_undone(
    tmp_path: Path, api_server: Served
) -> None:
    """vgpuctl's JSON patch: its entries appended to lists holding someone else's, its
    ownership annotations, each tested against the version read; then removed again. The
    others' entries stay as they were."""
    kubeconfig = policed(api_server, tmp_path)
    theirs = copy.deepcopy(stored_kubevirt(api_server)["spec"]["configuration"][PERMITTED_KEY])
    version = stored_kubevirt(api_server)["metadata"]["resourceVersion"]
    with as_kubeconfig(kubeconfig) as api:
        api.patch_object(**KV, name="kubevirt", patch=[
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": f"{PERMITTED}/mediatedDevices/-", "value": GOOD_MDEV},
            {"op": "add", "path": "/metadata/annotations",
             "value": {"vgpu.reconciler.dev/mediated-devices": "NVIDIA A2-4Q",
                       "vgpu.reconciler.dev/pci-host-devices": "nvidia.com/NVIDIA_L40S-24Q"}},
            {"op": "add", "path": f"{PERMITTED}/pciHostDevices/-", "value": GOOD_PCI},
        ])  # fmt: skip
        lists = stored_kubevirt(api_server)["spec"]["configuration"][PERMITTED_KEY]
        assert lists["mediatedDevices"] == [*theirs["mediatedDevices"], GOOD_MDEV]
        assert lists["pciHostDevices"] == [*theirs["pciHostDevices"], GOOD_PCI]
        api.patch_object(**KV, name="kubevirt", patch=[
            {"op": "test", "path": f"{PERMITTED}/mediatedDevices/1", "value": GOOD_MDEV},
            {"op": "remove", "path": f"{PERMITTED}/mediatedDevices/1"},
            {"op": "remove", "path": f"{PERMITTED}/pciHostDevices/1"},
            {"op": "remove", "path": "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"},
        ])  # fmt: skip
    assert stored_kubevirt(api_server)["spec"]["configuration"][PERMITTED_KEY] == theirs


@pytest.mark.parametrize(
    ("ops", "refusal"),
    [
        # Someone else's entry changed in place: a new entry, which vgpuctl never writes.
        ([{"op": "replace", "path": f"{PERMITTED}/pciHostDevices/0/pciVendorSelector",
           "value": "8086:1572"}], "pciHostDevices only NVIDIA vGPU entries"),
        ([{"op": "replace", "path": f"{PERMITTED}/mediatedDevices/0/resourceName",
           "value": "nvidia.com/GRID_T4-8Q"}], "mediatedDevices only vGPU entries"),
        # Another vendor's device, and NVIDIA's without an external provider (KubeVirt's own
        # device plugin would hand the host's device to any VM).
        ([{"op": "add", "path": f"{PERMITTED}/pciHostDevices/-",
           "value": {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/nic"}}],
         "pciHostDevices only NVIDIA vGPU entries"),
        ([{"op": "add", "path": f"{PERMITTED}/mediatedDevices/-",
           "value": {**GOOD_MDEV, "externalResourceProvider": False}}],
         "mediatedDevices only vGPU entries"),
    ],
    ids=["replace-theirs-pci", "replace-theirs-mdev", "add-a-nic", "add-internal-mdev"],
)  # fmt: skip
def test_the_agents_token_cannot_write_entries_vgpuctl_never_writes(
    tmp_path: Path, api_server: Served, ops: list[dict[str, Any]], refusal: str
) -> None:
    kubeconfig = policed(api_server, tmp_path)
    before = kubevirt_view(api_server)
    with as_kubeconfig(kubeconfig) as api, pytest.raises(ClusterError) as err:
        api.patch_object(**KV, name="kubevirt", patch=ops)
    wanted = "the vgpuctl agent may add to the KubeVirt CR's " + refusal
    assert denied_by_policy(err.value.message, wanted), err.value.message
    assert kubevirt_view(api_server) == before


def test_the_agents_token_may_allow_list_a_vfio_profile_and_mark_it_retiring(
    tmp_path: Path, api_server: Served
) -> None:
    """What the vfio interface needs (a pciHostDevices entry and vgpuctl's annotation naming
    it), then the two-phase retirement's marks (vgpu.reconciler.dev/retiring) set, changed
    and removed: each admitted."""
    kubeconfig = policed(api_server, tmp_path)
    richer_kubevirt(api_server)
    retiring = "/metadata/annotations/vgpu.reconciler.dev~1retiring"
    marks = json.dumps({"nvidia.com/NVIDIA_L40S-24Q": "2026-12-07T19:00:00Z"})
    with as_kubeconfig(kubeconfig) as api:
        api.patch_object(**KV, name="kubevirt", patch=[
            {"op": "add", "path": f"{PERMITTED}/pciHostDevices/-", "value": GOOD_PCI},
            {"op": "add", "path": "/metadata/annotations/vgpu.reconciler.dev~1pci-host-devices",
             "value": "nvidia.com/NVIDIA_L40S-24Q"},
        ])  # fmt: skip
        stored = stored_kubevirt(api_server)
        assert GOOD_PCI in stored["spec"]["configuration"][PERMITTED_KEY]["pciHostDevices"]
        annotations = stored["metadata"]["annotations"]
        assert annotations["vgpu.reconciler.dev/pci-host-devices"] == GOOD_PCI["resourceName"]
        for op in (
            {"op": "add", "path": retiring, "value": marks},
            {"op": "replace", "path": retiring, "value": "{}"},
            {"op": "remove", "path": retiring},
        ):
            api.patch_object(**KV, name="kubevirt", patch=[op])
            annotations = stored_kubevirt(api_server)["metadata"]["annotations"]
            assert annotations.get("vgpu.reconciler.dev/retiring") == op.get("value"), op


#: The policy's words for a removal of an entry vgpuctl does not own, and for a claim of one.
NOT_OWNED = "may remove from the KubeVirt CR's allow-lists only the entries its ownership"
NOT_ADDED = "may add to its ownership annotations only the entries it adds in the same write"
OWNED_MDEV = "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"


def owning(mdev: str = "", pci: str = "") -> dict[str, Any]:
    """The op giving the CR (which has no annotations: tests/cluster_node.py ``kubevirt_cr``)
    vgpuctl's ownership annotations naming ``mdev`` and ``pci``."""
    names = {
        "vgpu.reconciler.dev/mediated-devices": mdev,
        "vgpu.reconciler.dev/pci-host-devices": pci,
    }
    return {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {k: v for k, v in names.items() if v},
    }


#: Someone else's entries in the CR tests/cluster_node.py's ``kubevirt_cr`` writes (each the
#: first of its list): KubeVirt's virt-handler removes the mdevs of a type no longer listed.
THEIR_MDEV = {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q"}
THEIR_PCI = {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/A10"}


@pytest.mark.parametrize(
    ("ops", "refusal"),
    [
        # Someone else's entries removed outright.
        ([{"op": "test", "path": f"{PERMITTED}/mediatedDevices/0", "value": THEIR_MDEV},
          {"op": "remove", "path": f"{PERMITTED}/mediatedDevices/0"}], NOT_OWNED),
        ([{"op": "test", "path": f"{PERMITTED}/pciHostDevices/0", "value": THEIR_PCI},
          {"op": "remove", "path": f"{PERMITTED}/pciHostDevices/0"}], NOT_OWNED),
        # Claimed and removed in one write: the annotation before the write is what counts.
        ([owning(mdev="GRID T4-2Q"),
          {"op": "remove", "path": f"{PERMITTED}/mediatedDevices/0"}], NOT_OWNED),
        # Claimed, to be removed by a later write: an entry vgpuctl did not add is not its.
        ([owning(mdev="GRID T4-2Q")], NOT_ADDED),
        ([owning(pci="nvidia.com/A10")], NOT_ADDED),
        # Claimed beside an entry of its own added in the same write.
        ([{"op": "add", "path": f"{PERMITTED}/mediatedDevices/-", "value": GOOD_MDEV},
          owning(mdev="GRID T4-2Q,NVIDIA A2-4Q")], NOT_ADDED),
    ],
    ids=[
        "remove-theirs-mdev", "remove-theirs-pci", "claim-and-remove", "claim-theirs-mdev",
        "claim-theirs-pci", "claim-beside-its-own",
    ],
)  # fmt: skip
def test_the_agents_token_cannot_take_someone_elses_entry_off_the_allow_list(
    tmp_path: Path, api_server: Served, ops: list[dict[str, Any]], refusal: str
) -> None:
    """A stolen token must not make virt-handler remove other profiles' vGPUs (in use by a VM
    or not: docs/domain.md §10) on every node: the entries vgpuctl may remove are the ones
    its ownership annotations named before the write, and it may name only entries it adds."""
    kubeconfig = policed(api_server, tmp_path)
    before = kubevirt_view(api_server)
    lists = before["spec"]["configuration"][PERMITTED_KEY]
    assert (lists["mediatedDevices"][0], lists["pciHostDevices"][0]) == (THEIR_MDEV, THEIR_PCI)
    with as_kubeconfig(kubeconfig) as api, pytest.raises(ClusterError) as err:
        api.patch_object(**KV, name="kubevirt", patch=ops)
    assert denied_by_policy(err.value.message, refusal), err.value.message
    assert kubevirt_view(api_server) == before


def test_the_agent_removes_what_it_owns_even_when_the_annotation_was_hand_spaced(
    tmp_path: Path, api_server: Served
) -> None:
    """Its own entry, added and claimed; an administrator rewrites the annotation with spaces
    after the comma; the agent's removal of its entry (and of the name) still goes through,
    and someone else's entry stays."""
    kubeconfig = policed(api_server, tmp_path)
    with as_kubeconfig(kubeconfig) as api:
        api.patch_object(**KV, name="kubevirt", patch=[
            {"op": "add", "path": f"{PERMITTED}/mediatedDevices/-", "value": GOOD_MDEV},
            owning(mdev="NVIDIA A2-4Q"),
        ])  # fmt: skip
        stored = stored_kubevirt(api_server)
        stored["metadata"]["annotations"]["vgpu.reconciler.dev/mediated-devices"] = (
            " NVIDIA A2-4Q ,  "
        )
        api_server.custom.replace_namespaced_custom_object(
            "kubevirt.io", "v1", KV_NS, "kubevirts", "kubevirt", stored
        )
        api.patch_object(**KV, name="kubevirt", patch=[
            {"op": "test", "path": f"{PERMITTED}/mediatedDevices/1", "value": GOOD_MDEV},
            {"op": "remove", "path": f"{PERMITTED}/mediatedDevices/1"},
            {"op": "remove", "path": OWNED_MDEV},
        ])  # fmt: skip
    lists = stored_kubevirt(api_server)["spec"]["configuration"][PERMITTED_KEY]
    assert lists["mediatedDevices"] == [THEIR_MDEV]


NODE_KINDS = {
    "vgpudevices": {
        "kind": "VGPUDevice", "name": f"{OTHER}-000008004",
        "spec": {"address": "0000:08:00.4", "enabled": True, "nodeName": OTHER,
                 "parentGPUDeviceAddress": "0000:08:00.0", "vGPUTypeName": "NVIDIA A2-4Q"},
        "status": {"uuid": "0b0e4f51-1b7f-5a4e-9f64-d7b0a7a9a001"},
        "edit": ("vGPUTypeName", "NVIDIA A2-16Q"),
    },
    "sriovgpudevices": {
        "kind": "SRIOVGPUDevice", "name": f"{OTHER}-000008000",
        "spec": {"address": "0000:08:00.0", "enabled": True, "nodeName": OTHER},
        "status": {"vfAddresses": ["0000:08:00.4"]},
        "edit": ("enabled", False),
    },
    "vgpunodestates": {
        "kind": "VGPUNodeState", "name": OTHER,
        "spec": {"nodeName": OTHER},
        "status": {"desiredFingerprint": "sha256:0"},
        "edit": ("nodeName", NODE),
    },
}  # fmt: skip


def node_object(plural: str, name: str | None = None, node: str = OTHER) -> dict[str, Any]:
    shape = NODE_KINDS[plural]
    group, version = (GROUP, VERSION) if plural != "vgpunodestates" else NODE_STATES[:2]
    spec = {**shape["spec"], "nodeName": node}
    return {
        "apiVersion": f"{group}/{version}",
        "kind": shape["kind"],
        "metadata": {
            "name": name or shape["name"],
            "labels": {"nodename": node, "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": spec,
    }


@pytest.mark.parametrize("plural", list(NODE_KINDS))
def test_the_agents_token_cannot_write_another_nodes_objects_of_any_kind(
    tmp_path: Path, api_server: Served, plural: str
) -> None:
    """Create, spec update, status update, claim (relabelled to this node) and delete of
    another node's SRIOVGPUDevice, VGPUDevice and VGPUNodeState: each refused by the policy
    (a VGPUNodeState's delete by RBAC first: the role grants none); nothing changes."""
    kubeconfig = policed(api_server, tmp_path)
    shape = NODE_KINDS[plural]
    group, version = (GROUP, VERSION) if plural != "vgpunodestates" else NODE_STATES[:2]
    where = {"group": group, "version": version, "plural": plural}
    made = api_server.custom.create_cluster_custom_object(
        group, version, plural, node_object(plural)
    )
    made["status"] = shape["status"]
    theirs = api_server.custom.replace_cluster_custom_object_status(
        group, version, plural, made["metadata"]["name"], made
    )
    name = theirs["metadata"]["name"]
    spec_edit = copy.deepcopy(theirs)
    key, value = shape["edit"]
    spec_edit["spec"][key] = value
    status_edit = copy.deepcopy(theirs)
    status_edit["status"] = {}
    claimed = copy.deepcopy(theirs)
    claimed["metadata"]["labels"]["nodename"] = NODE
    claimed["spec"]["nodeName"] = NODE
    # This node's label with another node in spec.nodeName (what Harvester's controllers act
    # on; a VGPUNodeState is named after its node).
    mixed = node_object(plural, name=NODE if plural == "vgpunodestates" else f"{NODE}-000008009")
    mixed["metadata"]["labels"]["nodename"] = NODE
    refusal = "the vgpuctl agent may write only its own node's"
    with as_kubeconfig(kubeconfig) as api:
        attempts = {
            "update": lambda: api.replace_object(**where, name=name, body=spec_edit),
            "status": lambda: api.replace_status(**where, name=name, body=status_edit),
            "claim": lambda: api.replace_object(**where, name=name, body=claimed),
            "create": lambda: api.create_object(**where, body=node_object(plural, f"{OTHER}-new")),
            # Its name taken: the policy judges before the store finds the name taken (k8s.io/
            # apiserver registry/generic/registry/store.go, Store.Create: createValidation,
            # then Storage.Create), so the answer is the policy's, not 409 AlreadyExists.
            "create-taken": lambda: api.create_object(**where, body=node_object(plural)),
            "mixed": lambda: api.create_object(**where, body=mixed),
            "delete": lambda: api.delete_object(**where, name=name),
        }
        for what, attempt in attempts.items():
            with pytest.raises(ClusterError) as err:
                attempt()
            if (plural, what) == ("vgpunodestates", "delete"):
                assert f"RBAC denies delete on {plural}.{group}" in err.value.message
            else:
                assert denied_by_policy(err.value.message, refusal), (what, err.value.message)
    listed = api_server.custom.list_cluster_custom_object(group, version, plural)
    assert [o["metadata"]["name"] for o in listed["items"]] == [name]
    stored = listed["items"][0]
    assert (stored["metadata"]["labels"]["nodename"], stored["spec"]) == (OTHER, theirs["spec"])


def test_a_token_without_the_node_claim_writes_no_device_objects_on_both(
    tmp_path: Path, api_server: Served
) -> None:
    """The agent's account without the node claim (on the real server its static token: the
    token file gives it no extra) is refused every device object."""
    policed(api_server, tmp_path)
    node = node_of(tmp_path, api_server)
    node.kubeconfig = static_agent(api_server, tmp_path)
    res = node.run("apply", SEED, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert NO_CLAIM in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    for plural in ("sriovgpudevices", "vgpudevices"):
        assert api_server.custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"] == []


@contextmanager
def fallback_policy(served: Served, kubeconfig: Path) -> Iterator[None]:
    """deploy/no-node-claim/'s policy in force instead of the shipped one; the shipped one again
    at the end (the real server is shared by the process's tests)."""
    (fallback,) = [
        d
        for d in shipped(POLICY_KINDS, components=("no-node-claim",))
        if d["kind"] == "ValidatingAdmissionPolicy"
    ]
    if served.emulator is not None:
        served.emulator.seed(fallback)
        yield
        return
    admission = client.AdmissionregistrationV1Api(served.api)

    def install(doc: dict[str, Any]) -> None:
        current = admission.read_validating_admission_policy("vgpuctl-agent")
        body = copy.deepcopy(doc)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        admission.replace_validating_admission_policy("vgpuctl-agent", body)

    probe = node_object("vgpudevices", name=f"{NODE}-probe", node=NODE)

    def own_create_admitted() -> bool:
        with as_kubeconfig(kubeconfig) as api:
            try:
                api.create_object(group=GROUP, version=VERSION, plural="vgpudevices", body=probe)
            except ClusterError as error:
                if NO_CLAIM not in error.message:
                    raise
                return False
        served.custom.delete_cluster_custom_object(GROUP, VERSION, "vgpudevices", f"{NODE}-probe")
        return True

    install(fallback)
    try:
        wait_until(own_create_admitted, "the fallback policy never applied")
        yield
    finally:
        install(POLICY)
        wait_until(lambda: not own_create_admitted(), "the shipped policy never came back")


def test_the_no_node_claim_fallback_drops_only_the_node_check_on_both(
    tmp_path: Path, api_server: Served
) -> None:
    policed(api_server, tmp_path)
    static = static_agent(api_server, tmp_path)
    node = node_of(tmp_path, api_server)
    node.kubeconfig = static
    with fallback_policy(api_server, static):
        node.ok("apply", SEED, "--yes")
        listed = api_server.custom.list_cluster_custom_object(GROUP, VERSION, "vgpudevices")
        assert len(listed["items"]) == 16
        # The KubeVirt CR is still limited to the allow-list.
        with as_kubeconfig(static) as api, pytest.raises(ClusterError) as err:
            api.patch_object(
                **KV, name="kubevirt",
                patch=[{"op": "add", "path": "/spec/imageTag", "value": "x"}],
            )  # fmt: skip
        assert denied_by_policy(err.value.message, BEYOND), err.value.message


def other_user(served: Served, tmp_path: Path, who: str) -> Path:
    """A kubeconfig of the admin, or of Harvester's own service account (bound to cluster-admin,
    as Harvester's chart binds it; on the real server a TokenRequest's token)."""
    if served.emulator is not None:
        user = ADMIN if who == "admin" else HARVESTER
        return served.emulator.kubeconfig(tmp_path / who, user=user)
    assert served.real is not None
    if who == "admin":
        return served.kubeconfig_path
    core = client.CoreV1Api(served.api)
    create_ignoring_conflict(
        core.create_namespaced_service_account, KV_NS, {"metadata": {"name": "harvester"}}
    )
    create_ignoring_conflict(
        client.RbacAuthorizationV1Api(served.api).create_cluster_role_binding,
        {
            "metadata": {"name": "vgpuctl-test-harvester"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "harvester", "namespace": KV_NS}],
        },
    )  # fmt: skip
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token("harvester", KV_NS, request).status.token
    path = served.real.kubeconfig(tmp_path / who, "admin", token=token)
    user = f"system:serviceaccount:{KV_NS}:harvester"
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{KV_NS}"],
            resource_attributes=client.V1ResourceAttributes(
                group="kubevirt.io", resource="kubevirts", verb="update", namespace=KV_NS
            ),
        )
    )
    authz = client.AuthorizationV1Api(served.api)
    wait_until(
        lambda: authz.create_subject_access_review(review).status.allowed,
        "Harvester's binding never applied",
    )
    return path


@pytest.mark.parametrize("who", ["admin", "harvester"])
def test_other_users_are_not_affected_on_both(tmp_path: Path, api_server: Served, who: str) -> None:
    policed(api_server, tmp_path)
    kubeconfig = other_user(api_server, tmp_path, who)
    with as_kubeconfig(kubeconfig) as api:
        changed = stored_kubevirt(api_server)
        changed["spec"]["imageRegistry"] = "registry.example/kubevirt"
        changed["spec"]["configuration"][PERMITTED_KEY]["pciHostDevices"] = []
        api.replace_object(**KV, name="kubevirt", body=changed)
        where = {"group": GROUP, "version": VERSION, "plural": "vgpudevices"}
        created = api.create_object(**where, body=node_object("vgpudevices"))
        created["spec"]["vGPUTypeName"] = "NVIDIA A2-8Q"
        api.replace_object(**where, name=created["metadata"]["name"], body=created)
        api.delete_object(**where, name=created["metadata"]["name"])
    assert stored_kubevirt(api_server)["spec"]["imageRegistry"] == "registry.example/kubevirt"
    assert (
        api_server.custom.list_cluster_custom_object(GROUP, VERSION, "vgpudevices")["items"] == []
    )


def test_vgpuctl_for_another_node_with_this_nodes_token_is_refused_on_both(
    tmp_path: Path, api_server: Served
) -> None:
    """A stolen token, used to run vgpuctl as another node: its objects are never written."""
    kubeconfig = policed(api_server, tmp_path)
    sim = make_sim(tmp_path / "other-host", ["A2@0000:08:00.0"], node=OTHER)
    node = ClusterNode(sim.dir, OTHER)
    node.kubeconfig = kubeconfig
    node.kubelet_dir = tmp_path / "other-kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    desired = tmp_path / "other.yaml"
    desired.write_text(SEED.read_text().replace(NODE, OTHER))
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "may write only its own node's objects" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    for plural in ("sriovgpudevices", "vgpudevices"):
        assert api_server.custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"] == []
