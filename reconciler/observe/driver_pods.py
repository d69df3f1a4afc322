"""Harvester's NVIDIA driver pods → whether each node's is ready, as pcidevices-controller needs
it before its host work (``model.harvester.DriverPod``; docs/delegate.md). Pure.

The pods are those of ``harvester-system`` labelled ``app=nvidia-driver-daemonset`` (one list,
by that namespace and label), matched to nodes by ``spec.nodeName`` as
``setupRemoteExecutor`` (pkg/controller/gpudevice/gpu_controller.go, bdd8025) matches them.
A pod is ready when it is not being deleted, its phase is ``Running`` and its ``Ready``
condition is ``True``: pcidevices' readiness check (pkg/util/executor/remote.go ``CheckReady``)
is an exec into its first container, which fails while that container does not run (file(1)
exits 0 for a missing ``/tmp/ready``, so the file itself decides nothing). Harvester's
nvidia-driver-runtime chart declares no readiness probe, so ``Ready`` is its containers
running; another driver DaemonSet's probe only makes it stricter.

Every pod is untrusted input: a field of the wrong type or size is a note naming the pod and
the field, never a traceback. A pod whose node can be read but whose state cannot counts as
not ready on that node (fail closed: the controller may be using it); one whose node cannot be
read is a note on every node (it belongs to none that can be told).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.model.errors import excerpt
from reconciler.model.harvester import DRIVER_NAMESPACE, DriverPod
from reconciler.observe.harvester_devices import MAX_ENTRIES, ObjectError

_MAX_NAME = 253
#: An object's name (DNS-1123 subdomain) and a container's (DNS-1123 label), as the API server
#: validates them: anything else is not shown, it is an error.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: A phase, a condition's status or reason, a container state's reason: short words.
_MAX_WORD = 128


def driver_pods(
    pods: Sequence[Mapping[str, Any]], nodes: Iterable[str]
) -> dict[str, tuple[DriverPod | None, tuple[str, ...]]]:
    """For each of ``nodes``: its first driver pod (by name) that is not ready (None when all
    are ready or it has none), and the notes about pods that could not be read."""
    wanted = set(nodes)
    blocking: dict[str, DriverPod] = {}
    everywhere: list[str] = []
    if len(pods) > MAX_ENTRIES:
        everywhere.append(
            f"{len(pods)} NVIDIA driver pods in {DRIVER_NAMESPACE}: only the first "
            f"{MAX_ENTRIES} are read"
        )
    for raw in pods[:MAX_ENTRIES]:
        try:
            name, node = _identity(raw)
        except ObjectError as e:
            everywhere.append(f"Pod {DRIVER_NAMESPACE}/{e}: ignored")
            continue
        if node not in wanted:
            continue
        try:
            why = not_ready(raw)
        except ObjectError as e:
            why = f"its status could not be read: {e}"
        if why and (node not in blocking or name < blocking[node].name):
            blocking[node] = DriverPod(name, why)
    notes = tuple(everywhere)
    return {node: (blocking.get(node), notes) for node in sorted(wanted)}


def not_ready(raw: Mapping[str, Any]) -> str:
    """Why a driver pod is not ready ("" when it is): being deleted, its phase, its ``Ready``
    condition, and its first container's state (the container pcidevices execs into)."""
    metadata = _mapping(raw, "metadata")
    if metadata.get("deletionTimestamp"):
        return "being deleted"
    status = _mapping(raw, "status")
    phase = _word(status, "phase", "status.phase") or "unknown"
    ready = _ready(status)
    if phase == "Running" and ready == ("True", ""):
        return ""
    parts = [f"phase {phase}"]
    parts.append(
        "no Ready condition"
        if ready is None
        else f"Ready: {ready[0]}" + (f" ({ready[1]})" if ready[1] else "")
    )
    container = _first_container(raw, status)
    if container:
        parts.append(container)
    return "; ".join(parts)


def _identity(raw: Mapping[str, Any]) -> tuple[str, str]:
    if not isinstance(raw, Mapping):
        raise ObjectError("?: not an object")
    metadata = raw.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or len(name) > _MAX_NAME or not _NAME.fullmatch(name):
        raise ObjectError("?: metadata.name is not a name")
    spec = raw.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if (
        node is None or node == ""
    ):  # not scheduled yet: no node's (pcidevices compares it with its own)
        return name, ""
    if not isinstance(node, str) or len(node) > _MAX_NAME or not _NAME.fullmatch(node):
        raise ObjectError(f"{name}: spec.nodeName is not a name")
    return name, node


def _ready(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``Ready`` condition's status and reason; None when there is none."""
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or len(conditions) > MAX_ENTRIES:
        raise ObjectError("status.conditions is not a list of conditions")
    for condition in conditions:
        if not isinstance(condition, Mapping):
            raise ObjectError("status.conditions is not a list of conditions")
        if condition.get("type") == "Ready":
            where = "status.conditions[Ready]"
            return (
                _word(condition, "status", f"{where}.status") or "Unknown",
                _word(condition, "reason", f"{where}.reason"),
            )
    return None


def _first_container(raw: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """The first container's state when it is not running ("" when it runs or is not said):
    ``container <name> waiting: <reason>`` or ``terminated: <reason>``."""
    spec = raw.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        return ""
    first = containers[0]
    name = first.get("name") if isinstance(first, Mapping) else None
    if not isinstance(name, str) or len(name) > 63 or not _LABEL.fullmatch(name):
        raise ObjectError("spec.containers[0].name is not a name")
    statuses = status.get("containerStatuses") or []
    if not isinstance(statuses, list) or len(statuses) > MAX_ENTRIES:
        raise ObjectError("status.containerStatuses is not a list")
    for entry in statuses:
        if not isinstance(entry, Mapping) or entry.get("name") != name:
            continue
        state = entry.get("state")
        if not isinstance(state, Mapping):
            raise ObjectError(f"status.containerStatuses[{name}].state is not an object")
        for key in ("waiting", "terminated"):
            detail = state.get(key)
            if detail is None:
                continue
            if not isinstance(detail, Mapping):
                raise ObjectError(f"status.containerStatuses[{name}].state.{key} is not an object")
            reason = _word(detail, "reason", f"status.containerStatuses[{name}].state.{key}.reason")
            return f"container {name} {key}" + (f": {reason}" if reason else "")
        return ""
    return f"container {name} has no status yet"


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{key} is not an object")
    return value


def _word(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > _MAX_WORD:
        raise ObjectError(f"{where} is not a word")
    return excerpt(value, _MAX_WORD)
