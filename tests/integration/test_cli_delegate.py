"""Delegate mode end to end (docs/delegate.md): ``vgpuctl plan``/``apply``/``assert`` as a user
runs them against the API-server emulator serving Harvester's CRDs, with the double of
pcidevices-controller and its webhook (``tests/doubles/pcidevices.py``) running in its thread on
a simulated A2 (NVIDIA's vendor-specific VFIO interface, as bdd8025 drives it).

vgpuctl never touches the host here: every change on it is the double's, acting on the specs
vgpuctl writes. Expectations from the seed's desired state (four 4 GB vGPUs on VFs 0-3, i.e.
functions 4-7) and docs/domain.md §5-6; the host is judged from its own files.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from reconciler.sim import SimHost, build_host
from tests import rbac
from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.doubles.pcidevices import PciDevicesController, install, node_object, vm
from tests.simnode import REPO, run_vgpuctl

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)
NODE = "harvester-kgd9c"
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
VFS = ["0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7"]


@dataclass
class Cluster:
    emu: ApiServerEmulator
    host: SimHost
    ctl: PciDevicesController
    kubeconfig: Path

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return run_vgpuctl(*args, "--kubeconfig", self.kubeconfig, timeout=300)

    def ok(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        res = self.run(*args)
        assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
        return res

    def types(self) -> dict[str, str]:
        """Each VF's current_vgpu_type that is not 0, as the host has it."""
        out = {}
        for vf in sorted((self.host.sysfs_root / "bus/pci/devices").glob("0000:08:0*")):
            current = vf / "nvidia" / "current_vgpu_type"
            if current.exists() and current.read_text().strip() != "0":
                out[vf.name] = current.read_text().strip()
        return out


def layout(tmp_path: Path, vgpus: dict[str, str]) -> Path:
    """The seed's desired state with another VF layout."""
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["nodes"][NODE]["gpus"][0]["vgpus"] = vgpus
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    install(emu)
    emu.seed(node_object(NODE))
    gpu = {"model": "A2", "address": "0000:08:00.0", "interface": "vfio", "sriov": "disabled"}
    host = build_host(tmp_path / "host", {"gpus": [gpu]})
    kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    with PciDevicesController(emu, host, NODE, kubeconfig) as ctl:
        ctl.resync()
        ctl.run_until_idle()
        ctl.start(resync_seconds=0.5)
        yield Cluster(emu, host, ctl, kubeconfig)
        ctl.stop()


def test_the_seeds_node_converges_through_pcidevices_controller(harvester: Cluster) -> None:
    plan = harvester.run("plan", SEED, "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    # Found on its own (the controller's webhook configuration), said in one line.
    assert "delegate mode" in plan.stderr
    assert "+ sriov 0000:08:00.0  enable  (SRIOVGPUDevice harvester-kgd9c-000008000)" in plan.stdout
    assert "its VFs are planned once pcidevices-controller has made" in plan.stdout
    # The double made the A2's PCIDevice (10de:25b6): the seed's "model: NVIDIA A2" is checked.
    assert "not checked" not in plan.stdout

    harvester.ok("apply", SEED, "--yes")
    # The A2's type ids (docs/domain.md §4: 742-756 on this branch; the double lists them in
    # the simulator's order): 4A is 751, 4Q 746.
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    assert "No changes" in harvester.ok("plan", SEED).stdout
    assert harvester.run("assert", SEED).returncode == 0
    assert harvester.ctl.errors == []


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
    name = f"{NODE}-000008005"
    harvester.emu.seed(vm("win11", "default", hostdevices={"nvidia.com/NVIDIA_A2-4Q": [name]}))
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        SEED.read_text().replace('"0000:08:00.5": NVIDIA A2-4Q', '"0000:08:00.5": NVIDIA A2-4A')
    )
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


def test_the_delegate_role_is_enough_and_no_more(harvester: Cluster, tmp_path: Path) -> None:
    """deploy/harvester/rbac.yaml enforced on vgpuctl's own requests (the double acts as
    itself): a plan, an apply that converges the seed's node and an assert are all allowed,
    and every rule of the role is used."""
    granted = rbac.grants(rbac.DELEGATE_RBAC, rbac.DELEGATE_ACCOUNT)
    account = rbac.DELEGATE_ACCOUNT
    user = UserInfo(f"system:serviceaccount:{account['namespace']}:{account['name']}")
    ours: list[Request] = []

    def authorize(request: Request, who: UserInfo) -> bool:
        if who != user:
            return True  # the double, and the test itself
        ours.append(request)
        return rbac.allows(granted, request)

    harvester.emu.authorize_with(authorize)
    kubeconfig = harvester.emu.kubeconfig(tmp_path / "delegate.kubeconfig", user=user)
    for args in (("plan", SEED), ("apply", SEED, "--yes"), ("assert", SEED)):
        res = run_vgpuctl(*args, "--kubeconfig", kubeconfig, timeout=300)
        assert res.returncode == 0, f"{args}: {res.stdout}{res.stderr}"
    assert [r for r in ours if not rbac.allows(granted, r)] == []
    assert rbac.unused(granted, ours) == set()
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
