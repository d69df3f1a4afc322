"""deploy/'s ValidatingAdmissionPolicy judged by the real API server's CEL and by the emulator's
model of it (cel-python, tests/doubles/admission.py): the same test against each (the
``api_server`` fixture; the real one is ``just test-real``).

The agent's identity on the real server is its service account's token bound to a pod on its
node (a TokenRequest, as the kubelet makes for the pod's projected volume), which carries the
node's name in the user's extra; on the emulator, ``tests/agent_cluster.py``'s ``agent()``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests import rbac
from tests.agent_cluster import AGENT, POLICY_KINDS, agent, shipped
from tests.api_servers import (
    Served,
    agent_pod_token,
    create_ignoring_conflict,
    harvester_cluster,
    install_rbac,
    node_of,
)
from tests.simnode import NODE, SEED

GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"
OTHER = "harvester-other"
POLICY = next(d for d in shipped(POLICY_KINDS) if d["kind"] == "ValidatingAdmissionPolicy")
#: The policy's own message for a write to another node's objects.
NOT_YOURS = next(
    v["message"] for v in POLICY["spec"]["validations"] if "own node's objects" in v["message"]
)
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
