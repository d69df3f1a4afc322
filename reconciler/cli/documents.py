"""Desired-state documents written by vgpuctl itself: ``export`` and the copy in a saved plan.

Both are plain desired-state files (``schemas/desired-state.schema.json``), so they go back in
through the same loader and validation as a file a person wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.catalog import Catalog
from reconciler.model import (
    UNKNOWN_TYPE,
    DesiredNode,
    Gpu,
    Inventory,
    PciAddress,
    ValidationError,
    VgpuMode,
)

API_VERSION = "vgpu.reconciler.dev/v1alpha1"
KIND = "VGPUDesiredState"


def _document(name: str, nodes: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"nodes": dict(nodes)},
    }


def node_document(node: DesiredNode) -> dict[str, Any]:
    """A one-node desired-state document equal, once loaded, to ``node``."""
    gpus = []
    for g in node.gpus:
        entry: dict[str, Any] = {"address": str(g.address)}
        if g.model:
            entry["model"] = g.model
        entry["sriov"] = "enabled" if g.sriov else "disabled"
        if g.mode is not VgpuMode.EQUAL_SIZE:
            entry["mode"] = g.mode.value
        if g.vgpus is not None:
            entry["vgpus"] = {
                (str(k) if isinstance(k, PciAddress) else k): v for k, v in g.vgpus.items()
            }
        if g.profiles is not None:
            entry["profiles"] = dict(g.profiles)
        gpus.append(entry)
    doc = _document(node.name, {node.name: {"gpus": gpus}})
    if node.max_parallel is not None:
        # The node agents' fleet budget it was planned under: a saved plan applied later
        # takes a rollout slot as the files would have it do.
        doc["spec"]["rollout"] = {"maxParallel": node.max_parallel}
    return doc


def export_document(inventory: Inventory, *, name: str) -> dict[str, Any]:
    """What the host has now, as a desired state that plans to no changes. GPUs vgpuctl must
    leave alone or cannot read fully are left out (:func:`unexportable` says why)."""
    gpus = []
    for g in inventory.gpus:
        if unexportable(g) is not None:
            continue
        entry: dict[str, Any] = {"address": str(g.address)}
        if g.model:
            entry["model"] = g.model
        entry["sriov"] = "enabled" if g.sriov_enabled else "disabled"
        if g.sriov_enabled and g.vgpu_mode is VgpuMode.MIXED_SIZE:
            entry["mode"] = VgpuMode.MIXED_SIZE.value
        if g.sriov_enabled:
            entry["vgpus"] = {str(v.address): v.vgpu.type_name for v in g.vfs if v.vgpu}
        gpus.append(entry)
    return _document(name, {inventory.node: {"gpus": gpus}})


def unexportable(gpu: Gpu) -> str | None:
    """Why ``export`` leaves a GPU out: one vgpuctl must leave alone (passed through whole, no
    vGPU VFs), one whose vGPUs it cannot drive now (no interface, a vfio type it cannot name),
    or one in the middle of a change (a removal under way, a vGPU whose type it cannot read).
    An empty layout would be a lie there."""
    from reconciler.plan.guard import hands_off, not_drivable

    reason = hands_off(gpu) or not_drivable(gpu)
    if reason is not None:
        return reason
    for vf in gpu.vfs:
        if vf.vgpu is not None and (vf.vgpu.removing or vf.vgpu.type_name == UNKNOWN_TYPE):
            return (
                f"GPU {gpu.address}: the vGPU on VF {vf.address} is being removed, or its type "
                "is unknown"
            )
    return None


def node_from_document(doc: object, catalog: Catalog, source: str) -> DesiredNode:
    """Load the desired state a saved plan carries, through the normal loader."""
    from reconciler.desired import load_document

    if not isinstance(doc, Mapping):
        raise ValidationError(f"{source}: the saved plan carries no desired state")
    desired = load_document(doc, source=source, catalog=catalog)
    if len(desired.nodes) != 1:
        raise ValidationError(f"{source}: the saved plan's desired state must name one node")
    node = desired.node(next(iter(desired.nodes)))
    if node is None:  # pragma: no cover - the node has its own entry
        raise ValidationError(f"{source}: the saved plan's desired state names no node")
    return node


def crd_objects(inventory: Inventory, catalog: Catalog) -> list[dict[str, Any]]:
    """The objects vgpuctl writes for the host as it is (its current vGPUs taken as the
    desired ones): Harvester's SRIOVGPUDevices and VGPUDevices, then the node's VGPUNodeState,
    its times those of now (a summary of the host as it is, nothing blocked or changed)."""
    from reconciler.apply.cluster import utc_now
    from reconciler.model.nodestate import stamped
    from reconciler.plan import render_objects
    from reconciler.plan.nodestate import settled_node_state

    node = inventory.node
    source = f"{node} (observed)"
    desired = node_from_document(export_document(inventory, name=node), catalog, source)
    objects = [o.to_json() for o in render_objects(node, desired, inventory)]
    summary = settled_node_state(node, desired, inventory).to_json()
    summary["status"] = stamped(summary["status"], utc_now())
    return [*objects, summary]
