"""The renderer's shortcut: a VGPUDevice the API server holds exactly as rendered is not made
again (``AsStored``), and the cluster planner calls it up to date without comparing.

The oracle is the planner's own long way: the same node planned with no stored objects handed
to the renderer, so every object is rendered and compared through Harvester's view. Whatever
was changed in the stored object, both ways must give the same cluster plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from reconciler.model import DesiredGpu, DesiredNode, Gpu, Inventory, PciAddress, VfKey
from reconciler.model.cluster import (
    MANAGED_BY_LABEL,
    ClusterState,
    KubeObject,
    object_name,
)
from reconciler.plan.assign import vf_profiles
from reconciler.plan.check import vf_slots
from reconciler.plan.cluster import ClusterPlan, plan_cluster
from reconciler.plan.render import LAST_APPLIED_ANNOTATION, AsStored, render_with
from tests.gpus import a2

NODE = "n1"
PROFILE = "NVIDIA A2-4Q"
CREATABLE = frozenset({"NVIDIA A2-4Q", "NVIDIA A2-8Q"})
_HOST = a2(vgpus={0: "A2-4Q", 1: "A2-4Q"})
#: An A2 with SR-IOV on and vGPUs on VFs 0 and 1; the free VFs offer two types.
GPU: Gpu = replace(
    _HOST,
    vfs=tuple(vf if vf.vgpu else replace(vf, creatable=CREATABLE) for vf in _HOST.vfs),
)


def _inventory(gpu: Gpu = GPU) -> Inventory:
    return Inventory(NODE, (gpu,))


def _desired() -> DesiredNode:
    keyed: dict[VfKey, str] = {0: PROFILE, 1: PROFILE}
    return DesiredNode(NODE, (DesiredGpu(GPU.address, True, vgpus=keyed),))


def _assignments() -> dict[PciAddress, dict[int, str]]:
    entry = _desired().gpu(GPU.address)
    assert entry is not None
    return {GPU.address: vf_profiles(entry, vf_slots(GPU))}


def _stored() -> list[KubeObject]:
    """The node's objects as the API server holds them after vgpuctl wrote them."""
    rendered = render_with(NODE, _desired().gpus, _inventory(), _assignments())
    return [
        replace(o, resource_version=str(100 + i))
        for i, o in enumerate(rendered)
        if isinstance(o, KubeObject)
    ]


def _state(objects: list[KubeObject]) -> ClusterState:
    return ClusterState(
        NODE,
        sriov_gpu_devices={o.name: o for o in objects if o.kind == "SRIOVGPUDevice"},
        vgpu_devices={o.name: o for o in objects if o.kind == "VGPUDevice"},
    )


def _plan(
    state: ClusterState, *, shortcut: bool, adopt: bool = False, gpu: Gpu = GPU
) -> ClusterPlan:
    desired = _desired()
    rendered = render_with(
        NODE,
        desired.gpus,
        _inventory(gpu),
        _assignments(),
        stored=state.vgpu_devices if shortcut else None,
    )
    return plan_cluster(
        rendered,
        state,
        desired={g.address: g for g in desired.gpus},
        inventory=_inventory(gpu),
        configured=[PROFILE],
        adopt=adopt,
    )


def test_objects_stored_as_rendered_are_not_made_again() -> None:
    stored = _stored()
    state = _state(stored)
    rendered = render_with(
        NODE, _desired().gpus, _inventory(), _assignments(), stored=state.vgpu_devices
    )
    vf_names = [object_name(NODE, str(vf.address)) for vf in GPU.vfs]
    assert [o.name for o in rendered] == [object_name(NODE, str(GPU.address)), *vf_names]
    assert rendered[1:] == [AsStored("VGPUDevice", name) for name in vf_names]
    plan = _plan(state, shortcut=True)
    assert plan.actions == []
    assert [n.target for n in plan.noops] == [o.name for o in stored]
    assert {n.reason for n in plan.noops[1:]} == {"VGPUDevice up to date"}


def _section(o: KubeObject, name: str, change: Callable[[dict[str, Any]], None]) -> KubeObject:
    value = dict(getattr(o, name))
    change(value)
    changes: dict[str, Any] = {name: MappingProxyType(value)}
    return replace(o, **changes)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.pop(key, None)


MUTATIONS: Mapping[str, Callable[[KubeObject], KubeObject]] = {
    "as-written": lambda o: o,
    "another-resource-version": lambda o: replace(o, resource_version="7"),
    "spec-type-changed": lambda o: _section(o, "spec", _set("vGPUTypeName", "NVIDIA A2-8Q")),
    "spec-type-missing": lambda o: _section(o, "spec", _drop("vGPUTypeName")),
    "spec-type-null": lambda o: _section(o, "spec", _set("vGPUTypeName", None)),
    "spec-enabled-missing": lambda o: _section(o, "spec", _drop("enabled")),
    "spec-extra-field": lambda o: _section(o, "spec", _set("extra", "x")),
    "status-uuid-changed": lambda o: _section(o, "status", _set("uuid", "other")),
    "status-uuid-empty": lambda o: _section(o, "status", _set("uuid", "")),
    "status-undeclared-field": lambda o: _section(o, "status", _set("inUse", True)),
    "status-empty": lambda o: replace(o, status=MappingProxyType({})),
    "status-types-changed": lambda o: _section(
        o, "status", _set("availableTypes", {"NVIDIA A2-4Q": "nvidia-500"})
    ),
    "label-extra": lambda o: _section(o, "labels", _set("team", "a")),
    "label-managed-by-missing": lambda o: _section(o, "labels", _drop(MANAGED_BY_LABEL)),
    "label-managed-by-other": lambda o: _section(o, "labels", _set(MANAGED_BY_LABEL, "other")),
    "label-nodename-missing": lambda o: _section(o, "labels", _drop("nodename")),
    "annotation-extra": lambda o: _section(o, "annotations", _set("note", "x")),
    "annotation-applied-differs": lambda o: _section(
        o, "annotations", _set(LAST_APPLIED_ANNOTATION, "{}")
    ),
    "annotation-applied-missing": lambda o: _section(
        o, "annotations", _drop(LAST_APPLIED_ANNOTATION)
    ),
}


@pytest.mark.parametrize("adopt", [False, True], ids=["own", "adopt"])
@pytest.mark.parametrize("vf", [0, 5], ids=["vgpu", "free"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_shortcut_plans_what_the_long_way_plans(mutation: str, vf: int, adopt: bool) -> None:
    stored = _stored()
    target = object_name(NODE, str(GPU.vfs[vf].address))
    changed = [MUTATIONS[mutation](o) if o.name == target else o for o in stored]
    state = _state(changed)
    assert _plan(state, shortcut=True, adopt=adopt) == _plan(state, shortcut=False, adopt=adopt)


def test_a_missing_object_is_created_either_way() -> None:
    stored = _stored()
    gone = object_name(NODE, str(GPU.vfs[3].address))
    state = _state([o for o in stored if o.name != gone])
    plan = _plan(state, shortcut=True)
    assert plan == _plan(state, shortcut=False)
    assert [a.target for a in plan.actions] == [gone]


def test_a_vgpu_without_a_uuid_is_planned_alike_either_way() -> None:
    """A summary may show a vGPU without its UUID (untrusted input): its VGPUDevice's status
    leaves the UUID out, as Harvester's omitempty does, so what is rendered is what the API
    server keeps, and an object an earlier vgpuctl stored with an empty UUID is up to date
    either way (it once rendered ``uuid: ""``, which the shortcut took as stored and the long
    way, through Harvester's view, as a change every run)."""
    vf0 = GPU.vfs[0]
    assert vf0.vgpu is not None
    no_uuid = replace(GPU, vfs=(replace(vf0, vgpu=replace(vf0.vgpu, uuid="")), *GPU.vfs[1:]))
    name = object_name(NODE, str(vf0.address))
    stored = [_section(o, "status", _set("uuid", "")) if o.name == name else o for o in _stored()]
    state = _state(stored)
    plan = _plan(state, shortcut=True, gpu=no_uuid)
    assert plan == _plan(state, shortcut=False, gpu=no_uuid)
    assert plan.actions == []
