"""A hostile text in one API object fails closed for that object only (issue 28, item 2).

The attack: whoever may write one object vgpuctl reads puts a text in it that Python's JSON
decoder cannot take — 200,000 ``[`` in a VGPUDevice's ``vgpu.reconciler.dev/last-applied-spec``
(a 200 KB annotation the API server accepts), or in a VM's
``harvesterhci.io/deviceAllocationDetails``. Before the fix the decoder's ``RecursionError``
escaped every ``except ValueError``: the node's ``plan``, ``plan --observed cluster`` and the
node agent failed with an internal error on every run, and one such VM anywhere stopped the
delegate ``plan``/``apply`` of every node. Now every such text is read within bounds
(``reconciler/model/clustertext.py``): the object it is on is treated the safe way, one escaped
line names it and the field, and every other object, node and the fleet are planned.

Each test runs ``vgpuctl`` as a subprocess against the API-server emulator, as an operator runs
it, and judges from its output and exit code.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster_node import VGPUS, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.doubles.pcidevices import vm
from tests.harvester_node import NODE, SEED, VFS, Cluster, harvester_node, seed_with
from tests.simnode import run_vgpuctl
from tests.watch_agent import Watch, seed_text, wait_for

LAST_APPLIED = "vgpu.reconciler.dev/last-applied-spec"
ALLOCATION = "harvesterhci.io/deviceAllocationDetails"
#: The issue's text: deeper than any JSON decoder's recursion limit, under 256 KiB.
DEEP = "[" * 200_000
VICTIM = f"{NODE}-000008005"  # the seed's VF 1 (0000:08:00.5), a 4Q


def _no_internal_error(res: Any) -> None:
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    assert "RecursionError" not in out, out[-3000:]


def _poison_last_applied(emu: ApiServerEmulator, name: str) -> None:
    obj = stored(emu, VGPUS, name)
    obj["metadata"]["annotations"][LAST_APPLIED] = DEEP
    emu.seed(obj)


def test_a_deep_last_applied_annotation_fails_closed_for_that_vgpudevice_only(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    _poison_last_applied(emu, VICTIM)

    res = node.run("plan", SEED, "--detailed-exitcode", "-o", "json")
    _no_internal_error(res)
    # Exit 2: a change is planned (the object's update), not an error.
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    plan = json.loads(res.stdout)
    # That object only is written again (its annotation rewritten), and the node's summary
    # (VGPUNodeState) that says a write is pending; the rest is up to date.
    assert sorted((a["kind"], a["target"]) for a in plan["actions"]) == [
        ("cr-update", NODE),
        ("cr-update", VICTIM),
    ]
    assert plan["blocked"] == []
    assert len([n for n in plan["noops"] if n["reason"] == "VGPUDevice up to date"]) == 15
    notes = [n for n in plan["notes"] if VICTIM in n]
    assert notes == [
        f"VGPUDevice {VICTIM}: annotation {LAST_APPLIED} nests deeper than 32 levels: hand "
        "edits of its spec cannot be told; the update rewrites it"
    ]
    # The text plan says it in one line too, and never quotes the annotation.
    text = node.run("plan", SEED)
    _no_internal_error(text)
    assert text.returncode == 0
    lines = [ln for ln in text.stdout.splitlines() if VICTIM in ln and LAST_APPLIED in ln]
    assert len(lines) >= 1 and all(len(ln) < 400 for ln in lines), text.stdout
    assert "[[[[" not in text.stdout

    # Applying it repairs the object: the next plan has nothing to do.
    node.ok("apply", SEED, "--yes")
    repaired = stored(emu, VGPUS, VICTIM)["metadata"]["annotations"][LAST_APPLIED]
    assert json.loads(repaired)["address"] == "0000:08:00.5"
    assert node.run("plan", SEED, "--detailed-exitcode").returncode == 0


def test_the_node_agent_repairs_a_deep_last_applied_annotation(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    watch = start_watch(node, desired)
    wait_for(watch.ready, "the first convergence")
    _poison_last_applied(emu, VICTIM)

    def repaired() -> bool:
        text = stored(emu, VGPUS, VICTIM)["metadata"]["annotations"][LAST_APPLIED]
        return text.startswith("{")

    # Its next reconcile writes the object again (before the fix: an internal error on every
    # reconcile, the object never repaired), and says why in a line naming it.
    wait_for(repaired, "the annotation rewritten", timeout=30)
    line = watch.wait_log(lambda d: VICTIM in str(d) and LAST_APPLIED in str(d), "the update")
    assert "[[[[" not in json.dumps(watch.logs())
    assert "internal error" not in json.dumps(watch.logs()), line
    wait_for(watch.ready, "converged again")


def test_a_deep_annotation_on_one_node_leaves_the_fleet_planned(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    names = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    gpu = {"A2-4Q": 2}
    fleet = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "fleet"},
        "spec": {
            "nodes": {
                n: {"gpus": [{"address": "0000:08:00.0", "sriov": "enabled", "profiles": gpu}]}
                for n in names
            }
        },
    }
    desired = tmp_path / "fleet.yaml"
    desired.write_text(yaml.safe_dump(fleet))
    for name in names:
        cluster_node(tmp_path, emu, name).ok("apply", desired, "--yes")
    victim = "gpu-node-2-000008004"
    _poison_last_applied(emu, victim)
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")

    common = ("plan", desired, "--observed", "cluster", "--kubeconfig", kubeconfig)
    res = run_vgpuctl(*common, "--detailed-exitcode", "--sysfs-root", tmp_path / "no-host")
    _no_internal_error(res)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("=== node") == 3
    # The object's update and its node's summary's.
    assert "Cluster plan: 3 nodes, 1 with changes; 0 to create, 2 to change" in res.stdout
    assert f"VGPUDevice {victim}: annotation {LAST_APPLIED} nests deeper" in res.stdout

    doc = json.loads(run_vgpuctl(*common, "-o", "json").stdout)
    assert doc["errors"] == {}
    assert [p["node"] for p in doc["plans"]] == names
    by_node = {p["node"]: p for p in doc["plans"]}
    assert sorted(a["target"] for a in by_node["gpu-node-2"]["actions"]) == ["gpu-node-2", victim]
    assert by_node["gpu-node-1"]["actions"] == by_node["gpu-node-3"]["actions"] == []
    named = [n for p in doc["plans"] for n in p["notes"] if LAST_APPLIED in n]
    assert len(named) == 1 and victim in named[0]


# -- delegate mode: a VM's device-allocation annotation ------------------------------------------

OTHER = "harvester-b"


@pytest.fixture
def harvester(tmp_path: Path) -> Iterator[Cluster]:
    """The seed's node on Harvester (pcidevices-controller's double running), its four vGPUs
    made, and a second node whose SR-IOV is off (its SRIOVGPUDevice as the controller makes
    one); the emulator serves Harvester's own CRDs."""
    from tests.cluster_node import kubevirt_cr, register_crds

    with ApiServerEmulator() as server:
        register_crds(server, harvester=True)
        server.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        server.seed(kubevirt_cr())
        with harvester_node(server, tmp_path) as cluster:
            cluster.ok("apply", SEED, "--yes")
            gpus = ("devices.harvesterhci.io", "v1beta1", "sriovgpudevices")
            mine = server.get_object(*gpus, f"{NODE}-000008000")
            assert mine is not None
            other = copy.deepcopy(mine)
            meta = other["metadata"]
            meta.update(name=f"{OTHER}-000008000", labels={"nodename": OTHER})
            for key in ("uid", "resourceVersion", "creationTimestamp", "generation",
                        "ownerReferences", "finalizers", "managedFields"):  # fmt: skip
                meta.pop(key, None)
            other["spec"].update(nodeName=OTHER, enabled=False)
            other["status"] = {}
            server.seed(other)
            yield cluster


def _two_nodes(tmp_path: Path) -> Path:
    """The seed's node with VF 0 a 4Q and VF 1 a 4A (both changed), and the other node's GPU
    with SR-IOV on."""
    doc = yaml.safe_load(seed_with(VFS[0], "NVIDIA A2-4Q"))
    gpu = doc["spec"]["nodes"][NODE]["gpus"][0]
    gpu["vgpus"][VFS[1]] = "NVIDIA A2-4A"
    doc["spec"]["nodes"][OTHER] = {"gpus": [{"address": "0000:08:00.0", "sriov": "enabled"}]}
    path = tmp_path / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _hostile_vm(requests: str) -> dict[str, Any]:
    """A stopped VM asking for ``requests`` whose allocation annotation is 200,000 ``[``."""
    obj = vm("evil", "default", hostdevices={})
    obj["metadata"]["annotations"][ALLOCATION] = DEEP
    devices = {"hostDevices": [{"name": "gpu", "deviceName": requests}]}
    obj["spec"] = {"running": False, "template": {"spec": {"domain": {"devices": devices}}}}
    return obj


def test_a_vm_with_a_deep_allocation_annotation_holds_only_what_it_could(
    harvester: Cluster, tmp_path: Path
) -> None:
    desired = _two_nodes(tmp_path)
    harvester.emu.seed(_hostile_vm("nvidia.com/NVIDIA_A2-4Q"))

    res = harvester.run("plan", desired, "--delegate", "harvester", "-o", "json")
    _no_internal_error(res)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["errors"] == {}
    plans = {p["node"]: p for p in doc["plans"]}
    assert sorted(plans) == sorted([NODE, OTHER])
    # The other node is planned as if the VM were not there.
    assert [(a["kind"], a["target"]) for a in plans[OTHER]["actions"]] == [
        ("sriovgpudevice-enable", f"{OTHER}-000008000")
    ]
    assert not any(ALLOCATION in n for n in plans[OTHER]["notes"])
    # On the seed's node the VM could hold the two 4Qs (VFs 1 and 3): VF 1's change is
    # blocked; VF 0 (a 4A now, which it cannot hold) is changed.
    seed = plans[NODE]
    victim = f"{NODE}-000008005"
    assert {b["target"] for b in seed["blocked"]} == {victim}
    reasons = [b["reason"] for b in seed["blocked"]]
    assert any("default/evil (allocation annotation unreadable)" in r for r in reasons), reasons
    assert {a["target"] for a in seed["actions"]} == {f"{NODE}-000008004"}
    (line,) = [n for n in seed["notes"] if ALLOCATION in n]
    assert line == (
        f"VM default/evil: annotation {ALLOCATION} nests deeper than 32 levels: counted as "
        "holding the 2 configured VGPUDevices of this node it could hold"
    )

    text = harvester.run("plan", desired, "--delegate", "harvester")
    _no_internal_error(text)
    assert text.returncode == 0
    assert f"=== node {OTHER} (through pcidevices-controller) ===" in text.stdout
    assert "VM default/evil: annotation" in text.stdout
    assert "[[[[" not in text.stdout + text.stderr
