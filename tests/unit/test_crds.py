"""schemas/crds/ are the contract of the objects vgpuctl writes to the cluster: Harvester's
SRIOVGPUDevice and VGPUDevice (docs/domain.md §5) plus vgpuctl's additive status fields.

The CRDs are checked for shape (group, version, scope, status subresource, names, printer
columns), for the structural-schema rules the API server enforces, and as validators: the
openAPIV3Schema is turned into a JSON Schema (the small conversion below) that must accept the
seed's example objects and the planner's rendered objects, and reject unknown fields (the API
server prunes them, or refuses them under strict field validation) and wrong types.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reconciler.catalog import default_catalog
from reconciler.model import Inventory
from reconciler.model.cluster import (
    GROUP,
    NODE_LABEL,
    PARENT_LABEL,
    SRIOV_GPU_KIND,
    SRIOV_GPU_PLURAL,
    VERSION,
    VGPU_KIND,
    VGPU_PLURAL,
    object_name,
)
from reconciler.model.inventory import VGPUType

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "schemas" / "crds"
FIXTURES = REPO / "tests" / "fixtures" / "crds"
SRIOV_CRD_FILE = CRDS / f"{SRIOV_GPU_PLURAL}.{GROUP}.yaml"
VGPU_CRD_FILE = CRDS / f"{VGPU_PLURAL}.{GROUP}.yaml"

# The object shapes agreed in notes/contracts-cluster.md: every one of these fields is declared.
SRIOV_SPEC = {"address", "nodeName", "enabled"}
SRIOV_STATUS = {
    "vfAddresses",
    "vGPUDevices",
    "model",
    "vendorId",
    "deviceId",
    "subsystemVendorId",
    "subsystemDeviceId",
    "interface",
    "driver",
    "totalVFs",
    "numVFs",
    "vfOffset",
    "vfStride",
    "vgpuTypes",
}
VGPU_SPEC = {"address", "enabled", "nodeName", "parentGPUDeviceAddress", "vGPUTypeName"}
VGPU_STATUS = {
    "vGPUStatus",
    "uuid",
    "configureVGPUTypeName",
    "availableTypes",
    "vfIndex",
    "inUse",
    "holder",
}

# docs/domain.md §5; the seed's `kubectl get vgpudevices` table has exactly these columns.
SRIOV_COLUMNS = [
    ("Address", "string", ".spec.address"),
    ("Node Name", "string", ".spec.nodeName"),
    ("Enabled", "boolean", ".spec.enabled"),
    ("VGPUDevices", "string", ".status.vGPUDevices"),
]
VGPU_COLUMNS = [
    ("Address", "string", ".spec.address"),
    ("Node Name", "string", ".spec.nodeName"),
    ("Enabled", "boolean", ".spec.enabled"),
    ("UUID", "string", ".status.uuid"),
    ("VGPUType", "string", ".spec.vGPUTypeName"),
    ("ParentGPUDevice", "string", ".spec.parentGPUDeviceAddress"),
]
# The seed's first row of `kubectl get vgpudevices` (after NAME), for its example VGPUDevice.
SEED_TABLE_ROW = (
    "0000:08:00.4   harvester-kgd9c   true      dd6772a8-7db8-4e96-9a73-f94c389d9bc3   "
    "NVIDIA A2-4A   0000:08:00.0"
)


# --- the conversion: openAPIV3Schema (Kubernetes' structural subset) → JSON Schema ------------


def to_json_schema(node: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema that accepts what the API server would store unchanged.

    ``nullable`` becomes a ``null`` type; ``x-kubernetes-int-or-string`` an integer-or-string
    type; other ``x-kubernetes-*`` keys (list types, CEL rules) are dropped — their rules are not
    evaluated here. An object with ``properties`` and neither ``additionalProperties`` nor
    ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false``: the API server
    prunes unknown fields there (strict field validation refuses them), so a field vgpuctl writes
    that the schema does not declare would be lost.
    """
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "nullable" or key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable"):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


# Keys a structural schema may not use (apiextensions validation), and the types it knows.
FORBIDDEN_KEYS = {"$ref", "$schema", "definitions", "dependencies", "id", "patternProperties"}
TYPES = {"string", "number", "integer", "boolean", "array", "object"}


def structural_violations(node: Mapping[str, Any], path: str = "") -> list[str]:
    """Why ``node`` is not a structural schema (empty when it is), for the rules that matter
    for hand-written CRDs: a type on every node, no forbidden keys, no ``uniqueItems``, no
    ``additionalProperties`` next to ``properties`` or set to false, one schema for ``items``,
    and ``metadata`` left to the API server."""
    problems: list[str] = []
    where = path or "<root>"
    unknown_allowed = node.get("x-kubernetes-int-or-string") or node.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    if "type" not in node and not unknown_allowed:
        problems.append(f"{where}: no type")
    elif "type" in node and node["type"] not in TYPES:
        problems.append(f"{where}: type {node['type']!r} is not one of {sorted(TYPES)}")
    problems += [f"{where}: {key} is forbidden" for key in sorted(FORBIDDEN_KEYS & set(node))]
    if node.get("uniqueItems"):
        problems.append(f"{where}: uniqueItems is forbidden")
    if "additionalProperties" in node:
        if "properties" in node:
            problems.append(f"{where}: additionalProperties next to properties")
        if node["additionalProperties"] is False:
            problems.append(f"{where}: additionalProperties: false is forbidden")
    if isinstance(node.get("items"), list):
        problems.append(f"{where}: items must be one schema")
    for name, sub in (node.get("properties") or {}).items():
        sub_path = f"{path}.{name}"
        if sub_path == ".metadata" and set(sub) - {"type", "description"}:
            problems.append(".metadata: only the API server's own rules apply to metadata")
        problems += structural_violations(sub, sub_path)
    if isinstance(node.get("items"), dict):
        problems += structural_violations(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_violations(node["additionalProperties"], f"{path}{{}}")
    return problems


def schema_nodes(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every declared property below ``node`` with its dotted path (``.spec.address``)."""
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")


# --- fixtures -----------------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text("utf-8"))
    assert isinstance(doc, dict), path
    return doc


CRD_BY_KIND = {SRIOV_GPU_KIND: _load(SRIOV_CRD_FILE), VGPU_KIND: _load(VGPU_CRD_FILE)}
COLUMNS_BY_KIND = {SRIOV_GPU_KIND: SRIOV_COLUMNS, VGPU_KIND: VGPU_COLUMNS}


def _version(crd: Mapping[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return dict(version)


def _open_api(kind: str) -> dict[str, Any]:
    return dict(_version(CRD_BY_KIND[kind])["schema"]["openAPIV3Schema"])


VALIDATORS = {
    kind: jsonschema.Draft202012Validator(to_json_schema(_open_api(kind))) for kind in CRD_BY_KIND
}


def _errors(obj: Mapping[str, Any]) -> list[str]:
    validator = VALIDATORS[str(obj["kind"])]
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def _seed(name: str) -> dict[str, Any]:
    return _load(FIXTURES / name)


def _full_sriov() -> dict[str, Any]:
    """An SRIOVGPUDevice with every field set, as vgpuctl writes it for the seed's A2."""
    vfs = [f"0000:08:0{i // 8}.{i % 8}" for i in range(4, 20)]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": SRIOV_GPU_KIND,
        "metadata": {
            "name": "harvester-kgd9c-000008000",
            "labels": {NODE_LABEL: "harvester-kgd9c", "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": {"address": "0000:08:00.0", "nodeName": "harvester-kgd9c", "enabled": True},
        "status": {
            "vfAddresses": vfs,
            "vGPUDevices": [object_name("harvester-kgd9c", a) for a in vfs],
            "model": "NVIDIA A2",
            "vendorId": "10de",
            "deviceId": "25b6",
            "subsystemVendorId": "10de",
            "subsystemDeviceId": "157e",
            "interface": "mdev",
            "driver": "nvidia",
            "totalVFs": 16,
            "numVFs": 16,
            "vfOffset": 4,
            "vfStride": 1,
            "vgpuTypes": [
                VGPUType("NVIDIA A2-4Q", "nvidia-746", 4096, 4, 4, "7680x4320", 60).to_json()
            ],
        },
    }


def _full_vgpu() -> dict[str, Any]:
    """A VGPUDevice with every field set, as vgpuctl writes it for a held vGPU."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": VGPU_KIND,
        "metadata": {
            "name": "harvester-kgd9c-000008005",
            "labels": {
                NODE_LABEL: "harvester-kgd9c",
                PARENT_LABEL: "harvester-kgd9c-000008000",
                "app.kubernetes.io/managed-by": "vgpuctl",
            },
            "annotations": {"vgpu.reconciler.dev/last-applied-spec": "{}"},
        },
        "spec": {
            "address": "0000:08:00.5",
            "enabled": True,
            "nodeName": "harvester-kgd9c",
            "parentGPUDeviceAddress": "0000:08:00.0",
            "vGPUTypeName": "NVIDIA A2-4Q",
        },
        "status": {
            "vGPUStatus": "vGPUConfigured",
            "uuid": "9534e04b-4687-412b-833e-3ae95b97d4d1",
            "configureVGPUTypeName": "NVIDIA A2-4Q",
            "availableTypes": {"NVIDIA A2-4Q": "nvidia-746"},
            "vfIndex": 1,
            "inUse": True,
            "holder": "VM default/win11 (pod virt-launcher-win11-abcde)",
        },
    }


# --- CRD shape ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "plural", "short"),
    [(SRIOV_GPU_KIND, SRIOV_GPU_PLURAL, "sriovgpu"), (VGPU_KIND, VGPU_PLURAL, "vgpu")],
)
def test_crd_identity_matches_the_model(kind: str, plural: str, short: str) -> None:
    crd = CRD_BY_KIND[kind]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
    spec = crd["spec"]
    assert spec["group"] == GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"] == {
        "plural": plural,
        "singular": kind.lower(),
        "kind": kind,
        "listKind": f"{kind}List",
        "shortNames": [short],
    }
    version = _version(crd)
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert version["subresources"] == {"status": {}}


def test_file_names_are_the_crd_names() -> None:
    assert sorted(p.name for p in CRDS.iterdir()) == sorted(
        f"{crd['metadata']['name']}.yaml" for crd in CRD_BY_KIND.values()
    )


@pytest.mark.parametrize("kind", [SRIOV_GPU_KIND, VGPU_KIND])
def test_printer_columns_are_harvesters(kind: str) -> None:
    columns = _version(CRD_BY_KIND[kind])["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == COLUMNS_BY_KIND[kind]
    # Each column shows a declared field of the matching type: a typo would print blanks.
    declared = dict(schema_nodes(_open_api(kind)))
    for column in columns:
        field = declared[column["jsonPath"]]
        expected = "array" if column["name"] == "VGPUDevices" else column["type"]
        assert field["type"] == expected, column


def test_printer_columns_print_the_seeds_table_row() -> None:
    obj = _seed("seed-vgpudevice.yaml")
    cells = []
    for column in _version(CRD_BY_KIND[VGPU_KIND])["additionalPrinterColumns"]:
        value: Any = obj
        for part in column["jsonPath"].lstrip(".").split("."):
            value = value[part]
        cells.append(str(value).lower() if isinstance(value, bool) else str(value))
    assert cells == re.split(r"\s{2,}", SEED_TABLE_ROW)


# --- the schema -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "spec", "status"),
    [(SRIOV_GPU_KIND, SRIOV_SPEC, SRIOV_STATUS), (VGPU_KIND, VGPU_SPEC, VGPU_STATUS)],
)
def test_schema_declares_every_field_of_the_object_shape(
    kind: str, spec: set[str], status: set[str]
) -> None:
    props = _open_api(kind)["properties"]
    assert set(props) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert set(props["spec"]["properties"]) == spec
    # Every spec field is always written (Harvester's Go types have no omitempty on them)...
    assert set(props["spec"]["required"]) == spec
    assert set(props["status"]["properties"]) == status
    # ...while a freshly created object has no status at all.
    assert "required" not in props["status"]


def test_vgpu_type_entries_are_the_models_json() -> None:
    entry = _open_api(SRIOV_GPU_KIND)["properties"]["status"]["properties"]["vgpuTypes"]["items"]
    assert set(entry["properties"]) == set(VGPUType("x", "y", 1, 1).to_json())


def test_harvester_field_spellings_are_kept() -> None:
    status = _open_api(VGPU_KIND)["properties"]["status"]["properties"]
    assert "configureVGPUTypeName" in status  # sic: Harvester's spelling
    assert status["availableTypes"] == {
        "description": status["availableTypes"]["description"],
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
    assert status["vGPUStatus"]["enum"] == ["", "vGPUConfigured"]
    assert _open_api(SRIOV_GPU_KIND)["properties"]["status"]["properties"]["model"]["nullable"]


@pytest.mark.parametrize("kind", [SRIOV_GPU_KIND, VGPU_KIND])
def test_schema_is_structural(kind: str) -> None:
    schema = _open_api(kind)
    assert structural_violations(schema) == []
    # Nothing needs to keep unknown fields: every field vgpuctl or Harvester writes is declared.
    assert "x-kubernetes-preserve-unknown-fields" not in yaml.safe_dump(schema)


def test_structural_check_can_fail() -> None:
    bad = {
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": {
                "type": "object",
                "properties": {"a": {"description": "no type"}},
                "additionalProperties": False,
            },
            "list": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "ref": {"$ref": "#/definitions/x"},
        },
    }
    assert structural_violations(bad) == [
        ".metadata: only the API server's own rules apply to metadata",
        ".spec: additionalProperties next to properties",
        ".spec: additionalProperties: false is forbidden",
        ".spec.a: no type",
        ".list: uniqueItems is forbidden",
        ".ref: no type",
        ".ref: $ref is forbidden",
    ]


@pytest.mark.parametrize("kind", [SRIOV_GPU_KIND, VGPU_KIND])
def test_every_field_is_described(kind: str) -> None:
    undescribed = [
        path
        for path, node in schema_nodes(_open_api(kind))
        if path not in (".metadata",) and not node.get("description")
    ]
    assert undescribed == []


# --- validation -----------------------------------------------------------------------------------


def test_conversion_keeps_kubernetes_semantics() -> None:
    converted = to_json_schema(
        {
            "type": "object",
            "properties": {
                "a": {"type": "string", "nullable": True, "enum": ["x"]},
                "b": {"x-kubernetes-int-or-string": True},
                "c": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "d": {"type": "object", "additionalProperties": {"type": "integer"}},
                "e": {"type": "array", "items": {"type": "object", "properties": {}}},
            },
        }
    )
    assert converted == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": {"type": ["string", "null"], "enum": ["x", None]},
            "b": {"type": ["integer", "string"]},
            "c": {"type": "object"},
            "d": {"type": "object", "additionalProperties": {"type": "integer"}},
            "e": {
                "type": "array",
                "items": {"type": "object", "properties": {}, "additionalProperties": False},
            },
        },
    }


@pytest.mark.parametrize("name", ["seed-sriovgpudevice.yaml", "seed-vgpudevice.yaml"])
def test_the_seeds_example_objects_validate(name: str) -> None:
    obj = _seed(name)
    # The seed's objects carry only Harvester's status fields: vgpuctl's are optional.
    assert _errors(obj) == []


@pytest.mark.parametrize("build", [_full_sriov, _full_vgpu])
def test_an_object_with_every_field_validates(build: Any) -> None:
    assert _errors(build()) == []


def test_a_model_the_catalogue_does_not_know_is_null() -> None:
    obj = _full_sriov()
    obj["status"]["model"] = None
    assert _errors(obj) == []


@pytest.mark.parametrize("build", [_full_sriov, _full_vgpu])
def test_a_freshly_created_object_has_no_status(build: Any) -> None:
    obj = build()
    del obj["status"]
    assert _errors(obj) == []
    obj["status"] = {}
    assert _errors(obj) == []


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj[part]
    obj[last] = value


def _drop(obj: dict[str, Any], path: str, _: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj[part]
    del obj[last]


# (base object, change, path, value, what the validator must name)
REJECTED = [
    (_full_vgpu, _set, "spec.vGPUTypename", "NVIDIA A2-4Q", "'vGPUTypename' was unexpected"),
    (_full_vgpu, _set, "status.configuredVGPUTypeName", "x", "'configuredVGPUTypeName' was unexp"),
    (_full_sriov, _set, "status.vgpuDevices", [], "'vgpuDevices' was unexpected"),
    (_full_sriov, _set, "extra", {}, "'extra' was unexpected"),
    (_full_vgpu, _set, "spec.enabled", "true", "'true' is not of type 'boolean'"),
    (_full_sriov, _set, "spec.address", "0000:08:00", "does not match"),
    (_full_vgpu, _set, "spec.parentGPUDeviceAddress", "08:00.0", "does not match"),
    (_full_sriov, _set, "status.vfAddresses", ["0000:08:0g.4"], "does not match"),
    (_full_vgpu, _set, "status.vGPUStatus", "configured", "is not one of"),
    (_full_vgpu, _set, "status.availableTypes", {"NVIDIA A2-4Q": 746}, "is not of type 'string'"),
    (_full_vgpu, _set, "status.vfIndex", -1, "less than the minimum"),
    (_full_vgpu, _set, "status.inUse", "no", "is not of type 'boolean'"),
    (_full_sriov, _set, "status.interface", "pci", "is not one of"),
    (_full_sriov, _set, "status.numVFs", "16", "is not of type 'integer'"),
    (_full_sriov, _set, "status.vgpuTypes", [{"id": "nvidia-746"}], "'name' is a required"),
    (
        _full_sriov,
        _set,
        "status.vgpuTypes",
        [{"name": "A", "id": "1", "framebufferMiB": 1, "maxInstances": 1, "size": 1}],
        "'size' was unexp",
    ),
    (_full_vgpu, _drop, "spec.vGPUTypeName", None, "'vGPUTypeName' is a required property"),
    (_full_sriov, _drop, "spec.enabled", None, "'enabled' is a required property"),
    (_full_sriov, _set, "spec.nodeName", "", "should be non-empty"),
]


@pytest.mark.parametrize(
    ("build", "change", "path", "value", "message"),
    REJECTED,
    ids=[f"{change.__name__[1:]}-{path}" for _, change, path, _, _ in REJECTED],
)
def test_the_schema_rejects(build: Any, change: Any, path: str, value: Any, message: str) -> None:
    obj = build()
    assert _errors(obj) == []  # the change alone makes it invalid
    change(obj, path, copy.deepcopy(value))
    errors = _errors(obj)
    assert errors, f"{path} = {value!r} was accepted"
    assert any(message in e for e in errors), errors


# --- the planner's rendered objects ---------------------------------------------------------------

SEED_NODE = "harvester-kgd9c"


def _rendered() -> list[dict[str, Any]]:
    from reconciler.desired import load_desired
    from reconciler.plan.render import render_objects

    catalog = default_catalog()
    desired = load_desired([REPO / "desired-state" / f"{SEED_NODE}.yaml"], catalog=catalog)
    node = desired.node(SEED_NODE)
    assert node is not None
    observed = REPO / "tests" / "cases" / "seed-already-applied" / "observed.json"
    inventory = Inventory.from_json(json.loads(observed.read_text("utf-8")))
    return [obj.to_json() for obj in render_objects(SEED_NODE, node, inventory)]


def test_rendered_objects_validate_against_the_crds() -> None:
    objects = _rendered()
    kinds = sorted(obj["kind"] for obj in objects)
    # The seed's node: one managed A2 with 16 VFs.
    assert kinds == [SRIOV_GPU_KIND] + [VGPU_KIND] * 16
    for obj in objects:
        assert obj["apiVersion"] == f"{GROUP}/{VERSION}"
        assert _errors(obj) == [], obj["metadata"]["name"]


def test_rendered_objects_fill_every_declared_field() -> None:
    """The renderer and the CRDs agree both ways: nothing rendered is undeclared (the validation
    above) and nothing declared is left unrendered for a GPU whose VFs and vGPUs exist."""
    fields = {SRIOV_GPU_KIND: (SRIOV_SPEC, SRIOV_STATUS), VGPU_KIND: (VGPU_SPEC, VGPU_STATUS)}
    for obj in _rendered():
        spec, status = fields[obj["kind"]]
        name = obj["metadata"]["name"]
        assert set(obj["spec"]) == spec, name
        assert set(obj["status"]) == status, name
