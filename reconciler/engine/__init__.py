"""The engine: one reconcile of one node, the single pipeline ``apply`` and ``watch`` run.

observe → plan → lock → plan again under the lock → host phase → observe the host again →
cluster phase → device plugins → verify (``pipeline.py``). It sits above ``apply`` (the
executors, the lock, the journal) and below the CLI and the watch loop, which decide only
*when* to reconcile and how to show it. It speaks to the world through ports
(:class:`NodePorts`, :class:`DevicePlugins`): never the kube adapter or grpc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.model.lazy import lazy_exports

if TYPE_CHECKING:
    from reconciler.engine.expect import Expected
    from reconciler.engine.observe import Planned, observe_and_plan
    from reconciler.engine.pipeline import (
        Convergence,
        HostMismatch,
        PluginsTold,
        Reconciled,
        RunSettings,
        Verification,
        reconcile,
    )
    from reconciler.engine.ports import DevicePlugins, NodePorts

#: Where each public name lives. Imported on first use: ``plan`` needs observe_and_plan, not
#: the executors.
_EXPORTS = {
    "Convergence": "reconciler.engine.pipeline",
    "DevicePlugins": "reconciler.engine.ports",
    "Expected": "reconciler.engine.expect",
    "HostMismatch": "reconciler.engine.pipeline",
    "NodePorts": "reconciler.engine.ports",
    "Planned": "reconciler.engine.observe",
    "PluginsTold": "reconciler.engine.pipeline",
    "Reconciled": "reconciler.engine.pipeline",
    "RunSettings": "reconciler.engine.pipeline",
    "Verification": "reconciler.engine.pipeline",
    "observe_and_plan": "reconciler.engine.observe",
    "reconcile": "reconciler.engine.pipeline",
}


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "Convergence",
    "DevicePlugins",
    "Expected",
    "HostMismatch",
    "NodePorts",
    "Planned",
    "PluginsTold",
    "Reconciled",
    "RunSettings",
    "Verification",
    "observe_and_plan",
    "reconcile",
]
