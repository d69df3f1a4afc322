"""The node agent's shipped role (deploy/rbac.yaml) is enough for every flow the agent runs and
every rule in it is used, judged by the real kube-apiserver's RBAC authorizer and audit log and
by the emulator's model of both (the ``api_server`` fixture; the real one is ``just test-real``).

The agent's identity is its service account's token bound to a pod on its node, with
deploy/admission-policy.yaml in force too (``api_servers.PolicedAgent``). Its flows: ``apply``
(a first apply racing an admin who creates two of its objects meanwhile: 409, re-read, re-plan),
``plan``, ``watch`` (which follows the cluster by watches and resets hand edits of every kind
of its objects), ``apply`` of a GPU with SR-IOV disabled under a rollout budget (its VGPUDevices
deleted while it holds a rollout slot, a Lease), ``apply`` on
a host the GPU has left (its SRIOVGPUDevice deleted) and ``plan`` of a node group selected by
labels (the agent's own Node read). ``status`` and the device plugin never talk to the API
server. The union of what those flows ask for is every (verb, resource) the role grants,
``resourceNames`` rules included, and nothing it does not."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from tests import rbac
from tests.api_servers import (
    Served,
    agent_mark,
    agent_requests,
    create_ignoring_conflict,
    node_of,
)
from tests.cluster_node import ClusterNode
from tests.doubles.emulator import Request
from tests.simnode import NODE, SEED, make_sim
from tests.watch_agent import Watch, seed_text, wait_for

DEVICES, V1BETA1 = "devices.harvesterhci.io", "v1beta1"
NODE_STATES, V1ALPHA1 = "vgpu.reconciler.dev", "v1alpha1"
PF, VF4, VF5 = f"{NODE}-000008000", f"{NODE}-000008004", f"{NODE}-000008005"
MANAGED = {"nodename": NODE, "app.kubernetes.io/managed-by": "vgpuctl"}
PATIENCE_S = 60.0

#: Every (verb, group, resource, subresource) deploy/rbac.yaml grants the agent, written out by
#: hand from the file, each with the flow below that asks for it.
AGENT_REQUESTS = {
    # the pcidevices-controller guard (apply, plan, watch): one get each, by name
    ("get", "harvesterhci.io", "addons", None),
    ("get", "apps", "daemonsets", None),
    ("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", None),
    # its node's objects: listed (plan), watched (watch), created (first apply), re-read after
    # a 409 (the raced first apply), spec updated (hand edits reset by watch), deleted (SR-IOV
    # disabled: VGPUDevices; the GPU gone: its SRIOVGPUDevice), status written
    ("list", DEVICES, "sriovgpudevices", None),
    ("watch", DEVICES, "sriovgpudevices", None),
    ("get", DEVICES, "sriovgpudevices", None),
    ("create", DEVICES, "sriovgpudevices", None),
    ("update", DEVICES, "sriovgpudevices", None),
    ("delete", DEVICES, "sriovgpudevices", None),
    ("update", DEVICES, "sriovgpudevices", "status"),
    ("list", DEVICES, "vgpudevices", None),
    ("watch", DEVICES, "vgpudevices", None),
    ("get", DEVICES, "vgpudevices", None),
    ("create", DEVICES, "vgpudevices", None),
    ("update", DEVICES, "vgpudevices", None),
    ("delete", DEVICES, "vgpudevices", None),
    ("update", DEVICES, "vgpudevices", "status"),
    # its VGPUNodeState: every node's listed and watched, its own read (intent), created,
    # its spec reset (watch), its status written
    ("list", NODE_STATES, "vgpunodestates", None),
    ("watch", NODE_STATES, "vgpunodestates", None),
    ("get", NODE_STATES, "vgpunodestates", None),
    ("create", NODE_STATES, "vgpunodestates", None),
    ("update", NODE_STATES, "vgpunodestates", None),
    ("update", NODE_STATES, "vgpunodestates", "status"),
    # its rollout slot (spec.rollout.maxParallel): the slots listed, one created, read by name
    # at each renewal and at the release, renewed and released (updates)
    ("list", "coordination.k8s.io", "leases", None),
    ("create", "coordination.k8s.io", "leases", None),
    ("get", "coordination.k8s.io", "leases", None),
    ("update", "coordination.k8s.io", "leases", None),
    # the KubeVirt CR: found (list), followed (watch), read and patched (its allow-list)
    ("list", "kubevirt.io", "kubevirts", None),
    ("watch", "kubevirt.io", "kubevirts", None),
    ("get", "kubevirt.io", "kubevirts", None),
    ("patch", "kubevirt.io", "kubevirts", None),
    # the VMs on the node (who holds a vGPU)
    ("list", "kubevirt.io", "virtualmachineinstances", None),
    # its own Node, for a node group selected by labels
    ("get", "", "nodes", None),
    # Events on its objects
    ("create", "", "events", None),
}


def cluster_object(served: Served, plural: str, name: str) -> dict[str, Any] | None:
    group, version = (NODE_STATES, V1ALPHA1) if plural == "vgpunodestates" else (DEVICES, V1BETA1)
    try:
        found: dict[str, Any] = served.custom.get_cluster_custom_object(
            group, version, plural, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def paused_sriov_manage(node: ClusterNode) -> tuple[Path, Path]:
    """The host's sriov-manage waits, once called, until a file appears: the apply that calls
    it pauses between its host work and its cluster writes. (the file it makes when called,
    the file that lets it go on)"""
    script = node.dir / "bin" / "sriov-manage"
    real = script.with_name("sriov-manage.real")
    script.rename(real)
    called, go = node.dir / "sriov-manage-called", node.dir / "sriov-manage-go"
    script.write_text(
        f'#!/bin/sh\ntouch "{called}"\nwhile [ ! -e "{go}" ]; do sleep 0.05; done\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return called, go


def raced_first_apply(served: Served, node: ClusterNode) -> None:
    """The seed's first apply; while its sriov-manage runs, an admin creates the GPU's
    SRIOVGPUDevice and one VGPUDevice (vgpuctl's labels): each create is 409, re-read, and
    written over."""
    called, go = paused_sriov_manage(node)
    result: list[Any] = []
    apply = threading.Thread(target=lambda: result.append(node.run("apply", SEED, "--yes")))
    apply.start()
    try:
        wait_for(called.exists, "sriov-manage called", PATIENCE_S)
        for plural, kind, name, spec in (
            ("sriovgpudevices", "SRIOVGPUDevice", PF,
             {"address": "0000:08:00.0", "nodeName": NODE, "enabled": False}),
            ("vgpudevices", "VGPUDevice", VF4,
             {"address": "0000:08:00.4", "nodeName": NODE, "enabled": False,
              "vGPUTypeName": "", "parentGPUDeviceAddress": "0000:08:00.0"}),
        ):  # fmt: skip
            served.custom.create_cluster_custom_object(
                DEVICES, V1BETA1, plural,
                {"apiVersion": f"{DEVICES}/{V1BETA1}", "kind": kind,
                 "metadata": {"name": name, "labels": MANAGED}, "spec": spec},
            )  # fmt: skip
    finally:
        go.touch()
        apply.join(PATIENCE_S * 2)
    (res,) = result
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Converged" in res.stdout
    for name in (PF, VF4):
        assert f"{name}: updated " in res.stderr, res.stderr
    assert res.stderr.count("(after 1 conflict: re-read and re-planned)") == 2, res.stderr
    vgpu = cluster_object(served, "vgpudevices", VF4)
    assert vgpu is not None and vgpu["spec"]["vGPUTypeName"] == "NVIDIA A2-4A"


def watched_hand_edits(
    served: Served, node: ClusterNode, directory: Path, start_watch: Callable[..., Watch]
) -> None:
    """The watch agent resets a hand edit of each kind of its objects, then stops."""
    desired = directory / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the watch's first reconcile", PATIENCE_S)
    custom = served.custom
    custom.patch_cluster_custom_object(
        DEVICES, V1BETA1, "vgpudevices", VF5, {"spec": {"vGPUTypeName": "NVIDIA A2-4C"}}
    )
    custom.patch_cluster_custom_object(
        DEVICES, V1BETA1, "sriovgpudevices", PF, {"spec": {"enabled": False}}
    )
    custom.patch_cluster_custom_object(
        NODE_STATES, V1ALPHA1, "vgpunodestates", NODE, {"spec": {"nodeName": None}}
    )

    def reset() -> bool:
        vgpu = cluster_object(served, "vgpudevices", VF5)
        sriov = cluster_object(served, "sriovgpudevices", PF)
        state = cluster_object(served, "vgpunodestates", NODE)
        return (
            vgpu is not None
            and vgpu["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
            and sriov is not None
            and sriov["spec"]["enabled"] is True
            and state is not None
            and state.get("spec") == {"nodeName": NODE}
        )

    wait_for(reset, "the three hand edits reset", PATIENCE_S)
    assert watch.stop(signal.SIGTERM, timeout=PATIENCE_S) == 0


def test_every_flow_of_the_agent_is_allowed_and_uses_every_rule_of_its_role(
    tmp_path: Path,
    api_server: Served,
    agent_kubeconfig: Path,
    start_watch: Callable[..., Watch],
) -> None:
    node = node_of(tmp_path, api_server)
    node.kubeconfig = agent_kubeconfig
    mark = agent_mark(api_server)

    raced_first_apply(api_server, node)
    again = node.run("plan", SEED, "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    watched_hand_edits(api_server, node, tmp_path, start_watch)

    # SR-IOV disabled: the VGPUDevices go, then the GPU leaves the host: its SRIOVGPUDevice.
    disabled = tmp_path / "disabled.yaml"
    # Under a rollout budget of one (spec.rollout.maxParallel): the host change takes, renews
    # and releases a slot, a Lease in the agents' namespace (reconciler/apply/slots.py).
    create_ignoring_conflict(
        client.CoreV1Api(api_server.api).create_namespace, {"metadata": {"name": "vgpuctl-system"}}
    )
    disabled.write_text(
        SEED.read_text().replace("sriov: enabled", "sriov: disabled").split("vgpus:")[0]
        + "\n  rollout:\n    maxParallel: 1\n"
    )
    node.ok("apply", disabled, "--yes")
    assert cluster_object(api_server, "vgpudevices", VF4) is None
    dropped = tmp_path / "dropped.yaml"
    dropped.write_text(SEED.read_text().split("gpus:")[0] + "gpus: []\n")
    pulled = ClusterNode(make_sim(tmp_path / "host-pulled", ["A2@0000:09:00.0"]).dir, NODE)
    pulled.kubeconfig, pulled.kubelet_dir = node.kubeconfig, node.kubelet_dir
    pulled.ok("apply", dropped, "--yes")
    assert cluster_object(api_server, "sriovgpudevices", PF) is None

    # A node group that selects by labels: the agent reads its own Node.
    core = client.CoreV1Api(api_server.api)
    create_ignoring_conflict(core.create_node, {"metadata": {"name": NODE}})
    core.patch_node(
        NODE,
        {"metadata": {"labels": {"example.com/pool": "vdi"}}},
        _content_type="application/merge-patch+json",
    )
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(SEED.read_text().split("spec:")[0] + (
        "spec:\n  nodeGroups:\n    - name: vdi\n      selector: {labels: {example.com/pool: vdi}}\n"
        "      gpus: [{match: {model: A2}, sriov: disabled}]\n"))  # fmt: skip
    try:
        pulled.ok("plan", grouped)
    finally:  # the real server's Node outlives the test
        core.patch_node(
            NODE,
            {"metadata": {"labels": {"example.com/pool": None}}},
            _content_type="application/merge-patch+json",
        )

    made = agent_requests(api_server, since=mark)
    leases = client.CoordinationV1Api(api_server.api)  # the real server is shared: no slot left
    for item in leases.list_namespaced_lease("vgpuctl-system").items:
        leases.delete_namespaced_lease(item.metadata.name, "vgpuctl-system")
    granted = rbac.grants()
    assert [r for r in made if not rbac.allows(granted, Request(*r))] == []
    assert {r[:4] for r in made} == AGENT_REQUESTS
    unused = rbac.unused(granted, [Request(*r) for r in made])
    # One slot is used: the other 31 are granted the same verbs by name, in the same rule.
    unused -= {g for g in unused if g.resource == "leases" and g.name != "vgpuctl-rollout-0"}
    assert unused == set()
    # Narrow as it reads: no pod, Events in one namespace only, the guard's three by name.
    assert not [r for r in made if r[2] == "pods"]
    assert {r[4] for r in made if r[2] == "events"} == {"default"}
    assert {r[5] for r in made if r[2] in ("addons", "daemonsets")} == {
        "pcidevices-controller",
        "harvester-pcidevices-controller",
    }
