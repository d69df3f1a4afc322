"""The jsonschema validator ``shape`` checks documents with: the same verdicts, in file order,
at a bounded cost per value.

jsonschema's Draft 2020-12 validator is the judge. Three changes to how it walks, none to what it
decides:

- the schema's local ``$ref``s are inlined once (jsonschema resolves each again for every value
  it checks: a third of its time on a fleet-sized file);
- a mapping's entries are checked in the order written (jsonschema's ``additionalProperties``
  walks a set of the keys), so the first problems found in a broken file are its first ones;
- a value whose subschema is a plain leaf (a type, a length, a pattern, an enum, a minimum) and
  that plainly satisfies it is not handed to jsonschema at all: jsonschema builds a validator
  per value it descends into (20 µs each), which made the bulk of a large file's time. Anything
  else, every failure included, goes to jsonschema, which words the violation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

#: Keywords that say nothing about validity.
_ANNOTATIONS = frozenset({"description", "title", "examples", "$comment", "default"})
#: Keywords a plain leaf may hold (with ``type`` "string" or "integer", or none).
_LEAF = frozenset({"type", "minLength", "maxLength", "pattern", "enum", "const", "minimum"})
#: Keywords :func:`certainly_valid` understands; a schema with any other is never "certain".
_STRUCTURE = frozenset(
    {
        "properties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
    }
)
#: Identifiers of the schema itself: they say nothing about validity either.
_IDS = _ANNOTATIONS | {"$schema", "$id"}
_KNOWN = _IDS | _LEAF | _STRUCTURE | {"items", "minItems", "maxItems"}
_MISSING = object()

_Check = Callable[[Any], bool]


def build_validator(schema: dict[str, Any]) -> Validator:
    """A Draft 2020-12 validator for ``schema`` walking as the module says."""
    from jsonschema import Draft202012Validator, validators

    checks = _LeafChecks()
    walking: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator,
        {
            "properties": _properties(checks),
            "additionalProperties": _additional_properties(Draft202012Validator, checks),
        },
    )
    return walking(inlined(schema, schema.get("$defs", {})))


def inlined(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every local ``{"$ref": "#/$defs/x", …}`` replaced by definition ``x``
    (its own keywords kept beside), and ``$defs`` left out. The schema has no cycles."""
    if isinstance(node, list):
        return [inlined(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return inlined({**defs[ref.removeprefix("#/$defs/")], **rest}, defs)
    return {k: inlined(v, defs) for k, v in node.items() if k != "$defs"}


class _LeafChecks:
    """Per subschema (by identity: the validator's schema lives as long as it does), a
    predicate true only for values that certainly satisfy it, or None when it is no leaf."""

    def __init__(self) -> None:
        self._checks: dict[int, tuple[object, _Check | None]] = {}

    def plainly_valid(self, value: Any, schema: Any) -> bool:
        known = self._checks.get(id(schema))
        if known is None or known[0] is not schema:
            known = self._checks[id(schema)] = (schema, _leaf_check(schema))
        check = known[1]
        return check is not None and check(value)


def _leaf_check(schema: Any) -> _Check | None:
    if not isinstance(schema, dict) or not set(schema) - _ANNOTATIONS <= _LEAF:
        return None
    kind = schema.get("type")
    if kind not in (None, "string", "integer"):
        return None
    min_length = schema.get("minLength", 0)
    max_length = schema.get("maxLength")
    pattern = re.compile(schema["pattern"]) if "pattern" in schema else None
    enum = schema.get("enum")
    const = schema.get("const", _MISSING)
    minimum = schema.get("minimum")

    def check(value: Any) -> bool:
        if const is not _MISSING and not (type(value) is type(const) and value == const):
            return False
        if type(value) is str:
            return (
                kind != "integer"
                and len(value) >= min_length
                and (max_length is None or len(value) <= max_length)
                and (pattern is None or pattern.search(value) is not None)
                and (enum is None or any(type(e) is str and e == value for e in enum))
            )
        if type(value) is int:  # not bool: jsonschema tells them apart
            return (
                kind != "string"
                and enum is None
                and (minimum is None or (type(minimum) is int and value >= minimum))
            )
        return False

    return check


_CERTAIN = _LeafChecks()


def certainly_valid(schema: Any, value: Any) -> bool:
    """Whether ``value`` plainly satisfies ``schema`` (inlined: no ``$ref``), decided without
    jsonschema: true only when it certainly does. Anything this does not understand (another
    keyword, a float where an integer is expected) is "not certain", and jsonschema judges.

    A valid desired state, the common case, then never imports jsonschema (with referencing and
    rpds, about a quarter of a cold ``vgpuctl plan``); one with a problem is walked by the
    validator as before, which words it."""
    if not isinstance(schema, dict) or not set(schema) <= _KNOWN:
        return False
    if "items" in schema or "maxItems" in schema or schema.get("type") == "array":
        if type(value) is not list or not set(schema) - _IDS <= {
            "type",
            "items",
            "minItems",
            "maxItems",
        }:
            return False
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        items = schema.get("items", True)
        return items is True or all(certainly_valid(items, item) for item in value)
    if schema.get("type") == "object" or not _STRUCTURE.isdisjoint(schema):
        if type(value) is not dict or not set(schema) - _IDS <= _STRUCTURE | {"type"}:
            return False
        if (
            not schema.get("minProperties", 0)
            <= len(value)
            <= schema.get("maxProperties", len(value))
        ):
            return False
        if any(name not in value for name in schema.get("required", ())):
            return False
        known = schema.get("properties", {})
        names = schema.get("propertyNames")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if type(name) is not str:
                return False
            if names is not None and not certainly_valid(names, name):
                return False
            sub = known.get(name, extra)
            if sub is False or (sub is not True and not certainly_valid(sub, item)):
                return False
        return True
    return _CERTAIN.plainly_valid(value, schema)


def _properties(checks: _LeafChecks) -> Any:
    def properties(
        validator: Any, properties: dict[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for name, subschema in properties.items():
            if name in instance:
                value = instance[name]
                if checks.plainly_valid(value, subschema):
                    continue
                yield from validator.descend(value, subschema, path=name, schema_path=name)

    return properties


def _additional_properties(base: Any, checks: _LeafChecks) -> Any:
    original = base.VALIDATORS["additionalProperties"]

    def additional_properties(
        validator: Any, extra: Any, instance: Any, schema: dict[str, Any]
    ) -> Iterator[Any]:
        if (
            "patternProperties" in schema
            or not validator.is_type(extra, "object")
            or not validator.is_type(instance, "object")
        ):
            yield from original(validator, extra, instance, schema)
            return
        known = schema.get("properties", {})
        for name, value in instance.items():
            if name in known or checks.plainly_valid(value, extra):
                continue
            yield from validator.descend(value, extra, path=name)

    return additional_properties
