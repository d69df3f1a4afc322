"""``vgpuctl capacity``: per node and vGPU profile, what is configured, advertised, asked for,
held on the host without a pod and free; cluster totals; ``--require PROFILE=N`` (repeated)
asks whether one node can start a VM that needs them all (``--any-node``: each alone);
``--desired FILE`` answers as the cluster will be once that desired state has landed
(``observe/capacity.py`` says where each number comes from, ``plan/capacity.py`` the layout)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.cli.render import safe, table
from reconciler.model import ReconcilerError, UsageError

if TYPE_CHECKING:
    from reconciler.catalog import Catalog
    from reconciler.model import Desired
    from reconciler.model.clusterapi import ClusterApi
    from reconciler.observe.capacity import Capacity, Requirement

EXIT_OK, EXIT_ERROR, EXIT_SHORT = 0, 1, 2
COLUMNS = ("NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "HELD", "FREE")
#: ``nvidia.com/NVIDIA_A2-4Q=3``: an extended resource name (as the kubelet accepts it) and a
#: positive count.
_RESOURCE = re.compile(r"nvidia\.com/[A-Za-z0-9][-A-Za-z0-9_.]{0,62}")
#: ``A2-4Q``, ``NVIDIA A2-4Q``, ``GRID A100-4C``: a profile name as the desired state writes
#: one (at most 63 characters: schemas/desired-state.schema.json).
_PROFILE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_. ]{0,62}")
_COUNT = re.compile(r"[1-9][0-9]{0,5}")


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "capacity",
        help="how many vGPUs of each profile the cluster can still give, per node",
        description="Per node and vGPU resource: vGPUs configured (the node's VGPUNodeState, "
        "else its VGPUDevices), allocatable (the node's status), requested (pods bound to the "
        "node and not finished), held (on the host, by no pod: the node's VGPUNodeState), "
        "free = allocatable - requested - held; then the cluster's totals. A profile "
        "configured but not allocatable (its device plugin not registered) is warned of. "
        "Reads the cluster only (--kubeconfig, or the pod's service account).",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument(
        "--require",
        action="append",
        metavar="PROFILE=N",
        help="exit 0 when one node has N of PROFILE free (A2-4Q=3, NVIDIA A2-4Q=3 or "
        "nvidia.com/NVIDIA_A2-4Q=3), else 2, naming the best node and the shortfall. "
        "Repeated: all of them on one node at once (can a VM needing them all start?)",
    )
    p.add_argument(
        "--any-node",
        action="store_true",
        help="with several --require: check each alone (each may be met on another node)",
    )
    p.add_argument(
        "--desired",
        nargs="+",
        metavar="FILE",
        help="answer as the cluster will be once this desired state has landed: each node "
        "it names laid out as planned from the inventory its VGPUNodeState shows, every vGPU "
        "advertised, the pods as they are (nothing is written)",
    )
    p.set_defaults(handler=cmd_capacity)
    return p


def requirements(texts: Sequence[str], catalog: Catalog) -> list[Requirement]:
    """``--require`` values as requirements, one per resource (a resource named twice, in any
    spelling, asks for both counts together), in the order first named."""
    from reconciler.catalog import long_profile_name
    from reconciler.model.cluster import resource_name
    from reconciler.observe.capacity import Requirement

    counts: dict[str, int] = {}
    for text in texts:
        name, sep, count = text.rpartition("=")
        name = name.strip()
        if not sep or _COUNT.fullmatch(count) is None:
            raise UsageError(
                f"--require {text!r}: expected PROFILE=N (N from 1), as A2-4Q=3 or "
                "nvidia.com/NVIDIA_A2-4Q=3"
            )
        if _RESOURCE.fullmatch(name):
            resource = name
        elif _PROFILE.fullmatch(name):
            # Spelt as the desired state spells a profile (desired/normalise.py), then named as
            # its resource (docs/domain.md §7).
            resource = resource_name(catalog.spelled(name) or long_profile_name(name))
        else:
            raise UsageError(
                f"--require {text!r}: {name!r} is neither a vGPU profile name (as A2-4Q or "
                "NVIDIA A2-4Q, at most 63 characters) nor a resource (nvidia.com/…)"
            )
        counts[resource] = counts.get(resource, 0) + int(count)
    return [Requirement(r, n) for r, n in counts.items()]


def cmd_capacity(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.observe.capacity import check_each, check_jointly, observe_capacity

    host = Host(options)
    if ns.any_node and not ns.require:
        raise UsageError("--any-node says how several --require are checked: give --require")
    wanted = requirements(ns.require or (), host.catalog)
    desired = None
    if ns.desired:
        from reconciler.cli.commands import load

        desired = load(ns.desired, host)  # a bad file is said before the cluster is read
    api = host.cluster_api
    if api is None:
        raise UsageError("capacity reads the cluster: pass --kubeconfig")
    capacity = observe_capacity(api)
    errors: dict[str, ReconcilerError] = {}
    landing: list[str] = []
    if desired is not None:
        capacity, landing, errors = landed(desired, capacity, api, host)
    # A planned node's vGPUs are all advertised once landed: only the others can be warned of.
    warnings = [*capacity.unadvertised(), *landing]
    verdict = None
    if wanted:
        verdict = (check_each if ns.any_node else check_jointly)(capacity, wanted)
    if ns.output == "json":
        doc: dict[str, Any] = {
            "nodes": [
                {"node": n.node, "resources": [p.to_json() for p in n.profiles]}
                for n in capacity.nodes
            ],
            "totals": [p.to_json() for p in capacity.totals()],
            "notes": list(capacity.notes),
            "warnings": warnings,
        }
        if ns.desired:
            doc["desired"] = list(ns.desired)
            doc["errors"] = {n: e.lines() for n, e in errors.items()}
        if verdict is not None:
            doc["require"] = {
                "mode": "any-node" if ns.any_node else "joint",
                "satisfied": verdict.satisfied,
                "requirements": [f.to_json() for f in verdict.findings],
                "messages": list(verdict.messages),
            }
        print(json.dumps(doc, indent=2))
    else:
        rows = [
            (n.node, p.resource, str(p.configured), str(p.allocatable), str(p.requested),
             str(p.held), str(p.free))
            for n in capacity.nodes
            for p in n.profiles
        ]  # fmt: skip
        rows += [
            ("(cluster)", p.resource, str(p.configured), str(p.allocatable), str(p.requested),
             str(p.held), str(p.free))
            for p in capacity.totals()
        ]  # fmt: skip
        print(table(COLUMNS, rows), end="")
        for note in capacity.notes:
            print(f"note: {safe(note)}", file=sys.stderr)
        for warning in warnings:
            print(f"warning: {safe(warning)}", file=sys.stderr)
        for name, error in errors.items():
            for line in error.lines():
                print(f"error: node {safe(name)}: {safe(line)}", file=sys.stderr)
        for message in verdict.messages if verdict is not None else ():
            print(safe(message), file=sys.stderr)
    if errors:
        return EXIT_ERROR
    if verdict is None:
        return EXIT_OK
    return EXIT_OK if verdict.satisfied else EXIT_SHORT


def landed(
    desired: Desired, now: Capacity, api: ClusterApi, host: Host
) -> tuple[Capacity, list[str], dict[str, ReconcilerError]]:
    """``now`` as it will be once ``desired`` has landed, the warnings it
    gives, and the nodes it names that cannot be planned (the error saying why). Nothing is
    written.

    Each node the desired state names is planned as ``plan --observed cluster`` plans it
    (its inventory from its VGPUNodeState, its objects, the cluster's VMs): a node that cannot
    be is an error. Assumed once the change has landed: every vGPU of the planned layout exists
    (``plan/capacity.py``), the changes that wait now (a VM holds a vGPU they need gone)
    included, and the node's device plugin advertises each of them (allocatable = configured);
    the pods bound to the node ask what they ask now; a vGPU held on the host without a pod
    that the layout keeps is still held, one it removes was let go. A resource the node's
    vGPUs do not make (none configured now, none planned) keeps what the node advertises.
    Every other node is as it is now."""
    from reconciler.model.cluster import resource_name
    from reconciler.model.record import replace
    from reconciler.observe import FleetReader
    from reconciler.observe.capacity import NodeCapacity, ProfileCapacity, held_without_pod
    from reconciler.observe.nodes import all_node_labels
    from reconciler.plan.capacity import planned_vgpus
    from reconciler.plan.planner import plan_node

    reader = FleetReader(api, kubevirt_namespace=host.options.kubevirt_namespace)
    labels = all_node_labels(api) if desired.groups else {}
    names = desired.selected(labels)
    observed = reader.observe(names)
    errors: dict[str, ReconcilerError] = {}
    warnings: list[str] = []
    notes = list(now.notes)
    rows = {n.node: n for n in now.nodes}
    for name in names:
        seen = observed.get(name)
        if seen is None or isinstance(seen, ReconcilerError):
            errors[name] = seen or ReconcilerError(f"node {name} was not read")
            continue
        inventory, cluster = seen
        node = desired.node(name, labels.get(name, {}))
        try:
            plan = plan_node(node, inventory, catalog=host.catalog, cluster=cluster)
            layout = planned_vgpus(node, inventory, catalog=host.catalog)
        except ReconcilerError as exc:
            errors[name] = exc
            continue
        if plan.blocked:
            count = len(plan.blocked)
            notes.append(
                f"node {name}: {count} change{'s' * (count != 1)} of the plan wait now (see "
                "'vgpuctl plan --observed cluster'): counted as run"
            )
        configured: dict[str, int] = {}
        held: dict[str, int] = {}
        for vgpu in layout:
            key = resource_name(vgpu.type_name)
            configured[key] = configured.get(key, 0) + 1
            if vgpu.kept is not None and held_without_pod(vgpu.kept.in_use, vgpu.kept.holder):
                held[key] = held.get(key, 0) + 1
        before = {p.resource: p for p in rows[name].profiles} if name in rows else {}
        profiles = []
        for key in sorted(set(configured) | set(before)):
            was = before.get(key)
            requested = was.requested if was is not None else 0
            if key in configured:
                row = ProfileCapacity.of(
                    key, configured[key], configured[key], requested, held.get(key, 0)
                )
            elif was is not None and was.configured == 0:
                row = was  # not a resource of the node's vGPUs: advertised as it is
            else:
                row = ProfileCapacity.of(key, 0, 0, requested)
            if row.configured or row.allocatable or row.requested:
                profiles.append(row)
            if row.requested > row.allocatable:
                warnings.append(
                    f"node {name}: {row.requested} {key} requested by its pods but "
                    f"{row.allocatable} once the change has landed: it cannot land while "
                    "they keep them"
                )
        rows[name] = NodeCapacity(name, tuple(profiles))
    nodes = tuple(rows[n] for n in sorted(rows) if rows[n].profiles)
    return replace(now, nodes=nodes, notes=tuple(notes)), warnings, errors
