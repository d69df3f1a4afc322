"""KubeVirt as a neighbour (docs/domain.md §10), through the CLI on a simulated host.

KubeVirt's virt-handler removes every mdev its KubeVirt CR does not allow-list, in use or not.
Without a cluster connection vgpuctl cannot keep that list, so on a host that shows KubeVirt
(its device-plugin socket ``kubevirt-<device>.sock`` in the kubelet's directory, or a
``virt-handler`` process) ``plan`` and ``apply`` block every mdev vGPU create, saying why and
how out; ``--unsafe-kubevirt-allow-listed`` lets them run and the plan says so. NVIDIA's
vendor-specific VFIO vGPUs are not mdevs, and with a cluster vgpuctl keeps the allow-list: no
block then. ``doctor`` checks the same, and with a cluster reads the KubeVirt CR.

The simulated host's kubelet directory is ``DIR/kubelet``; its processes are the proc tree under
``DIR/sys/.vgpuctl-sim/proc``. Expected values are written from the domain facts.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster_node import cluster_node, kubevirt_cr
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED, SimNode, run_vgpuctl
from tests.watch_agent import Watch

GPU = "0000:08:00.0"
SEED_VFS = ("0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7")
#: What every blocked create's reason says, in parts (the signal varies).
WAITS = "waits for a cluster connection: KubeVirt runs on this host ("
SWEEP = (
    "and its virt-handler removes every mdev whose type the KubeVirt CR does not allow-list, "
    "in use by a VM or not; pass --kubeconfig (vgpuctl then keeps the allow-list), or allow-list "
    "each type by hand (permittedHostDevices.mediatedDevices, externalResourceProvider: true) "
    "and pass --unsafe-kubevirt-allow-listed"
)


def plant_socket(kubelet_dir: Path, name: str = "kubevirt-kvm.sock") -> Path:
    """A Unix socket bound where virt-handler's device plugin binds it (a real socket file, as
    KubeVirt leaves it), in the kubelet's device-plugin directory."""
    plugins = kubelet_dir / "device-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bound by a relative name: a test's temporary path may pass the 108 bytes of sun_path.
    with contextlib.chdir(plugins):
        sock.bind(name)
    sock.close()  # the file stays, as a stale socket of a stopped virt-handler would
    return plugins / name


def plant_process(node: SimNode, pid: int, comm: str) -> None:
    """A process of the simulated host's proc tree, named ``comm`` (``/proc/<pid>/comm``)."""
    proc = node.dir / "sys" / ".vgpuctl-sim" / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "comm").write_text(comm + "\n")


def mdevs(node: SimNode) -> list[str]:
    devices = node.dir / "sys" / "bus" / "mdev" / "devices"
    return sorted(p.name for p in devices.iterdir()) if devices.is_dir() else []


def seed_host(tmp_path: Path) -> SimNode:
    res = run_vgpuctl("sim", "init", tmp_path / "host", "--gpu", f"A2@{GPU}")
    assert res.returncode == 0, res.stderr
    return SimNode(tmp_path / "host")


def plan_json(node: SimNode, desired: Path, *extra: str) -> dict[str, Any]:
    return json.loads(node.ok("plan", desired, "-o", "json", *extra).stdout)  # type: ignore[no-any-return]


def test_a_kubevirt_socket_blocks_every_mdev_create_and_apply_makes_none(tmp_path: Path) -> None:
    node = seed_host(tmp_path)
    plant_socket(node.dir / "kubelet")
    plugins = node.dir / "kubelet" / "device-plugins"
    reason = f"{WAITS}{plugins} holds KubeVirt's device-plugin socket kubevirt-kvm.sock), {SWEEP}"
    plan = plan_json(node, SEED)
    assert [a["kind"] for a in plan["actions"]] == ["sriov-enable"]  # VFs are no mdevs
    blocked = [(b["kind"], b["target"], b["reason"]) for b in plan["blocked"]]
    assert blocked == [("vgpu-create", vf, reason) for vf in SEED_VFS]
    assert plan["applyable"] is False

    res = node.run("apply", SEED, "--yes")
    assert res.returncode == 2, res.stderr
    assert "Applied; 4 change(s) remain blocked" in res.stdout
    assert f"! vgpu-create 0000:08:00.4: {reason}" in res.stdout
    assert mdevs(node) == []  # nothing made for virt-handler to sweep


def test_the_unsafe_flag_lets_the_creates_run_and_the_plan_says_on_whose_word(
    tmp_path: Path,
) -> None:
    node = seed_host(tmp_path)
    plant_socket(node.dir / "kubelet")
    plan = plan_json(node, SEED, "--unsafe-kubevirt-allow-listed")
    assert plan["blocked"] == []
    assert [a["target"] for a in plan["actions"] if a["kind"] == "vgpu-create"] == list(SEED_VFS)
    assert plan["notes"][0].startswith(
        "--unsafe-kubevirt-allow-listed: KubeVirt runs on this host ("
    )
    assert plan["notes"][0].endswith(
        "mdev vGPUs are created on the operator's word that every type vgpuctl creates here "
        "is allow-listed by hand in the KubeVirt CR with externalResourceProvider: true "
        "(otherwise virt-handler removes them, in use or not)"
    )
    # A global option: before the subcommand too.
    res = run_vgpuctl("--unsafe-kubevirt-allow-listed", "apply", SEED, "--yes", *node.flags)
    assert res.returncode == 0, res.stderr
    assert "Note: --unsafe-kubevirt-allow-listed: KubeVirt runs on this host" in res.stdout
    assert len(mdevs(node)) == 4


def test_a_virt_handler_process_is_kubevirt_too(tmp_path: Path) -> None:
    node = seed_host(tmp_path)
    plant_process(node, 311, "kubelet")
    plant_process(node, 4242, "virt-handler")
    plan = plan_json(node, SEED)
    reasons = {b["reason"] for b in plan["blocked"]}
    assert reasons == {WAITS + "process 4242 is virt-handler), " + SWEEP}


def test_watch_without_a_cluster_leaves_the_creates_blocked_and_says_why(
    node: SimNode, desired_dir: Path, start_watch: Callable[..., Watch]
) -> None:
    plant_socket(node.dir / "kubelet")
    watch = start_watch(node, desired_dir)
    line = watch.wait_log(
        lambda d: d["msg"].startswith("blocked: vgpu-create 0000:08:00.4: "), "a blocked create"
    )
    assert line["msg"].startswith(f"blocked: vgpu-create 0000:08:00.4: {WAITS}")
    assert line["msg"].endswith(SWEEP)
    assert watch.metric("vgpuctl_blocked_actions") == 4
    assert watch.metric("vgpuctl_converged") == 0
    assert mdevs(node) == []


def test_a_process_of_another_name_is_not(tmp_path: Path) -> None:
    node = seed_host(tmp_path)
    plant_process(node, 311, "virt-launcher")  # the VM's pod, not the node's handler
    (node.dir / "kubelet" / "device-plugins").mkdir(parents=True)
    (node.dir / "kubelet" / "device-plugins" / "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock").touch()
    plan = plan_json(node, SEED)
    assert plan["blocked"] == []
    assert len([a for a in plan["actions"] if a["kind"] == "vgpu-create"]) == 4


def test_room_making_removals_wait_with_the_blocked_creates(tmp_path: Path) -> None:
    """A profile change on a KubeVirt host without a cluster: the create is blocked, so the
    removal that only makes room for it waits too (the VF keeps its working vGPU); with
    --partial the removal runs alone."""
    node = seed_host(tmp_path)
    node.ok("apply", SEED, "--yes")  # no KubeVirt yet: the seed's four vGPUs
    before = mdevs(node)
    plant_socket(node.dir / "kubelet", "kubevirt-tun.sock")
    doc = yaml.safe_load(SEED.read_text())
    doc["spec"]["nodes"][NODE]["gpus"][0]["vgpus"]["0000:08:00.4"] = "NVIDIA A2-4Q"
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(doc))
    plan = plan_json(node, changed)
    assert [a["kind"] for a in plan["actions"]] == []
    kinds = [(b["kind"], b["target"]) for b in plan["blocked"]]
    assert kinds == [("vgpu-remove", "0000:08:00.4"), ("vgpu-create", "0000:08:00.4")]
    remove, create = plan["blocked"]
    assert create["reason"].startswith(WAITS)
    assert remove["reason"] == (
        "VF 0000:08:00.4 hosts NVIDIA A2-4A; desired NVIDIA A2-4Q; deferred: it only makes room "
        f"for NVIDIA A2-4Q, which {create['reason']} (apply --partial removes it now)"
    )
    res = node.run("apply", changed, "--yes")
    assert res.returncode == 2, res.stderr
    assert mdevs(node) == before

    partial = plan_json(node, changed, "--partial")
    assert [(a["kind"], a["target"]) for a in partial["actions"]] == [
        ("vgpu-remove", "0000:08:00.4"),
        ("device-plugin-refresh", "nvidia.com/NVIDIA_A2-4A"),
    ]
    assert [(b["kind"], b["target"]) for b in partial["blocked"]] == [
        ("vgpu-create", "0000:08:00.4")
    ]


def test_vendor_vfio_vgpus_are_not_swept_so_not_blocked(tmp_path: Path) -> None:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", f"L40S@{GPU}", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host")
    plant_socket(node.dir / "kubelet")
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "vfio"},
        "spec": {
            "nodes": {
                NODE: {
                    "gpus": [
                        {"address": GPU, "sriov": "enabled", "profiles": {"NVIDIA L40S-8Q": 2}}
                    ]
                }
            }
        },
    }
    desired = tmp_path / "desired.yaml"
    desired.write_text(yaml.safe_dump(doc))
    plan = plan_json(node, desired)
    assert plan["blocked"] == []
    assert [a["target"] for a in plan["actions"] if a["kind"] == "vgpu-create"] == [
        "0000:08:00.4",
        "0000:08:00.5",
    ]
    node.ok("apply", desired, "--yes")
    assert (node.dir / "kubelet" / "device-plugins" / "kubevirt-kvm.sock").is_socket()


def test_a_mode_switch_needed_only_by_blocked_creates_waits_with_them(tmp_path: Path) -> None:
    """Mixed-size mode (docs/domain.md §4) is set just before a GPU's first vGPU: with every
    create blocked, the switch has nothing to precede."""
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", "L40S@0000:41:00.0", "--interface", "mdev"
    )
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host")
    plant_socket(node.dir / "kubelet")
    doc = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "mixed"},
        "spec": {
            "nodes": {
                NODE: {
                    "gpus": [
                        {
                            "address": "0000:41:00.0",
                            "sriov": "enabled",
                            "mode": "mixed-size",
                            "vgpus": {
                                "0000:41:00.4": "NVIDIA L40S-16Q",
                                "0000:41:00.5": "NVIDIA L40S-8Q",
                            },
                        }
                    ]
                }
            }
        },
    }
    desired = tmp_path / "desired.yaml"
    desired.write_text(yaml.safe_dump(doc))
    plan = plan_json(node, desired)
    assert [(a["kind"], a["target"]) for a in plan["actions"]] == [("sriov-enable", "0000:41:00.0")]
    mode, *creates = plan["blocked"]
    assert (mode["kind"], mode["reason"]) == (
        "vgpu-mode",
        "desired mixed-size; the GPU will be in equal-size mode after sriov-manage -e "
        "(nvidia-smi vgpu -i 0000:41:00.0 -shm 1, before its first vGPU); waits with the GPU's "
        "creates, all blocked",
    )
    assert [(c["kind"], c["target"]) for c in creates] == [
        ("vgpu-create", "0000:41:00.4"),
        ("vgpu-create", "0000:41:00.5"),
    ]
    assert all(c["reason"].startswith(WAITS) for c in creates)


def test_with_a_cluster_the_creates_run(tmp_path: Path, emu: ApiServerEmulator) -> None:
    """vgpuctl keeps the KubeVirt allow-list itself then (plan/cluster.py)."""
    node = cluster_node(tmp_path, emu)
    plant_socket(node.kubelet_dir)
    plant_socket(node.dir / "kubelet")
    plan = json.loads(node.ok("plan", SEED, "-o", "json").stdout)
    assert plan["blocked"] == []
    assert len([a for a in plan["actions"] if a["kind"] == "vgpu-create"]) == 4
    assert not any("unsafe" in n for n in plan["notes"])


# -- doctor ----------------------------------------------------------------------------------


def doctor_kubevirt(node: SimNode, *extra: str) -> tuple[int, dict[str, Any]]:
    res = node.run("doctor", "-o", "json", *extra)
    assert res.returncode in (0, 1), res.stderr
    checks = [c for c in json.loads(res.stdout)["checks"] if c["check"] == "kubevirt"]
    assert len(checks) == 1, res.stdout
    return res.returncode, checks[0]


def test_doctor_without_a_cluster_fails_where_kubevirt_runs(tmp_path: Path) -> None:
    node = seed_host(tmp_path)
    plugins = node.dir / "kubelet" / "device-plugins"
    rc, check = doctor_kubevirt(node)
    assert rc == 0
    assert check == {
        "check": "kubevirt",
        "status": "ok",
        "found": f"KubeVirt does not run on this host (no kubevirt-*.sock in {plugins}, no "
        "virt-handler process): nothing removes the vGPUs vgpuctl makes",
        "fix": "",
    }
    plant_socket(node.dir / "kubelet")
    rc, check = doctor_kubevirt(node)
    assert rc == 1
    assert check["status"] == "fail"
    assert check["found"] == (
        f"KubeVirt runs on this host ({plugins} holds KubeVirt's device-plugin socket "
        "kubevirt-kvm.sock), and its virt-handler removes every mdev whose type the KubeVirt "
        "CR does not allow-list, in use by a VM or not; with no cluster connection vgpuctl "
        "cannot allow-list the types it creates, so plan and apply block every mdev vGPU create"
    )
    assert check["fix"] == (
        "pass --kubeconfig (vgpuctl then keeps the allow-list), or allow-list each type by hand "
        "(permittedHostDevices.mediatedDevices, externalResourceProvider: true) and pass "
        "--unsafe-kubevirt-allow-listed"
    )
    _, check = doctor_kubevirt(node, "--unsafe-kubevirt-allow-listed")
    assert check["status"] == "info"
    assert check["found"].endswith(
        "--unsafe-kubevirt-allow-listed: the operator says every type vgpuctl creates here is "
        "allow-listed by hand"
    )


def test_doctor_passes_a_kubevirt_host_whose_vgpus_are_vendor_vfio(tmp_path: Path) -> None:
    res = run_vgpuctl(
        "sim", "init", tmp_path / "host", "--gpu", f"L40S@{GPU}", "--interface", "vfio"
    )
    assert res.returncode == 0, res.stderr
    node = SimNode(tmp_path / "host")
    plugins = node.dir / "kubelet" / "device-plugins"
    plant_socket(node.dir / "kubelet")
    _, check = doctor_kubevirt(node)
    assert check["status"] == "ok"
    assert check["found"] == (
        f"KubeVirt runs on this host ({plugins} holds KubeVirt's device-plugin socket "
        "kubevirt-kvm.sock), and its virt-handler removes every mdev whose type the KubeVirt "
        "CR does not allow-list, in use by a VM or not; this host's vGPUs are NVIDIA's "
        "vendor-specific VFIO VFs, which it does not remove"
    )


def _set_configuration(emu: ApiServerEmulator, **configuration: Any) -> None:
    cr = kubevirt_cr()
    cr["spec"]["configuration"].update(configuration)
    emu.seed(cr)


def test_doctor_with_a_cluster_reads_the_kubevirt_cr(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    # vGPUs made without the cluster: nothing allow-listed them.
    SimNode(node.dir).ok("apply", SEED, "--yes")
    rc, check = doctor_kubevirt(node)
    assert check["status"] == "fail"
    assert check["found"] == (
        "KubeVirt's mediated-device handling is on, and harvester-system/kubevirt does not "
        "allow-list NVIDIA A2-4A, NVIDIA A2-4Q with externalResourceProvider: true: "
        "virt-handler removes those vGPUs at its next heartbeat, in use by a VM or not"
    )
    assert rc == 1

    # Allow-listed by hand, spelt as KubeVirt compares (spaces → _), one without the
    # externalResourceProvider it needs.
    permitted = kubevirt_cr()["spec"]["configuration"]["permittedHostDevices"]
    permitted["mediatedDevices"] += [
        {
            "mdevNameSelector": "NVIDIA_A2-4A",
            "resourceName": "nvidia.com/NVIDIA_A2-4A",
            "externalResourceProvider": True,
        },
        {"mdevNameSelector": "NVIDIA A2-4Q", "resourceName": "nvidia.com/NVIDIA_A2-4Q"},
    ]
    _set_configuration(emu, permittedHostDevices=permitted)
    _, check = doctor_kubevirt(node)
    assert check["status"] == "fail"
    assert "does not allow-list NVIDIA A2-4Q with externalResourceProvider: true" in check["found"]

    permitted["mediatedDevices"][-1]["externalResourceProvider"] = True
    _set_configuration(emu, permittedHostDevices=permitted)
    _, check = doctor_kubevirt(node)
    assert check == {
        "check": "kubevirt",
        "status": "ok",
        "found": "KubeVirt's mediated-device handling is on, and harvester-system/kubevirt "
        "allow-lists every mdev vGPU type on this host (NVIDIA A2-4A, NVIDIA A2-4Q) with "
        "externalResourceProvider: true",
        "fix": "",
    }


def test_doctor_passes_once_apply_with_the_cluster_allow_listed_the_types(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    _, check = doctor_kubevirt(node)
    assert check["found"] == (
        "KubeVirt's mediated-device handling is on (harvester-system/kubevirt); this host has "
        "no mdev vGPU for it to remove (vgpuctl allow-lists each type it creates)"
    )
    node.ok("apply", SEED, "--yes")
    _, check = doctor_kubevirt(node)
    assert check["status"] == "ok"
    assert (
        "allow-lists every mdev vGPU type on this host (NVIDIA A2-4A, NVIDIA A2-4Q)"
        in (check["found"])
    )


def test_doctor_with_a_cluster_passes_when_mdev_handling_is_off(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    SimNode(node.dir).ok("apply", SEED, "--yes")
    _set_configuration(emu, mediatedDevicesConfiguration={"enabled": False})
    _, check = doctor_kubevirt(node)
    assert check["status"] == "ok"
    assert check["found"] == (
        "KubeVirt's mediated-device handling is off in harvester-system/kubevirt "
        "(spec.configuration.mediatedDevicesConfiguration.enabled is false): virt-handler "
        "removes no mdev"
    )
    _set_configuration(
        emu, developerConfiguration={"featureGates": ["LiveMigration", "DisableMDEVConfiguration"]}
    )
    _, check = doctor_kubevirt(node)
    assert check["found"] == (
        "KubeVirt's mediated-device handling is off in harvester-system/kubevirt (the feature "
        "gate DisableMDEVConfiguration is on): virt-handler removes no mdev"
    )
    # The Go constant's name is no gate KubeVirt knows: handling stays on.
    _set_configuration(
        emu, developerConfiguration={"featureGates": ["DisableMediatedDevicesHandling"]}
    )
    _, check = doctor_kubevirt(node)
    assert check["status"] == "fail"


def test_doctor_with_two_kubevirt_crs_asks_which_one(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Which of two KubeVirt CRs rules this node is not known: the check fails and says how
    to choose (the same words the plan uses)."""
    node = cluster_node(tmp_path, emu)
    emu.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubevirt"}})
    emu.seed(kubevirt_cr("kubevirt"))
    rc, check = doctor_kubevirt(node)
    assert rc == 1
    assert check == {
        "check": "kubevirt",
        "status": "fail",
        "found": "found 2 KubeVirt CRs in any namespace (harvester-system/kubevirt, "
        "kubevirt/kubevirt): pass --kubevirt-namespace to choose one",
        "fix": "",
    }
