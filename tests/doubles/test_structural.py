"""The emulator's CRD schema rules, written from the API server's behaviour (apiextensions-
apiserver's pruning and OpenAPI validation), not from structural.py: unknown fields are dropped
at any depth, types, required fields, enums and patterns are enforced with the field's path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.structural import UnsupportedSchema, check_schema, prune, validate

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "devices.harvesterhci.io", "v1beta1"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["address"],
            "properties": {
                "address": {"type": "string", "pattern": "^[0-9a-f]{4}:[0-9a-f]{2}$"},
                "count": {"type": "integer"},
                "mode": {"type": "string", "enum": ["on", "off"]},
                "port": {"x-kubernetes-int-or-string": True},
                "note": {"type": "string", "nullable": True},
                "items": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                },
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "closed": {"type": "object"},
            },
        },
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    },
}


def obj(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "spec": spec}


def test_unknown_fields_are_dropped_at_every_depth_and_the_root_keeps_its_own() -> None:
    o = obj(address="0000:08", extra=1, items=[{"name": "n", "other": 2}], closed={"k": 1})
    o["status"] = {"ready": True, "vfIndex": 3}
    o["top"] = "level"

    prune(o, SCHEMA)

    assert o == {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "a"},
        "spec": {"address": "0000:08", "items": [{"name": "n"}], "closed": {}},
        "status": {"ready": True},
    }


def test_preserved_and_additional_properties_keep_their_fields() -> None:
    o = obj(address="0000:08", labels={"a": "b"}, free={"any": {"thing": 1}})
    prune(o, SCHEMA)
    assert o["spec"]["labels"] == {"a": "b"}
    assert o["spec"]["free"] == {"any": {"thing": 1}}


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        (
            {"address": "0000:08", "count": "3"},
            'spec.count: Invalid value: "string": spec.count in body must be of type integer: '
            '"string"',
        ),
        ({}, "spec.address: Required value"),
        (
            {"address": "0000:08", "mode": "auto"},
            'spec.mode: Unsupported value: "auto": supported values: "on", "off"',
        ),
        (
            {"address": "08:00"},
            'spec.address: Invalid value: "08:00": spec.address in body should match '
            "'^[0-9a-f]{4}:[0-9a-f]{2}$'",
        ),
        (
            {"address": "0000:08", "count": None},
            'spec.count: Invalid value: "null": spec.count in body must be of type integer: "null"',
        ),
        (
            {"address": "0000:08", "port": True},
            'spec.port: Invalid value: "boolean": spec.port in body must be of type integer or '
            'string: "boolean"',
        ),
        (
            {"address": "0000:08", "labels": {"a": 1}},
            'spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type '
            'string: "integer"',
        ),
    ],
)
def test_a_violation_is_named_by_its_field_path(spec: dict[str, Any], cause: str) -> None:
    assert validate(obj(**spec), SCHEMA) == [cause]


def test_what_the_schema_allows_is_valid() -> None:
    o = obj(address="0000:08", count=3, mode="on", port="http", note=None, labels={"a": "b"})
    assert validate(o, SCHEMA) == []
    assert validate({**obj(address="0000:08", port=8080)}, SCHEMA) == []


def test_a_schema_keyword_the_model_does_not_know_is_refused() -> None:
    with pytest.raises(UnsupportedSchema, match=r"properties.spec: oneOf"):
        check_schema({"type": "object", "properties": {"spec": {"oneOf": []}}})


def test_our_crds_use_only_what_the_model_knows() -> None:
    for path in sorted((REPO / "schemas" / "crds").glob("*.yaml")):
        for version in yaml.safe_load(path.read_text())["spec"]["versions"]:
            check_schema(version["schema"]["openAPIV3Schema"])


# -- through the emulator, over HTTP with the real client -------------------------------------


@pytest.fixture
def custom(tmp_path: Path) -> Iterator[Any]:
    with ApiServerEmulator() as emulator:
        emulator.register_crd(
            yaml.safe_load(
                (REPO / "schemas/crds/vgpudevices.devices.harvesterhci.io.yaml").read_text()
            )
        )
        config = client.Configuration()
        config.host = emulator.url
        with client.ApiClient(config) as api:
            yield client.CustomObjectsApi(api)


def vgpu_device(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VGPUDevice",
        "metadata": {"name": "n1-000008004"},
        "spec": {
            "address": "0000:08:00.4",
            "enabled": True,
            "nodeName": "n1",
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": "NVIDIA A2-4Q",
            **spec,
        },
    }


def test_the_emulator_stores_a_write_pruned_to_the_crd(custom: Any) -> None:
    created = custom.create_cluster_custom_object(
        GROUP, VERSION, "vgpudevices", vgpu_device(colour="blue")
    )
    assert "colour" not in created["spec"]
    assert created["spec"]["address"] == "0000:08:00.4"


def test_the_emulator_refuses_an_invalid_write_with_422_naming_the_fields(custom: Any) -> None:
    # Harvester's schema has no required field and no pattern: types are what it checks.
    body = vgpu_device(address=8004, enabled="yes")

    with pytest.raises(client.ApiException) as caught:
        custom.create_cluster_custom_object(GROUP, VERSION, "vgpudevices", body)

    assert caught.value.status == 422
    message = yaml.safe_load(caught.value.body)["message"]
    assert message.startswith('VGPUDevice.devices.harvesterhci.io "n1-000008004" is invalid: [')
    assert 'spec.address in body must be of type string: "integer"' in message
    assert 'spec.enabled in body must be of type boolean: "string"' in message
    assert custom.list_cluster_custom_object(GROUP, VERSION, "vgpudevices")["items"] == []
