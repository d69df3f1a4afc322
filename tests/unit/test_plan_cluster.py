"""plan_node with a cluster: uses the cluster knows, CR actions, the KubeVirt allow-list, the plan
JSON contract, and speed. The golden cases (tests/cases/cluster-*) hold whole plans."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reconciler.model import (
    VGPU,
    ActionKind,
    CrCreate,
    CrDelete,
    CrUpdate,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    KubevirtAllow,
    KubevirtUpdate,
    PciAddress,
    Plan,
    PlanError,
    Vf,
    VfKey,
    VgpuCreate,
    VGPUType,
)
from reconciler.model.cluster import (
    ClusterState,
    ConfiguredProfile,
    DeviceUse,
    KubeObject,
    KubeVirtConfig,
)
from reconciler.model.nodestate import stamped
from reconciler.model.plan_json import action_to_json, plan_from_json, plan_to_json
from reconciler.plan import plan_node
from reconciler.plan.cluster import KUBEVIRT_MISSING
from reconciler.plan.compare import effect
from reconciler.plan.planner import NO_CLUSTER
from reconciler.plan.render import render_objects
from tests.cluster_a2 import CATALOG, NODE, a2_desired, allow_entry, kubevirt_config, mdev_a2

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json").read_text("utf-8")
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _synced(desired: DesiredNode, inventory: Inventory, **kwargs: Any) -> ClusterState:
    """The cluster as vgpuctl left it for ``desired`` on ``inventory``."""
    objects = [
        replace(o, resource_version=str(100 + i))
        for i, o in enumerate(render_objects(NODE, desired, inventory))
    ]
    state = ClusterState(
        NODE,
        sriov_gpu_devices={o.name: o for o in objects if o.kind == "SRIOVGPUDevice"},
        vgpu_devices={o.name: o for o in objects if o.kind == "VGPUDevice"},
        **kwargs,
    )
    return with_node_state(state, desired, inventory)


def with_node_state(
    state: ClusterState, desired: DesiredNode, inventory: Inventory
) -> ClusterState:
    """``state`` with the VGPUNodeState an earlier run left (as the planner writes it, times
    stamped): the tests here are about the other objects; tests/unit/test_node_state.py
    judges the node state itself."""
    plan = plan_node(desired, inventory, catalog=CATALOG, cluster=state)
    (write,) = [a for a in plan.actions if a.target == NODE]
    assert isinstance(write, CrCreate | CrUpdate)
    stored = replace(
        write.object,
        status=stamped(write.object.status, "2026-11-30T10:00:00Z"),
        resource_version="99",
    )
    return replace(state, node_state=stored)


SEED = {0: "NVIDIA A2-4A", 1: "NVIDIA A2-4Q"}


def test_without_a_cluster_the_host_plan_says_cluster_actions_were_skipped() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    plan = plan_node(a2_desired({**SEED, 2: "NVIDIA A2-4Q"}), inventory, catalog=CATALOG)
    assert plan.notes == (NO_CLUSTER,) == ("cluster actions skipped: no cluster configured",)
    assert [a.kind for a in plan.actions] == [
        ActionKind.VGPU_CREATE,
        ActionKind.DEVICE_PLUGIN_REFRESH,
    ]
    with_cluster = plan_node(
        a2_desired({**SEED, 2: "NVIDIA A2-4Q"}),
        inventory,
        catalog=CATALOG,
        cluster=_synced(a2_desired(SEED), inventory),
    )
    assert with_cluster.actions[:1] == plan.actions[:1]
    assert with_cluster.actions[-1].kind is ActionKind.DEVICE_PLUGIN_REFRESH
    assert NO_CLUSTER not in with_cluster.notes


def test_cluster_state_of_another_node_is_refused() -> None:
    with pytest.raises(PlanError, match="cluster state is for node other"):
        plan_node(
            a2_desired(SEED),
            Inventory(NODE, (mdev_a2(SEED),)),
            catalog=CATALOG,
            cluster=ClusterState("other"),
        )


def test_a_kubelet_allocation_blocks_removal_naming_the_vm_and_wins_over_the_hosts_word() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED, held={1: "process 4242 (qemu)"}),))
    cluster = _synced(
        a2_desired(SEED),
        inventory,
        device_uses={
            "uuid-1": DeviceUse("uuid-1", "nvidia.com/NVIDIA_A2-4Q", "VM vdi/win11 (pod p)")
        },
    )
    plan = plan_node(a2_desired({0: "NVIDIA A2-4A"}), inventory, catalog=CATALOG, cluster=cluster)
    (blocked,) = plan.blocked
    assert blocked.kind is ActionKind.VGPU_REMOVE
    assert "in use by VM vdi/win11 (pod p)" in blocked.reason
    # The fingerprint is the host's own, whatever the cluster said.
    assert plan.observed_fingerprint == inventory.fingerprint()


def test_a_running_vmi_with_unknown_allocation_holds_every_vgpu_of_its_profile() -> None:
    inventory = Inventory(
        NODE, (mdev_a2({0: "NVIDIA A2-4Q", 1: "NVIDIA A2-4Q", 2: "NVIDIA A2-4A"}),)
    )
    cluster = ClusterState(
        NODE,
        vmi_resources={
            "vdi/b": ("nvidia.com/NVIDIA_A2-4Q",),
            "vdi/a": ("nvidia.com/NVIDIA_A2-4Q", "nvidia.com/other"),
        },
    )
    plan = plan_node(a2_desired({}), inventory, catalog=CATALOG, cluster=cluster)
    removable = {a.target for a in plan.actions if a.kind is ActionKind.VGPU_REMOVE}
    assert removable == {"0000:08:00.6"}  # the A2-4A: no VMI asks for that profile
    reasons = [b.reason for b in plan.blocked if b.kind is ActionKind.VGPU_REMOVE]
    assert len(reasons) == 2
    assert all("in use by VMs vdi/a, vdi/b (allocation unknown)" in r for r in reasons)


_ALLOW_KINDS = (ActionKind.KUBEVIRT_ALLOW, ActionKind.KUBEVIRT_UPDATE)


def _kubevirt_update(plan: Plan) -> Mapping[str, Any]:
    """The plan's allow-list change as one: the additions of its kubevirt-allow (which must
    come before every host action), the removals of its kubevirt-update (after every host
    action), the selectors owned once both ran."""
    allow = [a for a in plan.actions if a.kind is ActionKind.KUBEVIRT_ALLOW]
    update = [a for a in plan.actions if a.kind is ActionKind.KUBEVIRT_UPDATE]
    assert len(allow) <= 1 and len(update) <= 1 and allow + update
    host = [a.seq for a in plan.actions if a.kind.is_host]
    out: dict[str, Any] = {"add": [], "remove": [], "owned": [], "addPci": [], "removePci": []}
    if allow:
        assert allow[0].seq == 1 and allow[0].target == "kubevirt/kubevirt/kubevirt"
        doc = action_to_json(allow[0])
        assert "remove" not in doc and "removePci" not in doc
        out.update(doc)
    if update:
        assert all(seq < update[0].seq for seq in host)
        doc = action_to_json(update[0])
        assert (
            doc["add"] == []
            and "addPci" not in doc
            and update[0].target == ("kubevirt/kubevirt/kubevirt")
        )
        out["remove"], out["removePci"] = doc["remove"], doc.get("removePci", [])
        out["reason"] = doc["reason"] if not allow else f"{out['reason']}; {doc['reason']}"
        out["resourceVersion"] = doc["resourceVersion"]
        out["namespace"], out["name"] = doc["namespace"], doc["name"]
        if allow:
            out["owned"] = sorted(set(out["owned"]) - set(doc["remove"]))
            owned_pci = set(out.get("ownedPci", [])) - set(out["removePci"])
            out["ownedPci"] = sorted(owned_pci)
        else:
            out["owned"], out["ownedPci"] = doc["owned"], doc.get("ownedPci", [])
    for key in ("addPci", "removePci", "ownedPci"):
        if not out.get(key):
            out.pop(key, None)
    return out


def test_allow_list_gains_configured_profiles_and_loses_only_its_own_unused_ones() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    kubevirt = kubevirt_config(
        ["NVIDIA A2-4A", "NVIDIA A2-8Q", "NVIDIA A2-2B", "NVIDIA L4-6Q"],
        ["NVIDIA A2-4A", "NVIDIA A2-2B", "NVIDIA L4-6Q", "NVIDIA A2-1B"],
    )
    cluster = _synced(
        a2_desired(SEED),
        inventory,
        kubevirt=kubevirt,
        profiles_elsewhere=frozenset(
            {ConfiguredProfile("NVIDIA L4-6Q"), ConfiguredProfile("NVIDIA A2-8Q")}
        ),
    )
    fields = _kubevirt_update(
        plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster)
    )
    assert fields["add"] == [allow_entry("NVIDIA A2-4Q")]
    # A2-2B was ours and is configured nowhere: marked retiring (removed by a later run, its
    # mark old enough: test_an_owned_entry_no_node_keeps_is_marked_then_removed_after_the_grace);
    # A2-8Q is not ours (kept although configured elsewhere only); L4-6Q is ours and still
    # configured on another node; A2-1B was ours but someone removed its entry: forgotten.
    assert fields["remove"] == []
    (update,) = [
        a
        for a in plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster).actions
        if isinstance(a, KubevirtUpdate) and a.kind is ActionKind.KUBEVIRT_UPDATE
    ]
    assert update.retire == ("NVIDIA A2-2B",) and update.unmark == ()
    assert fields["owned"] == ["NVIDIA A2-2B", "NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA L4-6Q"]
    assert (fields["namespace"], fields["name"], fields["resourceVersion"]) == (
        "kubevirt",
        "kubevirt",
        "5",
    )


# -- two-phase retirement: marked, then removed once the mark is older than the grace --------

OBSERVED_AT = "2026-12-07T19:00:00Z"


def _retiring_plan(
    marks: dict[str, str],
    *,
    grace: float = 900.0,
    elsewhere: frozenset[ConfiguredProfile] = frozenset(),
    observed_at: str = OBSERVED_AT,
) -> tuple[KubevirtAllow | None, KubevirtUpdate | None, Plan]:
    """The seed node, unchanged, its allow-list owning A2-2B (no node has or wants it) beside
    its own two types, with ``marks`` on the CR."""
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    owned = ["NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA A2-2B"]
    kubevirt = replace(kubevirt_config(owned, owned), retiring=marks)
    cluster = _synced(
        a2_desired(SEED),
        inventory,
        kubevirt=kubevirt,
        profiles_elsewhere=elsewhere,
        observed_at=observed_at,
    )
    plan = plan_node(
        a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster, allow_list_grace=grace
    )
    allow = [a for a in plan.actions if isinstance(a, KubevirtAllow)]
    update = [
        a
        for a in plan.actions
        if isinstance(a, KubevirtUpdate) and a.kind is ActionKind.KUBEVIRT_UPDATE
    ]
    return (allow or [None])[0], (update or [None])[0], plan


def test_an_owned_entry_no_node_keeps_is_marked_then_removed_after_the_grace() -> None:
    """Unmarked: marked (the executor stamps the time). Marked less than the grace before the
    summaries were read: left, with a note. Marked the grace or longer before: removed, its
    mark with it. A mark that cannot be read is written again. (Before: removed at once.)"""
    _, update, _ = _retiring_plan({})
    assert update is not None
    assert (update.retire, update.remove, update.unmark) == (("NVIDIA A2-2B",), (), ())
    assert "mark NVIDIA A2-2B retiring" in update.reason and "after 15m" in update.reason

    _, update, plan = _retiring_plan({"NVIDIA A2-2B": "2026-12-07T18:45:01Z"})
    assert update is None
    assert any("NVIDIA A2-2B retiring since 2026-12-07T18:45:01Z" in n for n in plan.notes)

    _, update, _ = _retiring_plan({"NVIDIA A2-2B": "2026-12-07T18:45:00Z"})
    assert update is not None
    assert (update.retire, update.remove, update.unmark) == ((), ("NVIDIA A2-2B",), ())
    assert update.owned == ("NVIDIA A2-4A", "NVIDIA A2-4Q")

    _, update, _ = _retiring_plan({"NVIDIA A2-2B": "yesterday"})
    assert update is not None and update.retire == ("NVIDIA A2-2B",) and update.remove == ()


def test_a_mark_is_never_old_enough_when_the_observation_time_is_unknown() -> None:
    _, update, _ = _retiring_plan({"NVIDIA A2-2B": "2020-01-01T00:00:00Z"}, observed_at="")
    assert update is None


def test_a_grace_of_zero_removes_at_once_unmarked() -> None:
    _, update, _ = _retiring_plan({}, grace=0)
    assert update is not None
    assert (update.retire, update.remove) == ((), ("NVIDIA A2-2B",))


def test_a_mark_on_a_type_kept_again_or_gone_is_cleared() -> None:
    """Another node shows A2-2B again: its mark is cleared, nothing retires; a mark on a
    selector that is no owned entry any more is cleared too."""
    marks = {"NVIDIA A2-2B": "2026-12-07T18:00:00Z", "NVIDIA A2-1B": "2026-12-07T18:00:00Z"}
    _, update, _ = _retiring_plan(marks, elsewhere=frozenset({ConfiguredProfile("NVIDIA A2-2B")}))
    assert update is not None
    assert (update.retire, update.remove) == ((), ())
    assert update.unmark == ("NVIDIA A2-1B", "NVIDIA A2-2B")
    assert "clear the retiring mark of NVIDIA A2-1B, NVIDIA A2-2B" in update.reason


def test_every_mdev_type_the_host_phase_creates_is_made_sure_of_before_it() -> None:
    """A2-4Q is listed and unmarked, A2-4C listed but marked by another node, A2-4A missing:
    the plan creates vGPUs of all three, so its kubevirt-allow names all three (the listed
    ones added only if gone at apply) and clears their marks, before the first host action.
    The saved form of this step is the same whether or not they were listed at plan time.
    (Before: only the missing A2-4A, and a marked type was created unprotected.)"""
    inventory = Inventory(NODE, (mdev_a2({}),))
    wanted = {0: "NVIDIA A2-4Q", 1: "NVIDIA A2-4C", 2: "NVIDIA A2-4A"}
    kubevirt = replace(
        kubevirt_config(["NVIDIA A2-4Q", "NVIDIA A2-4C"], ["NVIDIA A2-4Q", "NVIDIA A2-4C"]),
        retiring={"NVIDIA A2-4C": "2026-12-07T18:00:00Z"},
    )
    cluster = ClusterState(NODE, kubevirt=kubevirt, observed_at=OBSERVED_AT)
    plan = plan_node(a2_desired(wanted), inventory, catalog=CATALOG, cluster=cluster)
    allow = plan.actions[0]
    assert isinstance(allow, KubevirtAllow) and allow.seq == 1
    assert [e.selector for e in allow.add] == ["NVIDIA A2-4A", "NVIDIA A2-4C", "NVIDIA A2-4Q"]
    assert allow.unmark == ("NVIDIA A2-4A", "NVIDIA A2-4C", "NVIDIA A2-4Q")
    assert allow.owned == ("NVIDIA A2-4A", "NVIDIA A2-4C", "NVIDIA A2-4Q")
    assert "NVIDIA A2-4C, NVIDIA A2-4Q listed now; made sure of at apply" in allow.reason
    assert not any(a.kind is ActionKind.KUBEVIRT_UPDATE for a in plan.actions)
    # Listed or gone at plan time, the step does the same (a saved plan compares equal).
    gone = replace(kubevirt, mediated_devices=(), owned=frozenset())
    fresh = plan_node(
        a2_desired(wanted), inventory, catalog=CATALOG, cluster=replace(cluster, kubevirt=gone)
    )
    assert effect(fresh.actions[0]) == effect(allow)


def test_a_complete_allow_list_is_a_noop_and_a_missing_kubevirt_cr_a_note() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    complete = kubevirt_config(["NVIDIA A2-4A", "NVIDIA A2-4Q"], ["NVIDIA A2-4Q"])
    plan = plan_node(
        a2_desired(SEED),
        inventory,
        catalog=CATALOG,
        cluster=_synced(a2_desired(SEED), inventory, kubevirt=complete),
    )
    assert plan.actions == () and plan.drift == ()
    assert [n.reason for n in plan.noops[-2:]] == [
        "allow-list has every profile a node has or wants (NVIDIA A2-4A, NVIDIA A2-4Q)",
        "VGPUNodeState up to date",
    ]
    missing = plan_node(
        a2_desired(SEED),
        inventory,
        catalog=CATALOG,
        cluster=_synced(
            a2_desired(SEED),
            inventory,
            notes=("KubeVirt CR not found: allow-list not updated", "x"),
        ),
    )
    assert missing.notes == (KUBEVIRT_MISSING, "x")  # the observer's note is not repeated


def test_only_the_creates_of_a_type_kubevirt_serves_itself_are_blocked() -> None:
    """A2-4Q is listed without externalResourceProvider (KubeVirt's own device plugin serves
    it, its sweep spares it only if mediatedDevicesConfiguration asks): the new A2-4Q is
    blocked with why, the new A2-4A is made, and vgpuctl adds no A2-4Q entry beside it."""
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    theirs = {"mdevNameSelector": "NVIDIA_A2-4Q", "resourceName": "nvidia.com/kv-4q"}
    kubevirt = KubeVirtConfig(
        "kubevirt", "kubevirt", "5", (allow_entry("NVIDIA A2-4A"), theirs), frozenset()
    )
    wanted = a2_desired({**SEED, 2: "NVIDIA A2-4Q", 3: "NVIDIA A2-4A"})
    cluster = _synced(a2_desired(SEED), inventory, kubevirt=kubevirt)
    plan = plan_node(wanted, inventory, catalog=CATALOG, cluster=cluster)
    creates = [(a.target, a.type_name) for a in plan.actions if isinstance(a, VgpuCreate)]
    assert creates == [(str(mdev_a2({}).vfs[3].address), "NVIDIA A2-4A")]
    (blocked,) = [b.action for b in plan.blocked]
    assert isinstance(blocked, VgpuCreate) and blocked.type_name == "NVIDIA A2-4Q"
    assert blocked.reason.startswith(
        "KubeVirt serves NVIDIA_A2-4Q itself: the kubevirt/kubevirt/kubevirt mediatedDevices "
        "entry for it (resourceName nvidia.com/kv-4q) is not externalResourceProvider: true"
    )
    # The allow step only makes sure of the A2-4A it creates (listed: someone else's entry,
    # not claimed); nothing of A2-4Q.
    (allow,) = [a for a in plan.actions if isinstance(a, KubevirtAllow)]
    assert [e.selector for e in allow.add] == ["NVIDIA A2-4A"] == list(allow.unmark)
    assert allow.owned == ()
    assert [n for n in plan.notes if "vgpuctl adds no allow-list entry" in n] == [
        f"{blocked.reason}. vgpuctl adds no allow-list entry for NVIDIA A2-4Q and makes no "
        "vGPU of it"
    ]


# -- the PCI host devices allow-list: profiles on NVIDIA's vendor-specific VFIO interface ------

L40S = PciAddress.parse("0000:18:00.0")
L40S_8Q, L40S_4Q = "NVIDIA L40S-8Q", "NVIDIA L40S-4Q"
VFIO_SEED = {0: L40S_8Q, 1: L40S_8Q}


def _l40s_vfio(vgpus: Mapping[int, str]) -> Gpu:
    """An L40S with SR-IOV on and its VFs on the vfio interface (docs/domain.md §3b): a vGPU is
    named by its VF; the VFs' device id (sriov_vf_device) is 26b9."""
    model = CATALOG.model("L40S")
    assert model is not None
    types = tuple(
        VGPUType(p.name, str(1145 + i), p.framebuffer_mib, p.max_instances)
        for i, p in enumerate(model.time_sliced_profiles)
    )
    base = Gpu(
        L40S, "10de", "26b9", model="NVIDIA L40S", total_vfs=32, num_vfs=32, vf_offset=4,
        driver="nvidia", vf_device="26b9",
    )  # fmt: skip
    vfs = []
    for i in range(32):
        address = base.predicted_vf_address(i)
        vfs.append(Vf(address, i, VGPU(str(address), vgpus[i]) if i in vgpus else None))
    return replace(base, interface=Interface.VFIO, vfs=tuple(vfs), types=types)


def _vfio_desired(vgpus: Mapping[int, str]) -> DesiredNode:
    keyed: dict[VfKey, str] = dict(vgpus.items())
    return DesiredNode(NODE, (DesiredGpu(L40S, True, vgpus=keyed),))


def _pci_entry(profile: str) -> dict[str, Any]:
    return {
        "pciVendorSelector": "10DE:26B9",
        "resourceName": "nvidia.com/" + profile.replace(" ", "_"),
        "externalResourceProvider": True,
    }


def _allow_lists(
    mdev: list[str], owned: list[str], pci: list[str], owned_pci: list[str]
) -> KubeVirtConfig:
    return KubeVirtConfig(
        "kubevirt",
        "kubevirt",
        "5",
        tuple(allow_entry(s) for s in mdev),
        frozenset(owned),
        tuple(_pci_entry(p) for p in pci),
        frozenset("nvidia.com/" + p.replace(" ", "_") for p in owned_pci),
    )


def _vfio_plan(kubevirt: KubeVirtConfig, elsewhere: frozenset[ConfiguredProfile]) -> Plan:
    inventory = Inventory(NODE, (_l40s_vfio(VFIO_SEED),))
    cluster = _synced(
        _vfio_desired(VFIO_SEED), inventory, kubevirt=kubevirt, profiles_elsewhere=elsewhere
    )
    return plan_node(_vfio_desired(VFIO_SEED), inventory, catalog=CATALOG, cluster=cluster)


def test_an_unnamed_vfio_gpu_keeps_its_objects_and_its_pci_host_device_entry() -> None:
    """The L40S's file stops naming it: its two L40S-8Q vGPUs stay on the host, so its 33
    objects stay as they are (they describe that layout already) and L40S-8Q stays allow-listed
    as a PCI host device (10DE:26B9), not as a mediated device: what changes is the summary."""
    inventory = Inventory(NODE, (_l40s_vfio(VFIO_SEED),))
    kubevirt = _allow_lists([], [], [L40S_8Q], [L40S_8Q])
    cluster = _synced(_vfio_desired(VFIO_SEED), inventory, kubevirt=kubevirt)
    plan = plan_node(DesiredNode(NODE, ()), inventory, catalog=CATALOG, cluster=cluster)
    assert [(a.kind, a.target) for a in plan.actions] == [(ActionKind.CR_UPDATE, NODE)]
    summary = plan.actions[0]
    assert isinstance(summary, CrUpdate)
    assert [g["managed"] for g in summary.object.status["gpus"]] == [False]
    assert sum(n.reason == "VGPUDevice up to date" for n in plan.noops) == 32
    assert sum(n.reason == "SRIOVGPUDevice up to date" for n in plan.noops) == 1
    kept = [n for n in plan.notes if "unmanaged" in n]
    assert kept == [
        "GPU 0000:18:00.0 (NVIDIA L40S) is not in the desired state: unmanaged; its objects "
        "describe what the host has"
    ]
    (allow,) = [n for n in plan.noops if n.target == "kubevirt/kubevirt/kubevirt"]
    assert allow.reason == "allow-list has every profile a node has or wants (NVIDIA L40S-8Q)"


def test_an_unnamed_gpus_objects_follow_the_host_and_its_profiles_stay_configured() -> None:
    """The A2 is no longer named; since the last run someone removed the A2-4Q on VF 1 and
    created an A2-4A on VF 2, and the driver no longer reads VF 0's type. Each changed VF's
    object says what the host has (VF 0: a vGPU, its type not named), nothing is deleted, and
    A2-4A stays allow-listed while A2-4Q, on no VF of any node now, leaves it."""
    synced = _synced(
        a2_desired(SEED), Inventory(NODE, (mdev_a2(SEED),)), kubevirt=kubevirt_config(
            ["NVIDIA A2-4A", "NVIDIA A2-4Q"], ["NVIDIA A2-4A", "NVIDIA A2-4Q"]
        )
    )  # fmt: skip
    now = Inventory(NODE, (mdev_a2({0: "unknown", 2: "NVIDIA A2-4A"}),))
    # A grace of 0: the entry goes at once (the two-phase retirement is tested above).
    plan = plan_node(
        DesiredNode(NODE, ()), now, catalog=CATALOG, cluster=synced, allow_list_grace=0
    )
    updates = {a.target: a for a in plan.actions if isinstance(a, CrUpdate) and a.target != NODE}
    assert sorted(updates) == ["n1-000008004", "n1-000008005", "n1-000008006"]
    assert not [a for a in plan.actions if a.kind is ActionKind.CR_DELETE]
    spec = {"nodeName": NODE, "parentGPUDeviceAddress": "0000:08:00.0"}
    assert dict(updates["n1-000008004"].object.spec) == {
        **spec, "address": "0000:08:00.4", "enabled": True, "vGPUTypeName": "",
    }  # fmt: skip
    assert dict(updates["n1-000008005"].object.spec) == {
        **spec, "address": "0000:08:00.5", "enabled": False, "vGPUTypeName": "",
    }  # fmt: skip
    assert dict(updates["n1-000008006"].object.spec) == {
        **spec, "address": "0000:08:00.6", "enabled": True, "vGPUTypeName": "NVIDIA A2-4A",
    }  # fmt: skip
    assert updates["n1-000008006"].reason == (
        "VGPUDevice for VF 0000:08:00.6: spec differs from the host; status differs from the host"
    )
    fields = _kubevirt_update(plan)
    assert fields["add"] == [] and fields["remove"] == ["NVIDIA A2-4Q"]
    assert fields["owned"] == ["NVIDIA A2-4A"]


def _foreign(obj: KubeObject) -> KubeObject:
    """``obj`` as Harvester's pcidevices-controller keeps it: no managed-by label of vgpuctl."""
    return replace(
        obj, labels={k: v for k, v in obj.labels.items() if not k.endswith("managed-by")}
    )


def test_another_controllers_objects_of_an_unnamed_gpu_are_left_alone_unless_adopted() -> None:
    """The A2 is named, the L40S beside it is not. Its objects all another controller's: left
    alone, --adopt or not (it is for the GPUs the desired state names), and no note says its
    objects are kept. Its GPU's object vgpuctl's but its VFs' another controller's: the GPU is
    kept, and the VFs' objects are left alone unless --adopt, which takes them over as they
    are (their spec is already what the host has)."""
    inventory = Inventory(NODE, (mdev_a2(SEED), _l40s_vfio(VFIO_SEED)))
    both = DesiredNode(NODE, (*a2_desired(SEED).gpus, *_vfio_desired(VFIO_SEED).gpus))
    synced = _synced(both, inventory)
    l40s = [
        o
        for o in (*synced.sriov_gpu_devices.values(), *synced.vgpu_devices.values())
        if o.name.startswith("n1-000018")
    ]
    assert len(l40s) == 33
    unnamed_note = (
        "GPU 0000:18:00.0 (NVIDIA L40S) is not in the desired state: unmanaged; its objects "
        "describe what the host has"
    )

    def stored_as(objects: list[KubeObject]) -> ClusterState:
        by_name = {o.name: o for o in objects}
        return replace(
            synced,
            sriov_gpu_devices={**synced.sriov_gpu_devices, **{
                n: o for n, o in by_name.items() if o.kind == "SRIOVGPUDevice"}},
            vgpu_devices={**synced.vgpu_devices, **{
                n: o for n, o in by_name.items() if o.kind == "VGPUDevice"}},
        )  # fmt: skip

    theirs = stored_as([_foreign(o) for o in l40s])
    for adopt in (False, True):
        plan = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=theirs, adopt=adopt)
        assert [a.target for a in plan.actions if a.target.startswith("n1-000018")] == []
        assert unnamed_note not in plan.notes
        noop = next(n for n in plan.noops if n.target == "n1-000018000")
        assert noop.reason == (
            "managed by another controller; GPU 0000:18:00.0 is not in the desired state: "
            "not touched"
        )

    mixed = stored_as([o if o.kind == "SRIOVGPUDevice" else _foreign(o) for o in l40s])
    plan = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=mixed)
    assert [a.target for a in plan.actions if a.target.startswith("n1-000018")] == []
    assert unnamed_note in plan.notes
    noop = next(n for n in plan.noops if n.target == "n1-000018004")
    assert noop.reason == "managed by another controller: not touched (use --adopt)"
    adopted = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=mixed, adopt=True)
    taken = [a for a in adopted.actions if a.target.startswith("n1-000018")]
    assert len(taken) == 32
    assert all(isinstance(a, CrUpdate) and a.adopt and not a.drift for a in taken)
    first = taken[0]
    assert isinstance(first, CrUpdate) and first.target == "n1-000018004"
    assert first.object.spec["vGPUTypeName"] == L40S_8Q and first.object.spec["enabled"] is True


def test_a_profile_on_a_vfio_gpu_is_allowed_as_a_pci_host_device() -> None:
    fields = _kubevirt_update(_vfio_plan(_allow_lists([], [], [], []), frozenset()))
    assert fields["add"] == [] and fields["remove"] == [] and fields["owned"] == []
    assert fields["addPci"] == [
        {
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/NVIDIA_L40S-8Q",
            "externalResourceProvider": True,
        }
    ]
    assert fields["ownedPci"] == ["nvidia.com/NVIDIA_L40S-8Q"]
    assert "removePci" not in fields
    assert fields["reason"] == (
        "PCI host devices allow-list: add nvidia.com/NVIDIA_L40S-8Q (10DE:26B9) (a node has or "
        "wants vGPUs of it)"
    )


def test_a_profile_named_with_a_run_of_spaces_is_allow_listed_under_harvesters_name() -> None:
    """Another node has ``NVIDIA  A2-8Q`` (two spaces) on mdev and ``NVIDIA  L40S-4Q`` on vfio:
    their entries carry the resource Harvester names them by (pcidevices
    ``GeneratevGPUDeviceName``: a run of whitespace is one ``_``), which vgpuctl's device
    plugin advertises and a VM asks for; vgpuctl wrote ``nvidia.com/NVIDIA__A2-8Q``. An entry
    written by hand with Harvester's name lists the type: nothing added, nothing noted."""
    mdev, vfio = "NVIDIA  A2-8Q", "NVIDIA  L40S-4Q"
    elsewhere = frozenset(
        {ConfiguredProfile(mdev), ConfiguredProfile(vfio, Interface.VFIO, "26b9")}
    )
    fields = _kubevirt_update(_vfio_plan(_allow_lists([], [], [L40S_8Q], [L40S_8Q]), elsewhere))
    assert fields["add"] == [
        {
            "mdevNameSelector": "NVIDIA  A2-8Q",
            "resourceName": "nvidia.com/NVIDIA_A2-8Q",
            "externalResourceProvider": True,
        }
    ]
    assert fields["addPci"] == [
        {
            "pciVendorSelector": "10DE:26B9",
            "resourceName": "nvidia.com/NVIDIA_L40S-4Q",
            "externalResourceProvider": True,
        }
    ]
    by_hand = {
        "mdevNameSelector": "NVIDIA  A2-8Q",
        "resourceName": "nvidia.com/NVIDIA_A2-8Q",
        "externalResourceProvider": True,
    }
    pci_by_hand = {**_pci_entry(L40S_8Q), "resourceName": "nvidia.com/NVIDIA_L40S-4Q"}
    listed = KubeVirtConfig(
        "kubevirt",
        "kubevirt",
        "5",
        (by_hand,),
        frozenset(),
        (_pci_entry(L40S_8Q), pci_by_hand),
        frozenset({"nvidia.com/NVIDIA_L40S-8Q"}),
    )
    plan = _vfio_plan(listed, elsewhere)
    assert [a for a in plan.actions if a.kind is ActionKind.KUBEVIRT_ALLOW] == []
    assert not any("resourceName" in note for note in plan.notes), plan.notes


def test_a_vfio_entry_stays_while_another_node_has_the_profile_on_vfio_and_goes_after() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    kubevirt = _allow_lists(
        ["NVIDIA A2-4A", "NVIDIA A2-4Q"], ["NVIDIA A2-4Q"], [L40S_8Q], [L40S_8Q]
    )
    on_vfio = ConfiguredProfile(L40S_8Q, Interface.VFIO, "26b9")
    kept = plan_node(
        a2_desired(SEED),
        inventory,
        catalog=CATALOG,
        cluster=_synced(
            a2_desired(SEED), inventory, kubevirt=kubevirt, profiles_elsewhere=frozenset({on_vfio})
        ),
    )
    assert kept.actions == ()
    assert kept.noops[-2].reason == (
        "allow-list has every profile a node has or wants "
        "(NVIDIA A2-4A, NVIDIA A2-4Q, NVIDIA L40S-8Q)"
    )
    # No node has it any more: the entry vgpuctl added goes, and the mdev side is untouched.
    gone = _kubevirt_update(
        plan_node(
            a2_desired(SEED),
            inventory,
            catalog=CATALOG,
            cluster=_synced(a2_desired(SEED), inventory, kubevirt=kubevirt),
        )
    )
    assert gone["removePci"] == ["nvidia.com/NVIDIA_L40S-8Q"]
    assert "addPci" not in gone and "ownedPci" not in gone
    assert (gone["add"], gone["remove"], gone["owned"]) == ([], [], ["NVIDIA A2-4Q"])
    assert gone["reason"] == (
        "PCI host devices allow-list: remove nvidia.com/NVIDIA_L40S-8Q (no node has or wants "
        "vGPUs of it)"
    )
    # Only on mdev elsewhere now: on vfio no node has it, so its PCI entry goes, and the
    # mdev entry comes.
    moved = _kubevirt_update(
        plan_node(
            a2_desired(SEED),
            inventory,
            catalog=CATALOG,
            cluster=_synced(
                a2_desired(SEED),
                inventory,
                kubevirt=kubevirt,
                profiles_elsewhere=frozenset({ConfiguredProfile(L40S_8Q)}),
            ),
        )
    )
    assert moved["add"] == [allow_entry(L40S_8Q)] and moved["removePci"] == [
        "nvidia.com/NVIDIA_L40S-8Q"
    ]


def test_pci_entries_someone_else_added_are_never_touched() -> None:
    # An entry for a profile configured here, and one for a profile configured nowhere: both
    # someone else's (no ownership recorded).
    theirs = _allow_lists([], [], [L40S_8Q, L40S_4Q], [])
    plan = _vfio_plan(theirs, frozenset())
    assert [a for a in plan.actions if a.kind in _ALLOW_KINDS] == []
    assert any(
        n.reason == "allow-list has every profile a node has or wants (NVIDIA L40S-8Q)"
        for n in plan.noops
    )


def test_one_profile_on_mdev_here_and_on_vfio_elsewhere_gets_an_entry_of_each_kind() -> None:
    mdev_l40s = replace(
        _l40s_vfio({}),
        interface=Interface.MDEV,
        vfs=tuple(
            replace(v, vgpu=VGPU(f"uuid-{v.index}", L40S_8Q)) if v.index < 2 else v
            for v in _l40s_vfio({}).vfs
        ),
    )
    inventory = Inventory(NODE, (mdev_l40s,))
    cluster = _synced(
        _vfio_desired(VFIO_SEED),
        inventory,
        kubevirt=_allow_lists([], [], [], []),
        profiles_elsewhere=frozenset({ConfiguredProfile(L40S_8Q, Interface.VFIO, "26B9")}),
    )
    fields = _kubevirt_update(
        plan_node(_vfio_desired(VFIO_SEED), inventory, catalog=CATALOG, cluster=cluster)
    )
    assert fields["add"] == [allow_entry(L40S_8Q)]
    assert fields["addPci"] == [_pci_entry(L40S_8Q)]
    assert (fields["owned"], fields["ownedPci"]) == ([L40S_8Q], ["nvidia.com/NVIDIA_L40S-8Q"])
    assert fields["reason"] == (
        "mediated devices allow-list: add NVIDIA L40S-8Q (a node has or wants vGPUs of it); PCI "
        "host devices allow-list: add nvidia.com/NVIDIA_L40S-8Q (10DE:26B9) (a node has or wants "
        "vGPUs of it)"
    )


def test_a_gpu_whose_vfs_are_not_up_on_a_host_without_mdev_is_planned_as_vfio() -> None:
    off = replace(_l40s_vfio({}), interface=Interface.NONE, num_vfs=0, vfs=(), types=())
    inventory = Inventory(NODE, (off,), mdev_bus=False)
    node = DesiredNode(NODE, (DesiredGpu(L40S, True, profiles={L40S_8Q: 2}),))
    cluster = ClusterState(NODE, kubevirt=_allow_lists([], [], [], []))
    fields = _kubevirt_update(plan_node(node, inventory, catalog=CATALOG, cluster=cluster))
    assert fields["add"] == [] and fields["addPci"] == [_pci_entry(L40S_8Q)]


def test_a_vfio_profile_whose_vf_device_id_is_unknown_gets_a_note_not_an_entry() -> None:
    unknown = replace(_l40s_vfio(VFIO_SEED), vf_device="")
    inventory = Inventory(NODE, (unknown,))
    cluster = _synced(_vfio_desired(VFIO_SEED), inventory, kubevirt=_allow_lists([], [], [], []))
    plan = plan_node(_vfio_desired(VFIO_SEED), inventory, catalog=CATALOG, cluster=cluster)
    assert [a for a in plan.actions if a.kind in _ALLOW_KINDS] == []
    assert (
        "profile NVIDIA L40S-8Q is configured on NVIDIA's vfio interface but its VFs' "
        "PCI device id is not known: no pciHostDevices entry added"
    ) in plan.notes


def test_objects_of_another_controller_for_gpus_we_do_not_render_are_never_deleted() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    theirs = KubeObject(
        "SRIOVGPUDevice",
        "n1-000009000",
        labels={"nodename": NODE},
        spec={"address": "0000:09:00.0"},
        resource_version="3",
    )
    ours_gone = replace(
        theirs,
        name="n1-00000a000",
        labels={**theirs.labels, "app.kubernetes.io/managed-by": "vgpuctl"},
        spec={"address": "0000:0a:00.0"},
    )
    cluster = replace(
        _synced(a2_desired(SEED), inventory),
        sriov_gpu_devices={
            **_synced(a2_desired(SEED), inventory).sriov_gpu_devices,
            theirs.name: theirs,
            ours_gone.name: ours_gone,
        },
    )
    for adopt in (False, True):
        plan = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster, adopt=adopt)
        # The node's VGPUNodeState records the change; the only Harvester object written is ours.
        assert [(a.kind, a.target, a.reason) for a in plan.actions] == [
            (ActionKind.CR_UPDATE, NODE, "VGPUNodeState for node n1: status differs from the host"),
            (ActionKind.CR_DELETE, "n1-00000a000", "GPU 0000:0a:00.0 is not on this host"),
        ]
        assert plan.actions[1] == CrDelete(
            seq=2,
            target="n1-00000a000",
            reason="GPU 0000:0a:00.0 is not on this host",
            object_kind="SRIOVGPUDevice",
            resource_version="3",
        )
        noop = next(n for n in plan.noops if n.target == theirs.name)
        assert noop.reason == (
            "managed by another controller; GPU 0000:09:00.0 is not on this host: not touched"
        )


def test_a_label_value_names_the_other_controller() -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    synced = _synced(a2_desired(SEED), inventory)
    pf = next(iter(synced.sriov_gpu_devices.values()))
    theirs = replace(pf, labels={**pf.labels, "app.kubernetes.io/managed-by": "pcidevices"})
    cluster = replace(synced, sriov_gpu_devices={pf.name: theirs})
    plan = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster)
    assert plan.actions == ()
    assert any(n.reason == "managed by pcidevices: not touched (use --adopt)" for n in plan.noops)
    assert plan.notes == (
        f"1 object managed by pcidevices not touched (use --adopt to manage them): {pf.name}",
        KUBEVIRT_MISSING,
    )


def _busy_plan() -> Plan:
    """Every cluster kind: a create, updates (one drifted), deletes, a KubeVirt update."""
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    synced = _synced(a2_desired({**SEED, 2: "NVIDIA A2-4A"}), inventory)
    vgpus = dict(synced.vgpu_devices)
    first = vgpus.pop("n1-000008004")
    vgpus["n1-000008004"] = replace(first, spec={**first.spec, "enabled": False})  # by hand
    del vgpus["n1-000008005"]
    stray = replace(first, name="n1-000008099", spec={**first.spec, "address": "0000:08:09.1"})
    vgpus[stray.name] = stray
    cluster = replace(
        synced, vgpu_devices=vgpus, kubevirt=kubevirt_config([], []), profiles_elsewhere=frozenset()
    )
    return plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster)


def test_summary_counts_cluster_actions_by_kind() -> None:
    plan = _busy_plan()
    kinds = [a.kind for a in plan.actions]
    assert kinds == [
        ActionKind.KUBEVIRT_ALLOW,  # the allow-list is empty: its additions come first
        ActionKind.CR_CREATE,
        ActionKind.CR_UPDATE,
        ActionKind.CR_UPDATE,
        ActionKind.CR_UPDATE,  # the node's VGPUNodeState, last of its kind: records the change
        ActionKind.CR_DELETE,
    ]
    assert plan.actions[4].target == NODE
    assert [a.seq for a in plan.actions] == [1, 2, 3, 4, 5, 6]
    s = plan.summary
    assert (s.create, s.change, s.remove, s.blocked) == (1, 4, 1, 0)
    (drift,) = plan.drift
    assert drift.target == "n1-000008004"
    assert [c.to_json() for c in drift.changes] == [
        {"path": "spec.enabled", "from": True, "to": False}
    ]
    assert [a.drift for a in plan.actions if isinstance(a, CrUpdate)] == [
        True,
        False,
        False,
    ]


def test_a_cluster_plan_round_trips_through_json_and_matches_the_schema() -> None:
    plan = _busy_plan()
    raw = json.loads(json.dumps(plan_to_json(plan)))
    assert plan_to_json(plan_from_json(raw)) == raw
    assert plan_from_json(raw) == plan
    VALIDATOR.validate(raw)
    assert raw["drift"][0]["changes"][0]["path"] == "spec.enabled"


def _set(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        target: Any = p
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        target: Any = p
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_set(("actions", 1, "object", "kind"), "Pod"), id="cr kind"),
        pytest.param(_drop(("actions", 1, "object")), id="create without object"),
        pytest.param(_set(("actions", 1, "target"), "N1_000008006"), id="object name"),
        pytest.param(_drop(("actions", 2, "resourceVersion")), id="update rv"),
        pytest.param(_set(("actions", 2, "drift"), "yes"), id="drift flag"),
        pytest.param(_set(("actions", 2, "changes", 0, "op"), "x"), id="change field"),
        pytest.param(_drop(("actions", 5, "resourceVersion")), id="delete rv"),
        pytest.param(_set(("actions", 5, "objectKind"), "Pod"), id="delete kind"),
        pytest.param(_set(("actions", 0, "target"), "kubevirt"), id="kubevirt target"),
        pytest.param(
            _set(("actions", 0, "add", 0, "externalResourceProvider"), False),
            id="external provider",
        ),
        pytest.param(_set(("actions", 0, "remove"), ["NVIDIA A2-4A"]), id="allow removes"),
        pytest.param(_set(("drift", 0, "changes"), []), id="drift without changes"),
        pytest.param(_set(("drift", 0, "kind"), "Node"), id="drift kind"),
    ],
)
def test_the_schema_rejects_malformed_cluster_actions(
    damage: Callable[[dict[str, Any]], None],
) -> None:
    raw = json.loads(json.dumps(plan_to_json(_busy_plan())))
    VALIDATOR.validate(raw)
    damage(raw)
    assert not VALIDATOR.is_valid(raw)


def _l40s_node() -> tuple[DesiredNode, Inventory]:
    model = CATALOG.model("L40S")
    assert model is not None
    types = tuple(
        VGPUType(p.name, f"nvidia-{1144 + i}", p.framebuffer_mib, p.max_instances)
        for i, p in enumerate(model.time_sliced_profiles)
    )
    gpus = []
    for bus in (0x08, 0x18, 0x28, 0x38, 0x48, 0x58, 0x68, 0x78):
        base = Gpu(
            PciAddress(0, bus, 0, 0), "10de", "26b9", model="NVIDIA L40S", total_vfs=32,
            num_vfs=32, vf_offset=2, interface=Interface.MDEV, types=types, driver="nvidia",
        )  # fmt: skip
        vfs = tuple(
            Vf(base.predicted_vf_address(i), i, VGPU(f"u{bus}-{i}", "NVIDIA L40S-8Q"))
            if i < 6
            else Vf(base.predicted_vf_address(i), i)
            for i in range(32)
        )
        gpus.append(replace(base, vfs=vfs))
    node = DesiredNode(
        NODE, tuple(DesiredGpu(g.address, True, profiles={"NVIDIA L40S-8Q": 6}) for g in gpus)
    )
    return node, Inventory(NODE, tuple(gpus))


def test_cluster_planning_of_a_256_vf_node() -> None:
    """Correct at scale (its speed is measured by `just bench`, never asserted here)."""
    node, inventory = _l40s_node()
    cluster = _synced(
        node, inventory, kubevirt=kubevirt_config(["NVIDIA L40S-8Q"], ["NVIDIA L40S-8Q"])
    )
    assert sum(len(g.vfs) for g in inventory.gpus) == 256
    in_sync = plan_node(node, inventory, catalog=CATALOG, cluster=cluster)
    assert in_sync.actions == ()
    # One vGPU fewer per GPU: every empty VF of every GPU can create again, 216 status updates,
    # and the node's VGPUNodeState.
    fewer = replace(
        node,
        gpus=tuple(replace(g, profiles={"NVIDIA L40S-8Q": 5}) for g in node.gpus),
    )
    busy = plan_node(fewer, inventory, catalog=CATALOG, cluster=cluster)
    assert busy.summary.change == 217


def test_a_host_scanned_without_availability_is_not_planned_against_a_cluster() -> None:
    # Its VFs' creatable sets were not read: the VGPUDevices' availableTypes and the summary's
    # counts would show "nothing creatable" for what is only unknown.
    inventory = Inventory(NODE, (mdev_a2({0: "NVIDIA A2-4Q"}),), vf_availability=False)
    desired = a2_desired({0: "NVIDIA A2-4Q"})
    with pytest.raises(PlanError, match="scanned without each VF's available types"):
        plan_node(desired, inventory, catalog=CATALOG, cluster=ClusterState(NODE))
    # Without a cluster it is what plans read.
    assert plan_node(desired, inventory, catalog=CATALOG).actions == ()


def test_the_plan_text_shows_marks_unmarks_and_the_types_made_sure_of() -> None:
    """What a person reads of the retirement (cli/render.py): the allow step's types made sure
    of, an entry marked retiring, a mark cleared, an entry removed."""
    from reconciler.cli.render import plan_text

    _, marking, plan = _retiring_plan({"NVIDIA A2-1B": "2026-12-07T18:00:00Z"})
    assert marking is not None
    text = plan_text(plan)
    assert "        ~ mediatedDevices: NVIDIA A2-2B marked retiring\n" in text
    assert "        ~ mediatedDevices: NVIDIA A2-1B retiring mark cleared\n" in text
    _, _, removing = _retiring_plan({"NVIDIA A2-2B": "2026-12-07T18:00:00Z"})
    assert "        - mediatedDevices: NVIDIA A2-2B\n" in plan_text(removing)
    inventory = Inventory(NODE, (mdev_a2({}),))
    cluster = ClusterState(
        NODE, kubevirt=kubevirt_config(["NVIDIA A2-4Q"], ["NVIDIA A2-4Q"]), observed_at=OBSERVED_AT
    )
    creating = plan_node(
        a2_desired({0: "NVIDIA A2-4Q"}), inventory, catalog=CATALOG, cluster=cluster
    )
    assert (
        "        + mediatedDevices: NVIDIA A2-4Q (made sure of: added if gone, not retiring)\n"
        in plan_text(creating)
    )


@pytest.mark.parametrize(
    ("owned", "whose"),
    [
        (False, "an entry vgpuctl did not add is never changed"),
        (True, "vgpuctl changes none of its entries in place: remove it by hand and the next run "
         "writes it anew"),
    ],
)  # fmt: skip
def test_an_entry_of_the_profiles_selector_under_another_resource_name_is_noted(
    owned: bool, whose: str
) -> None:
    inventory = Inventory(NODE, (mdev_a2(SEED),))
    other = {**allow_entry("NVIDIA A2-4Q"), "resourceName": "nvidia.com/old"}
    kubevirt = KubeVirtConfig(
        "kubevirt",
        "kubevirt",
        "5",
        (allow_entry("NVIDIA A2-4A"), other),
        frozenset({"NVIDIA A2-4Q"} if owned else set()),
    )
    cluster = _synced(a2_desired(SEED), inventory, kubevirt=kubevirt)
    plan = plan_node(a2_desired(SEED), inventory, catalog=CATALOG, cluster=cluster)
    assert [n for n in plan.notes if "names resourceName" in n] == [
        "the kubevirt/kubevirt/kubevirt mediatedDevices entry for NVIDIA A2-4Q names "
        "resourceName nvidia.com/old, not nvidia.com/NVIDIA_A2-4Q that vgpuctl advertises: "
        f"left as it is ({whose})"
    ]
