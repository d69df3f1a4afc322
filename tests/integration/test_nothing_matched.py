"""A node the desired state selects but whose host lacks what it wants is not converged
(issue 29, item 5).

A node group that selects a node and none of whose GPU entries matches a GPU there (its
driver did not load, so no GPU is seen; or the node is not the one the group meant), and a node
whose own entry names a GPU the host does not have, are errors for that node: ``plan`` names the
group (or entry) and what it wanted and exits 1, ``assert`` reports drift and exits 2, and
``watch`` is not converged, counts a plan error and records a Warning Event on the node's
VGPUNodeState. Before, the group case was "No changes. The node matches the desired state.",
``assert`` exit 0 and ``vgpuctl_converged 1``.

Expected outputs are written by hand from the files below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.cluster_node import NODE_STATES, cluster_node
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED, SimNode, make_sim, run_vgpuctl
from tests.watch_agent import Watch, wait_for

#: A group selecting every harvester-* node, wanting six L40S-8Q on each L40S.
L40S_GROUP = """\
apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {name: lab}
spec:
  nodeGroups:
    - name: l40s-workers
      selector: {names: ["harvester-*"]}
      gpus:
        - {match: {model: L40S}, sriov: enabled, profiles: {L40S-8Q: 6}}
"""

WANTED = (
    "node group 'l40s-workers' selects node harvester-kgd9c, and none of its GPU entries "
    "matches a GPU there (it wants GPUs matching model 'NVIDIA L40S'): "
)
ADVICE = ". Narrow the group's selector, or see why the GPU is missing (vgpuctl doctor)"


def _group_file(tmp_path: Path) -> Path:
    path = tmp_path / "group.yaml"
    path.write_text(L40S_GROUP)
    return path


def test_a_group_that_matches_no_gpu_of_the_node_is_not_converged(tmp_path: Path) -> None:
    node = make_sim(tmp_path / "host", ["A2@0000:09:00.0"])
    desired = _group_file(tmp_path)
    problem = f"{desired}:9:11: {WANTED}its GPUs are 0000:09:00.0 (NVIDIA A2){ADVICE}"

    res = node.run("plan", desired)
    assert res.returncode == 1, res.stdout + res.stderr
    assert problem in res.stderr
    assert "No changes" not in res.stdout

    res = node.run("assert", desired)
    assert (res.returncode, res.stdout) == (
        2,
        "node harvester-kgd9c has drifted: 1 node group that selects node harvester-kgd9c "
        f"matches none of its GPUs\n  {problem}\n",
    )

    res = node.run("apply", desired, "--yes")
    assert res.returncode == 1 and problem in res.stderr
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    assert [vf["vgpu"] for gpu in inventory["gpus"] for vf in gpu["vfs"]] == []  # untouched


def test_a_node_with_no_gpu_seen_at_all_is_not_converged(tmp_path: Path) -> None:
    """No NVIDIA GPU on the host (its driver did not load): an empty sysfs tree."""
    root = tmp_path / "sys"
    for directory in ("bus/pci/devices", "bus/mdev/devices", "devices"):
        (root / directory).mkdir(parents=True)
    host = ["--sysfs-root", root, "--node", NODE, "--state-dir", tmp_path / "state"]
    host += ["--kubelet-dir", tmp_path / "kubelet"]
    desired = _group_file(tmp_path)
    res = run_vgpuctl("assert", desired, *host)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{WANTED}no NVIDIA SR-IOV GPU is seen on it{ADVICE}" in res.stdout

    # A node's own entry naming a GPU the host lacks: drift too (it was exit 1, an error).
    res = run_vgpuctl("assert", SEED, *host)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (
        "GPU 0000:08:00.0 is not on node harvester-kgd9c: it has no NVIDIA SR-IOV GPUs"
        in res.stdout
    )
    res = run_vgpuctl("plan", SEED, *host)
    assert res.returncode == 1
    assert "GPU 0000:08:00.0 is not on node harvester-kgd9c" in res.stderr


def test_watch_is_not_converged_and_says_so_on_the_node_state(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node: SimNode = cluster_node(tmp_path, emu)  # one A2 at 0000:08:00.0
    desired = _group_file(tmp_path)
    watch = start_watch(node, desired)

    def absent() -> list[dict[str, object]]:
        return [
            e
            for e in emu.objects("", "v1", "events", "default")
            if e["reason"] == "DesiredGpuAbsent"
        ]

    wait_for(lambda: bool(absent()), "the Warning Event", timeout=20)
    (event,) = absent()
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "/".join(NODE_STATES[:2]),
        "kind": "VGPUNodeState",
        "name": NODE,
    }
    assert event["message"] == (
        f"not converged: {desired}:9:11: {WANTED}its GPUs are 0000:08:00.0 (NVIDIA A2){ADVICE}"
    )
    assert watch.metric("vgpuctl_converged") == 0
    assert watch.metric("vgpuctl_errors_total", kind="plan") >= 1
    assert watch.get("/readyz")[0] == 503
