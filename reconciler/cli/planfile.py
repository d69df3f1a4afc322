"""Saved plans (``plan --out``) read back for ``apply PLANFILE``: untrusted input, checked whole.

A saved plan is a plan (``schemas/plan.schema.json``) plus ``desiredState``, the desired state it
was made from. Whoever can write the file can put anything in it, so nothing in it is run as
written: ``apply`` plans again from its desired state under the node lock and runs the fresh
plan, and only when that does what the file says (``commands.py``). This module turns the file
into a :class:`SavedPlan`, or refuses it with one line naming the file and what is wrong:
bounded in size before it is parsed, numbers bounded while parsing, nesting bounded, then the
schema, never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.cli.files import nesting_depth
from reconciler.desired.source import read_file
from reconciler.model import Plan, ValidationError
from reconciler.model.errors import excerpt
from reconciler.model.plan import FORMAT_VERSION
from reconciler.model.plan_json import PlanFormatError, plan_from_json
from reconciler.model.plan_json import value_in_words as _kind
from reconciler.model.record import record

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as SchemaViolation
    from jsonschema.protocols import Validator

#: A plan for eight 32-VF GPUs with every cluster object is well under 2 MiB.
MAX_BYTES = 16 * 1024 * 1024
#: A plan nests about ten levels (actions → object → status → …).
MAX_DEPTH = 64
#: Integers in a plan are sequence numbers, VF indexes and counts.
MAX_INT_DIGITS = 18

_MARK = '"formatVersion"'
_SCHEMA = "plan.schema.json"


@record(frozen=True, slots=True)
class SavedPlan:
    path: Path
    plan: Plan
    #: The desired-state document the plan was made from (checked by the desired-state loader).
    desired: Mapping[str, Any]


class _Refused(Exception):
    """Why the file is not a valid saved plan (raised from the JSON parser's hooks)."""


def read_saved_plan(path: Path) -> SavedPlan | None:
    """The saved plan in ``path``; None when the file is a desired-state file instead (YAML, or
    a JSON document with an ``apiVersion``): the desired-state loader reads and reports those.

    Any other JSON object, and any JSON that mentions ``"formatVersion"``, is taken for a saved
    plan: :class:`ValidationError` (one line) unless it is a valid one.
    """
    try:
        blob = read_file(path, limit=MAX_BYTES + 1)  # a FIFO is refused, not waited on
        text = blob.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # the desired-state loader reports unreadable files with their location
    start = text.lstrip()[:1]
    marked = _MARK in text
    if start not in ("{", "[") or (start == "[" and not marked):
        return None

    def refuse(why: str) -> ValidationError:
        return ValidationError(f"{path}: not a valid saved plan: {why}")

    if len(blob) > MAX_BYTES:
        if not marked:
            return None
        raise refuse(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        doc = json.loads(
            text,
            parse_int=_integer,
            parse_float=_number,
            parse_constant=_constant,
        )
    except json.JSONDecodeError as exc:
        if not marked:
            return None  # YAML in flow style: the desired-state loader reads it
        raise ValidationError(
            f"{path}:{exc.lineno}:{exc.colno}: not a valid saved plan: not JSON: {exc.msg}"
        ) from None
    except (RecursionError, _Refused) as exc:
        if not marked:
            return None
        raise refuse(
            f"nested more than {MAX_DEPTH} levels deep"
            if isinstance(exc, RecursionError)
            else str(exc)
        ) from None
    if isinstance(doc, dict) and "apiVersion" in doc and "formatVersion" not in doc:
        return None  # a desired-state document written as JSON
    if not isinstance(doc, dict):
        raise refuse(f"the top level is {_kind(doc)}, not an object")
    if "formatVersion" not in doc:
        raise ValidationError(
            f"{path}: not a saved plan (expected the JSON written by 'vgpuctl plan --out', "
            "with a formatVersion)"
        )
    if nesting_depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise refuse(f"nested more than {MAX_DEPTH} levels deep")
    version = doc.get("formatVersion")
    if type(version) is int and 0 < version < FORMAT_VERSION:
        raise ValidationError(
            f"{path}: written by an older vgpuctl (plan format {version}); "
            "run 'vgpuctl plan --out' again"
        )
    if type(version) is not int or version != FORMAT_VERSION:
        raise refuse(
            f"formatVersion is {_kind(version)}; this vgpuctl reads formatVersion "
            f"{FORMAT_VERSION} only (plan again with this version)"
        )
    desired = doc.get("desiredState")
    plan_doc = {k: v for k, v in doc.items() if k != "desiredState"}
    violation = _first_violation(plan_doc)
    if violation is not None:
        raise refuse(violation)
    if not isinstance(desired, dict):
        raise refuse(
            "desiredState is "
            + ("absent" if desired is None else _kind(desired))
            + ", not the desired state the plan was made from (written by 'vgpuctl plan --out')"
        )
    try:
        plan = plan_from_json(plan_doc)
    except PlanFormatError as exc:  # what the schema cannot say (an object named otherwise)
        raise refuse(exc.message) from None
    return SavedPlan(path=path, plan=plan, desired=desired)


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"the number {excerpt(text, 24)} is too large")
    return int(text)


def _number(text: str) -> float:
    value = float(text) if len(text) <= 40 else math.inf
    if not math.isfinite(value):
        raise _Refused(f"the number {excerpt(text, 24)} is too large")
    return value


def _constant(text: str) -> float:
    raise _Refused(f"{text} is not a JSON number")


@cache
def _validator() -> Validator:
    from jsonschema import Draft202012Validator

    from reconciler.desired.schemas import schema_path

    schema = json.loads(schema_path(_SCHEMA).read_text(encoding="utf-8"))
    return Draft202012Validator(schema)


def _first_violation(doc: Mapping[str, Any]) -> str | None:
    """The schema violation to report (the one jsonschema finds most relevant), in words."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(doc))
    return None if error is None else _explain(error)


def _explain(error: SchemaViolation) -> str:
    from reconciler.desired.source import dotted

    where = dotted(tuple(error.absolute_path)) if error.absolute_path else "the top level"
    schema = error.schema if isinstance(error.schema, dict) else {}
    value = error.instance
    match error.validator:
        case "type":
            expected = error.validator_value
            names = expected if isinstance(expected, list) else [expected]
            return f"{where}: expected {' or '.join(map(str, names))}, got {_kind(value)}"
        case "required":
            present = value if isinstance(value, dict) else {}
            missing = [f for f in schema.get("required", []) if f not in present]
            return f"{where}: missing required field {excerpt(', '.join(missing))}"
        case "additionalProperties":
            allowed = schema.get("properties", {})
            unknown = [k for k in value if k not in allowed] if isinstance(value, dict) else []
            return f"{where}: unknown field {excerpt(', '.join(map(str, unknown)))}"
        case "enum" | "const":
            return f"{where}: {_kind(value)} is not allowed here"
        case "pattern" | "minLength" | "maxLength" | "minimum" | "maximum" | "uniqueItems":
            return f"{where}: {_kind(value)} is not valid here ({error.validator} rule)"
    return f"{where}: {excerpt(error.message)}"
