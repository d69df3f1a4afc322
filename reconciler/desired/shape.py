"""Check a parsed document against ``schemas/desired-state.schema.json``, in human words.

Second stage of ``desired``. jsonschema finds the violations; this module turns each into one
located line a person can act on (``unknown field 'vgpu' at …; did you mean 'vgpus'?``) instead of
a dump of the failing schema. The schema stays the single statement of the format: editors use
the same file for completion, and its ``title``/``examples`` annotations feed the messages here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from reconciler.desired.schemas import schema_path
from reconciler.desired.source import Document, JsonPath, dotted, problem_at, quoted
from reconciler.desired.validator import build_validator, certainly_valid, inlined
from reconciler.model import Problem, SourceLocation
from reconciler.model.errors import excerpt
from reconciler.model.record import record

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as SchemaViolation
    from jsonschema.protocols import Validator

SCHEMA = "desired-state.schema.json"
_KIND = "VGPUDesiredState"
#: Problems looked at per file. jsonschema takes a tenth of a millisecond per violation; a file
#: with more is broken throughout, and its first problems say so.
MAX_SHAPE_PROBLEMS = 500
#: Unknown fields of one mapping that get a "did you mean" (each costs a difflib search).
_SUGGESTIONS = 20

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "nothing",
}


@cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_path(SCHEMA).read_text(encoding="utf-8"))
    return schema


@cache
def _validator() -> Validator:
    # jsonschema (with referencing and rpds) costs 40-70 ms to import: only a document that
    # is not certainly valid pays it, once per process.
    return build_validator(_schema())


@cache
def _inlined_schema() -> Any:
    schema = _schema()
    return inlined(schema, schema.get("$defs", {}))


@record(frozen=True, slots=True)
class Shape:
    """The schema problems of one document, in file order, each with the path it concerns."""

    problems: list[tuple[JsonPath, Problem]]
    #: False when checking stopped at :data:`MAX_SHAPE_PROBLEMS`: there are more, and parts
    #: of the document were not checked at all.
    complete: bool = True


def shape_problems(document: Document) -> Shape:
    """The schema violations of ``document`` (the first :data:`MAX_SHAPE_PROBLEMS`)."""
    if certainly_valid(_inlined_schema(), document.data):
        return Shape([], True)  # no jsonschema needed (nor imported): nothing to word
    found: dict[tuple[JsonPath, str], tuple[SourceLocation, str]] = {}
    complete = True
    for error in _validator().iter_errors(document.data):
        for path, location, message in _explain(error, document):
            found.setdefault((path, message), (location, message))
            if len(found) >= MAX_SHAPE_PROBLEMS:
                complete = False
                break
        if not complete:
            break
    ordered = sorted(found.items(), key=lambda item: (item[1][0].line, item[1][0].column))
    problems = [(path, problem_at(loc, message)) for (path, _), (loc, message) in ordered]
    return Shape(problems, complete)


def _explain(
    error: SchemaViolation, document: Document
) -> Iterable[tuple[JsonPath, SourceLocation, str]]:
    path: JsonPath = tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    where = dotted(path)
    if "propertyNames" in error.absolute_schema_path:
        # The key itself is wrong (a bad VF key or node name): point at the key.
        key = str(error.instance)
        key_path = (*path, key)
        yield key_path, document.location(key_path, key=True), _bad_key(key, where, schema)
        return
    validator = error.validator
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(schema.get("properties", {}))
        unknown = (key for key in error.instance if key not in allowed)
        for count, key in enumerate(unknown):
            key_path = (*path, key)
            at = f"at {where}" if path else "at the top level"
            message = f"unknown field {quoted(key)} {at}"
            suggestion = did_you_mean(key, allowed) if count < _SUGGESTIONS else None
            message += f"; did you mean '{suggestion}'?" if suggestion else _allowed(allowed)
            yield key_path, document.location(key_path, key=True), message
        return
    # A field's problems point at its key, where the entry starts (``sriov: on`` at ``sriov``);
    # list items have no key and point at the item.
    location = document.location(path, key=True)
    shown = document.shown(path, error.instance)
    if validator == "required" and isinstance(error.instance, dict):
        for field in schema.get("required", []):
            if field not in error.instance:
                yield path, location, f"{where}: missing required field '{field}'"
        return
    if validator == "type" and not path:
        yield path, location, f"expected a {_KIND} mapping, got {describe(error.instance)}"
        return
    if validator == "type":
        expected = _expected_type(error.validator_value)
        yield path, location, f"{where}: expected {expected}, got {describe(error.instance)}"
        return
    if validator == "enum":
        yield path, location, f"{where}: {quoted(shown)} is not one of {error.validator_value!r}"
        return
    if validator == "const":
        yield path, location, f"{where}: expected '{error.validator_value}', got {quoted(shown)}"
        return
    if validator in ("maxItems", "maxProperties") and isinstance(error.instance, list | dict):
        count, limit = len(error.instance), error.validator_value
        yield path, location, f"{where}: {count:,} entries, more than the {limit} allowed"
        return
    if validator in ("minItems", "minProperties") and isinstance(error.instance, list | dict):
        wanted = sorted(schema.get("properties", {}))
        if wanted:
            what = " or ".join(f"'{name}'" for name in wanted)
            yield path, location, f"{where}: must not be empty: give {what}"
        else:
            yield path, location, f"{where}: must not be empty"
        return
    if validator == "minimum":
        yield (
            path,
            location,
            f"{where}: must be at least {error.validator_value}, got {excerpt(str(shown))}",
        )
        return
    if validator == "minLength" and error.validator_value == 1:
        yield path, location, f"{where}: must not be empty"
        return
    if validator == "maxLength" and isinstance(error.instance, str):
        count, limit = len(error.instance), error.validator_value
        yield path, location, f"{where}: {count:,} characters, more than the {limit} allowed"
        return
    if validator in {"pattern", "minLength", "maxLength"} and "title" in schema:
        yield (
            path,
            location,
            f"{where}: {quoted(shown)} is not a valid {schema['title']}{_eg(schema)}",
        )
        return
    # jsonschema's own words quote the value whole: no more than an excerpt of them.
    yield path, location, f"{where}: {excerpt(error.message)}"


def _bad_key(key: str, where: str, schema: dict[str, Any]) -> str:
    limit = schema.get("maxLength")
    if isinstance(limit, int) and len(key) > limit:
        return f"{where}: a key of {len(key):,} characters, more than the {limit} allowed"
    return f"{where}: {quoted(key)} is not a valid {schema.get('title', 'key')}{_eg(schema)}"


def _eg(schema: dict[str, Any]) -> str:
    examples = schema.get("examples") or []
    return f", e.g. {' or '.join(str(e) for e in examples)}" if examples else ""


def _allowed(allowed: Sequence[str]) -> str:
    return f" (allowed: {', '.join(allowed)})" if allowed else ""


def _expected_type(value: object) -> str:
    names = value if isinstance(value, list) else [value]
    return " or ".join(_TYPE_WORDS.get(str(n), str(n)) for n in names)


def describe(value: object) -> str:
    """A value's kind in words, with the value when short: ``a list``, ``text 'abc'``."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"text {quoted(value)}" if len(value) <= 40 else "text"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} ({value})"


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was probably meant to be, if one is close (case-insensitive)."""
    import difflib

    by_folded = {c.casefold(): c for c in candidates}
    if word.casefold() in by_folded:
        return by_folded[word.casefold()]
    close = difflib.get_close_matches(word.casefold(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[close[0]] if close else None
