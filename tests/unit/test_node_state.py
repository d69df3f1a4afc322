"""The node's VGPUNodeState (issue 12 item 1) and Harvester's schema as the planner reads what is
stored (item 2): what the summary says, when it is written, and that an idle node writes nothing.

Expected values are written from the seed's node (desired-state/harvester-kgd9c.yaml: one A2,
four 4 GB vGPUs on VFs .4 to .7, the A2's maximum) and the case host
tests/cases/seed-already-applied (the seed applied: those four vGPUs exist).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.cluster import execute_cluster
from reconciler.apply.errors import MandateError
from reconciler.apply.mandate import ClusterMandate
from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.model import CrCreate, CrUpdate, DesiredNode, Inventory, PciAddress, Plan
from reconciler.model.cluster import (
    NODE_STATE_KIND,
    ClusterState,
    DeviceUse,
    KubeObject,
    harvester_view,
)
from reconciler.model.nodestate import PENDING_TIME, configured_profiles, stamped
from reconciler.plan import plan_node
from reconciler.plan.nodestate import desired_fingerprint
from tests.doubles.cluster import FakeCluster

REPO = Path(__file__).resolve().parents[2]
NODE = "harvester-kgd9c"
CATALOG = default_catalog()
EARLIER = "2026-11-30T10:00:00Z"
NOW = "2026-12-02T03:00:00Z"
#: The seed's vGPUs by VF (docs/domain.md §5; uuid5 of node and VF, as the README shows them).
SEED_VGPUS = {
    "0000:08:00.4": "NVIDIA A2-4A",
    "0000:08:00.5": "NVIDIA A2-4Q",
    "0000:08:00.6": "NVIDIA A2-4A",
    "0000:08:00.7": "NVIDIA A2-4Q",
}


def seed_node(text: str | None = None, tmp_path: Path | None = None) -> DesiredNode:
    path = REPO / "desired-state" / f"{NODE}.yaml"
    if text is not None:
        assert tmp_path is not None
        path = tmp_path / "desired.yaml"
        path.write_text(text)
    node = load_desired([path], catalog=CATALOG).node(NODE)
    assert node is not None
    return node


def applied_host() -> Inventory:
    raw = json.loads((REPO / "tests/cases/seed-already-applied/observed.json").read_text())
    return Inventory.from_json(raw)


def plan(cluster: ClusterState, node: DesiredNode | None = None) -> Plan:
    return plan_node(node or seed_node(), applied_host(), catalog=CATALOG, cluster=cluster)


def node_state_write(p: Plan) -> CrCreate | CrUpdate:
    (write,) = [a for a in p.actions if a.target == NODE]
    assert isinstance(write, CrCreate | CrUpdate)
    assert write.object.kind == NODE_STATE_KIND
    return write


def as_written(obj: KubeObject, time: str = EARLIER) -> KubeObject:
    """``obj`` as the cluster executor wrote it at ``time`` and the server returns it."""
    return replace(obj, status=stamped(obj.status, time), resource_version="41")


def converged_cluster() -> ClusterState:
    """The seed applied: every object as vgpuctl wrote it, the node state included."""
    first = plan(ClusterState(NODE))
    objects = {
        a.object.name: as_written(a.object) for a in first.actions if isinstance(a, CrCreate)
    }
    state = objects.pop(NODE)
    return ClusterState(
        NODE,
        sriov_gpu_devices={n: o for n, o in objects.items() if o.kind == "SRIOVGPUDevice"},
        vgpu_devices={n: o for n, o in objects.items() if o.kind == "VGPUDevice"},
        node_state=state,
    )


# -- what it says -------------------------------------------------------------------------------


def test_the_summary_of_the_seeds_node() -> None:
    write = node_state_write(plan(ClusterState(NODE)))
    obj = write.object
    assert (obj.name, dict(obj.spec)) == (NODE, {"nodeName": NODE})
    assert dict(obj.labels) == {"nodename": NODE, "app.kubernetes.io/managed-by": "vgpuctl"}
    status = obj.status
    assert status["counts"] == {
        "gpus": 1, "managedGPUs": 1, "vfs": 16, "vgpus": 4, "inUse": 0, "blocked": 0,
    }  # fmt: skip
    assert {v["vf"]: v["profile"] for v in status["vgpus"]} == SEED_VGPUS
    assert [v["vfIndex"] for v in status["vgpus"]] == [0, 1, 2, 3]
    (gpu,) = status["gpus"]
    assert (gpu["address"], gpu["model"], gpu["managed"]) == ("0000:08:00.0", "NVIDIA A2", True)
    assert gpu["sriov"]["numVFs"] == 16 and len(gpu["vfAddresses"]) == 16
    # The A2's vGPU types (the seed host's 15, by the driver's type ids), once for the node.
    ((types),) = status["typeSets"]
    assert gpu["typeSet"] == 0 and "vgpuTypes" not in gpu
    assert [t["id"] for t in types] == [f"nvidia-{742 + i}" for i in range(15)]
    profiles = {p["name"]: p for p in status["profiles"]}
    # Four 4 GB vGPUs are the A2's maximum: nothing is creatable anywhere any more.
    assert profiles["NVIDIA A2-4A"] == {
        "name": "NVIDIA A2-4A",
        "resourceName": "nvidia.com/NVIDIA_A2-4A",
        "wanted": 2,
        "vgpus": 2,
        "inUse": 0,
        "creatable": 0,
    }
    assert set(profiles) == {"NVIDIA A2-4A", "NVIDIA A2-4Q"}
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Converged", "True", "Converged"),
        ("Blocked", "False", "NothingBlocked"),
        ("Degraded", "False", "AllGPUsDrivable"),
    ]
    # Times are the write's: left for the executor to stamp.
    assert {c["lastTransitionTime"] for c in status["conditions"]} == {PENDING_TIME}
    assert status["vgpuctlVersion"] == "0.1.0"
    assert status["desiredFingerprint"].startswith("sha256:")
    # The seed is already applied: this reconcile writes objects, not the host.
    assert status["lastChange"] == {
        "time": PENDING_TIME,
        "result": "applied 17 actions: 17 cr-create",
    }


def test_a_vgpu_in_use_is_shown_with_its_holder_and_blocks_a_change(tmp_path: Path) -> None:
    cluster = converged_cluster()
    uuid = next(v["uuid"] for v in cluster.node_state.status["vgpus"] if v["vf"] == "0000:08:00.5")  # type: ignore[union-attr]
    held = replace(
        cluster,
        device_uses={uuid: DeviceUse(uuid, "nvidia.com/NVIDIA_A2-4Q", "VM default/win11 (pod p)")},
    )
    changed = seed_node(
        (REPO / "desired-state" / f"{NODE}.yaml")
        .read_text()
        .replace('"0000:08:00.5": NVIDIA A2-4Q', '"0000:08:00.5": NVIDIA A2-4A'),
        tmp_path,
    )
    status = node_state_write(plan(held, changed)).object.status
    vf5 = next(v for v in status["vgpus"] if v["vf"] == "0000:08:00.5")
    assert (vf5["inUse"], vf5["holder"]) == (True, "VM default/win11 (pod p)")
    assert (status["counts"]["inUse"], status["counts"]["blocked"]) == (1, 2)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Converged"]["status"], conditions["Converged"]["reason"]) == (
        "False",
        "ChangesBlocked",
    )
    assert conditions["Blocked"]["status"] == "True"
    assert conditions["Blocked"]["message"].startswith(
        "2 changes blocked: vgpu-remove 0000:08:00.5"
    )
    assert "VM default/win11" in conditions["Blocked"]["message"]
    # Converged and Blocked changed status: their times are the write's. Degraded did not.
    assert conditions["Converged"]["lastTransitionTime"] == PENDING_TIME
    assert conditions["Blocked"]["lastTransitionTime"] == PENDING_TIME
    assert conditions["Degraded"]["lastTransitionTime"] == EARLIER


def test_a_managed_gpu_that_cannot_be_driven_is_degraded() -> None:
    host = applied_host()
    gpu = host.gpus[0]
    passed_through = replace(host, gpus=(replace(gpu, driver="vfio-pci"),))
    p = plan_node(seed_node(), passed_through, catalog=CATALOG, cluster=ClusterState(NODE))
    conditions = {c["type"]: c for c in node_state_write(p).object.status["conditions"]}
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
        "True",
        "GPUsNotDrivable",
    )
    assert "GPU 0000:08:00.0 is bound to vfio-pci" in conditions["Degraded"]["message"]
    assert (conditions["Converged"]["status"], conditions["Converged"]["reason"]) == (
        "False",
        "Degraded",
    )


# -- when it is written -------------------------------------------------------------------------


def test_an_idle_node_writes_nothing() -> None:
    p = plan(converged_cluster())
    assert p.actions == ()
    assert any(n.target == NODE and n.reason == "VGPUNodeState up to date" for n in p.noops)


def test_a_reconcile_that_changes_nothing_else_keeps_the_last_change() -> None:
    cluster = converged_cluster()
    stored = cluster.node_state
    assert stored is not None and stored.status["lastChange"]["time"] == EARLIER
    # A VM starts using .4's vGPU: the summary shows it, nothing else changes.
    uuid = stored.status["vgpus"][0]["uuid"]
    held = replace(cluster, device_uses={uuid: DeviceUse(uuid, "nvidia.com/NVIDIA_A2-4A", "pod x")})
    write = node_state_write(plan(held))
    assert isinstance(write, CrUpdate) and write.status_changed and not write.spec_changed
    assert write.object.status["lastChange"] == stored.status["lastChange"]
    assert [c.path for c in write.changes] == [
        "status.counts.inUse",
        "status.vgpus",
        "status.profiles",
    ]


def test_a_stored_text_too_long_to_be_vgpuctls_is_not_carried_over() -> None:
    cluster = converged_cluster()
    stored = cluster.node_state
    assert stored is not None
    status = {**stored.status, "lastChange": {"time": EARLIER, "result": "x" * (1 << 20)}}
    cluster = replace(cluster, node_state=replace(stored, status=status))
    write = node_state_write(plan(cluster))
    assert isinstance(write, CrUpdate) and "lastChange" not in write.object.status


def test_a_reconcile_that_changes_something_records_it(tmp_path: Path) -> None:
    cluster = converged_cluster()
    fewer = seed_node(
        (REPO / "desired-state" / f"{NODE}.yaml")
        .read_text()
        .replace('            "0000:08:00.7": NVIDIA A2-4Q\n', ""),
        tmp_path,
    )
    p = plan(cluster, fewer)
    write = node_state_write(p)
    # The plan, read by hand: .7's vGPU removed, .7's VGPUDevice and every VF whose offer
    # widens updated, the node state; the device plugin of A2-4Q refreshed (not counted).
    result = write.object.status["lastChange"]["result"]
    assert result.startswith("applied ") and "1 vgpu-remove" in result
    assert write.object.status["lastChange"]["time"] == PENDING_TIME
    assert (
        write.object.status["desiredFingerprint"] != cluster.node_state.status["desiredFingerprint"]
    )  # type: ignore[union-attr]


def test_the_executor_stamps_pending_times_and_keeps_the_others() -> None:
    status = {
        "conditions": [
            {"type": "Converged", "status": "True", "lastTransitionTime": PENDING_TIME},
            {"type": "Blocked", "status": "False", "lastTransitionTime": EARLIER},
        ],
        "lastChange": {"time": PENDING_TIME, "result": "applied 1 action: 1 cr-create"},
    }
    assert stamped(status, NOW) == {
        "conditions": [
            {"type": "Converged", "status": "True", "lastTransitionTime": NOW},
            {"type": "Blocked", "status": "False", "lastTransitionTime": EARLIER},
        ],
        "lastChange": {"time": NOW, "result": "applied 1 action: 1 cr-create"},
    }
    # Through the cluster executor: what reaches the API server is stamped.
    write = node_state_write(plan(ClusterState(NODE)))
    api = FakeCluster()
    result = execute_cluster([write], api=api, node=NODE, now=lambda: NOW)
    assert result.ok, result.failed
    stored = api.get_object(
        group="vgpu.reconciler.dev", version="v1alpha1", plural="vgpunodestates", name=NODE
    )
    assert stored is not None
    assert {c["lastTransitionTime"] for c in stored["status"]["conditions"]} == {NOW}
    assert stored["status"]["lastChange"]["time"] == NOW


def test_the_mandate_refuses_another_nodes_summary() -> None:
    write = node_state_write(plan(ClusterState(NODE)))
    other = replace(
        write,
        target="gpu-node-2",
        object=replace(write.object, name="gpu-node-2"),
    )
    mandate = ClusterMandate(node=NODE, managed=frozenset({PciAddress.parse("0000:08:00.0")}))
    mandate.check([write])  # its own: allowed
    with pytest.raises(MandateError) as err:
        mandate.check([other])
    assert "a VGPUNodeState named gpu-node-2 is not node harvester-kgd9c's" in err.value.message


# -- the desired state's fingerprint and the profiles configured --------------------------------


def test_the_fingerprint_depends_on_what_is_desired_not_how_it_was_written(tmp_path: Path) -> None:
    text = (REPO / "desired-state" / f"{NODE}.yaml").read_text()
    reordered = text.replace(
        '            "0000:08:00.4": NVIDIA A2-4A\n            "0000:08:00.5": NVIDIA A2-4Q\n',
        '            "0000:08:00.5": NVIDIA A2-4Q\n            "0000:08:00.4": NVIDIA A2-4A\n',
    )
    assert reordered != text
    commented = "# another comment\n" + reordered
    assert desired_fingerprint(seed_node(commented, tmp_path)) == desired_fingerprint(seed_node())
    other = text.replace('"0000:08:00.7": NVIDIA A2-4Q', '"0000:08:00.7": NVIDIA A2-4A')
    assert desired_fingerprint(seed_node(other, tmp_path)) != desired_fingerprint(seed_node())


def test_configured_profiles_are_wanted_or_present() -> None:
    status: dict[str, Any] = {
        "profiles": [
            {"name": "NVIDIA A2-4Q", "wanted": 2, "vgpus": 0},
            {"name": "NVIDIA A2-4A", "wanted": 0, "vgpus": 1},
            {"name": "NVIDIA A2-8Q", "wanted": 0, "vgpus": 0, "creatable": 2},
            {"name": "", "wanted": 1},
            {"name": "NVIDIA A2-1Q", "wanted": True},  # not a count
            "garbage",
        ]
    }
    assert configured_profiles(status) == {"NVIDIA A2-4Q", "NVIDIA A2-4A"}
    assert configured_profiles({"profiles": "x"}) == frozenset()


# -- Harvester's schema, as the planner reads what is stored --------------------------------------


def vgpu_device(spec: dict[str, Any], status: dict[str, Any]) -> KubeObject:
    return KubeObject(
        kind="VGPUDevice",
        name=f"{NODE}-000008010",
        labels={"nodename": NODE},
        spec=spec,
        status=status,
        resource_version="7",
    )


def test_harvesters_view_reads_absent_and_null_as_go_does_and_drops_the_rest() -> None:
    stored = vgpu_device(
        {"address": "0000:08:01.0", "enabled": None, "nodeName": NODE, "colour": "blue"},
        {"uuid": "", "vGPUStatus": None, "availableTypes": {}, "inUse": True, "vfIndex": 4},
    )
    view = harvester_view(stored)
    assert dict(view.spec) == {
        "address": "0000:08:01.0",
        "enabled": False,
        "nodeName": NODE,
        "parentGPUDeviceAddress": "",
        "vGPUTypeName": "",
    }
    assert dict(view.status) == {}
    assert (view.resource_version, dict(view.labels)) == ("7", {"nodename": NODE})
    summary = KubeObject(kind=NODE_STATE_KIND, name=NODE, status={"anything": 1})
    assert harvester_view(summary) is summary


def test_objects_written_under_the_old_schema_need_no_update() -> None:
    """Objects an earlier vgpuctl wrote with its own status fields (vfIndex, inUse, holder,
    model, vgpuTypes...): Harvester's schema prunes them; the planner ignores them."""
    cluster = converged_cluster()
    old = {
        name: replace(o, status={**o.status, "vfIndex": 3, "inUse": False, "holder": ""})
        for name, o in cluster.vgpu_devices.items()
    }
    assert plan(replace(cluster, vgpu_devices=old)).actions == ()


def test_the_harvester_uis_disable_of_an_unwanted_vf_is_no_difference() -> None:
    """The UI's Disable saves the object without spec.vGPUTypeName: for a VF the desired state
    leaves empty that is what vgpuctl wrote."""
    cluster = converged_cluster()
    name = f"{NODE}-000008010"
    stored = cluster.vgpu_devices[name]
    spec = {k: v for k, v in stored.spec.items() if k != "vGPUTypeName"}
    edited = {**cluster.vgpu_devices, name: replace(stored, spec=spec)}
    assert plan(replace(cluster, vgpu_devices=edited)).actions == ()


def test_the_harvester_uis_disable_of_a_wanted_vgpu_is_drift() -> None:
    cluster = converged_cluster()
    name = f"{NODE}-000008005"
    stored = cluster.vgpu_devices[name]
    spec = {k: v for k, v in stored.spec.items() if k != "vGPUTypeName"} | {"enabled": False}
    edited = {**cluster.vgpu_devices, name: replace(stored, spec=spec)}
    p = plan(replace(cluster, vgpu_devices=edited))
    (drift,) = p.drift
    assert drift.target == name
    update = next(a for a in p.actions if a.target == name)
    assert isinstance(update, CrUpdate) and update.drift
    assert update.object.spec["vGPUTypeName"] == "NVIDIA A2-4Q"


def test_gpus_with_the_same_types_share_one_list() -> None:
    from reconciler.plan.nodestate import render_node_state

    host = applied_host()
    a2 = host.gpus[0]
    twin = replace(a2, address=PciAddress.parse("0000:09:00.0"), vfs=())
    fewer = replace(a2, address=PciAddress.parse("0000:0a:00.0"), vfs=(), types=a2.types[:-1])
    node = render_node_state(
        NODE,
        desired=None,
        predicted=replace(host, gpus=(a2, twin, fewer)),
        managed=frozenset(),
        assignments={},
        blocked=(),
        degraded=(),
        changes=(),
        stored=None,
    )
    assert [g["typeSet"] for g in node.status["gpus"]] == [0, 0, 1]
    assert [len(s) for s in node.status["typeSets"]] == [15, 14]
