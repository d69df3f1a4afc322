"""The node's VGPUNodeState as the plan will leave it. Pure.

Rendered from the host as the host actions will leave it (the same predicted inventory the
Harvester objects are rendered from), the plan's blocked items, what cannot be driven, and the
actions that change something. Times are carried over from the stored object where they still
hold and left :data:`~reconciler.model.nodestate.PENDING_TIME` where the write decides them
(:mod:`reconciler.model.nodestate`), so a node where nothing changed renders exactly what is
stored: the diff finds nothing, and an idle node writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler import __version__
from reconciler.model import Action, ActionKind, DesiredNode, Inventory, PciAddress
from reconciler.model.cluster import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_KIND,
    KubeObject,
    resource_name,
)
from reconciler.model.inventory import gpu_facts_json
from reconciler.model.nodestate import BLOCKED, CONVERGED, DEGRADED, PENDING_TIME, condition
from reconciler.plan.assign import vf_profiles
from reconciler.plan.check import vf_slots
from reconciler.plan.render import canonical_json

#: How many reasons a condition's message quotes before "and N more".
_QUOTED = 3
#: The longest stored text (a condition's transition time, the last change's time and result)
#: carried over into the summary written next; a longer one is dropped, as if absent.
_MAX_KEPT = 1024


def render_node_state(
    node: str,
    *,
    desired: DesiredNode | None,
    predicted: Inventory,
    managed: frozenset[PciAddress],
    assignments: Mapping[PciAddress, Mapping[int, str]],
    blocked: Sequence[Action],
    degraded: Sequence[str],
    changes: Sequence[Action],
    stored: KubeObject | None,
) -> KubeObject:
    """The VGPUNodeState of ``node``.

    ``managed`` are the desired GPUs on the host and ``assignments`` their VF index → profile;
    ``blocked`` the plan's blocked actions; ``degraded`` why managed GPUs cannot be driven;
    ``changes`` the plan's host and cluster actions (the node state's own write aside): when
    there are any, ``lastChange`` records this reconcile. ``stored`` is the object as observed.
    """
    stored_status = stored.status if stored is not None else {}
    gpus = sorted(predicted.gpus, key=lambda g: g.address)
    vgpus: list[dict[str, Any]] = []
    for gpu in gpus:
        for vf in sorted(gpu.vfs, key=lambda v: v.index):
            if vf.vgpu is None:
                continue
            entry: dict[str, Any] = {
                "gpu": str(gpu.address),
                "vf": str(vf.address),
                "vfIndex": vf.index,
                "profile": vf.vgpu.type_name,
                "uuid": vf.vgpu.uuid,
                "inUse": vf.vgpu.in_use,
            }
            if vf.vgpu.holder:
                entry["holder"] = vf.vgpu.holder
            vgpus.append(entry)
    # Each GPU's vGPU types by reference to a list of distinct type lists: a node's GPUs of one
    # model list the same types (an 8×L40S node's summary shrinks from 48 KB to 18 KB), and
    # every node reads every node's summary.
    type_sets: list[list[dict[str, Any]]] = []
    set_index: dict[str, int] = {}
    gpu_entries = []
    for g in gpus:
        facts = gpu_facts_json(g)
        types = facts.pop("vgpuTypes")
        key = canonical_json(types)
        index = set_index.get(key)
        if index is None:
            index = set_index[key] = len(type_sets)
            type_sets.append(types)
        gpu_entries.append(
            {
                **facts,
                "managed": g.address in managed,
                "vfAddresses": [str(v.address) for v in sorted(g.vfs, key=lambda v: v.index)],
                "typeSet": index,
            }
        )
    status: dict[str, Any] = {
        "vgpuctlVersion": __version__,
        "desiredFingerprint": desired_fingerprint(desired),
        "counts": {
            "gpus": len(gpus),
            "managedGPUs": len(managed),
            "vfs": sum(len(g.vfs) for g in gpus),
            "vgpus": len(vgpus),
            "inUse": sum(1 for v in vgpus if v["inUse"]),
            "blocked": len(blocked),
        },
        "gpus": gpu_entries,
        "typeSets": type_sets,
        "vgpus": vgpus,
        "profiles": _profiles(predicted, assignments, vgpus),
        "conditions": _conditions(blocked, degraded, stored_status),
    }
    change = _last_change(changes, stored_status)
    if change is not None:
        status["lastChange"] = change
    return KubeObject(
        kind=NODE_STATE_KIND,
        name=node,
        labels={NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
        spec={"nodeName": node},
        status=status,
    )


def settled_node_state(node: str, desired: DesiredNode, inventory: Inventory) -> KubeObject:
    """The VGPUNodeState of a host that is as ``desired`` wants it: every managed GPU's VFs
    assigned as the planner assigns them, nothing blocked, nothing changed (its times
    pending). ``status -o crds`` shows it; test cases store it as an earlier run left it."""
    assignments = {}
    for gpu in inventory.gpus:
        entry = desired.gpu(gpu.address)
        if entry is not None:
            assignments[gpu.address] = vf_profiles(entry, vf_slots(gpu))
    return render_node_state(
        node,
        desired=desired,
        predicted=inventory,
        managed=frozenset(assignments),
        assignments=assignments,
        blocked=(),
        degraded=(),
        changes=(),
        stored=None,
    )


def desired_fingerprint(desired: DesiredNode | None) -> str:
    """SHA-256 of the node's desired GPUs as canonical JSON (where they were written aside):
    equal desired states give equal fingerprints, whatever file or order they came from."""
    gpus = []
    for g in sorted(desired.gpus if desired is not None else (), key=lambda g: g.address):
        doc: dict[str, Any] = {"address": str(g.address), "sriov": g.sriov}
        if g.model is not None:
            doc["model"] = g.model
        if g.vgpus is not None:
            doc["vgpus"] = {str(k): v for k, v in g.vgpus.items()}
        if g.profiles is not None:
            doc["profiles"] = dict(g.profiles)
        gpus.append(doc)
    text = canonical_json({"gpus": gpus})
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _profiles(
    predicted: Inventory,
    assignments: Mapping[PciAddress, Mapping[int, str]],
    vgpus: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Per profile: VFs the desired state gives it (``wanted``), its vGPUs (``vgpus``, ``inUse``)
    and the VFs it could be created on now (``creatable``)."""
    counts: dict[str, dict[str, int]] = {}

    def count(name: str, key: str) -> None:
        entry = counts.setdefault(name, {"wanted": 0, "vgpus": 0, "inUse": 0, "creatable": 0})
        entry[key] += 1

    for profiles in assignments.values():
        for name in profiles.values():
            count(name, "wanted")
    for v in vgpus:
        count(str(v["profile"]), "vgpus")
        if v["inUse"]:
            count(str(v["profile"]), "inUse")
    for gpu in predicted.gpus:
        for vf in gpu.vfs:
            for name in vf.creatable:
                count(name, "creatable")
    return [
        {"name": name, "resourceName": resource_name(name), **counts[name]}
        for name in sorted(counts)
    ]


def _conditions(
    blocked: Sequence[Action], degraded: Sequence[str], stored: Mapping[str, Any]
) -> list[dict[str, Any]]:
    if blocked:
        reasons = [f"{a.kind.value} {a.target}: {a.reason}" for a in blocked]
        blocked_c = (
            True,
            "ChangesBlocked",
            f"{_count(blocked, 'change')} blocked: " + _quote(reasons),
        )
    else:
        blocked_c = (False, "NothingBlocked", "no change is blocked")
    if degraded:
        degraded_c = (True, "GPUsNotDrivable", _quote(list(degraded)))
    else:
        degraded_c = (False, "AllGPUsDrivable", "every managed GPU can be driven")
    if degraded:
        converged_c = (False, "Degraded", "a managed GPU cannot be driven (see Degraded)")
    elif blocked:
        converged_c = (False, "ChangesBlocked", "changes are blocked (see Blocked)")
    else:
        converged_c = (True, "Converged", "the host and the cluster are as desired")
    out = []
    for kind, (status, reason, message) in zip(
        (CONVERGED, BLOCKED, DEGRADED), (converged_c, blocked_c, degraded_c), strict=True
    ):
        text = "True" if status else "False"
        out.append(
            {
                "type": kind,
                "status": text,
                "reason": reason,
                "message": message,
                "lastTransitionTime": _kept_time(stored, kind, text),
            }
        )
    return out


def _kept_time(stored: Mapping[str, Any], kind: str, status: str) -> str:
    """The stored condition's transition time when its status is unchanged; else pending."""
    c = condition(stored, kind)
    time = None if c is None else c.get("lastTransitionTime")
    if c is not None and c.get("status") == status and _kept(time):
        return str(time)
    return PENDING_TIME


def _last_change(changes: Sequence[Action], stored: Mapping[str, Any]) -> dict[str, Any] | None:
    """This reconcile's change when it makes one; else the stored one (None: never)."""
    if changes:
        by_kind: dict[ActionKind, int] = {}
        for a in changes:
            by_kind[a.kind] = by_kind.get(a.kind, 0) + 1
        parts = ", ".join(f"{n} {kind.value}" for kind, n in sorted(by_kind.items(), key=_order))
        return {"time": PENDING_TIME, "result": f"applied {_count(changes, 'action')}: {parts}"}
    change = stored.get("lastChange")
    if isinstance(change, Mapping) and _kept(change.get("time")) and _kept(change.get("result")):
        return {"time": change["time"], "result": change["result"]}
    return None


def _kept(value: object) -> bool:
    """Whether a stored status text is carried over: a string, not empty, at most
    :data:`_MAX_KEPT` characters (a longer one is someone's, not vgpuctl's: dropped)."""
    return isinstance(value, str) and 0 < len(value) <= _MAX_KEPT


def _order(item: tuple[ActionKind, int]) -> int:
    return item[0].order


def _count(items: Sequence[object], noun: str) -> str:
    return f"{len(items)} {noun}{'s' * (len(items) != 1)}"


def _quote(reasons: list[str]) -> str:
    shown = "; ".join(reasons[:_QUOTED])
    more = len(reasons) - _QUOTED
    return shown + (f"; and {more} more" if more > 0 else "")
