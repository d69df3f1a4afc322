"""``vgpuctl capacity``: per node and vGPU profile, what is configured, advertised, asked for and
free; cluster totals; ``--require RESOURCE=N`` asks whether one node can give N
(``observe/capacity.py`` says where each number comes from)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.cli.render import safe, table
from reconciler.model import UsageError

EXIT_OK, EXIT_SHORT = 0, 2
COLUMNS = ("NODE", "RESOURCE", "CONFIGURED", "ALLOCATABLE", "REQUESTED", "FREE")
#: ``nvidia.com/NVIDIA_A2-4Q=3``: an extended resource name (as the kubelet accepts it) and a
#: positive count.
_REQUIRE = re.compile(r"(nvidia\.com/[A-Za-z0-9][-A-Za-z0-9_.]{0,62})=([1-9][0-9]{0,5})")


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "capacity",
        help="how many vGPUs of each profile the cluster can still give, per node",
        description="Per node and vGPU resource: vGPUs configured (the node's VGPUNodeState, "
        "else its VGPUDevices), allocatable (the node's status), requested (pods bound to the "
        "node and not finished), free = allocatable - requested; then the cluster's totals. "
        "Reads the cluster only (--kubeconfig, or the pod's service account).",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument(
        "--require",
        metavar="RESOURCE=N",
        help="exit 0 when some single node has N of RESOURCE free (e.g. "
        "nvidia.com/NVIDIA_A2-4Q=3), else 2, naming the best node and the shortfall",
    )
    p.set_defaults(handler=cmd_capacity)
    return p


def cmd_capacity(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.observe.capacity import observe_capacity

    wanted: tuple[str, int] | None = None
    if ns.require is not None:
        match = _REQUIRE.fullmatch(ns.require)
        if match is None:
            raise UsageError(
                f"--require {ns.require!r}: expected RESOURCE=N, as nvidia.com/NVIDIA_A2-4Q=3"
            )
        wanted = (match.group(1), int(match.group(2)))
    api = Host(options).cluster_api
    if api is None:
        raise UsageError("capacity reads the cluster: pass --kubeconfig")
    capacity = observe_capacity(api)
    verdict = None
    if wanted is not None:
        resource, count = wanted
        best = capacity.best(resource)
        if best is None:
            verdict = (False, f"no node offers {resource}")
        elif best[1] >= count:
            verdict = (True, f"node {best[0]} has {best[1]} {resource} free (needed {count})")
        else:
            verdict = (
                False,
                f"no node has {count} {resource} free: the best, {best[0]}, has {best[1]} "
                f"(short by {count - best[1]})",
            )
    if ns.output == "json":
        doc: dict[str, Any] = {
            "nodes": [
                {"node": n.node, "resources": [p.to_json() for p in n.profiles]}
                for n in capacity.nodes
            ],
            "totals": [p.to_json() for p in capacity.totals()],
            "notes": list(capacity.notes),
        }
        if wanted is not None and verdict is not None:
            doc["require"] = {
                "resource": wanted[0],
                "count": wanted[1],
                "satisfied": verdict[0],
                "message": verdict[1],
            }
        print(json.dumps(doc, indent=2))
    else:
        rows = [
            (n.node, p.resource, str(p.configured), str(p.allocatable), str(p.requested),
             str(p.free))
            for n in capacity.nodes
            for p in n.profiles
        ]  # fmt: skip
        rows += [
            ("(cluster)", p.resource, str(p.configured), str(p.allocatable), str(p.requested),
             str(p.free))
            for p in capacity.totals()
        ]  # fmt: skip
        print(table(COLUMNS, rows), end="")
        for note in capacity.notes:
            print(f"note: {safe(note)}", file=sys.stderr)
        if verdict is not None:
            print(safe(verdict[1]), file=sys.stderr)
    if verdict is None:
        return EXIT_OK
    return EXIT_OK if verdict[0] else EXIT_SHORT
