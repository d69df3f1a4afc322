"""What the planner does with GPUs and vGPUs it must not (or cannot) touch, and with the names
real drivers print. Expectations are written from docs/domain.md §1-4 and §9, not from the
planner."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.model import (
    VGPU,
    ActionKind,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    Noop,
    PciAddress,
    Plan,
    PlanError,
    SriovEnable,
    Vf,
    VgpuCreate,
    VgpuRemove,
    VGPUType,
)
from reconciler.plan import plan_node, vgpu_uuid
from tests.gpus import CATALOG, NODE, a2, card, want

A2 = PciAddress.parse("0000:08:00.0")
L4 = PciAddress.parse("0000:41:00.0")


def plan(*gpus: DesiredGpu, host: tuple[Gpu, ...]) -> Plan:
    return plan_node(DesiredNode(NODE, gpus), Inventory(NODE, host), catalog=CATALOG)


def kinds(p: Plan) -> list[tuple[str, str]]:
    return [(a.kind.value, a.target) for a in p.actions if a.kind.is_host]


# ---------------------------------------------------------------- hands off


def test_a_gpu_passed_through_whole_is_left_alone_with_one_blocked_entry() -> None:
    """Bound to vfio-pci: sriov-manage -e would unbind it from its VM (docs/domain.md §2)."""
    l4 = replace(card("L4", L4, enabled=False), driver="vfio-pci")
    p = plan(want(A2, {0: "A2-4Q"}), want(L4, {0: "L4-6Q"}), host=(a2(A2, enabled=False), l4))
    assert kinds(p) == [("sriov-enable", str(A2)), ("vgpu-create", "0000:08:00.4")]
    assert [(b.kind, b.target) for b in p.blocked] == [(ActionKind.SRIOV_ENABLE, str(L4))]
    assert p.blocked[0].reason == (
        "GPU 0000:41:00.0 is bound to vfio-pci, not nvidia: it is passed through whole to a VM, "
        "or reserved for one; vgpuctl never touches it (sriov-manage would unbind it)"
    )
    # The first change it would make, as planned: nothing of it runs.
    assert p.blocked[0].action == SriovEnable(
        target=str(L4), reason=p.blocked[0].reason, gpu=L4, num_vfs=32
    )
    assert not p.applyable


def test_a_gpu_passed_through_whole_and_desired_off_is_no_change() -> None:
    l4 = replace(card("L4", L4, enabled=False), driver="vfio-pci")
    p = plan(want(L4, sriov=False), host=(l4,))
    assert not p.has_changes
    assert p.noops == (
        Noop(
            str(L4),
            "left alone as desired: GPU 0000:41:00.0 is bound to vfio-pci, not nvidia: it is "
            "passed through whole to a VM, or reserved for one; vgpuctl never touches it "
            "(sriov-manage would unbind it)",
        ),
    )


def test_a_gpu_without_vgpu_vfs_is_blocked_not_an_error() -> None:
    """sriov_vf_device 0 (SR-IOV present, no vGPU VFs): blocked, applyable false, no error."""
    t4 = replace(a2(A2, enabled=False), vf_device="0000")
    p = plan(want(A2, {0: "A2-4Q"}), host=(t4,))
    assert p.actions == ()
    assert [(b.kind, b.target) for b in p.blocked] == [(ActionKind.SRIOV_ENABLE, str(A2))]
    assert "sriov_vf_device is 0: it makes no vGPU VFs" in p.blocked[0].reason
    assert not p.applyable


# ---------------------------------------------------------------- not drivable


def _vfio_a2(vgpus: dict[int, str]) -> Gpu:
    """An A2 on NVIDIA's vendor-specific VFIO interface: the VF is the vGPU's identity."""
    gpu = a2(A2)
    vfs = tuple(
        replace(vf, vgpu=VGPU(str(vf.address), vgpus[vf.index]) if vf.index in vgpus else None)
        for vf in gpu.vfs
    )
    types = tuple(replace(t, type_id=str(742 + i)) for i, t in enumerate(gpu.types))
    return replace(gpu, interface=Interface.VFIO, vfs=vfs, types=types)


def test_a_vfio_gpu_matching_its_desired_state_needs_nothing() -> None:
    p = plan(want(A2, {0: "A2-4Q"}), host=(_vfio_a2({0: "NVIDIA A2-4Q"}),))
    assert not p.has_changes


def test_a_vfio_gpu_is_driven_and_its_vgpus_are_named_by_their_vf() -> None:
    """On the vfio interface the VF is the vGPU (docs/domain.md §3b): a create and a remove name
    it by the VF's address, never by an invented UUID."""
    p = plan(want(A2, {1: "A2-4Q"}), host=(_vfio_a2({0: "NVIDIA A2-4Q"}),))
    assert p.blocked == ()
    steps = [a for a in p.actions if isinstance(a, VgpuCreate | VgpuRemove)]
    assert [(a.kind, a.target, a.uuid) for a in steps] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.4", "0000:08:00.4"),
        (ActionKind.VGPU_CREATE, "0000:08:00.5", "0000:08:00.5"),
    ]
    assert p.interface == "vfio"
    assert p.applyable


def test_a_profile_change_on_a_vfio_vf_keeps_the_vf_as_its_name() -> None:
    p = plan(want(A2, {0: "A2-8Q"}), host=(_vfio_a2({0: "NVIDIA A2-4Q"}),))
    (remove, create) = [a for a in p.actions if a.kind.is_host]
    assert isinstance(remove, VgpuRemove)
    assert isinstance(create, VgpuCreate)
    assert (remove.target, remove.uuid, remove.replaced_by) == (
        "0000:08:00.4",
        "0000:08:00.4",
        "NVIDIA A2-8Q",
    )
    assert (create.target, create.uuid, create.replaces) == (
        "0000:08:00.4",
        "0000:08:00.4",
        "NVIDIA A2-4Q",
    )


def test_a_vfio_type_nobody_can_name_blocks_every_change_of_its_gpu() -> None:
    """VF 2 has a type whose id no list and no record names: its size is unknown, so neither
    it nor anything the equal-size rule ties to it is touched."""
    host = _vfio_a2({0: "NVIDIA A2-4Q", 2: "type 1147"})
    p = plan(want(A2, {0: "A2-4Q", 1: "A2-4Q"}), host=(host,))
    assert [a for a in p.actions if a.kind.is_host] == []
    assert [(b.kind, b.target) for b in p.blocked] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.6"),
        (ActionKind.VGPU_CREATE, "0000:08:00.5"),
    ]
    for b in p.blocked:
        assert b.reason.startswith(
            "GPU 0000:08:00.0: VF 0000:08:00.6 has vGPU type 1147, which no VF's "
            "nvidia/creatable_vgpu_types lists any more, vgpuctl has no record of, and the "
            "driver did not name (nvidia-smi vgpu -s -v: see the notes)"
        )
        assert "'nvidia-smi vgpu -q' shows each vGPU's type name" in b.reason
    assert not p.applyable
    # Wanting A2-4Q there is no better: type 1147 may be anything, so it is never taken for
    # the desired profile, nor replaced blindly.
    p = plan(want(A2, {0: "A2-4Q", 2: "A2-4Q"}), host=(host,))
    assert [a for a in p.actions if a.kind.is_host] == []
    assert [(b.kind, b.target) for b in p.blocked] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.6"),
        (ActionKind.VGPU_CREATE, "0000:08:00.6"),
    ]


def test_vfs_with_no_interface_block_the_gpus_changes() -> None:
    gpu = replace(a2(A2), interface=Interface.NONE, types=())
    p = plan(want(A2, {0: "A2-4Q"}), host=(gpu,))
    assert p.actions == ()
    assert len(p.blocked) == 1
    assert "its VFs expose no vGPU interface" in p.blocked[0].reason


# ---------------------------------------------------------------- holders vgpuctl cannot see


def test_a_vgpu_counted_in_use_because_the_probe_is_blind_is_not_removed() -> None:
    blind = "unknown: cannot see the host's processes (vgpuctl runs in PID namespace 9)"
    gpu = a2(A2, {0: "A2-4Q"}, in_use={0: blind})
    p = plan(want(A2, {0: "A2-4A"}), host=(gpu,))
    assert kinds(p) == []
    remove, create = p.blocked
    assert (remove.kind, remove.target) == (ActionKind.VGPU_REMOVE, "0000:08:00.4")
    assert remove.reason == (
        "VF 0000:08:00.4 hosts NVIDIA A2-4Q, counted as in use: cannot see the host's "
        "processes (vgpuctl runs in PID namespace 9); desired NVIDIA A2-4A"
    )
    assert create.reason == "waits for NVIDIA A2-4Q on 0000:08:00.4 (in use) to be removed"


def test_a_removal_under_way_blocks_its_vf() -> None:
    gpu = a2(A2)
    removing = VGPU(
        "5adb8e42-c29a-5705-8ae0-584ba08668af", "unknown", True, "unknown: x", "7", True
    )
    vfs = tuple(replace(vf, vgpu=removing) if vf.index == 0 else vf for vf in gpu.vfs)
    host = replace(gpu, vfs=vfs)
    for desired in (want(A2, {}), want(A2, {0: "A2-4Q"})):
        p = plan(desired, host=(host,))
        assert kinds(p) == []
        assert p.blocked[0].reason.startswith(
            "VF 0000:08:00.4 has vGPU 5adb8e42-c29a-5705-8ae0-584ba08668af being removed"
        )
    p = plan(want(A2, {0: "A2-4Q"}), host=(host,))
    assert p.blocked[1].reason == (
        "waits for vGPU 5adb8e42-c29a-5705-8ae0-584ba08668af on 0000:08:00.4 (a removal under "
        "way) to be removed"
    )


# ---------------------------------------------------------------- names as drivers print them


def test_a_name_takes_the_hosts_prefix() -> None:
    """An A100's driver prints GRID A100-4C; a desired NVIDIA A100-4C is that profile."""
    a100 = card("A100", A2)
    assert a100.type_named("GRID A100-4C") is not None
    desired = DesiredGpu(A2, True, vgpus={0: "NVIDIA A100-4C"})
    p = plan(desired, host=(a100,))
    create = next(a for a in p.actions if a.kind is ActionKind.VGPU_CREATE)
    assert isinstance(create, VgpuCreate)
    assert create.type_name == "GRID A100-4C"


def test_a_gpu_and_profile_no_catalogue_knows_work_from_what_the_host_offers() -> None:
    """An RTX 5880 Ada (not in the catalogue): sizes and maxima from its driver's list."""
    name = "NVIDIA RTX 5880 Ada-48C"
    address = PciAddress.parse("0000:17:00.0")
    vfs = tuple(Vf(PciAddress.parse(f"0000:17:00.{4 + i}"), i) for i in range(4))
    gpu = Gpu(
        address,
        "10de",
        "26b2",
        interface=Interface.MDEV,
        total_vfs=4,
        num_vfs=4,
        vf_offset=4,
        vfs=vfs,
        types=(VGPUType(name, "nvidia-1", 49152, 1),),
        driver="nvidia",
    )
    p = plan(DesiredGpu(address, True, vgpus={0: name}), host=(gpu,))
    assert kinds(p) == [("vgpu-create", "0000:17:00.4")]
    create = p.actions[0]
    assert isinstance(create, VgpuCreate)
    assert create.uuid == vgpu_uuid(NODE, "0000:17:00.4")
    # Its maximum is the driver's: a second 48 GB vGPU is refused, naming it.
    two = DesiredGpu(address, True, vgpus={0: name, 1: name})
    with pytest.raises(PlanError) as caught:
        plan(two, host=(gpu,))
    assert (
        "2 vGPUs of 48 GB on GPU 0000:17:00.0, but 'NVIDIA RTX 5880 Ada-48C' allows at most 1 "
        "per GPU"
    ) in caught.value.lines()[0]
