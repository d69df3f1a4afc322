"""Delegate mode end to end (docs/delegate.md): ``vgpuctl plan``/``apply``/``assert`` as a user
runs them against the API-server emulator serving Harvester's CRDs, with the double of
pcidevices-controller and its webhook (``tests/doubles/pcidevices.py``) running in its thread on
a simulated A2 (NVIDIA's vendor-specific VFIO interface, as bdd8025 drives it).

vgpuctl never touches the host here: every change on it is the double's, acting on the specs
vgpuctl writes. Expectations from the seed's desired state (four 4 GB vGPUs on VFs 0-3, i.e.
functions 4-7) and docs/domain.md §5-6; the host is judged from its own files.
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from tests import rbac
from tests.doubles.emulator import ApiServerEmulator
from tests.harvester_node import (
    DRIVER_POD,
    NODE,
    SEED,
    VFS,
    Cluster,
    driver_pod_on,
    harvester_node,
    layout,
    seed_with,
    vm_holds,
)
from tests.simnode import run_vgpuctl
from tests.watch_agent import wait_for

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path) as cluster:
        yield cluster


def test_the_seeds_node_converges_through_pcidevices_controller(harvester: Cluster) -> None:
    plan = harvester.run("plan", SEED, "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    # Found on its own (the controller's webhook configuration), said in one line.
    assert "delegate mode" in plan.stderr
    assert "+ sriov 0000:08:00.0  enable  (SRIOVGPUDevice harvester-kgd9c-000008000)" in plan.stdout
    md = harvester.ok("plan", SEED, "-o", "markdown").stdout
    assert (
        "| `+` | 0000:08:00.0 | sriov 0000:08:00.0  enable  (SRIOVGPUDevice "
        "harvester-kgd9c-000008000) | SR-IOV is off; desired on |"
    ) in md.splitlines()
    # The whole plan ahead of time (issue 30, item 3): each VF's profile on the VGPUDevice
    # pcidevices-controller will make after the enable, named after the VF (docs/domain.md §5).
    for vf, name, profile in AHEAD:
        assert (
            f"+ vgpu {vf}  {profile}  (VGPUDevice {name})  (after the enable; VGPUDevice not "
            "made yet)"
        ) in plan.stdout
    assert "its VFs are planned once" not in plan.stdout
    assert "Plan: 5 to create, 0 to change, 0 to remove, 0 blocked." in plan.stdout
    # The double made the A2's PCIDevice (10de:25b6): the seed's "model: NVIDIA A2" is checked.
    assert "not checked" not in plan.stdout

    applied = harvester.ok("apply", SEED, "--yes")
    # One round: the VF steps were planned with the enable, and nothing is left after it.
    assert "round 1" in applied.stderr and "round 2" not in applied.stderr
    # The A2's type ids (docs/domain.md §4: 742-756 on this branch; the double lists them in
    # the simulator's order): 4A is 751, 4Q 746.
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    md = harvester.ok("plan", SEED, "-o", "markdown").stdout
    assert md.splitlines()[2] == (
        "**1 node, 0 with changes: 0 to create, 0 to change, 0 to remove, 0 blocked** "
        "(observed: harvester)"
    )
    assert "No changes" in harvester.ok("plan", SEED).stdout
    assert harvester.run("assert", SEED).returncode == 0
    assert harvester.ctl.errors == []


#: The seed's four vGPUs, by hand from docs/domain.md §1 and §5: the A2's VF i is function
#: 4 + i of 0000:08:00 (its SR-IOV VF offset 4, stride 1), and pcidevices-controller names its
#: VGPUDevice <node>-<VF address without ':' and '.'> (gpuhelper.go generateVGPUDevice).
AHEAD = [
    ("0000:08:00.4", "harvester-kgd9c-000008004", "NVIDIA A2-4A"),
    ("0000:08:00.5", "harvester-kgd9c-000008005", "NVIDIA A2-4Q"),
    ("0000:08:00.6", "harvester-kgd9c-000008006", "NVIDIA A2-4A"),
    ("0000:08:00.7", "harvester-kgd9c-000008007", "NVIDIA A2-4Q"),
]


def test_the_plan_of_a_gpu_whose_sriov_is_off_has_its_vfs_too(harvester: Cluster) -> None:
    """Issue 30, item 3: plan -o json, -o markdown and text show the enable, then each VF's
    profile on the VGPUDevice that does not exist yet; apply converges in one run; a plan
    after it finds nothing to do."""
    doc = json.loads(harvester.ok("plan", SEED, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    first, *vfs = node_plan["actions"]
    assert (first["seq"], first["kind"], first["target"], first["gpu"]) == (
        1, "sriovgpudevice-enable", "harvester-kgd9c-000008000", "0000:08:00.0"
    )  # fmt: skip
    assert [
        (a["seq"], a["kind"], a["target"], a["node"], a["gpu"], a["vf"], a["vfIndex"], a["type"],
         a["objectExists"], a["resourceVersion"])
        for a in vfs
    ] == [
        (2 + i, "vgpudevice-enable", name, NODE, "0000:08:00.0", vf, i, profile, False, "")
        for i, (vf, name, profile) in enumerate(AHEAD)
    ]  # fmt: skip
    assert doc["summary"] == {"nodes": 1, "nodesWithChanges": 1, "create": 5, "change": 0,
                              "remove": 0, "blocked": 0}  # fmt: skip
    assert node_plan["notes"] == []
    md = harvester.ok("plan", SEED, "-o", "markdown").stdout.splitlines()
    for vf, name, profile in AHEAD:
        assert (
            f"| `+` | 0000:08:00.0 | vgpu {vf}  {profile}  (VGPUDevice {name})  (after the "
            f"enable; VGPUDevice not made yet) | VF {vf} has no vGPU; desired {profile} |"
        ) in md

    applied = harvester.ok("apply", SEED, "--yes")
    assert "round 2" not in applied.stderr
    for i, (_vf, name, profile) in enumerate(AHEAD, start=2):
        assert f"{i} vgpudevice-enable {name}: enabled {profile}" in applied.stderr
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    assert harvester.ok("assert", SEED).returncode == 0
    doc = json.loads(harvester.ok("plan", SEED, "-o", "json").stdout)
    assert doc["plans"][0]["actions"] == [] and doc["summary"]["create"] == 0
    # Each VF's spec was written once (a JSON patch), the GPU's once.
    written = [(r.resource, r.name) for r, _ in harvester.emu.patches]
    assert written == [
        ("sriovgpudevices", "harvester-kgd9c-000008000"),
        *(("vgpudevices", name) for _vf, name, _p in AHEAD),
    ]
    assert harvester.ctl.errors == []


def test_the_count_form_is_planned_ahead_too(harvester: Cluster, tmp_path: Path) -> None:
    # profiles: two A2-4Q, no VF named: the first free VFs in index order, 0 and 1.
    doc = yaml.safe_load(SEED.read_text())
    gpu = doc["spec"]["nodes"][NODE]["gpus"][0]
    del gpu["vgpus"]
    gpu["profiles"] = {"NVIDIA A2-4Q": 2}
    counted = tmp_path / "counted.yaml"
    counted.write_text(yaml.safe_dump(doc))
    plan = json.loads(harvester.ok("plan", counted, "-o", "json").stdout)
    assert [
        (a["kind"], a["target"], a.get("vf"), a.get("type"), a.get("objectExists"))
        for a in plan["plans"][0]["actions"]
    ] == [
        ("sriovgpudevice-enable", "harvester-kgd9c-000008000", None, None, None),
        ("vgpudevice-enable", "harvester-kgd9c-000008004", VFS[0], "NVIDIA A2-4Q", False),
        ("vgpudevice-enable", "harvester-kgd9c-000008005", VFS[1], "NVIDIA A2-4Q", False),
    ]
    applied = harvester.ok("apply", counted, "--yes")
    assert "round 2" not in applied.stderr
    assert harvester.types() == {VFS[0]: "746", VFS[1]: "746"}
    assert harvester.ok("assert", counted).returncode == 0
    assert "No changes" in harvester.ok("plan", counted).stdout


def test_vfs_made_elsewhere_than_predicted_fail_the_step_and_nothing_is_written(
    emu: ApiServerEmulator, tmp_path: Path
) -> None:
    """A board whose SR-IOV VF offset is 8, not the catalogue's 4: its VFs are 0000:08:01.0
    onwards (0x800 + 8 = 0x808), so pcidevices-controller makes harvester-kgd9c-000008010 …,
    never the VGPUDevices the plan predicted. Apply fails at the first VF step, naming both,
    and writes no VGPUDevice; planned again from the objects made, the count form converges."""
    with harvester_node(emu, tmp_path, vf_offset=8) as cluster:
        res = cluster.run("apply", SEED, "--yes")
        assert res.returncode == 1, res.stdout + res.stderr
        assert (
            "error: vgpudevice-enable harvester-kgd9c-000008004: the plan predicted VGPUDevice "
            "harvester-kgd9c-000008004 for VF 0000:08:00.4 (VF 0 of GPU 0000:08:00.0, from the "
            "catalogue's VF offset and stride), but pcidevices-controller made other "
            "VGPUDevices: harvester-kgd9c-000008010, harvester-kgd9c-000008011, "
            "harvester-kgd9c-000008012, harvester-kgd9c-000008013, … (16 in all) "
            "(status.vGPUDevices of harvester-kgd9c-000008000); nothing was written to it: run "
            "plan again, which plans from the objects made"
        ) in res.stderr
        assert cluster.types() == {}
        assert [r.resource for r, _ in cluster.emu.patches] == ["sriovgpudevices"]
        doc = yaml.safe_load(SEED.read_text())
        gpu = doc["spec"]["nodes"][NODE]["gpus"][0]
        del gpu["vgpus"]
        gpu["profiles"] = {"NVIDIA A2-4Q": 2}
        counted = tmp_path / "counted.yaml"
        counted.write_text(yaml.safe_dump(doc))
        cluster.ok("apply", counted, "--yes")
        assert cluster.types() == {"0000:08:01.0": "746", "0000:08:01.1": "746"}


def test_kubectl_get_vgpudevices_shows_the_result(harvester: Cluster) -> None:
    """The acceptance's last step, as a user runs it: kubectl (Harvester's printer columns,
    printed by the emulator as the API server prints them) shows each VF's vGPU type."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (.ci/run installs it)")
    harvester.ok("apply", SEED, "--yes")
    shown = subprocess.run(
        [kubectl, "--kubeconfig", str(harvester.kubeconfig), "get", "vgpudevices"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert shown[0].split() == [
        "NAME", "ADDRESS", "NODE", "NAME", "ENABLED", "UUID", "VGPUTYPE", "PARENTGPUDEVICE"
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in shown[1:]}
    assert len(rows) == 16  # the A2's 16 VFs, each a VGPUDevice
    expected = {VFS[0]: "NVIDIA A2-4A", VFS[1]: "NVIDIA A2-4Q", VFS[2]: "NVIDIA A2-4A",
                VFS[3]: "NVIDIA A2-4Q"}  # fmt: skip
    for vf, profile in expected.items():
        name = f"{NODE}-0000{vf[5:7]}{vf[8:10]}{vf[11]}"
        address, node, enabled, _uuid, *vgpu_type, parent = rows[name]
        assert (address, node, enabled, " ".join(vgpu_type), parent) == (
            vf, NODE, "true", profile, "0000:08:00.0"
        )  # fmt: skip
    disabled = [r for n, r in rows.items() if r[2] == "false"]
    assert len(disabled) == 12


def test_a_hand_edit_is_drift_that_assert_reports_and_apply_resets(harvester: Cluster) -> None:
    harvester.ok("apply", SEED, "--yes")
    # Someone disables VF 1's vGPU by hand (Harvester's UI does this write).
    name = f"{NODE}-000008005"
    api = config.new_client_from_config(config_file=str(harvester.kubeconfig))
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        "devices.harvesterhci.io", "v1beta1", "vgpudevices", name, {"spec": {"enabled": False}}
    )
    api.close()
    harvester.ctl.run_until_idle()
    res = harvester.run("assert", SEED)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"node {NODE} has drifted: 1 to create" in res.stdout
    doc = json.loads(harvester.ok("plan", SEED, "-o", "json").stdout)
    assert doc["summary"] == {"nodes": 1, "nodesWithChanges": 1, "create": 1, "change": 0,
                              "remove": 0, "blocked": 0}  # fmt: skip
    harvester.ok("apply", SEED, "--yes")
    assert harvester.run("assert", SEED).returncode == 0
    assert harvester.types()[VFS[1]] == "746"


def test_a_profile_change_and_a_shrink(harvester: Cluster, tmp_path: Path) -> None:
    harvester.ok("apply", SEED, "--yes")
    changed = layout(tmp_path, {VFS[0]: "NVIDIA A2-4A", VFS[1]: "NVIDIA A2-4Q",
                                VFS[3]: "NVIDIA A2-4A"})  # fmt: skip
    plan = harvester.ok("plan", changed)
    assert "-/+ vgpu 0000:08:00.7  NVIDIA A2-4Q → NVIDIA A2-4A" in plan.stdout
    assert "- vgpu 0000:08:00.6  NVIDIA A2-4A" in plan.stdout
    harvester.ok("apply", changed, "--yes")
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[3]: "751"}
    assert "No changes" in harvester.ok("plan", changed).stdout


def test_later_rounds_apply_the_desired_state_that_was_confirmed(
    harvester: Cluster, tmp_path: Path
) -> None:
    # The GPU enable and its VFs' steps (planned ahead) are round 1. The file is edited the
    # moment the enable is written: the VF steps are still the state the user confirmed.
    desired = tmp_path / "desired.yaml"
    desired.write_text(SEED.read_text())
    edited: list[bool] = []

    def edit_on_enable(_attributes: object) -> None:
        if not edited:
            edited.append(True)
            desired.write_text(layout(tmp_path, {VFS[0]: "NVIDIA A2-2Q"}).read_text())

    rule = {
        "operations": ["UPDATE"],
        "apiGroups": ["devices.harvesterhci.io"],
        "apiVersions": ["v1beta1"],
        "resources": ["sriovgpudevices"],
        "scope": "Cluster",
    }
    harvester.emu.register_webhook("edit.test", edit_on_enable, rules=[rule])  # type: ignore[arg-type]
    harvester.ok("apply", desired, "--yes")
    assert edited  # the edit happened during the run
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}


def test_a_gpu_shrunk_to_sriov_off(harvester: Cluster, tmp_path: Path) -> None:
    # Every vGPU disabled first (the controller removes each), then the GPU (sriov-manage -d
    # through the controller): the host ends with SR-IOV off.
    harvester.ok("apply", SEED, "--yes")
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["nodes"][NODE]["gpus"][0] = {"address": "0000:08:00.0", "sriov": "disabled"}
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(doc))
    plan = json.loads(harvester.ok("plan", off, "-o", "json").stdout)
    (node_plan,) = plan["plans"]
    assert [a["kind"] for a in node_plan["actions"]] == [
        *(["vgpudevice-disable"] * 4),
        "sriovgpudevice-disable",
    ]
    harvester.ok("apply", off, "--yes")
    numvfs = harvester.host.sysfs_root / "bus/pci/devices/0000:08:00.0/sriov_numvfs"
    assert numvfs.read_text().strip() == "0"
    assert harvester.types() == {}
    assert "No changes" in harvester.ok("plan", off).stdout


def test_a_vgpu_a_vm_uses_is_never_disabled(harvester: Cluster, tmp_path: Path) -> None:
    harvester.ok("apply", SEED, "--yes")
    name = vm_holds(harvester, VFS[1])
    assert name == f"{NODE}-000008005"
    changed = tmp_path / "changed.yaml"
    changed.write_text(seed_with(VFS[1], "NVIDIA A2-4A"))
    plan = harvester.run("plan", changed, "-o", "json")
    doc = json.loads(plan.stdout)
    (node_plan,) = doc["plans"]
    assert node_plan["actions"] == []
    assert [(b["kind"], b["target"]) for b in node_plan["blocked"]] == [
        ("vgpudevice-disable", name),
        ("vgpudevice-enable", name),
    ]
    assert "in use by VM default/win11" in node_plan["blocked"][0]["reason"]
    res = harvester.run("apply", changed, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert harvester.types()[VFS[1]] == "746"  # still its 4Q


#: Why the seed's node waits while its driver pod crash-loops, from the pod's status as
#: tests/doubles/pcidevices.py ``driver_pod`` writes it (the kubelet's words).
DRIVER_NOT_READY = (
    f"the NVIDIA driver pod harvester-system/{DRIVER_POD} on node {NODE} is not ready "
    "(phase Running; Ready: False (ContainersNotReady); container nvidia-driver-ctr waiting: "
    "CrashLoopBackOff)"
)


def test_a_node_whose_driver_pod_is_not_ready_is_blocked_until_it_is(harvester: Cluster) -> None:
    """Issue 30, item 4: pcidevices-controller runs no sriov-manage while the node's NVIDIA
    driver pod is not ready (manageGPU's readiness check fails, the key is requeued): plan
    says so on the step, apply writes nothing and ends at once (not at a wait's timeout),
    assert reports drift; once the pod runs, apply converges."""
    driver_pod_on(harvester, running=False)
    doc = json.loads(harvester.run("plan", SEED, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    assert node_plan["actions"] == []
    blocked = node_plan["blocked"]
    assert (blocked[0]["kind"], blocked[0]["target"]) == (
        "sriovgpudevice-enable",
        f"{NODE}-000008000",
    )
    assert blocked[0]["reason"] == (
        f"{DRIVER_NOT_READY}: pcidevices-controller waits for it before any host work "
        "(gpu_controller.go manageGPU → executor CheckReady)"
    )
    # Any VF step planned ahead of the enable waits for the same pod.
    assert all(b["reason"].startswith(DRIVER_NOT_READY) for b in blocked)
    text = harvester.run("plan", SEED).stdout
    assert DRIVER_NOT_READY in text
    # --timeout 20: an apply that wrote the enable would wait for the controller that long.
    res = harvester.run("apply", SEED, "--yes", "--timeout", "20")
    assert res.returncode == 2, res.stdout + res.stderr
    assert DRIVER_NOT_READY in res.stdout
    assert "within 20 s" not in res.stdout + res.stderr
    gpu = harvester.emu.get_object("devices.harvesterhci.io", "v1beta1", "sriovgpudevices",
                                   f"{NODE}-000008000")  # fmt: skip
    assert gpu is not None and gpu["spec"]["enabled"] is False  # nothing written
    assert harvester.ctl.sriov_manage_calls == []
    res = harvester.run("assert", SEED)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (
        f"node {NODE} has drifted: 0 to create, 0 to change, 0 to remove, {len(blocked)} blocked"
        in res.stdout
    )
    # The pod's container runs: the controller's next retry passes its readiness check.
    driver_pod_on(harvester, running=True)
    harvester.ok("apply", SEED, "--yes")
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    assert harvester.run("assert", SEED).returncode == 0


def test_a_write_the_controller_cannot_carry_out_for_the_driver_pod_names_it(
    harvester: Cluster,
) -> None:
    """The pod stops running while apply waits for the controller (after its plan): the wait
    that runs out names the pod, not the node resync."""
    driver_pod_on(harvester, running=True)

    def crash_on_enable(_attributes: object) -> None:
        driver_pod_on(harvester, running=False)

    rule = {
        "operations": ["UPDATE"],
        "apiGroups": ["devices.harvesterhci.io"],
        "apiVersions": ["v1beta1"],
        "resources": ["sriovgpudevices"],
        "scope": "Cluster",
    }
    harvester.emu.register_webhook("crash.test", crash_on_enable, rules=[rule])  # type: ignore[arg-type]
    res = harvester.run("apply", SEED, "--yes", "--timeout", "3")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"pcidevices-controller made no VGPUDevices for {NODE}-000008000 within 3 s (VFs: 0, "
        f"VGPUDevices listed: 0): {DRIVER_NOT_READY}: pcidevices-controller waits for it before "
        "any host work (gpu_controller.go manageGPU → executor CheckReady)"
    ) in res.stderr
    assert "node resync" not in res.stderr
    assert any(e.message.startswith("error during readiness check: ") for e in harvester.ctl.errors)


def test_the_delegate_role_is_enough_and_no_more(harvester: Cluster, tmp_path: Path) -> None:
    """deploy/harvester/rbac.yaml enforced on vgpuctl's own requests (the double acts as
    itself): a plan, an apply that converges the seed's node and an assert are all allowed,
    and every rule of the role but the watch's own is used."""
    role = rbac.enforce(harvester.emu, rbac.DELEGATE_RBAC, rbac.DELEGATE_ACCOUNT)
    kubeconfig = harvester.emu.kubeconfig(tmp_path / "delegate.kubeconfig", user=role.user)
    harvester.emu.seed(node_object("harvester-kgd9c"))
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(GROUPED)  # node groups: the Nodes are listed
    for args in (
        ("plan", SEED),
        ("apply", SEED, "--yes"),
        ("assert", SEED),
        ("assert", grouped),
    ):
        res = run_vgpuctl(*args, "--kubeconfig", kubeconfig, timeout=300)
        assert res.returncode == 0, f"{args}: {res.stdout}{res.stderr}"
    assert role.refused() == []
    # What only the watch needs (its own recording test uses every rule, these included).
    assert {(g.resource, g.verb) for g in rbac.unused(role.granted, role.requests)} == {
        ("sriovgpudevices", "watch"),
        ("vgpudevices", "watch"),
        ("leases", "create"),
        ("leases", "get"),
        ("leases", "update"),
        ("events", "create"),
    }
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}


def test_delegate_none_keeps_the_node_local_guard(harvester: Cluster) -> None:
    # The operator asked for node-local mode: it still refuses to act while the controller
    # runs (never two controllers on one GPU), and says how.
    res = run_vgpuctl(
        "apply", SEED, "--yes", "--delegate", "none", "--kubeconfig", harvester.kubeconfig,
        "--sysfs-root", harvester.host.sysfs_root, "--node", NODE,
    )  # fmt: skip
    assert res.returncode == 1
    assert "pcidevices-controller" in res.stderr
    assert harvester.types() == {}


#: The seed's layout, given by a node group that selects the node by name and its GPU by the
#: device ID its PCIDevice names.
GROUPED = (
    "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
    "metadata: {name: lab}\nspec:\n  nodeGroups:\n    - name: a2\n"
    '      selector: {names: ["harvester-*"]}\n'
    "      gpus:\n        - match: {deviceId: 25b6}\n          sriov: enabled\n"
    "          vgpus: {0: NVIDIA A2-4A, 1: NVIDIA A2-4Q, 2: NVIDIA A2-4A, 3: NVIDIA A2-4Q}\n"
)


def node_object(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def test_node_groups_converge_through_pcidevices_controller(
    harvester: Cluster, tmp_path: Path
) -> None:
    """Delegate mode expands node groups over the cluster's Nodes and matches their GPUs by
    what Harvester's objects say of them (address, the PCIDevice's device ID)."""
    harvester.emu.seed(node_object("harvester-kgd9c"))
    harvester.emu.seed(node_object("cpu-only"))  # selected by no group: not planned
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(GROUPED)
    plan = harvester.ok("plan", grouped)
    assert "cpu-only" not in plan.stdout
    harvester.ok("apply", grouped, "--yes")
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    assert "No changes" in harvester.ok("plan", grouped).stdout
    assert harvester.ctl.errors == []


def test_a_model_harvesters_objects_cannot_tell_is_not_guessed(
    harvester: Cluster, tmp_path: Path
) -> None:
    """A PCIDevice names vendor and device only, and the A2 and the A16 share 10de:25b6: a
    group matching by model cannot be decided there, and says so, naming the entry."""
    harvester.emu.seed(node_object("harvester-kgd9c"))
    by_model = tmp_path / "by-model.yaml"
    by_model.write_text(GROUPED.replace("deviceId: 25b6", "model: A2"))
    res = harvester.run("apply", by_model, "--yes")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        "by-model.yaml:9:11: GPU 0000:08:00.0 of node harvester-kgd9c may be NVIDIA A16 or "
        "NVIDIA A2 (PCI device 25b6): node group 'a2' matches NVIDIA A2 by model, which cannot "
        "tell them apart here; match it by deviceId or address"
    ) in res.stderr
    assert harvester.types() == {}


# --- issue 30, item 1: status is the truth --------------------------------------------------


def _patches(emu: ApiServerEmulator, name: str) -> int:
    """How many JSON patches of the VGPUDevice ``name`` the API server received."""
    return sum(1 for r, _ in emu.patches if r.resource == "vgpudevices" and r.name == name)


def test_an_enable_the_controller_fails_after_admission_is_pending_not_converged(
    harvester: Cluster, tmp_path: Path
) -> None:
    one = layout(tmp_path, {VFS[0]: "NVIDIA A2-4A"})
    name = f"{NODE}-000008004"
    # The host refuses the vGPU (enableVGPU's current_vgpu_type write), after the webhook
    # admitted the spec: the spec stays enabled: true, the status says nothing, it is retried.
    harvester.ctl.refuse_enable = errno.EPERM
    res = harvester.run("apply", one, "--yes", "--timeout", "4")
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        f"pcidevices-controller has not carried out the enable of NVIDIA A2-4A on {name} after "
        "4 s (spec.enabled: true; status.vGPUStatus: empty"
    ) in res.stderr
    assert harvester.types() == {}
    assert any(
        e.message.startswith(f"error writing to create file for vgpu {name}")
        for e in harvester.ctl.errors
    )
    # Not converged: assert says so (exit 2), plan shows the step as pending.
    res = harvester.run("assert", one)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (
        f"node {NODE} has drifted: 1 to create, 0 to change, 0 to remove, 0 blocked "
        "(1 pending: written, not carried out)"
    ) in res.stdout
    shown = harvester.run("plan", one).stdout
    assert f"+ vgpu {VFS[0]}  NVIDIA A2-4A  (VGPUDevice {name})  pending" in shown
    assert "pending: pcidevices-controller has not carried out the spec" in shown
    # A later apply waits again: it does not write the same spec a second time.
    assert harvester.run("apply", one, "--yes", "--timeout", "2").returncode == 1
    assert _patches(harvester.emu, name) == 1
    # The controller is fixed: its next retry makes the vGPU; vgpuctl wrote the spec once.
    harvester.ctl.refuse_enable = None
    wait_for(lambda: harvester.types() == {VFS[0]: "751"}, "the controller's retry", 60)
    wait_for(lambda: harvester.run("assert", one).returncode == 0, "assert converged", 60)
    assert _patches(harvester.emu, name) == 1


def test_a_status_the_controller_writes_late_is_pending_until_it_does(
    harvester: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    one = layout(tmp_path / "one", {VFS[0]: "NVIDIA A2-4A"})
    two = layout(tmp_path / "two", {VFS[0]: "NVIDIA A2-4A", VFS[1]: "NVIDIA A2-4A"})
    harvester.ok("apply", one, "--yes")
    # The controller's informers deliver changes late (longer than apply waits, here).
    harvester.ctl.informer_lag = 600.0
    assert harvester.run("apply", two, "--yes", "--timeout", "2").returncode == 1
    res = harvester.run("assert", two)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "(1 pending: written, not carried out)" in res.stdout
    harvester.ctl.informer_lag = 0.0
    wait_for(lambda: harvester.run("assert", two).returncode == 0, "the late status", 60)
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "751"}
    assert _patches(harvester.emu, f"{NODE}-000008005") == 1
