"""Observe the cluster side of a node: our CRs, the KubeVirt allow-list, and who uses which vGPU.

Reads go through the :class:`~reconciler.model.clusterapi.ClusterApi` port (never the
``kubernetes`` package), so tests run the same code against fakes or the API-server emulator.
Each reader is a list call plus a pure interpretation of its items:

- The node's own SRIOVGPUDevices and VGPUDevices (label ``nodename``: a selected list, so a
  node reads only its own however large the fleet).
- Every VGPUNodeState (one object per node): this node's, and from the other nodes' the
  profiles configured elsewhere and on which kind of GPU (a KubeVirt allow-list entry stays
  while any node has its profile on that kind). Each node's token writes its own summary, and
  what they say goes into the KubeVirt CR, so a profile name or VF device id is checked first
  as vgpuctl checks its own host's (a type name that can be a resource name, four hex digits):
  one that fails is left out with a note naming the object and field, the rest is used.
- The KubeVirt CR, wherever it lives (``harvester-system`` on Harvester, ``kubevirt``
  upstream), unless a namespace is pinned; read *before* the VGPUNodeStates, and the time
  taken between the two (``ClusterState.observed_at``, an injected clock, no later than the
  summaries are read): a retiring mark the CR shows was written before it, and is judged
  against it (``model.retiring``; docs/architecture.md, "The KubeVirt allow-list").
- VMIs on the node and the kubelet's device-plugin checkpoint, joined by pod UID (a VMI's
  ``status.activePods`` maps its launcher pods' UIDs to their nodes, KubeVirt's
  ``VirtualMachineInstanceStatus.ActivePods``): which vGPU (device ID) a VM was given. Pods
  are never read: the agent needs no access to them.

Errors propagate: host actions must never run on the strength of cluster data that could not
be read, so an unreachable server or an RBAC denial is the caller's to report. Only absences
that are normal are notes: KubeVirt not installed, no KubeVirt CR, no checkpoint file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import MappingProxyType
from typing import Any

from reconciler.model import (
    ClusterError,
    Interface,
    Inventory,
    ObserveError,
    PciAddress,
    ResourceMissingError,
    TypeNames,
)
from reconciler.model.background import in_background
from reconciler.model.cluster import (
    GROUP_VERSIONS,
    KUBEVIRT_GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    KUBEVIRT_OWNED_PCI_ANNOTATION,
    KUBEVIRT_PLURAL,
    KUBEVIRT_VERSION,
    NODE_LABEL,
    NODE_STATE_KIND,
    PLURALS,
    SRIOV_GPU_KIND,
    VGPU_KIND,
    ClusterState,
    ConfiguredProfile,
    DeviceUse,
    KubeObject,
    KubeVirtConfig,
    is_pci_device_id,
    is_type_name,
)
from reconciler.model.clusterapi import ClusterApi, list_each
from reconciler.model.clustertext import ClusterTextError, bounded_text
from reconciler.model.errors import excerpt
from reconciler.model.nodestate import configured_profiles
from reconciler.model.record import field, record
from reconciler.model.retiring import KUBEVIRT_RETIRING_ANNOTATION as _RETIRING
from reconciler.model.retiring import parse_marks, rfc3339
from reconciler.observe.checkpoint import CheckpointEntry, checkpoint_file, read_checkpoint
from reconciler.observe.parse import parse_type_name

VMI_PLURAL = "virtualmachineinstances"
#: Label KubeVirt puts on a VMI once it is scheduled.
VMI_NODE_LABEL = "kubevirt.io/nodeName"
#: Only resources of this prefix are vGPUs (the checkpoint also lists kvm, tun, …).
VGPU_RESOURCE_PREFIX = "nvidia.com/"
#: Phases after which a VMI holds nothing. Every other phase (Pending, Scheduling,
#: Scheduled, Running, Unknown: node unreachable, the VM may well still run) counts as
#: holding its devices: wrongly calling a vGPU free could destroy a running VM's device.
FINAL_PHASES = frozenset({"Succeeded", "Failed"})


class NoNodeStateError(ObserveError):
    """A node has no VGPUNodeState: vgpuctl has not reconciled it, or the cluster has no such
    node (the CLI tells the two apart by the cluster's Nodes)."""


def observe_cluster(
    api: ClusterApi,
    *,
    node: str,
    kubevirt_namespace: str | None = None,
    kubelet_dir: Path | None = None,
    clock: Callable[[], float] = time.time,
) -> ClusterState:
    """Everything the cluster says about ``node``'s vGPUs.

    The KubeVirt CR is read before the VGPUNodeStates, and ``clock`` (seconds since the
    epoch) between the two: ``ClusterState.observed_at``, a time no later than the summaries
    were read (a retiring mark is judged against it: the safe side).

    ``kubelet_dir`` (the node's ``/var/lib/kubelet``) enables the checkpoint join; without it
    every vGPU resource a VM on the node requests counts as possibly in use
    (``vmi_resources``). An allocation of a pod no VMI of the node names (another workload,
    a launcher whose VMI is gone, a migration target) holds its vGPU as ``pod <uid>``.

    Raises the port's :class:`~reconciler.model.ClusterError` subclasses (unreachable,
    forbidden, our CRDs missing: ``ResourceMissingError``) and :class:`ObserveError` (several
    KubeVirt CRs and none pinned; a malformed checkpoint).
    """
    selector = f"{NODE_LABEL}={node}"
    sriov = _our_objects(api, SRIOV_GPU_KIND, label_selector=selector)
    vgpus = _our_objects(api, VGPU_KIND, label_selector=selector)
    # The KubeVirt CR, then the time, then the summaries: a retiring mark the CR shows was
    # written before that time, and the summaries are read no earlier than it, which is what
    # the mark is judged against (model.retiring; docs/architecture.md, "The KubeVirt
    # allow-list").
    kubevirt, notes = _kubevirt(api, kubevirt_namespace)
    observed_at = rfc3339(clock())
    states = _our_objects(api, NODE_STATE_KIND)
    vmis = _vmis(api, label_selector=f"{VMI_NODE_LABEL}={node}")
    entries: list[CheckpointEntry] | None = None
    if kubelet_dir is not None:
        entries = read_checkpoint(kubelet_dir)
        if entries is None:
            notes.append(
                f"no kubelet device-plugin checkpoint at {checkpoint_file(kubelet_dir)}: "
                "no vGPU is allocated to a pod"
            )
    uses = _node_uses(vmis, entries, node=node)
    elsewhere = profiles_elsewhere(states, node=node, refused=notes)
    return ClusterState(
        node=node,
        sriov_gpu_devices={o.name: o for o in sriov if _node_of(o) == node},
        vgpu_devices={o.name: o for o in vgpus if _node_of(o) == node},
        node_state=_own_state(states, node),
        profiles_elsewhere=elsewhere,
        kubevirt=kubevirt,
        device_uses=uses.device_uses,
        vmi_resources=uses.vmi_resources,
        notes=tuple(notes),
        observed_at=observed_at,
    )


def observe_nodes_from_cluster(
    api: ClusterApi,
    nodes: Sequence[str],
    *,
    kubevirt_namespace: str | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, tuple[Inventory, ClusterState] | ObserveError]:
    """Cluster-only planning: each node's inventory from its VGPUNodeState and its Harvester
    objects, and its cluster state, from one list call per kind however many nodes, grouped by
    node once. A node that cannot be read so (no VGPUNodeState yet, a malformed one) maps to
    the error saying why (:class:`FleetReader`, whose reads begin when it is made).
    """
    return FleetReader(api, kubevirt_namespace=kubevirt_namespace, clock=clock).observe(nodes)


class FleetReader:
    """The reads of :func:`observe_nodes_from_cluster`, begun when the reader is made, so a
    caller may do its own work (read the desired state, which names the nodes) meanwhile.

    The VGPUDevices, a node's 256 objects of a fleet's 265 (``just bench``: 256,000 of
    265,000), are listed on a thread of their own; the other lists and their reading run on
    the caller's when it calls :meth:`observe`. Each page's answer is awaited with the
    interpreter's lock released, so the server's time on one list overlaps the caller's work
    and the other lists (1,000 nodes: a wait of about a second per list of VGPUDevices).
    Whatever the list raises, :meth:`observe` raises. A reader the caller gives up (its
    desired state invalid, say) is left to finish on its own: the thread holds nothing but the
    list, and does not keep the process alive.

    No node is visited, so no kubelet checkpoint is read: every vGPU resource a running VM
    requests counts as possibly in use on that VM's node.
    """

    def __init__(
        self,
        api: ClusterApi,
        *,
        kubevirt_namespace: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._kubevirt_namespace = kubevirt_namespace
        self._clock = clock
        self._vgpus: Future[list[KubeObject]] | None = in_background(
            lambda: _our_objects(api, VGPU_KIND), name="vgpuctl-list"
        )

    def observe(
        self, nodes: Sequence[str]
    ) -> dict[str, tuple[Inventory, ClusterState] | ObserveError]:
        """Each of ``nodes``' observation, or the error saying why it cannot be made."""
        api = self._api
        wanted = set(nodes)
        sriov = _by_node(_our_objects(api, SRIOV_GPU_KIND), wanted)
        # The KubeVirt CR, the time, then the summaries (as observe_cluster).
        kubevirt, notes = _kubevirt(api, self._kubevirt_namespace)
        observed_at = rfc3339(self._clock())
        all_states = _our_objects(api, NODE_STATE_KIND)
        states = {o.name: o for o in all_states if o.name in wanted and _node_of(o) == o.name}
        configured = {o.name: _configured(o, notes) for o in all_states if o.managed_by_us}
        vmis = _vmis(api)
        listed, self._vgpus = self._vgpus, None  # the reader lets the list go (once grouped)
        vgpus = _by_node(
            _our_objects(api, VGPU_KIND) if listed is None else listed.result(), wanted
        )
        del listed
        return _observations(
            nodes,
            sriov=sriov,
            vgpus=vgpus,
            states=states,
            configured=configured,
            kubevirt=kubevirt,
            notes=notes,
            vmis=vmis,
            observed_at=observed_at,
        )


def _observations(
    nodes: Sequence[str],
    *,
    sriov: Mapping[str, list[KubeObject]],
    vgpus: Mapping[str, list[KubeObject]],
    states: Mapping[str, KubeObject],
    configured: Mapping[str, frozenset[ConfiguredProfile]],
    kubevirt: KubeVirtConfig | None,
    notes: list[str],
    vmis: Sequence[Mapping[str, Any]],
    observed_at: str = "",
) -> dict[str, tuple[Inventory, ClusterState] | ObserveError]:
    """Each node's inventory and cluster state from the fleet's objects, grouped (pure)."""
    wanted = set(nodes)
    vmis_by_node: dict[str, list[Mapping[str, Any]]] = {}
    for vmi in vmis:
        where = _labels(vmi).get(VMI_NODE_LABEL, "")
        if where in wanted:
            vmis_by_node.setdefault(where, []).append(vmi)
    notes.append("kubelet checkpoints not read (cluster-only): VMs' vGPU resources count as in use")
    everywhere: dict[ConfiguredProfile, int] = {}  # profile → how many nodes have it configured
    for profiles in configured.values():
        for profile in profiles:
            everywhere[profile] = everywhere.get(profile, 0) + 1
    out: dict[str, tuple[Inventory, ClusterState] | ObserveError] = {}
    for node in nodes:
        mine = configured.get(node, frozenset())
        elsewhere = frozenset(p for p, n in everywhere.items() if n > (p in mine))
        own_sriov, own_vgpus = sriov.get(node, []), vgpus.get(node, [])
        uses = _node_uses(vmis_by_node.get(node, []), None, node=node)
        state = ClusterState(
            node=node,
            sriov_gpu_devices={o.name: o for o in own_sriov},
            vgpu_devices={o.name: o for o in own_vgpus},
            node_state=states.get(node),
            profiles_elsewhere=elsewhere,
            kubevirt=kubevirt,
            device_uses=uses.device_uses,
            vmi_resources=uses.vmi_resources,
            notes=tuple(notes),
            observed_at=observed_at,
        )
        try:
            inventory = inventory_from_cluster(node, states.get(node), own_sriov, own_vgpus)
        except ObserveError as e:
            out[node] = e
            continue
        out[node] = (inventory, state)
    return out


def _by_node(objects: Iterable[KubeObject], wanted: set[str]) -> dict[str, list[KubeObject]]:
    """``objects`` grouped by their ``nodename`` label, the wanted nodes' only: one pass."""
    out: dict[str, list[KubeObject]] = {}
    for o in objects:
        where = _node_of(o)
        if where in wanted:
            out.setdefault(where, []).append(o)
    return out


# -- our CRs ------------------------------------------------------------------------------------


def _our_objects(api: ClusterApi, kind: str, *, label_selector: str = "") -> list[KubeObject]:
    """Every object of ``kind`` (of ``label_selector``), each made a record as soon as its
    page is read (:func:`~reconciler.model.clusterapi.list_each`, :class:`_Records`)."""
    group, version = GROUP_VERSIONS[kind]
    return list_each(
        api,
        _Records(kind),
        group=group,
        version=version,
        plural=PLURALS[kind],
        label_selector=label_selector,
    )


class _Records:
    """The records of one list's items, their repeated label sets held once. A fleet's objects
    repeat much of what they hold: each GPU's 32 VGPUDevices have the same labels; a label set
    whose values are all texts is shared as one read-only view (equal values, so nothing read
    differs; anything else, a hostile value of another type, is kept as read). The table
    lives as long as the list is read. Sharing equal short texts too (node names, addresses,
    type names) took peak memory of a 1,000-node plan from 515 to 411 MiB but made it 18 %
    slower, which this item's "no slower than today" rules out (docs/performance.md)."""

    __slots__ = ("_kind", "_labels")

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._labels: dict[tuple[tuple[str, Any], ...], Mapping[str, Any]] = {}

    def __call__(self, item: dict[str, Any]) -> KubeObject:
        # The item is ours (decoded for this call): kept, not copied. List items normally
        # carry their kind; the reader's is the one (a string shared by every record).
        item["kind"] = self._kind
        meta = item.get("metadata")
        if type(meta) is dict:
            labels = meta.get("labels")
            if type(labels) is dict and labels:
                meta["labels"] = self._label_set(labels)
        return KubeObject.from_json(item, take=True)

    def _label_set(self, labels: dict[str, Any]) -> Mapping[str, Any]:
        key = tuple(labels.items())
        try:
            shared = self._labels.get(key)
        except TypeError:  # a value that is no label's (a list, an object): not shared
            return labels
        if shared is None:
            # Equal to a shared set means its values are texts too (a text equals only texts).
            if not all(type(v) is str for v in labels.values()):
                return labels
            shared = self._labels[key] = MappingProxyType(labels)
        return shared


def _node_of(obj: KubeObject) -> str:
    return obj.labels.get(NODE_LABEL, "")


def profiles_elsewhere(
    node_states: Iterable[KubeObject], *, node: str, refused: list[str] | None = None
) -> frozenset[ConfiguredProfile]:
    """Profiles the VGPUNodeStates of the other nodes (vgpuctl's) show configured, each on the
    kind of GPU it is configured on. What fails vgpuctl's checks is left out, a line saying so
    appended to ``refused`` (see :func:`_configured`)."""
    out: set[ConfiguredProfile] = set()
    for o in node_states:
        if o.managed_by_us and o.name != node:
            out |= _configured(o, refused)
    return frozenset(out)


def _configured(
    state: KubeObject, refused: list[str] | None = None
) -> frozenset[ConfiguredProfile]:
    """The profiles a node's VGPUNodeState shows configured, on the kind of GPU of its status
    ``gpus`` entry (``interface``, ``sriov.vfDevice``): the GPUs whose VFs hold its vGPUs
    (``vgpus[].vf`` in their ``vfAddresses``), else (wanted, none made yet) the managed GPUs
    whose types offer it. A GPU entry of an older vgpuctl (no ``interface``), one not found,
    or a malformed one counts as mdev; so does a profile no GPU can be found for.

    The summary is written by that node's token, and its names and device ids end up in the
    KubeVirt CR: a profile name that fails vgpuctl's name check is left out, a VF device id
    that is not four hex digits counts as not known (no pciHostDevices entry is written from
    it), each with a line in ``refused`` naming the object and the field."""
    names = configured_profiles(state.status)
    if not names:
        return frozenset()
    status = state.status
    bad = sorted(n for n in names if not is_type_name(n))
    if bad:
        names = names.difference(bad)
        if refused is not None:
            refused.extend(_refused_names(state, bad))
        if not names:
            return frozenset()
    gpus = [g for g in _listed(status.get("gpus")) if isinstance(g, Mapping)]
    type_sets = _listed(status.get("typeSets"))
    vgpus = [
        v
        for v in _listed(status.get("vgpus"))
        if isinstance(v, Mapping) and isinstance(v.get("profile"), str)
    ]
    vgpu_vfs = {str(v.get("vf", "")) for v in vgpus}
    kinds: dict[str, tuple[Interface, str]] = {}  # GPU address → its interface, VF device id
    gpu_of_vf: dict[str, str] = {}  # the vGPUs' VFs only (a node has far more VFs than vGPUs)
    offered: dict[str, set[str]] = {}  # profile → managed GPUs offering it
    for i, g in enumerate(gpus):
        address = str(g.get("address", ""))
        kinds[address] = _kind_of(g, state.name, i, refused)
        if vgpu_vfs:
            for vf in vgpu_vfs.intersection(map(str, _listed(g.get("vfAddresses")))):
                gpu_of_vf[vf] = address
        index = g.get("typeSet")
        if g.get("managed") is True and type(index) is int and 0 <= index < len(type_sets):
            for t in _listed(type_sets[index]):
                if isinstance(t, Mapping) and isinstance(t.get("name"), str):
                    offered.setdefault(t["name"], set()).add(address)
    held: dict[str, set[str]] = {}  # profile → GPUs holding its vGPUs
    for v in vgpus:
        gpu = gpu_of_vf.get(str(v.get("vf", "")), str(v.get("gpu", "")))
        held.setdefault(v["profile"], set()).add(gpu)
    out: set[ConfiguredProfile] = set()
    for name in names:
        where = held.get(name) or offered.get(name)
        if not where:
            out.add(ConfiguredProfile(name))
            continue
        for address in where:
            interface, vf_device = kinds.get(address, (Interface.MDEV, ""))
            out.add(ConfiguredProfile(name, interface, vf_device))
    return frozenset(out)


def _kind_of(
    gpu: Mapping[str, Any], state: str, index: int, refused: list[str] | None
) -> tuple[Interface, str]:
    """A summary's GPU entry's interface (vfio, or else mdev) and VFs' device id ("": not
    known; so is one that is not a PCI device id, which ``refused`` is told)."""
    if gpu.get("interface") != Interface.VFIO.value:
        return Interface.MDEV, ""
    sriov = gpu.get("sriov")
    device = sriov.get("vfDevice") if isinstance(sriov, Mapping) else None
    if not isinstance(device, str) or not device:
        return Interface.VFIO, ""
    if not is_pci_device_id(device):
        if refused is not None:
            refused.append(
                f"{_summary(state)}: status.gpus[{index}].sriov.vfDevice "
                f"'{excerpt(device)}' is not a PCI device id (four hex digits): refused, no "
                "pciHostDevices entry is written from it"
            )
        return Interface.VFIO, ""
    return Interface.VFIO, device


def _refused_names(state: KubeObject, bad: Sequence[str]) -> list[str]:
    """A line per profile name of ``state``'s status that fails vgpuctl's name check."""
    profiles = _listed(state.status.get("profiles"))
    lines = []
    for name in bad:
        index = next(
            i for i, e in enumerate(profiles) if isinstance(e, Mapping) and e.get("name") == name
        )
        lines.append(
            f"{_summary(state.name)}: status.profiles[{index}].name '{excerpt(name)}' is not a "
            "vGPU type name (vgpuctl's name check): refused, left out of the KubeVirt allow-list"
        )
    return lines


def _summary(name: str) -> str:
    return f"VGPUNodeState {excerpt(name)}"


def _listed(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def summary_type_names(api: ClusterApi, node: str) -> TypeNames:
    """(GPU, type id) → name of the vfio types ``node``'s VGPUNodeState shows: each vfio GPU
    entry of its status with its ``typeSets`` list (``{id, name}``). What the node's vgpuctl
    could name when it wrote the summary, for a node whose record of configured types is lost
    (docs/domain.md §3b). The object is untrusted input: an entry that is not a PCI address,
    a decimal id and a driver's type name is skipped. Empty when there is no summary or the
    cluster cannot be read (the types then stay unnamed, and their GPUs' changes blocked)."""
    group, version = GROUP_VERSIONS[NODE_STATE_KIND]
    try:
        raw = api.get_object(
            group=group, version=version, plural=PLURALS[NODE_STATE_KIND], name=node
        )
    except ClusterError:
        return {}
    if raw is None:
        return {}
    status = raw.get("status")
    if not isinstance(status, Mapping):
        return {}
    type_sets = _listed(status.get("typeSets"))
    out: dict[tuple[PciAddress, str], str] = {}
    for g in _listed(status.get("gpus")):
        if not isinstance(g, Mapping) or g.get("interface") != Interface.VFIO.value:
            continue
        index = g.get("typeSet")
        if type(index) is not int or not 0 <= index < len(type_sets):
            continue
        try:
            gpu = PciAddress.parse(str(g.get("address")))
        except ValueError:
            continue
        for t in _listed(type_sets[index]):
            if not isinstance(t, Mapping):
                continue
            type_id, name = t.get("id"), t.get("name")
            if not (isinstance(type_id, str) and type_id.isdigit() and len(type_id) <= 9):
                continue
            if not isinstance(name, str):
                continue
            try:
                out[(gpu, str(int(type_id)))] = parse_type_name(name)
            except ObserveError:
                continue
    return out


def _own_state(states: Iterable[KubeObject], node: str) -> KubeObject | None:
    """This node's VGPUNodeState (named after the node and labelled with it)."""
    for o in states:
        if o.name == node and _node_of(o) == node:
            return o
    return None


# -- KubeVirt ----------------------------------------------------------------------------------


def kubevirt_cr(api: ClusterApi, namespace: str | None) -> Mapping[str, Any] | None:
    """The one KubeVirt CR (in ``namespace``, else in any), as read; None when there is none.
    Raises :class:`ResourceMissingError` when KubeVirt is not installed (its kind not served)
    and :class:`ObserveError` naming them when there are several: which one rules is not
    known."""
    items = api.list_objects(
        group=KUBEVIRT_GROUP,
        version=KUBEVIRT_VERSION,
        plural=KUBEVIRT_PLURAL,
        namespace=namespace,
    )
    if len(items) > 1:
        names = ", ".join(sorted(_ns_name(i) for i in items))
        raise ObserveError(
            f"found {len(items)} KubeVirt CRs {_where(namespace)} ({names}): "
            "pass --kubevirt-namespace to choose one"
        )
    return items[0] if items else None


def _where(namespace: str | None) -> str:
    return f"in namespace {namespace}" if namespace else "in any namespace"


def _kubevirt(api: ClusterApi, namespace: str | None) -> tuple[KubeVirtConfig | None, list[str]]:
    """The KubeVirt CR's allow-list; ``None`` with a note when KubeVirt is absent."""
    try:
        cr = kubevirt_cr(api, namespace)
    except ResourceMissingError:
        return None, [
            "KubeVirt is not installed (kubevirts.kubevirt.io is not served): "
            "its mediated-device allow-list is not managed"
        ]
    if cr is None:
        return None, [
            f"no KubeVirt CR found {_where(namespace)}: its mediated-device allow-list is not "
            "managed"
        ]
    config = kubevirt_config(cr)
    try:
        parse_marks(((cr.get("metadata") or {}).get("annotations") or {}).get(_RETIRING))
    except ClusterTextError as e:
        return config, [
            f"KubeVirt CR {config.namespace}/{config.name}: annotation {_RETIRING} {e}: read as "
            "no retiring marks (no entry is removed before it is marked again)"
        ]
    return config, []


def kubevirt_config(raw: Mapping[str, Any]) -> KubeVirtConfig:
    """The allow-list and our ownership annotation of one KubeVirt CR (pure)."""
    meta = raw.get("metadata") or {}
    name = _ns_name(raw)
    spec = raw.get("spec") or {}
    permitted = ((spec.get("configuration") or {}).get("permittedHostDevices")) or {}
    annotations = meta.get("annotations") or {}
    return KubeVirtConfig(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        mediated_devices=_entries(permitted, "mediatedDevices", name),
        owned=_owned(annotations, KUBEVIRT_OWNED_ANNOTATION),
        pci_host_devices=_entries(permitted, "pciHostDevices", name),
        owned_pci=_owned(annotations, KUBEVIRT_OWNED_PCI_ANNOTATION),
        retiring=_marks(annotations),
    )


def _marks(annotations: Mapping[str, Any]) -> dict[str, str]:
    """The retiring marks (``model.retiring``); none when the annotation cannot be read."""
    try:
        return parse_marks(annotations.get(_RETIRING))
    except ClusterTextError:
        return {}


def _entries(permitted: object, key: str, name: str) -> tuple[dict[str, Any], ...]:
    """The allow-list ``key`` of ``permittedHostDevices``, its entries as stored."""
    entries = permitted.get(key) if isinstance(permitted, dict) else None
    if entries is None:
        entries = []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ObserveError(
            f"KubeVirt CR {name}: spec.configuration.permittedHostDevices.{key} "
            "is not a list of objects"
        )
    return tuple(dict(e) for e in entries)


def _owned(annotations: Mapping[str, Any], key: str) -> frozenset[str]:
    """The comma-separated ownership annotation ``key``."""
    owned = str(annotations.get(key) or "")
    return frozenset(s.strip() for s in owned.split(",") if s.strip())


def _ns_name(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


# -- who uses which vGPU ------------------------------------------------------------------------


def _vmis(api: ClusterApi, *, label_selector: str = "") -> list[dict[str, Any]]:
    """VMIs in every phase: a finished one says which pods' allocations are stale."""
    try:
        return api.list_objects(
            group=KUBEVIRT_GROUP,
            version=KUBEVIRT_VERSION,
            plural=VMI_PLURAL,
            label_selector=label_selector,
        )
    except ResourceMissingError:
        return []  # no KubeVirt, no VMs (the KubeVirt note says so)


@record(frozen=True, slots=True)
class _Uses:
    device_uses: dict[str, DeviceUse] = field(default_factory=dict)
    #: VMI ``namespace/name`` → vGPU resources it requests whose devices are unknown.
    vmi_resources: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _node_uses(
    vmis: Sequence[Mapping[str, Any]],
    entries: Sequence[CheckpointEntry] | None,
    *,
    node: str,
) -> _Uses:
    """Join the VMIs and checkpoint entries of one node (pure).

    A VMI's ``status.activePods`` names its launcher pods (UID → node): their allocations
    are the VM's. KubeVirt lists every pod the VMI controls, finished ones too, until the pod
    is deleted: the pods of a finished VMI hold nothing (the kubelet drops a finished pod's
    entries only at its next allocation). Any other pod's allocation holds its vGPU.
    ``entries`` None means the checkpoint was not read: nothing is known by device ID, so
    every vGPU resource an active VM requests goes to ``vmi_resources``.
    """
    holder_of_pod: dict[str, str] = {}  # pod UID → "VM ns/name (pod uid)"
    finished_pods: set[str] = set()
    active = [v for v in vmis if _phase(v) not in FINAL_PHASES]
    for vmi in vmis:
        for uid in _active_pods(vmi):
            if _phase(vmi) in FINAL_PHASES:
                finished_pods.add(uid)
            else:
                holder_of_pod[uid] = f"VM {_ns_name(vmi)} (pod {uid})"
    finished_pods -= holder_of_pod.keys()  # a pod an active VMI still names holds

    device_uses: dict[str, DeviceUse] = {}
    allocated: set[tuple[str, str]] = set()  # (pod UID, resource) with a checkpoint entry
    for entry in entries or ():
        if not entry.resource_name.startswith(VGPU_RESOURCE_PREFIX):
            continue
        if entry.pod_uid in finished_pods:
            continue
        allocated.add((entry.pod_uid, entry.resource_name))
        holder = holder_of_pod.get(entry.pod_uid, f"pod {entry.pod_uid}")
        for device_id in entry.device_ids:
            device_uses.setdefault(
                device_id, DeviceUse(device_id, entry.resource_name, holder=holder)
            )

    unknown: dict[str, tuple[str, ...]] = {}  # VMI "namespace/name" → resources
    for vmi in active:
        here = [uid for uid, where in _active_pods(vmi).items() if where == node]
        missing = sorted(
            r for r in _vmi_resources(vmi) if not any((uid, r) in allocated for uid in here)
        )
        if missing:
            unknown[_ns_name(vmi)] = tuple(missing)
    return _Uses(device_uses=device_uses, vmi_resources=dict(sorted(unknown.items())))


def _active_pods(vmi: Mapping[str, Any]) -> dict[str, str]:
    """``status.activePods``: launcher pod UID → node name ("" not yet scheduled)."""
    pods = (vmi.get("status") or {}).get("activePods")
    if not isinstance(pods, Mapping):
        return {}
    return {str(uid): str(where or "") for uid, where in pods.items()}


def _vmi_resources(vmi: Mapping[str, Any]) -> set[str]:
    """vGPU resources a VMI asks for: ``spec.domain.devices.gpus[]`` and ``hostDevices[]``
    ``deviceName``s (what its launcher pod will request)."""
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    out = set()
    for key in ("gpus", "hostDevices"):
        for dev in devices.get(key) or ():
            name = dev.get("deviceName") if isinstance(dev, dict) else None
            if isinstance(name, str) and name.startswith(VGPU_RESOURCE_PREFIX):
                out.add(name)
    return out


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


# -- inventory from the cluster (cluster-only planning) -------------------------------------------


def inventory_from_cluster(
    node: str,
    node_state: KubeObject | None,
    sriov_objs: Sequence[KubeObject],
    vgpu_objs: Sequence[KubeObject],
) -> Inventory:
    """The node's host as vgpuctl last recorded it (pure): each GPU as its VGPUNodeState
    shows it (what it is, its SR-IOV state and vGPU types, its VFs' addresses, its vGPUs), each
    VF's creatable types from its VGPUDevice's ``status.availableTypes``.

    Raises :class:`ObserveError` naming the object and field when the node has no
    VGPUNodeState (vgpuctl has not reconciled it) or one is malformed, a text of it longer than
    :data:`MAX_STATUS_TEXT` characters included: that node is then not planned (the error is
    its line; its host is not known), and every other node is.
    """
    if node_state is None:
        raise NoNodeStateError(
            f"node {node} has no {NODE_STATE_KIND}: vgpuctl has not reconciled it yet, so the "
            "cluster does not say what its host has (run vgpuctl apply or watch on it)"
        )
    f = _Field(node_state)
    status = node_state.status
    # VF address → its creatable type names, sorted; the VFs of a GPU mostly list the same
    # types, and each distinct list is made once.
    creatable: dict[str, list[str]] = {}
    made: dict[tuple[str, ...], list[str]] = {}
    for o in vgpu_objs:
        if o.labels.get(NODE_LABEL) != node:
            continue
        available = o.status.get("availableTypes")
        key = tuple(available) if isinstance(available, dict | MappingProxyType) else ()
        names = made.get(key)
        if names is None:
            names = made[key] = sorted({str(k) for k in key})
        creatable[str(o.spec.get("address", ""))] = names
    vgpus: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(f.items(status, "vgpus", "status")):
        where = f"status.vgpus[{i}]"
        if not isinstance(raw, Mapping):
            raise f.fail(where, "is not an object")
        vf = f.address(raw.get("vf"), f"{where}.vf")
        vgpus[str(vf)] = {
            "vgpu": {
                "type": f.text(raw, "profile", where),
                "uuid": f.text(raw, "uuid", where),
                "holder": f.text(raw, "holder", where),
            },
            "inUse": raw.get("inUse") is True,
        }
    type_sets = f.items(status, "typeSets", "status")
    gpus = []
    for i, raw in enumerate(f.items(status, "gpus", "status")):
        where = f"status.gpus[{i}]"
        if not isinstance(raw, Mapping):
            raise f.fail(where, "is not an object")
        index = raw.get("typeSet")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(type_sets):
            raise f.fail(f"{where}.typeSet", f"is not an index of status.typeSets: {index!r}")
        vfs = []
        for j, text in enumerate(f.items(raw, "vfAddresses", where)):
            address = str(f.address(text, f"{where}.vfAddresses[{j}]"))
            vgpu = vgpus.get(address)
            vfs.append(
                {
                    "address": address,
                    "index": j,
                    "creatableTypes": creatable.get(address, _NONE),
                    "vgpu": None if vgpu is None else vgpu["vgpu"],
                    "inUse": vgpu is not None and vgpu["inUse"],
                }
            )
        entry = {k: v for k, v in raw.items() if k not in _SUMMARY_ONLY}
        gpus.append({**entry, "vgpuTypes": type_sets[index], "vfs": vfs})
    try:
        inventory = Inventory.from_json({"node": node, "sysfsRoot": "", "gpus": gpus})
    except (KeyError, TypeError, ValueError) as e:
        raise f.fail("status.gpus", f"is malformed: {excerpt(repr(e), 200)}") from None
    return Inventory(
        node=node,
        gpus=tuple(sorted(inventory.gpus, key=lambda g: g.address)),
        sysfs_root="",
        notes=(f"observed from the cluster ({NODE_STATE_KIND} {node}): the host was not read",),
    )


_NONE: list[str] = []  # no creatable type (read only)
#: The longest text of a VGPUNodeState's status read (a holder: ``VM <namespace>/<name> (pod
#: <uid>)``, under 400 characters); its CRD bounds none.
MAX_STATUS_TEXT = 1024
#: Fields of a summary's GPU entry that are not the inventory's.
_SUMMARY_ONLY = frozenset({"managed", "vfAddresses", "typeSet"})


class _Field:
    """Typed reads of one object's status, failing with the object and field named."""

    def __init__(self, obj: KubeObject) -> None:
        self.obj = obj

    def fail(self, path: str, why: str) -> ObserveError:
        return ObserveError(f"{self.obj.kind} {self.obj.name}: {path} {why}")

    def address(self, value: object, path: str) -> PciAddress:
        # Quoted in the error bounded; a list or object by its type (never its repr).
        text = str(value) if isinstance(value, str | int | float) else type(value).__name__
        try:
            return PciAddress.parse(text)
        except ValueError:
            raise self.fail(path, f"is not a PCI address: {excerpt(text)!r}") from None

    def text(self, section: Mapping[str, Any], key: str, path: str) -> str:
        value = section.get(key)
        if value is None:
            return ""
        try:
            return bounded_text(value, limit=MAX_STATUS_TEXT)
        except ClusterTextError as e:
            raise self.fail(f"{path}.{key}", str(e)) from None

    def items(self, section: Mapping[str, Any], key: str, path: str) -> list[Any]:
        value = section.get(key)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise self.fail(f"{path}.{key}", "is not a list")
        return list(value)
