"""Delegate mode's observation: every node of the desired state, as Harvester's objects show it
(docs/delegate.md). Six lists for the whole cluster, whatever the number of nodes — the
``SRIOVGPUDevice``s, the ``VGPUDevice``s, KubeVirt's ``VirtualMachine``s and
``VirtualMachineInstance``s, Harvester's ``PCIDevice``s (to check a desired ``model``) and its
``MigConfiguration``s (which GPUs pcidevices-controller switched to MIG mode) —
grouped by node here; the values are read by
``harvester_devices`` (pure). Raises the port's ``ClusterError`` subclasses (unreachable,
forbidden, Harvester's CRDs missing), so nothing is planned on what could not be read.

Besides, one list of the NVIDIA driver pods in ``harvester-system`` (read by ``driver_pods``,
pure): a node whose pod is not ready has the steps that need pcidevices-controller's host work
blocked. That list alone may be refused (403: a role from before it) without failing anything:
each node then says so in a note.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.model import ForbiddenError, ResourceMissingError
from reconciler.model.cluster import (
    GROUP,
    KUBEVIRT_GROUP,
    KUBEVIRT_VERSION,
    NODE_LABEL,
    SRIOV_GPU_PLURAL,
    VERSION,
    VGPU_PLURAL,
)
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.harvester import DRIVER_LABEL, DRIVER_NAMESPACE, DriverPod, HarvesterNode
from reconciler.model.record import replace
from reconciler.observe.driver_pods import driver_pods
from reconciler.observe.harvester_devices import harvester_node

PCI_DEVICE_PLURAL = "pcidevices"
VM_PLURAL = "virtualmachines"
VMI_PLURAL = "virtualmachineinstances"
MIG_CONFIGURATION_PLURAL = "migconfigurations"


def observe_harvester_nodes(
    api: ClusterApi, nodes: Iterable[str] | None, *, label_selector: str = ""
) -> dict[str, HarvesterNode]:
    """Each of ``nodes`` as Harvester's objects show it (a node without objects is empty);
    ``None``: every node that has an ``SRIOVGPUDevice`` or a ``VGPUDevice`` (``status
    --delegate``). ``label_selector`` narrows the SRIOVGPUDevice and VGPUDevice lists
    (:func:`observe_harvester_node`)."""
    gpus = _by_node(
        api.list_objects(
            group=GROUP, version=VERSION, plural=SRIOV_GPU_PLURAL, label_selector=label_selector
        )
    )
    vfs = _by_node(
        api.list_objects(
            group=GROUP, version=VERSION, plural=VGPU_PLURAL, label_selector=label_selector
        )
    )
    wanted = sorted(set(nodes) if nodes is not None else {*gpus, *vfs})
    vms = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VM_PLURAL)
    vmis = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VMI_PLURAL)
    devices = _pci_devices(api)
    migs = _mig_configurations(api)
    found = {
        node: harvester_node(
            node,
            gpus.get(node, ()),
            vfs.get(node, ()),
            vms=vms,
            vmis=vmis,
            pci_devices=devices.get(node, ()),
            mig_configurations=migs,
        )
        for node in wanted
    }
    return _with_driver_pods(api, found)


def observe_harvester_node(api: ClusterApi, node: str) -> HarvesterNode:
    """``node`` alone, as a rollout's worker plans it again after each of its rounds: its
    SRIOVGPUDevices and VGPUDevices listed by the ``nodename`` label pcidevices-controller puts
    on both (pkg/util/gpuhelper/gpuhelper.go ``generateSRIOVGPUDevice``,
    ``generateVGPUDevice``), so a round of one node does not read every node's objects; the
    other lists as :func:`observe_harvester_nodes`."""
    return observe_harvester_nodes(api, [node], label_selector=f"{NODE_LABEL}={node}")[node]


def devices_in_use(api: ClusterApi, node: str) -> Mapping[str, str]:
    """Who uses each ``VGPUDevice`` of ``node`` now: three lists (its VGPUDevices by label, the
    VMs, the VMIs), read right before a disable, not the whole observation."""
    vfs = api.list_objects(
        group=GROUP, version=VERSION, plural=VGPU_PLURAL, label_selector=f"{NODE_LABEL}={node}"
    )
    vms = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VM_PLURAL)
    vmis = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VMI_PLURAL)
    return harvester_node(node, (), vfs, vms=vms, vmis=vmis).used_by


def _pci_devices(api: ClusterApi) -> dict[str, list[dict[str, Any]]]:
    """Harvester's ``PCIDevice`` objects by node (``status.nodeName``), read only to check a
    desired ``model``: where the resource is not served, none."""
    try:
        objects = api.list_objects(group=GROUP, version=VERSION, plural=PCI_DEVICE_PLURAL)
    except ResourceMissingError:
        return {}
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for obj in objects:
        status = obj.get("status")
        node = status.get("nodeName") if isinstance(status, Mapping) else None
        if isinstance(node, str) and node:
            out[node].append(obj)
    return out


def _mig_configurations(api: ClusterApi) -> list[dict[str, Any]]:
    """Harvester's ``MigConfiguration`` objects (cluster-scoped; pcidevices names each as its
    GPU's ``SRIOVGPUDevice``, with no ``nodename`` label): where the resource is not served
    (a Harvester before MIG support), none."""
    try:
        return api.list_objects(group=GROUP, version=VERSION, plural=MIG_CONFIGURATION_PLURAL)
    except ResourceMissingError:
        return []


def _by_node(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Objects by their ``nodename`` label (how pcidevices labels them); unlabelled ones are
    no node's."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for obj in objects:
        metadata = obj.get("metadata")
        labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
        node = labels.get(NODE_LABEL) if isinstance(labels, Mapping) else None
        if isinstance(node, str) and node:
            out[node].append(obj)
    return out


def driver_not_ready(api: ClusterApi, node: str) -> DriverPod | None:
    """``node``'s NVIDIA driver pod when it is not ready, read now (one list): what a wait that
    timed out blames. None when it is ready, absent or cannot be read."""
    try:
        pods = _list_driver_pods(api)
    except ForbiddenError:
        return None
    return driver_pods(pods, (node,))[node][0]


def _with_driver_pods(api: ClusterApi, found: dict[str, HarvesterNode]) -> dict[str, HarvesterNode]:
    """``found`` with each node's NVIDIA driver pod, when it is not ready (one list of the pods
    of ``harvester-system`` labelled ``app=nvidia-driver-daemonset``: pcidevices-controller's
    own choice, gpu_controller.go ``setupRemoteExecutor``). A list the role does not allow
    (403) blocks nothing: each node says so in a note and is planned as without a pod
    (deploy/harvester/rbac.yaml grants it; an older role may not). Any other failure is raised
    as the other lists' are."""
    if not found:
        return found
    try:
        pods = _list_driver_pods(api)
    except ForbiddenError as e:
        note = (
            f"the NVIDIA driver pods in {DRIVER_NAMESPACE} could not be read ({e.message}): "
            "steps are planned without knowing whether pcidevices-controller can carry them out "
            "(deploy/harvester/rbac.yaml grants the list)"
        )
        return {node: replace(h, driver_notes=(note,)) for node, h in found.items()}
    drivers = driver_pods(pods, found)
    return {
        node: replace(h, driver=drivers[node][0], driver_notes=drivers[node][1])
        for node, h in found.items()
    }


def _list_driver_pods(api: ClusterApi) -> list[dict[str, Any]]:
    return api.list_objects(
        group="",
        version="v1",
        plural="pods",
        namespace=DRIVER_NAMESPACE,
        label_selector=DRIVER_LABEL,
    )
