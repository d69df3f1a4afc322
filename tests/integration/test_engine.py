"""The engine (``reconciler.engine``) on a simulated seed node with an emulated API server: what
it does when the host after the host actions is not the one the cluster actions were planned
for, and which API writes a run makes for the cluster actions a plan shows.

The expected writes are written here by hand from the plan: a ``cr-create`` is a POST of the
object then a PUT of its ``/status`` (the status subresource drops status on create); a
``cr-update`` is a PUT of the object when its spec or metadata change and a PUT of ``/status``
when its status does; a ``cr-delete`` is a DELETE; a ``kubevirt-update`` is one JSON PATCH.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_node import NODE_STATES, VGPUS, cluster_node, register_crds
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.simnode import NODE, SEED, run_vgpuctl

#: Every scenario runs with our CRDs and with Harvester's own (what pcidevices-controller
#: installs): vgpuctl must converge under either.
CRD_SETS = ("ours", "harvester")

#: The seed's vGPU UUIDs on VFs .4 and .5 (uuid5 of node and VF, as the README shows them).
U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
WRITES = ("create", "update", "patch", "delete")


def seed_with(vf4: str) -> str:
    return SEED.read_text().replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": {vf4}')


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator() as server:
        register_crds(server)
        server.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        server.seed(
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "harvester-system"},
                "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": []}}},
            }
        )
        yield server


def writes(emu: ApiServerEmulator, since: int = 0) -> list[tuple[str, str, str, str | None]]:
    """The write requests to our objects and the KubeVirt CR (Events aside), in order."""
    return [
        (r.verb, r.resource, r.name or "", r.subresource)
        for r in emu.requests[since:]
        if r.verb in WRITES and r.resource != "events"
    ]


def event_writes(emu: ApiServerEmulator, since: int = 0) -> list[Request]:
    return [r for r in emu.requests[since:] if r.verb in WRITES and r.resource == "events"]


def saved_cluster_actions(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    return [a for a in doc["actions"] if a["kind"].startswith(("cr-", "kubevirt-"))]


# -- what was shown is what runs ------------------------------------------------------------------


def test_apply_planfile_makes_exactly_the_writes_of_the_saved_plans_cluster_actions(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    changed = tmp_path / "changed.yaml"
    changed.write_text(seed_with("NVIDIA A2-4C"))
    planfile = tmp_path / "plan.json"
    node.ok("plan", changed, "--out", planfile)

    # The plan, read by hand: the KubeVirt allow-list given the new profile first, before any
    # vGPU of it exists (A2-4A stays: VF .6 still has it); VF .4's vGPU replaced (remove,
    # create), then its VGPUDevice's spec and status updated, the node's VGPUNodeState (its
    # vGPUs, the desired state's fingerprint, this change). Nothing else: the other VFs'
    # statuses do not change (four 4 GB vGPUs before and after).
    cluster = saved_cluster_actions(planfile)
    assert [(a["kind"], a["target"]) for a in cluster] == [
        ("kubevirt-allow", "kubevirt/harvester-system/kubevirt"),
        ("cr-update", "harvester-kgd9c-000008004"),
        ("cr-update", NODE),
    ]
    assert json.loads(planfile.read_text())["actions"][0]["kind"] == "kubevirt-allow"
    update = cluster[1]
    assert (update["specChanged"], update["statusChanged"]) == (True, True)

    before = len(emu.requests)
    applied = node.ok("apply", planfile, "--yes")
    assert "Converged" in applied.stdout
    # kubevirt-allow: the intent to create A2-4C published in the node's VGPUNodeState (PUT
    # /status), then one PATCH, before the host actions; cr-update with spec and status
    # changed: PUT, PUT /status; the node state's status alone: PUT /status.
    assert writes(emu, before) == [
        ("update", "vgpunodestates", NODE, "status"),
        ("patch", "kubevirts", "kubevirt", None),
        ("update", "vgpudevices", "harvester-kgd9c-000008004", None),
        ("update", "vgpudevices", "harvester-kgd9c-000008004", "status"),
        ("update", "vgpunodestates", NODE, "status"),
    ]
    # Events: one per host action carried out (VGPURemoved, VGPUCreated on VF .4's object).
    assert [(r.verb, r.namespace) for r in event_writes(emu, before)] == [("create", "default")] * 2
    # What was written is what the saved plan showed, spec and status.
    stored = emu.get_object(*VGPUS, "harvester-kgd9c-000008004")
    assert stored is not None
    assert stored["spec"] == update["object"]["spec"]
    assert stored["status"] == update["object"]["status"]
    assert "Wrote the status" not in applied.stderr


def test_a_first_apply_writes_the_statuses_shown_then_what_only_the_driver_could_say(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """SR-IOV is off when the plan is made: the driver lists its vGPU types (with their ids) on
    VFs only, so the plan's VGPUNodeState shows the catalogue's types with blank ids. The run
    writes that status as shown, then, after verifying, the one status the host now says
    otherwise, as its own named write: never a silent re-plan of the shown writes."""
    node = cluster_node(tmp_path, emu)
    planfile = tmp_path / "plan.json"
    node.ok("plan", SEED, "--out", planfile)
    cluster = saved_cluster_actions(planfile)
    pf = "harvester-kgd9c-000008000"
    #: The VFs' objects, named after their addresses 0000:08:00.4 … 0000:08:02.3.
    vfs = [f"harvester-kgd9c-000008{dev}{fn}" for dev in ("00", "01", "02") for fn in "01234567"]
    vfs = vfs[4:20]
    assert [(a["kind"], a["target"]) for a in cluster] == [
        ("kubevirt-allow", "kubevirt/harvester-system/kubevirt"),
        ("cr-create", pf),
        *(("cr-create", name) for name in vfs),
        ("cr-create", NODE),
    ]
    shown_status = cluster[-1]["object"]["status"]
    shown_types = shown_status["typeSets"][shown_status["gpus"][0]["typeSet"]]
    assert {t["id"] for t in shown_types} == {""}

    at_refresh: list[dict[str, Any]] = []

    def look(request: Request) -> None:
        # The node state's status as stored when the second status write of it arrives.
        if request.subresource == "status" and request.name == NODE:
            stored = emu.get_object(*NODE_STATES, NODE)
            if stored is not None and stored.get("status"):
                at_refresh.append(stored["status"])

    emu.on_before_write(look)
    before = len(emu.requests)
    applied = node.ok("apply", planfile, "--yes")
    emu.on_before_write(None)
    # Each cr-create: POST (to the collection: no name), then PUT /status when its status has
    # a field: the four VFs with a vGPU (.4 to .7) do; the twelve others have none and nothing
    # creatable (four 4 GB vGPUs are the A2's maximum), so an empty status (Harvester's
    # omitempty). The kubevirt-allow first: the node's VGPUNodeState created with the intent
    # (POST, PUT /status), then one PATCH; the node state's cr-create, over the intent's
    # object, writes its status (PUT /status); last the node state's status again.
    with_vgpu = set(vfs[:4])
    assert writes(emu, before) == [
        ("create", "vgpunodestates", "", None),
        ("update", "vgpunodestates", NODE, "status"),
        ("patch", "kubevirts", "kubevirt", None),
        ("create", "sriovgpudevices", "", None),
        ("update", "sriovgpudevices", pf, "status"),
        *(
            w
            for name in vfs
            for w in (
                ("create", "vgpudevices", "", None),
                *([("update", "vgpudevices", name, "status")] if name in with_vgpu else []),
            )
        ),
        ("update", "vgpunodestates", NODE, "status"),
        ("update", "vgpunodestates", NODE, "status"),
    ]
    # The intent: the profiles the run creates, wanted, and nothing else. The status the
    # cluster phase wrote is the one the plan showed, blank type ids and all (and the times
    # the write stamped).
    intent, first = at_refresh
    assert intent == {
        "profiles": [
            {"name": p, "resourceName": "nvidia.com/" + p.replace(" ", "_"), "wanted": 2,
             "vgpus": 0, "inUse": 0, "creatable": 0}
            for p in ("NVIDIA A2-4A", "NVIDIA A2-4Q")
        ]
    }  # fmt: skip
    assert first["gpus"] == shown_status["gpus"]
    final = emu.get_object(*NODE_STATES, NODE)
    assert final is not None
    final_types = final["status"]["typeSets"][final["status"]["gpus"][0]["typeSet"]]
    assert "" not in {t["id"] for t in final_types}
    assert "Wrote the status of 1 object again from the host as it now is" in applied.stderr
    assert "Converged" in applied.stdout


# -- the host is not what the cluster actions were planned for -------------------------------------


def test_the_engine_stops_before_any_cluster_write_when_the_host_is_not_as_predicted(
    tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Another process removes a vGPU while the host actions run: the cluster actions were
    planned for a host with it, so none is written; the run says which VF differs, the device
    plugins learn the host as it is, and the next run plans from it and converges."""
    from reconciler.cli.host import Host
    from reconciler.cli.options import GlobalOptions
    from reconciler.desired import load_desired
    from reconciler.engine import RunSettings, reconcile
    from reconciler.model import Inventory
    from reconciler.sim import SimHost

    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    sim = SimHost.open(node.dir / "sys")
    assert sim is not None
    host = Host(
        GlobalOptions(
            sysfs_root=sim.sysfs_root, sriov_manage=None, node=NODE, state_dir=None,
            no_color=True, kubelet_dir=node.kubelet_dir, kubeconfig=node.kubeconfig,
        )
    )  # fmt: skip
    changed = tmp_path / "changed.yaml"
    changed.write_text(seed_with("NVIDIA A2-4C"))
    desired = load_desired([changed], catalog=host.catalog).node(NODE)
    assert desired is not None
    ports = host.ports(write_timeout=5.0)
    real_driver = ports.driver

    class Meddled:
        """The real driver; right after it creates a vGPU, another process removes U5."""

        def __init__(self) -> None:
            self.real = real_driver()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def create_vgpu(self, **kw: Any) -> None:
            self.real.create_vgpu(**kw)
            sim.writer().write(f"bus/mdev/devices/{U5}/remove", "1")

    told: list[tuple[Inventory, frozenset[str]]] = []

    class Plugins:
        def update(self, inventory: Inventory, *, removed_on_purpose: Any = ()) -> None:
            told.append((inventory, frozenset(removed_on_purpose)))

    before = len(emu.requests)
    result = reconcile(
        replace(ports, driver=Meddled),
        desired,
        settings=RunSettings(verify_timeout=5.0),
        plugins=Plugins(),
    )
    assert result.host is not None and result.host.ok  # every host action did what it said
    assert result.mismatch is not None
    assert result.mismatch.differences == (
        f"VF 0000:08:00.5 hosts no vGPU, the plan predicted NVIDIA A2-4Q {U5}",
    )
    assert "No cluster object was written" in result.mismatch.message
    assert not result.ok
    assert result.cluster is None and result.verification is None
    # Only the intent to create A2-4C and the allow-list's addition, made before the host
    # actions; the intent stays published (other nodes keep A2-4C listed) until a run writes
    # the node's summary.
    assert result.allow_list is not None and result.allow_list.ok
    assert writes(emu, before) == [
        ("update", "vgpunodestates", NODE, "status"),
        ("patch", "kubevirts", "kubevirt", None),
    ]
    published = emu.get_object(*NODE_STATES, NODE)
    assert published is not None
    assert {p["name"]: p["wanted"] for p in published["status"]["profiles"]}["NVIDIA A2-4C"] == 1
    assert event_writes(emu, before) == []
    # The plugins learn the host as it is: U4 removed on purpose (and created again), U5 gone.
    assert len(told) == 1
    inventory, removed = told[0]
    assert removed == {U4}
    present = {vf.vgpu.uuid for g in inventory.gpus for vf in g.vfs if vf.vgpu is not None}
    assert U4 in present and U5 not in present

    again = node.ok("apply", changed, "--yes")
    assert "Converged" in again.stdout
    final = emu.get_object(*VGPUS, "harvester-kgd9c-000008005")
    assert final is not None and final["status"]["uuid"] == U5


ANOTHER_TOOL = """
import sys
from pathlib import Path
from reconciler.sim import SimHost

root, vf, type_name, uuid = sys.argv[1:]
types = Path(root, "bus/pci/devices", vf, "mdev_supported_types")
type_id = next(t.name for t in types.iterdir() if (t / "name").read_text().strip() == type_name)
create = f"bus/pci/devices/{vf}/mdev_supported_types/{type_id}/create"
SimHost.open(root).writer().write(create, uuid)
"""


def test_apply_says_it_stopped_and_exits_1(tmp_path: Path, emu: ApiServerEmulator) -> None:
    """The same through ``vgpuctl apply``: ``sriov-manage`` is a wrapper that, once SR-IOV is
    on, lets another tool create a vGPU on a VF the desired state leaves empty."""
    node = cluster_node(tmp_path, emu)
    tool = node.dir / "another-tool.py"
    tool.write_text(ANOTHER_TOOL)
    wrapper = node.dir / "bin" / "meddling-sriov-manage"
    stranger = "0d6f2f52-1f4c-4a63-9a43-2b8f6a1c9e11"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'"{node.dir}/bin/sriov-manage" "$@" || exit $?\n'
        f'exec "{sys.executable}" "{tool}" "{node.dir}/sys" 0000:08:01.0 "NVIDIA A2-4A" '
        f"{stranger}\n"
    )
    wrapper.chmod(0o755)
    one = tmp_path / "one.yaml"
    one.write_text(SEED.read_text().split('            "0000:08:00.5"')[0])
    flags = [f if f != str(node.dir / "bin" / "sriov-manage") else str(wrapper) for f in node.flags]
    before = len(emu.requests)
    res = run_vgpuctl("apply", one, "--yes", *flags)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (
        "Apply stopped: the host after the host actions is not what the plan's cluster actions "
        "were planned for: VF 0000:08:01.0 hosts NVIDIA A2-4A "
        f"{stranger}, the plan predicted no vGPU. No cluster object was written"
    ) in res.stderr
    assert "Traceback" not in res.stderr
    # Only the intent (the node's VGPUNodeState created with it) and the allow-list's
    # additions, made before the host actions.
    assert writes(emu, before) == [
        ("create", "vgpunodestates", "", None),
        ("update", "vgpunodestates", NODE, "status"),
        ("patch", "kubevirts", "kubevirt", None),
    ]
    assert event_writes(emu, before) == []
