"""Node-group selectors at the schema's maximum (issue 28, item 3): 256 groups of 256 distinct
name globs each (65,536 globs, a 0.9 MB file), matched against 100 and 1,000 node names that
only the last group selects (so every node is matched against every group).

Measured in process: loading the file (the real loader), then choosing the fleet's nodes
(``Desired.selected``) and each node's groups (``Desired.node``), as ``plan --observed cluster``
does. Before the globs were compiled once per desired state, ``fnmatchcase``'s cache of 32,768
patterns was exceeded and every match recompiled: about 4.5 s a node. Target: the time grows
linearly with the nodes (the 1,000-node run against ten times the 100-node one), the one-time
compilation reported apart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

GROUPS = GLOBS = 256


def glob_fleet_yaml(groups: int = GROUPS, globs: int = GLOBS) -> str:
    """``groups`` node groups, each selecting ``globs`` distinct globs (``r007-n123-*``)."""
    lines = [
        "apiVersion: vgpu.reconciler.dev/v1alpha1",
        "kind: VGPUDesiredState",
        "metadata: {name: globs}",
        "spec:",
        "  nodeGroups:",
    ]
    for g in range(groups):
        names = ", ".join(f'"r{g:03d}-n{i:03d}-*"' for i in range(globs))
        lines += [
            f"    - name: r{g:03d}",
            f"      selector: {{names: [{names}]}}",
            "      gpus:",
            "        - {match: {model: A2}, sriov: enabled, profiles: {A2-4Q: 4}}",
        ]
    return "\n".join(lines) + "\n"


def bench_globs(tmp: Path, sizes: tuple[int, ...] = (100, 1000)) -> dict[str, Any]:
    from reconciler.catalog import default_catalog
    from reconciler.desired import load_desired

    catalog = default_catalog()
    path = tmp / "globs.yaml"
    path.write_text(glob_fleet_yaml())
    result: dict[str, Any] = {
        "groups": GROUPS,
        "globs": GROUPS * GLOBS,
        "file_bytes": path.stat().st_size,
    }
    t0 = time.perf_counter()
    desired = load_desired([path], catalog=catalog)
    result["load_s"] = round(time.perf_counter() - t0, 3)
    last = GROUPS - 1
    # The first match compiles every selector: measured apart, on a node of no size.
    t0 = time.perf_counter()
    desired.selected({f"r{last:03d}-n000-first": {}})
    result["first_match_compiles_s"] = round(time.perf_counter() - t0, 3)
    for size in sizes:
        nodes = {f"r{last:03d}-n{n % GLOBS:03d}-{n}": {} for n in range(size)}
        t0 = time.perf_counter()
        names = desired.selected(nodes)
        chosen = [desired.node(name, nodes[name]) for name in names]
        elapsed = time.perf_counter() - t0
        assert len(chosen) == size and all(c is not None and c.matched for c in chosen)
        result[f"nodes_{size}"] = {"nodes": size, "match_s": round(elapsed, 4)}
    if len(sizes) == 2:
        small, large = (result[f"nodes_{s}"]["match_s"] for s in sizes)
        result["time_ratio"] = round(large / small, 2) if small else None
        result["node_ratio"] = sizes[1] / sizes[0]
    return result
