"""The diff engine: (desired node, observed inventory) → Plan. Pure; constraint checks included.

``plan_node`` is the entry point. ``VGPU_UUID_NAMESPACE`` and ``vgpu_uuid`` define the UUIDs
created vGPUs get (a contract: the same node and VF always give the same UUID).
"""

from reconciler.plan.planner import plan_node
from reconciler.plan.uuids import VGPU_UUID_NAMESPACE, vgpu_uuid

__all__ = ["VGPU_UUID_NAMESPACE", "plan_node", "vgpu_uuid"]
