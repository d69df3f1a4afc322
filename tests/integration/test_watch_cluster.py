"""``vgpuctl watch`` with a cluster: the API-server emulator in this process, the agent in a
subprocess with ``--kubeconfig``.

Cluster drift is found by watches (list once, then watch: this node's objects, every node's
VGPUNodeState and the KubeVirt CR; a rescan makes no request); a hand edit is reset, an invalid
desired state becomes a Warning Event. The same agent against the real kube-apiserver, as its
pod-bound token under deploy/'s role and policy: ``test_real_watch_cluster.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests import rbac
from tests.cluster_node import VGPUS, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.watch_agent import Watch, seed_text, wait_for

#: Every scenario runs with our CRDs and with Harvester's own (what pcidevices-controller
#: installs): vgpuctl must converge under either.
CRD_SETS = ("ours", "harvester")

TARGET = "harvester-kgd9c-000008005"


def quiet_for(emu: ApiServerEmulator, seconds: float) -> bool:
    """No request but watches for ``seconds``."""
    import time

    before = [r for r in emu.requests if r.verb != "watch"]
    time.sleep(seconds)
    return [r for r in emu.requests if r.verb != "watch"] == before


def test_a_hand_edit_of_our_object_is_reset_at_the_next_rescan(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence")
    assert stored(emu, VGPUS, TARGET)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"

    # Idle: the cluster is followed by watches (issue 12, item 5), so a rescan makes no
    # request at all, and nothing is written. (The events of the run's own writes may arrive
    # after its last look and cause one more reconcile, which finds nothing to do: let it.)
    wait_for(lambda: quiet_for(emu, 1.0), "the agent quiet")
    emu.requests.clear()
    rescans = watch.metric("vgpuctl_rescan_duration_seconds_count")
    wait_for(
        lambda: watch.metric("vgpuctl_rescan_duration_seconds_count") >= rescans + 3,
        "three idle rescans",
    )
    assert {r.verb for r in emu.requests} <= {"watch"}, emu.requests

    edited = stored(emu, VGPUS, TARGET)
    edited["spec"]["vGPUTypeName"] = "NVIDIA A2-4C"
    emu.seed(edited)
    wait_for(
        lambda: stored(emu, VGPUS, TARGET)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q",
        "the hand edit reset",
        timeout=10,
    )
    assert watch.metric("vgpuctl_drift_detected_total", source="cluster") >= 1
    assert watch.metric("vgpuctl_drift_detected_total", source="host") == 0


def test_an_invalid_desired_state_is_a_warning_event(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence")
    desired.write_text(seed_text("NVIDIA A2-99Q"))

    def warnings() -> list[dict[str, object]]:
        return [
            e
            for e in emu.objects("", "v1", "events", "default")
            if e["reason"] == "InvalidDesiredState"
        ]

    wait_for(lambda: bool(warnings()), "the Event", timeout=10)
    (event,) = warnings()
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "SRIOVGPUDevice"  # type: ignore[index]
    assert event["involvedObject"]["name"] == "harvester-kgd9c-000008000"  # type: ignore[index]
    assert str(desired) in str(event["message"])
    assert stored(emu, VGPUS, TARGET)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"  # kept


def test_watch_needs_no_verb_the_role_does_not_grant(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    emu.requests.clear()
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence")
    desired.write_text(seed_text("NVIDIA A2-4C"))
    wait_for(
        lambda: (
            stored(emu, VGPUS, "harvester-kgd9c-000008004")["spec"]["vGPUTypeName"]
            == "NVIDIA A2-4C"
        ),
        "the edit",
    )
    desired.write_text(seed_text("NVIDIA A2-99Q"))  # an Event
    wait_for(lambda: watch.metric("vgpuctl_desired_state_valid") == 0, "the invalid state")
    granted = rbac.grants()
    denied = sorted({rbac.needed(r) for r in emu.requests if not rbac.allows(granted, r)})
    assert not denied, f"watch needs more than the role grants: {denied}"
    # The cluster is followed by watches: this node's objects (selected), every summary and
    # the KubeVirt CR.
    watched = {(r.group, r.resource) for r in emu.requests if r.verb == "watch"}
    assert watched == {
        ("devices.harvesterhci.io", "sriovgpudevices"),
        ("devices.harvesterhci.io", "vgpudevices"),
        ("vgpu.reconciler.dev", "vgpunodestates"),
        ("kubevirt.io", "kubevirts"),
    }


def test_labelling_the_node_brings_it_into_a_node_group(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    """The agent reads its own Node while a group selects by labels: labelling the node, with
    no change to the files, makes the group configure its GPU at the next rescan; an invalid
    desired state is then a Warning Event on that GPU's object."""
    node = cluster_node(tmp_path, emu)
    emu.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.node}})
    desired = tmp_path / "desired.yaml"
    desired.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: lab}\nspec:\n  nodeGroups:\n    - name: vdi\n"
        "      selector: {labels: {example.com/pool: vdi}}\n"
        "      gpus: [{match: {model: A2}, sriov: enabled, profiles: {A2-4Q: 4}}]\n"
    )
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first reconcile")
    assert not emu.objects(*VGPUS)  # not labelled: no group selects it
    assert [r.verb for r in emu.requests if r.resource == "nodes"][:1] == ["get"]

    emu.seed(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.node, "labels": {"example.com/pool": "vdi"}},
        }
    )
    wait_for(
        lambda: sum(1 for o in emu.objects(*VGPUS) if o["spec"].get("vGPUTypeName")) == 4,
        "four A2-4Q once the node is labelled",
        timeout=20,
    )
    assert watch.metric("vgpuctl_drift_detected_total", source="desired") >= 1

    # The GPU a group configures carries the Warning Event of an invalid desired state, as a
    # listed one does (the last run's plan says which GPUs the groups gave the node).
    desired.write_text(desired.read_text().replace("A2-4Q: 4", "A2-4Q: 99"))
    wait_for(
        lambda: any(
            e["reason"] == "InvalidDesiredState"
            and e["involvedObject"]["name"] == "harvester-kgd9c-000008000"
            for e in emu.objects("", "v1", "events", "default")
        ),
        "the Warning Event on the group's GPU",
        timeout=10,
    )
