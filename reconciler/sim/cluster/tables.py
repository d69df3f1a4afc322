"""Server-side printing of custom resources, as the API server does it for ``kubectl get``.

A client that asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` (kubectl does)
gets a ``meta.k8s.io/v1`` ``Table`` instead of the object or list. For a custom resource the
columns come from its CRD version's ``additionalPrinterColumns``, after a ``Name`` column; a
version that declares none gets ``Age`` (``.metadata.creationTimestamp``, a date). Modelled on
the real code:

- k8s.io/apiextensions-apiserver pkg/registry/customresource/tableconvertor/tableconvertor.go
  (``New``, ``ConvertToTable``, ``cellForJSONValue``) and pkg/apiserver/customresource_handler.go
  (the default ``Age`` column);
- k8s.io/client-go util/jsonpath ``PrintResults`` (a ``string`` column's cell: a string as it is,
  a list or a map as compact JSON, anything else as Go's ``fmt.Fprint`` prints it);
- k8s.io/apimachinery pkg/util/duration ``HumanDuration`` (a ``date`` cell: ``5m10s``, ``3h``,
  ``2d4h``) and pkg/api/meta/table ``MetaToTableRow`` (each row's object is the item's
  ``PartialObjectMetadata``).

Evaluated: keys, indexes and the equality filter every "Ready" column uses
(``.status.conditions[?(@.type=="Ready")].status``); a path using anything else is refused
when the CRD is installed, as the emulator refuses schema keywords it does not model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

#: The Accept header's Table request (kubectl sends v1 first, then v1beta1, then plain JSON).
_TABLE = re.compile(r"as=Table\s*;\s*v=v1\s*;\s*g=meta\.k8s\.io|as=Table;g=meta\.k8s\.io;v=v1")
_STEP = re.compile(
    r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]"
)
AGE = {
    "name": "Age",
    "type": "date",
    "jsonPath": ".metadata.creationTimestamp",
    "description": "CreationTimestamp is a timestamp representing the server time when this "
    "object was created.",
}


def wants_table(accept: str | None) -> bool:
    """Whether the client asked for a ``meta.k8s.io/v1`` Table before anything else it takes."""
    if not accept:
        return False
    first = accept.split(",")[0]
    return bool(_TABLE.search(first.replace(" ", "")))


#: A step: a key, an index, or a filter ``[?(@.key=="value")]`` (the first item it selects,
#: as the table convertor takes ``results[0][0]``).
Step = str | int | tuple[str, str]


def parse_path(path: str) -> tuple[Step, ...]:
    """A simple JSON path's steps; raises ValueError for anything else."""
    steps: list[Step] = []
    at = 0
    while at < len(path):
        match = _STEP.match(path, at)
        if match is None:
            raise ValueError(f"not a JSON path this emulator evaluates: {path!r}")
        key, index, field, value = match.groups()
        if key is not None:
            steps.append(key)
        elif index is not None:
            steps.append(int(index))
        else:
            steps.append((field, value))
        at = match.end()
    if not steps:
        raise ValueError(f"not a simple JSON path: {path!r}")
    return tuple(steps)


def columns(declared: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Table's columns: ``Name``, then the declared ones (``Age`` when none are)."""
    out = [{"name": "Name", "type": "string", "format": "name", "priority": 0}]
    for col in declared or (AGE,):
        parse_path(col["jsonPath"])
        out.append(
            {
                "name": col["name"],
                "type": col["type"],
                "format": col.get("format", ""),
                "description": col.get("description")
                or f"Custom resource definition column (in JSONPath format): {col['jsonPath']}",
                "priority": col.get("priority", 0),
                "jsonPath": col["jsonPath"],
            }
        )
    return out


def table(
    declared: Sequence[Mapping[str, Any]],
    objects: Sequence[Mapping[str, Any]],
    *,
    list_metadata: Mapping[str, Any],
    now: datetime | None = None,
) -> dict[str, Any]:
    """The ``Table`` of ``objects`` (one for a GET of an object, the page for a list)."""
    cols = columns(declared)
    at = now or datetime.now(UTC)
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        cells: list[Any] = [meta.get("name", "")]
        for col in cols[1:]:
            found, value = _find(obj, parse_path(col["jsonPath"]))
            cells.append(_cell(col["type"], value, at) if found else None)
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        # A Table's ListMeta is typed (omitempty): a custom resource list's empty continue
        # token is not written here.
        "metadata": {
            k: v for k, v in list_metadata.items() if k in ("resourceVersion", "continue") and v
        },
        "columnDefinitions": [{k: v for k, v in c.items() if k != "jsonPath"} for c in cols],
        "rows": rows,
    }


def _find(obj: Any, steps: tuple[Step, ...]) -> tuple[bool, Any]:
    for step in steps:
        if isinstance(step, tuple):
            field, value = step
            items = obj if isinstance(obj, list) else []
            chosen = [i for i in items if isinstance(i, Mapping) and i.get(field) == value]
            if not chosen:
                return False, None
            obj = chosen[0]
            continue
        if isinstance(step, int):
            if not isinstance(obj, list) or step >= len(obj):
                return False, None
        elif not isinstance(obj, Mapping) or step not in obj:
            return False, None
        obj = obj[step]
    return True, obj


def _cell(kind: str, value: Any, now: datetime) -> Any:
    if kind == "string":
        return _print(value)
    if value is None:
        return None
    if kind == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "date" and isinstance(value, str):
        try:
            stamp = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return "<invalid>"
        return human_duration((now - stamp).total_seconds())
    return None


def _print(value: Any) -> str:
    """client-go's ``PrintResults`` of one value."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # Go prints float64(3) as 3
    return str(value)


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"
