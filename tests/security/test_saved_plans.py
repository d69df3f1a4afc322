"""A saved plan cannot widen what apply does (issue 10, item 1).

Each scenario is what a person who can write a plan file would do: ``vgpuctl plan --out``, edit
the JSON, ``vgpuctl apply PLANFILE --yes``, against a simulated host (and, for the cluster
ones, the API-server emulator). Each attack must be refused with a clear message, and nothing
written: the simulated host's sysfs tree is compared file by file, its kernel's write and
``sriov-manage`` counters must not move, and the API server must see no write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.model.cluster import GROUP, VERSION
from reconciler.sim import SimHost
from tests.cluster_node import register_crds
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED, SimNode, make_sim

SRIOV = (GROUP, VERSION, "sriovgpudevices")
VGPUS = (GROUP, VERSION, "vgpudevices")
KUBEVIRTS = ("kubevirt.io", "v1", "kubevirts")
POD_UID = "9f1c7d1e-0000-4000-8000-000000000001"

#: The seed's node with two of its four vGPUs dropped: 0000:08:00.5 and 0000:08:00.7 removed.
CHANGED = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: changed}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {{"0000:08:00.4": A2-4A, "0000:08:00.6": A2-4A}}
"""

# --- the host, judged from its own files ------------------------------------------------------


def host_files(node: SimNode) -> dict[str, str]:
    """Every entry of the simulated sysfs tree: a link's target, a file's content, or "dir"."""
    root = node.dir / "sys"
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".vgpuctl-sim"]
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                found[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    found[rel] = f.read().decode("utf-8", "replace")
    return found


def kernel_counters(node: SimNode) -> dict[str, int]:
    """The simulated kernel's sysfs writes and sriov-manage runs, counted by the simulator."""
    host = SimHost.open(node.dir / "sys")
    assert host is not None
    return host.stats()


class HostWatch:
    """What the host is before an attack, to prove after it that nothing was written."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.files = host_files(node)
        self.counters = kernel_counters(node)

    def assert_unchanged(self) -> None:
        assert kernel_counters(self.node) == self.counters, "the host was written to"
        now = host_files(self.node)
        keys = now.keys() | self.files.keys()
        changed = sorted(k for k in keys if now.get(k) != self.files.get(k))
        assert not changed, f"the host changed: {changed[:5]}"


def edit(planfile: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(planfile.read_text())
    change(doc)
    planfile.write_text(json.dumps(doc, indent=2))


#: The phase each kind runs in (plan format 2 writes it in every action).
PHASES = {"vgpu-remove": "host", "sriov-disable": "host", "sriov-enable": "host",
          "vgpu-create": "host", "cr-delete": "cluster", "kubevirt-update": "cluster"}  # fmt: skip


def append(doc: dict[str, Any], *actions: dict[str, Any]) -> None:
    for action in actions:
        doc["actions"].append(
            {"seq": len(doc["actions"]) + 1, "phase": PHASES[action["kind"]],
             "reason": "edited in", **action}
        )  # fmt: skip


def refused(res: Any, *fragments: str) -> None:
    """Refused with exit 1, one clear message (no traceback, no internal error)."""
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    assert "✓" not in res.stderr, f"actions ran:\n{res.stderr}"
    for fragment in fragments:
        assert fragment in res.stderr, f"{fragment!r} not in:\n{res.stderr}"


def vgpu_uuid(node: SimNode, vf: str) -> str | None:
    for gpu in json.loads(node.ok("status", "-o", "json").stdout)["gpus"]:
        for vf_doc in gpu["vfs"]:
            if vf_doc["address"] == vf:
                return vf_doc["vgpu"]["uuid"] if vf_doc["vgpu"] else None
    raise AssertionError(f"no VF {vf}")


def write_checkpoint(
    kubelet_dir: Path, uuid: str, resource: str = "nvidia.com/NVIDIA_A2-4Q"
) -> None:
    """The kubelet gave vGPU ``uuid`` to a pod (its device-plugin checkpoint says so)."""
    checkpoint = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": POD_UID, "ContainerName": "compute", "ResourceName": resource,
                 "DeviceIDs": {"-1": [uuid]}, "AllocResp": ""},
            ],
            "RegisteredDevices": {resource: [uuid]},
        },
        "Checksum": 1,
    }  # fmt: skip
    (kubelet_dir / "device-plugins").mkdir(parents=True, exist_ok=True)
    (kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint").write_text(
        json.dumps(checkpoint)
    )


class LocalNode(SimNode):
    """A simulated node with its own kubelet directory and no cluster."""

    kubelet_dir: Path

    @property
    def flags(self) -> list[str]:
        return [*super().flags, "--kubelet-dir", str(self.kubelet_dir)]


def local_node(tmp_path: Path, *gpus: str) -> LocalNode:
    sim = make_sim(tmp_path / "host", list(gpus or ["A2@0000:08:00.0"]))
    node = LocalNode(sim.dir, sim.node)
    node.kubelet_dir = tmp_path / "kubelet"
    (node.kubelet_dir / "device-plugins").mkdir(parents=True)
    return node


# --- host attacks ----------------------------------------------------------------------------


def test_an_appended_removal_of_a_vgpu_a_pod_holds_is_refused(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    node.ok("apply", SEED, "--yes")
    held = vgpu_uuid(node, "0000:08:00.5")
    assert held is not None
    write_checkpoint(node.kubelet_dir, held)
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    planfile = tmp_path / "plan.json"
    shown = node.run("plan", desired, "--out", planfile)
    assert "! vgpu-remove 0000:08:00.5" in shown.stdout  # a normal plan shows it blocked

    def unblock(doc: dict[str, Any]) -> None:
        blocked = next(b for b in doc["blocked"] if b["target"] == "0000:08:00.5")
        append(doc, {k: v for k, v in blocked.items() if k != "reason"})

    edit(planfile, unblock)
    before = HostWatch(node)
    res = node.run("apply", planfile, "--yes")
    refused(
        res,
        f"{planfile} does not match a fresh plan",
        f"only in {planfile}: vgpu-remove 0000:08:00.5",
        "nothing was changed; run 'vgpuctl plan' again",
    )
    before.assert_unchanged()
    assert vgpu_uuid(node, "0000:08:00.5") == held


def test_sriov_and_a_vgpu_on_a_gpu_the_desired_state_does_not_name_are_refused(
    tmp_path: Path,
) -> None:
    node = local_node(tmp_path, "A2@0000:08:00.0", "A2@0000:09:00.0")
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)  # names 0000:08:00.0 only
    edit(
        planfile,
        lambda doc: append(
            doc,
            {"kind": "sriov-enable", "target": "0000:09:00.0",
             "gpu": "0000:09:00.0", "numVFs": 16},
            {"kind": "vgpu-create", "target": "0000:09:00.4",
             "gpu": "0000:09:00.0", "vfIndex": 0, "type": "NVIDIA A2-4Q",
             "uuid": "5adb8e42-c29a-5705-8ae0-584ba08668b0"},
        ),
    )  # fmt: skip
    before = HostWatch(node)
    res = node.run("apply", planfile, "--yes")
    refused(
        res,
        f"only in {planfile}: sriov-enable 0000:09:00.0",
        f"only in {planfile}: vgpu-create 0000:09:00.4 (NVIDIA A2-4Q)",
    )
    before.assert_unchanged()


def test_a_removal_on_an_unnamed_gpu_through_a_named_gpus_address_is_refused(
    tmp_path: Path,
) -> None:
    node = local_node(tmp_path, "A2@0000:08:00.0", "A2@0000:09:00.0")
    both = tmp_path / "both.yaml"
    both.write_text(
        SEED.read_text()
        + '        - address: "0000:09:00.0"\n'
        + "          sriov: enabled\n"
        + '          vgpus: {"0000:09:00.4": A2-4Q}\n'
    )
    node.ok("apply", both, "--yes")
    victim = vgpu_uuid(node, "0000:09:00.4")
    assert victim is not None
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)  # 0000:09:00.0 is not named: left as is
    edit(
        planfile,
        lambda doc: append(
            doc,
            {"kind": "vgpu-remove", "target": "0000:09:00.4",
             "gpu": "0000:08:00.0", "vfIndex": 0, "type": "NVIDIA A2-4Q", "uuid": victim},
        ),
    )  # fmt: skip
    before = HostWatch(node)
    refused(node.run("apply", planfile, "--yes"), f"only in {planfile}: vgpu-remove 0000:09:00.4")
    before.assert_unchanged()
    assert vgpu_uuid(node, "0000:09:00.4") == victim


def test_sriov_manage_is_never_run_on_a_nic(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    nic = "0000:03:00.0"  # the simulator's Intel SR-IOV NIC, bound to ixgbe
    assert (node.dir / "sys" / "bus" / "pci" / "devices" / nic / "sriov_numvfs").exists()
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)
    edit(
        planfile,
        lambda doc: append(doc, {"kind": "sriov-disable", "target": nic, "gpu": nic}),
    )
    before = HostWatch(node)
    refused(node.run("apply", planfile, "--yes"), f"only in {planfile}: sriov-disable {nic}")
    before.assert_unchanged()  # not even the seed's own sriov-manage -e ran
    assert kernel_counters(node)["sriovManageCalls"] == 0


def test_edited_reasons_are_never_shown_the_fresh_plans_are(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)

    def reword(doc: dict[str, Any]) -> None:
        for action in doc["actions"]:
            action["reason"] = "all fine\x1b[1A\x1b[2K"

    edit(planfile, reword)
    res = node.run("apply", planfile, "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all fine" not in res.stdout and "\x1b" not in res.stdout
    assert "SR-IOV is off; desired enabled" in res.stdout  # the fresh plan's own words
    assert node.run("assert", SEED).returncode == 0


def test_a_matching_saved_plan_runs(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)
    res = node.run("apply", planfile, "--yes")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Converged" in res.stdout
    assert node.run("assert", SEED).returncode == 0


# --- malformed plans -------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[str], str]:
    def change(text: str) -> str:
        doc = json.loads(text)
        *parents, last = path.split(".")
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
        return json.dumps(doc, indent=2)

    return change


#: Each made vgpuctl fail badly before: an internal error (huge integer, deep nesting), the plan
#: applied anyway (unknown formatVersion, an extra nested field), or a message that named no
#: file and followed a printed plan, or spoke Python (wrong types).
MALFORMED: dict[str, tuple[Callable[[str], str], str]] = {
    "huge integer": (
        lambda text: text.replace('"seq": 1,', '"seq": 1' + "0" * 5000 + ",", 1),
        "is too large",
    ),
    "huge float": (lambda text: text.replace('"numVFs": 16', '"numVFs": 1e400', 1), "too large"),
    "NaN": (lambda text: text.replace('"numVFs": 16', '"numVFs": NaN', 1), "NaN"),
    "deep nesting": (
        lambda text: text.replace('"notes": [', '"notes": [' + "[" * 10**5 + "]" * 10**5 + ",", 1),
        "nested more than",
    ),
    "moderate nesting in an action": (
        _set("actions.0.extra", json.loads("[" * 80 + "]" * 80)),
        "nested more than",
    ),
    "unknown formatVersion": (_set("formatVersion", 3), "formatVersion is the number 3"),
    "formatVersion true": (_set("formatVersion", True), "formatVersion is the boolean true"),
    "an extra field": (_set("actions.0.force", True), "actions[0]: unknown field force"),
    "actions not a list": (_set("actions", {"seq": 1}), "actions: expected array"),
    "an action not an object": (_set("actions.0", [1]), "actions[0]: expected object"),
    "numVFs as text": (_set("actions.0.numVFs", "16"), "actions[0].numVFs"),
    "node not text": (_set("node", ["x"]), "node: expected string"),
}

#: Refused in one clear line before too (worded differently): kept so they stay so.
ALSO_MALFORMED: dict[str, tuple[Callable[[str], str], str]] = {
    "unknown kind": (_set("actions.0.kind", "rm-rf"), "actions[0].kind"),
    "desired state not an object": (_set("desiredState", [1]), "desiredState is a list"),
    "non-object JSON": (lambda text: f"[{text}]", "the top level is a list, not an object"),
    "not JSON": (lambda text: text[: len(text) // 2], "not JSON"),
}


@pytest.mark.parametrize("case", [*MALFORMED, *ALSO_MALFORMED])
def test_a_malformed_plan_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    node = local_node(tmp_path)
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)
    change, fragment = {**MALFORMED, **ALSO_MALFORMED}[case]
    planfile.write_text(change(planfile.read_text()))
    before = HostWatch(node)
    res = node.run("apply", planfile, "--yes")
    refused(res, str(planfile), fragment)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400, res.stderr
    assert res.stdout == ""
    before.assert_unchanged()


def _format_1(doc: dict[str, Any]) -> None:
    """``doc`` as vgpuctl wrote plans before format 2: each action's own fields in ``params``."""
    common = ("seq", "kind", "target", "reason")
    for entries in (doc["actions"], doc["blocked"]):
        entries[:] = [
            {**{k: a[k] for k in common if k in a},
             "params": {k: v for k, v in a.items() if k not in (*common, "phase")}}
            for a in entries
        ]  # fmt: skip
    doc["formatVersion"] = 1


def test_a_saved_plan_of_format_1_is_refused_in_one_line(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)
    edit(planfile, _format_1)
    assert '"params": {' in planfile.read_text()
    before = HostWatch(node)
    res = node.run("apply", planfile, "--yes")
    refused(
        res,
        f"{planfile}: written by an older vgpuctl (plan format 1); run 'vgpuctl plan --out' again",
    )
    assert len(res.stderr.splitlines()) == 1, res.stderr
    before.assert_unchanged()


def test_a_fifo_given_as_the_plan_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO for reading waits for a writer: ``apply FIFO`` hung for ever."""
    node = local_node(tmp_path)
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    before = HostWatch(node)
    res = node.run("apply", fifo, "--yes", timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"{fifo}: cannot read: not a regular file" in res.stderr
    before.assert_unchanged()


# --- cluster attacks -------------------------------------------------------------------------


def _kubevirt() -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "harvester-system"},
        "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": [
            # Someone else's entry: vgpuctl must never remove it, nor call it its own.
            {"mdevNameSelector": "GRID T4-2Q", "resourceName": "nvidia.com/GRID_T4-2Q"},
        ]}}},
    }  # fmt: skip


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as server:
        register_crds(server)
        server.seed(_kubevirt())
        yield server


class ClusterNode(LocalNode):
    kubeconfig: Path

    @property
    def flags(self) -> list[str]:
        return [*super().flags, "--kubeconfig", str(self.kubeconfig)]


def cluster_node(tmp_path: Path, emu: ApiServerEmulator) -> ClusterNode:
    local = local_node(tmp_path)
    node = ClusterNode(local.dir, local.node)
    node.kubelet_dir = local.kubelet_dir
    node.kubeconfig = emu.kubeconfig(tmp_path / "kubeconfig")
    return node


class ClusterWatch:
    """The API objects before an attack, and the requests made since."""

    def __init__(self, emu: ApiServerEmulator) -> None:
        self.emu = emu
        self.objects = self._objects()
        emu.requests.clear()

    def _objects(self) -> dict[str, list[dict[str, Any]]]:
        return {"/".join(r): self.emu.objects(*r) for r in (SRIOV, VGPUS, KUBEVIRTS)}

    def assert_unchanged(self) -> None:
        writes = [r for r in self.emu.requests if r.verb not in ("get", "list", "watch")]
        assert not writes, f"the API server was written to: {writes}"
        assert self._objects() == self.objects


def test_a_delete_of_another_nodes_object_is_refused(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    theirs = emu.get_object(*VGPUS, f"{NODE}-000008004")
    assert theirs is not None
    other = "gpu-node-2"
    theirs["metadata"] = {
        "name": f"{other}-000008004",
        "labels": {**theirs["metadata"]["labels"], "nodename": other},
    }
    theirs["spec"]["nodeName"] = other
    stored = emu.seed(theirs)
    planfile = tmp_path / "plan.json"
    assert "No changes." in node.ok("plan", SEED, "--out", planfile).stdout
    edit(
        planfile,
        lambda doc: append(
            doc,
            {"kind": "cr-delete", "target": f"{other}-000008004",
             "objectKind": "VGPUDevice",
             "resourceVersion": stored["metadata"]["resourceVersion"]},
        ),
    )  # fmt: skip
    host, cluster = HostWatch(node), ClusterWatch(emu)
    refused(
        node.run("apply", planfile, "--yes"),
        f"only in {planfile}: cr-delete {other}-000008004 (VGPUDevice)",
    )
    host.assert_unchanged()
    cluster.assert_unchanged()


def _kubevirt_update(doc: dict[str, Any], emu: ApiServerEmulator, **fields: Any) -> None:
    kv = emu.get_object(*KUBEVIRTS, "kubevirt", "harvester-system")
    assert kv is not None
    append(
        doc,
        {
            "kind": "kubevirt-update",
            "target": "kubevirt/harvester-system/kubevirt",
            "namespace": "harvester-system",
            "name": "kubevirt",
            "resourceVersion": kv["metadata"]["resourceVersion"],
            "remove": [],
            **fields,
        },
    )


def _selectors(emu: ApiServerEmulator) -> list[str]:
    kv = emu.get_object(*KUBEVIRTS, "kubevirt", "harvester-system")
    assert kv is not None
    entries = kv["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
    return sorted(e["mdevNameSelector"] for e in entries)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        # Not the entry vgpuctl writes (KubeVirt would allocate it itself): malformed.
        (
            {"mdevNameSelector": "NVIDIA A2-8Q", "resourceName": "nvidia.com/NVIDIA_A2-8Q",
             "externalResourceProvider": False},
            "actions[0].add[0].externalResourceProvider",
        ),
        # Well-formed, but no fresh plan adds it or claims the foreign entry.
        (
            {"mdevNameSelector": "NVIDIA A2-8Q", "resourceName": "nvidia.com/NVIDIA_A2-8Q",
             "externalResourceProvider": True},
            "only in {planfile}: kubevirt-update kubevirt/harvester-system/kubevirt",
        ),
    ],
)  # fmt: skip
def test_a_kubevirt_entry_and_a_foreign_claim_are_refused(
    tmp_path: Path, emu: ApiServerEmulator, entry: dict[str, Any], fragment: str
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    assert _selectors(emu) == ["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"]
    planfile = tmp_path / "plan.json"
    assert "No changes." in node.ok("plan", SEED, "--out", planfile).stdout
    edit(
        planfile,
        lambda doc: _kubevirt_update(
            doc, emu, add=[entry],
            owned=["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA A2-8Q"],
        ),
    )  # fmt: skip
    host, cluster = HostWatch(node), ClusterWatch(emu)
    refused(node.run("apply", planfile, "--yes"), fragment.format(planfile=planfile))
    host.assert_unchanged()
    cluster.assert_unchanged()
    # A normal apply afterwards has nothing to undo: the foreign entry is not ours to remove.
    assert "No changes." in node.ok("apply", SEED, "--yes").stdout
    assert _selectors(emu) == ["GRID T4-2Q", "NVIDIA A2-4A", "NVIDIA A2-4Q"]


def test_an_untouched_plan_does_not_remove_a_vgpu_a_pod_was_given_since(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    desired = tmp_path / "changed.yaml"
    desired.write_text(CHANGED)
    planfile = tmp_path / "plan.json"
    shown = node.ok("plan", desired, "--out", planfile)
    assert "- vgpu 0000:08:00.5" in shown.stdout  # not in use yet: its removal is planned
    uuid = vgpu_uuid(node, "0000:08:00.5")
    assert uuid is not None
    write_checkpoint(node.kubelet_dir, uuid)  # then the kubelet gives it to a pod
    host, cluster = HostWatch(node), ClusterWatch(emu)
    refused(
        node.run("apply", planfile, "--yes"),
        f"{planfile} does not match a fresh plan",
        f"only in {planfile}: vgpu-remove 0000:08:00.5 (NVIDIA A2-4Q)",
    )
    host.assert_unchanged()
    cluster.assert_unchanged()
    assert vgpu_uuid(node, "0000:08:00.5") == uuid
