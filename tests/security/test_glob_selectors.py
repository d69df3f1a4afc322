"""Node-group name globs past ``fnmatch``'s pattern cache (issue 28, item 3).

``fnmatchcase`` compiles each glob through a cache of 32,768 patterns. A desired state with
more distinct globs than that (the schema allows 256 per group, and a file of 256 groups × 256
globs is 0.9 MB) made every match recompile: ``plan --observed cluster`` of 100 nodes took five
minutes. Each selector's globs are now compiled once per loaded desired state.

The test counts work, not time: the glob translations (``fnmatch.translate``, what every
compilation starts with) made by ``vgpuctl plan --observed cluster`` against the API emulator,
for a fleet of 2 nodes and of 6. Compiled once per desired state, the count is the number of
distinct globs whatever the fleet; compiled per match, it grows with every node.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.bench.globs import glob_fleet_yaml
from tests.cluster_node import kubevirt_cr, register_crds
from tests.doubles.emulator import ApiServerEmulator

#: Groups × globs: just past the cache's 32,768 patterns (the issue's file had 256 × 256).
GROUPS, GLOBS = 129, 256

#: vgpuctl's ``main`` with ``fnmatch.translate`` counted (patched before vgpuctl is imported,
#: so whatever vgpuctl imports from ``fnmatch`` is the counted one).
COUNTING = """\
import fnmatch, sys
calls = 0
original = fnmatch.translate
def translate(pattern):
    global calls
    calls += 1
    return original(pattern)
fnmatch.translate = translate
from reconciler.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    print(f"translations={calls}", file=sys.stderr)
sys.exit(code)
"""


def _translations(tmp_path: Path, nodes: int) -> int:
    """The translations ``plan --observed cluster`` makes for a fleet of ``nodes`` Nodes."""
    with ApiServerEmulator() as emu:
        register_crds(emu)
        emu.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        emu.seed(kubevirt_cr())
        for n in range(nodes):
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": _name(n)}}
            emu.seed(node)
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(glob_fleet_yaml(GROUPS, GLOBS))
        kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
        res = subprocess.run(
            [sys.executable, "-c", COUNTING, "plan", str(fleet), "--observed", "cluster",
             "--kubeconfig", str(kubeconfig), "--sysfs-root", str(tmp_path / "no-such-host")],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False,
        )  # fmt: skip
    # No agent ran on these nodes (no VGPUNodeState): each is an error, named; every node
    # was matched against every group to get there.
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    for n in range(nodes):
        assert _name(n) in res.stdout + res.stderr
    (count,) = re.findall(r"translations=(\d+)", res.stderr)
    return int(count)


def _name(n: int) -> str:
    """Node ``n``: the last group's glob ``n`` selects it, so every group is asked first."""
    return f"r{GROUPS - 1:03d}-n{n:03d}-x"


def test_each_glob_is_compiled_once_per_desired_state(tmp_path: Path) -> None:
    counts = {}
    for nodes in (2, 6):
        (tmp_path / str(nodes)).mkdir()
        counts[nodes] = _translations(tmp_path / str(nodes), nodes)
    # Every glob has a wildcard: each is translated exactly once, however many nodes.
    assert counts == {2: GROUPS * GLOBS, 6: GROUPS * GLOBS}
