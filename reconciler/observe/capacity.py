"""How many vGPUs of each profile the cluster can still give (``vgpuctl capacity``).

Per node and vGPU resource (``nvidia.com/NVIDIA_A2-4Q``):

- **configured**: the vGPUs of that profile on the node, from its ``VGPUNodeState`` summary
  (``status.profiles[].vgpus``), else — a node vgpuctl does not summarise, as in delegate mode —
  its ``VGPUDevice`` objects (label ``nodename``) whose ``status.configureVGPUTypeName`` is the
  profile;
- **allocatable**: the node's ``status.allocatable``, what its device plugin advertised;
- **requested**: the requests of the pods bound to the node (``spec.nodeName``) that have not
  finished (phase neither Succeeded nor Failed), each pod's request as the scheduler counts it
  (k8s.io/component-helpers ``resource.PodRequests``): the containers' sum plus restartable
  (sidecar) init containers, or a regular init container's request on top of the sidecars
  started before it, whichever is larger;
- **held**: the vGPUs of that profile held on the host without a pod: the node's
  ``VGPUNodeState`` lists each vGPU (``status.vgpus[]``) with ``inUse`` and its ``holder`` as
  the node agent saw it. A vGPU the kubelet allocated to a pod is named after that pod
  (``VM <namespace>/<name> (pod <uid>)`` or ``pod <uid>``: ``observe/cluster.py``
  ``_node_uses``), or after a VM whose allocation is not known (``VM … (allocation unknown)``:
  ``plan/uses.py``): such a pod is counted in *requested* already. Any other holder — a
  process no pod's allocation names (``pid 1234 (qemu-system-x86)``: ``observe/holds.py``
  ``describe_holder``), or ``unknown: …`` when the agent could not see every process
  (``observe/host.py`` ``unknown_holder``: counted, failing closed) — holds a vGPU the device
  plugin would still hand to a pod, whose VM would then not start. A node without a summary
  (delegate mode) says nothing of holders: 0;
- **free**: allocatable − requested − held (never below 0).

A profile **configured** on a node but not **allocatable** there (its device plugin has not
registered it, or advertises none) is flagged (:meth:`Capacity.unadvertised`): no pod can be
given one of those vGPUs.

Everything read is untrusted: a quantity that is not a whole number of devices (extended
resources are counted in whole devices) is left out and noted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.model import ResourceMissingError
from reconciler.model.cluster import (
    GROUP,
    NODE_LABEL,
    NODE_STATE_GROUP,
    NODE_STATE_PLURAL,
    NODE_STATE_VERSION,
    VERSION,
    VGPU_PLURAL,
    resource_name,
)
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.record import record

#: The extended resources vGPUs are advertised as.
PREFIX = "nvidia.com/"
_FINISHED = ("Succeeded", "Failed")
#: The longest profile name read from a summary (the desired state allows 63 characters).
_MAX_NAME = 256


@record(frozen=True, slots=True)
class ProfileCapacity:
    resource: str
    configured: int
    allocatable: int
    requested: int
    #: Held on the host without a pod (the module's description).
    held: int
    #: allocatable − requested − held, never below 0 (a cluster total: the nodes' free summed).
    free: int

    @staticmethod
    def of(
        resource: str, configured: int, allocatable: int, requested: int, held: int = 0
    ) -> ProfileCapacity:
        free = max(allocatable - requested - held, 0)
        return ProfileCapacity(resource, configured, allocatable, requested, held, free)

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "configured": self.configured,
            "allocatable": self.allocatable,
            "requested": self.requested,
            "held": self.held,
            "free": self.free,
        }


@record(frozen=True, slots=True)
class NodeCapacity:
    node: str
    profiles: tuple[ProfileCapacity, ...]


@record(frozen=True, slots=True)
class Capacity:
    nodes: tuple[NodeCapacity, ...]
    notes: tuple[str, ...] = ()

    def totals(self) -> tuple[ProfileCapacity, ...]:
        """Per resource, the cluster's sums (``free``: what the nodes have free, summed)."""
        sums: dict[str, tuple[int, int, int, int, int]] = {}
        for node in self.nodes:
            for p in node.profiles:
                c, a, r, h, f = sums.get(p.resource, (0, 0, 0, 0, 0))
                sums[p.resource] = (
                    c + p.configured, a + p.allocatable, r + p.requested, h + p.held, f + p.free
                )  # fmt: skip
        return tuple(ProfileCapacity(k, *v) for k, v in sorted(sums.items()))

    def unadvertised(self) -> tuple[str, ...]:
        """One warning per node and profile configured there but not allocatable: the node's
        device plugin has not registered the resource (or advertises none of it)."""
        return tuple(
            f"node {n.node}: {p.configured} {p.resource} configured but none allocatable: its "
            "device plugin has not registered it, so no pod can be given one"
            for n in self.nodes
            for p in n.profiles
            if p.configured > 0 and p.allocatable == 0
        )


@record(frozen=True, slots=True)
class Requirement:
    """``--require``: ``count`` vGPUs of ``resource``."""

    resource: str
    count: int


@record(frozen=True, slots=True)
class Finding:
    """A requirement as checked: the node looked at (the one that has it, else the best one;
    None when no node offers the resource) and how many are free there."""

    requirement: Requirement
    node: str | None
    free: int

    @property
    def met(self) -> bool:
        return self.node is not None and self.free >= self.requirement.count

    def to_json(self) -> dict[str, Any]:
        r = self.requirement
        return {"resource": r.resource, "count": r.count, "node": self.node, "free": self.free,
                "satisfied": self.met}  # fmt: skip


@record(frozen=True, slots=True)
class Verdict:
    satisfied: bool
    findings: tuple[Finding, ...]
    messages: tuple[str, ...]


def check_jointly(capacity: Capacity, wanted: Sequence[Requirement]) -> Verdict:
    """Whether one node has every requirement free at once (a VM that needs them all starts on
    one node): for each requirement, the node's free vGPUs of its resource are at least its
    count. The best node is the one short by the fewest vGPUs in all, then the one with the
    most of them free, then the first by name; only nodes that have at least one of the
    resources are looked at. A resource no node has at all fails the check by itself."""
    offered = {p.resource for n in capacity.nodes for p in n.profiles}
    missing = [r for r in wanted if r.resource not in offered]
    if missing:
        return Verdict(
            False,
            tuple(Finding(r, None, 0) for r in wanted),
            tuple(f"no node offers {r.resource}" for r in missing),
        )
    asked = {r.resource for r in wanted}

    def free_on(node: NodeCapacity) -> list[int]:
        free = {p.resource: p.free for p in node.profiles}
        return [free.get(r.resource, 0) for r in wanted]

    def rank(node: NodeCapacity) -> tuple[int, int, str]:
        free = free_on(node)
        short = sum(max(r.count - f, 0) for r, f in zip(wanted, free, strict=True))
        return short, -sum(free), node.node

    best = min(
        (n for n in capacity.nodes if any(p.resource in asked for p in n.profiles)), key=rank
    )
    findings = tuple(Finding(r, best.node, f) for r, f in zip(wanted, free_on(best), strict=True))
    met = all(f.met for f in findings)
    return Verdict(met, findings, (_joint_message(best.node, findings, met),))


def check_each(capacity: Capacity, wanted: Sequence[Requirement]) -> Verdict:
    """``--any-node``: each requirement checked alone (any node may meet each)."""
    verdicts = [check_jointly(capacity, [r]) for r in wanted]
    return Verdict(
        all(v.satisfied for v in verdicts),
        tuple(f for v in verdicts for f in v.findings),
        tuple(m for v in verdicts for m in v.messages),
    )


def _joint_message(node: str, findings: Sequence[Finding], met: bool) -> str:
    if len(findings) == 1:
        f = findings[0]
        r = f.requirement
        if met:
            return f"node {node} has {f.free} {r.resource} free (needed {r.count})"
        return (
            f"no node has {r.count} {r.resource} free: the best, {node}, has {f.free} "
            f"(short by {r.count - f.free})"
        )
    if met:
        return f"node {node} has them all free at once: " + ", ".join(
            f"{f.free} {f.requirement.resource} (needed {f.requirement.count})" for f in findings
        )
    asked = " and ".join(f"{f.requirement.count} {f.requirement.resource}" for f in findings)
    has = " and ".join(f"{f.free} {f.requirement.resource}" for f in findings)
    short = " and ".join(
        f"{f.requirement.count - f.free} {f.requirement.resource}" for f in findings if not f.met
    )
    return f"no node has {asked} free at once: the best, {node}, has {has} (short by {short})"


def _whole(value: object) -> int | None:
    """A whole-device quantity ("2", 2); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    return None


def _requests(container: object) -> Mapping[str, object]:
    if not isinstance(container, Mapping):
        return {}
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    requests = resources.get("requests")
    limits = resources.get("limits")
    # An extended resource given only as a limit is requested as much (the API server
    # defaults requests to limits).
    out: dict[str, object] = dict(limits) if isinstance(limits, Mapping) else {}
    if isinstance(requests, Mapping):
        out.update(requests)
    return out


def pod_requests(pod: Mapping[str, Any], notes: list[str]) -> dict[str, int]:
    """The pod's vGPU requests as the scheduler counts them (module docstring)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    name = _name(pod)

    def vgpus(container: object) -> dict[str, int]:
        out = {}
        for key, raw in _requests(container).items():
            if not (isinstance(key, str) and key.startswith(PREFIX)):
                continue
            n = _whole(raw)
            if n is None:
                notes.append(f"pod {name}: {key} request {raw!r} is not a whole number: ignored")
                continue
            out[key] = n
        return out

    total: dict[str, int] = {}
    for c in _list(spec.get("containers")):
        for k, v in vgpus(c).items():
            total[k] = total.get(k, 0) + v
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in _list(spec.get("initContainers")):
        asked = vgpus(c)
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            for k, v in asked.items():
                sidecars[k] = sidecars.get(k, 0) + v
        else:
            for k in set(asked) | set(sidecars):
                init_peak[k] = max(init_peak.get(k, 0), asked.get(k, 0) + sidecars.get(k, 0))
    for k, v in sidecars.items():
        total[k] = total.get(k, 0) + v
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    return {k: v for k, v in total.items() if v}


def observe_capacity(api: ClusterApi) -> Capacity:
    """Every node's vGPU resources: five lists (nodes, pods not finished, the summaries, the
    VGPUDevices), whatever the cluster's size."""
    notes: list[str] = []
    allocatable: dict[str, dict[str, int]] = {}
    for node in api.list_objects(group="", version="v1", plural="nodes"):
        status = node.get("status")
        alloc = status.get("allocatable") if isinstance(status, Mapping) else None
        resources = {}
        for key, raw in alloc.items() if isinstance(alloc, Mapping) else ():
            if isinstance(key, str) and key.startswith(PREFIX):
                n = _whole(raw)
                if n is None:
                    notes.append(f"node {_name(node)}: allocatable {key} {raw!r} ignored")
                    continue
                resources[key] = n
        allocatable[_name(node)] = resources
    requested: dict[str, dict[str, int]] = {}
    pods = api.list_objects(
        group="",
        version="v1",
        plural="pods",
        field_selector="status.phase!=Succeeded,status.phase!=Failed",
    )
    for pod in pods:
        spec = pod.get("spec")
        status = pod.get("status")
        bound = spec.get("nodeName") if isinstance(spec, Mapping) else None
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if not isinstance(bound, str) or not bound or phase in _FINISHED:
            continue
        bucket = requested.setdefault(bound, {})
        for key, n in pod_requests(pod, notes).items():
            bucket[key] = bucket.get(key, 0) + n
    configured, held = _configured(api)
    nodes = []
    for name in sorted(set(allocatable) | set(configured)):
        keys = set(allocatable.get(name, {})) | set(configured.get(name, {}))
        keys |= set(requested.get(name, {})) | set(held.get(name, {}))
        profiles = tuple(
            ProfileCapacity.of(
                key,
                configured.get(name, {}).get(key, 0),
                allocatable.get(name, {}).get(key, 0),
                requested.get(name, {}).get(key, 0),
                held.get(name, {}).get(key, 0),
            )
            for key in sorted(keys)
        )
        if profiles:
            nodes.append(NodeCapacity(name, profiles))
    return Capacity(tuple(nodes), tuple(notes))


#: How the node agent names the holder of a vGPU a pod was allocated (the module's
#: description): such a vGPU is the pod's, counted in its requests.
_POD_HOLDERS = ("VM ", "VMs ", "pod ")


def held_without_pod(in_use: object, holder: object) -> bool:
    """Whether a vGPU a node summary lists (``inUse``, ``holder``) is held on the host without
    a pod: in use, by a holder that is not a pod's (the module's description)."""
    if in_use is not True:
        return False
    return not (isinstance(holder, str) and holder.startswith(_POD_HOLDERS))


def _configured(api: ClusterApi) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Per node and resource, the vGPUs configured (the node's summary, else its VGPUDevices),
    and those held on the host without a pod (the summary's)."""
    summaries: dict[str, dict[str, int]] = {}
    held: dict[str, dict[str, int]] = {}
    for state in _maybe_list(api, NODE_STATE_GROUP, NODE_STATE_VERSION, NODE_STATE_PLURAL):
        status = state.get("status")
        profiles = status.get("profiles") if isinstance(status, Mapping) else None
        counts: dict[str, int] = {}
        for entry in _list(profiles):
            if not isinstance(entry, Mapping):
                continue
            name, vgpus = entry.get("name"), _whole(entry.get("vgpus"))
            if isinstance(name, str) and name and vgpus:
                counts[resource_name(name)] = vgpus
        summaries[_name(state)] = counts
        vgpu_list = status.get("vgpus") if isinstance(status, Mapping) else None
        mine: dict[str, int] = {}
        for entry in _list(vgpu_list):
            if not isinstance(entry, Mapping):
                continue
            profile = entry.get("profile")
            named = isinstance(profile, str) and 0 < len(profile) <= _MAX_NAME
            if named and held_without_pod(entry.get("inUse"), entry.get("holder")):
                key = resource_name(str(profile))
                mine[key] = mine.get(key, 0) + 1
        held[_name(state)] = mine
    devices: dict[str, dict[str, int]] = {}
    for device in _maybe_list(api, GROUP, VERSION, VGPU_PLURAL):
        meta = device.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        node = labels.get(NODE_LABEL) if isinstance(labels, Mapping) else None
        status = device.get("status")
        profile = status.get("configureVGPUTypeName") if isinstance(status, Mapping) else None
        if isinstance(node, str) and node and isinstance(profile, str) and profile:
            counts = devices.setdefault(node, {})
            key = resource_name(profile)
            counts[key] = counts.get(key, 0) + 1
    return {**devices, **summaries}, held


def _maybe_list(api: ClusterApi, group: str, version: str, plural: str) -> list[dict[str, Any]]:
    try:
        return api.list_objects(group=group, version=version, plural=plural)
    except ResourceMissingError:
        return []  # the CRD is not installed: nothing of that kind


def _list(value: object) -> Iterable[object]:
    return value if isinstance(value, list | tuple) else ()


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else "?"
