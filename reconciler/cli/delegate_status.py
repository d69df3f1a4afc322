"""``vgpuctl status --delegate harvester [NODE …]``: the nodes' vGPUs as Harvester's objects
show them (docs/delegate.md, "status"). Reads only; no desired state.

Per node, per GPU its ``SRIOVGPUDevice`` (spec ``enabled``; status ``vfAddresses``,
``vGPUDevices``), per VF its ``VGPUDevice``: the spec (``enabled``, ``vGPUTypeName``), what the
status says it hosts (``configureVGPUTypeName`` and ``uuid`` with ``vGPUStatus:
vGPUConfigured``: docs/domain.md §6, the truth), whether the spec is **pending** (asks what the
status does not show: ``HarvesterVf.pending``) and why, and which VM uses it. The objects are
read and checked by ``observe/delegate.py`` and ``observe/harvester_devices.py`` (an object that
fails its checks is left out, with a note naming it and the field).

How long a spec has been pending is not shown: pcidevices-controller (bdd8025) writes no Events,
no conditions and no time into the objects, and ``metadata.managedFields`` dates each writer's
last change of the object (of any field), which bounds the spec write but does not date it.

``-o json`` is the document of ``schemas/delegate-status.schema.json`` (:func:`status_document`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from reconciler.cli.commands import EXIT_OK, _err, _out, _style
from reconciler.cli.host import Host
from reconciler.cli.render import safe, table
from reconciler.model import UsageError
from reconciler.model.harvester import VGPU_CONFIGURED, HarvesterGpu, HarvesterNode, HarvesterVf
from reconciler.plan.delegate import ignored_change

#: ``formatVersion`` of the document (schemas/delegate-status.schema.json).
STATUS_FORMAT_VERSION = 1

#: A VF's ``state``: hosting what its status says, pending (the spec asks what the status
#: does not show), or free (disabled, hosting nothing).
HOSTING, PENDING, FREE = "hosting", "pending", "free"

COLUMNS = ("VF", "VGPUDEVICE", "SPEC", "HOSTS (STATUS)", "UUID", "STATE", "USED BY")


def pending_cause(vf: HarvesterVf) -> str:
    """Why ``vf``'s spec is pending ("" when it is not): what the spec asks, what the status
    shows, and what pcidevices-controller does about it (vgpu_controller.go ``OnVGPUChange``)."""
    if not vf.pending:
        return ""
    hosted = ignored_change(vf)
    if hosted:
        return (
            f"the spec asks {vf.type_name} over the {hosted} it hosts: pcidevices-controller "
            "ignores a type change on an enabled VGPUDevice (vgpuctl apply disables and enables "
            "it again, or sets the spec back when the profile it hosts is the desired one)"
        )
    if vf.enabled:
        return (
            f"the enable of {vf.type_name} is not carried out: pcidevices-controller retries a "
            "failed enable without writing a status (its log names the error)"
        )
    return (
        f"the disable is not carried out: the status still shows "
        f"{vf.configured_type or 'a vGPU'} configured"
    )


def _state(vf: HarvesterVf) -> str:
    if vf.pending:
        return PENDING
    return HOSTING if vf.hosts else FREE


def _vf_json(vf: HarvesterVf, index: int, used_by: str) -> dict[str, Any]:
    status: dict[str, Any] = {
        "vGPUStatus": VGPU_CONFIGURED if vf.configured else "",
        "configureVGPUTypeName": vf.configured_type,
        "uuid": vf.uuid,
        "availableTypes": sorted(vf.available),
    }
    return {
        "name": vf.name,
        "address": str(vf.address),
        "index": index,
        "spec": {"enabled": vf.enabled, "vGPUTypeName": vf.type_name},
        "status": status,
        "hosts": vf.hosts or None,
        "state": _state(vf),
        "pendingReason": pending_cause(vf) or None,
        "usedBy": used_by or None,
    }


def _gpu_json(gpu: HarvesterGpu, observed: HarvesterNode) -> dict[str, Any]:
    vfs = observed.vfs_of(gpu.address)
    return {
        "name": gpu.name,
        "address": str(gpu.address),
        "spec": {"enabled": gpu.enabled},
        "status": {
            "vfAddresses": [str(a) for a in gpu.vf_addresses],
            "vGPUDevices": list(gpu.vgpu_devices),
        },
        "vfs": [_vf_json(v, i, observed.used_by.get(v.name, "")) for i, v in enumerate(vfs)],
    }


def node_json(observed: HarvesterNode) -> dict[str, Any]:
    """One node of the document. A VF whose parent GPU has no object here is listed under a
    GPU entry of its own (``name`` null): nothing the objects say is left out."""
    gpus = [_gpu_json(g, observed) for g in observed.gpus]
    known = {g.address for g in observed.gpus}
    for parent in sorted({v.parent for v in observed.vfs} - known):
        vfs = observed.vfs_of(parent)
        gpus.append(
            {
                "name": None,
                "address": str(parent),
                "spec": None,
                "status": None,
                "vfs": [
                    _vf_json(v, i, observed.used_by.get(v.name, "")) for i, v in enumerate(vfs)
                ],
            }
        )
    rows = [v for g in gpus for v in g["vfs"]]
    return {
        "node": observed.node,
        "gpus": gpus,
        "summary": {
            "gpus": len(observed.gpus),
            "vfs": len(rows),
            HOSTING: sum(v["state"] == HOSTING for v in rows),
            PENDING: sum(v["state"] == PENDING for v in rows),
            "inUse": sum(v["usedBy"] is not None for v in rows),
        },
        "notes": [*observed.notes, *observed.unread_holders],
    }


def status_document(nodes: Sequence[HarvesterNode]) -> dict[str, Any]:
    """``status --delegate harvester -o json``: every node in name order."""
    return {
        "formatVersion": STATUS_FORMAT_VERSION,
        "observed": "harvester",
        "nodes": [node_json(n) for n in sorted(nodes, key=lambda n: n.node)],
    }


def _shown(text: str | None) -> str:
    return text or "-"


def node_text(doc: dict[str, Any]) -> str:
    """One node of the document as text: a line per GPU, a table of its VFs, then each
    pending VF's cause. Every value escaped (``render.table``/``safe``)."""
    out: list[str] = []
    for gpu in doc["gpus"]:
        if gpu["name"] is None:
            out.append(f"GPU {safe(gpu['address'])}: no SRIOVGPUDevice object")
        else:
            status = gpu["status"]
            out.append(
                f"GPU {safe(gpu['address'])}  SRIOVGPUDevice {safe(gpu['name'])}  spec.enabled: "
                f"{str(gpu['spec']['enabled']).lower()}  status: "
                f"{len(status['vfAddresses'])} VFs, {len(status['vGPUDevices'])} VGPUDevices"
            )
        rows = [
            (
                v["address"],
                v["name"],
                (v["spec"]["vGPUTypeName"] or "(no type)") if v["spec"]["enabled"] else "disabled",
                _shown(v["hosts"]),
                _shown(v["status"]["uuid"]),
                v["state"].upper() if v["state"] == PENDING else v["state"],
                _shown(v["usedBy"]),
            )
            for v in gpu["vfs"]
        ]
        if rows:
            out.append(table(COLUMNS, rows).rstrip("\n"))
        for v in gpu["vfs"]:
            if v["pendingReason"]:
                out.append(f"  PENDING {safe(v['name'])}: {safe(v['pendingReason'])}")
    s = doc["summary"]
    out.append(
        f"{s['gpus']} GPU{'s' * (s['gpus'] != 1)}, {s['vfs']} VF{'s' * (s['vfs'] != 1)}: "
        f"{s[HOSTING]} hosting, {s[PENDING]} pending (spec not carried out), {s['inUse']} in use"
    )
    return "\n".join(out) + "\n"


def cmd_status_delegate(ns: argparse.Namespace, host: Host) -> int:
    from reconciler.observe.delegate import observe_harvester_nodes

    if ns.output == "crds":
        raise UsageError(
            "-o crds prints the objects vgpuctl writes for this node's host (node-local mode); "
            "in delegate mode the objects are Harvester's: -o json, or kubectl get vgpudevices"
        )
    api = host.cluster_api
    if api is None:  # delegating() checked
        raise UsageError("delegate mode needs a cluster: pass --kubeconfig")
    named = list(dict.fromkeys(ns.nodes)) or None
    observed = observe_harvester_nodes(api, named)
    doc = status_document(list(observed.values()))
    if ns.output == "json":
        _out(json.dumps(doc, indent=2) + "\n")
        return EXIT_OK
    if ns.output == "yaml":
        import yaml

        _out(yaml.safe_dump(doc, sort_keys=False))
        return EXIT_OK
    if not doc["nodes"]:
        _err("No SRIOVGPUDevice or VGPUDevice object in the cluster: pcidevices-controller has "
             "found no SR-IOV GPU on any node.")  # fmt: skip
        return EXIT_OK
    style = _style(host.options)
    for node in doc["nodes"]:
        _out(style.bold(f"=== node {safe(node['node'])} (Harvester's objects) ===") + "\n")
        if not node["gpus"]:
            _out("no SRIOVGPUDevice or VGPUDevice object on this node\n")
        else:
            _out(node_text(node))
        for note in node["notes"]:
            _err(f"note: node {safe(node['node'])}: {safe(note)}")
    return EXIT_OK
