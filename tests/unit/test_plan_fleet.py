"""plan_fleet: every node planned alone, in order, a failing node recorded without stopping the
others; the collector's threshold raised for the batch only."""

from __future__ import annotations

import gc
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
