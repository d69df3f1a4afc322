"""Texts read from the cluster, parsed within bounds: the one JSON reader for them.

Annotations, status strings and other fields of API objects are written by whoever may write
those objects, so each is untrusted. ``json.loads`` alone is not enough: its decoder recurses
once per ``[`` or ``{``, and 200,000 of them (a 200 KB annotation the API server accepts) end
in a ``RecursionError`` no ``except ValueError`` catches, every time the object is read. Here a
text is refused, before it is decoded, when it is longer than a limit or nests deeper than one
(counted by a scan that skips strings and never recurses); then it is decoded with numbers
bounded. Every refusal is a :class:`ClusterTextError` whose message says what is wrong in a few
words: the caller names the object and field, and decides what the object then means (each
site's docstring says, always the safe way: a vGPU that may be in use is never destroyed).
"""

from __future__ import annotations

import json
import re
from typing import TypeAlias

#: A JSON value as decoded (objects are ``dict``, arrays ``list``).
JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"

#: The most characters of one text read: what the API server allows all of an object's
#: annotations together (256 KiB), the largest a legitimate one can be.
MAX_TEXT = 256 << 10
#: The deepest nesting read. vgpuctl's own texts (a VF's last-applied spec, Harvester's
#: device-allocation details) nest two or three levels.
MAX_DEPTH = 32
#: Integers in these texts are counts and indexes.
MAX_INT_DIGITS = 18

#: A JSON string (skipped whole) or a bracket; anything else is passed over by ``finditer``.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


class ClusterTextError(ValueError):
    """Why a text from the cluster was not read, in a few words (``is longer than 262144
    characters``): the caller puts the object and field in front."""


def nesting_exceeds(text: str, depth: int) -> bool:
    """Whether ``text`` opens more than ``depth`` brackets (``[``, ``{``) at once outside its
    strings. Linear in the text, no recursion, and nothing is scanned when the text holds no
    more than ``depth`` opening brackets in all (every annotation a controller writes)."""
    if text.count("[") + text.count("{") <= depth:
        return False
    level = 0
    for token in _TOKENS.finditer(text):
        match token.group():
            case "[" | "{":
                level += 1
                if level > depth:
                    return True
            case "]" | "}":
                level -= 1
    return False


def parse_json(text: object, *, limit: int = MAX_TEXT, depth: int = MAX_DEPTH) -> JsonValue:
    """``text`` decoded as JSON, or :class:`ClusterTextError` when it is not text, is longer
    than ``limit`` characters, nests deeper than ``depth``, has an integer of more than
    :data:`MAX_INT_DIGITS` digits or a non-finite number, or is not JSON."""
    if not isinstance(text, str):
        raise ClusterTextError("is not text")
    if len(text) > limit:
        raise ClusterTextError(f"is longer than {limit} characters")
    if nesting_exceeds(text, depth):
        raise ClusterTextError(f"nests deeper than {depth} levels")
    try:
        value: JsonValue = json.loads(
            text, parse_int=_integer, parse_float=_number, parse_constant=_constant
        )
    except ClusterTextError:
        raise
    except (ValueError, RecursionError):  # RecursionError: unreachable past the scan
        raise ClusterTextError("is not JSON") from None
    return value


def bounded_text(value: object, *, limit: int) -> str:
    """``value`` when it is a string of at most ``limit`` characters, else
    :class:`ClusterTextError` (for fields read as plain text: names, times, holders)."""
    if not isinstance(value, str):
        raise ClusterTextError("is not text")
    if len(value) > limit:
        raise ClusterTextError(f"is longer than {limit} characters")
    return value


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ClusterTextError(f"has an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _number(text: str) -> float:
    value = float(text) if len(text) <= 40 else float("inf")
    if value in (float("inf"), float("-inf")):
        raise ClusterTextError("has a number out of range")
    return value


def _constant(text: str) -> float:
    raise ClusterTextError(f"has {text}, which is not a JSON number")
