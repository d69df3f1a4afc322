"""schemas/crds/ are the contract of the objects vgpuctl writes to the cluster: Harvester's
SRIOVGPUDevice and VGPUDevice exactly as Harvester's own CRDs declare them (docs/domain.md §5),
and vgpuctl's own per-node VGPUNodeState.

Harvester's two are compared with Harvester's CRDs (tests/fixtures/harvester-crds/, written from
harvester/pcidevices ``charts/templates/crds.yaml``): the same schema and printer columns,
descriptions aside. All three are checked for the structural-schema rules the API server
enforces and used as validators: the openAPIV3Schema is turned into a JSON Schema (the small
conversion below) that must accept the seed's example objects and the planner's rendered
objects, and reject unknown fields (the API server prunes them) and wrong types.
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
    HARVESTER_SPEC,
    HARVESTER_STATUS,
    NODE_LABEL,
    NODE_STATE_GROUP,
    NODE_STATE_KIND,
    NODE_STATE_PLURAL,
    NODE_STATE_VERSION,
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
HARVESTER = REPO / "tests" / "fixtures" / "harvester-crds"
FIXTURES = REPO / "tests" / "fixtures" / "crds"
SRIOV_CRD_FILE = CRDS / f"{SRIOV_GPU_PLURAL}.{GROUP}.yaml"
VGPU_CRD_FILE = CRDS / f"{VGPU_PLURAL}.{GROUP}.yaml"
NODE_STATE_CRD_FILE = CRDS / f"{NODE_STATE_PLURAL}.{NODE_STATE_GROUP}.yaml"

# Harvester's fields (docs/domain.md §5), written out here from its Go types.
SRIOV_SPEC = {"address", "nodeName", "enabled"}
SRIOV_STATUS = {"vfAddresses", "vGPUDevices"}
VGPU_SPEC = {"address", "enabled", "nodeName", "parentGPUDeviceAddress", "vGPUTypeName"}
VGPU_STATUS = {"vGPUStatus", "uuid", "configureVGPUTypeName", "availableTypes"}
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


CRD_BY_KIND = {
    SRIOV_GPU_KIND: _load(SRIOV_CRD_FILE),
    VGPU_KIND: _load(VGPU_CRD_FILE),
    NODE_STATE_KIND: _load(NODE_STATE_CRD_FILE),
}
HARVESTERS = (SRIOV_GPU_KIND, VGPU_KIND)


def _version(crd: Mapping[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return dict(version)


def _open_api(kind: str) -> dict[str, Any]:
    return dict(_version(CRD_BY_KIND[kind])["schema"]["openAPIV3Schema"])


def _root(kind: str) -> dict[str, Any]:
    """The kind's schema with the root fields the API server keeps whatever the schema says
    (apiVersion, kind, metadata: Harvester's schema does not declare them)."""
    schema = to_json_schema(_open_api(kind))
    root = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    }
    schema["properties"] = {**root, **schema["properties"]}
    return schema


VALIDATORS = {kind: jsonschema.Draft202012Validator(_root(kind)) for kind in CRD_BY_KIND}


def _errors(obj: Mapping[str, Any]) -> list[str]:
    validator = VALIDATORS[str(obj["kind"])]
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def _seed(name: str) -> dict[str, Any]:
    return _load(FIXTURES / name)


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


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
        },
    }


def _full_vgpu() -> dict[str, Any]:
    """A VGPUDevice with every field set, as vgpuctl writes it for a vGPU."""
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
        },
    }


def _full_node_state() -> dict[str, Any]:
    """A VGPUNodeState with every field set, written by hand from the CRD's description."""
    a2_4q = VGPUType("NVIDIA A2-4Q", "nvidia-746", 4096, 4, 4, "7680x4320", 60).to_json()
    return {
        "apiVersion": f"{NODE_STATE_GROUP}/{NODE_STATE_VERSION}",
        "kind": NODE_STATE_KIND,
        "metadata": {
            "name": "harvester-kgd9c",
            "labels": {NODE_LABEL: "harvester-kgd9c", "app.kubernetes.io/managed-by": "vgpuctl"},
        },
        "spec": {"nodeName": "harvester-kgd9c"},
        "status": {
            "vgpuctlVersion": "0.1.0",
            "desiredFingerprint": "sha256:" + "0" * 64,
            "counts": {
                "gpus": 1,
                "managedGPUs": 1,
                "vfs": 16,
                "vgpus": 1,
                "inUse": 1,
                "blocked": 0,
            },
            "gpus": [
                {
                    "address": "0000:08:00.0",
                    "vendorId": "10de",
                    "deviceId": "25b6",
                    "subsystemVendorId": "10de",
                    "subsystemDeviceId": "157e",
                    "model": "NVIDIA A2",
                    "interface": "mdev",
                    "driver": "nvidia",
                    "managed": True,
                    "sriov": {"totalVFs": 16, "numVFs": 16, "vfOffset": 4, "vfStride": 1},
                    "vfAddresses": ["0000:08:00.4", "0000:08:00.5"],
                    "typeSet": 0,
                }
            ],
            "typeSets": [[a2_4q]],
            "vgpus": [
                {
                    "gpu": "0000:08:00.0",
                    "vf": "0000:08:00.5",
                    "vfIndex": 1,
                    "profile": "NVIDIA A2-4Q",
                    "uuid": "9534e04b-4687-412b-833e-3ae95b97d4d1",
                    "inUse": True,
                    "holder": "VM default/win11 (pod virt-launcher-win11-abcde)",
                }
            ],
            "profiles": [
                {
                    "name": "NVIDIA A2-4Q",
                    "resourceName": "nvidia.com/NVIDIA_A2-4Q",
                    "wanted": 1,
                    "vgpus": 1,
                    "inUse": 1,
                    "creatable": 3,
                }
            ],
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": "R",
                    "message": "m",
                    "lastTransitionTime": "2026-12-01T10:00:00Z",
                }
                for t, s in (("Converged", "True"), ("Blocked", "False"), ("Degraded", "False"))
            ],
            "lastChange": {"time": "2026-12-01T10:00:00Z", "result": "applied 1 action"},
        },
    }


# --- the CRDs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", HARVESTERS)
def test_our_crds_for_harvesters_kinds_are_harvesters_own(kind: str) -> None:
    """Installing ours or Harvester's is the same: equal but for descriptions and our labels."""
    ours = _without_descriptions(CRD_BY_KIND[kind])
    ours["metadata"].pop("labels")
    theirs = _load(HARVESTER / f"{CRD_BY_KIND[kind]['metadata']['name']}.yaml")
    assert theirs["spec"].pop("preserveUnknownFields", False) is False  # v1's default
    assert ours["spec"].pop("preserveUnknownFields") is False
    assert ours == theirs


@pytest.mark.parametrize("kind", HARVESTERS)
def test_harvesters_schema_has_exactly_the_fields_vgpuctl_writes(kind: str) -> None:
    spec, status = {
        SRIOV_GPU_KIND: (SRIOV_SPEC, SRIOV_STATUS),
        VGPU_KIND: (VGPU_SPEC, VGPU_STATUS),
    }[kind]
    props = _open_api(kind)["properties"]
    assert set(props["spec"]["properties"]) == spec == {n for n, _ in HARVESTER_SPEC[kind]}
    assert set(props["status"]["properties"]) == status == set(HARVESTER_STATUS[kind])
    # Harvester's schema requires nothing and has no enums or patterns (Go types, no markers).
    text = yaml.safe_dump(props)
    assert "required" not in text and "enum" not in text and "pattern" not in text


def test_the_node_state_crd_is_vgpuctls_own() -> None:
    crd = CRD_BY_KIND[NODE_STATE_KIND]
    assert crd["metadata"]["name"] == f"{NODE_STATE_PLURAL}.{NODE_STATE_GROUP}"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == (NODE_STATE_GROUP, "Cluster")
    assert spec["names"]["kind"] == NODE_STATE_KIND
    assert spec["names"]["plural"] == NODE_STATE_PLURAL
    version = _version(crd)
    assert (version["name"], version["served"], version["storage"]) == (
        NODE_STATE_VERSION,
        True,
        True,
    )
    assert version["subresources"] == {"status": {}}
    # kubectl get vgns: node, converged, vGPUs, blocked, age (issue 12).
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Node", ".spec.nodeName"),
        ("Converged", '.status.conditions[?(@.type=="Converged")].status'),
        ("vGPUs", ".status.counts.vgpus"),
        ("In Use", ".status.counts.inUse"),
        ("Blocked", ".status.counts.blocked"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_file_names_are_the_crd_names() -> None:
    assert sorted(p.name for p in CRDS.iterdir()) == sorted(
        f"{crd['metadata']['name']}.yaml" for crd in CRD_BY_KIND.values()
    )


def test_printer_columns_print_the_seeds_table_row() -> None:
    obj = _seed("seed-vgpudevice.yaml")
    cells = []
    for column in _version(CRD_BY_KIND[VGPU_KIND])["additionalPrinterColumns"]:
        value: Any = obj
        for part in column["jsonPath"].lstrip(".").split("."):
            value = value[part]
        cells.append(str(value).lower() if isinstance(value, bool) else str(value))
    assert cells == re.split(r"\s{2,}", SEED_TABLE_ROW)


@pytest.mark.parametrize("kind", [SRIOV_GPU_KIND, VGPU_KIND, NODE_STATE_KIND])
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


@pytest.mark.parametrize("kind", HARVESTERS)
def test_every_field_is_described(kind: str) -> None:
    undescribed = [
        path for path, node in schema_nodes(_open_api(kind)) if not node.get("description")
    ]
    assert undescribed == []


def test_every_node_state_status_field_is_described() -> None:
    status = _open_api(NODE_STATE_KIND)["properties"]["status"]["properties"]
    assert [name for name, node in status.items() if not node.get("description")] == []


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
    assert _errors(_seed(name)) == []


@pytest.mark.parametrize("build", [_full_sriov, _full_vgpu, _full_node_state])
def test_an_object_with_every_field_validates(build: Any) -> None:
    assert _errors(build()) == []


@pytest.mark.parametrize("build", [_full_sriov, _full_vgpu])
def test_harvesters_nulls_validate(build: Any) -> None:
    """Harvester's strings are nullable (Go's zero values): null reads as empty."""
    obj = build()
    for key in obj["spec"]:
        if isinstance(obj["spec"][key], str):
            obj["spec"][key] = None
    assert _errors(obj) == []


@pytest.mark.parametrize("build", [_full_sriov, _full_vgpu, _full_node_state])
def test_a_freshly_created_object_has_no_status(build: Any) -> None:
    obj = build()
    del obj["status"]
    assert _errors(obj) == []
    obj["status"] = {}
    assert _errors(obj) == []


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    obj[last] = value


# (base object, path, value, what the validator must name)
REJECTED = [
    (_full_vgpu, "spec.vGPUTypename", "NVIDIA A2-4Q", "'vGPUTypename' was unexpected"),
    (_full_vgpu, "status.configuredVGPUTypeName", "x", "'configuredVGPUTypeName' was unexp"),
    # vgpuctl's additions of old: Harvester's schema prunes them.
    (_full_vgpu, "status.inUse", True, "'inUse' was unexpected"),
    (_full_vgpu, "status.vfIndex", 1, "'vfIndex' was unexpected"),
    (_full_sriov, "status.model", "NVIDIA A2", "'model' was unexpected"),
    (_full_sriov, "status.vgpuDevices", [], "'vgpuDevices' was unexpected"),
    (_full_sriov, "extra", {}, "'extra' was unexpected"),
    (_full_vgpu, "spec.enabled", "true", "'true' is not of type 'boolean'"),
    (_full_vgpu, "status.availableTypes", {"NVIDIA A2-4Q": 746}, "is not of type 'string', 'null'"),
    (_full_node_state, "status.counts.vgpus", -1, "less than the minimum"),
    (_full_node_state, "status.vgpus.0.inUse", "no", "is not of type 'boolean'"),
    (_full_node_state, "status.conditions.0.type", "Ready", "is not one of"),
    (_full_node_state, "status.conditions.0.status", "yes", "is not one of"),
    (_full_node_state, "status.summary", {}, "'summary' was unexpected"),
]


@pytest.mark.parametrize(
    ("build", "path", "value", "message"), REJECTED, ids=[path for _, path, _, _ in REJECTED]
)
def test_the_schema_rejects(build: Any, path: str, value: Any, message: str) -> None:
    obj = build()
    assert _errors(obj) == []  # the change alone makes it invalid
    _set(obj, path, copy.deepcopy(value))
    errors = _errors(obj)
    assert errors, f"{path} = {value!r} was accepted"
    assert any(message in e for e in errors), errors


def test_a_condition_without_its_transition_time_is_rejected() -> None:
    obj = _full_node_state()
    del obj["status"]["conditions"][0]["lastTransitionTime"]
    assert any("'lastTransitionTime' is a required property" in e for e in _errors(obj))


# --- the planner's objects ------------------------------------------------------------------------

SEED_NODE = "harvester-kgd9c"


def _planned() -> list[dict[str, Any]]:
    """Every object a plan for the seed's node writes (from SR-IOV off: all created)."""
    from reconciler.desired import load_desired
    from reconciler.model import CrCreate
    from reconciler.model.cluster import ClusterState
    from reconciler.model.nodestate import stamped
    from reconciler.plan import plan_node

    catalog = default_catalog()
    desired = load_desired([REPO / "desired-state" / f"{SEED_NODE}.yaml"], catalog=catalog)
    node = desired.node(SEED_NODE)
    assert node is not None
    observed = REPO / "tests" / "cases" / "seed-fresh-enable-and-create" / "observed.json"
    inventory = Inventory.from_json(json.loads(observed.read_text("utf-8")))
    plan = plan_node(node, inventory, catalog=catalog, cluster=ClusterState(SEED_NODE))
    out = []
    for a in plan.actions:
        if isinstance(a, CrCreate):
            body = a.object.to_json()
            body["status"] = stamped(body["status"], "2026-12-02T03:00:00Z")  # as the executor
            out.append(body)
    return out


def test_planned_objects_validate_against_the_crds() -> None:
    """Nothing vgpuctl writes is a field the API server would prune or refuse."""
    objects = _planned()
    # The seed's node: one managed A2 with 16 VFs, and the node's summary.
    assert sorted(obj["kind"] for obj in objects) == sorted(
        [SRIOV_GPU_KIND] + [VGPU_KIND] * 16 + [NODE_STATE_KIND]
    )
    for obj in objects:
        assert _errors(obj) == [], obj["metadata"]["name"]


def test_planned_objects_write_every_spec_field_and_only_non_empty_status_fields() -> None:
    fields = {SRIOV_GPU_KIND: (SRIOV_SPEC, SRIOV_STATUS), VGPU_KIND: (VGPU_SPEC, VGPU_STATUS)}
    for obj in _planned():
        if obj["kind"] == NODE_STATE_KIND:
            continue
        spec, status = fields[obj["kind"]]
        name = obj["metadata"]["name"]
        assert set(obj["spec"]) == spec, name
        assert set(obj["status"]) <= status, name
        assert all(v not in ("", [], {}, None) for v in obj["status"].values()), name
