"""plan_fleet: many nodes planned in one process, one after the other (``plan --observed
cluster`` plans every node of a desired state this way).

Each node is planned by :func:`~reconciler.plan.plan_node`, alone: a node whose desired state
cannot be reached is recorded with its error and the others are still planned. The nodes come
from an iterable, consumed as the batch goes, so a caller may produce each node's observation
(parse it, say) only when its turn comes.

One thing differs from planning the nodes in a loop of one's own: the batch runs with CPython's
cyclic garbage collector paused. A fleet's plan allocates millions of objects while it keeps
every node's objects, inventory and plan, so the collector walked the kept ones again and
again, each full pass over all of them as the heap grew by a quarter: 1.6 s of a 14 s
1,000-node ``plan --observed cluster`` (5 full passes), a tenth of ``fleet_plan`` (``just
bench``). What the batch makes is acyclic values (frozen dataclasses, JSON mappings and
lists), freed by reference counting as before; a cycle made meanwhile (an exception's
traceback, say) waits for the next full collection. The collector is resumed when the batch
ends, however it ends, unless it was paused already (mypy tunes it for its builds for the same
reason).

Resuming alone would only move the cost: everything the batch made and kept is still counted
as young, so the first allocation after it started a young collection over all of it, then
the middle and the full one (1.6 s after a 1,000-node batch, measured with ``gc.callbacks``).
The survivors are therefore handed straight to the oldest generation, where the collector's
own promotion would have put them after those three walks: ``gc.freeze()`` moves every tracked
object aside and zeroes the young count, ``gc.unfreeze()`` puts them all into the oldest
generation (both splice lists, whatever their length). Nothing is exempt from collection
afterwards: the next full collection sees them, cycles included. Skipped when the caller keeps
objects frozen of its own (``gc.get_freeze_count()``), which unfreezing would release.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from reconciler.catalog import Catalog
from reconciler.model import DesiredNode, Inventory, Plan, ReconcilerError
from reconciler.model.cluster import ClusterState
from reconciler.model.record import record
from reconciler.model.retiring import DEFAULT_ALLOW_LIST_GRACE
from reconciler.plan.planner import plan_node


@record(frozen=True, slots=True)
class FleetMember:
    """One node to plan: its desired state (None: nothing of it is desired) and observation."""

    desired: DesiredNode | None
    inventory: Inventory
    cluster: ClusterState | None = None


@record(frozen=True, slots=True)
class FleetPlan:
    """The plans of the nodes that could be planned, in the order they came, and why each
    other node could not be (by node name)."""

    plans: tuple[Plan, ...]
    failures: Mapping[str, ReconcilerError]


def plan_fleet(
    members: Iterable[FleetMember],
    *,
    catalog: Catalog,
    adopt: bool = False,
    allow_list_grace: float = DEFAULT_ALLOW_LIST_GRACE,
) -> FleetPlan:
    """Plan every member (see the module's description; ``allow_list_grace``: plan_node's)."""
    plans: list[Plan] = []
    failures: dict[str, ReconcilerError] = {}
    with collector_batch():
        for member in members:
            try:
                plan = plan_node(
                    member.desired,
                    member.inventory,
                    catalog=catalog,
                    cluster=member.cluster,
                    adopt=adopt,
                    allow_list_grace=allow_list_grace,
                )
            except ReconcilerError as exc:
                failures[member.inventory.node] = exc
            else:
                plans.append(plan)
    return FleetPlan(plans=tuple(plans), failures=failures)


@contextmanager
def collector_batch() -> Iterator[None]:
    """Run the block with the cyclic garbage collector paused (see the module's description)."""
    paused_here = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused_here:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
