"""Structural-schema pruning and validation of custom resources, as a real API server does them.

Modelled on kubernetes ``staging/src/k8s.io/apiextensions-apiserver``: ``pkg/apiserver/schema/
pruning`` (a field the schema does not declare is dropped, at any depth, unless
``x-kubernetes-preserve-unknown-fields`` keeps it; ``apiVersion``, ``kind`` and ``metadata`` at
the root are the server's own) and the OpenAPI validation of ``pkg/apiserver/validation`` (types,
``required``, ``enum``, ``pattern``, bounds), whose errors name the field path:
``spec.vfIndex: Invalid value: "string": spec.vfIndex in body must be of type integer: "string"``.

The subset of OpenAPI v3 that CRD schemas use here: ``type``, ``properties``,
``additionalProperties`` (a schema), ``items``, ``required``, ``enum``, ``pattern``,
``minimum``/``maximum``, ``minLength``/``maxLength``, ``maxItems``, ``nullable``,
``x-kubernetes-int-or-string`` and ``x-kubernetes-preserve-unknown-fields``. A keyword outside
it is refused when the CRD is installed, so a test never relies on one silently ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

#: The schema keywords this model knows; descriptions and the like carry no rule.
KNOWN = frozenset(
    {
        "type", "properties", "additionalProperties", "items", "required", "enum", "pattern",
        "minimum", "maximum", "minLength", "maxLength", "maxItems", "nullable",
        "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
        "description", "format", "title", "example",
    }
)  # fmt: skip
_ROOT_KEPT = ("apiVersion", "kind", "metadata")


class UnsupportedSchema(ValueError):
    """A CRD schema uses a keyword this model does not implement."""


def check_schema(schema: Mapping[str, Any], path: str = "openAPIV3Schema") -> None:
    """Refuse a schema with a keyword outside :data:`KNOWN` (raises :class:`UnsupportedSchema`)."""
    unknown = sorted(set(schema) - KNOWN)
    if unknown:
        raise UnsupportedSchema(f"{path}: {', '.join(unknown)} not modelled by the emulator")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{path}.properties.{name}")
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            check_schema(sub, f"{path}.{key}")


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Drop, in place, every field of the object ``schema`` does not declare (the root's
    ``apiVersion``, ``kind`` and ``metadata`` stay)."""
    for key in list(obj):
        if key in _ROOT_KEPT:
            continue
        sub = (schema.get("properties") or {}).get(key)
        if sub is not None:
            obj[key] = _pruned(obj[key], sub)
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            del obj[key]


def _pruned(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        if properties is None and not isinstance(additional, Mapping):
            return value if preserve or schema.get("type") != "object" else {}
        kept: dict[str, Any] = {}
        for key, item in value.items():
            if properties is not None and key in properties:
                kept[key] = _pruned(item, properties[key])
            elif isinstance(additional, Mapping):
                kept[key] = _pruned(item, additional)
            elif preserve:
                kept[key] = item
        return kept
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_pruned(item, schema["items"]) for item in value]
    return value


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every violation of ``schema`` by ``obj`` (pruned first), as the API server words it."""
    errors: list[str] = []
    root = {k: v for k, v in obj.items() if k not in _ROOT_KEPT}
    _check(root, {**schema, "required": [r for r in schema.get("required", ())
                                         if r not in _ROOT_KEPT]}, "", errors)  # fmt: skip
    return errors


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if value is None:
        if not schema.get("nullable", False) and path:
            errors.append(
                _invalid(path, "null", f'{path} in body must be of type {_type(schema)}: "null"')
            )
        return
    if not _has_type(value, schema):
        shown = _kind_word(value)
        errors.append(
            _invalid(path, shown, f'{path} in body must be of type {_type(schema)}: "{shown}"')
        )
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(
            f"{path}: Unsupported value: {json.dumps(value)}: supported values: {supported}"
        )
    if isinstance(value, str):
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            errors.append(
                _invalid(path, value, f"{path} in body should match '{schema['pattern']}'")
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: Too long: may not be more than {schema['maxLength']} bytes")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be at least {schema['minLength']} chars long",
                )
            )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be greater than or equal to {schema['minimum']}",
                )
            )
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be less than or equal to {schema['maximum']}",
                )
            )
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required", ()):
            if name not in value:
                errors.append(f"{_join(path, name)}: Required value")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, additional if isinstance(additional, Mapping) else None)
            if sub is not None:
                _check(item, sub, _join(path, key), errors)
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: Too many: {len(value)}: must have at most "
                          f"{schema['maxItems']} items")  # fmt: skip
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                _check(item, items, f"{path}[{i}]", errors)


def _type(schema: Mapping[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    return str(schema.get("type", "any"))


def _has_type(value: Any, schema: Mapping[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    kind = schema.get("type")
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = {"string": str, "boolean": bool, "object": dict, "array": list}.get(kind)
    return expected is not None and isinstance(value, expected)


def _invalid(path: str, shown: Any, detail: str) -> str:
    return f"{path}: Invalid value: {json.dumps(shown)}: {detail}"


def _kind_word(value: Any) -> str:
    """How the API server shows a wrong value's kind in a type error (``"string"``)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


#: k8s.io/apimachinery pkg/util/validation/field/errors.go: how a field error's body starts
#: (its ErrorType's String) and the StatusCause reason that type becomes (its ``CauseType``).
_CAUSE_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Invalid value", "FieldValueInvalid"),
)


def status_cause(error: str) -> dict[str, str]:
    """One error of :func:`validate` (``<field>: <body>``) as a cause of the API server's 422
    Status: apimachinery pkg/api/errors/errors.go ``NewInvalid`` lists each field error as
    ``{"reason": <its type>, "message": <its ErrorBody>, "field": <its path>}``. A wrong type
    is ``FieldValueTypeInvalid`` (as kube-apiserver v1.37.2 answered a string for a boolean)."""
    field, _, body = error.partition(": ")
    reason = next((r for start, r in _CAUSE_REASONS if body.startswith(start)), "FieldValueInvalid")
    if reason == "FieldValueInvalid" and " in body must be of type " in body:
        reason = "FieldValueTypeInvalid"
    return {"reason": reason, "message": body, "field": field}
