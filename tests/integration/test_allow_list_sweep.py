"""Issue 29: the KubeVirt allow-list against KubeVirt's virt-handler, through the CLI.

virt-handler removes, at every heartbeat, each mdev whose type the KubeVirt CR does not
allow-list (externally), in use or not (docs/domain.md §10). The simulator plays it
(``vgpuctl sim virt-handler``, :mod:`reconciler.sim.virt_handler`), reading the CR from the API
emulator. A type is listed before its first vGPU is created (a crash at any point, then a
heartbeat, loses nothing) and stays listed while any node has a vGPU of it, whatever the
files say.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from reconciler.sim.virt_handler import sweep
from tests.cluster_node import ClusterNode, cluster_node, mdev_selectors, stored_kubevirt
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED

KUBEVIRT_NS = "harvester-system"


def _desired(tmp_path: Path, vgpus: dict[str, str], name: str = "desired.yaml") -> Path:
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["nodes"][NODE]["gpus"][0]["vgpus"] = vgpus
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _vgpus(node: ClusterNode) -> dict[str, tuple[str, str]]:
    """VF → (type, UUID) of every vGPU the host has (``status -o json``)."""
    status = json.loads(node.ok("status", "-o", "json").stdout)
    return {
        vf["address"]: (vf["vgpu"]["type"], vf["vgpu"]["uuid"])
        for gpu in status["gpus"]
        for vf in gpu["vfs"]
        if vf.get("vgpu")
    }


def _heartbeat(node: ClusterNode) -> int:
    """One virt-handler heartbeat through the CLI; the number of vGPUs it removed."""
    res = node.run("sim", "virt-handler", node.dir, "--once")
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return res.stderr.count("virt-handler: removed mdev")


SEED_VGPUS = {
    "0000:08:00.4": "NVIDIA A2-4A",
    "0000:08:00.5": "NVIDIA A2-4Q",
    "0000:08:00.6": "NVIDIA A2-4A",
    "0000:08:00.7": "NVIDIA A2-4Q",
}
#: The seed with .4 changed to a type no node has yet: A2-4C.
NEW_TYPE = {**SEED_VGPUS, "0000:08:00.4": "NVIDIA A2-4C"}


def test_a_new_type_is_allow_listed_before_its_first_vgpu_in_every_plan(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    assert _heartbeat(node) == 0
    desired = _desired(tmp_path, NEW_TYPE)
    for observed in ((), ("--observed", "cluster")):
        plan = json.loads(node.ok("plan", desired, *observed, "-o", "json").stdout)
        if "plans" in plan:
            (plan,) = plan["plans"]
        kinds = [(a["kind"], a.get("phase")) for a in plan["actions"]]
        # The allow-list's addition first; the vGPU replaced after it.
        assert kinds[0] == ("kubevirt-allow", "allow-list"), kinds
        assert [e["mdevNameSelector"] for e in plan["actions"][0]["add"]] == ["NVIDIA A2-4C"]
        create = kinds.index(("vgpu-create", "host"))
        assert kinds.index(("vgpu-remove", "host")) < create
        assert ("kubevirt-update", "cluster") not in kinds  # nothing leaves the list
    # A saved plan carries the order, and applying it keeps it.
    saved = tmp_path / "plan.json"
    node.ok("plan", desired, "--out", saved)
    doc = json.loads(saved.read_text())
    assert doc["actions"][0]["kind"] == "kubevirt-allow"
    applied = node.ok("apply", saved, "--yes")
    lines = [ln for ln in applied.stderr.splitlines() if "kubevirt-allow" in ln or "vgpu-" in ln]
    assert "kubevirt-allow" in lines[0] and "allowed NVIDIA A2-4C" in lines[0], lines
    assert _heartbeat(node) == 0
    assert _vgpus(node)["0000:08:00.4"][0] == "NVIDIA A2-4C"


def test_a_crash_before_or_after_the_first_create_of_a_new_type_loses_nothing_to_the_sweep(
    tmp_path: Path,
) -> None:
    """The apply is killed right after its second host change (the A2-4C created), or right
    after its first (the old vGPU of .4 removed: after the allow-list write, before the first
    A2-4C is created): a heartbeat then removes nothing; the rerun converges; nothing is lost.
    (Before issue 29 the first kill left the new vGPU unlisted, and the heartbeat took it.)"""
    for crash_after in (2, 1):
        where = tmp_path / f"crash-{crash_after}"
        where.mkdir()
        with ApiServerEmulator() as fresh:
            _fresh_cluster(fresh)
            node = cluster_node(where, fresh)
            node.ok("apply", SEED, "--yes")
            before = _vgpus(node)
            desired = _desired(where, NEW_TYPE)
            node.ok("sim", "fail", node.dir, "--crash-after", str(crash_after))
            killed = node.run("apply", desired, "--yes")
            assert killed.returncode < 0, killed.stdout + killed.stderr  # SIGKILLed
            assert _heartbeat(node) == 0, f"crash after {crash_after}: the sweep took a vGPU"
            assert "NVIDIA A2-4C" in mdev_selectors(fresh)
            after_crash = _vgpus(node)
            # The three untouched vGPUs are all still there, as they were.
            for vf in ("0000:08:00.5", "0000:08:00.6", "0000:08:00.7"):
                assert after_crash[vf] == before[vf]
            node.ok("apply", desired, "--yes")
            assert _heartbeat(node) == 0
            final = _vgpus(node)
            assert {vf: t for vf, (t, _) in final.items()} == NEW_TYPE


def test_a_type_the_files_no_longer_name_stays_listed_while_a_vgpu_of_it_exists(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """A VM holds an A2-4A vGPU; the file turns every VF to A2-4Q. The held vGPU cannot be
    removed, and its type stays allow-listed, so the heartbeat leaves it to its VM. (Before
    issue 29 the entry went as soon as no file named the type, and the heartbeat removed the
    VM's vGPU.) Once the VM lets go, the vGPU is replaced and only then does the entry go: it
    is marked retiring by that run, and removed by the first run at least the grace period
    later (here 1 s: reconciler/model/retiring.py)."""
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    held_vf, (held_type, held_uuid) = "0000:08:00.4", _vgpus(node)["0000:08:00.4"]
    assert held_type == "NVIDIA A2-4A"
    node.ok("sim", "hold", node.dir, held_uuid)
    all_4q = _desired(tmp_path, dict.fromkeys(SEED_VGPUS, "NVIDIA A2-4Q"))
    res = node.run("apply", all_4q, "--yes")
    assert res.returncode in (0, 2), res.stdout + res.stderr  # blocked: the VM holds .4
    # One heartbeat, without waiting on the VM: the held vGPU would be lost if swept.
    swept = sweep(node.dir, stored_kubevirt(emu), wait=False)
    assert (dict(swept.removed), dict(swept.held)) == ({}, {})
    assert "NVIDIA A2-4A" in mdev_selectors(emu)
    assert _vgpus(node)[held_vf] == (held_type, held_uuid)

    node.ok("sim", "release", node.dir, held_uuid)
    node.ok("apply", all_4q, "--yes", "--allow-list-grace", "1s")
    assert "NVIDIA A2-4A" in mdev_selectors(emu)  # marked retiring, not yet removed
    assert _heartbeat(node) == 0
    time.sleep(2.1)  # marks are stamped to the second
    node.ok("apply", all_4q, "--yes", "--allow-list-grace", "1s")
    assert "NVIDIA A2-4A" not in mdev_selectors(emu)
    assert "GRID T4-2Q" in mdev_selectors(emu)  # someone else's entry: never touched
    assert _heartbeat(node) == 0
    assert {t for t, _ in _vgpus(node).values()} == {"NVIDIA A2-4Q"}


def _fresh_cluster(emu: ApiServerEmulator) -> None:
    from tests.cluster_node import kubevirt_cr, register_crds

    register_crds(emu)
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBEVIRT_NS}})
    emu.seed(kubevirt_cr())


def test_a_type_kubevirt_serves_itself_gets_no_vgpu_and_loses_none_to_the_sweep(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Someone lists NVIDIA A2-4C in the KubeVirt CR without ``externalResourceProvider: true``:
    KubeVirt's own device plugin serves those mdevs and its sweep does not spare them
    (device_controller.go ``updatePermittedHostDevicePlugins``, ``getExternallyProvidedMdevs``).
    vgpuctl neither adds its entry beside it nor makes an A2-4C: the create is blocked with the
    reason, the A2-4A it would replace stays, a heartbeat takes nothing. (Before, the entry
    counted as listed by its selector: the A2-4C was made and the next heartbeat removed it.)"""
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    kv = stored_kubevirt(emu)
    entries = kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    entries.append({"mdevNameSelector": "NVIDIA A2-4C", "resourceName": "nvidia.com/kv-a2-4c"})
    emu.seed(kv)
    before = _vgpus(node)
    desired = _desired(tmp_path, NEW_TYPE)
    plan = json.loads(node.ok("plan", desired, "-o", "json").stdout)
    assert [a["kind"] for a in plan["actions"] if a["kind"].startswith("vgpu")] == []
    (blocked,) = [b for b in plan["blocked"] if b["kind"] == "vgpu-create"]
    assert blocked["type"] == "NVIDIA A2-4C"
    assert blocked["reason"].startswith("KubeVirt serves NVIDIA A2-4C itself"), blocked
    assert any("vgpuctl adds no allow-list entry for NVIDIA A2-4C" in n for n in plan["notes"])
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr  # blocked
    assert "NVIDIA A2-4C" in mdev_selectors(emu)  # theirs, left as it is
    assert sum(1 for s in mdev_selectors(emu) if s == "NVIDIA A2-4C") == 1
    assert _heartbeat(node) == 0
    assert _vgpus(node) == before


def test_an_entry_kubevirt_reads_as_ours_is_not_written_twice(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """An external entry spelt ``NVIDIA_A2-4C`` (KubeVirt turns spaces into ``_`` on both sides)
    with vgpuctl's resourceName already lists A2-4C: no second entry is added, and the new
    vGPU survives the heartbeat. (Before, the selector was compared as written: a duplicate
    ``NVIDIA A2-4C`` entry was added.)"""
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    kv = stored_kubevirt(emu)
    entries = kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    entries.append(
        {
            "mdevNameSelector": "NVIDIA_A2-4C",
            "resourceName": "nvidia.com/NVIDIA_A2-4C",
            "externalResourceProvider": True,
        }
    )
    emu.seed(kv)
    node.ok("apply", _desired(tmp_path, NEW_TYPE), "--yes")
    selectors = mdev_selectors(emu)
    assert "NVIDIA A2-4C" not in selectors and "NVIDIA_A2-4C" in selectors, selectors
    assert _heartbeat(node) == 0
    assert _vgpus(node)["0000:08:00.4"][0] == "NVIDIA A2-4C"
