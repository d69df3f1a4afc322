"""The planner beyond the golden cases: UUIDs, ordering, determinism, and plan-time checks the
desired-state loader already rejects offline (so no golden case can reach them)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.model import (
    VGPU,
    ActionKind,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Inventory,
    Observation,
    PciAddress,
    Plan,
    PlanError,
    Vf,
    VgpuCreate,
    VgpuMode,
    VgpuModeSet,
    VgpuRemove,
)
from reconciler.model.plan_json import plan_to_json
from reconciler.plan import VGPU_UUID_NAMESPACE, plan_node, vgpu_uuid
from reconciler.plan.assign import assign_counts
from tests.gpus import A2, A2_B, A2_C, CATALOG, NODE, a2, card, want


def plan(*gpus: DesiredGpu, host: tuple[Gpu, ...], node: str = NODE, partial: bool = False) -> Plan:
    return plan_node(
        DesiredNode(node, gpus), Inventory(node, host), catalog=CATALOG, partial=partial
    )


def problems(*gpus: DesiredGpu, host: tuple[Gpu, ...]) -> list[str]:
    with pytest.raises(PlanError) as caught:
        plan(*gpus, host=host)
    return caught.value.lines()


def _unfingerprinted(p: Plan) -> dict[str, object]:
    # The fingerprint digests the inventory as given, VF order included; observe and
    # Inventory.from_json always give index order, so only the rest must not depend on it.
    doc = plan_to_json(p)
    doc.pop("observedFingerprint")
    return doc


# ---------------------------------------------------------------- deterministic UUIDs


def test_the_namespace_is_uuid5_of_the_project_domain() -> None:
    assert str(uuid.uuid5(uuid.NAMESPACE_DNS, "vgpu.reconciler.dev")) == VGPU_UUID_NAMESPACE


@pytest.mark.parametrize("name", ["harvester-kgd9c", "n", "节点-1", "a" * 300])
def test_vgpu_uuid_is_the_standard_uuid5(name: str) -> None:
    vf = PciAddress.parse("0000:08:01.7")
    assert vgpu_uuid(name, vf) == str(uuid.uuid5(uuid.UUID(VGPU_UUID_NAMESPACE), f"{name}/{vf}"))


def test_a_recreated_vgpu_gets_the_uuid_it_had() -> None:
    fresh = plan(want(vgpus={0: "A2-4Q"}), host=(a2(enabled=False),))
    first = next(a for a in fresh.actions if a.kind is ActionKind.VGPU_CREATE)
    # After a reboot the VF is back without its mdev: the create carries the same UUID.
    rebooted = plan(want(vgpus={0: "A2-4Q"}), host=(a2(),))
    again = next(a for a in rebooted.actions if a.kind is ActionKind.VGPU_CREATE)
    assert isinstance(first, VgpuCreate) and isinstance(again, VgpuCreate)
    assert again.uuid == first.uuid
    assert first.uuid == vgpu_uuid(NODE, PciAddress.parse("0000:08:00.4"))


def test_uuids_differ_per_node_and_per_vf() -> None:
    one = plan(want(vgpus={0: "A2-4Q", 1: "A2-4Q"}), host=(a2(),), node="n1")
    two = plan(want(vgpus={0: "A2-4Q", 1: "A2-4Q"}), host=(a2(),), node="n2")
    uuids = {a.uuid for p in (one, two) for a in p.actions if isinstance(a, VgpuCreate)}
    assert len(uuids) == 4


# ---------------------------------------------------------------- ordering


def _mixed_host() -> tuple[Gpu, ...]:
    return (
        a2(A2_C, enabled=False),
        a2(A2_B, {0: "A2-4Q", 1: "A2-4Q"}),
        a2(A2, {0: "A2-4Q", 2: "A2-4Q"}),
    )


def _mixed_desired() -> tuple[DesiredGpu, ...]:
    return (
        want(A2_C, {1: "A2-2Q", 0: "A2-2Q"}),
        want(A2_B, sriov=False),
        want(A2, {2: "A2-4A", 0: "A2-4A", 5: "A2-4A"}),
    )


def test_actions_run_removes_then_disable_then_enable_then_creates() -> None:
    p = plan(*_mixed_desired(), host=_mixed_host())
    steps = [(a.seq, a.kind.value, a.target) for a in p.actions if a.kind.is_host]
    assert steps == [
        (1, "vgpu-remove", "0000:08:00.4"),
        (2, "vgpu-remove", "0000:08:00.6"),
        (3, "vgpu-remove", "0000:09:00.4"),
        (4, "vgpu-remove", "0000:09:00.5"),
        (5, "sriov-disable", "0000:09:00.0"),
        (6, "sriov-enable", "0000:0a:00.0"),
        (7, "vgpu-create", "0000:08:00.4"),
        (8, "vgpu-create", "0000:08:00.6"),
        (9, "vgpu-create", "0000:08:01.1"),
        (10, "vgpu-create", "0000:0a:00.4"),
        (11, "vgpu-create", "0000:0a:00.5"),
    ]
    replaced = [a for a in p.actions if a.is_replacement]
    assert [(a.kind.value, a.target) for a in replaced] == [
        ("vgpu-remove", "0000:08:00.4"),
        ("vgpu-remove", "0000:08:00.6"),
        ("vgpu-create", "0000:08:00.4"),
        ("vgpu-create", "0000:08:00.6"),
    ]
    assert p.summary.to_json() == {"create": 4, "change": 2, "remove": 3, "blocked": 0}


def test_the_order_of_the_inputs_does_not_matter() -> None:
    forward = plan(*_mixed_desired(), host=_mixed_host())
    backward_host = tuple(replace(g, vfs=tuple(reversed(g.vfs))) for g in reversed(_mixed_host()))
    backward = plan(*reversed(_mixed_desired()), host=backward_host)
    assert _unfingerprinted(backward) == _unfingerprinted(forward)


def test_blocked_entries_follow_the_run_order() -> None:
    host = (
        a2(A2_B, {0: "A2-4Q"}, in_use={0: "vm-b"}),
        a2(A2, {0: "A2-4Q", 1: "A2-4Q"}, in_use={1: "vm-a"}),
    )
    p = plan(want(A2_B, sriov=False), want(A2, {0: "A2-2Q", 1: "A2-2Q"}), host=host)
    assert [(b.kind.value, b.target) for b in p.blocked] == [
        ("vgpu-remove", "0000:08:00.4"),  # deferred: it makes room only for the waiting 2Qs
        ("vgpu-remove", "0000:08:00.5"),
        ("vgpu-remove", "0000:09:00.4"),
        ("sriov-disable", "0000:09:00.0"),
        ("vgpu-create", "0000:08:00.4"),
        ("vgpu-create", "0000:08:00.5"),
    ]
    assert not p.applyable


# ---------------------------------------------------------------- count form

_PROFILES = ["A2-4Q", "A2-4A", "A2-2Q"]


@given(
    hosted=st.dictionaries(st.integers(0, 15), st.sampled_from(_PROFILES), max_size=10),
    in_use=st.sets(st.integers(0, 15), max_size=3),
    counts=st.dictionaries(st.sampled_from(["A2-4Q", "A2-4A"]), st.integers(1, 2), min_size=1),
    order=st.randoms(use_true_random=False),
)
def test_the_count_form_ignores_input_order(
    hosted: dict[int, str], in_use: set[int], counts: dict[str, int], order: random.Random
) -> None:
    gpu = a2(vgpus=hosted, in_use={i: "vm" for i in in_use if i in hosted})
    vfs = list(gpu.vfs)
    names = list(counts)
    order.shuffle(vfs)
    order.shuffle(names)
    shuffled = replace(gpu, vfs=tuple(vfs))
    first = plan(want(profiles=counts), host=(gpu,))
    second = plan(want(profiles={n: counts[n] for n in names}), host=(shuffled,))
    assert _unfingerprinted(second) == _unfingerprinted(first)


def _vfs(hosted: Mapping[int, str], in_use: frozenset[int] = frozenset()) -> tuple[Vf, ...]:
    return tuple(
        Vf(
            PciAddress(0, 8, 0, 0),
            i,
            VGPU(f"u{i}", hosted[i], in_use=i in in_use) if i in hosted else None,
        )
        for i in range(8)
    )


def test_the_count_form_keeps_in_use_vgpus_before_lower_indexes() -> None:
    vfs = _vfs({0: "P", 2: "P", 5: "P"}, in_use=frozenset({5}))
    assert assign_counts(vfs, {"P": 2}) == {0: "P", 5: "P"}


def test_the_count_form_fills_empty_vfs_then_vfs_that_must_be_cleared() -> None:
    """Nothing in use: a new vGPU is made on a VF with no vGPU before one whose vGPU must go
    (made before the old one goes)."""
    hosted = {i: "OLD" for i in range(8) if i not in (3, 6)}
    vfs = _vfs(hosted)
    assert assign_counts(vfs, {"P": 3}) == {3: "P", 6: "P", 0: "P"}
    assert assign_counts(vfs, {"P": 7}) == dict.fromkeys((3, 6, 0, 1, 2, 4, 5), "P")


def test_with_an_in_use_vgpu_to_go_the_count_form_fills_free_vfs_in_index_order() -> None:
    """A VM holds a vGPU that must go: the change cannot finish in this run, so the free VFs
    are taken in index order whether their vGPU is gone yet or not (the VFs a plan names are
    the ones the next plan names once the removals ran), in-use VFs last."""
    hosted = {i: "OLD" for i in range(8) if i not in (3, 6)}
    vfs = _vfs(hosted, in_use=frozenset({0, 1}))
    assert assign_counts(vfs, {"P": 3}) == {2: "P", 3: "P", 4: "P"}
    assert assign_counts(vfs, {"P": 7}) == dict.fromkeys((2, 3, 4, 5, 6, 7, 0), "P")
    # After the removals of 2, 4, 5 and 7 ran (nothing else changed): the same VFs.
    after = _vfs({0: "OLD", 1: "OLD"}, in_use=frozenset({0, 1}))
    assert assign_counts(after, {"P": 3}) == {2: "P", 3: "P", 4: "P"}


def test_the_count_form_serves_profiles_in_name_order() -> None:
    assert assign_counts(_vfs({}), {"B": 1, "A": 2}) == {0: "A", 1: "A", 2: "B"}


# ---------------------------------------------------------------- fingerprint and identity


def test_the_fingerprint_ignores_where_sysfs_is_mounted() -> None:
    host = (a2(vgpus={0: "A2-4Q"}),)
    here = plan_node(None, Inventory(NODE, host, sysfs_root="/sys"), catalog=CATALOG)
    there = plan_node(None, Inventory(NODE, host, sysfs_root="/tmp/sim/sys"), catalog=CATALOG)
    changed = plan_node(None, Inventory(NODE, (a2(vgpus={0: "A2-4A"}),)), catalog=CATALOG)
    assert here.observed_fingerprint == there.observed_fingerprint
    assert changed.observed_fingerprint != here.observed_fingerprint


class _Counted:
    """An observation that counts how often its fingerprint is computed."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory, self.computed = inventory, 0

    def fingerprint(self) -> str:
        self.computed += 1
        return self.inventory.fingerprint()


def test_a_plans_fingerprint_is_computed_once_when_first_read_and_equal_to_a_saved_ones() -> None:
    inventory = Inventory(NODE, (a2(vgpus={0: "A2-4Q"}),))
    counted = _Counted(inventory)
    observation = Observation(counted)
    assert counted.computed == 0  # made, not computed
    expected = inventory.fingerprint()  # its definition: test_model_inventory.py
    assert observation.fingerprint == expected
    assert observation.fingerprint == expected
    assert counted.computed == 1
    # Equal to the same fingerprint however it was made (a saved plan holds the text alone).
    assert observation == Observation(expected)
    assert hash(observation) == hash(Observation(expected))
    assert observation != Observation("sha256:" + "0" * 64)
    assert repr(Observation(expected)) == f"Observation({expected!r})"


def test_a_plan_computes_its_fingerprint_only_when_read() -> None:
    inventory = Inventory(NODE, (a2(vgpus={0: "A2-4Q"}),))
    computed: list[Inventory] = []
    real = Inventory.fingerprint

    def counting(self: Inventory) -> str:
        computed.append(self)
        return real(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Inventory, "fingerprint", counting)
        plan = plan_node(None, inventory, catalog=CATALOG)
        assert computed == []
        assert plan.observed_fingerprint == real(inventory)
        assert computed == [inventory]


def test_without_a_desired_node_every_gpu_is_left_alone() -> None:
    p = plan_node(None, Inventory(NODE, (a2(vgpus={0: "A2-4Q"}), a2(A2_B))), catalog=CATALOG)
    assert not p.actions
    assert not p.blocked
    assert p.applyable
    assert [n.reason for n in p.noops] == [
        "GPU 0000:08:00.0 (NVIDIA A2) is not in the desired state: unmanaged, left as is",
        "GPU 0000:09:00.0 (NVIDIA A2) is not in the desired state: unmanaged, left as is",
    ]


def test_interface_is_none_until_some_gpu_has_vfs() -> None:
    assert plan(want(), host=(a2(enabled=False),)).interface == "none"
    assert plan(want(), host=(a2(enabled=False), a2(A2_B))).interface == "mdev"


# ---------------------------------------------------------------- in use


def test_an_in_use_vgpu_without_a_known_holder_says_so() -> None:
    p = plan(want(vgpus={}), host=(a2(vgpus={0: "A2-4Q"}, in_use={0: ""}),))
    assert [b.reason for b in p.blocked] == [
        "VF 0000:08:00.4 hosts NVIDIA A2-4Q, in use (holder unknown); no vGPU desired"
    ]


def test_creates_beyond_the_maximum_wait_for_the_in_use_vgpu_only_as_far_as_needed() -> None:
    host = (a2(vgpus={0: "A2-4Q", 1: "A2-4Q"}, in_use={0: "vm", 1: "vm"}),)
    p = plan(want(vgpus={4: "A2-4Q", 5: "A2-4Q", 6: "A2-4Q"}), host=host)
    assert [a.target for a in p.actions if a.kind is ActionKind.VGPU_CREATE] == [
        "0000:08:01.0",
        "0000:08:01.1",
    ]
    waiting = [b for b in p.blocked if b.kind is ActionKind.VGPU_CREATE]
    assert [(b.target, b.reason) for b in waiting] == [
        (
            "0000:08:01.2",
            "waits for NVIDIA A2-4Q on 0000:08:00.4 (in use), "
            "NVIDIA A2-4Q on 0000:08:00.5 (in use) to be removed",
        )
    ]


def test_a_removal_that_only_makes_room_for_waiting_creates_waits_too() -> None:
    """VF 0's A2-4Q is to become an A2-2Q, which cannot be made while VF 1's A2-4Q (in use,
    no longer wanted) stays: removing VF 0's now would leave the GPU one vGPU short until then,
    so that removal waits too, with the same cause, and stays half of its replacement."""
    host = (a2(vgpus={0: "A2-4Q", 1: "A2-4Q"}, in_use={1: "vm"}),)
    p = plan(want(vgpus={0: "A2-2Q"}), host=host)
    assert [a for a in p.actions if a.kind.is_host] == []
    waits = "waits for NVIDIA A2-4Q on 0000:08:00.5 (in use) to be removed"
    assert [(b.kind, b.target, b.action.is_replacement, b.reason) for b in p.blocked] == [
        (
            ActionKind.VGPU_REMOVE,
            "0000:08:00.4",
            True,
            "VF 0000:08:00.4 hosts NVIDIA A2-4Q; desired NVIDIA A2-2Q; deferred: it only makes "
            f"room for NVIDIA A2-2Q, which {waits} (apply --partial removes it now)",
        ),
        (
            ActionKind.VGPU_REMOVE,
            "0000:08:00.5",
            False,
            "VF 0000:08:00.5 hosts NVIDIA A2-4Q, in use by vm; no vGPU desired",
        ),
        (ActionKind.VGPU_CREATE, "0000:08:00.4", True, waits),
    ]
    assert p.summary.to_json() == {"create": 0, "change": 0, "remove": 0, "blocked": 3}


def test_removals_run_when_some_of_the_creates_they_make_room_for_can_run() -> None:
    """Four A2-4A (4 GB; VF 0's in use) to four A2-4Q (4 GB too): three A2-4Q fit beside the
    held A2-4A (four 4 GB vGPUs at most), the fourth waits for it. The removals make room for
    creates that run, so they run: the GPU still has four vGPUs after the apply."""
    host = (a2(vgpus=dict.fromkeys(range(4), "A2-4A"), in_use={0: "vm"}),)
    p = plan(want(profiles={"A2-4Q": 4}), host=host)
    assert [(a.kind, a.target) for a in p.actions if a.kind.is_host] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.5"),
        (ActionKind.VGPU_REMOVE, "0000:08:00.6"),
        (ActionKind.VGPU_REMOVE, "0000:08:00.7"),
        (ActionKind.VGPU_CREATE, "0000:08:00.5"),
        (ActionKind.VGPU_CREATE, "0000:08:00.6"),
        (ActionKind.VGPU_CREATE, "0000:08:00.7"),
    ]
    assert [(b.kind, b.target) for b in p.blocked] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.4"),
        (ActionKind.VGPU_CREATE, "0000:08:01.0"),
    ]


def test_with_partial_a_replacement_whose_create_must_wait_is_a_plain_remove() -> None:
    host = (a2(vgpus={0: "A2-4Q", 1: "A2-4Q"}, in_use={1: "vm"}),)
    p = plan(want(vgpus={0: "A2-2Q"}), host=host, partial=True)
    [remove] = [a for a in p.actions if a.kind.is_host]
    assert (remove.kind, remove.target, remove.is_replacement) == (
        ActionKind.VGPU_REMOVE,
        "0000:08:00.4",
        False,
    )
    assert [(b.kind, b.target, b.action.is_replacement) for b in p.blocked] == [
        (ActionKind.VGPU_REMOVE, "0000:08:00.5", False),
        (ActionKind.VGPU_CREATE, "0000:08:00.4", False),
    ]
    assert p.summary.to_json() == {"create": 0, "change": 0, "remove": 1, "blocked": 2}


# ---------------------------------------------------------------- plan-time checks


def test_every_problem_is_reported_in_file_order() -> None:
    lines = problems(
        want(A2_B, {0: "A2-4Q", 1: "A2-2Q"}, line=20),
        want(PciAddress.parse("0000:41:00.0"), profiles={"L40S-8Q": 1}, line=30),
        want(A2, profiles={"A2-3Q": 1}, line=10),
        host=(a2(), a2(A2_B)),
    )
    assert lines == [
        "d.yaml:10:11: GPU 0000:08:00.0 (NVIDIA A2) does not offer 'NVIDIA A2-3Q'; offered: "
        "NVIDIA A2-1B, -2B, -1Q, -2Q, -4Q, -8Q, -16Q, -1A, -2A, -4A, -8A, -16A, -4C, -8C, -16C",
        # The entries have no place of their own here: they are where their GPU is.
        "d.yaml:20:11: mixed framebuffer sizes on GPU 0000:09:00.0: 'NVIDIA A2-2Q' (2 GB) and "
        "'NVIDIA A2-4Q' (4 GB, line 20); time-sliced vGPUs on one GPU share one size "
        "(equal-size mode)",
        "d.yaml:30:11: GPU 0000:41:00.0 is not on node node-1: its GPUs are "
        "0000:08:00.0 (NVIDIA A2), 0000:09:00.0 (NVIDIA A2)",
    ]


def test_over_the_maximum_names_the_first_vf_over_the_limit() -> None:
    five: dict[PciAddress | int, str] = {i: "A2-4Q" if i % 2 else "A2-4A" for i in range(5)}
    assert problems(want(vgpus=five), host=(a2(),)) == [
        "5 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA A2-4A' allows at most 4 per "
        "NVIDIA A2; first over the limit: VF 0000:08:01.0; profiles that allow 5: "
        "A2-1B A2-2B A2-1Q A2-2Q A2-1A A2-2A"
    ]


def test_a_vf_named_by_index_and_by_address_is_one_vf() -> None:
    vf0 = PciAddress.parse("0000:08:00.4")
    assert problems(want(vgpus={0: "A2-4Q", vf0: "A2-4Q"}), host=(a2(),)) == [
        "VF 0000:08:00.4 of GPU 0000:08:00.0 is named twice: as index 0 and by its address "
        "(one vGPU per VF)"
    ]


def test_the_count_form_cannot_ask_for_more_vgpus_than_vfs() -> None:
    small = replace(a2(), model=None, device_id="ffff", subsystem_device_id="", types=())
    small = replace(small, vfs=small.vfs[:4], num_vfs=4, total_vfs=4)
    assert problems(want(profiles={"X-1Q": 5}), host=(small,)) == [
        "5 vGPUs requested on GPU 0000:08:00.0, but it has 4 VFs (one vGPU per VF)"
    ]


def test_checks_the_loader_also_makes_hold_for_api_callers() -> None:
    assert problems(
        want(A2, sriov=False, vgpus={0: "A2-4Q"}),
        want(A2, {0: "A2-4Q"}),
        want(A2_B, {0: "A2-4Q"}),
        host=(a2(), replace(a2(A2_B, enabled=False), total_vfs=0)),
    ) == [
        "GPU 0000:08:00.0 (NVIDIA A2): vGPUs are desired but sriov is disabled",
        "GPU 0000:08:00.0 is listed twice",
        "GPU 0000:09:00.0 (NVIDIA A2) has no SR-IOV VFs (sriov_totalvfs is 0): it cannot host "
        "vGPUs",
    ]


def test_a_desired_model_that_matches_by_short_name_is_no_problem() -> None:
    p = plan(replace(want(vgpus={}), model="a2"), host=(a2(),))
    assert p.applyable


# ---------------------------------------------------------------- speed


def test_a_256_vf_node_plans_in_full() -> None:
    """An 8×L40S node, count form (its speed is measured by `just bench`, not asserted here)."""
    buses = (0x41, 0x42, 0x43, 0x44, 0x81, 0x82, 0x83, 0x84)
    addresses = [PciAddress(0, bus, 0, 0) for bus in buses]
    half = dict.fromkeys(range(0, 32, 2), "L40S-1Q")
    inventory = Inventory(NODE, tuple(card("L40S", a, half) for a in addresses))
    node = DesiredNode(NODE, tuple(want(a, profiles={"L40S-1Q": 24}) for a in addresses))
    p = plan_node(node, inventory, catalog=CATALOG)
    assert len([a for a in p.actions if a.kind.is_host]) == 8 * 8


# ---------------------------------------------------------------- mixed-size mode


def _mixed(gpu: DesiredGpu) -> DesiredGpu:
    return replace(gpu, mode=VgpuMode.MIXED_SIZE)


def _host_steps(p: Plan) -> list[tuple[str, str, str]]:
    """(kind, target, type or mode) of each host action, in run order."""
    out = []
    for a in p.actions:
        if isinstance(a, VgpuModeSet):
            out.append((a.kind.value, a.target, a.mode.value))
        elif isinstance(a, VgpuCreate | VgpuRemove):
            out.append((a.kind.value, a.target, a.type_name.removeprefix("NVIDIA ")))
        elif a.kind.is_host:
            out.append((a.kind.value, a.target, ""))
    return out


def _blocked_steps(p: Plan) -> list[tuple[str, str]]:
    return [(b.action.kind.value, b.action.target) for b in p.blocked]


def test_mixed_size_is_set_after_the_enable_and_before_the_first_create() -> None:
    # An A2 (16 GB) with an 8Q beside a 4Q: only mixed-size mode allows it.
    desired = _mixed(want(vgpus={0: "A2-8Q", 1: "A2-4Q"}))
    p = plan(desired, host=(a2(enabled=False),))
    assert _host_steps(p) == [
        ("sriov-enable", "0000:08:00.0", ""),
        ("vgpu-mode", "0000:08:00.0", "mixed-size"),
        ("vgpu-create", "0000:08:00.4", "A2-8Q"),
        ("vgpu-create", "0000:08:00.5", "A2-4Q"),
    ]
    mode = next(a for a in p.actions if isinstance(a, VgpuModeSet))
    assert "nvidia-smi vgpu -i 0000:08:00.0 -shm 1" in mode.reason
    # The switch is a change; the enable and the two vGPUs are creates.
    assert (p.summary.create, p.summary.change, p.summary.remove) == (3, 1, 0)


def test_a_gpu_already_in_mixed_size_mode_is_not_switched_again() -> None:
    desired = _mixed(want(vgpus={0: "A2-8Q", 1: "A2-4Q"}))
    host = replace(a2(), vgpu_mode=VgpuMode.MIXED_SIZE)
    assert [k for k, _, _ in _host_steps(plan(desired, host=(host,)))] == [
        "vgpu-create",
        "vgpu-create",
    ]
    # In equal-size mode with SR-IOV on and no vGPU, the switch comes first.
    assert _host_steps(plan(desired, host=(a2(),)))[0] == (
        "vgpu-mode",
        "0000:08:00.0",
        "mixed-size",
    )


def test_nothing_to_create_needs_no_switch() -> None:
    # The layout is there already: the mode matters only to vGPUs about to be made.
    desired = _mixed(want(vgpus={0: "A2-4Q", 1: "A2-4Q"}))
    p = plan(desired, host=(a2(vgpus={0: "A2-4Q", 1: "A2-4Q"}),))
    assert p.actions == () and p.blocked == ()


def test_the_switch_runs_after_the_removals_that_empty_the_gpu() -> None:
    desired = _mixed(want(vgpus={1: "A2-8Q", 2: "A2-4Q"}))
    p = plan(desired, host=(a2(vgpus={0: "A2-4Q", 3: "A2-4Q"}),))
    assert _host_steps(p) == [
        ("vgpu-remove", "0000:08:00.4", "A2-4Q"),
        ("vgpu-remove", "0000:08:00.7", "A2-4Q"),
        ("vgpu-mode", "0000:08:00.0", "mixed-size"),
        ("vgpu-create", "0000:08:00.5", "A2-8Q"),
        ("vgpu-create", "0000:08:00.6", "A2-4Q"),
    ]


@pytest.mark.parametrize(
    ("observed", "words"),
    [(VgpuMode.EQUAL_SIZE, "it is equal-size"), (VgpuMode.UNKNOWN, "its mode could not be read")],
)
def test_a_gpu_whose_vgpus_stay_is_never_switched(observed: VgpuMode, words: str) -> None:
    # VF 0's 4Q stays: the driver refuses the switch while it exists. A second 4Q fits beside
    # it in either mode and runs; the 8Q needs the switch and waits, saying why.
    desired = _mixed(want(vgpus={0: "A2-4Q", 1: "A2-8Q", 2: "A2-4Q"}))
    host = replace(a2(vgpus={0: "A2-4Q"}), vgpu_mode=observed)
    p = plan(desired, host=(host,))
    assert _host_steps(p) == [("vgpu-create", "0000:08:00.6", "A2-4Q")]
    assert _blocked_steps(p) == [
        ("vgpu-mode", "0000:08:00.0"),
        ("vgpu-create", "0000:08:00.5"),
    ]
    switch, create = (b.action for b in p.blocked)
    assert switch.reason == (
        f"desired mixed-size, {words}; GPU 0000:08:00.0 hosts vGPUs that stay (NVIDIA A2-4Q on "
        "0000:08:00.4): the driver sets the vGPU mode only while a GPU hosts none"
    )
    assert create.reason.startswith("needs mixed-size mode on GPU 0000:08:00.0; GPU ")


def test_an_in_use_vgpu_keeps_the_switch_and_the_other_size_waiting() -> None:
    desired = _mixed(want(vgpus={1: "A2-8Q"}))
    host = a2(vgpus={0: "A2-4Q"}, in_use={0: "vm-a"})
    p = plan(desired, host=(host,))
    assert p.actions == ()
    assert _blocked_steps(p) == [
        ("vgpu-remove", "0000:08:00.4"),
        ("vgpu-mode", "0000:08:00.0"),
        ("vgpu-create", "0000:08:00.5"),
    ]


def test_a_gpu_known_to_be_mixed_goes_back_to_equal_size_only_when_empty() -> None:
    desired = want(vgpus={0: "A2-4Q", 1: "A2-4Q"})  # equal-size: the default
    empty = replace(a2(), vgpu_mode=VgpuMode.MIXED_SIZE)
    assert _host_steps(plan(desired, host=(empty,)))[0] == (
        "vgpu-mode",
        "0000:08:00.0",
        "equal-size",
    )
    # With a vGPU that stays the GPU stays mixed-size: equal sizes fit it, nothing waits.
    hosting = replace(a2(vgpus={0: "A2-4Q"}), vgpu_mode=VgpuMode.MIXED_SIZE)
    assert _host_steps(plan(desired, host=(hosting,))) == [("vgpu-create", "0000:08:00.5", "A2-4Q")]
    # A mode that could not be read is left alone when equal-size is desired.
    unknown = replace(a2(vgpus={0: "A2-4Q"}), vgpu_mode=VgpuMode.UNKNOWN)
    assert [k for k, _, _ in _host_steps(plan(desired, host=(unknown,)))] == ["vgpu-create"]


def test_equal_size_plans_no_mode_step() -> None:
    for desired in (
        want(profiles={"A2-4Q": 1}),
        replace(want(profiles={"A2-4Q": 1}), mode=VgpuMode.EQUAL_SIZE),
    ):
        kinds = [k for k, _, _ in _host_steps(plan(desired, host=(a2(enabled=False),)))]
        assert kinds == ["sriov-enable", "vgpu-create"]
