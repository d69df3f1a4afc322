"""Observe the cluster side of a node: our CRs, the KubeVirt allow-list, and who uses which vGPU.

Reads go through the :class:`~reconciler.model.clusterapi.ClusterApi` port (never the
``kubernetes`` package), so tests run the same code against fakes or the API-server emulator.
Each reader is a list call plus a pure interpretation of its items:

- SRIOVGPUDevice objects of the node (label ``nodename``), and every VGPUDevice in one list:
  the node's own objects plus, from other nodes' managed ones, which profiles are configured
  elsewhere (a KubeVirt allow-list entry stays while any node offers its profile). One
  unfiltered list is one request instead of two; the price is reading other nodes' objects,
  which the "elsewhere" question needs anyway.
- The KubeVirt CR, wherever it lives (``harvester-system`` on Harvester, ``kubevirt``
  upstream), unless a namespace is pinned.
- VMIs on the node and the kubelet's device-plugin checkpoint, joined by pod UID (a VMI's
  ``status.activePods`` maps its launcher pods' UIDs to their nodes, KubeVirt's
  ``VirtualMachineInstanceStatus.ActivePods``): which vGPU (device ID) a VM was given. Pods
  are never read: the agent needs no access to them.

Errors propagate: host actions must never run on the strength of cluster data that could not
be read, so an unreachable server or an RBAC denial is the caller's to report. Only absences
that are normal are notes: KubeVirt not installed, no KubeVirt CR, no checkpoint file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.model import (
    VGPU,
    Gpu,
    Interface,
    Inventory,
    ObserveError,
    PciAddress,
    ResourceMissingError,
    Vf,
    VGPUType,
)
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_GROUP,
    KUBEVIRT_OWNED_ANNOTATION,
    KUBEVIRT_PLURAL,
    KUBEVIRT_VERSION,
    NODE_LABEL,
    SRIOV_GPU_KIND,
    SRIOV_GPU_PLURAL,
    VERSION,
    VGPU_KIND,
    VGPU_PLURAL,
    ClusterState,
    DeviceUse,
    KubeObject,
    KubeVirtConfig,
    object_name,
)
from reconciler.model.clusterapi import ClusterApi
from reconciler.observe.checkpoint import CheckpointEntry, checkpoint_file, read_checkpoint

VMI_PLURAL = "virtualmachineinstances"
#: Label KubeVirt puts on a VMI once it is scheduled.
VMI_NODE_LABEL = "kubevirt.io/nodeName"
#: Only resources of this prefix are vGPUs (the checkpoint also lists kvm, tun, …).
VGPU_RESOURCE_PREFIX = "nvidia.com/"
#: Phases after which a VMI holds nothing. Every other phase (Pending, Scheduling,
#: Scheduled, Running, Unknown: node unreachable, the VM may well still run) counts as
#: holding its devices: wrongly calling a vGPU free could destroy a running VM's device.
FINAL_PHASES = frozenset({"Succeeded", "Failed"})


def observe_cluster(
    api: ClusterApi,
    *,
    node: str,
    kubevirt_namespace: str | None = None,
    kubelet_dir: Path | None = None,
) -> ClusterState:
    """Everything the cluster says about ``node``'s vGPUs.

    ``kubelet_dir`` (the node's ``/var/lib/kubelet``) enables the checkpoint join; without it
    every vGPU resource a VM on the node requests counts as possibly in use
    (``vmi_resources``). An allocation of a pod no VMI of the node names (another workload,
    a launcher whose VMI is gone, a migration target) holds its vGPU as ``pod <uid>``.

    Raises the port's :class:`~reconciler.model.ClusterError` subclasses (unreachable,
    forbidden, our CRDs missing: ``ResourceMissingError``) and :class:`ObserveError` (several
    KubeVirt CRs and none pinned; a malformed checkpoint).
    """
    sriov = _our_objects(api, SRIOV_GPU_KIND, label_selector=f"{NODE_LABEL}={node}")
    vgpus = _our_objects(api, VGPU_KIND)
    kubevirt, notes = _kubevirt(api, kubevirt_namespace)
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
    return ClusterState(
        node=node,
        sriov_gpu_devices={o.name: o for o in sriov if _node_of(o) == node},
        vgpu_devices={o.name: o for o in vgpus if _node_of(o) == node},
        profiles_elsewhere=profiles_elsewhere(vgpus, node=node),
        kubevirt=kubevirt,
        device_uses=uses.device_uses,
        vmi_resources=uses.vmi_resources,
        notes=tuple(notes),
    )


def observe_nodes_from_cluster(
    api: ClusterApi, nodes: Sequence[str], *, kubevirt_namespace: str | None = None
) -> dict[str, tuple[Inventory, ClusterState]]:
    """Cluster-only planning: each node's inventory from its CRs' status, and its cluster
    state, from one list call per kind however many nodes (grouped by label in code).

    No node is visited, so no kubelet checkpoint is read: every vGPU resource a running VM
    requests counts as possibly in use on that VM's node.
    """
    sriov = _our_objects(api, SRIOV_GPU_KIND)
    vgpus = _our_objects(api, VGPU_KIND)
    kubevirt, notes = _kubevirt(api, kubevirt_namespace)
    vmis = _vmis(api)
    wanted = set(nodes)
    vmis_by_node: dict[str, list[dict[str, Any]]] = {}
    for vmi in vmis:
        where = _labels(vmi).get(VMI_NODE_LABEL, "")
        if where in wanted:
            vmis_by_node.setdefault(where, []).append(vmi)
    notes.append("kubelet checkpoints not read (cluster-only): VMs' vGPU resources count as in use")
    out: dict[str, tuple[Inventory, ClusterState]] = {}
    for node in nodes:
        uses = _node_uses(vmis_by_node.get(node, []), None, node=node)
        state = ClusterState(
            node=node,
            sriov_gpu_devices={o.name: o for o in sriov if _node_of(o) == node},
            vgpu_devices={o.name: o for o in vgpus if _node_of(o) == node},
            profiles_elsewhere=profiles_elsewhere(vgpus, node=node),
            kubevirt=kubevirt,
            device_uses=uses.device_uses,
            vmi_resources=uses.vmi_resources,
            notes=tuple(notes),
        )
        out[node] = (inventory_from_crs(node, sriov, vgpus), state)
    return out


# -- our CRs ------------------------------------------------------------------------------------


def _our_objects(api: ClusterApi, kind: str, *, label_selector: str = "") -> list[KubeObject]:
    plural = SRIOV_GPU_PLURAL if kind == SRIOV_GPU_KIND else VGPU_PLURAL
    items = api.list_objects(
        group=GROUP, version=VERSION, plural=plural, label_selector=label_selector
    )
    objects = []
    for raw in items:
        obj = KubeObject.from_json(raw)
        if obj.kind != kind:  # list items normally carry their kind; make sure
            obj = KubeObject.from_json({**raw, "kind": kind})
        objects.append(obj)
    return objects


def _node_of(obj: KubeObject) -> str:
    return obj.labels.get(NODE_LABEL, "")


def profiles_elsewhere(vgpu_objects: Iterable[KubeObject], *, node: str) -> frozenset[str]:
    """Profiles configured (enabled, with a type) by managed VGPUDevices of other nodes."""
    return frozenset(
        str(o.spec.get("vGPUTypeName"))
        for o in vgpu_objects
        if o.managed_by_us
        and _node_of(o) != node
        and o.spec.get("enabled") is True
        and o.spec.get("vGPUTypeName")
    )


# -- KubeVirt ----------------------------------------------------------------------------------


def _kubevirt(api: ClusterApi, namespace: str | None) -> tuple[KubeVirtConfig | None, list[str]]:
    """The KubeVirt CR's allow-list; ``None`` with a note when KubeVirt is absent."""
    where = f"in namespace {namespace}" if namespace else "in any namespace"
    try:
        items = api.list_objects(
            group=KUBEVIRT_GROUP,
            version=KUBEVIRT_VERSION,
            plural=KUBEVIRT_PLURAL,
            namespace=namespace,
        )
    except ResourceMissingError:
        return None, [
            "KubeVirt is not installed (kubevirts.kubevirt.io is not served): "
            "its mediated-device allow-list is not managed"
        ]
    if not items:
        return None, [
            f"no KubeVirt CR found {where}: its mediated-device allow-list is not managed"
        ]
    if len(items) > 1:
        names = ", ".join(sorted(_ns_name(i) for i in items))
        raise ObserveError(
            f"found {len(items)} KubeVirt CRs {where} ({names}): "
            "pass --kubevirt-namespace to choose one"
        )
    return kubevirt_config(items[0]), []


def kubevirt_config(raw: Mapping[str, Any]) -> KubeVirtConfig:
    """The allow-list and our ownership annotation of one KubeVirt CR (pure)."""
    meta = raw.get("metadata") or {}
    name = _ns_name(raw)
    spec = raw.get("spec") or {}
    permitted = ((spec.get("configuration") or {}).get("permittedHostDevices")) or {}
    entries = permitted.get("mediatedDevices") if isinstance(permitted, dict) else None
    if entries is None:
        entries = []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ObserveError(
            f"KubeVirt CR {name}: spec.configuration.permittedHostDevices.mediatedDevices "
            "is not a list of objects"
        )
    owned = str((meta.get("annotations") or {}).get(KUBEVIRT_OWNED_ANNOTATION) or "")
    return KubeVirtConfig(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        mediated_devices=tuple(dict(e) for e in entries),
        owned=frozenset(s.strip() for s in owned.split(",") if s.strip()),
    )


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


@dataclass(frozen=True, slots=True)
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


# -- inventory from CR status (cluster-only planning) --------------------------------------------


def inventory_from_crs(
    node: str, sriov_objs: Sequence[KubeObject], vgpu_objs: Sequence[KubeObject]
) -> Inventory:
    """The node's host as its SRIOVGPUDevice / VGPUDevice status last recorded it (pure).

    Objects of other nodes are ignored. A GPU object without status (never observed) is a GPU
    whose SR-IOV state is unknown, taken as off. Raises :class:`ObserveError` naming the
    object and field when a status is malformed.
    """
    vgpus = {o.name: o for o in vgpu_objs if _node_of(o) == node}
    gpus = [_gpu_from_cr(o, vgpus, node) for o in sriov_objs if _node_of(o) == node]
    gpus.sort(key=lambda g: g.address)
    return Inventory(
        node=node,
        gpus=tuple(gpus),
        sysfs_root="",
        notes=("observed from SRIOVGPUDevice/VGPUDevice status: the host was not read",),
    )


class _Field:
    """Typed reads of one object's status, failing with the object and field named."""

    def __init__(self, obj: KubeObject) -> None:
        self.obj = obj

    def fail(self, path: str, why: str) -> ObserveError:
        return ObserveError(f"{self.obj.kind} {self.obj.name}: {path} {why}")

    def address(self, value: object, path: str) -> PciAddress:
        try:
            return PciAddress.parse(str(value))
        except ValueError:
            raise self.fail(path, f"is not a PCI address: {value!r}") from None

    def integer(self, section: Mapping[str, Any], key: str, path: str, default: int = 0) -> int:
        value = section.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{path}.{key}", f"is not an integer: {value!r}")
        return value

    def text(self, section: Mapping[str, Any], key: str, path: str) -> str:
        value = section.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(f"{path}.{key}", f"is not a string: {value!r}")
        return value

    def items(self, section: Mapping[str, Any], key: str, path: str) -> list[Any]:
        value = section.get(key)
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise self.fail(f"{path}.{key}", "is not a list")
        return list(value)


def _gpu_from_cr(obj: KubeObject, vgpus: Mapping[str, KubeObject], node: str) -> Gpu:
    f = _Field(obj)
    address = f.address(obj.spec.get("address"), "spec.address")
    status = obj.status
    if not status:
        return Gpu(address=address, vendor_id="10de", device_id="")
    try:
        interface = Interface(f.text(status, "interface", "status") or "none")
    except ValueError:
        raise f.fail(
            "status.interface", f"is not mdev, vfio or none: {status['interface']!r}"
        ) from None
    types = []
    for i, raw in enumerate(f.items(status, "vgpuTypes", "status")):
        try:
            types.append(VGPUType.from_json(raw))
        except (KeyError, TypeError, ValueError) as e:
            raise f.fail(f"status.vgpuTypes[{i}]", f"is malformed: {e!r}") from None
    vf_names = f.items(status, "vGPUDevices", "status")
    vfs = []
    for i, text in enumerate(f.items(status, "vfAddresses", "status")):
        vf_address = f.address(text, f"status.vfAddresses[{i}]")
        name = str(vf_names[i]) if i < len(vf_names) else object_name(node, str(vf_address))
        vfs.append(_vf_from_cr(vgpus.get(name), vf_address, i))
    model = status.get("model")
    return Gpu(
        address=address,
        vendor_id=f.text(status, "vendorId", "status") or "10de",
        device_id=f.text(status, "deviceId", "status"),
        subsystem_vendor_id=f.text(status, "subsystemVendorId", "status"),
        subsystem_device_id=f.text(status, "subsystemDeviceId", "status"),
        model=str(model) if model else None,
        interface=interface,
        driver=f.text(status, "driver", "status"),
        total_vfs=f.integer(status, "totalVFs", "status"),
        num_vfs=f.integer(status, "numVFs", "status"),
        vf_offset=f.integer(status, "vfOffset", "status"),
        vf_stride=f.integer(status, "vfStride", "status", default=1),
        vfs=tuple(vfs),
        types=tuple(types),
    )


def _vf_from_cr(obj: KubeObject | None, address: PciAddress, index: int) -> Vf:
    """A VF from its VGPUDevice status; without an object, a VF known only by address."""
    if obj is None or not obj.status:
        return Vf(address=address, index=index)
    f = _Field(obj)
    status = obj.status
    available = status.get("availableTypes") or {}
    if not isinstance(available, Mapping):
        raise f.fail("status.availableTypes", "is not a map of type name to id")
    uuid = f.text(status, "uuid", "status")
    vgpu = None
    if uuid:
        vgpu = VGPU(
            uuid=uuid,
            type_name=f.text(status, "configureVGPUTypeName", "status"),
            in_use=status.get("inUse") is True,
            holder=f.text(status, "holder", "status"),
        )
    return Vf(address=address, index=index, vgpu=vgpu, creatable=frozenset(map(str, available)))
