"""Delegate mode's observation: every node of the desired state, as Harvester's objects show it
(docs/delegate.md). Six lists for the whole cluster, whatever the number of nodes — the
``SRIOVGPUDevice``s, the ``VGPUDevice``s, KubeVirt's ``VirtualMachine``s and
``VirtualMachineInstance``s, Harvester's ``PCIDevice``s (to check a desired ``model``) and its
``MigConfiguration``s (which GPUs pcidevices-controller switched to MIG mode) —
grouped by node here; the values are read by
``harvester_devices`` (pure). Raises the port's ``ClusterError`` subclasses (unreachable,
forbidden, Harvester's CRDs missing), so nothing is planned on what could not be read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.model import ResourceMissingError
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
from reconciler.model.harvester import HarvesterNode
from reconciler.observe.harvester_devices import harvester_node

PCI_DEVICE_PLURAL = "pcidevices"
VM_PLURAL = "virtualmachines"
VMI_PLURAL = "virtualmachineinstances"
MIG_CONFIGURATION_PLURAL = "migconfigurations"


def observe_harvester_nodes(
    api: ClusterApi, nodes: Iterable[str] | None
) -> dict[str, HarvesterNode]:
    """Each of ``nodes`` as Harvester's objects show it (a node without objects is empty);
    ``None``: every node that has an ``SRIOVGPUDevice`` or a ``VGPUDevice`` (``status
    --delegate``)."""
    gpus = _by_node(api.list_objects(group=GROUP, version=VERSION, plural=SRIOV_GPU_PLURAL))
    vfs = _by_node(api.list_objects(group=GROUP, version=VERSION, plural=VGPU_PLURAL))
    wanted = sorted(set(nodes) if nodes is not None else {*gpus, *vfs})
    vms = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VM_PLURAL)
    vmis = api.list_objects(group=KUBEVIRT_GROUP, version=KUBEVIRT_VERSION, plural=VMI_PLURAL)
    devices = _pci_devices(api)
    migs = _mig_configurations(api)
    return {
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
