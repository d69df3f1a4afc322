"""``vgpuctl watch --kubeconfig`` (the node agent, as deploy/daemonset.yaml runs it) end to end
against the emulator and the real kube-apiserver (the ``api_server`` fixture; the real one is
``just test-real``), as the agent's identity with only what deploy/ ships in force: its role
(deploy/rbac.yaml) and its admission policy (deploy/admission-policy.yaml), the identity on the
real server a service-account token bound to a pod on the node (the node-name claim).

It converges the seed's node, then follows the cluster by watches alone (a rescan makes no
request): an admin's hand edit of a VGPUDevice, its SRIOVGPUDevice deleted, its VGPUNodeState's
spec emptied and vgpuctl's entry taken out of the KubeVirt allow-list
are each put back; the VGPUDevice CRD re-applied with a change (as Harvester's
pcidevices-controller does at every start) ends the watch of that resource and expires its
version (410), which the agent answers by listing again, then watching on (a later hand edit is
reset); SIGTERM stops it cleanly (exit 0)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.api_servers import Served, node_of, reapply_crd
from tests.simnode import NODE
from tests.watch_agent import Watch, seed_text, wait_for

DEVICES, V1BETA1 = "devices.harvesterhci.io", "v1beta1"
NODE_STATES, V1ALPHA1 = "vgpu.reconciler.dev", "v1alpha1"
KV_NS = "harvester-system"
PF = f"{NODE}-000008000"
VF4, VF5 = f"{NODE}-000008004", f"{NODE}-000008005"
#: The real server's first convergence takes a few seconds more than the emulator's.
PATIENCE_S = 60.0


def device(served: Served, plural: str, name: str) -> dict[str, Any] | None:
    from kubernetes import client

    try:
        found: dict[str, Any] = served.custom.get_cluster_custom_object(
            DEVICES, V1BETA1, plural, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def node_state(served: Served) -> dict[str, Any]:
    found: dict[str, Any] = served.custom.get_cluster_custom_object(
        NODE_STATES, V1ALPHA1, "vgpunodestates", NODE
    )
    return found


def mediated(served: Served) -> list[str]:
    kubevirt = served.custom.get_namespaced_custom_object(
        "kubevirt.io", "v1", KV_NS, "kubevirts", "kubevirt"
    )
    entries = kubevirt["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    return [e["mdevNameSelector"] for e in entries]


def type_of(served: Served, name: str) -> object:
    found = device(served, "vgpudevices", name)
    return None if found is None else found["spec"].get("vGPUTypeName")


def test_the_agent_converges_follows_the_cluster_and_stops_on_sigterm(
    tmp_path: Path,
    api_server: Served,
    agent_kubeconfig: Path,
    start_watch: Callable[..., Watch],
) -> None:
    node = node_of(tmp_path, api_server)
    node.kubeconfig = agent_kubeconfig
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence", timeout=PATIENCE_S)

    # The seed's node (desired-state/harvester-kgd9c.yaml): the GPU enabled, its four vGPUs.
    sriov = device(api_server, "sriovgpudevices", PF)
    assert sriov is not None and sriov["spec"]["enabled"] is True
    assert type_of(api_server, VF4) == "NVIDIA A2-4A"
    assert type_of(api_server, VF5) == "NVIDIA A2-4Q"
    assert sorted(mediated(api_server)) == ["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"]
    assert node_state(api_server)["spec"] == {"nodeName": NODE}
    custom = api_server.custom

    # A hand edit of a VGPUDevice's profile: reset.
    custom.patch_cluster_custom_object(
        DEVICES, V1BETA1, "vgpudevices", VF5, {"spec": {"vGPUTypeName": "NVIDIA A2-4C"}}
    )
    wait_for(lambda: type_of(api_server, VF5) == "NVIDIA A2-4Q", "the hand edit reset", PATIENCE_S)

    # The GPU's SRIOVGPUDevice deleted: made again.
    custom.delete_cluster_custom_object(DEVICES, V1BETA1, "sriovgpudevices", PF)
    wait_for(
        lambda: device(api_server, "sriovgpudevices", PF) is not None,
        "the SRIOVGPUDevice made again",
        PATIENCE_S,
    )

    # Its VGPUNodeState's spec emptied (the node it is of): written again.
    custom.patch_cluster_custom_object(
        NODE_STATES, V1ALPHA1, "vgpunodestates", NODE, {"spec": {"nodeName": None}}
    )
    wait_for(
        lambda: node_state(api_server).get("spec") == {"nodeName": NODE},
        "the VGPUNodeState's spec written again",
        PATIENCE_S,
    )

    # vgpuctl's entry taken out of the KubeVirt allow-list (a vGPU of that profile runs):
    # put back, someone else's entry kept.
    index = mediated(api_server).index("NVIDIA A2-4A")
    custom.patch_namespaced_custom_object(
        "kubevirt.io", "v1", KV_NS, "kubevirts", "kubevirt",
        [{"op": "remove",
          "path": f"/spec/configuration/permittedHostDevices/mediatedDevices/{index}"}],
        _content_type="application/json-patch+json",
    )  # fmt: skip
    wait_for(
        lambda: sorted(mediated(api_server)) == ["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"],
        "the allow-list entry put back",
        PATIENCE_S,
    )

    # The VGPUDevice CRD re-applied with a change: the watch of VGPUDevices ends and its
    # version has expired (410) in the new watch cache; the agent lists again.
    reapply_crd(api_server, "vgpudevices")
    watch.wait_log(
        lambda d: (
            d.get("msg") == "this node's VGPUDevices: the watch's version expired: listing again"
        ),
        "the VGPUDevices listed again after 410",
        PATIENCE_S,
    )
    # Followed by a watch again: the next edit is reset too.
    custom.patch_cluster_custom_object(
        DEVICES, V1BETA1, "vgpudevices", VF5, {"spec": {"vGPUTypeName": "NVIDIA A2-4C"}}
    )
    wait_for(
        lambda: type_of(api_server, VF5) == "NVIDIA A2-4Q",
        "a later hand edit reset",
        PATIENCE_S,
    )
    assert watch.metric("vgpuctl_drift_detected_total", source="cluster") >= 1
    assert watch.metric("vgpuctl_drift_detected_total", source="host") == 0

    assert watch.stop(signal.SIGTERM, timeout=PATIENCE_S) == 0
    messages = [d.get("msg") for d in watch.logs()]
    assert "SIGTERM: stopping once the reconcile under way is done" in messages
    assert messages[-1] == "stopped"
    assert not [d for d in watch.logs() if d.get("level") in ("ERROR", "CRITICAL")]
