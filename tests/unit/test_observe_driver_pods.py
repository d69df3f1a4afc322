"""The NVIDIA driver pods read for delegate mode (``observe/driver_pods.py``,
``observe/delegate.py``): one list of ``harvester-system``'s pods labelled
``app=nvidia-driver-daemonset`` (pcidevices v1beta1 ``DefaultNamespace``, ``NvidiaDriverLabel``),
matched to nodes by ``spec.nodeName`` as gpu_controller.go ``setupRemoteExecutor`` matches
them. Pod objects are written by hand in the kubelet's shapes (phase, the Ready condition,
container states); the expected reasons from those fields."""

from __future__ import annotations

from typing import Any

from reconciler.model import ForbiddenError
from reconciler.model.harvester import DriverPod
from reconciler.observe.delegate import driver_not_ready, observe_harvester_nodes
from reconciler.observe.driver_pods import driver_pods
from tests.doubles.cluster import FakeCluster

NODE = "harvester-kgd9c"
OTHER = "harvester-x2m4p"
LABELS = {"app": "nvidia-driver-daemonset"}


def pod(
    name: str,
    node: str,
    *,
    phase: str = "Running",
    ready: str = "True",
    reason: str = "",
    state: dict[str, Any] | None = None,
    namespace: str = "harvester-system",
    deleting: bool = False,
) -> dict[str, Any]:
    condition = {"type": "Ready", "status": ready, **({"reason": reason} if reason else {})}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": LABELS}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T21:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": node, "containers": [{"name": "nvidia-driver-ctr"}]},
        "status": {
            "phase": phase,
            "conditions": [condition],
            "containerStatuses": [{"name": "nvidia-driver-ctr", "state": state or {"running": {}}}],
        },
    }


CRASHING = pod(
    "nvidia-driver-runtime-x7k2p",
    NODE,
    ready="False",
    reason="ContainersNotReady",
    state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
)


def test_a_running_ready_pod_blocks_nothing_and_a_crashing_one_is_said_why() -> None:
    found = driver_pods([pod("nvidia-driver-runtime-aaaaa", NODE)], [NODE])
    assert found == {NODE: (None, ())}
    found = driver_pods([CRASHING], [NODE])
    assert found[NODE][0] == DriverPod(
        "nvidia-driver-runtime-x7k2p",
        "phase Running; Ready: False (ContainersNotReady); container nvidia-driver-ctr "
        "waiting: CrashLoopBackOff",
    )


def test_a_pod_still_starting_or_being_deleted_is_not_ready() -> None:
    starting = pod(
        "nvidia-driver-runtime-b",
        NODE,
        phase="Pending",
        ready="False",
        reason="ContainersNotReady",
        state={"waiting": {"reason": "ContainerCreating"}},
    )
    (found, _notes) = driver_pods([starting], [NODE])[NODE]
    assert found is not None and found.why == (
        "phase Pending; Ready: False (ContainersNotReady); container nvidia-driver-ctr waiting: "
        "ContainerCreating"
    )
    leaving = pod("nvidia-driver-runtime-c", NODE, deleting=True)
    assert driver_pods([leaving], [NODE])[NODE][0] == DriverPod(
        "nvidia-driver-runtime-c", "being deleted"
    )
    # No status at all yet (just created): not ready, and says what is missing.
    bare = {**pod("nvidia-driver-runtime-d", NODE), "status": {}}
    assert driver_pods([bare], [NODE])[NODE][0] == DriverPod(
        "nvidia-driver-runtime-d",
        "phase unknown; no Ready condition; container nvidia-driver-ctr has no status yet",
    )


def test_pods_of_other_nodes_and_unscheduled_ones_are_no_nodes_concern() -> None:
    unscheduled = pod("nvidia-driver-runtime-e", "", phase="Pending", ready="False")
    found = driver_pods([CRASHING | {"spec": {"nodeName": OTHER}}, unscheduled], [NODE])
    assert found == {NODE: (None, ())}
    # Each node gets its own.
    both = driver_pods([CRASHING, pod("nvidia-driver-runtime-f", OTHER)], [NODE, OTHER])
    assert both[OTHER] == (None, ())
    assert both[NODE][0] is not None and both[NODE][0].name == "nvidia-driver-runtime-x7k2p"


def test_malformed_pods_are_notes_or_fail_closed_never_a_traceback() -> None:
    bad_conditions = pod("nvidia-driver-runtime-g", NODE)
    bad_conditions["status"]["conditions"] = "Ready"
    bad_name = pod("nvidia-driver-runtime-h", NODE)
    bad_name["metadata"]["name"] = "x\x1b[31m"
    bad_node = pod("nvidia-driver-runtime-i", NODE)
    bad_node["spec"]["nodeName"] = ["harvester-kgd9c"]
    found, notes = driver_pods([bad_conditions, bad_name, bad_node, "not a pod"], [NODE])[NODE]  # type: ignore[list-item]
    # Its node is known, its state not: it counts as not ready there.
    assert found == DriverPod(
        "nvidia-driver-runtime-g",
        "its status could not be read: status.conditions is not a list of conditions",
    )
    assert notes == (
        "Pod harvester-system/?: metadata.name is not a name: ignored",
        "Pod harvester-system/nvidia-driver-runtime-i: spec.nodeName is not a name: ignored",
        "Pod harvester-system/?: not an object: ignored",
    )


def test_one_list_in_harvester_system_by_the_driver_label() -> None:
    api = FakeCluster()
    api.seed("pods", [CRASHING])
    # Not a driver pod: the same label elsewhere, or another app in harvester-system.
    api.seed("pods", [pod("nvidia-driver-runtime-j", OTHER, namespace="default", ready="False")])
    other_app = pod("virt-handler-k", OTHER, ready="False")
    other_app["metadata"]["labels"] = {"app": "virt-handler"}
    api.seed("pods", [other_app])
    observed = observe_harvester_nodes(api, [NODE, OTHER])
    pods = [call for call in api.lists if call.plural == "pods"]
    assert [(c.group, c.version, c.namespace, c.label_selector) for c in pods] == [
        ("", "v1", "harvester-system", "app=nvidia-driver-daemonset")
    ]
    assert observed[NODE].driver is not None
    assert observed[NODE].driver.name == "nvidia-driver-runtime-x7k2p"
    assert observed[OTHER].driver is None and observed[OTHER].driver_notes == ()
    assert observed[NODE].notes == ()  # nothing that would block the whole node
    assert driver_not_ready(api, NODE) == observed[NODE].driver


def test_a_list_the_role_does_not_allow_is_a_note_and_blocks_nothing() -> None:
    api = FakeCluster()
    api.seed("pods", [CRASHING])
    api.fail["pods"] = ForbiddenError("pods is forbidden: cannot list in harvester-system")
    observed = observe_harvester_nodes(api, [NODE])[NODE]
    assert observed.driver is None and observed.notes == ()
    assert observed.driver_notes == (
        "the NVIDIA driver pods in harvester-system could not be read (pods is forbidden: "
        "cannot list in harvester-system): steps are planned without knowing whether "
        "pcidevices-controller can carry them out (deploy/harvester/rbac.yaml grants the list)",
    )
    assert driver_not_ready(api, NODE) is None
