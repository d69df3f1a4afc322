"""predict_inventory: the host after the host actions, by the driver's rules; and, on the
simulator, exactly what observing the host after a real apply gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import (
    ConfinedSysfsWriter,
    Journal,
    MdevDriver,
    PerVfDriver,
    SubprocessRunner,
    VfioDriver,
    execute,
)
from reconciler.apply.sysfs import SysfsReader
from reconciler.catalog import default_catalog
from reconciler.model import (
    VGPU,
    Action,
    CrCreate,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    PciAddress,
    SriovDisable,
    SriovEnable,
    Vf,
    VgpuCreate,
    VgpuRemove,
    VGPUType,
)
from reconciler.model.cluster import ClusterState
from reconciler.observe import observe_host
from reconciler.plan import plan_node
from reconciler.plan.predict import predict_inventory
from reconciler.plan.render import render_objects
from reconciler.sim import build_host

CATALOG = default_catalog()
NODE = "harvester-kgd9c"
A2 = PciAddress.parse("0000:08:00.0")
ALL_A2 = {p.name for p in CATALOG.model("A2").time_sliced_profiles}  # type: ignore[union-attr]
FOUR_GB = {"NVIDIA A2-4A", "NVIDIA A2-4Q", "NVIDIA A2-4C"}


def _a2_off() -> Gpu:
    return Gpu(
        A2,
        "10de",
        "25b6",
        "10de",
        "157e",
        model="NVIDIA A2",
        total_vfs=16,
        vf_offset=4,
        driver="nvidia",
    )


def _enable() -> Action:
    return SriovEnable(seq=1, target=str(A2), reason="test", gpu=A2, num_vfs=16)


def _create(index: int, profile: str) -> Action:
    address = str(_a2_off().predicted_vf_address(index))
    return VgpuCreate(
        seq=1, target=address, reason="test", gpu=A2, vf_index=index, type_name=profile,
        uuid=f"u{index}",
    )  # fmt: skip


def _creatable(inventory: Inventory) -> dict[int, frozenset[str]]:
    gpu = inventory.gpu(A2)
    assert gpu is not None
    return {vf.index: vf.creatable for vf in gpu.vfs}


def test_enabling_makes_the_vfs_where_the_kernel_puts_them_with_the_catalogues_types() -> None:
    after = predict_inventory(Inventory(NODE, (_a2_off(),)), [_enable()], catalog=CATALOG)
    gpu = after.gpu(A2)
    assert gpu is not None
    assert gpu.num_vfs == 16 and gpu.interface is Interface.MDEV
    assert [str(vf.address) for vf in gpu.vfs][:5] == [
        "0000:08:00.4",
        "0000:08:00.5",
        "0000:08:00.6",
        "0000:08:00.7",
        "0000:08:01.0",
    ]
    assert {t.name for t in gpu.types} == ALL_A2
    a2_4q = gpu.type_named("NVIDIA A2-4Q")
    assert a2_4q is not None and (a2_4q.framebuffer_mib, a2_4q.max_instance) == (4096, 4)
    assert set(_creatable(after).values()) == {frozenset(ALL_A2)}


def test_the_first_vgpu_narrows_every_other_vf_to_its_size() -> None:
    after = predict_inventory(
        Inventory(NODE, (_a2_off(),)), [_enable(), _create(0, "NVIDIA A2-4Q")], catalog=CATALOG
    )
    creatable = _creatable(after)
    assert creatable[0] == frozenset()  # it hosts one now
    assert all(creatable[i] == FOUR_GB for i in range(1, 16))
    gpu = after.gpu(A2)
    assert gpu is not None and gpu.vfs[0].vgpu == VGPU("u0", "NVIDIA A2-4Q")


def test_at_the_sizes_maximum_nothing_more_is_creatable_and_a_removal_reopens_it() -> None:
    steps = [_enable(), *(_create(i, "NVIDIA A2-4A") for i in range(4))]
    full = predict_inventory(Inventory(NODE, (_a2_off(),)), steps, catalog=CATALOG)
    assert set(_creatable(full).values()) == {frozenset()}
    gpu = full.gpu(A2)
    assert gpu is not None
    remove = VgpuRemove(
        seq=1, target=str(gpu.vfs[2].address), reason="test", gpu=A2, vf_index=2,
        type_name="NVIDIA A2-4A", uuid="u2",
    )  # fmt: skip
    freed = predict_inventory(full, [remove], catalog=CATALOG)
    creatable = _creatable(freed)
    assert creatable[2] == FOUR_GB and creatable[4] == FOUR_GB and creatable[0] == frozenset()


def test_a_prediction_of_vgpus_only_has_them_and_leaves_creatable_as_observed() -> None:
    # What the planner asks for when no cluster reads the rest (the device plugins' refresh).
    steps = [_enable(), *(_create(i, "NVIDIA A2-4A") for i in range(4))]
    full = predict_inventory(Inventory(NODE, (_a2_off(),)), steps, catalog=CATALOG)
    gpu = full.gpu(A2)
    assert gpu is not None
    remove = VgpuRemove(
        seq=1, target=str(gpu.vfs[2].address), reason="test", gpu=A2, vf_index=2,
        type_name="NVIDIA A2-4A", uuid="u2",
    )  # fmt: skip
    after = predict_inventory(
        full, [remove, _create(5, "NVIDIA A2-4A")], catalog=CATALOG, vgpus_only=True
    )
    hosts = {i: VGPU(f"u{i}", "NVIDIA A2-4A") for i in (0, 1, 3, 5)}
    gpu_after = after.gpu(A2)
    assert gpu_after is not None
    assert [vf.vgpu for vf in gpu_after.vfs] == [hosts.get(i) for i in range(16)]
    assert [vf.address for vf in gpu_after.vfs] == [vf.address for vf in gpu.vfs]
    assert _creatable(after) == _creatable(full)  # not recounted: VF 2 still shows none


def test_disabling_takes_the_vfs_and_types_away() -> None:
    on = predict_inventory(Inventory(NODE, (_a2_off(),)), [_enable()], catalog=CATALOG)
    disable = SriovDisable(seq=1, target=str(A2), reason="test", gpu=A2)
    off = predict_inventory(on, [disable], catalog=CATALOG)
    assert off.gpu(A2) == _a2_off()


def test_gpus_no_action_touches_keep_what_was_observed() -> None:
    # Observed creatable sets are the driver's word, even where the rules would say otherwise.
    other = replace(_a2_off(), address=PciAddress.parse("0000:09:00.0"))
    inventory = Inventory(NODE, (_a2_off(), other))
    assert predict_inventory(inventory, [], catalog=CATALOG) is inventory
    after = predict_inventory(inventory, [_enable()], catalog=CATALOG)
    assert after.gpus[1] is other


def test_the_predicted_vgpu_is_named_as_the_action_names_it_the_vf_address_on_vfio() -> None:
    """The planner names a vGPU on the vfio interface by its VF's address (diff.py): the host
    predicted after the create shows it under that name, as the observer will."""
    vfio_gpu = replace(
        _a2_off(),
        address=PciAddress.parse("0000:09:00.0"),
        interface=Interface.VFIO,
        num_vfs=16,
        vfs=(Vf(PciAddress.parse("0000:09:00.4"), 0),),
    )
    inventory = Inventory(NODE, (_a2_off(), vfio_gpu))
    create = VgpuCreate(
        seq=2,
        target="0000:09:00.4",
        reason="test",
        gpu=PciAddress.parse("0000:09:00.0"),
        vf_index=0,
        type_name="NVIDIA A2-4Q",
        uuid="0000:09:00.4",
    )
    after = predict_inventory(inventory, [_enable(), create], catalog=CATALOG)
    a2, vfio_after = after.gpus
    assert a2.interface is Interface.VFIO  # one driver per node
    assert vfio_after.vfs[0].vgpu == VGPU("0000:09:00.4", "NVIDIA A2-4Q")


def test_type_ids_are_not_invented_before_the_driver_shows_them() -> None:
    """Type ids belong to the driver branch (docs/domain.md §4): a GPU whose SR-IOV is still off
    gets the catalogue's types with no id, unless a sibling of the same model on this node
    shows them already (one driver serves the node, so the ids are the same)."""
    after = predict_inventory(Inventory(NODE, (_a2_off(),)), [_enable()], catalog=CATALOG)
    assert {t.type_id for t in after.gpus[0].types} == {""}
    sibling = replace(
        _a2_off(),
        address=PciAddress.parse("0000:09:00.0"),
        interface=Interface.MDEV,
        num_vfs=16,
        vfs=(Vf(PciAddress.parse("0000:09:00.4"), 0),),
        types=(VGPUType("NVIDIA A2-4Q", "nvidia-746", 4096, 4),),
    )
    after = predict_inventory(Inventory(NODE, (_a2_off(), sibling)), [_enable()], catalog=CATALOG)
    assert after.gpus[0].types == (VGPUType("NVIDIA A2-4Q", "nvidia-746", 4096, 4),)


# What a real apply on the simulator leaves, observed again, renders exactly as predicted.
SCENARIOS: dict[str, tuple[dict[str, Any], DesiredGpu]] = {
    "seed from SR-IOV off": (
        {"model": "A2", "address": "0000:08:00.0", "sriov": "disabled"},
        DesiredGpu(A2, True, vgpus={0: "NVIDIA A2-4A", 1: "NVIDIA A2-4Q", 2: "NVIDIA A2-4A"}),
    ),
    "one 2 GB vGPU among 16 VFs": (
        {"model": "A2", "address": "0000:08:00.0", "vgpus": {0: "NVIDIA A2-4Q"}},
        DesiredGpu(A2, True, vgpus={5: "NVIDIA A2-2B"}),
    ),
    "count form from SR-IOV off": (
        {"model": "L40S", "address": "0000:08:00.0", "sriov": "disabled"},
        DesiredGpu(A2, True, profiles={"NVIDIA L40S-8Q": 4}),
    ),
    "SR-IOV disabled": (
        {"model": "A2", "address": "0000:08:00.0", "vgpus": {3: "NVIDIA A2-8Q"}},
        DesiredGpu(A2, False),
    ),
}


def _statuses(objects: list[Any]) -> dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return {o.name: (dict(o.spec), dict(o.status)) for o in objects}


@pytest.mark.parametrize("interface", ["mdev", "vfio"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_prediction_matches_the_simulated_host_after_apply(
    name: str, interface: str, tmp_path: Path
) -> None:
    host_gpu, desired_gpu = SCENARIOS[name]
    host_dir = tmp_path / "host"
    spec = {"gpus": [host_gpu], "extraDevices": False, "interface": interface}
    sim = build_host(host_dir, spec, catalog=CATALOG)
    root = host_dir / "sys"
    node = DesiredNode(NODE, (desired_gpu,))
    before = observe_host(root, node=NODE, catalog=CATALOG, hold_probe=sim.hold_probe())
    plan = plan_node(node, before, catalog=CATALOG, cluster=ClusterState(NODE))
    host_actions = tuple(a for a in plan.actions if a.kind.is_host)
    creates = [a.object for a in plan.actions if isinstance(a, CrCreate)]
    predicted_objects = [o.to_json() for o in creates if o.kind != "VGPUNodeState"]
    (node_state,) = [o for o in creates if o.kind == "VGPUNodeState"]
    writer = ConfinedSysfsWriter(root, kernel=sim.writer())
    argv = [str(host_dir / "bin" / "sriov-manage")]
    runner = SubprocessRunner()
    driver = PerVfDriver(
        mdev=MdevDriver(
            sysfs_root=root, writer=writer, runner=runner, sriov_manage=argv, command_timeout=60
        ),
        vfio=VfioDriver(
            sysfs_root=root, writer=writer, runner=runner, sriov_manage=argv, command_timeout=60
        ),
        reader=SysfsReader(root),
    )
    result = execute(
        replace(plan, actions=host_actions),
        driver=driver,
        journal=Journal(host_dir / "state", NODE),
    )
    assert result.ok, result.failed
    after = observe_host(root, node=NODE, catalog=CATALOG, hold_probe=sim.hold_probe())
    observed = _statuses(render_objects(NODE, node, after))
    predicted = {o["metadata"]["name"]: (o["spec"], o["status"]) for o in predicted_objects}
    # On vfio, once a vGPU is configured the lists name only its size's types: the ids of
    # the others are unknown until a list names them again (docs/domain.md §3b).
    narrowed = interface == "vfio" and any(vf.vgpu for vf in before.gpus[0].vfs)
    if before.gpus[0].sriov_enabled and not narrowed:
        assert predicted == observed
    else:
        # The driver's type ids show only once SR-IOV is on (on vfio: once listed): the
        # prediction leaves them empty and is right about everything else.
        assert predicted == _without_type_ids(observed)
        if not before.gpus[0].sriov_enabled:
            assert predicted != observed
    assert predicted_inventory_renders_the_same(node, before, host_actions, _statuses_of(predicted))
    # The node's VGPUNodeState lists the vGPUs the host has after the apply, UUIDs included.
    assert [(v["vf"], v["profile"], v["uuid"]) for v in node_state.status["vgpus"]] == [
        (str(vf.address), vf.vgpu.type_name, vf.vgpu.uuid)
        for gpu in after.gpus
        for vf in sorted(gpu.vfs, key=lambda v: v.index)
        if vf.vgpu is not None
    ]


def _without_type_ids(
    statuses: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
) -> dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]]:
    out = {}
    for name, (spec, observed) in statuses.items():
        status = dict(observed)
        if "availableTypes" in status:
            status["availableTypes"] = dict.fromkeys(status["availableTypes"], "")
        if "vgpuTypes" in status:
            status["vgpuTypes"] = [{**t, "id": ""} for t in status["vgpuTypes"]]
        out[name] = (spec, status)
    return out


def _statuses_of(
    predicted: dict[str, tuple[Any, Any]],
) -> dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return {name: (dict(spec), dict(status)) for name, (spec, status) in predicted.items()}


def predicted_inventory_renders_the_same(
    node: DesiredNode,
    before: Inventory,
    actions: tuple[Action, ...],
    observed: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
) -> bool:
    return _statuses(render_objects(NODE, node, predict_inventory(before, actions))) == observed
