"""The emulator's server-side printing (``tables.py``) against the real code's rules, written by
hand from k8s.io/apimachinery's ``duration.HumanDuration``, client-go's jsonpath
``PrintResults`` and apiextensions-apiserver's table convertor."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.doubles import tables
from tests.doubles.emulator import ApiServerEmulator


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (310, "5m10s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 25 * 60, "3h25m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (48 * 3600, "2d"),
        (50 * 3600, "2d2h"),
        (8 * 86400, "8d"),
        (729 * 86400, "729d"),
        (730 * 86400, "2y"),
        (731 * 86400, "2y1d"),
        (8 * 365 * 86400, "8y"),
    ],
)
def test_ages_read_as_kubectl_shows_them(seconds: int, shown: str) -> None:
    assert tables.human_duration(seconds) == shown


def test_cells_are_printed_as_the_api_server_prints_them() -> None:
    declared = [
        {"name": "Enabled", "type": "string", "jsonPath": ".spec.enabled"},
        {"name": "Devices", "type": "string", "jsonPath": ".status.devices"},
        {"name": "Count", "type": "integer", "jsonPath": ".status.count"},
        {"name": "Ratio", "type": "string", "jsonPath": ".status.ratio"},
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "First", "type": "string", "jsonPath": ".status.devices[0]"},
        {"name": "Missing", "type": "string", "jsonPath": ".status.nothing"},
        {"name": "Created", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip
    obj = {
        "metadata": {"name": "x", "creationTimestamp": "2026-12-02T10:00:00Z"},
        "spec": {"enabled": True},
        "status": {
            "devices": ["a", "b"],
            "count": 3.0,
            "ratio": 2.0,
            "conditions": [
                {"type": "Other", "status": "False"},
                {"type": "Ready", "status": "True"},
            ],
        },
    }
    doc = tables.table(
        declared, [obj], list_metadata={"resourceVersion": "7"},
        now=datetime(2026, 12, 2, 13, 25, tzinfo=UTC),
    )  # fmt: skip
    assert [c["name"] for c in doc["columnDefinitions"]] == ["Name"] + [d["name"] for d in declared]
    (row,) = doc["rows"]
    assert row["cells"] == ["x", "true", '["a","b"]', 3, "2", "True", "a", None, "3h25m"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert doc["metadata"] == {"resourceVersion": "7"}


def test_a_crd_without_columns_shows_its_age() -> None:
    cols = tables.columns([])
    assert [(c["name"], c["type"]) for c in cols] == [("Name", "string"), ("Age", "date")]


def test_a_path_it_cannot_evaluate_is_refused() -> None:
    with pytest.raises(ValueError, match="not a JSON path"):
        tables.columns([{"name": "X", "type": "string", "jsonPath": ".items[*].name"}])


def test_kubectls_accept_header_gets_a_table_and_others_the_object() -> None:
    kubectl = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,"
        "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
    )
    assert tables.wants_table(kubectl)
    assert not tables.wants_table("application/json")
    assert not tables.wants_table(None)
    with ApiServerEmulator() as emu:
        emu.register_crd(
            {
                "spec": {
                    "group": "example.io", "scope": "Cluster",
                    "names": {"plural": "things", "kind": "Thing"},
                    "versions": [{"name": "v1", "served": True, "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]}],
                }
            }
        )  # fmt: skip
        emu.seed({"apiVersion": "example.io/v1", "kind": "Thing", "metadata": {"name": "t"},
                  "spec": {"size": 4}})  # fmt: skip

        def get(path: str, accept: str) -> Any:
            request = urllib.request.Request(emu.url + path, headers={"Accept": accept})  # noqa: S310
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                return json.loads(answer.read())

        listed = get("/apis/example.io/v1/things", kubectl)
        assert listed["kind"] == "Table"
        assert [r["cells"] for r in listed["rows"]] == [["t", 4]]
        one = get("/apis/example.io/v1/things/t", kubectl)
        assert [r["cells"] for r in one["rows"]] == [["t", 4]]
        assert get("/apis/example.io/v1/things/t", "application/json")["spec"] == {"size": 4}
