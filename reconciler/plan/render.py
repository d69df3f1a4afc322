"""The node's CRs as they should be: spec from the desired state, status from the host.

Pure. One SRIOVGPUDevice per managed GPU and one VGPUDevice per VF of a managed GPU whose VFs
exist, named and labelled as Harvester's pcidevices-controller does (docs/domain.md §5), marked as
vgpuctl's, and annotated with the spec vgpuctl writes, so a spec edited by hand shows as drift.
A GPU the desired state does not name whose objects vgpuctl wrote (:func:`kept_unmanaged`) keeps
them, spec and status both from the host as it is (:func:`as_found`): they ask for nothing the
host does not have, so neither vgpuctl nor any controller reading them would change it.
They hold exactly the fields Harvester's CRDs declare, with Harvester's types (every spec field;
status fields only when not empty): what the API server keeps under either CRD.
The cluster planner diffs these against what the API server holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, cast

from reconciler.model import DesiredGpu, DesiredNode, Gpu, Inventory, PciAddress, Vf, VfKey
from reconciler.model.cluster import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    PARENT_LABEL,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    ClusterState,
    KubeObject,
    object_name,
)
from reconciler.model.inventory import UNKNOWN_TYPE
from reconciler.model.record import record
from reconciler.plan.assign import vf_profiles
from reconciler.plan.check import vf_slots

#: The spec vgpuctl last wrote, as canonical JSON: a stored spec that differs was edited by hand.
LAST_APPLIED_ANNOTATION = "vgpu.reconciler.dev/last-applied-spec"
#: ``status.vGPUStatus`` of a VF that hosts a vGPU (Harvester's value).
VGPU_CONFIGURED = "vGPUConfigured"


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal values give equal text, the text of ``json.dumps(value,
    sort_keys=True, separators=(",", ":"))`` (what vgpuctl has always written in the
    last-applied annotation). orjson writes that text ten times faster (a fleet's plan makes
    a quarter of a million); what it would write differently goes through ``json``: text
    that is not ASCII (``json`` escapes it), a value it does not take (a read-only mapping,
    an integer beyond 64 bits). Floats would differ in exponent form: vgpuctl's canonical
    values have none (specs are strings and booleans, fingerprints strings and integers)."""
    try:
        text = _sorted_dumps()(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return _CANONICAL.encode(value)
    if not text.isascii():
        return _CANONICAL.encode(value)
    return text.decode("ascii")


@functools.cache
def _sorted_dumps() -> Callable[[Any], bytes]:
    """orjson's encoder with sorted keys, imported on first use: a plan of the host alone
    renders no object, and its cold start is measured (tests/bench)."""
    import orjson

    return functools.partial(orjson.dumps, option=orjson.OPT_SORT_KEYS)


def as_found(gpu: Gpu) -> tuple[DesiredGpu, dict[int, str]]:
    """An unmanaged GPU as its objects' spec shows it: the host's layout taken as desired.
    SR-IOV as it is, and per VF with a vGPU (VF index → profile) the vGPU's type; one whose
    type cannot be read is there with an empty type name (``enabled`` and no type: the spec
    says a vGPU is there, and names no type it might not be)."""
    layout = {
        vf.index: "" if vf.vgpu.type_name == UNKNOWN_TYPE else vf.vgpu.type_name
        for vf in sorted(gpu.vfs, key=lambda vf: vf.index)
        if vf.vgpu is not None
    }
    keyed: dict[VfKey, str] = dict(layout.items())
    entry = DesiredGpu(
        gpu.address,
        gpu.sriov_enabled,
        model=gpu.model,
        vgpus=MappingProxyType(keyed) if gpu.sriov_enabled else None,
    )
    return entry, layout


def kept_unmanaged(
    node: str,
    inventory: Inventory,
    managed: Iterable[PciAddress],
    cluster: ClusterState,
) -> dict[PciAddress, tuple[DesiredGpu, dict[int, str]]]:
    """The GPUs of ``inventory`` not among ``managed`` whose objects are kept, each
    :func:`as_found`: those of which the cluster holds an object vgpuctl manages (its
    SRIOVGPUDevice, or a VGPUDevice of it: by name, parent label or spec). A GPU vgpuctl
    never wrote an object for gets none; another controller's objects of an unmanaged GPU are
    left alone (and, with none of vgpuctl's beside them, never taken over: ``--adopt`` is for
    the GPUs the desired state names)."""
    skip = frozenset(managed)
    if all(g.address in skip for g in inventory.gpus):
        return {}  # the usual case: every GPU managed (a fleet's plan renders many nodes)
    ours = [
        o
        for o in (*cluster.sriov_gpu_devices.values(), *cluster.vgpu_devices.values())
        if o.managed_by_us
    ]
    kept: dict[PciAddress, tuple[DesiredGpu, dict[int, str]]] = {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        if gpu.address in skip:
            continue
        pf = str(gpu.address)
        pf_name = object_name(node, pf)
        names = {pf_name, *(object_name(node, str(vf.address)) for vf in gpu.vfs)}
        if any(_of_gpu(o, pf, pf_name, names) for o in ours):
            kept[gpu.address] = as_found(gpu)
    return kept


def _of_gpu(obj: KubeObject, pf: str, pf_name: str, names: set[str]) -> bool:
    if obj.name in names or obj.labels.get(PARENT_LABEL) == pf_name:
        return True
    key = "address" if obj.kind == SRIOV_GPU_KIND else "parentGPUDeviceAddress"
    return obj.spec.get(key) == pf


@record(frozen=True, slots=True)
class AsStored:
    """A rendered object the API server already holds as rendered (vgpuctl's labels, the
    last-applied spec, spec and status all equal): there is nothing to write, so it is not
    made (a fleet's plan renders a quarter of a million VGPUDevices, nearly all of them so)."""

    kind: str
    name: str


def render_objects(node: str, desired: DesiredNode, inventory: Inventory) -> list[KubeObject]:
    """The CRs of ``node``: per managed GPU on the host its SRIOVGPUDevice, then its VFs'
    VGPUDevices in numeric VF order; GPUs in address order. Desired GPUs not on the host are
    skipped (the planner reports them)."""
    assignments = {}
    for gpu in inventory.gpus:
        entry = desired.gpu(gpu.address)
        if entry is not None:
            assignments[gpu.address] = vf_profiles(entry, vf_slots(gpu))
    # Nothing stored is given, so nothing is AsStored.
    return cast("list[KubeObject]", render_with(node, desired.gpus, inventory, assignments))


def render_with(
    node: str,
    desired: Iterable[DesiredGpu],
    inventory: Inventory,
    assignments: Mapping[PciAddress, Mapping[int, str]],
    *,
    stored: Mapping[str, KubeObject] | None = None,
) -> list[KubeObject | AsStored]:
    """:func:`render_objects` with the VF → profile assignment given (the host planner's).
    A VGPUDevice of ``stored`` (by name, as the API server holds it) that is exactly as
    rendered is :class:`AsStored` in its place (:func:`_as_rendered`)."""
    by_address = {g.address: g for g in inventory.gpus}
    objects: list[KubeObject | AsStored] = []
    for entry in sorted(desired, key=lambda d: d.address):
        gpu = by_address.get(entry.address)
        if gpu is None:
            continue
        objects.extend(
            _gpu_objects(node, entry, gpu, assignments.get(gpu.address, {}), stored or {})
        )
    return objects


def _as_rendered(
    current: KubeObject,
    labels: Mapping[str, str],
    applied: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> bool:
    """Whether ``current`` is what the cluster planner would find no difference in: every
    label vgpuctl sets, the last-applied spec, and spec and status each equal to the rendered
    ones. Such an object is in Harvester's view already (the rendered spec has every field,
    none null; the rendered status only declared fields, none empty), so the planner's own
    comparison, through that view, would find it equal too: this is a shortcut of it, never
    a different answer (tests/unit/test_plan_cluster_as_stored.py holds the two to the same
    plans)."""
    return (
        current.spec == spec
        and current.status == status
        and current.annotations.get(LAST_APPLIED_ANNOTATION) == applied
        and labels.items() <= current.labels.items()
    )


def _gpu_objects(
    node: str,
    desired: DesiredGpu,
    gpu: Gpu,
    profiles: Mapping[int, str],
    stored: Mapping[str, KubeObject],
) -> list[KubeObject | AsStored]:
    pf = str(gpu.address)
    pf_name = object_name(node, pf)
    vfs = sorted(gpu.vfs, key=lambda vf: vf.index)
    vf_addresses = [str(vf.address) for vf in vfs]
    vf_names = [object_name(node, a) for a in vf_addresses]
    spec = {"address": pf, "enabled": desired.sriov, "nodeName": node}
    # Harvester's fields only (docs/domain.md §5), empty ones left out as its omitempty does:
    # everything else vgpuctl knows of the GPU is in the node's VGPUNodeState.
    status: dict[str, Any] = {}
    if vf_addresses:
        status = {"vfAddresses": vf_addresses, "vGPUDevices": vf_names}
    # Fresh mappings handed over as read-only views: KubeObject keeps them without a copy (a
    # fleet renders a quarter of a million of these).
    objects: list[KubeObject | AsStored] = [
        KubeObject(
            kind=SRIOV_GPU_KIND,
            name=pf_name,
            labels=MappingProxyType({NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY}),
            annotations=MappingProxyType({LAST_APPLIED_ANNOTATION: canonical_json(spec)}),
            spec=MappingProxyType(spec),
            status=MappingProxyType(status),
        )
    ]
    type_ids = {t.name: t.type_id for t in gpu.types}
    labels = MappingProxyType(
        {NODE_LABEL: node, PARENT_LABEL: pf_name, MANAGED_BY_LABEL: MANAGED_BY}
    )
    available: dict[frozenset[str], dict[str, str]] = {}  # VFs of a GPU mostly offer the same
    # A VF's spec as canonical text, written from its parts: the keys sort as written, a PCI
    # address needs no escaping, and the node's and each profile's JSON are made once (a
    # fleet renders a quarter of a million; canonical_json of the whole spec gives the same
    # text, which a test holds).
    node_text = canonical_json(node)
    quoted: dict[str, str] = {}
    for vf, address, name in zip(vfs, vf_addresses, vf_names, strict=True):
        profile = profiles.get(vf.index)
        offered = available.get(vf.creatable)
        if offered is None:
            offered = available[vf.creatable] = _available(vf.creatable, type_ids)
        type_name = profile or ""
        type_text = quoted.get(type_name)
        if type_text is None:
            type_text = quoted[type_name] = canonical_json(type_name)
        vf_spec = {
            "address": address,
            "enabled": profile is not None,
            "nodeName": node,
            "parentGPUDeviceAddress": pf,
            "vGPUTypeName": type_name,
        }
        applied = (
            f'{{"address":"{address}","enabled":{"false" if profile is None else "true"},'
            f'"nodeName":{node_text},"parentGPUDeviceAddress":"{pf}","vGPUTypeName":{type_text}}}'
        )
        vf_status = _vf_status(vf, offered)
        current = stored.get(name)
        if current is not None and _as_rendered(current, labels, applied, vf_spec, vf_status):
            objects.append(AsStored(VGPU_KIND, name))
            continue
        objects.append(
            KubeObject(  # positional: a fleet renders a quarter of a million
                VGPU_KIND,
                name,
                labels,
                MappingProxyType({LAST_APPLIED_ANNOTATION: applied}),
                MappingProxyType(vf_spec),
                MappingProxyType(vf_status),
            )
        )
    return objects


def _available(creatable: frozenset[str], type_ids: Mapping[str, str]) -> dict[str, str]:
    """``status.availableTypes``: name → type id, in the driver's order (type ids), not the
    set's, so the same host renders the same text."""
    if not creatable:
        return {}
    available = {name: type_ids[name] for name in type_ids if name in creatable}
    for name in sorted(creatable - type_ids.keys()):
        available[name] = ""  # listed as creatable but not among the GPU's types: id unknown
    return available


def _vf_status(vf: Vf, available: dict[str, str]) -> dict[str, Any]:
    """Harvester's VGPUDevice status, empty fields left out (its ``omitempty``)."""
    vgpu = vf.vgpu
    status: dict[str, Any] = {}
    if vgpu is not None:
        status["vGPUStatus"] = VGPU_CONFIGURED
        if vgpu.uuid:  # a vGPU a summary shows without one (untrusted input)
            status["uuid"] = vgpu.uuid
        if vgpu.type_name:
            status["configureVGPUTypeName"] = vgpu.type_name
    if available:
        status["availableTypes"] = available
    return status
