"""Delegate mode's planner (``plan/delegate.py``; docs/delegate.md): a node seen through
Harvester's objects → the spec writes pcidevices-controller acts on. Expected steps written by
hand from docs/domain.md §4–6: object names are ``<node>-<address without ':' and '.'>``, an A2's
VF 0 is function 4, a profile change is a disable then an enable of the same object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from reconciler.model import (
    DesiredGpu,
    DesiredNode,
    PciAddress,
    Plan,
    PlanError,
    VgpuDeviceDisable,
    VgpuDeviceEnable,
    VgpuMode,
)
from reconciler.model.harvester import HarvesterGpu, HarvesterNode, HarvesterVf
from reconciler.model.plan_json import plan_from_json, plan_to_json
from reconciler.plan.delegate import plan_delegate, waits_for_controller
from tests.gpus import A2, CATALOG, want

NODE = "harvester-kgd9c"
#: What pcidevices lists on a free A2 VF (names → mdev type keys), a few of them.
A2_TYPES = {
    "NVIDIA A2-1Q": "nvidia-742",
    "NVIDIA A2-2Q": "nvidia-743",
    "NVIDIA A2-4Q": "nvidia-744",
    "NVIDIA A2-8Q": "nvidia-745",
    "NVIDIA A2-16Q": "nvidia-746",
}


def vf_address(index: int) -> PciAddress:
    return PciAddress.parse(f"0000:08:{(4 + index) // 8:02x}.{(4 + index) % 8}")


def name(address: PciAddress) -> str:
    return f"{NODE}-{str(address).replace(':', '').replace('.', '')}"


def harvester(
    *,
    enabled: bool = True,
    vgpus: Mapping[int, str] | None = None,
    used: Mapping[int, str] | None = None,
    vfs: int = 16,
) -> HarvesterNode:
    """An A2 as pcidevices shows it: ``vgpus`` VF index → the profile it hosts."""
    vgpus = vgpus or {}
    hosts = set(vgpus.values())
    size = {n: int(n.split("-")[-1][:-1]) for n in A2_TYPES}
    left = {n: k for n, k in A2_TYPES.items() if not hosts or size[n] in {size[h] for h in hosts}}
    objects = []
    for i in range(vfs if enabled else 0):
        profile = vgpus.get(i)
        objects.append(
            HarvesterVf(
                name=name(vf_address(i)),
                resource_version=str(100 + i),
                address=vf_address(i),
                parent=A2,
                enabled=profile is not None,
                type_name=profile or "",
                configured=profile is not None,
                configured_type=profile or "",
                uuid=A2_TYPES[profile] if profile else "",
                available={} if profile else left,
            )
        )
    gpu = HarvesterGpu(
        name=name(A2),
        resource_version="7",
        address=A2,
        enabled=enabled,
        vf_addresses=tuple(v.address for v in objects),
        vgpu_devices=tuple(v.name for v in objects),
    )
    return HarvesterNode(
        NODE,
        (gpu,),
        tuple(objects),
        used_by={name(vf_address(i)): who for i, who in (used or {}).items()},
    )


def plan(*gpus: DesiredGpu, observed: HarvesterNode) -> Plan:
    return plan_delegate(DesiredNode(NODE, gpus), observed, catalog=CATALOG)


def steps(p: Plan) -> list[tuple[str, str, str]]:
    out = []
    for a in p.actions:
        detail = a.type_name if isinstance(a, VgpuDeviceEnable | VgpuDeviceDisable) else ""
        out.append((a.kind.value, a.target, detail))
    return out


def ahead(p: Plan) -> list[tuple[str, str, int, str, str]]:
    """Each VF step: its object, VF, index, profile, and resourceVersion (planned ahead: "")."""
    return [
        (a.target, str(a.vf), a.vf_index, a.type_name, a.resource_version)
        for a in p.actions
        if isinstance(a, VgpuDeviceEnable) and not a.object_exists
    ]


def test_a_disabled_gpu_is_enabled_first_then_its_vfs_planned_ahead() -> None:
    # The A2's VF i appears at function 4 + i (its SR-IOV VF offset 4, stride 1), and
    # pcidevices names its VGPUDevice <node>-<address without ':' and '.'>: the count form
    # fills VFs 0 and 1, as it will once the objects exist.
    p = plan(want(profiles={"A2-4Q": 2}), observed=harvester(enabled=False))
    assert steps(p) == [
        ("sriovgpudevice-enable", f"{NODE}-000008000", ""),
        ("vgpudevice-enable", f"{NODE}-000008004", "NVIDIA A2-4Q"),
        ("vgpudevice-enable", f"{NODE}-000008005", "NVIDIA A2-4Q"),
    ]
    assert ahead(p) == [
        (f"{NODE}-000008004", "0000:08:00.4", 0, "NVIDIA A2-4Q", ""),
        (f"{NODE}-000008005", "0000:08:00.5", 1, "NVIDIA A2-4Q", ""),
    ]
    assert p.interface == "harvester"
    assert not any("planned once" in n for n in p.notes)
    assert p.summary.create == 3
    # Saved and read back (plan -o json, a saved plan), the steps keep their mark.
    assert plan_from_json(plan_to_json(p)) == p


def test_the_vgpus_form_is_planned_ahead_by_index_and_by_address() -> None:
    # VF 9 is 0x800 + 4 + 9 = 0x80d: 0000:08:01.5.
    p = plan(
        want(vgpus={9: "A2-4A", PciAddress.parse("0000:08:00.6"): "A2-4Q"}),
        observed=harvester(enabled=False),
    )
    assert ahead(p) == [
        (f"{NODE}-000008006", "0000:08:00.6", 2, "NVIDIA A2-4Q", ""),
        (f"{NODE}-000008015", "0000:08:01.5", 9, "NVIDIA A2-4A", ""),
    ]


def test_a_gpu_planned_ahead_is_refused_as_it_would_be_once_its_objects_exist() -> None:
    # Three 8 GB vGPUs on a 16 GB A2: refused before the enable is written, not after.
    with pytest.raises(PlanError) as info:
        plan(want(profiles={"A2-8Q": 3}, line=4), observed=harvester(enabled=False))
    assert "d.yaml:4:11:" in info.value.lines()[0]
    assert "allows at most 2 per NVIDIA A2" in info.value.lines()[0]


@pytest.mark.parametrize(
    ("desired", "ids", "why"),
    [
        # The A16's VF offset was never seen on a real host (catalogue vfOffset absent).
        ({"A16-4Q": 2}, None, "the catalogue does not know where NVIDIA A16's VFs appear"),
        ({"A2-4Q": 2}, ("10de", "2236"), "the desired profiles are NVIDIA A2's, but its PCIDevice"),
    ],
)
def test_vfs_that_cannot_be_predicted_wait_for_their_objects_and_the_note_says_why(
    desired: dict[str, int], ids: tuple[str, str] | None, why: str
) -> None:
    observed = replace(harvester(enabled=False), pci_ids={A2: ids} if ids else {})
    p = plan(want(profiles=desired), observed=observed)
    assert steps(p) == [("sriovgpudevice-enable", f"{NODE}-000008000", "")]
    (note,) = [n for n in p.notes if "planned once" in n]
    assert note.startswith(
        "GPU 0000:08:00.0: its VFs are planned once pcidevices-controller has made their "
        "VGPUDevice objects (after the enable, within a node resync: about 30 s): "
    )
    assert why in note


def test_a_gpu_whose_objects_are_not_made_yet_waits_and_is_not_converged() -> None:
    # SR-IOV on, but pcidevices-controller makes the VGPUDevices at its next node resync:
    # nothing to write, yet not there: a blocked wait (assert says drifted; apply waits).
    observed = replace(harvester(), vfs=())
    p = plan(want(profiles={"A2-4Q": 2}), observed=observed)
    assert p.actions == ()
    assert [(b.kind.value, b.target) for b in p.blocked] == [
        ("sriovgpudevice-enable", f"{NODE}-000008000")
    ]
    assert waits_for_controller(p) and p.has_changes
    # Nothing desired on its VFs: nothing to wait for.
    assert not plan(want(), observed=observed).has_changes


def test_profiles_are_enabled_on_the_first_free_vfs() -> None:
    p = plan(want(profiles={"A2-4Q": 2}), observed=harvester())
    assert steps(p) == [
        ("vgpudevice-enable", f"{NODE}-000008004", "NVIDIA A2-4Q"),
        ("vgpudevice-enable", f"{NODE}-000008005", "NVIDIA A2-4Q"),
    ]
    first = p.actions[0]
    assert isinstance(first, VgpuDeviceEnable)
    assert (first.resource_version, first.vf_index, str(first.vf)) == ("100", 0, "0000:08:00.4")
    # The JSON form is the contract: it reads back to the same plan.
    assert plan_from_json(plan_to_json(p)) == p


def test_a_profile_change_is_a_disable_then_an_enable_of_the_same_object() -> None:
    p = plan(want(vgpus={0: "A2-2Q"}), observed=harvester(vgpus={0: "NVIDIA A2-4Q"}))
    assert steps(p) == [
        ("vgpudevice-disable", f"{NODE}-000008004", "NVIDIA A2-4Q"),
        ("vgpudevice-enable", f"{NODE}-000008004", "NVIDIA A2-2Q"),
    ]
    disable, enable = p.actions
    assert isinstance(disable, VgpuDeviceDisable) and disable.replaced_by == "NVIDIA A2-2Q"
    assert isinstance(enable, VgpuDeviceEnable) and enable.replaces == "NVIDIA A2-4Q"
    assert (p.summary.create, p.summary.change, p.summary.remove) == (0, 1, 0)


def test_a_vf_a_vm_uses_is_never_disabled() -> None:
    observed = harvester(vgpus={0: "NVIDIA A2-4Q"}, used={0: "VM default/win11"})
    p = plan(want(vgpus={0: "A2-2Q"}), observed=observed)
    assert p.actions == ()
    assert [(b.kind.value, b.target) for b in p.blocked] == [
        ("vgpudevice-disable", f"{NODE}-000008004"),
        ("vgpudevice-enable", f"{NODE}-000008004"),
    ]
    assert "in use by VM default/win11" in p.blocked[0].reason


def test_sriov_off_disables_the_vfs_then_the_gpu() -> None:
    p = plan(want(sriov=False), observed=harvester(vgpus={1: "NVIDIA A2-4Q"}))
    assert steps(p) == [
        ("vgpudevice-disable", f"{NODE}-000008005", "NVIDIA A2-4Q"),
        ("sriovgpudevice-disable", f"{NODE}-000008000", ""),
    ]
    assert plan(want(sriov=False), observed=harvester(enabled=False)).actions == ()


def test_a_converged_node_needs_nothing() -> None:
    observed = harvester(vgpus={0: "NVIDIA A2-4Q", 1: "NVIDIA A2-4Q"})
    p = plan(want(profiles={"A2-4Q": 2}), observed=observed)
    assert p.actions == () and p.blocked == () and not p.has_changes


@pytest.mark.parametrize(
    ("gpu", "observed", "message"),
    [
        (
            want(vgpus={0: "A2-4Q", 1: "A2-2Q"}, line=9),
            harvester(),
            "d.yaml:9:11: mixed framebuffer sizes on GPU 0000:08:00.0",  # as node-local says
        ),
        (
            want(PciAddress.parse("0000:09:00.0"), profiles={"A2-4Q": 1}, line=3),
            harvester(),
            "has no SRIOVGPUDevice on node harvester-kgd9c",
        ),
        (
            replace(want(profiles={"A2-4Q": 1}, line=5), mode=VgpuMode.MIXED_SIZE),
            harvester(),
            "mode: mixed-size is not made through pcidevices-controller",
        ),
    ],
)
def test_what_cannot_be_reached_is_refused_before_anything_is_written(
    gpu: DesiredGpu, observed: HarvesterNode, message: str
) -> None:
    with pytest.raises(PlanError) as caught:
        plan(gpu, observed=observed)
    assert any(message in line for line in caught.value.lines()), caught.value.lines()


@pytest.mark.parametrize(
    ("model", "ids", "outcome"),
    [
        ("NVIDIA A2", ("10de", "25b6"), ""),
        ("NVIDIA A16", ("10de", "25b6"), ""),  # A2 and A16 share 25b6; no subsystem id here
        ("NVIDIA A10", ("10de", "25b6"), "is NVIDIA A16 or NVIDIA A2 (PCIDevice 10de:25b6)"),
        ("NVIDIA A2", None, "desired model NVIDIA A2 not checked: no PCIDevice object"),
    ],
)
def test_a_desired_model_is_checked_against_the_pcidevice(
    model: str, ids: tuple[str, str] | None, outcome: str
) -> None:
    short = model.removeprefix("NVIDIA ")
    gpu = replace(want(profiles={f"{short}-4Q": 1}, line=4), model=model)
    observed = replace(harvester(), pci_ids={A2: ids} if ids else {})
    if outcome.startswith("is "):
        with pytest.raises(PlanError) as caught:
            plan(gpu, observed=observed)
        assert caught.value.lines() == [
            f"d.yaml:4:11: GPU 0000:08:00.0 {outcome}, not the desired {model}"
        ]
        return
    p = plan(gpu, observed=observed)
    assert [n for n in p.notes if "model" in n] == (
        [f"GPU 0000:08:00.0: {outcome} of it on node {NODE}"] if outcome else []
    )


def test_an_unreadable_object_blocks_every_write_of_the_node() -> None:
    observed = replace(harvester(), notes=("VGPUDevice x: spec.address is not a PCI address",))
    p = plan(want(profiles={"A2-4Q": 1}), observed=observed)
    assert p.actions == ()
    assert [b.kind.value for b in p.blocked] == ["vgpudevice-enable"]
    assert "could not be read" in p.blocked[0].reason


def _with_status(observed: HarvesterNode, index: int, **status: object) -> HarvesterNode:
    """``observed`` with VF ``index``'s object changed (its status as the controller left it)."""
    vfs = tuple(
        replace(v, **status) if v.address == vf_address(index) else v  # type: ignore[arg-type]
        for v in observed.vfs
    )
    return replace(observed, vfs=vfs)


# Issue 30, item 1: status is the truth. pcidevices' enableVGPU (vgpu_controller.go) writes
# vGPUStatus, uuid and configureVGPUTypeName in one UpdateStatus once the vGPU is made; when it
# fails after the webhook admitted the spec, the spec stays enabled: true with no status.


@pytest.mark.parametrize(
    "status",
    [
        # The enable failed after admission (or has not run yet): no status at all.
        {"configured": False, "configured_type": "", "uuid": ""},
        # After a reboot reconcileVGPUSetup clears vGPUStatus and uuid, keeps the type name.
        {"configured": False, "uuid": ""},
        # No uuid: not what enableVGPU writes.
        {"uuid": ""},
    ],
)
def test_an_enabled_spec_the_status_does_not_show_is_a_pending_step(
    status: dict[str, object],
) -> None:
    observed = _with_status(harvester(vgpus={0: "NVIDIA A2-4Q"}), 0, **status)
    p = plan(want(vgpus={0: "A2-4Q"}), observed=observed)
    assert steps(p) == [("vgpudevice-enable", f"{NODE}-000008004", "NVIDIA A2-4Q")]
    (step,) = p.actions
    assert isinstance(step, VgpuDeviceEnable) and step.pending
    assert step.reason.startswith("pending: pcidevices-controller has not carried out the spec")
    assert p.has_changes  # not converged: assert exits 2
    assert plan_from_json(plan_to_json(p)) == p
    # The count form keeps the VF too: the pending VF is not traded for another.
    p = plan(want(profiles={"A2-4Q": 1}), observed=observed)
    assert steps(p) == [("vgpudevice-enable", f"{NODE}-000008004", "NVIDIA A2-4Q")]


def test_a_type_change_the_controller_ignores_is_pending_and_says_so() -> None:
    # The spec says 4Q, the VF hosts 2Q: enableVGPU never runs on a configured VF.
    observed = _with_status(
        harvester(vgpus={0: "NVIDIA A2-4Q"}), 0, configured_type="NVIDIA A2-2Q", uuid="nvidia-743"
    )
    (step,) = plan(want(vgpus={0: "A2-4Q"}), observed=observed).actions
    assert isinstance(step, VgpuDeviceEnable) and step.pending
    assert "it hosts NVIDIA A2-2Q: pcidevices-controller ignores a type change" in step.reason


def test_a_disabled_spec_whose_vgpu_is_still_there_is_a_pending_disable() -> None:
    observed = _with_status(harvester(vgpus={0: "NVIDIA A2-4Q"}), 0, enabled=False)
    p = plan(want(vgpus={}), observed=observed)
    (step,) = p.actions
    assert isinstance(step, VgpuDeviceDisable) and step.pending
    assert (step.target, step.type_name) == (f"{NODE}-000008004", "NVIDIA A2-4Q")
