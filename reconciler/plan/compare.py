"""Do two plans do the same thing? ``apply PLANFILE`` asks it of a saved plan and a fresh one. Pure.

A saved plan is run only when a fresh plan of the desired state it carries, made under the node
lock from the host and cluster as they are, has the same actions in the same order. "The same"
is what an action does: its kind, its target and its fields. Not its reason (words for people),
not its seq (its place, compared through the order), and not the resourceVersion a cluster write
was planned from: a write always carries the version it was planned from, and the fresh plan's
is the one that runs. Every other field counts: a profile, a UUID, an object's body, a KubeVirt
entry. Fields are compared in their JSON form (:mod:`reconciler.model.plan_json`), by their
JSON names.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from reconciler.model import Action, ActionKind
from reconciler.model.plan_json import action_to_json
from reconciler.model.record import record

#: Not part of what an action does (``kind`` and ``target`` are compared on their own).
_NOT_EFFECT = frozenset({"seq", "kind", "phase", "target", "reason", "resourceVersion"})


def _fields(action: Action) -> dict[str, Any]:
    """The fields that say what ``action`` does, in JSON form (no version planned from)."""
    doc = action_to_json(action)
    fields = {k: v for k, v in doc.items() if k not in _NOT_EFFECT}
    body = fields.get("object")
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        metadata = {k: v for k, v in body["metadata"].items() if k != "resourceVersion"}
        fields["object"] = {**body, "metadata": metadata}
    return fields


def effect(action: Action) -> str:
    """What ``action`` does, as canonical JSON (two actions do the same iff these are equal)."""
    return json.dumps(
        [action.kind.value, action.target, _fields(action)],
        sort_keys=True,
        separators=(",", ":"),
    )


@record(frozen=True, slots=True)
class Changed:
    """An action both plans have for one kind and target, with other fields."""

    saved: Action
    fresh: Action

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields (JSON names) whose values differ (a resourceVersion alone never does)."""
        a, b = _fields(self.saved), _fields(self.fresh)
        return tuple(sorted(k for k in a.keys() | b.keys() if _json(a.get(k)) != _json(b.get(k))))


@record(frozen=True, slots=True)
class PlanDifference:
    """How a saved plan's actions differ from a fresh plan's; empty when they do the same."""

    #: Actions only the saved plan has (no action of that kind and target in the fresh one).
    only_saved: tuple[Action, ...] = ()
    #: Actions only the fresh plan has.
    only_fresh: tuple[Action, ...] = ()
    #: Same kind and target in both, other fields.
    changed: tuple[Changed, ...] = ()
    #: The same actions, in another order.
    reordered: bool = False

    def __bool__(self) -> bool:
        return bool(self.only_saved or self.only_fresh or self.changed or self.reordered)


def compare_actions(saved: Sequence[Action], fresh: Sequence[Action]) -> PlanDifference:
    """Where ``saved`` and ``fresh`` differ, each side in its own order (linear)."""
    saved_effects = [effect(a) for a in saved]
    fresh_effects = [effect(a) for a in fresh]
    if saved_effects == fresh_effects:
        return PlanDifference()
    extra_saved = Counter(saved_effects) - Counter(fresh_effects)
    extra_fresh = Counter(fresh_effects) - Counter(saved_effects)
    if not extra_saved and not extra_fresh:
        return PlanDifference(reordered=True)
    left = _take(saved, saved_effects, extra_saved)
    right = _take(fresh, fresh_effects, extra_fresh)
    # Pair what both sides have for one kind and target: "changed", not one gone and one new.
    by_key: dict[tuple[ActionKind, str], list[Action]] = {}
    for action in right:
        by_key.setdefault((action.kind, action.target), []).append(action)
    changed: list[Changed] = []
    only_saved: list[Action] = []
    paired: set[int] = set()
    for action in left:
        candidates = by_key.get((action.kind, action.target))
        if candidates:
            match = candidates.pop(0)
            paired.add(id(match))
            changed.append(Changed(action, match))
        else:
            only_saved.append(action)
    only_fresh = [a for a in right if id(a) not in paired]
    return PlanDifference(tuple(only_saved), tuple(only_fresh), tuple(changed))


def _take(actions: Sequence[Action], effects: Sequence[str], extra: Counter[str]) -> list[Action]:
    left = Counter(extra)
    out = []
    for action, key in zip(actions, effects, strict=True):
        if left[key] > 0:
            left[key] -= 1
            out.append(action)
    return out


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
