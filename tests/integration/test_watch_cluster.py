"""``vgpuctl watch`` with a cluster: the API-server emulator in this process, the agent in a
subprocess with ``--kubeconfig``.

Cluster drift is found by polling the resourceVersions of this node's objects and of the
KubeVirt CR at each rescan (list calls: no ``watch`` verb, so the ClusterRole does not
change); a hand edit is reset, an invalid desired state becomes a Warning Event.
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


def test_a_hand_edit_of_our_object_is_reset_at_the_next_rescan(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence")
    assert stored(emu, VGPUS, TARGET)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"

    # An idle rescan only lists (three list calls); it writes nothing.
    emu.requests.clear()
    wait_for(lambda: len(emu.requests) >= 6, "two idle rescans")
    assert {r.verb for r in emu.requests} == {"list"}

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
    wait_for(lambda: watch.reconciles() == 2, "the edit")
    desired.write_text(seed_text("NVIDIA A2-99Q"))  # an Event
    wait_for(lambda: watch.metric("vgpuctl_desired_state_valid") == 0, "the invalid state")
    granted = rbac.grants()
    denied = sorted({rbac.needed(r) for r in emu.requests if not rbac.allows(granted, r)})
    assert not denied, f"watch needs more than the role grants: {denied}"
    assert "watch" not in {r.verb for r in emu.requests}
