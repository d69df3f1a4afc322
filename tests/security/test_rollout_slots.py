"""The node agents' rollout slots (issue 33, item 5) under deploy/'s RBAC and admission policy,
judged by the real API server (its RBAC authorizer, its CEL) and by the emulator's models of
them (tests/rbac.py, cel-python): the same tests against each (the ``api_server`` fixture; the
real one is ``just test-real``).

A node's token may hold a slot only for its own node; another node's slot, while that node
renews it, may not be released, renewed for it or taken over; once expired (a renewTime past
the old one by its leaseDurationSeconds: deploy/admission-policy.yaml) it may be taken over.
And ``vgpuctl apply`` with the agent's token waits for a slot another node holds, gives up with
exit 75, and takes the slot once it is released.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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

NAMESPACE = "vgpuctl-system"
OTHER = "harvester-other"
POLICY = next(d for d in shipped(POLICY_KINDS) if d["kind"] == "ValidatingAdmissionPolicy")
#: The policy's own messages for a slot that is not the agent's to write.
NOT_A_SLOT = next(
    v["message"] for v in POLICY["spec"]["validations"] if "rollout slots' Leases" in v["message"]
)
NOT_ITS_SLOT = next(
    v["message"] for v in POLICY["spec"]["validations"] if "hold a rollout slot" in v["message"]
)
new_client_from_config: Any = config.new_client_from_config


def micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease(name: str, holder: str | None, renewed: datetime) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseDurationSeconds": 15,
        "acquireTime": micro(renewed),
        "renewTime": micro(renewed),
        "leaseTransitions": 0,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


@pytest.fixture
def agent_kubeconfig(tmp_path: Path, api_server: Served) -> Iterator[Path]:
    """deploy/'s RBAC and admission policy in force; ``NODE``'s agent's kubeconfig. The slots
    made are deleted afterwards (the real server is shared by a process's tests)."""
    core = client.CoreV1Api(api_server.api)
    create_ignoring_conflict(core.create_namespace, {"metadata": {"name": NAMESPACE}})
    if api_server.emulator is not None:
        for doc in shipped(POLICY_KINDS):
            api_server.emulator.seed(doc)
        granted = rbac.grants()
        api_server.emulator.authorize_with(
            lambda request, user: user.username != AGENT or rbac.allows(granted, request)
        )
        path = api_server.emulator.kubeconfig(tmp_path / "agent", user=agent(NODE))
    else:
        assert api_server.real is not None
        token = agent_pod_token(api_server, NODE)
        install_rbac(api_server, rbac.RBAC)
        admission = client.AdmissionregistrationV1Api(api_server.api)
        policy, binding = shipped(POLICY_KINDS)
        create_ignoring_conflict(admission.create_validating_admission_policy, policy)
        create_ignoring_conflict(admission.create_validating_admission_policy_binding, binding)
        path = api_server.real.kubeconfig(tmp_path / "agent", "agent", token=token)
        _until_judged(api_server, path)
    leases = client.CoordinationV1Api(api_server.api)

    def no_slots() -> None:
        for item in leases.list_namespaced_lease(NAMESPACE).items:
            leases.delete_namespaced_lease(item.metadata.name, NAMESPACE)

    no_slots()  # the real server is shared: another test's released slots may be there
    try:
        yield path
    finally:
        no_slots()


def _until_judged(served: Served, path: Path) -> None:
    """The real server loads the policy and the bindings from its informers: until both are in
    force, the agent may be refused (RBAC) or let through (no policy yet)."""
    api = new_client_from_config(config_file=str(path))
    admin = client.CoordinationV1Api(served.api)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.CoordinationV1Api(api).create_namespaced_lease(
                    NAMESPACE, lease("not-a-slot", NODE, datetime.now(UTC))
                )
            except client.ApiException as error:
                if NOT_A_SLOT in (error.body or ""):
                    return
            else:
                admin.delete_namespaced_lease("not-a-slot", NAMESPACE)
            assert time.monotonic() < deadline, "the RBAC and the admission policy never judged"
            time.sleep(0.2)
    finally:
        api.close()


def refused(caught: pytest.ExceptionInfo[client.ApiException], name: str, message: str) -> None:
    denied = yaml.safe_load(caught.value.body)
    assert (caught.value.status, denied["reason"]) == (422, "Invalid")
    assert denied["message"] == (
        f'leases.coordination.k8s.io "{name}" is forbidden: ValidatingAdmissionPolicy '
        f"'vgpuctl-agent' with binding 'vgpuctl-agent' denied request: {message}"
    )


def test_an_agent_holds_only_its_own_nodes_slots(
    agent_kubeconfig: Path, api_server: Served
) -> None:
    api = new_client_from_config(config_file=str(agent_kubeconfig))
    try:
        leases = client.CoordinationV1Api(api)
        now = datetime.now(UTC)
        mine = leases.create_namespaced_lease(NAMESPACE, lease("vgpuctl-rollout-0", NODE, now))
        assert mine.spec.holder_identity == NODE
        for name in ("vgpuctl-rollout-32", "vgpuctl-leader"):
            with pytest.raises(client.ApiException) as caught:
                leases.create_namespaced_lease(NAMESPACE, lease(name, NODE, now))
            refused(caught, name, NOT_A_SLOT)
        with pytest.raises(client.ApiException) as caught:
            leases.create_namespaced_lease(NAMESPACE, lease("vgpuctl-rollout-1", OTHER, now))
        refused(caught, "vgpuctl-rollout-1", NOT_ITS_SLOT)
        # Its own slot: renewed, then released (no holder).
        body = mine.to_dict()
        renewed = lease("vgpuctl-rollout-0", NODE, now + timedelta(seconds=2))
        renewed["metadata"]["resourceVersion"] = body["metadata"]["resource_version"]
        done = leases.replace_namespaced_lease("vgpuctl-rollout-0", NAMESPACE, renewed)
        released = lease("vgpuctl-rollout-0", None, now + timedelta(seconds=3))
        released["metadata"]["resourceVersion"] = done.metadata.resource_version
        assert leases.replace_namespaced_lease(
            "vgpuctl-rollout-0", NAMESPACE, released
        ).spec.holder_identity in (None, "")
    finally:
        api.close()


def test_another_nodes_slot_is_taken_over_only_once_expired(
    agent_kubeconfig: Path, api_server: Served
) -> None:
    admin = client.CoordinationV1Api(api_server.api)
    renewed = datetime.now(UTC)
    theirs = admin.create_namespaced_lease(NAMESPACE, lease("vgpuctl-rollout-2", OTHER, renewed))
    version = theirs.metadata.resource_version
    api = new_client_from_config(config_file=str(agent_kubeconfig))
    try:
        leases = client.CoordinationV1Api(api)
        attempts = {
            # Released for it, renewed for it, taken within its lease duration.
            "release": lease("vgpuctl-rollout-2", None, renewed + timedelta(seconds=1)),
            "renew": lease("vgpuctl-rollout-2", OTHER, renewed + timedelta(seconds=1)),
            "early": lease("vgpuctl-rollout-2", NODE, renewed + timedelta(seconds=10)),
        }
        for what, body in attempts.items():
            body["metadata"]["resourceVersion"] = version
            with pytest.raises(client.ApiException) as caught:
                leases.replace_namespaced_lease("vgpuctl-rollout-2", NAMESPACE, body)
            refused(caught, "vgpuctl-rollout-2", NOT_ITS_SLOT)
            assert what  # (named for the failure's traceback)
        stored = admin.read_namespaced_lease("vgpuctl-rollout-2", NAMESPACE)
        assert (stored.spec.holder_identity, stored.metadata.resource_version) == (OTHER, version)
        # Expired: a renewTime past the old one by more than its 15 s.
        late = lease("vgpuctl-rollout-2", NODE, renewed + timedelta(seconds=16))
        late["metadata"]["resourceVersion"] = version
        taken = leases.replace_namespaced_lease("vgpuctl-rollout-2", NAMESPACE, late)
        assert taken.spec.holder_identity == NODE
    finally:
        api.close()


def test_apply_waits_for_a_slot_another_node_holds(
    tmp_path: Path, agent_kubeconfig: Path, api_server: Served
) -> None:
    harvester_cluster(api_server)
    node = node_of(tmp_path, api_server)
    node.kubeconfig = agent_kubeconfig
    paced = tmp_path / "seed-paced.yaml"
    paced.write_text(SEED.read_text() + "  rollout:\n    maxParallel: 1\n")
    admin = client.CoordinationV1Api(api_server.api)
    held = admin.create_namespaced_lease(
        NAMESPACE, lease("vgpuctl-rollout-0", OTHER, datetime.now(UTC))
    )
    waited = node.run("apply", paced, "--yes", "--slot-timeout", "2")
    assert waited.returncode == 75, waited.stdout + waited.stderr
    assert f"no rollout slot became free within 2 s (1 of 1 held by: {OTHER})" in waited.stderr
    assert admin.read_namespaced_lease("vgpuctl-rollout-0", NAMESPACE).spec.holder_identity == (
        OTHER
    )
    # The other node releases it (client-go's release: no holder, a 1 s lease): taken at once.
    released = lease("vgpuctl-rollout-0", None, datetime.now(UTC))
    released["spec"]["leaseDurationSeconds"] = 1
    released["metadata"]["resourceVersion"] = held.metadata.resource_version
    admin.replace_namespaced_lease("vgpuctl-rollout-0", NAMESPACE, released)
    done = node.run("apply", paced, "--yes", "--slot-timeout", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Converged" in done.stdout
    slot = admin.read_namespaced_lease("vgpuctl-rollout-0", NAMESPACE)
    assert slot.spec.holder_identity in (None, "")  # released when done
    assert slot.spec.lease_transitions == 1
