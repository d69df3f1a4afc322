"""Hand-written expectations for the golden cases (``tests/cases/<name>/expect.yaml``).

A golden ``expected-plan.json`` is written by the planner (``UPDATE_GOLDEN=1``), so on its own it
only says the planner still does what it did. Each case therefore also carries a short
``expect.yaml``, written by a person from the case's story (its desired state, its host
and docs/domain.md), that says what the plan *means*; the golden test checks the planner's output
against both. A regenerated golden file that changes the meaning fails here.

The format is deliberately blind to the shape of an action's parameters (it changes with the
plan format) and to the wording of reasons (matched by key phrases)::

    # one line of story
    actions:                    # every action, in plan order
      - [sriov-enable, "0000:08:00.0"]
      - [vgpu-create, "0000:08:00.4", NVIDIA A2-4A]      # [kind, target, carried...]
      - [kubevirt-update, kubevirt/harvester-system/kubevirt, {remove: [NVIDIA A2-4A]}]
    blocked:                    # every blocked item, in order
      - [vgpu-remove, "0000:08:00.5", in use by simulated VM]   # [kind, target, reason phrase]
    notes: [--adopt]            # optional: each phrase appears in some note

A *carried* value is a string the action holds somewhere in its parameters (at any depth; its
kind, target and reason excepted), or a one-key mapping ``{key: value or [values]}``: some
field named ``key``, at any depth, holds that value (or every listed value) somewhere in it.

A case whose answer is an error has instead::

    errors:                     # every problem line, in order
      - ["desired.yaml:13", NVIDIA A2-2Q, NVIDIA A2-4A]   # [where, phrases...]

``where`` is the start of the line (file and line; the column is left to the loader).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: The fields of an action (or blocked item) that are not its parameters.
_OWN_FIELDS = frozenset({"seq", "kind", "target", "reason"})


def load_expectation(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a mapping")
    known = {"actions", "blocked", "notes", "errors"}
    if not set(raw) <= known:
        raise ValueError(f"{path}: unknown keys {sorted(set(raw) - known)}")
    if ("errors" in raw) == ("actions" in raw or "blocked" in raw):
        raise ValueError(f"{path}: either 'errors', or 'actions' and 'blocked'")
    if "errors" not in raw and not ("actions" in raw and "blocked" in raw):
        raise ValueError(f"{path}: 'actions' and 'blocked' are both required (say [] for none)")
    for section in ("actions", "blocked", "errors"):
        for entry in raw.get(section) or []:
            # YAML 1.1 reads an unquoted 0000:08:00.5 as a number: every item must be text
            # (or, for a carried value, a mapping).
            if not isinstance(entry, list) or len(entry) < 2:
                raise ValueError(f"{path}: {section}: {entry!r} is not [kind, target, ...]")
            if not all(isinstance(item, str | dict) for item in entry):
                raise ValueError(f"{path}: {section}: {entry!r}: quote every value")
    if not all(isinstance(n, str) for n in raw.get("notes") or []):
        raise ValueError(f"{path}: notes: quote every phrase")
    return raw


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str):
        yield value


def _fields(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key), item
            yield from _fields(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _fields(item)


def _params(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in _OWN_FIELDS}


def _carries(entry: Mapping[str, Any], carried: Any) -> bool:
    params = _params(entry)
    if isinstance(carried, str):
        return carried in set(_leaves(params))
    if isinstance(carried, Mapping) and len(carried) == 1:
        ((key, want),) = carried.items()
        wanted = list(want) if isinstance(want, list) else [want]
        for name, value in _fields(params):
            if name != key:
                continue
            held = set(_leaves(value))
            if all(w in held for w in wanted):
                return True
        return False
    raise ValueError(f"a carried value is a string or a one-key mapping, not {carried!r}")


def _show(entry: Mapping[str, Any]) -> str:
    return f"{entry.get('kind')} {entry.get('target')}"


def check_plan(expect: Mapping[str, Any], plan: Mapping[str, Any]) -> list[str]:
    """The ways ``plan`` (a plan's JSON) differs from ``expect``; empty when it meets it."""
    problems: list[str] = []
    for section in ("actions", "blocked"):
        want: Sequence[Sequence[Any]] = expect.get(section) or []
        got: Sequence[Mapping[str, Any]] = plan.get(section) or []
        got_pairs = [(g.get("kind"), g.get("target")) for g in got]
        want_pairs = [(w[0], w[1]) for w in want]
        if got_pairs != want_pairs:
            problems.append(
                f"{section}: expected {[' '.join(map(str, p)) for p in want_pairs]}, "
                f"got {[' '.join(map(str, p)) for p in got_pairs]}"
            )
            continue
        for w, g in zip(want, got, strict=True):
            rest = list(w[2:])
            if section == "blocked":
                if not rest:
                    problems.append(f"blocked {_show(g)}: the expectation names no reason phrase")
                    continue
                phrase, rest = rest[0], rest[1:]
                if phrase not in str(g.get("reason", "")):
                    problems.append(
                        f"blocked {_show(g)}: reason {g.get('reason')!r} lacks {phrase!r}"
                    )
            for carried in rest:
                if not _carries(g, carried):
                    problems.append(f"{section[:-1]} {_show(g)} does not carry {carried!r}")
    notes = [str(n) for n in plan.get("notes") or []]
    for phrase in expect.get("notes") or []:
        if not any(phrase in n for n in notes):
            problems.append(f"no note contains {phrase!r}: {notes}")
    return problems


def check_errors(expect: Mapping[str, Any], lines: Sequence[str]) -> list[str]:
    """The ways the problem ``lines`` differ from ``expect['errors']``."""
    want: Sequence[Sequence[str]] = expect.get("errors") or []
    if len(want) != len(lines):
        return [f"expected {len(want)} problem lines, got {len(lines)}: {list(lines)}"]
    problems = []
    for w, line in zip(want, lines, strict=True):
        where, phrases = w[0], w[1:]
        if not line.startswith(f"{where}:"):
            problems.append(f"{line!r} is not at {where}")
        problems.extend(f"{line!r} lacks {p!r}" for p in phrases if p not in line)
    return problems
