"""Field-level differences between two versions of a cluster object, as plans show them.

``~ spec.vGPUTypeName: "NVIDIA A2-4A" → "NVIDIA A2-4Q"``. Each section (labels, annotations,
spec, status) is compared key by key; a key whose two values are both mappings is handed to
deepdiff (imported lazily: node-local plans never load it), anything else — a scalar, a list
such as ``status.vfAddresses`` — is reported whole, which reads better than item by item.
deepdiff's answers are cached by content: when one vGPU narrows what the other 255 VFs of a
node can create, their ``availableTypes`` all change the same way and are diffed once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from reconciler.model.plan import FieldChange

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ABSENT = object()
#: Concrete types, not the Mapping ABC: an ABC check per field is what a 256-VF plan would feel.
_MAPPINGS = (dict, MappingProxyType)


def format_path(parts: Sequence[str | int]) -> str:
    """``["spec", "vGPUTypeName"]`` → ``spec.vGPUTypeName``; keys that are not identifiers in
    brackets (``status.availableTypes["NVIDIA A2-4Q"]``), list indexes as ``[3]``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def section_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], *, prefix: Sequence[str]
) -> list[FieldChange]:
    """What differs between two versions of one section (``spec``, ``status``, …): keys in
    ``new``'s order, then keys only ``old`` has."""
    if old == new:
        return []
    changes: list[FieldChange] = []
    keys = list(new) + [k for k in old if k not in new]
    for key in keys:
        before = old.get(key, _ABSENT)
        after = new.get(key, _ABSENT)
        if before == after:
            continue
        path = [*prefix, key]
        if isinstance(before, _MAPPINGS) and isinstance(after, _MAPPINGS):
            for parts, b, a in _nested(before, after):
                changes.append(FieldChange(format_path([*path, *parts]), b, a))
        else:
            changes.append(
                FieldChange(
                    format_path(path),
                    None if before is _ABSENT else _plain(before),
                    None if after is _ABSENT else _plain(after),
                )
            )
    return changes


_Found = tuple[tuple[tuple[str | int, ...], Any, Any], ...]
_SEEN: dict[tuple[object, object], _Found] = {}
_SEEN_MAX = 4096


def _nested(before: Mapping[str, Any], after: Mapping[str, Any]) -> _Found:
    """deepdiff of two mappings: (path parts, old, new) per difference, in path order; cached
    by content."""
    key = (_frozen(before), _frozen(after))
    found = _SEEN.get(key)
    if found is None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()  # a watch loop runs for months: bound what it remembers
        found = _SEEN[key] = _deepdiff(_plain(before), _plain(after))
    return found


def _frozen(value: Any) -> object:
    """A hashable stand-in for a JSON value: equal values, equal keys (dicts by sorted items,
    tagged so that a dict never equals a list)."""
    if isinstance(value, _MAPPINGS):
        return ("{", tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("[", tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)  # True == 1, but not as a field value


def _deepdiff(before: Any, after: Any) -> _Found:
    from deepdiff import DeepDiff  # heavy: only plans that update a cluster object load it

    tree = DeepDiff(before, after, view="tree")
    found: list[tuple[tuple[str | int, ...], Any, Any]] = []
    for levels in tree.values():
        for level in levels:
            parts = tuple(level.path(output_format="list"))
            found.append((parts, _present(level.t1), _present(level.t2)))
    found.sort(key=lambda f: [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in f[0]])
    return tuple(found)


def _present(value: Any) -> Any:
    from deepdiff.helper import NotPresent

    return None if isinstance(value, NotPresent) else value


def _plain(value: Any) -> Any:
    if isinstance(value, _MAPPINGS):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
