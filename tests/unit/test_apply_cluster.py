"""The cluster executor against an in-memory API server with resourceVersions and a status
subresource: writes, preconditions, conflicts and re-planning."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from reconciler.apply.cluster import (
    SKIPPED_NOT_CLUSTER,
    allow_list_change,
    allow_list_patch,
    execute_cluster,
    record_host_events,
)
from reconciler.apply.executor import Outcome, OutcomeStatus
from reconciler.apply.mandate import ClusterMandate
from reconciler.model import (
    Action,
    ActionKind,
    ApplyError,
    Blocked,
    CrCreate,
    CrDelete,
    CrUpdate,
    KubevirtAllow,
    KubevirtUpdate,
    MediatedDevice,
    PciAddress,
    PciHostDevice,
    SriovEnable,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.cluster import (
    KUBEVIRT_OWNED_ANNOTATION,
    KUBEVIRT_OWNED_PCI_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    VGPU_KIND,
    KubeObject,
)
from reconciler.model.retiring import KUBEVIRT_RETIRING_ANNOTATION
from tests.doubles import jsonpatch
from tests.doubles.cluster import FakeCluster, Key

NODE = "harvester-kgd9c"
NAME = "harvester-kgd9c-000008004"


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def event(
        self,
        kind: str,
        name: str,
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        uid: str = "",
    ) -> None:
        self.recorded.append((kind, name, reason, type))


# -- objects and actions ------------------------------------------------------------------------


def intended(profile: str = "NVIDIA A2-4Q", uuid: str = "u-1") -> KubeObject:
    return KubeObject(
        kind=VGPU_KIND,
        name=NAME,
        labels={NODE_LABEL: NODE, MANAGED_BY_LABEL: MANAGED_BY},
        spec={
            "address": "0000:08:00.4",
            "enabled": True,
            "vGPUTypeName": profile,
            "nodeName": NODE,
            "parentGPUDeviceAddress": "0000:08:00.0",
        },
        status={"vGPUStatus": "vGPUConfigured", "uuid": uuid},
    )


def create(obj: KubeObject, seq: int = 1) -> CrCreate:
    return CrCreate(seq=seq, target=obj.name, reason="missing", object=obj)


def update(obj: KubeObject, rv: str, *, spec: bool = True, status: bool = True) -> CrUpdate:
    body = KubeObject(**{**_fields(obj), "resource_version": rv})
    return CrUpdate(
        seq=2,
        target=obj.name,
        reason="differs",
        resource_version=rv,
        object=body,
        spec_changed=spec,
        status_changed=status,
    )


def _fields(obj: KubeObject) -> dict[str, Any]:
    return {
        "kind": obj.kind,
        "name": obj.name,
        "labels": obj.labels,
        "annotations": obj.annotations,
        "spec": obj.spec,
        "status": obj.status,
    }


def host_action(kind: ActionKind, target: str) -> Any:
    """A host action of ``kind`` on ``target`` (the cluster executor only skips these)."""
    gpu = PciAddress.parse("0000:08:00.0")
    common: dict[str, Any] = {"seq": 1, "target": target, "reason": "r", "gpu": gpu}
    vgpu = {"vf_index": 0, "type_name": "NVIDIA A2-4Q", "uuid": "u"}
    match kind:
        case ActionKind.SRIOV_ENABLE:
            return SriovEnable(**common, num_vfs=16)
        case ActionKind.VGPU_CREATE:
            return VgpuCreate(**common, **vgpu)
        case ActionKind.VGPU_REMOVE:
            return VgpuRemove(**common, **vgpu)
        case ActionKind.CR_CREATE:
            return create(intended())
    raise AssertionError(kind)


def delete(rv: str, name: str = NAME) -> CrDelete:
    return CrDelete(seq=3, target=name, reason="gone", object_kind=VGPU_KIND, resource_version=rv)


def simple_replan(want: KubeObject, current: KubeObject | None) -> Action | None:
    """A stand-in for the planner's replan_object: update whatever differs."""
    if current is None:
        return create(want)
    spec = dict(current.spec) != dict(want.spec)
    status = dict(current.status) != dict(want.status)
    if not (spec or status):
        return None
    return update(want, current.resource_version, spec=spec, status=status)


def stored(fake: FakeCluster, name: str = NAME) -> dict[str, Any]:
    return fake.store[("vgpudevices", None, name)]


# -- writes -------------------------------------------------------------------------------------


def test_create_then_status_through_the_subresource() -> None:
    fake = FakeCluster()
    result = execute_cluster([create(intended())], api=fake, node=NODE)
    assert result.ok
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.message == f"created vgpudevices/{NAME}, status written"
    # The status PUT carries the version the create returned.
    assert fake.calls == [("create", "vgpudevices", None), ("update/status", "vgpudevices", "101")]
    assert stored(fake)["status"] == {"vGPUStatus": "vGPUConfigured", "uuid": "u-1"}
    assert result.node == NODE


def test_create_without_status_is_one_request() -> None:
    fake = FakeCluster()
    obj = KubeObject(kind=VGPU_KIND, name=NAME, spec={**intended().spec, "enabled": False})
    result = execute_cluster([create(obj)], api=fake)
    assert result.outcomes[0].message == f"created vgpudevices/{NAME}"
    assert [c[0] for c in fake.calls] == ["create"]


def test_update_sends_the_planned_version_then_status_with_the_returned_one() -> None:
    fake = FakeCluster()
    rv = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())
    result = execute_cluster([update(intended(), rv)], api=fake)
    assert result.outcomes[0].status is OutcomeStatus.DONE
    assert fake.calls == [
        ("update", "vgpudevices", rv),
        ("update/status", "vgpudevices", str(int(rv) + 1)),
    ]
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"


def test_status_only_update_is_one_status_request() -> None:
    fake = FakeCluster()
    rv = fake.put("vgpudevices", intended(uuid="old").to_json())
    result = execute_cluster([update(intended(), rv, spec=False)], api=fake)
    assert fake.calls == [("update/status", "vgpudevices", rv)]
    assert result.outcomes[0].message == f"wrote the status of vgpudevices/{NAME}"
    assert stored(fake)["status"]["uuid"] == "u-1"


def test_a_status_that_became_empty_is_written_empty() -> None:
    """A VF whose vGPU is gone (or a GPU whose VFs all are) has a status with nothing in it:
    written so, not left saying what was there."""
    fake = FakeCluster()
    rv = fake.put("vgpudevices", intended().to_json())
    emptied = KubeObject(**{**_fields(intended()), "spec": {**intended().spec}, "status": {}})
    result = execute_cluster([update(emptied, rv, spec=False)], api=fake)
    assert result.ok
    assert fake.calls == [("update/status", "vgpudevices", rv)]
    assert stored(fake).get("status", {}) == {}


def test_spec_only_update_leaves_status_alone() -> None:
    fake = FakeCluster()
    rv = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())
    execute_cluster([update(intended(), rv, status=False)], api=fake)
    assert [c[0] for c in fake.calls] == ["update"]


def test_delete_carries_the_resource_version_precondition() -> None:
    fake = FakeCluster()
    rv = fake.put("vgpudevices", intended().to_json())
    result = execute_cluster([delete(rv)], api=fake)
    assert fake.calls == [("delete", "vgpudevices", rv)]
    assert result.outcomes[0].message == f"deleted vgpudevices/{NAME}"
    assert not fake.store


# -- conflicts ----------------------------------------------------------------------------------


def test_conflict_rereads_replans_and_retries_with_the_fresh_version() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())
    # Someone edits the object after the plan was made.
    edited = intended("NVIDIA A2-8Q", uuid="theirs").to_json()
    fresh = fake.put("vgpudevices", edited)
    seen: list[tuple[KubeObject, KubeObject | None]] = []

    def replan(want: KubeObject, current: KubeObject | None) -> Action | None:
        seen.append((want, current))
        return simple_replan(want, current)

    result = execute_cluster([update(intended(), planned)], api=fake, replan=replan)
    assert result.ok
    assert result.outcomes[0].message.endswith("(after 1 conflict: re-read and re-planned)")
    assert [c[:2] for c in fake.calls] == [
        ("update", "vgpudevices"),
        ("get", "vgpudevices"),
        ("update", "vgpudevices"),
        ("update/status", "vgpudevices"),
    ]
    assert fake.calls[0][2] == planned
    assert fake.calls[2][2] == fresh
    ((want, current),) = seen
    assert want.spec["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert current is not None
    assert current.spec["vGPUTypeName"] == "NVIDIA A2-8Q"
    assert current.resource_version == fresh
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"


def test_gives_up_after_the_retries_and_runs_nothing_after() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())

    def meddle(verb: str, key: Key) -> None:  # another writer wins every race
        fake.put("vgpudevices", fake.store[key])

    fake.before_write = meddle
    events = Events()
    later = delete("1", name="harvester-kgd9c-000008005")
    result = execute_cluster(
        [update(intended(), planned), later],
        api=fake,
        replan=simple_replan,
        events=events,
        max_conflict_retries=2,
    )
    failed = result.failed
    assert failed is not None
    assert failed.message == (
        f"vgpudevices/{NAME} kept changing under us: gave up after 3 conflicts"
    )
    assert failed.transient
    assert [c[0] for c in fake.calls].count("update") == 3  # the first try and two retries
    assert result.not_run == (later,)
    assert events.recorded == [(VGPU_KIND, NAME, "UpdateFailed", "Warning")]


def test_without_replan_a_conflict_fails_asking_for_a_new_plan() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())
    fake.put("vgpudevices", stored(fake))
    result = execute_cluster([update(intended(), planned)], api=fake)
    assert result.failed is not None
    assert "run plan again" in result.failed.message
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4A"  # never overwritten blindly


def test_replan_finding_nothing_to_do_is_a_noop() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended("NVIDIA A2-4A").to_json())
    fake.put("vgpudevices", intended().to_json())  # someone made it exactly right
    result = execute_cluster([update(intended(), planned)], api=fake, replan=simple_replan)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.NOOP
    assert outcome.message == (
        f"vgpudevices/{NAME} is already as intended (after 1 conflict: re-read and re-planned)"
    )


def test_create_of_an_existing_object_replans_into_an_update() -> None:
    fake = FakeCluster()
    fake.put("vgpudevices", intended("NVIDIA A2-4A", uuid="old").to_json())
    result = execute_cluster([create(intended())], api=fake, replan=simple_replan)
    assert result.ok
    assert [c[0] for c in fake.calls] == ["create", "get", "update", "update/status"]
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"


def test_a_status_conflict_after_a_create_still_reports_the_create() -> None:
    fake = FakeCluster()

    def meddle(verb: str, key: Key) -> None:
        if verb == "update/status" and fake.before_write is not None:
            fake.before_write = None
            fake.put("vgpudevices", fake.store[key])

    fake.before_write = meddle
    result = execute_cluster([create(intended())], api=fake, replan=simple_replan)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.message.startswith(f"created vgpudevices/{NAME}, status written")
    assert stored(fake)["status"]["uuid"] == "u-1"


def test_an_update_of_a_deleted_object_replans_into_a_create() -> None:
    fake = FakeCluster()
    result = execute_cluster([update(intended(), "55")], api=fake, replan=simple_replan)
    assert result.ok
    assert [c[0] for c in fake.calls] == ["update", "get", "create", "update/status"]


def test_delete_conflict_retries_with_the_fresh_version_while_still_ours() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended().to_json())
    fresh = fake.put("vgpudevices", intended("NVIDIA A2-8Q").to_json())
    result = execute_cluster([delete(planned)], api=fake)
    assert result.ok
    assert fake.calls == [
        ("delete", "vgpudevices", planned),
        ("get", "vgpudevices", None),
        ("delete", "vgpudevices", fresh),
    ]
    assert not fake.store


def test_delete_of_an_object_taken_over_meanwhile_leaves_it_alone() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended().to_json())
    taken = intended().to_json()
    taken["metadata"]["labels"][MANAGED_BY_LABEL] = "pcidevices-controller"
    fake.put("vgpudevices", taken)
    result = execute_cluster([delete(planned)], api=fake)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.NOOP
    assert outcome.message == (
        f"vgpudevices/{NAME} is now managed by pcidevices-controller: left alone "
        "(after 1 conflict: re-read and re-planned)"
    )
    assert fake.store


def test_create_racing_another_controller_leaves_its_object_alone() -> None:
    fake = FakeCluster()
    theirs = intended("NVIDIA A2-16Q").to_json()
    theirs["metadata"]["labels"] = {NODE_LABEL: NODE}  # Harvester's controller, no managed-by
    fake.put("vgpudevices", theirs)
    replans: list[KubeObject | None] = []

    def replan(want: KubeObject, current: KubeObject | None) -> Action | None:
        replans.append(current)
        return simple_replan(want, current)

    result = execute_cluster([create(intended())], api=fake, replan=replan)
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.NOOP
    assert "is now managed by another controller: left alone" in outcome.message
    assert replans == []
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-16Q"


def test_an_adopting_update_replans_over_another_controllers_object() -> None:
    fake = FakeCluster()
    theirs = intended("NVIDIA A2-16Q").to_json()
    theirs["metadata"]["labels"] = {NODE_LABEL: NODE}
    planned = fake.put("vgpudevices", theirs)
    fake.put("vgpudevices", stored(fake))  # changed since the plan
    action = update(intended(), planned)
    action = replace(action, reason="adopt", adopt=True)
    result = execute_cluster([action], api=fake, replan=simple_replan)
    assert result.ok
    assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"


def test_delete_of_an_object_gone_meanwhile_is_a_noop() -> None:
    fake = FakeCluster()
    planned = fake.put("vgpudevices", intended().to_json())

    def change(verb: str, key: Key) -> None:
        fake.before_write = None
        fake.put("vgpudevices", fake.store[key])

    fake.before_write = change  # changed since the plan: the delete conflicts ...
    fake.on_get = fake.store.pop  # ... and it is gone when re-read
    result = execute_cluster([delete(planned)], api=fake)
    assert result.outcomes[0].status is OutcomeStatus.NOOP
    assert [c[0] for c in fake.calls] == ["delete", "get"]


def test_unreachable_server_fails_transient() -> None:
    fake = FakeCluster()
    fake.down = True
    result = execute_cluster([create(intended())], api=fake)
    assert result.failed is not None
    assert result.failed.transient
    assert result.failed.message.startswith("cannot reach the Kubernetes API server")


# -- plan shape ---------------------------------------------------------------------------------


def test_host_actions_are_skipped() -> None:
    host = host_action(ActionKind.VGPU_CREATE, "0000:08:00.4")
    result = execute_cluster([host], api=FakeCluster())
    assert result.outcomes[0].status is OutcomeStatus.SKIPPED
    assert result.outcomes[0].message == SKIPPED_NOT_CLUSTER


def test_malformed_actions_write_nothing() -> None:
    fake = FakeCluster()
    bad = [
        create(intended()),
        update(intended(), ""),
        replace(delete("1"), object_kind="Pod"),
        KubevirtUpdate(
            seq=4, target="kubevirt/a/b", reason="x", namespace="a", name="", resource_version=""
        ),
        replace(create(intended(), seq=5), target="n1-other"),
    ]
    with pytest.raises(ApplyError) as err:
        execute_cluster(bad, api=fake)
    assert [p.message for p in err.value.problems] == [
        f"action 2 (cr-update {NAME}): resourceVersion must be a non-empty string",
        f"action 3 (cr-delete {NAME}): objectKind must be one of SRIOVGPUDevice, VGPUDevice, "
        "VGPUNodeState",
        "action 4 (kubevirt-update kubevirt/a/b): name must be a non-empty string",
        f"action 5 (cr-create n1-other): object is named '{NAME}', not 'n1-other'",
    ]
    assert fake.calls == []


def test_on_outcome_sees_each_outcome() -> None:
    seen: list[Outcome] = []
    execute_cluster([create(intended())], api=FakeCluster(), on_outcome=seen.append)
    assert [o.status for o in seen] == [OutcomeStatus.DONE]


# -- KubeVirt -----------------------------------------------------------------------------------

A2_4Q = {
    "mdevNameSelector": "NVIDIA A2-4Q",
    "resourceName": "nvidia.com/NVIDIA_A2-4Q",
    "externalResourceProvider": True,
}


def entry(selector: str) -> dict[str, Any]:
    return {
        "mdevNameSelector": selector,
        "resourceName": "nvidia.com/" + selector.replace(" ", "_"),
        "externalResourceProvider": True,
    }


def kubevirt_cr(entries: list[dict[str, Any]], owned: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {
            "name": "kubevirt",
            "namespace": "harvester-system",
            "annotations": {KUBEVIRT_OWNED_ANNOTATION: owned, "keep": "me"},
        },
        "spec": {
            "certificateRotateStrategy": {},
            "configuration": {
                "developerConfiguration": {"featureGates": ["LiveMigration"]},
                "permittedHostDevices": {
                    "pciHostDevices": [{"pciVendorSelector": "10DE:2236", "resourceName": "a10"}],
                    "mediatedDevices": entries,
                },
            },
        },
    }


def kubevirt_update(
    rv: str, *, add: list[str], remove: list[str], owned: list[str]
) -> KubevirtUpdate:
    return KubevirtUpdate(
        seq=9,
        target="kubevirt/harvester-system/kubevirt",
        reason="allow-list",
        namespace="harvester-system",
        name="kubevirt",
        resource_version=rv,
        add=tuple(MediatedDevice(s, entry(s)["resourceName"]) for s in add),
        remove=tuple(remove),
        owned=tuple(owned),
    )


def stored_kubevirt(fake: FakeCluster) -> dict[str, Any]:
    return fake.store[("kubevirts", "harvester-system", "kubevirt")]


def selectors(fake: FakeCluster) -> list[str]:
    devices = stored_kubevirt(fake)["spec"]["configuration"]["permittedHostDevices"]
    return [e["mdevNameSelector"] for e in devices["mediatedDevices"]]


def test_kubevirt_update_adds_and_removes_only_its_own_entries() -> None:
    fake = FakeCluster()
    theirs = entry("GRID T4-2Q")
    rv = fake.put(
        "kubevirts",
        kubevirt_cr([theirs, entry("NVIDIA A2-8Q")], "NVIDIA A2-8Q"),
        "harvester-system",
    )
    before = copy.deepcopy(stored_kubevirt(fake))
    action = kubevirt_update(
        rv, add=["NVIDIA A2-4Q"], remove=["NVIDIA A2-8Q"], owned=["NVIDIA A2-4Q"]
    )
    result = execute_cluster([action], api=fake)
    assert result.outcomes[0].message == (
        "kubevirt/harvester-system/kubevirt: allowed NVIDIA A2-4Q; removed NVIDIA A2-8Q"
    )
    assert fake.calls == [("get", "kubevirts", None), ("patch", "kubevirts", None)]
    # A JSON patch naming only the entries and the annotation it changes, each guarded by a
    # test of the value read; it removes an entry, so it is written with the CR's version.
    entries = "/spec/configuration/permittedHostDevices/mediatedDevices"
    annotation = "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"
    assert fake.patches == [
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": f"{entries}/1", "value": entry("NVIDIA A2-8Q")},
            {"op": "test", "path": annotation, "value": "NVIDIA A2-8Q"},
            {"op": "remove", "path": f"{entries}/1"},
            {"op": "add", "path": f"{entries}/-", "value": entry("NVIDIA A2-4Q")},
            {"op": "add", "path": annotation, "value": "NVIDIA A2-4Q"},
        ]
    ]
    after = stored_kubevirt(fake)
    assert selectors(fake) == ["GRID T4-2Q", "NVIDIA A2-4Q"]
    assert after["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"][0] == theirs
    assert after["metadata"]["annotations"] == {
        KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q",
        "keep": "me",
    }
    # Everything else exactly as read.
    for path in (
        ("spec", "certificateRotateStrategy"),
        ("spec", "configuration", "developerConfiguration"),
    ):
        a, b = before, after
        for p in path:
            a, b = a[p], b[p]
        assert a == b
    assert (
        after["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
        == before["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    )


def test_kubevirt_conflict_recomputes_against_the_fresh_entries() -> None:
    fake = FakeCluster()
    planned = fake.put("kubevirts", kubevirt_cr([], ""), "harvester-system")

    def other_node(verb: str, key: Key) -> None:
        # Another vgpuctl adds its profile between our read and our write, once.
        fake.before_write = None
        fake.put(
            "kubevirts", kubevirt_cr([entry("NVIDIA L4-2Q")], "NVIDIA L4-2Q"), "harvester-system"
        )

    fake.before_write = other_node
    action = kubevirt_update(planned, add=["NVIDIA A2-4Q"], remove=[], owned=["NVIDIA A2-4Q"])
    result = execute_cluster([action], api=fake)
    assert result.ok
    assert result.outcomes[0].message.endswith("(after 1 conflict: re-read and re-planned)")
    assert selectors(fake) == ["NVIDIA L4-2Q", "NVIDIA A2-4Q"]
    owned = stored_kubevirt(fake)["metadata"]["annotations"][KUBEVIRT_OWNED_ANNOTATION]
    assert owned == "NVIDIA A2-4Q,NVIDIA L4-2Q"
    # The first patch's test of the annotation failed: read again, patched again.
    assert [c[0] for c in fake.calls] == ["get", "patch", "get", "patch"]


def test_kubevirt_changed_since_the_plan_is_replanned_before_writing() -> None:
    fake = FakeCluster()
    planned = fake.put("kubevirts", kubevirt_cr([], ""), "harvester-system")
    fake.put("kubevirts", kubevirt_cr([A2_4Q], ""), "harvester-system")  # someone added it
    action = kubevirt_update(planned, add=["NVIDIA A2-4Q"], remove=[], owned=["NVIDIA A2-4Q"])
    result = execute_cluster([action], api=fake)
    # Present already: nothing to add; claimed as owned because the plan says so.
    assert result.outcomes[0].status is OutcomeStatus.DONE
    assert [c[0] for c in fake.calls] == ["get", "patch"]
    assert selectors(fake) == ["NVIDIA A2-4Q"]


def test_kubevirt_already_as_planned_is_a_noop() -> None:
    fake = FakeCluster()
    rv = fake.put("kubevirts", kubevirt_cr([A2_4Q], "NVIDIA A2-4Q"), "harvester-system")
    action = kubevirt_update(rv, add=["NVIDIA A2-4Q"], remove=[], owned=["NVIDIA A2-4Q"])
    result = execute_cluster([action], api=fake)
    assert result.outcomes[0].status is OutcomeStatus.NOOP
    assert [c[0] for c in fake.calls] == ["get"]


def test_kubevirt_gives_up_too() -> None:
    fake = FakeCluster()
    planned = fake.put("kubevirts", kubevirt_cr([], ""), "harvester-system")

    def keep_changing_the_annotation(verb: str, key: Key) -> None:
        edited = copy.deepcopy(fake.store[key])
        edited["metadata"]["annotations"][KUBEVIRT_OWNED_ANNOTATION] += "x"
        fake.put("kubevirts", edited, "harvester-system")

    fake.before_write = keep_changing_the_annotation
    action = kubevirt_update(planned, add=["NVIDIA A2-4Q"], remove=[], owned=["NVIDIA A2-4Q"])
    result = execute_cluster([action], api=fake, max_conflict_retries=1)
    assert result.failed is not None
    assert result.failed.message == (
        "kubevirt/harvester-system/kubevirt kept changing under us: gave up after 2 conflicts"
    )


def _someone_else_edits(fake: FakeCluster) -> None:
    """Between our read and our (first) write: another field, and someone else's entry."""

    def edit(verb: str, key: Key) -> None:
        fake.before_write = None
        edited = copy.deepcopy(fake.store[key])
        edited["spec"]["imageRegistry"] = "registry.example/kubevirt"
        mediated = edited["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        mediated[0]["resourceName"] = "nvidia.com/T4"
        fake.put("kubevirts", edited, "harvester-system")

    fake.before_write = edit


def test_kubevirt_add_leaves_a_concurrent_change_elsewhere_alone() -> None:
    fake = FakeCluster()
    theirs = entry("GRID T4-2Q")
    planned = fake.put("kubevirts", kubevirt_cr([theirs], ""), "harvester-system")
    _someone_else_edits(fake)
    action = kubevirt_update(planned, add=["NVIDIA A2-4Q"], remove=[], owned=["NVIDIA A2-4Q"])
    result = execute_cluster([action], api=fake)
    assert result.ok
    after = stored_kubevirt(fake)
    assert after["spec"]["imageRegistry"] == "registry.example/kubevirt"
    assert after["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [
        {**theirs, "resourceName": "nvidia.com/T4"},
        A2_4Q,
    ]
    # An addition tests only what it touches: no conflict.
    assert [c[0] for c in fake.calls] == ["get", "patch"]
    assert not any(op["path"] == "/metadata/resourceVersion" for op in fake.patches[0])


def test_kubevirt_removal_waits_when_the_cr_changed_since_the_plan() -> None:
    """A profile leaves the allow-list only as decided from the CR's version (issue 12; the
    retiring marks, model.retiring): a change anywhere in the CR since it was read fails the
    patch, which writes nothing; read again, the CR has another version than the plan's, so
    the removal waits for the next run (decided from summaries read before the change), the
    outcome says so, and the other change is left alone. (Before, the removal was re-planned
    against the new version and written.)"""
    fake = FakeCluster()
    theirs = entry("GRID T4-2Q")
    planned = fake.put(
        "kubevirts", kubevirt_cr([theirs, A2_4Q], "NVIDIA A2-4Q"), "harvester-system"
    )
    version = planned
    _someone_else_edits(fake)
    action = kubevirt_update(planned, add=[], remove=["NVIDIA A2-4Q"], owned=[])
    result = execute_cluster([action], api=fake)
    assert result.ok
    assert result.outcomes[0].status is OutcomeStatus.NOOP
    assert result.outcomes[0].message == (
        "kubevirt/harvester-system/kubevirt: mediatedDevices already as planned; the CR changed "
        "since the plan: removal of NVIDIA A2-4Q waits for the next run (after 1 conflict: "
        "re-read and re-planned)"
    )
    after = stored_kubevirt(fake)
    assert after["spec"]["imageRegistry"] == "registry.example/kubevirt"
    assert selectors(fake) == ["GRID T4-2Q", "NVIDIA A2-4Q"]
    assert [c[0] for c in fake.calls] == ["get", "patch", "get"]
    (first,) = fake.patches
    assert first[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": version}


def test_kubevirt_removal_read_at_another_version_is_not_written_but_the_rest_is() -> None:
    """The CR read at apply has another resourceVersion than the plan's (another node wrote
    it between the plan and this write): the removal is not written, not even tried; the
    marks and unmarks of the same action are (they are safe whatever changed)."""
    fake = FakeCluster()
    cr = kubevirt_cr([A2_4Q, entry("NVIDIA A2-8Q")], "NVIDIA A2-4Q,NVIDIA A2-8Q")
    planned = fake.put("kubevirts", cr, "harvester-system")
    edited = copy.deepcopy(cr)
    edited["spec"]["imageRegistry"] = "registry.example/kubevirt"
    fake.put("kubevirts", edited, "harvester-system")
    action = replace(
        kubevirt_update(planned, add=[], remove=["NVIDIA A2-4Q"], owned=["NVIDIA A2-8Q"]),
        retire=("NVIDIA A2-8Q",),
    )
    result = execute_cluster([action], api=fake, now=lambda: "2026-12-07T19:00:00Z")
    assert result.ok
    assert result.outcomes[0].status is OutcomeStatus.DONE
    assert result.outcomes[0].message == (
        "kubevirt/harvester-system/kubevirt: marked NVIDIA A2-8Q retiring; the CR changed since "
        "the plan: removal of NVIDIA A2-4Q waits for the next run"
    )
    assert selectors(fake) == ["NVIDIA A2-4Q", "NVIDIA A2-8Q"]
    annotations = stored_kubevirt(fake)["metadata"]["annotations"]
    assert json.loads(annotations[KUBEVIRT_RETIRING_ANNOTATION]) == {
        "NVIDIA A2-8Q": "2026-12-07T19:00:00Z"
    }
    assert annotations[KUBEVIRT_OWNED_ANNOTATION] == "NVIDIA A2-4Q,NVIDIA A2-8Q"
    (patch,) = fake.patches
    assert all(op["path"] != "/metadata/resourceVersion" for op in patch)


def test_kubevirt_removal_after_this_runs_own_allow_write_goes_ahead() -> None:
    """The plan's kubevirt-allow wrote the CR directly over the planned version (its patch
    tested it): the kubevirt-update planned from that version finds the allow's version, its
    own run's, and removes. An allow written over another version (someone wrote between the
    plan and it) records nothing: the removal then waits."""
    for foreign_first in (False, True):
        fake = FakeCluster()
        cr = kubevirt_cr([A2_4Q], "NVIDIA A2-4Q")
        planned = fake.put("kubevirts", cr, "harvester-system")
        if foreign_first:
            edited = copy.deepcopy(cr)
            edited["spec"]["imageRegistry"] = "registry.example/kubevirt"
            fake.put("kubevirts", edited, "harvester-system")
        allow = KubevirtAllow(
            seq=1, target="kubevirt/harvester-system/kubevirt", reason="r",
            namespace="harvester-system", name="kubevirt", resource_version=planned,
            add=(MediatedDevice("NVIDIA A2-8Q", "nvidia.com/NVIDIA_A2-8Q"),),
            owned=("NVIDIA A2-4Q", "NVIDIA A2-8Q"), unmark=("NVIDIA A2-8Q",),
        )  # fmt: skip
        update = replace(
            kubevirt_update(planned, add=[], remove=["NVIDIA A2-4Q"], owned=["NVIDIA A2-8Q"]),
            seq=2,
        )
        versions: dict[str, str] = {}
        first = execute_cluster([allow], api=fake, versions=versions)
        allowed = stored_kubevirt(fake)["metadata"]["resourceVersion"]
        second = execute_cluster([update], api=fake, versions=versions)
        assert first.ok and second.ok
        if foreign_first:
            assert versions == {}
            assert selectors(fake) == ["NVIDIA A2-4Q", "NVIDIA A2-8Q"]
            assert "waits for the next run" in second.outcomes[0].message
        else:
            assert versions[planned] == allowed
            assert selectors(fake) == ["NVIDIA A2-8Q"]
            assert fake.patches[0][0] == {
                "op": "test", "path": "/metadata/resourceVersion", "value": planned,
            }  # fmt: skip


def test_kubevirt_patch_fails_cleanly_when_an_entry_it_removes_changed() -> None:
    """Our entry is edited between the read and the removal's patch: the patch (which tests
    it) fails whole and writes nothing; the CR read again is not the planned one, so the
    removal waits for the next run."""
    fake = FakeCluster()
    planned = fake.put(
        "kubevirts", kubevirt_cr([entry("GRID T4-2Q"), A2_4Q], "NVIDIA A2-4Q"), "harvester-system"
    )

    def edit_our_entry(verb: str, key: Key) -> None:
        edited = copy.deepcopy(fake.store[key])
        mediated = edited["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        mediated[-1]["resourceName"] += "-edited"
        fake.put("kubevirts", edited, "harvester-system")

    fake.before_write = edit_our_entry  # before every write: the tested entry never matches
    action = kubevirt_update(planned, add=[], remove=["NVIDIA A2-4Q"], owned=[])
    result = execute_cluster([action], api=fake, max_conflict_retries=2)
    assert result.ok
    assert "removal of NVIDIA A2-4Q waits for the next run" in result.outcomes[0].message
    # The patch failed whole: the edited entry is there, nothing of the patch was written.
    assert selectors(fake) == ["GRID T4-2Q", "NVIDIA A2-4Q"]
    after = stored_kubevirt(fake)
    assert after["metadata"]["annotations"][KUBEVIRT_OWNED_ANNOTATION] == "NVIDIA A2-4Q"
    assert [c[0] for c in fake.calls] == ["get", "patch", "get"]


def _marked(cr: dict[str, Any], marks: dict[str, str]) -> dict[str, Any]:
    cr["metadata"]["annotations"][KUBEVIRT_RETIRING_ANNOTATION] = json.dumps(marks)
    return cr


def test_an_allow_step_clears_the_mark_of_a_type_it_creates_and_adds_it_if_gone() -> None:
    """The kubevirt-allow names every type its run creates: at apply a mark another node wrote
    since is cleared (a write: that node's removal, testing the mark, then fails), and an
    entry gone is added again; an entry there and unmarked is left as it is (no write)."""
    marks = {"NVIDIA A2-4Q": "2026-12-07T18:00:00Z", "NVIDIA A2-8Q": "2026-12-07T18:01:00Z"}
    cases = {
        "marked": kubevirt_cr([A2_4Q, entry("NVIDIA A2-8Q")], "NVIDIA A2-4Q,NVIDIA A2-8Q"),
        "gone": kubevirt_cr([entry("NVIDIA A2-8Q")], "NVIDIA A2-8Q"),
        "as is": kubevirt_cr([A2_4Q], "NVIDIA A2-4Q"),
    }
    _marked(cases["marked"], marks)
    for case, cr in cases.items():
        fake = FakeCluster()
        planned = fake.put("kubevirts", cr, "harvester-system")
        allow = KubevirtAllow(
            seq=1, target="kubevirt/harvester-system/kubevirt", reason="r",
            namespace="harvester-system", name="kubevirt", resource_version=planned,
            add=(MediatedDevice("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),),
            owned=("NVIDIA A2-4Q",), unmark=("NVIDIA A2-4Q",),
        )  # fmt: skip
        result = execute_cluster([allow], api=fake)
        assert result.ok, case
        annotations = stored_kubevirt(fake)["metadata"]["annotations"]
        if case == "as is":
            assert result.outcomes[0].status is OutcomeStatus.NOOP
            assert fake.patches == []
            continue
        assert "NVIDIA A2-4Q" in selectors(fake)
        if case == "marked":
            assert result.outcomes[0].message.endswith("cleared the retiring mark of NVIDIA A2-4Q")
            assert json.loads(annotations[KUBEVIRT_RETIRING_ANNOTATION]) == {
                "NVIDIA A2-8Q": "2026-12-07T18:01:00Z"
            }
            # The mark's old value is tested: a concurrent change of it fails the patch.
            assert {
                "op": "test",
                "path": "/metadata/annotations/" + KUBEVIRT_RETIRING_ANNOTATION.replace("/", "~1"),
                "value": json.dumps(marks),
            } in fake.patches[0]
        else:
            assert result.outcomes[0].message.endswith("allowed NVIDIA A2-4Q")
            assert KUBEVIRT_RETIRING_ANNOTATION not in annotations


def test_a_removal_takes_the_mark_with_it_and_fails_if_the_mark_was_cleared() -> None:
    """A removal patch tests the marks' annotation as read: another node's allow step that
    cleared the mark in between (it is about to create vGPUs of the type) fails it whole."""
    marks = {"NVIDIA A2-4Q": "2026-12-07T18:00:00Z"}
    cr = _marked(kubevirt_cr([A2_4Q], "NVIDIA A2-4Q"), marks)
    ops = allow_list_patch(cr, add=[], remove=["NVIDIA A2-4Q"])
    assert ops is not None
    patch, summary = ops
    assert summary == "removed NVIDIA A2-4Q"
    pointer = "/metadata/annotations/" + KUBEVIRT_RETIRING_ANNOTATION.replace("/", "~1")
    assert {"op": "test", "path": pointer, "value": json.dumps(marks)} in patch
    assert {"op": "remove", "path": pointer} in patch
    cleared = copy.deepcopy(cr)
    del cleared["metadata"]["annotations"][KUBEVIRT_RETIRING_ANNOTATION]
    with pytest.raises(jsonpatch.JsonPatchError):
        jsonpatch.apply(cleared, patch)
    removed = jsonpatch.apply(cr, patch)
    assert removed["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == []
    assert KUBEVIRT_RETIRING_ANNOTATION not in removed["metadata"]["annotations"]


def test_allow_list_patch_creates_the_levels_that_are_missing() -> None:
    cr = kubevirt_cr([], "")
    del cr["spec"]["configuration"]["permittedHostDevices"]
    del cr["metadata"]["annotations"]
    change = allow_list_patch(cr, add=[A2_4Q], remove=[])
    assert change is not None
    ops, summary = change
    assert summary == "allowed NVIDIA A2-4Q"
    # A missing branch is tested as null (what the API server's JSON patch passes for an
    # absent key) and added whole.
    assert ops == [
        {"op": "test", "path": "/spec/configuration/permittedHostDevices", "value": None},
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {
            "op": "add",
            "path": "/spec/configuration/permittedHostDevices",
            "value": {"mediatedDevices": [A2_4Q]},
        },
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q"},
        },
    ]
    patched = jsonpatch.apply(cr, ops)
    assert patched["spec"]["configuration"]["developerConfiguration"] == {
        "featureGates": ["LiveMigration"]
    }


def test_allow_list_patch_removes_from_the_end_and_drops_the_annotation() -> None:
    cr = kubevirt_cr(
        [entry("NVIDIA A2-4Q"), entry("GRID T4-2Q"), entry("NVIDIA A2-8Q")],
        "NVIDIA A2-4Q,NVIDIA A2-8Q",
    )
    change = allow_list_patch(cr, add=[], remove=["NVIDIA A2-4Q", "NVIDIA A2-8Q"])
    assert change is not None
    ops, _ = change
    entries = "/spec/configuration/permittedHostDevices/mediatedDevices"
    annotation = "/metadata/annotations/vgpu.reconciler.dev~1mediated-devices"
    assert ops == [
        {"op": "test", "path": f"{entries}/0", "value": entry("NVIDIA A2-4Q")},
        {"op": "test", "path": f"{entries}/2", "value": entry("NVIDIA A2-8Q")},
        {"op": "test", "path": annotation, "value": "NVIDIA A2-4Q,NVIDIA A2-8Q"},
        {"op": "remove", "path": f"{entries}/2"},
        {"op": "remove", "path": f"{entries}/0"},
        {"op": "remove", "path": annotation},
    ]
    patched = jsonpatch.apply(cr, ops)
    devices = patched["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    assert devices == [entry("GRID T4-2Q")]
    assert patched["metadata"]["annotations"] == {"keep": "me"}


def test_allow_list_never_removes_what_is_not_ours() -> None:
    cr = kubevirt_cr([entry("NVIDIA A2-4Q")], "")
    assert allow_list_change(cr, add=[], remove=["NVIDIA A2-4Q"]) is None


def test_allow_list_counts_an_entry_as_kubevirt_reads_it_and_refuses_one_it_serves() -> None:
    # KubeVirt compares selectors with spaces turned into "_" (removeSelectorSpaces): an
    # external entry spelt so, with vgpuctl's resourceName, already does what vgpuctl's would.
    spelt = {**entry("NVIDIA A2-4Q"), "mdevNameSelector": "NVIDIA_A2-4Q"}
    assert (
        allow_list_change(kubevirt_cr([spelt], ""), add=[entry("NVIDIA A2-4Q")], remove=[]) is None
    )
    # One KubeVirt serves itself (not external), written since the plan: nothing is written and
    # the step fails (the host phase after it does not run).
    theirs = {"mdevNameSelector": "NVIDIA_A2-4Q", "resourceName": "nvidia.com/kv"}
    with pytest.raises(ApplyError, match="KubeVirt serves it itself"):
        allow_list_change(kubevirt_cr([theirs], ""), add=[entry("NVIDIA A2-4Q")], remove=[])
    # An external entry under another resourceName does not admit vgpuctl's resource: added.
    other = {**spelt, "resourceName": "nvidia.com/other"}
    change = allow_list_change(kubevirt_cr([other], ""), add=[entry("NVIDIA A2-4Q")], remove=[])
    assert change is not None and change[1] == "allowed NVIDIA A2-4Q"


def test_allow_list_forgets_owned_entries_removed_by_hand() -> None:
    cr = kubevirt_cr([], "NVIDIA A2-4Q")
    change = allow_list_change(cr, add=[], remove=[], owned=[])
    assert change is not None
    body, summary = change
    assert KUBEVIRT_OWNED_ANNOTATION not in body["metadata"]["annotations"]
    assert summary == "ownership annotation updated"


# -- the PCI host devices allow-list (NVIDIA's vfio interface) --------------------------------

L40S_8Q = "nvidia.com/NVIDIA_L40S-8Q"
L40S_4Q = "nvidia.com/NVIDIA_L40S-4Q"
A10 = {"pciVendorSelector": "10DE:2236", "resourceName": "a10"}  # kubevirt_cr's: someone else's


def pci_entry(resource: str) -> dict[str, Any]:
    return {
        "pciVendorSelector": "10DE:26B9",
        "resourceName": resource,
        "externalResourceProvider": True,
    }


def test_kubevirt_update_adds_and_removes_only_its_own_pci_entries() -> None:
    fake = FakeCluster()
    cr = kubevirt_cr([A2_4Q], "NVIDIA A2-4Q")
    cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].append(pci_entry(L40S_4Q))
    cr["metadata"]["annotations"][KUBEVIRT_OWNED_PCI_ANNOTATION] = L40S_4Q
    rv = fake.put("kubevirts", cr, "harvester-system")
    action = replace(
        kubevirt_update(rv, add=[], remove=[], owned=["NVIDIA A2-4Q"]),
        add_pci=(PciHostDevice("10DE:26B9", L40S_8Q),),
        remove_pci=(L40S_4Q,),
        owned_pci=(L40S_8Q,),
    )
    result = execute_cluster([action], api=fake)
    assert result.outcomes[0].message == (
        f"kubevirt/harvester-system/kubevirt: allowed PCI {L40S_8Q}; removed PCI {L40S_4Q}"
    )
    entries = "/spec/configuration/permittedHostDevices/pciHostDevices"
    annotation = "/metadata/annotations/vgpu.reconciler.dev~1pci-host-devices"
    assert fake.patches == [
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": f"{entries}/1", "value": pci_entry(L40S_4Q)},
            {"op": "test", "path": annotation, "value": L40S_4Q},
            {"op": "remove", "path": f"{entries}/1"},
            {"op": "add", "path": f"{entries}/-", "value": pci_entry(L40S_8Q)},
            {"op": "add", "path": annotation, "value": L40S_8Q},
        ]
    ]
    after = stored_kubevirt(fake)
    permitted = after["spec"]["configuration"]["permittedHostDevices"]
    assert permitted["pciHostDevices"] == [A10, pci_entry(L40S_8Q)]
    assert permitted["mediatedDevices"] == [A2_4Q]  # the other list as it was
    assert after["metadata"]["annotations"] == {
        KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q",
        KUBEVIRT_OWNED_PCI_ANNOTATION: L40S_8Q,
        "keep": "me",
    }


def test_allow_list_patch_adds_a_missing_branch_once_with_both_lists() -> None:
    cr = kubevirt_cr([], "")
    del cr["spec"]["configuration"]["permittedHostDevices"]
    del cr["metadata"]["annotations"]
    change = allow_list_patch(
        cr, add=[A2_4Q], remove=[], add_pci=[pci_entry(L40S_8Q)], remove_pci=[]
    )
    assert change is not None
    ops, summary = change
    assert summary == f"allowed NVIDIA A2-4Q; allowed PCI {L40S_8Q}"
    assert ops == [
        {"op": "test", "path": "/spec/configuration/permittedHostDevices", "value": None},
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {
            "op": "add",
            "path": "/spec/configuration/permittedHostDevices",
            "value": {"mediatedDevices": [A2_4Q], "pciHostDevices": [pci_entry(L40S_8Q)]},
        },
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {
                KUBEVIRT_OWNED_ANNOTATION: "NVIDIA A2-4Q",
                KUBEVIRT_OWNED_PCI_ANNOTATION: L40S_8Q,
            },
        },
    ]
    patched = jsonpatch.apply(cr, ops)
    assert patched["spec"]["configuration"]["permittedHostDevices"] == {
        "mediatedDevices": [A2_4Q],
        "pciHostDevices": [pci_entry(L40S_8Q)],
    }


def test_allow_list_patch_adds_a_missing_pci_list_beside_the_mediated_one() -> None:
    cr = kubevirt_cr([A2_4Q], "NVIDIA A2-4Q")
    del cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    change = allow_list_patch(cr, add=[], remove=[], add_pci=[pci_entry(L40S_8Q)])
    assert change is not None
    ops, _ = change
    annotation = "/metadata/annotations/vgpu.reconciler.dev~1pci-host-devices"
    pci = "/spec/configuration/permittedHostDevices/pciHostDevices"
    assert ops == [
        {"op": "test", "path": pci, "value": None},
        {"op": "test", "path": annotation, "value": None},
        {"op": "add", "path": pci, "value": [pci_entry(L40S_8Q)]},
        {"op": "add", "path": annotation, "value": L40S_8Q},
    ]
    patched = jsonpatch.apply(cr, ops)
    assert patched["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"] == [A2_4Q]


def test_allow_list_never_removes_a_pci_entry_that_is_not_ours() -> None:
    cr = kubevirt_cr([], "")
    permitted = cr["spec"]["configuration"]["permittedHostDevices"]
    permitted["pciHostDevices"].append(pci_entry(L40S_8Q))
    assert allow_list_change(cr, add=[], remove=[], remove_pci=[L40S_8Q, "a10"]) is None
    # Named in the mediated devices' annotation: not the PCI one, so still not ours.
    cr["metadata"]["annotations"][KUBEVIRT_OWNED_ANNOTATION] = L40S_8Q
    change = allow_list_change(cr, add=[], remove=[L40S_8Q], remove_pci=[L40S_8Q])
    assert change is not None
    body, summary = change
    assert summary == "ownership annotation updated"  # the mdev side forgets a stray name
    after = body["spec"]["configuration"]["permittedHostDevices"]
    assert after["pciHostDevices"] == [A10, pci_entry(L40S_8Q)]


def test_allow_list_change_does_not_touch_its_input() -> None:
    cr = kubevirt_cr([], "")
    frozen = json.dumps(cr, sort_keys=True)
    allow_list_change(cr, add=[A2_4Q], remove=[])
    assert json.dumps(cr, sort_keys=True) == frozen


# -- host events --------------------------------------------------------------------------------


def test_host_outcomes_and_blocks_become_events_on_our_objects() -> None:
    def outcome(kind: ActionKind, target: str, status: OutcomeStatus) -> Outcome:
        return Outcome(host_action(kind, target), status, f"{kind} {status}")

    events = Events()
    record_host_events(
        [
            outcome(ActionKind.SRIOV_ENABLE, "0000:08:00.0", OutcomeStatus.DONE),
            outcome(ActionKind.VGPU_CREATE, "0000:08:00.4", OutcomeStatus.DONE),
            outcome(ActionKind.VGPU_CREATE, "0000:08:00.5", OutcomeStatus.NOOP),
            outcome(ActionKind.VGPU_REMOVE, "0000:08:00.6", OutcomeStatus.FAILED),
            outcome(ActionKind.CR_CREATE, NAME, OutcomeStatus.DONE),
        ],
        node=NODE,
        events=events,
        blocked=[
            Blocked(
                replace(
                    host_action(ActionKind.VGPU_REMOVE, "0000:08:00.7"),
                    seq=0,
                    reason="in use by VM default/win11",
                )
            )
        ],
    )
    assert events.recorded == [
        ("SRIOVGPUDevice", "harvester-kgd9c-000008000", "SRIOVEnabled", "Normal"),
        ("VGPUDevice", NAME, "VGPUCreated", "Normal"),
        ("VGPUDevice", "harvester-kgd9c-000008006", "VGPURemoveFailed", "Warning"),
        ("VGPUDevice", "harvester-kgd9c-000008007", "VGPURemovalBlocked", "Warning"),
    ]


# -- the mandate after a conflict -------------------------------------------------------------


def full(profile: str = "NVIDIA A2-4Q", node: str = NODE) -> KubeObject:
    """A VGPUDevice as the planner writes it, with the fields the mandate checks."""
    return KubeObject(
        kind=VGPU_KIND,
        name=NAME,
        labels={NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
        spec={
            "address": "0000:08:00.4",
            "enabled": True,
            "vGPUTypeName": profile,
            "nodeName": node,
            "parentGPUDeviceAddress": "0000:08:00.0",
        },
        status={},
    )


@pytest.mark.parametrize("faithful", [True, False])
def test_a_write_replanned_after_a_conflict_is_checked_like_the_plans(faithful: bool) -> None:
    """The plan's writes are checked against the mandate before the run; a write re-planned
    after a 409 is checked too, or a re-plan gone wrong could write another node's object."""
    fake = FakeCluster()
    planned = fake.put("vgpudevices", full("NVIDIA A2-4A").to_json())
    mandate = ClusterMandate(
        node=NODE,
        managed=frozenset({PciAddress.parse("0000:08:00.0")}),
        objects={NAME: KubeObject.from_json({**stored(fake), "kind": VGPU_KIND})},
    )
    fake.put("vgpudevices", stored(fake))  # edited after the plan: the update meets a 409

    def replan(want: KubeObject, current: KubeObject | None) -> Action | None:
        assert current is not None
        body = want if faithful else full(node="gpu-node-2")
        return update(body, current.resource_version)

    result = execute_cluster(
        [update(full(), planned)], api=fake, replan=replan, mandate=mandate, node=NODE
    )
    if faithful:
        assert result.ok
        assert stored(fake)["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
        return
    failed = result.failed
    assert failed is not None
    assert f"the VGPUDevice written is not for node {NODE}" in failed.message
    assert [c[0] for c in fake.calls] == ["update", "get"]  # nothing written after it
    assert stored(fake)["spec"]["nodeName"] == NODE
