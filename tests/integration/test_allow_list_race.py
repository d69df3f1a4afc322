"""Two nodes racing over one KubeVirt allow-list entry, and saved plans against a list that
changed since (the two-phase retirement: reconciler/model/retiring.py).

KubeVirt's virt-handler removes, on every node, each mdev whose type the KubeVirt CR does not
allow-list, in use or not (docs/domain.md §10). A node learns that another has vGPUs of a type
only from that node's VGPUNodeState, written after its host phase. Before the retirement, node
A could plan the removal of a type X no summary showed while node B, finding X listed, created
its first X vGPU with no allow-list write; A's removal then went through and virt-handler
swept B's new vGPU. Now A only marks X retiring; B's run makes sure of X before its create
(clearing a mark, if one is there); X goes only once the mark is older than the grace period
and no node shows X.

Node A runs in this process (the engine, its driver wrapped so that node B's whole
``vgpuctl apply`` runs between A's plan and A's cluster phase), B through the CLI; the
API-server emulator holds the cluster and :func:`reconciler.sim.virt_handler.sweep` plays
virt-handler's heartbeat on B.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.desired import load_desired
from reconciler.engine import RunSettings, reconcile
from reconciler.engine.ports import NodePorts
from reconciler.sim import SimHost
from reconciler.sim.virt_handler import sweep
from tests.cluster_node import ClusterNode, cluster_node, mdev_selectors, stored_kubevirt
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED

OTHER = "harvester-b"
#: The type the two nodes race over; the one both keep.
X, Y = "NVIDIA A2-4C", "NVIDIA A2-4Q"
VF4, VF5 = "0000:08:00.4", "0000:08:00.5"


def _desired(tmp_path: Path, node: str, vgpus: dict[str, str], name: str) -> Path:
    doc = yaml.safe_load(SEED.read_text())
    gpus = doc["spec"]["nodes"].pop(NODE)["gpus"]
    gpus[0]["vgpus"] = vgpus
    doc["spec"]["nodes"][node] = {"gpus": gpus}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _vgpus(node: ClusterNode) -> dict[str, str]:
    """VF → type of every vGPU the host has (``status -o json``)."""
    status = json.loads(node.ok("status", "-o", "json").stdout)
    return {
        vf["address"]: vf["vgpu"]["type"]
        for gpu in status["gpus"]
        for vf in gpu["vfs"]
        if vf.get("vgpu")
    }


def _ports(node: ClusterNode) -> tuple[Host, NodePorts]:
    sim = SimHost.open(node.dir / "sys")
    assert sim is not None
    host = Host(
        GlobalOptions(
            sysfs_root=sim.sysfs_root, sriov_manage=None, node=node.node, state_dir=None,
            no_color=True, kubelet_dir=node.kubelet_dir, kubeconfig=node.kubeconfig,
        )
    )  # fmt: skip
    return host, host.ports(write_timeout=5.0)


def _in_process(node: ClusterNode, desired: Path) -> tuple[Host, NodePorts, Any]:
    host, ports = _ports(node)
    wanted = load_desired([desired], catalog=host.catalog).node(node.node)
    assert wanted is not None
    return host, ports, wanted


def _later(host: Host, node: ClusterNode, seconds: float) -> Callable[[], Any]:
    """The node's cluster observation with its clock ``seconds`` ahead of the wall clock (the
    marks are stamped with the wall clock when written)."""
    from reconciler.observe import observe_cluster

    def observe() -> Any:
        return observe_cluster(
            host.cluster_api,  # type: ignore[arg-type]
            node=node.node,
            kubelet_dir=node.kubelet_dir,
            clock=lambda: time.time() + seconds,
        )

    return observe


def test_a_removal_planned_while_another_node_creates_its_first_vgpu_of_the_type_loses_nothing(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """A has the only X vGPU and drops it; B (whose summary does not show X yet) creates its
    first X vGPU between A's plan and A's allow-list write. On the old code A removed X, and
    the heartbeat on B took B's new vGPU. Now A marks X; nothing is lost; once B drops X too,
    a run after the grace period (a clock 16 minutes ahead) removes it, and not before."""
    a = cluster_node(tmp_path, emu)
    b = cluster_node(tmp_path, emu, name=OTHER)
    a.ok("apply", _desired(tmp_path, NODE, {VF4: X}, "a-with-x"), "--yes")
    b.ok("apply", _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x"), "--yes")
    assert X in mdev_selectors(emu)
    b_with_x = _desired(tmp_path, OTHER, {VF4: Y, VF5: X}, "b-with-x")

    # A drops X. Its plan is made before B's run; B's whole run happens during A's host
    # phase, before A's allow-list removal or mark.
    _, ports, wanted = _in_process(a, _desired(tmp_path, NODE, {VF4: Y}, "a-without-x"))
    real_driver = ports.driver
    raced: list[str] = []

    class RaceOnFirstRemove:
        def __init__(self) -> None:
            self.real = real_driver()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def remove_vgpu(self, **kw: Any) -> None:
            if not raced:
                raced.append(b.ok("apply", b_with_x, "--yes").stdout)
            self.real.remove_vgpu(**kw)

    result = reconcile(
        replace(ports, driver=RaceOnFirstRemove), wanted, settings=RunSettings(verify_timeout=5.0)
    )
    assert raced, "B never ran"
    assert result.host is not None and result.host.ok
    assert _vgpus(b)[VF5] == X

    # virt-handler's heartbeat on B: X must still be listed.
    swept = sweep(b.dir, stored_kubevirt(emu), wait=False)
    assert dict(swept.removed) == {}, f"the sweep took B's vGPUs: {dict(swept.removed)}"
    assert _vgpus(b) == {VF4: Y, VF5: X}
    assert X in mdev_selectors(emu)

    # B drops X: no node has or wants it. Within the grace period it stays listed...
    b_without_x = _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x-again")
    b.ok("apply", b_without_x, "--yes")
    assert _vgpus(b) == {VF4: Y}
    assert X in mdev_selectors(emu)
    marks = json.loads(
        stored_kubevirt(emu)["metadata"]["annotations"]["vgpu.reconciler.dev/retiring"]
    )
    assert set(marks) == {X}
    # ...and a run whose clock is past it (A's, with nothing to do on its host) removes it.
    host, ports, wanted = _in_process(a, _desired(tmp_path, NODE, {VF4: Y}, "a-without-x-2"))
    later = reconcile(
        replace(ports, observe_cluster=_later(host, a, 16 * 60)),
        wanted,
        settings=RunSettings(verify_timeout=5.0),
    )
    assert later.cluster is None or later.cluster.ok
    assert X not in mdev_selectors(emu)
    assert "vgpu.reconciler.dev/retiring" not in stored_kubevirt(emu)["metadata"]["annotations"]
    assert "GRID T4-2Q" in mdev_selectors(emu)  # someone else's entry: never touched
    assert dict(sweep(b.dir, stored_kubevirt(emu), wait=False).removed) == {}
    assert dict(sweep(a.dir, stored_kubevirt(emu), wait=False).removed) == {}


def test_a_saved_plan_made_while_the_type_was_listed_lists_it_again_before_its_create(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """B saves a plan creating its first X vGPU while X is listed (A has one); A then drops X
    and, the grace period past, X leaves the list. Applied now, B's saved plan adds X again
    before the create (its kubevirt-allow names X whatever the list held at plan time, and
    re-reads the CR at apply), and the heartbeat takes nothing. (Before, the saved plan had no
    kubevirt-allow, and applying it was refused: a fresh plan had one.)"""
    a = cluster_node(tmp_path, emu)
    b = cluster_node(tmp_path, emu, name=OTHER)
    a.ok("apply", _desired(tmp_path, NODE, {VF4: X}, "a-with-x"), "--yes")
    b.ok("apply", _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x"), "--yes")
    saved = tmp_path / "b-plan.json"
    b.ok("plan", _desired(tmp_path, OTHER, {VF4: Y, VF5: X}, "b-with-x"), "--out", saved)
    first = json.loads(saved.read_text())["actions"][0]
    assert first["kind"] == "kubevirt-allow" and first["unmark"] == [X]

    # A drops X, and a run of A's past the grace period removes it.
    host, ports, wanted = _in_process(a, _desired(tmp_path, NODE, {VF4: Y}, "a-without-x"))
    for ahead in (0, 16 * 60):
        reconcile(
            replace(ports, observe_cluster=_later(host, a, ahead)),
            wanted,
            settings=RunSettings(verify_timeout=5.0),
        )
    assert X not in mdev_selectors(emu)

    applied = b.ok("apply", saved, "--yes")
    assert "allowed " + X in applied.stdout + applied.stderr
    assert X in mdev_selectors(emu)
    assert _vgpus(b) == {VF4: Y, VF5: X}
    assert dict(sweep(b.dir, stored_kubevirt(emu), wait=False).removed) == {}


def test_a_node_killed_after_its_first_create_of_a_type_keeps_it_listed_by_its_intent(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """B's allow check runs before A's mark, and B is killed right after its first create of
    X, before its VGPUNodeState write; B is not run again. A, dropping X, plans and applies,
    then runs again with its clock past the grace period. On the old code B's summary never
    showed X: A marked X, then removed it, and the heartbeat on B took B's new vGPU. Now B
    published its intent (X wanted) before its allow check: A keeps X listed, nothing is
    lost."""
    a = cluster_node(tmp_path, emu)
    b = cluster_node(tmp_path, emu, name=OTHER)
    a.ok("apply", _desired(tmp_path, NODE, {VF4: X}, "a-with-x"), "--yes")
    b.ok("apply", _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x"), "--yes")
    assert X in mdev_selectors(emu)

    # B: its allow check (X listed, unmarked), its create of X on .5, killed there.
    b.ok("sim", "fail", b.dir, "--crash-after", "1")
    killed = b.run("apply", _desired(tmp_path, OTHER, {VF4: Y, VF5: X}, "b-with-x"), "--yes")
    assert killed.returncode < 0, killed.stdout + killed.stderr  # SIGKILLed
    assert _vgpus(b) == {VF4: Y, VF5: X}

    # A drops X (removes its own vGPU, retires what no node keeps), then runs again past the
    # grace period.
    host, ports, wanted = _in_process(a, _desired(tmp_path, NODE, {VF4: Y}, "a-without-x"))
    for ahead in (0, 16 * 60):
        result = reconcile(
            replace(ports, observe_cluster=_later(host, a, ahead)),
            wanted,
            settings=RunSettings(verify_timeout=5.0),
        )
        assert result.ok, result
    assert _vgpus(a) == {VF4: Y}

    # virt-handler's heartbeat on B takes nothing: X is still listed.
    swept = sweep(b.dir, stored_kubevirt(emu), wait=False)
    assert dict(swept.removed) == {}, f"the sweep took B's vGPUs: {dict(swept.removed)}"
    assert _vgpus(b) == {VF4: Y, VF5: X}
    assert X in mdev_selectors(emu)


def test_the_run_after_one_that_published_intent_plans_nothing(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """A run creating its first vGPU of X publishes its intent (every plan carries it: on the
    node, from the cluster alone, saved), then writes its summary as the planner renders it:
    the next plan is "No changes" (the intent leaves nothing behind that
    the planner would write again), and B's summary shows X as a vGPU it has."""
    b = cluster_node(tmp_path, emu, name=OTHER)
    b.ok("apply", _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x"), "--yes")
    b_with_x = _desired(tmp_path, OTHER, {VF4: Y, VF5: X}, "b-with-x")
    intent = {"node": OTHER, "profiles": [{"name": X, "wanted": 1}]}
    # Planned on the node and from the cluster alone (fleet planning), and saved.
    for observed in ((), ("--observed", "cluster")):
        plan = json.loads(b.ok("plan", b_with_x, *observed, "-o", "json").stdout)
        if "plans" in plan:
            (plan,) = [p for p in plan["plans"] if p["node"] == OTHER]
        first = plan["actions"][0]
        assert first["kind"] == "kubevirt-allow", observed
        assert first["intent"] == intent, observed
    text = b.ok("plan", b_with_x).stdout
    assert f"VGPUNodeState {OTHER}: intent published first: {X} (wanted 1)" in text
    saved = tmp_path / "b-plan.json"
    b.ok("plan", b_with_x, "--out", saved)
    assert json.loads(saved.read_text())["actions"][0]["intent"] == intent

    applied = b.ok("apply", saved, "--yes")
    assert "Converged" in applied.stdout
    assert f"vgpunodestates/{OTHER}: intent to create {X} (wanted 1) published" in (
        applied.stdout + applied.stderr
    )
    assert "No changes" in b.ok("plan", b_with_x).stdout
    state = emu.get_object("vgpu.reconciler.dev", "v1alpha1", "vgpunodestates", OTHER)
    assert state is not None
    profiles = {p["name"]: p for p in state["status"]["profiles"]}
    assert (profiles[X]["wanted"], profiles[X]["vgpus"]) == (1, 1)
    # A type the stored summary shows already: no intent.
    again = json.loads(b.ok("plan", b_with_x, "-o", "json").stdout)
    assert not [a for a in again["actions"] if a.get("intent")]


def test_an_intent_the_api_server_refuses_stops_the_run_before_the_allow_list_and_the_host(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """B's VGPUNodeState cannot be written (a webhook refuses it): the kubevirt-allow fails
    at its intent, before the KubeVirt CR is written, and no host action runs: no vGPU of X
    exists that no summary would show."""
    from tests.doubles.admission import Attributes
    from tests.doubles.emulator import WebhookDenial

    b = cluster_node(tmp_path, emu, name=OTHER)
    b.ok("apply", _desired(tmp_path, OTHER, {VF4: Y}, "b-without-x"), "--yes")
    kubevirt_before = stored_kubevirt(emu)

    def deny(a: Attributes) -> WebhookDenial | None:
        return WebhookDenial("not now", code=403, reason="Forbidden")

    rule = {
        "operations": ["CREATE", "UPDATE"],
        "apiGroups": ["vgpu.reconciler.dev"],
        "apiVersions": ["v1alpha1"],
        "resources": ["vgpunodestates", "vgpunodestates/status"],
        "scope": "Cluster",
    }
    emu.register_webhook("deny.test", deny, rules=[rule])
    res = b.run("apply", _desired(tmp_path, OTHER, {VF4: Y, VF5: X}, "b-with-x"), "--yes")
    assert res.returncode != 0, res.stdout + res.stderr
    assert "not now" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert _vgpus(b) == {VF4: Y}
    assert stored_kubevirt(emu) == kubevirt_before
