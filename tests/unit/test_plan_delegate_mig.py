"""Delegate mode and MIG (``plan/mig.py``, ``plan/delegate.py``; docs/delegate.md "MIG").

Facts, from harvester/pcidevices bdd8025 and docs/domain.md §10: pcidevices-controller's
``reconcileMIGConfiguration`` turns MIG mode on for every MIG-capable GPU whose SRIOVGPUDevice is
enabled and creates a MigConfiguration named as it; a GPU in MIG mode offers only MIG-backed
types, for GPU instances that exist. The A100 40GB (PCI device 20f1) has MIG-backed profiles in
the catalogue, the A2 (25b6, shared with the A16) none. Object names are ``<node>-<address
without ':' and '.'>``."""

from __future__ import annotations

import pytest

from reconciler.model import (
    DesiredGpu,
    DesiredNode,
    GpuMatch,
    GroupGpu,
    PciAddress,
    PlanError,
    SourceLocation,
    SriovGpuDeviceDisable,
    SriovGpuDeviceEnable,
)
from reconciler.model.harvester import HarvesterGpu, HarvesterNode
from reconciler.plan.delegate import plan_delegate
from reconciler.plan.mig import offline_problems
from tests.gpus import CATALOG

NODE = "harvester-kgd9c"
PF = PciAddress.parse("0000:08:00.0")
VF0 = PciAddress.parse("0000:08:00.4")
GPU_NAME = f"{NODE}-000008000"
A100_IDS = ("10de", "20f1")
A2_IDS = ("10de", "25b6")
AT = SourceLocation("d.yaml", 9, 13)
ENTRY = SourceLocation("d.yaml", 6, 11)


def node(*, ids: tuple[str, str] | None, mig: bool = False, enabled: bool = False) -> HarvesterNode:
    """One GPU at 08:00.0 as pcidevices shows it, SR-IOV off (no VGPUDevices), with its
    PCIDevice's ids (None: no PCIDevice) and a MigConfiguration of it or not."""
    return HarvesterNode(
        node=NODE,
        gpus=(HarvesterGpu(GPU_NAME, "7", PF, enabled),),
        pci_ids={PF: ids} if ids else {},
        mig_configured=frozenset({GPU_NAME} if mig else ()),
    )


def desired(
    profile: str, *, model: str | None = None, sriov: bool = True, group: str | None = None
) -> DesiredNode:
    gpu = DesiredGpu(
        address=PF,
        sriov=sriov,
        model=model,
        vgpus={VF0: profile} if sriov else None,
        location=ENTRY,
        entry_locations={VF0: AT} if sriov else {},
        group=group,
    )
    return DesiredNode(NODE, (gpu,))


def refusal(want: DesiredNode, observed: HarvesterNode) -> str:
    with pytest.raises(PlanError) as caught:
        plan_delegate(want, observed, catalog=CATALOG)
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.column) == ("d.yaml", 9, 13)
    return problem.message


def test_a_time_sliced_profile_on_an_a100_is_refused_before_the_enable() -> None:
    # The PCIDevice says 10de:20f1: an A100 40GB, MIG-capable. Nothing is planned for it.
    message = refusal(desired("GRID A100-10C"), node(ids=A100_IDS))
    assert message.startswith(f"GPU {PF} on node {NODE}: GRID A100-10C is a time-sliced profile")
    assert "NVIDIA A100 40GB" in message
    assert "pcidevices-controller turns MIG mode on when it enables SR-IOV" in message
    assert "reconcileMIGConfiguration" in message
    assert "only MIG-backed vGPU types" in message


def test_the_desired_model_says_mig_capable_where_no_pcidevice_does() -> None:
    message = refusal(desired("GRID A100-10C", model="NVIDIA A100 40GB"), node(ids=None))
    assert "GRID A100-10C is a time-sliced profile" in message
    # No model, no PCIDevice: the profile's own model in the catalogue says it.
    message = refusal(desired("GRID A100-10C"), node(ids=None))
    assert "NVIDIA A100 40GB" in message


def test_a_mig_configuration_makes_a_gpu_of_unknown_model_mig_capable() -> None:
    # An A30 (not in the catalogue), no PCIDevice: only Harvester's MigConfiguration tells.
    message = refusal(desired("NVIDIA A30-6C"), node(ids=None, mig=True))
    assert "NVIDIA A30-6C is a time-sliced profile" in message
    assert f"Harvester has a MigConfiguration {GPU_NAME} for it" in message
    # Without one, nothing says MIG: planned as any GPU (the enable of its SR-IOV first).
    plan = plan_delegate(desired("NVIDIA A30-6C"), node(ids=None), catalog=CATALOG)
    assert type(plan.actions[0]) is SriovGpuDeviceEnable


def test_a_mig_configuration_wins_over_the_catalogue() -> None:
    # The ids name an A2, but pcidevices found the GPU MIG-capable: it is in MIG mode.
    message = refusal(desired("NVIDIA A2-4Q"), node(ids=A2_IDS, mig=True))
    assert "MigConfiguration" in message


def test_an_a2_is_planned_as_before() -> None:
    # The enable of its SR-IOV first (its VF's step may be planned ahead of it, item 3).
    plan = plan_delegate(desired("NVIDIA A2-4Q"), node(ids=A2_IDS), catalog=CATALOG)
    assert type(plan.actions[0]) is SriovGpuDeviceEnable


@pytest.mark.parametrize("ids", [A100_IDS, A2_IDS, None])
def test_a_mig_backed_profile_is_refused_on_any_gpu(ids: tuple[str, str] | None) -> None:
    message = refusal(desired("GRID A100-1-5C"), node(ids=ids))
    assert message.startswith(f"GPU {PF} on node {NODE}: GRID A100-1-5C is MIG-backed")
    assert "Harvester's MigConfiguration, which vgpuctl does not write" in message
    assert "configure MIG in Harvester's UI, or use node-local mode on a node where" in message


def test_sriov_disabled_on_an_a100_is_still_planned() -> None:
    plan = plan_delegate(
        desired("", sriov=False), node(ids=A100_IDS, mig=True, enabled=True), catalog=CATALOG
    )
    assert [type(a) for a in plan.actions] == [SriovGpuDeviceDisable]


def test_enabling_sriov_alone_on_an_a100_is_planned_with_a_note_that_mig_goes_on() -> None:
    # No profile asked, so nothing to refuse; but the enable changes the GPU's mode.
    want = DesiredNode(NODE, (DesiredGpu(address=PF, sriov=True, location=ENTRY),))
    plan = plan_delegate(want, node(ids=A100_IDS), catalog=CATALOG)
    assert [type(a) for a in plan.actions] == [SriovGpuDeviceEnable]
    (note,) = [n for n in plan.notes if "MIG mode on" in n]
    assert note.startswith(f"GPU {PF}: enabling its SR-IOV makes pcidevices-controller turn MIG")
    assert "NVIDIA A100 40GB" in note
    # An A2's enable says nothing of MIG.
    plan = plan_delegate(want, node(ids=A2_IDS), catalog=CATALOG)
    assert not [n for n in plan.notes if "MIG" in n]


def test_a_node_groups_entry_is_named() -> None:
    message = refusal(desired("GRID A100-10C", group="big"), node(ids=A100_IDS))
    assert message.startswith(f"GPU {PF} on node {NODE} (node group 'big'): GRID A100-10C")


def test_offline_the_desired_model_or_device_id_or_profile_names_decide() -> None:
    from reconciler.model import Desired, NodeGroup, NodeSelector

    by_model = desired("GRID A100-10C", model="NVIDIA A100 40GB")
    entry = GroupGpu(
        group="big",
        match=GpuMatch(device_id="20f1"),
        sriov=True,
        profiles={"GRID A100-20C": 2},
        location=ENTRY,
        entry_locations={"GRID A100-20C": AT},
    )
    a2 = DesiredNode("a2-node", (desired("NVIDIA A2-4Q", model="NVIDIA A2").gpus[0],))
    doc = Desired(
        name="lab",
        nodes={NODE: by_model, "a2-node": a2},
        groups=(NodeGroup("big", NodeSelector(names=("h-*",)), (entry,)),),
    )
    problems = offline_problems(doc, CATALOG)
    assert [p.message.split(": ")[0] for p in problems] == [
        f"GPU {PF} of node {NODE}",
        "GPU matching device ID 20f1 of node group 'big'",
    ]
    assert all("time-sliced" in p.message for p in problems)
