"""How vgpuctl stays safe on a real host, driven as a user drives it (the CLI, a subprocess).

The kernel does not refuse to remove a vGPU a VM has open: the removal blocks until the VM
lets go (docs/domain.md §9), and the simulator does the same. So: a holder vgpuctl cannot see must
never be assumed absent, a removal that blocks must not hang vgpuctl, and a GPU passed through
whole must never reach ``sriov-manage``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.sim import SimHost
from tests.simnode import NODE, SEED, SimNode, make_sim, run_vgpuctl

#: The seed's vGPU on VF 0000:08:00.5 (an A2-4Q), and the desired state that changes it.
VF5 = "0000:08:00.5"


def seeded(node: SimNode) -> dict[str, str]:
    """Apply the seed; VF → vGPU UUID."""
    node.ok("apply", SEED, "--yes")
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    return {v["address"]: v["vgpu"]["uuid"] for v in inventory["gpus"][0]["vfs"] if v["vgpu"]}


def changed(tmp_path: Path) -> Path:
    """The seed with VF 0000:08:00.5 changed from A2-4Q to A2-4A (a removal, then a create)."""
    text = SEED.read_text()
    assert '"0000:08:00.5": NVIDIA A2-4Q' in text
    path = tmp_path / "changed.yaml"
    path.write_text(text.replace('"0000:08:00.5": NVIDIA A2-4Q', '"0000:08:00.5": NVIDIA A2-4A'))
    return path


def vgpu_on(node: SimNode, vf: str) -> dict[str, object] | None:
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    for v in inventory["gpus"][0]["vfs"]:
        if v["address"] == vf:
            return v["vgpu"]  # type: ignore[no-any-return]
    raise AssertionError(vf)


# ---------------------------------------------------------------- a holder vgpuctl cannot see


def test_a_removal_that_blocks_fails_within_the_write_timeout(
    a2_node: SimNode, tmp_path: Path
) -> None:
    uuids = seeded(a2_node)
    uuid = uuids[VF5]
    # A VM the hold probe cannot see (another PID namespace, say) has the vGPU open.
    assert run_vgpuctl("sim", "hold", a2_node.dir, uuid, "--hidden").returncode == 0
    assert vgpu_on(a2_node, VF5) == {"type": "NVIDIA A2-4Q", "uuid": uuid, "holder": "",
                                     "iommuGroup": vgpu_on(a2_node, VF5)["iommuGroup"]}  # type: ignore[index]  # fmt: skip
    started = time.monotonic()
    res = a2_node.run("apply", changed(tmp_path), "--yes", "--write-timeout", "1", timeout=60)
    took = time.monotonic() - started
    assert res.returncode == 1, res.stdout + res.stderr
    assert took < 20, f"apply took {took:.1f} s with a 1 s write timeout"
    remove = a2_node.dir / "sys" / "bus" / "mdev" / "devices" / uuid / "remove"
    assert (
        f"writing '1' to {remove} did not return within 1 s: the kernel is waiting for a "
        f"process to release vGPU {uuid}: probably a VM vgpuctl could not see"
    ) in res.stderr
    # The removal is under way (the kernel unlinked the mdev, the VM still has it): it shows as
    # such, its VF is blocked, and a second apply neither blocks nor writes again.
    assert vgpu_on(a2_node, VF5)["removing"] is True  # type: ignore[index]
    plan = a2_node.run("plan", changed(tmp_path))
    assert plan.returncode == 0, plan.stderr
    assert f"has vGPU {uuid} being removed" in plan.stdout
    writes = SimHost(a2_node.dir / "sys").stats()["writes"]
    again = a2_node.run("apply", changed(tmp_path), "--yes", "--write-timeout", "1", timeout=60)
    assert again.returncode == 2, again.stdout + again.stderr
    assert SimHost(a2_node.dir / "sys").stats()["writes"] == writes
    # The VM lets go: the stranded write completes on its own, and the next apply converges.
    assert run_vgpuctl("sim", "release", a2_node.dir, uuid).returncode == 0
    deadline = time.monotonic() + 10
    while vgpu_on(a2_node, VF5) is not None:
        assert time.monotonic() < deadline, "the stranded removal never completed"
        time.sleep(0.1)
    done = a2_node.run("apply", changed(tmp_path), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert vgpu_on(a2_node, VF5)["type"] == "NVIDIA A2-4A"  # type: ignore[index]


needs_pid_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="making a PID namespace (unshare --pid --fork --mount-proc) needs root and unshare",
)


def in_new_pid_namespace(node: SimNode, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``vgpuctl ARGS`` in a PID namespace of its own: it cannot see the host's processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "reconciler",
         *map(str, args), *node.flags],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


@needs_pid_namespace
def test_apply_outside_the_hosts_pid_namespace_blocks_every_removal(
    a2_node: SimNode, tmp_path: Path
) -> None:
    """In a pod without hostPID the probe sees no VM: every vGPU counts as in use."""
    uuids = seeded(a2_node)
    res = in_new_pid_namespace(a2_node, "apply", changed(tmp_path), "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"! vgpu-remove {VF5}" in res.stdout
    assert "counted as in use: cannot see the host's processes (vgpuctl runs in PID namespace" in (
        res.stdout
    )
    assert "in a pod, set hostPID: true" in res.stdout
    assert "Plan: 0 to create, 0 to change, 0 to remove, 2 blocked." in res.stdout
    assert vgpu_on(a2_node, VF5)["uuid"] == uuids[VF5]  # type: ignore[index]
    status = in_new_pid_namespace(a2_node, "status")
    assert status.returncode == 0, status.stderr
    assert "unknown (see note)" in status.stdout
    assert "vgpuctl cannot see every process of the host" in status.stderr
    # An operator who knows no VM can hide from it may say so, explicitly.
    res = in_new_pid_namespace(
        a2_node, "apply", changed(tmp_path), "--yes", "--unsafe-assume-no-hidden-holders"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "assumed that no process vgpuctl cannot see holds a vGPU" in res.stdout
    assert vgpu_on(a2_node, VF5)["type"] == "NVIDIA A2-4A"  # type: ignore[index]


# ---------------------------------------------------------------- a GPU passed through whole


def test_a_gpu_bound_to_vfio_pci_never_reaches_sriov_manage(tmp_path: Path) -> None:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", "A2@0000:08:00.0", "--gpu", "L4@0000:41:00.0",
        "--passthrough", "0000:41:00.0",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host", "n1")
    desired = tmp_path / "both.yaml"
    desired.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: lab}\nspec:\n  nodes:\n    n1:\n      gpus:\n"
        '        - {address: "0000:41:00.0", sriov: enabled, profiles: {L4-6Q: 2}}\n'
    )
    res = node.run("apply", desired, "--yes")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "! sriov-enable 0000:41:00.0" in res.stdout
    assert "GPU 0000:41:00.0 is bound to vfio-pci, not nvidia" in res.stdout
    sim = SimHost(node.dir / "sys")
    assert sim.stats()["sriovManageCalls"] == 0
    pf = node.dir / "sys" / "bus" / "pci" / "devices" / "0000:41:00.0"
    assert os.readlink(pf / "driver").endswith("/vfio-pci")
    status = node.run("status")
    assert "GPU 0000:41:00.0 NVIDIA L4: bound to vfio-pci" in status.stderr
    inventory = json.loads(node.ok("status", "-o", "json").stdout)
    assert [g["driver"] for g in inventory["gpus"]] == ["nvidia", "vfio-pci"]


# ---------------------------------------------------------------- doctor


def test_doctor_on_a_healthy_simulated_host(a2_node: SimNode) -> None:
    res = a2_node.run("doctor", "-o", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {c["check"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["iommu"]["status"] == "ok"
    assert checks["nvidia-driver"] == {
        "check": "nvidia-driver",
        "status": "ok",
        "found": "NVIDIA host driver 550.127.06 loaded",
        "fix": "",
    }
    assert checks["gpu 0000:08:00.0"]["status"] == "info"  # SR-IOV off: nothing to see yet
    assert checks["sriov-manage"]["status"] == "ok"
    assert checks["holders"]["status"] == "ok"
    assert checks["kubelet"]["status"] == "info"  # no kubelet, no cluster: a plain KVM host
    assert checks["kubevirt"]["status"] == "ok"  # nor KubeVirt's virt-handler
    a2_node.ok("apply", SEED, "--yes")
    text = a2_node.ok("doctor").stdout
    assert "gpu 0000:08:00.0  NVIDIA A2: 16 VFs, mdev interface, 15 vGPU types" in text
    assert text.rstrip().endswith(f"Node {NODE} is ready for vGPUs (7 checks).")


def test_doctor_says_what_is_missing_and_what_to_do(tmp_path: Path) -> None:
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    sys_root = node.dir / "sys"
    (sys_root / "module" / "nvidia" / "version").unlink()
    shutil.rmtree(sys_root / "kernel" / "iommu_groups")
    (sys_root / "kernel" / "iommu_groups").mkdir()
    kubelet = tmp_path / "kubelet"
    (kubelet / "device-plugins").mkdir(parents=True)
    (kubelet / "device-plugins").chmod(0o500)
    res = run_vgpuctl(
        "doctor", "-o", "json", "--sysfs-root", sys_root, "--node", NODE,
        "--sriov-manage", tmp_path / "nowhere" / "sriov-manage", "--kubelet-dir", kubelet,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] is False
    status = {c["check"]: c["status"] for c in report["checks"]}
    assert status == {
        "iommu": "fail",
        "nvidia-driver": "fail",
        "gpu 0000:08:00.0": "info",
        "sriov-manage": "fail",
        "holders": "ok",
        # Root may write anywhere: a 0500 directory is writable to it, as to the kubelet.
        "kubelet": "ok" if os.geteuid() == 0 else "fail",
        "kubevirt": "ok",
    }
    fixes = {c["check"]: c["fix"] for c in report["checks"]}
    assert "intel_iommu=on" in fixes["iommu"]
    assert "modprobe nvidia" in fixes["nvidia-driver"]
    assert "--sriov-manage" in fixes["sriov-manage"]
    text = run_vgpuctl(
        "doctor", "--sysfs-root", sys_root, "--node", NODE,
        "--sriov-manage", tmp_path / "nowhere" / "sriov-manage", "--kubelet-dir", kubelet,
    ).stdout  # fmt: skip
    assert "FAIL  nvidia-driver" in text
    assert "→ install NVIDIA's vGPU host driver" in text
    assert text.rstrip().endswith(f"3 of 7 checks failed on node {NODE}.")


@needs_pid_namespace
def test_doctor_sees_that_it_cannot_see_the_hosts_processes(a2_node: SimNode) -> None:
    res = in_new_pid_namespace(a2_node, "doctor")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL  holders" in res.stdout
    assert "hostPID: true" in res.stdout
