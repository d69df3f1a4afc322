"""vGPUs vgpuctl has no record of, on NVIDIA's vendor-specific VFIO interface (issue 31).

Once a GPU's capacity for a size is used (two L40-24Q, one A2-16Q), no VF's
``creatable_vgpu_types`` lists the type in use any more: only ``current_vgpu_type``'s id says
what a VF hosts (docs/domain.md §3b). vGPUs made by the simulator directly (as
pcidevices-controller or a hand would make them), or by vgpuctl with another state directory,
leave vgpuctl no record of that id. The driver still names it (``nvidia-smi vgpu -s -v -i
<GPU>``, the simulator's as the real one prints it), so such vGPUs are adopted like any other:
the same layout is no change, another size converges, ``status``/``export`` name them; only
where the driver cannot say either are the GPU's changes blocked, saying how to find out.
Every expectation is written from those facts; the ids are read off the host's own files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.sim import build_host
from reconciler.sim.state import load_state
from tests.simnode import NODE, SimNode, run_vgpuctl

GPU = "0000:08:00.0"
#: The first VFs of a simulated GPU (VF 0 at function 4).
VFS = ("0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7")


def host(tmp_path: Path, model: str, vgpus: dict[int, str]) -> SimNode:
    """A vfio host whose vGPUs the simulator made: vgpuctl has no record of them."""
    spec: dict[str, Any] = {
        "interface": "vfio",
        "gpus": [{"model": model, "address": GPU, "vgpus": vgpus}],
    }
    build_host(tmp_path / "host", spec)
    return SimNode(tmp_path / "host")


def desired(tmp_path: Path, gpu: dict[str, object], name: str) -> Path:
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "adopt"},
        "spec": {"nodes": {NODE: {"gpus": [{"address": GPU, "sriov": "enabled", **gpu}]}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def currents(node: SimNode) -> dict[str, str]:
    """Every VF's current_vgpu_type that is not 0, by VF address."""
    out = {}
    for path in sorted((node.dir / "sys").glob("devices/**/nvidia/current_vgpu_type")):
        value = path.read_text().strip()
        if value != "0":
            out[path.parent.parent.name] = value
    return out


def listed_anywhere(node: SimNode) -> set[str]:
    """The ids any VF's creatable_vgpu_types lists now."""
    ids = set()
    for path in (node.dir / "sys").glob("devices/**/nvidia/creatable_vgpu_types"):
        ids |= {ln.split(":")[0].strip() for ln in path.read_text().splitlines()[1:]}
    return ids


def hosted(node: SimNode, *extra: str) -> list[tuple[str, str]]:
    status = json.loads(node.ok("status", "-o", "json", *extra).stdout)
    (gpu,) = status["gpus"]
    return [(v["address"], v["vgpu"]["type"]) for v in gpu["vfs"] if v["vgpu"]]


def type_queries(node: SimNode) -> int:
    return load_state(node.dir / "sys").counters.get("nvidiaSmiTypeQueries", 0)


CASES = [
    # model, what the simulator made, the same layout, another size (and what it makes)
    pytest.param(
        "L40",
        {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"},
        {"NVIDIA L40-24Q": 2},
        {"NVIDIA L40-12Q": 4},
        id="L40-24Q",
    ),
    pytest.param(
        "A2",
        {0: "NVIDIA A2-16Q"},
        {"NVIDIA A2-16Q": 1},
        {"NVIDIA A2-8Q": 2},
        id="A2-16Q",
    ),
]


@pytest.mark.parametrize(("model", "made", "same", "other"), CASES)
def test_vgpus_vgpuctl_did_not_make_are_adopted(
    tmp_path: Path,
    model: str,
    made: dict[int, str],
    same: dict[str, int],
    other: dict[str, int],
) -> None:
    node = host(tmp_path, model, made)
    before = currents(node)
    assert len(before) == len(made)
    # At the type's maximum no list names it: only the driver can.
    assert not set(before.values()) & listed_anywhere(node)
    assert not (node.dir / "state").exists()
    # status names them (one nvidia-smi call for the GPU), and shows no id.
    assert hosted(node) == [(VFS[i], name) for i, name in sorted(made.items())]
    assert type_queries(node) == 1
    # The same layout: nothing to do, nothing blocked, nothing written.
    res = node.run("apply", desired(tmp_path, {"profiles": same}, "same.yaml"), "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No changes" in res.stdout
    assert "blocked" not in res.stdout
    assert currents(node) == before
    # export writes the layout that is there, by name.
    exported = yaml.safe_load(node.ok("export").stdout)
    (gpu,) = exported["spec"]["nodes"][NODE]["gpus"]
    assert sorted(gpu["vgpus"].values()) == sorted(made.values())
    # Another size: the adopted vGPUs go (none is in use), the new ones come, and a fresh
    # plan has nothing left to do.
    change = desired(tmp_path, {"profiles": other}, "other.yaml")
    res = node.run("apply", change, "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(made)} to remove, 0 blocked" in res.stdout
    (want, count) = next(iter(other.items()))
    assert [name for _, name in hosted(node)] == [want] * count
    res = node.run("plan", change, "--detailed-exitcode")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("model", "made", "same", "other"), CASES)
def test_vgpus_made_with_another_state_directory_are_adopted_and_recorded(
    tmp_path: Path,
    model: str,
    made: dict[int, str],
    same: dict[str, int],
    other: dict[str, int],
) -> None:
    """vgpuctl made the vGPUs with a state directory since lost: a run with another one
    changes nothing for the same layout and converges to another size; the record it writes
    before its first write names every type the GPU listed, so a run after that names
    everything without asking the driver."""
    node = host(tmp_path, model, {})
    first = ["--state-dir", str(tmp_path / "lost")]
    same_file = desired(tmp_path, {"profiles": same}, "same.yaml")
    node.ok("apply", same_file, "--yes", *first)
    before = currents(node)
    assert len(before) == sum(same.values())
    fresh = ["--state-dir", str(tmp_path / "fresh")]
    res = node.run("apply", same_file, "--yes", *fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No changes" in res.stdout
    assert currents(node) == before
    change = desired(tmp_path, {"profiles": other}, "other.yaml")
    node.ok("apply", change, "--yes", *fresh)
    (want, count) = next(iter(other.items()))
    assert [name for _, name in hosted(node, *fresh)] == [want] * count
    record = json.loads((tmp_path / "fresh" / f"{NODE}.vfio-types.json").read_text())
    names = {e["name"] for e in record["types"]}
    assert {want, *same} <= names  # the type it made, and the one it found
    asked = type_queries(node)
    res = node.run("plan", change, "--detailed-exitcode", *fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    assert type_queries(node) == asked  # the record names it: the driver is not asked


def test_a_type_the_driver_cannot_name_either_blocks_its_gpu(tmp_path: Path) -> None:
    """nvidia-smi fails (or is not there): the vGPU is shown by its id, every change on its
    GPU is blocked, and the reason says what was asked and how to find out by hand."""
    node = host(tmp_path, "L40", {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"})
    (type_id,) = set(currents(node).values())
    mute = ["--nvidia-smi", "/bin/false"]
    assert hosted(node, *mute) == [(VFS[0], f"type {type_id}"), (VFS[1], f"type {type_id}")]
    res = node.run(
        "plan", desired(tmp_path, {"profiles": {"NVIDIA L40-12Q": 4}}, "o.yaml"), "-o", "json",
        *mute,
    )  # fmt: skip
    plan = json.loads(res.stdout)
    assert plan["applyable"] is False
    assert plan["actions"] == [] or all(
        a["kind"] not in ("vgpu-create", "vgpu-remove") for a in plan["actions"]
    )
    for b in plan["blocked"]:
        assert f"has vGPU type {type_id}" in b["reason"]
        assert "'nvidia-smi vgpu -q' shows each vGPU's type name" in b["reason"]
    (note,) = [n for n in plan["notes"] if "could not be named" in n]
    assert "nvidia-smi vgpu -s -v -i 00000000:08:00.0" in note


def test_an_adopted_vgpu_a_vm_holds_is_never_removed(tmp_path: Path) -> None:
    """Adopted is not owned: a VM holding one of the L40-24Q the simulator made keeps it, and
    what the equal-size rule ties to it waits, blocked (the other 24Q's removal too: it would
    only make room for 12Q that cannot come yet)."""
    node = host(tmp_path, "L40", {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"})
    res = run_vgpuctl("sim", "hold", node.dir, VFS[0])
    assert res.returncode == 0, res.stderr
    before = currents(node)
    change = desired(tmp_path, {"profiles": {"NVIDIA L40-12Q": 4}}, "other.yaml")
    res = node.run("apply", change, "--yes")
    assert res.returncode != 0  # blocked: not converged
    assert currents(node) == before
    plan = json.loads(node.run("plan", change, "-o", "json").stdout)
    assert plan["actions"] == [] or all(
        a["kind"] not in ("vgpu-create", "vgpu-remove") for a in plan["actions"]
    )
    removals = {b["target"]: b["reason"] for b in plan["blocked"] if b["kind"] == "vgpu-remove"}
    assert "in use by simulated VM" in removals[VFS[0]]
    assert "deferred" in removals[VFS[1]]
