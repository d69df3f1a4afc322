"""The diff engine: (desired node, observed inventory[, cluster]) → Plan. Pure; constraint checks
included.

``plan_node`` is the entry point; ``fleet.plan_fleet`` plans many nodes in one batch (imported
from its module: a node's plan does not load it).
``VGPU_UUID_NAMESPACE`` and ``vgpu_uuid`` define the UUIDs created vGPUs get (a contract: the
same node and VF always give the same UUID). The cluster half:
``render_objects`` (the node's CRs as they should be), ``predict_inventory`` (the host after the
host actions, which CR statuses are rendered from) and ``replan_object`` (the cluster executor's
answer to a 409). ``resolve_groups`` makes a node's node-group entries the GPUs of its host
they match (``plan_node`` does it first).
"""

from typing import TYPE_CHECKING

from reconciler.model.lazy import lazy_exports
from reconciler.plan.groups import resolve as resolve_groups
from reconciler.plan.planner import NO_CLUSTER, plan_node
from reconciler.plan.predict import predict_inventory
from reconciler.plan.uuids import VGPU_UUID_NAMESPACE, vgpu_uuid

if TYPE_CHECKING:
    from reconciler.plan.cluster import KUBEVIRT_MISSING, replan_object
    from reconciler.plan.render import LAST_APPLIED_ANNOTATION, canonical_json, render_objects

#: The cluster half, imported on first use: a plan with no cluster renders no object.
__getattr__ = lazy_exports(
    __name__,
    {
        "KUBEVIRT_MISSING": "reconciler.plan.cluster",
        "replan_object": "reconciler.plan.cluster",
        "LAST_APPLIED_ANNOTATION": "reconciler.plan.render",
        "canonical_json": "reconciler.plan.render",
        "render_objects": "reconciler.plan.render",
    },
    globals(),
)

__all__ = [
    "KUBEVIRT_MISSING",
    "LAST_APPLIED_ANNOTATION",
    "NO_CLUSTER",
    "VGPU_UUID_NAMESPACE",
    "canonical_json",
    "plan_node",
    "predict_inventory",
    "render_objects",
    "replan_object",
    "resolve_groups",
    "vgpu_uuid",
]
