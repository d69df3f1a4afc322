"""Never fight Harvester's pcidevices-controller: ``vgpuctl apply`` and ``watch`` against the
API-server emulator, the controller shown by one signal at a time (docs/domain.md §6a).

These are node-local runs (``--delegate none``; without it, a run where the controller runs is
in delegate mode: ``test_cli_delegate.py``). While it runs, or while a read that would tell is
denied, apply exits 1 with one line and changes nothing (the simulated host byte for byte, no
cluster write); watch refuses each reconcile, says so in its log, /readyz and metrics, and goes
on when the controller is gone. What is not the controller (a disabled Addon, a DaemonSet
without a ready pod, Harvester's CRDs left behind) and a cluster without Harvester change
nothing, and say nothing about it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import rbac
from tests.cluster_node import SRIOV, VGPUS, ClusterNode, cluster_node
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.pcidevices_controller import (
    WEBHOOKS,
    addon,
    daemonset,
    install_harvester_crds,
    pcidevice,
    webhook,
)
from tests.simnode import SEED, run_vgpuctl
from tests.watch_agent import SEED_VGPUS, Watch, seed_text, vgpus, wait_for

NODE = "harvester-kgd9c"
RUNNING = "refusing to change node harvester-kgd9c: Harvester's pcidevices-controller is running"
ADVICE = (
    "it manages the same GPUs and objects, and two controllers would undo each other's changes. "
    "Disable the pcidevices-controller Addon to let vgpuctl manage this node's vGPUs, or keep it "
    "and let vgpuctl drive it: --delegate harvester"
)
#: What the reason adds when the webhook configuration is the only sign: it outlives a
#: disabled Addon (the controller applies it itself; its chart does not hold it).
LEFTOVER = (
    ". If the Addon is disabled already, the controller left its webhook configurations behind "
    "(it applies them itself, not its chart): delete "
    "ValidatingWebhookConfiguration pcidevices-validator and MutatingWebhookConfiguration "
    "pcidevices-mutator"
)
UNKNOWN = (
    "refusing to change node harvester-kgd9c: cannot tell whether Harvester's "
    "pcidevices-controller is running"
)
UNKNOWN_END = (
    "vgpuctl acts only when it knows the controller is not running (deploy/rbac.yaml grants "
    "the reads it needs)"
)


def host_files(node: ClusterNode) -> dict[str, str | bytes]:
    """The simulated host, every file and link (vgpuctl's own state directory aside)."""
    found: dict[str, str | bytes] = {}
    for top, dirs, files in os.walk(node.dir):
        dirs[:] = [d for d in dirs if not (Path(top) == node.dir and d == "state")]
        for name in [*dirs, *files]:
            path = Path(top, name)
            key = str(path.relative_to(node.dir))
            if path.is_symlink():
                found[key] = "-> " + os.readlink(path)
            elif path.is_file():
                found[key] = path.read_bytes()
    return found


def looked(emu: ApiServerEmulator) -> bool:
    """Whether vgpuctl read the three objects that would tell."""
    return READS.issubset((r.resource, r.name) for r in emu.requests if r.verb == "get")


def run_controller(emu: ApiServerEmulator, signal: str) -> None:
    if signal == "addon":
        install_harvester_crds(emu)
        emu.seed(addon(enabled=True))
    elif signal == "daemonset":
        emu.seed(daemonset(ready=3))
    else:
        emu.seed(webhook())


#: What vgpuctl reads to tell (resource, name): one get each.
READS = {
    ("addons", "pcidevices-controller"),
    ("daemonsets", "harvester-pcidevices-controller"),
    ("validatingwebhookconfigurations", "pcidevices-validator"),
}
SIGNALS = {
    "addon": "Addon harvester-system/pcidevices-controller is enabled",
    "daemonset": "DaemonSet harvester-system/harvester-pcidevices-controller has 3 ready pods",
    "webhook": "ValidatingWebhookConfiguration pcidevices-validator exists",
}


# -- apply ------------------------------------------------------------------------------------


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_apply_refuses_with_one_line_and_changes_nothing(
    tmp_path: Path, emu: ApiServerEmulator, signal: str
) -> None:
    node = cluster_node(tmp_path, emu)
    run_controller(emu, signal)
    before = host_files(node)
    emu.requests.clear()
    res = node.run("apply", SEED, "--yes", "--delegate", "none")
    assert res.returncode == 1
    assert res.stdout == ""
    leftover = LEFTOVER if signal == "webhook" else ""
    assert res.stderr == f"error: {RUNNING} ({SIGNALS[signal]}): {ADVICE}{leftover}\n"
    assert host_files(node) == before
    assert {r.verb for r in emu.requests} <= {"get", "list", "watch"}  # reads only
    assert not emu.objects(*SRIOV) and not emu.objects(*VGPUS)


def test_apply_refuses_even_with_nothing_to_do(tmp_path: Path, emu: ApiServerEmulator) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes", "--delegate", "none")
    emu.seed(daemonset(ready=1))
    res = node.run("apply", SEED, "--yes", "--delegate", "none")
    assert res.returncode == 1
    one_pod = "DaemonSet harvester-system/harvester-pcidevices-controller has 1 ready pod"
    assert res.stderr == f"error: {RUNNING} ({one_pod}): {ADVICE}\n"


def test_a_saved_plan_is_refused_once_the_controller_runs(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    saved = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", saved, "--delegate", "none")
    emu.seed(webhook())
    before = host_files(node)
    res = node.run("apply", saved, "--yes", "--delegate", "none")
    assert res.returncode == 1
    assert res.stderr == f"error: {RUNNING} ({SIGNALS['webhook']}): {ADVICE}{LEFTOVER}\n"
    assert host_files(node) == before


@pytest.mark.parametrize(
    ("group", "plural", "denied"),
    [
        ("harvesterhci.io", "addons", "addons.harvesterhci.io in namespace harvester-system"),
        ("apps", "daemonsets", "daemonsets.apps in namespace harvester-system"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
        ),
    ],
    ids=["addon", "daemonset", "webhook"],
)
def test_a_denied_read_refuses_naming_the_permission(
    tmp_path: Path, emu: ApiServerEmulator, group: str, plural: str, denied: str
) -> None:
    node = cluster_node(tmp_path, emu)
    install_harvester_crds(emu)
    emu.deny("get", group, plural)
    before = host_files(node)
    res = node.run("apply", SEED, "--yes", "--delegate", "none")
    assert res.returncode == 1
    assert res.stdout == ""
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {UNKNOWN} (RBAC denies get on {denied} (")
    assert line.endswith(f"): {UNKNOWN_END}")
    assert "Traceback" not in res.stderr
    assert host_files(node) == before
    assert not emu.objects(*SRIOV)


@pytest.mark.parametrize("shown", ["addon-disabled", "daemonset-not-ready", "leftover-crds"])
def test_what_is_not_the_controller_changes_nothing(
    tmp_path: Path, emu: ApiServerEmulator, shown: str
) -> None:
    node = cluster_node(tmp_path, emu)
    install_harvester_crds(emu)
    if shown == "addon-disabled":
        emu.seed(addon(enabled=False))
    elif shown == "daemonset-not-ready":
        emu.seed(daemonset(ready=0))
    else:
        emu.seed(pcidevice(NODE))
    emu.requests.clear()
    res = node.ok("apply", SEED, "--yes", "--delegate", "none")
    assert "Converged" in res.stdout
    assert "pcidevices" not in res.stdout + res.stderr
    assert vgpus(node) == SEED_VGPUS
    assert looked(emu)


def test_a_cluster_without_harvester_hears_nothing_of_it(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    emu.requests.clear()
    plan = node.ok("plan", SEED, "--delegate", "none")
    applied = node.ok("apply", SEED, "--yes", "--delegate", "none")
    for res in (plan, applied):
        assert "pcidevices" not in res.stdout + res.stderr
        assert "harvesterhci.io/" not in res.stdout + res.stderr
    # Asked, by name, and answered "not served" or "not found".
    assert looked(emu)


def test_on_harvester_the_shipped_role_is_enough_and_no_more(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """deploy/rbac.yaml enforced per request on a Harvester cluster: the agent reads the three
    objects (no 403, so no refusal for want of a permission) and nothing else of Harvester's;
    the grants name those objects, and no other can be read or listed with them."""
    granted = rbac.grants()
    emu.authorize_with(lambda request, _user: rbac.allows(granted, request))
    install_harvester_crds(emu)
    emu.seed(addon(enabled=False))
    emu.seed(daemonset(ready=0))
    emu.seed(pcidevice(NODE))
    node = cluster_node(tmp_path, emu)
    emu.requests.clear()
    node.ok("apply", SEED, "--yes", "--delegate", "none")
    emu.seed(addon(enabled=True))  # enabled again: refused for that reason, not for RBAC
    res = node.run("apply", SEED, "--yes", "--delegate", "none")
    assert res.stderr == f"error: {RUNNING} ({SIGNALS['addon']}): {ADVICE}\n"
    assert not [r for r in emu.requests if not rbac.allows(granted, r)]
    harvesters = {r.resource for r in emu.requests if r.group == "harvesterhci.io"}
    assert harvesters == {"addons"}
    assert not [r for r in emu.requests if r.resource == "pcidevices"]
    # Granted by name: another Addon, DaemonSet or webhook configuration is not readable.
    for group, plural, namespace, other in (
        ("harvesterhci.io", "addons", "harvester-system", "rancher-logging"),
        ("apps", "daemonsets", "harvester-system", "kube-proxy"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", None, "rancher"),
    ):
        assert not rbac.allows(granted, Request("get", group, plural, None, namespace, other))
        assert not rbac.allows(granted, Request("list", group, plural, None, namespace, None))


# -- plan -------------------------------------------------------------------------------------


def test_plan_still_plans_and_says_apply_would_refuse(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    emu.seed(webhook())
    res = node.ok("plan", SEED, "--delegate", "none")
    note = (
        "vgpuctl apply and watch refuse to act on this node: Harvester's pcidevices-controller "
        f"is running ({SIGNALS['webhook']}): {ADVICE}{LEFTOVER}"
    )
    assert f"Note: {note}\n" in res.stdout
    assert "+ sriov 0000:08:00.0  enable 16 VFs" in res.stdout
    doc = json.loads(node.ok("plan", SEED, "-o", "json", "--delegate", "none").stdout)
    assert doc["notes"][0] == note
    assert doc["actions"]


def test_a_fleet_plan_says_on_each_node_that_apply_would_refuse(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    # Its VGPUNodeState: what a cluster-only plan reads.
    node.ok("apply", SEED, "--yes", "--delegate", "none")
    kubeconfig = emu.kubeconfig(tmp_path / "ci.kubeconfig")
    argv = ("plan", SEED, "--observed", "cluster", "--kubeconfig", kubeconfig)
    quiet = run_vgpuctl(*argv)
    assert quiet.returncode == 0, quiet.stderr
    assert "pcidevices-controller" not in quiet.stdout  # not running: nothing said of it

    install_harvester_crds(emu)
    emu.seed(addon(enabled=True))
    emu.requests.clear()
    res = run_vgpuctl(*argv)
    assert res.returncode == 0, res.stderr
    note = (
        "vgpuctl apply and watch refuse to act on this node: Harvester's pcidevices-controller "
        f"is running ({SIGNALS['addon']}): {ADVICE}"
    )
    assert f"Note: {note}\n" in res.stdout
    assert "Cluster plan: 1 node, 0 with changes" in res.stdout
    assert looked(emu)
    assert {r.verb for r in emu.requests} <= {"get", "list"}
    doc = json.loads(run_vgpuctl(*argv, "-o", "json").stdout)
    assert [p["notes"][0] for p in doc["plans"]] == [note]


# -- watch ------------------------------------------------------------------------------------


def test_watch_refuses_each_reconcile_reports_it_and_goes_on_once_it_is_gone(
    tmp_path: Path, emu: ApiServerEmulator, start_watch: Callable[..., Watch]
) -> None:
    node = cluster_node(tmp_path, emu)
    emu.seed(webhook())
    desired = tmp_path / "desired.yaml"
    desired.write_text(seed_text())
    before = host_files(node)
    emu.requests.clear()
    # The node agent, as its DaemonSet runs it: node-local, never a delegate candidate.
    watch = start_watch(node, desired, "--delegate", "none")
    refused = watch.wait_log(lambda d: d.get("error") == "refused", "the refusal")
    message = f"{RUNNING} ({SIGNALS['webhook']}): {ADVICE}{LEFTOVER}"
    assert refused["level"] == "error"
    assert refused["msg"].startswith(f"reconcile failed: {message}; retrying when")
    assert refused["transient"] is False
    assert watch.get("/readyz") == (503, f"not converged yet: {message}\n")
    assert watch.get("/healthz")[0] == 200  # refusing is not dying
    assert watch.metric("vgpuctl_errors_total", kind="refused") == 1
    assert watch.metric("vgpuctl_reconciles_total", result="failed") == 1
    assert watch.metric("vgpuctl_converged") == 0

    # Every reconcile refuses: an edit of the desired state is the next one.
    desired.write_text(seed_text("NVIDIA A2-4C"))
    wait_for(lambda: watch.metric("vgpuctl_errors_total", kind="refused") == 2, "the 2nd refusal")
    assert host_files(node) == before
    assert {r.verb for r in emu.requests} <= {"get", "list", "watch"}  # reads only
    assert watch.proc.poll() is None

    # The controller gone (its webhook configuration deleted), the next reconcile acts.
    emu.delete_object(*WEBHOOKS, "pcidevices-validator")
    desired.write_text(seed_text())
    wait_for(watch.ready, "the convergence once the controller is gone")
    assert vgpus(node) == SEED_VGPUS
    assert watch.metric("vgpuctl_errors_total", kind="refused") == 2
