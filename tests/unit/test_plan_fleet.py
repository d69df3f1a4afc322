"""plan_fleet: every node planned alone, in order, a failing node recorded without stopping the
others; the cyclic collector paused for the batch, and what the batch kept handed to the oldest
generation without a walk over it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from reconciler.model import ActionKind, DesiredNode, Inventory, PlanError
from reconciler.plan.fleet import FleetMember, collector_batch, plan_fleet
from tests.gpus import A2, A2_B, CATALOG, a2, want


def member(node: str, profiles: dict[str, int], *, on: str = "A2") -> FleetMember:
    address = A2 if on == "A2" else A2_B
    return FleetMember(
        DesiredNode(node, (want(address, profiles=profiles),)),
        Inventory(node, (a2(A2),)),
    )


def test_every_node_is_planned_in_the_order_it_came() -> None:
    fleet = plan_fleet(
        [member("n1", {"A2-4Q": 2}), member("n2", {"A2-8Q": 1}), member("n3", {"A2-4Q": 1})],
        catalog=CATALOG,
    )

    assert [p.node for p in fleet.plans] == ["n1", "n2", "n3"]
    creates = [[a.kind for a in p.actions].count(ActionKind.VGPU_CREATE) for p in fleet.plans]
    assert creates == [2, 1, 1]
    assert fleet.failures == {}


def test_a_node_that_cannot_be_planned_is_recorded_and_the_others_are_planned() -> None:
    # n2 wants a GPU its host does not have.
    fleet = plan_fleet(
        [member("n1", {"A2-4Q": 2}), member("n2", {"A2-4Q": 2}, on="A2_B"), member("n3", {})],
        catalog=CATALOG,
    )

    assert [p.node for p in fleet.plans] == ["n1", "n3"]
    assert set(fleet.failures) == {"n2"}
    error = fleet.failures["n2"]
    assert isinstance(error, PlanError)
    assert "GPU 0000:09:00.0 is not on node n2" in "\n".join(error.lines())


def test_a_fleets_plans_compute_no_fingerprint_until_one_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fleet's text output never shows a plan's fingerprint: planning leaves it uncomputed.
    computed: list[str] = []
    real = Inventory.fingerprint

    def counting(self: Inventory) -> str:
        computed.append(self.node)
        return real(self)

    monkeypatch.setattr(Inventory, "fingerprint", counting)
    fleet = plan_fleet([member(f"n{i}", {"A2-4Q": 1}) for i in range(3)], catalog=CATALOG)
    assert len(fleet.plans) == 3
    assert computed == []
    assert fleet.plans[1].observed_fingerprint == real(Inventory("n1", (a2(A2),)))
    assert computed == ["n1"]


def test_the_collector_is_paused_while_nodes_are_produced_and_planned() -> None:
    assert gc.isenabled()
    seen: list[bool] = []

    def members() -> Iterator[FleetMember]:
        for name in ("n1", "n2"):
            seen.append(gc.isenabled())  # produced inside the batch
            yield member(name, {"A2-4Q": 1})

    plan_fleet(members(), catalog=CATALOG)

    assert seen == [False, False]
    assert gc.isenabled()


def test_the_collector_is_resumed_when_producing_a_node_fails() -> None:
    def members() -> Iterator[FleetMember]:
        yield member("n1", {"A2-4Q": 1})
        raise ValueError("the second node's observation is unreadable")

    with pytest.raises(ValueError, match="unreadable"):
        plan_fleet(members(), catalog=CATALOG)
    assert gc.isenabled()


def test_a_batch_inside_a_batch_leaves_the_collector_paused_until_the_outer_one_ends() -> None:
    with collector_batch():
        plan_fleet([member("n1", {"A2-4Q": 1})], catalog=CATALOG)
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_paused_by_the_caller_stays_paused() -> None:
    gc.disable()
    try:
        plan_fleet([member("n1", {"A2-4Q": 1})], catalog=CATALOG)
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    """A collectable object that can sit in a cycle and be watched through a weak reference."""

    def __init__(self) -> None:
        self.other: object = None


def test_what_a_batch_kept_goes_to_the_oldest_generation_without_a_young_collection() -> None:
    gc.collect()
    threshold = gc.get_threshold()[0]
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    try:
        with collector_batch():
            kept = [[i] for i in range(20 * threshold)]  # tracked, acyclic, kept past the batch
            gc.callbacks.append(count)
        # The collector would otherwise find 20 thresholds' worth of young objects at the first
        # allocation after the batch and walk them all, then the middle generation, then the
        # oldest.
        more = [[i] for i in range(threshold // 2)]
        assert collections == []
        assert gc.get_count()[0] < threshold
    finally:
        gc.callbacks.remove(count)
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(kept) in oldest and id(kept[-1]) in oldest
    assert gc.get_freeze_count() == 0
    del more


def test_a_cycle_made_in_a_batch_is_still_collected_afterwards() -> None:
    with collector_batch():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
    assert gone() is not None  # only the cyclic collector can free it
    gc.collect()
    assert gone() is None


def test_objects_the_caller_froze_stay_frozen() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_batch():
            kept = [[i] for i in range(1000)]
        assert gc.get_freeze_count() == frozen
        del kept
    finally:
        gc.unfreeze()
