"""The VGPUNodeState's status: vgpuctl's summary of one node (pure helpers).

One cluster-scoped object per node, named after it, in vgpuctl's own group
(``vgpu.reconciler.dev``; the role ``SriovNetworkNodeState`` plays for sriov-network-operator).
It holds what vgpuctl knows beyond Harvester's fields: the node's GPUs as observed, its vGPUs
(profile, UUID, in use and by whom), the profiles with their counts, the conditions
``Converged``, ``Blocked`` and ``Degraded``, the last reconcile that changed something, the
desired state's fingerprint and vgpuctl's version. The planner renders it
(``plan.nodestate``); it is written only when something it shows changes.

Times are the one thing a pure planner cannot know. A rendered status carries the times of the
stored object wherever they still hold (a condition whose status did not change keeps its
``lastTransitionTime``; a reconcile that changes nothing keeps ``lastChange``), and
:data:`PENDING_TIME` where the time is the write's: the cluster executor stamps those with the
moment it writes (:func:`stamped`). So an unchanged node renders exactly what is stored, and
no clock is ever a difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The condition types.
CONVERGED = "Converged"
BLOCKED = "Blocked"
DEGRADED = "Degraded"
#: A time the cluster executor fills in when it writes the status.
PENDING_TIME = ""


def stamped(status: Mapping[str, Any], now: str) -> dict[str, Any]:
    """``status`` with every :data:`PENDING_TIME` (a condition's ``lastTransitionTime``,
    ``lastChange.time``) set to ``now`` (RFC 3339, ``2026-12-02T03:07:13Z``)."""
    out = dict(status)
    conditions = status.get("conditions")
    if isinstance(conditions, list | tuple):
        out["conditions"] = [
            {**c, "lastTransitionTime": now}
            if isinstance(c, Mapping) and c.get("lastTransitionTime", PENDING_TIME) == PENDING_TIME
            else c
            for c in conditions
        ]
    change = status.get("lastChange")
    if isinstance(change, Mapping) and change.get("time", PENDING_TIME) == PENDING_TIME:
        out["lastChange"] = {**change, "time": now}
    return out


def configured_profiles(status: Mapping[str, Any]) -> frozenset[str]:
    """The profiles a node's VGPUNodeState shows configured: wanted by its desired state or
    present as vGPUs. Entries that are not well formed are skipped."""
    profiles = status.get("profiles")
    if not isinstance(profiles, list | tuple):
        return frozenset()
    out = set()
    for entry in profiles:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        if isinstance(name, str) and name and (_count(entry, "wanted") or _count(entry, "vgpus")):
            out.add(name)
    return frozenset(out)


def condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in ``status``, None when there is none."""
    for entry in _conditions(status.get("conditions")):
        if entry.get("type") == kind:
            return entry
    return None


def _conditions(value: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(value, list | tuple):
        return [c for c in value if isinstance(c, Mapping)]
    return []


def _count(entry: Mapping[str, Any], key: str) -> int:
    value = entry.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
