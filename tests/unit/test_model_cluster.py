"""KubeObject as read from the API server, and Harvester's view of a stored object: expected
values written by hand from Harvester's CRDs (docs/domain.md §5: spec fields always there, Go
reads a null or missing string as "" and a missing bool as false; status fields ``omitempty``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reconciler.model.cluster import KubeObject, harvester_view


def _vgpu_device(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "apiVersion": "devices.harvesterhci.io/v1beta1",
        "kind": "VGPUDevice",
        "metadata": {
            "name": "n1-000008004",
            "labels": {"nodename": "n1", "app.kubernetes.io/managed-by": "vgpuctl"},
            "annotations": {"a": "b"},
            "resourceVersion": "42",
            "uid": "9b1c",
            "finalizers": ["wrangler.cattle.io/x"],
        },
        "spec": {
            "address": "0000:08:00.4",
            "enabled": True,
            "nodeName": "n1",
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": "NVIDIA A2-4Q",
        },
        "status": {"vGPUStatus": "vGPUConfigured", "uuid": "5adb8e42", "availableTypes": {}},
    }
    raw.update(overrides)
    return raw


@pytest.mark.parametrize("take", [False, True])
def test_an_api_body_is_read_whole_whether_taken_or_copied(take: bool) -> None:
    obj = KubeObject.from_json(_vgpu_device(), take=take)
    assert (obj.kind, obj.name, obj.resource_version) == ("VGPUDevice", "n1-000008004", "42")
    assert dict(obj.labels) == {"nodename": "n1", "app.kubernetes.io/managed-by": "vgpuctl"}
    assert dict(obj.annotations) == {"a": "b"}
    assert obj.spec["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert dict(obj.retained) == {"finalizers": ["wrangler.cattle.io/x"]}
    with pytest.raises(TypeError):
        obj.spec["enabled"] = False  # type: ignore[index]


def test_a_body_not_taken_stays_the_callers() -> None:
    raw = _vgpu_device()
    obj = KubeObject.from_json(raw)
    raw["spec"]["vGPUTypeName"] = "changed"
    raw["metadata"]["labels"]["nodename"] = "n2"
    assert obj.spec["vGPUTypeName"] == "NVIDIA A2-4Q"
    assert obj.labels["nodename"] == "n1"


def test_a_taken_body_with_a_mapping_of_another_type_is_copied() -> None:
    from types import MappingProxyType

    obj = KubeObject.from_json(_vgpu_device(spec=MappingProxyType({"address": "x"})), take=True)
    assert dict(obj.spec) == {"address": "x"}


def test_an_object_in_harvesters_shape_is_its_own_view() -> None:
    obj = KubeObject.from_json(_vgpu_device(status={"vGPUStatus": "vGPUConfigured"}))
    assert harvester_view(obj) is obj


@pytest.mark.parametrize(
    ("spec", "status", "want_spec", "want_status"),
    [
        # Harvester's UI "Disable" drops vGPUTypeName: Go reads it as "".
        (
            {"address": "a", "enabled": False, "nodeName": "n1", "parentGPUDeviceAddress": "p"},
            {},
            {"address": "a", "enabled": False, "nodeName": "n1", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": ""},
            {},
        ),
        # A null string is "", a missing bool false; a field the CRD does not declare is gone.
        (
            {"address": "a", "enabled": None, "nodeName": None, "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T", "inUse": True},
            {},
            {"address": "a", "enabled": False, "nodeName": "", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T"},
            {},
        ),
        # omitempty: empty status values are not there; undeclared status fields neither.
        (
            {"address": "a", "enabled": True, "nodeName": "n1", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T"},
            {"vGPUStatus": "", "uuid": None, "availableTypes": {}, "configureVGPUTypeName": "T",
             "holder": "vm"},
            {"address": "a", "enabled": True, "nodeName": "n1", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T"},
            {"configureVGPUTypeName": "T"},
        ),
        # A declared status field holding false is not empty (only null, "", [] and {} are).
        (
            {"address": "a", "enabled": True, "nodeName": "n1", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T"},
            {"uuid": False, "vGPUStatus": 0},
            {"address": "a", "enabled": True, "nodeName": "n1", "parentGPUDeviceAddress": "p",
             "vGPUTypeName": "T"},
            {"uuid": False, "vGPUStatus": 0},
        ),
    ],
)  # fmt: skip
def test_harvesters_view_of_a_stored_object(
    spec: dict[str, Any],
    status: dict[str, Any],
    want_spec: dict[str, Any],
    want_status: dict[str, Any],
) -> None:
    raw = _vgpu_device(spec=copy.deepcopy(spec), status=copy.deepcopy(status))
    view = harvester_view(KubeObject.from_json(raw))
    assert dict(view.spec) == want_spec
    assert dict(view.status) == want_status
    assert (view.name, view.resource_version, dict(view.labels)) == (
        "n1-000008004",
        "42",
        {"nodename": "n1", "app.kubernetes.io/managed-by": "vgpuctl"},
    )
