"""The emulator's ValidatingAdmissionPolicy model against the API server's behaviour, and the
shipped policy's CEL under it (compiles, no variable ever fails for the agent's own writes)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.doubles.admission import (
    Attributes,
    Failed,
    PolicyNotSupportedError,
    UserInfo,
    admit,
    compile_expression,
    variables_of,
)
from tests.doubles.emulator import ApiServerEmulator

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL, KIND = "devices.harvesterhci.io", "v1beta1", "vgpudevices", "VGPUDevice"
CR = (GROUP, VERSION, PLURAL)
AGENT = "system:serviceaccount:vgpuctl-system:vgpuctl"
CLAIM = "authentication.kubernetes.io/node-name"
new_client_from_config: Any = config.new_client_from_config


def policy(*validations: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                        "resources": [PLURAL],
                    }
                ]
            },
            "validations": list(validations),
            **spec,
        },
    }


def binding(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "b"},
        "spec": {"policyName": "p", "validationActions": ["Deny"], **spec},
    }


def vgpu(name: str = "n1-000008004", node: str = "n1") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": {"nodename": node}},
        "spec": {"nodeName": node, "vGPUTypeName": ""},
    }


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as emu:
        emu.register(GROUP, VERSION, PLURAL, KIND, False, True)
        yield emu


def custom_as(emu: ApiServerEmulator, tmp_path: Path, user: UserInfo | None = None) -> Any:
    # No ":" in the name: the client splits a kubeconfig path list on it.
    name = (user.username if user else "default").replace(":", "-")
    path = emu.kubeconfig(tmp_path / f"kubeconfig-{name}", user=user)
    return client.CustomObjectsApi(new_client_from_config(config_file=str(path)))


def test_a_denial_is_the_api_servers_422(emulator: ApiServerEmulator, tmp_path: Path) -> None:
    emulator.seed(policy({"expression": "object.spec.vGPUTypeName != 'NVIDIA A2-16Q'",
                          "message": "no 16Q here"}))  # fmt: skip
    emulator.seed(binding())
    custom = custom_as(emulator, tmp_path)
    body = vgpu()
    body["spec"]["vGPUTypeName"] = "NVIDIA A2-16Q"
    with pytest.raises(client.ApiException) as caught:
        custom.create_cluster_custom_object(*CR, body)
    cause = "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no 16Q here"
    # dispatcher.go: admission.NewForbidden's message, reason and code from the policy.
    assert caught.value.status == 422
    assert json.loads(caught.value.body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'vgpudevices.{GROUP} "n1-000008004" is forbidden: {cause}',
        "reason": "Invalid",
        "details": {
            "name": "n1-000008004",
            "group": GROUP,
            "kind": PLURAL,
            "causes": [{"message": cause}],
        },
        "code": 422,
    }
    assert emulator.objects(*CR) == []
    custom.create_cluster_custom_object(*CR, vgpu())  # allowed: nothing else is affected


def test_the_caller_is_the_tokens_user(emulator: ApiServerEmulator, tmp_path: Path) -> None:
    same_node = f"request.userInfo.extra['{CLAIM}'][0] == object.metadata.labels['nodename']"
    only_agent = f"request.userInfo.username == '{AGENT}'"
    emulator.seed(
        policy({"expression": same_node}, matchConditions=[{"name": "a", "expression": only_agent}])
    )
    emulator.seed(binding())
    agent = UserInfo(AGENT, extra={CLAIM: ("n1",)})
    as_agent = custom_as(emulator, tmp_path, agent)
    as_agent.create_cluster_custom_object(*CR, vgpu())
    with pytest.raises(client.ApiException) as caught:
        as_agent.create_cluster_custom_object(*CR, vgpu("n2-000008004", node="n2"))
    assert caught.value.status == 422
    assert "failed expression: request.userInfo.extra" in json.loads(caught.value.body)["message"]
    # Another user does not match the policy's condition.
    admin = custom_as(emulator, tmp_path, UserInfo("kubernetes-admin", groups=("system:masters",)))
    admin.create_cluster_custom_object(*CR, vgpu("n2-000008004", "n2"))
    # The default token is the agent's service account without a node claim: an error.
    with pytest.raises(client.ApiException) as caught:
        custom_as(emulator, tmp_path).create_cluster_custom_object(*CR, vgpu("n3-x", "n3"))
    assert "resulted in error" in json.loads(caught.value.body)["message"]
    # An unknown token is not a user at all.
    forged = json.loads(emulator.kubeconfig(tmp_path / "forged").read_text())
    forged["users"][0]["user"]["token"] = "not-a-token"  # noqa: S105
    (tmp_path / "forged").write_text(json.dumps(forged))
    stranger = new_client_from_config(config_file=str(tmp_path / "forged"))
    with pytest.raises(client.ApiException) as caught:
        client.CustomObjectsApi(stranger).list_cluster_custom_object(*CR)
    assert caught.value.status == 401


def test_an_error_denies_under_fail_and_admits_under_ignore(
    emulator: ApiServerEmulator, tmp_path: Path
) -> None:
    broken = {"expression": "object.spec.missing == 'x'"}
    emulator.seed(policy(broken))
    emulator.seed(binding())
    custom = custom_as(emulator, tmp_path)
    with pytest.raises(client.ApiException) as caught:
        custom.create_cluster_custom_object(*CR, vgpu())
    message = json.loads(caught.value.body)["message"]
    assert "expression 'object.spec.missing == 'x'' resulted in error:" in message
    emulator.seed(policy(broken, failurePolicy="Ignore"))
    custom.create_cluster_custom_object(*CR, vgpu())


def test_deletes_see_the_old_object_and_status_writes_need_their_subresource(
    emulator: ApiServerEmulator, tmp_path: Path
) -> None:
    keep = {"expression": "oldObject == null || oldObject.metadata.name != 'keep'",
            "message": "kept"}  # fmt: skip
    emulator.seed(policy(keep))
    emulator.seed(binding())
    custom = custom_as(emulator, tmp_path)
    created = custom.create_cluster_custom_object(*CR, vgpu("keep"))
    with pytest.raises(client.ApiException, match="kept"):
        custom.delete_cluster_custom_object(*CR, "keep")
    # The rule names vgpudevices, not vgpudevices/status: a status write is not matched.
    created["status"] = {"uuid": "u"}
    custom.replace_cluster_custom_object_status(*CR, "keep", created)
    rules = policy(keep)["spec"]["matchConstraints"]["resourceRules"]
    rules[0]["resources"] = [f"{PLURAL}/status"]
    emulator.seed(policy(keep, matchConstraints={"resourceRules": rules}))
    custom.delete_cluster_custom_object(*CR, "keep")  # the main resource is not matched now


def test_unsupported_features_are_refused_loudly() -> None:
    attributes = Attributes("CREATE", GROUP, VERSION, PLURAL, KIND, "", "", "x",
                            UserInfo("u"), vgpu(), None)  # fmt: skip
    with pytest.raises(PolicyNotSupportedError):
        admit(
            attributes, [policy(paramKind={"apiVersion": "v1", "kind": "ConfigMap"})], [binding()]
        )
    with pytest.raises(PolicyNotSupportedError):
        admit(attributes, [policy()], [binding(validationActions=["Warn"])])


# -- the shipped policy -------------------------------------------------------------------------


def _shipped() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "admission-policy.yaml").read_text()))
    (p,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (b,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    return p, b


def test_every_expression_of_the_shipped_policy_compiles() -> None:
    spec = _shipped()[0]["spec"]
    expressions = [
        *(c["expression"] for c in spec["matchConditions"]),
        *(v["expression"] for v in spec["variables"]),
        *(v["expression"] for v in spec["validations"]),
    ]
    for expression in expressions:
        compile_expression(expression)
    assert all("\n" not in v["message"] for v in spec["validations"])


def _kubevirt() -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "harvester-system"},
        "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": []}}},
    }


def _agents_writes() -> list[Attributes]:
    """The writes the agent makes, each with the policy's view of it."""
    agent = UserInfo(AGENT, extra={CLAIM: ("n1",)})
    kv = _kubevirt()
    added = copy.deepcopy(kv)
    added["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] = [
        # As vgpuctl writes it (reconciler/model/plan.py, MediatedDevice.to_json).
        {
            "mdevNameSelector": "NVIDIA A2-4Q",
            "resourceName": "nvidia.com/NVIDIA_A2-4Q",
            "externalResourceProvider": True,
        }
    ]
    added["metadata"]["annotations"] = {"vgpu.reconciler.dev/mediated-devices": "NVIDIA A2-4Q"}
    bare = {**kv, "spec": {}}

    def kubevirt(new: dict[str, Any], old: dict[str, Any]) -> Attributes:
        return Attributes("UPDATE", "kubevirt.io", "v1", "kubevirts", "KubeVirt", "",
                          "harvester-system", "kubevirt", agent, new, old)  # fmt: skip

    def device(operation: str, new: Any, old: Any, sub: str = "") -> Attributes:
        return Attributes(operation, GROUP, VERSION, PLURAL, KIND, sub, "", "n1-000008004",
                          agent, new, old)  # fmt: skip

    return [
        kubevirt(added, kv),
        kubevirt(kv, added),
        kubevirt({**added, "spec": added["spec"]}, bare),
        device("CREATE", vgpu(), None),
        device("UPDATE", vgpu(), vgpu()),
        device("UPDATE", vgpu(), vgpu(), "status"),
        device("DELETE", None, vgpu()),
    ]


@pytest.mark.parametrize(
    "attributes", _agents_writes(), ids=lambda a: f"{a.resource}-{a.operation}"
)
def test_the_agents_writes_pass_and_no_variable_fails(attributes: Attributes) -> None:
    """No variable the validations read evaluates to an error for the agent's own writes: the
    policy never relies on what cel-python and cel-go do differently with errors."""
    shipped, bound = _shipped()
    assert admit(attributes, [shipped], [bound]) is None
    failed = {k: v for k, v in variables_of(shipped, attributes).items() if isinstance(v, Failed)}
    assert failed == {}
