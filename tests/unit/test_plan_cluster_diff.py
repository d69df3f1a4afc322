"""Field-level changes (deepdiff paths → plan paths) and replan_object, the executor's 409 path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from reconciler.model import ActionKind, CrUpdate
from reconciler.model.cluster import KubeObject
from reconciler.model.plan import FieldChange
from reconciler.model.plan_json import action_to_json
from reconciler.plan.changes import format_path, section_changes
from reconciler.plan.cluster import replan_object
from reconciler.plan.render import LAST_APPLIED_ANNOTATION, canonical_json

NODE = "harvester-kgd9c"


@pytest.mark.parametrize(
    ("path", "ours"),
    [
        (["spec", "vGPUTypeName"], "spec.vGPUTypeName"),
        (["status", "vfAddresses", 3], "status.vfAddresses[3]"),
        (["status", "availableTypes", "NVIDIA A2-4Q"], 'status.availableTypes["NVIDIA A2-4Q"]'),
        (["metadata", "labels", "app.kubernetes.io/managed-by"],
         'metadata.labels["app.kubernetes.io/managed-by"]'),
        (["it's"], '["it\'s"]'),
        (["a_1", "b-c"], 'a_1["b-c"]'),
        ([0, "x"], "[0].x"),
    ],
)  # fmt: skip
def test_deepdiff_paths_become_plan_paths(path: list[str | int], ours: str) -> None:
    """deepdiff's tree view gives a change's path as a list: the plan writes it this way."""
    assert format_path(path) == ours


def test_format_path_quotes_what_is_not_an_identifier() -> None:
    assert (
        format_path(["status", "availableTypes", 'A "B"']) == 'status.availableTypes["A \\"B\\""]'
    )


def test_scalars_and_lists_are_reported_whole() -> None:
    old = {"vGPUTypeName": "NVIDIA A2-4A", "list": [1, 2, 3], "gone": 1}
    new = {"vGPUTypeName": "NVIDIA A2-4Q", "list": [1, 3], "added": True}
    assert section_changes(old, new, prefix=("spec",)) == [
        FieldChange("spec.vGPUTypeName", "NVIDIA A2-4A", "NVIDIA A2-4Q"),
        FieldChange("spec.list", [1, 2, 3], [1, 3]),
        FieldChange("spec.added", None, True),
        FieldChange("spec.gone", 1, None),
    ]


def test_mappings_are_diffed_key_by_key_with_deepdiff() -> None:
    old = {"availableTypes": {"NVIDIA A2-1Q": "nvidia-744", "NVIDIA A2-4Q": "nvidia-746"}}
    new = {"availableTypes": {"NVIDIA A2-4Q": "nvidia-746", "NVIDIA A2-4A": "nvidia-751"}}
    changes = section_changes(old, new, prefix=("status",))
    assert sorted(changes, key=lambda c: c.path) == [
        FieldChange('status.availableTypes["NVIDIA A2-1Q"]', "nvidia-744", None),
        FieldChange('status.availableTypes["NVIDIA A2-4A"]', None, "nvidia-751"),
    ]


def test_nested_changes_go_down_to_the_field() -> None:
    old = {"a": {"b": {"c": 1, "d": [1, 2]}}}
    new = {"a": {"b": {"c": 2, "d": [1, 2]}}}
    assert section_changes(old, new, prefix=("spec",)) == [FieldChange("spec.a.b.c", 1, 2)]


def test_equal_sections_have_no_changes() -> None:
    assert section_changes({"a": {"b": 1}}, {"a": {"b": 1}}, prefix=("spec",)) == []


def _vf(**spec: Any) -> KubeObject:
    body = {
        "address": "0000:08:00.5",
        "enabled": True,
        "nodeName": NODE,
        "parentGPUDeviceAddress": "0000:08:00.0",
        "vGPUTypeName": "NVIDIA A2-4Q",
        **spec,
    }
    return KubeObject(
        kind="VGPUDevice",
        name="harvester-kgd9c-000008005",
        labels={
            "nodename": NODE,
            "harvesterhci.io/parentSRIOVGPUDevice": "harvester-kgd9c-000008000",
            "app.kubernetes.io/managed-by": "vgpuctl",
        },
        annotations={LAST_APPLIED_ANNOTATION: canonical_json(body)},
        spec=body,
        status={"vGPUStatus": "vGPUConfigured", "uuid": "u", "configureVGPUTypeName": "x"},
    )


def test_replan_of_a_deleted_object_creates_it() -> None:
    action = replan_object(_vf(), None, seq=7)
    assert action is not None
    assert (action.seq, action.kind, action.target) == (
        7,
        ActionKind.CR_CREATE,
        "harvester-kgd9c-000008005",
    )
    assert action_to_json(action)["object"]["spec"]["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert "resourceVersion" not in action_to_json(action)["object"]["metadata"]


def test_replan_when_someone_else_already_made_the_change_is_nothing() -> None:
    assert replan_object(_vf(), replace(_vf(), resource_version="42")) is None


def test_replan_updates_from_the_version_just_read_and_keeps_foreign_metadata() -> None:
    intended = replace(_vf(), resource_version="41")  # the plan's object
    current = replace(
        _vf(vGPUTypeName="NVIDIA A2-4A"),
        resource_version="42",
        labels={**_vf().labels, "team": "vdi"},
        annotations={**_vf(vGPUTypeName="NVIDIA A2-4A").annotations, "note": "keep"},
    )
    action = replan_object(intended, current, seq=3)
    assert action is not None and action.kind is ActionKind.CR_UPDATE
    fields = action_to_json(action)
    assert fields["resourceVersion"] == "42"
    assert fields["object"]["metadata"]["resourceVersion"] == "42"
    assert fields["object"]["metadata"]["labels"]["team"] == "vdi"
    assert fields["object"]["metadata"]["annotations"]["note"] == "keep"
    assert fields["object"]["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] == canonical_json(
        dict(intended.spec)
    )
    assert fields["specChanged"] is True and fields["statusChanged"] is False
    assert fields["drift"] is False  # annotated as written: a desired change, not a hand edit
    assert fields["changes"] == [
        {"path": "spec.vGPUTypeName", "from": "NVIDIA A2-4A", "to": "NVIDIA A2-4Q"}
    ]


def test_replan_of_a_hand_edited_object_flags_drift() -> None:
    edited = replace(_vf(), spec={**_vf().spec, "enabled": False}, resource_version="9")
    action = replan_object(_vf(), edited)
    assert action is not None and action_to_json(action)["drift"] is True
    assert "changed outside vgpuctl" in action.reason


def test_replan_leaves_another_controllers_object_alone_unless_adopted() -> None:
    theirs = replace(_vf(vGPUTypeName="NVIDIA A2-4A"), labels={"nodename": NODE}, annotations={})
    assert replan_object(_vf(), theirs) is None
    adopted = replan_object(_vf(), theirs, adopt=True)
    assert adopted is not None and action_to_json(adopted)["adopt"] is True
    assert "finalizers" not in action_to_json(adopted)["object"]["metadata"]
    assert action_to_json(adopted)["drift"] is False  # nothing vgpuctl wrote to compare with
    assert {c["path"] for c in action_to_json(adopted)["changes"]} == {
        'metadata.labels["harvesterhci.io/parentSRIOVGPUDevice"]',
        'metadata.labels["app.kubernetes.io/managed-by"]',
        "spec.vGPUTypeName",
    }


def test_status_only_changes_touch_only_the_status() -> None:
    current = replace(_vf(), status={**_vf().status, "uuid": "old"}, resource_version="5")
    action = replan_object(_vf(), current)
    assert isinstance(action, CrUpdate)
    assert (action.spec_changed, action.status_changed) == (False, True)
    assert action.reason.endswith("status differs from the host")


def test_an_update_carries_over_finalizers_and_owner_references() -> None:
    """A PUT replaces metadata whole: what other controllers put there must be written back."""
    owners = [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "n-1"}]
    theirs = KubeObject.from_json(
        {
            **_vf(vGPUTypeName="NVIDIA A2-4A").to_json(),
            "metadata": {
                "name": "harvester-kgd9c-000008005",
                "labels": {"nodename": NODE},
                "resourceVersion": "8",
                "finalizers": ["wrangler.cattle.io/vgpu-device"],
                "ownerReferences": owners,
            },
        }
    )
    assert theirs.retained == {
        "finalizers": ["wrangler.cattle.io/vgpu-device"],
        "ownerReferences": owners,
    }
    adopted = replan_object(_vf(), theirs, adopt=True)
    assert adopted is not None
    metadata = action_to_json(adopted)["object"]["metadata"]
    assert metadata["finalizers"] == ["wrangler.cattle.io/vgpu-device"]
    assert metadata["ownerReferences"] == owners
    assert metadata["ownerReferences"] is not owners  # a copy: the plan is plain JSON
    # Nothing to retain on an object that has none (no empty lists written).
    mine = replan_object(_vf(), replace(_vf(vGPUTypeName="NVIDIA A2-4A"), resource_version="3"))
    assert mine is not None
    assert "finalizers" not in action_to_json(mine)["object"]["metadata"]
