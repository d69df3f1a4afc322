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
- **free**: allocatable − requested (never below 0).

Everything read is untrusted: a quantity that is not a whole number of devices (extended
resources are counted in whole devices) is left out and noted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


@record(frozen=True, slots=True)
class ProfileCapacity:
    resource: str
    configured: int
    allocatable: int
    requested: int
    #: allocatable − requested, never below 0 (a cluster total: the nodes' free summed).
    free: int

    @staticmethod
    def of(resource: str, configured: int, allocatable: int, requested: int) -> ProfileCapacity:
        return ProfileCapacity(
            resource, configured, allocatable, requested, max(allocatable - requested, 0)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "configured": self.configured,
            "allocatable": self.allocatable,
            "requested": self.requested,
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
        sums: dict[str, tuple[int, int, int, int]] = {}
        for node in self.nodes:
            for p in node.profiles:
                c, a, r, f = sums.get(p.resource, (0, 0, 0, 0))
                sums[p.resource] = (
                    c + p.configured, a + p.allocatable, r + p.requested, f + p.free
                )  # fmt: skip
        return tuple(ProfileCapacity(k, *v) for k, v in sorted(sums.items()))

    def best(self, resource: str) -> tuple[str, int] | None:
        """The node with the most free devices of ``resource`` (the first by name among
        equals), and how many; None when no node has the resource at all."""
        found = sorted(
            (-p.free, n.node) for n in self.nodes for p in n.profiles if p.resource == resource
        )
        if not found:
            return None
        free, node = found[0]
        return node, -free


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
    configured = _configured(api)
    nodes = []
    for name in sorted(set(allocatable) | set(configured)):
        keys = set(allocatable.get(name, {})) | set(configured.get(name, {}))
        keys |= set(requested.get(name, {}))
        profiles = tuple(
            ProfileCapacity.of(
                key,
                configured.get(name, {}).get(key, 0),
                allocatable.get(name, {}).get(key, 0),
                requested.get(name, {}).get(key, 0),
            )
            for key in sorted(keys)
        )
        if profiles:
            nodes.append(NodeCapacity(name, profiles))
    return Capacity(tuple(nodes), tuple(notes))


def _configured(api: ClusterApi) -> dict[str, dict[str, int]]:
    """Per node and resource, the vGPUs configured: the node's summary, else its VGPUDevices."""
    summaries: dict[str, dict[str, int]] = {}
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
    return {**devices, **summaries}


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
