"""The watch loop's side of the device plugins: what they advertise between reconciles, and
their failures reported.

The engine tells the embedded device plugins the host it converged on, as part of each
reconcile (``reconciler.engine``). Between reconciles, a change of the host that a rescan
notices is told to them at once (:meth:`Advertising.host_changed`): what vanished is advertised
Unhealthy before a reconcile that may take a while, or fail. A device plugin's failure is
logged and counted (``vgpuctl_errors_total{kind="deviceplugin"}``), never the loop's or the
reconcile's: the node is converged without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from reconciler.engine import DevicePlugins, NodePorts, Reconciled
from reconciler.model import ReconcilerError
from reconciler.watch.metrics import WatchMetrics

log = logging.getLogger("vgpuctl.watch")


class Advertising:
    """Tells the device plugins (if any are embedded) what the host offers."""

    def __init__(
        self,
        plugins: DevicePlugins | None,
        *,
        ports: Callable[[], NodePorts],
        metrics: WatchMetrics,
    ) -> None:
        #: Given to the engine, which tells them itself during a reconcile.
        self.plugins = plugins
        self._ports = ports
        self._metrics = metrics

    def host_changed(self) -> None:
        """Tell the device plugins at once what vanished (reported Unhealthy until it is back),
        before a reconcile that may take a while or fail."""
        if self.plugins is None:
            return
        try:
            # The plugins advertise vGPUs: which types a free VF could still make is not theirs.
            inventory = self._ports().observe_host(availability=False)
        except ReconcilerError:
            return  # the reconcile that follows reports it
        try:
            self.plugins.update(inventory, removed_on_purpose=())
        except Exception as exc:
            self._failed(exc)

    def engine_told(self, result: Reconciled) -> None:
        """Report the device plugins' own failure during a reconcile (it went on without
        them)."""
        error = result.plugins.error if result.plugins is not None else None
        if error is not None:
            self._failed(error)

    def _failed(self, error: BaseException) -> None:
        self._metrics.errors.labels(kind="deviceplugin").inc()
        if isinstance(error, ReconcilerError):
            log.error("device plugins: %s", error.message)
        else:
            log.error("device plugins: update failed", exc_info=error)
