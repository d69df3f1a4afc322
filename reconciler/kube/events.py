"""Kubernetes Events on our custom resources: what ``kubectl describe vgpudevice X`` shows.

Events are a courtesy to the operator, never part of the reconcile: a failure to record one is
logged and dropped. After a failure that will not fix itself within this run (RBAC denies
events, the server is unreachable) the recorder stops trying, so one outage does not cost a
timeout per event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from reconciler.model import ClusterError, ReconcilerError
from reconciler.model.cluster import GROUP, GROUP_VERSIONS, VERSION
from reconciler.model.clusterapi import ClusterApi

log = logging.getLogger(__name__)

#: Where Events about cluster-scoped objects go (kubectl looks for them there).
EVENT_NAMESPACE = "default"

EVENT_TYPES = frozenset({"Normal", "Warning"})


class EventRecorder:
    """Records core/v1 Events on SRIOVGPUDevice / VGPUDevice objects (and the node's
    VGPUNodeState) for one node.

    Satisfies :class:`reconciler.apply.cluster.EventSink`.
    """

    def __init__(
        self,
        api: ClusterApi,
        *,
        component: str = "vgpuctl",
        node: str,
        clock: Callable[[], float] = time.time,
        unique: Callable[[], int] = time.time_ns,
    ) -> None:
        self.api = api
        self.component = component
        self.node = node
        self._clock = clock
        self._unique = unique
        #: Why recording stopped, once it has (for the CLI to mention).
        self.disabled: str | None = None
        self.recorded = 0
        self.dropped = 0

    def event(
        self,
        kind: str,
        name: str,
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        uid: str = "",
    ) -> None:
        if type not in EVENT_TYPES:
            raise ValueError(f"event type must be Normal or Warning, not {type!r}")
        if self.disabled is not None:
            self.dropped += 1
            return
        body = self.body(kind, name, reason=reason, message=message, type=type, uid=uid)
        try:
            self.api.create_object(
                group="", version="v1", plural="events", namespace=EVENT_NAMESPACE, body=body
            )
        except ReconcilerError as e:
            self.dropped += 1
            if isinstance(e, ClusterError):
                # Denied, unreachable, not served: the next event would fail the same way
                # (a 409 on a name clash is not a ClusterError: keep going).
                self.disabled = e.message
            log.warning("could not record event %s on %s %s: %s", reason, kind, name, e.message)
            return
        self.recorded += 1

    def body(
        self,
        kind: str,
        name: str,
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        uid: str = "",
    ) -> dict[str, Any]:
        """The Event object, as client-go's recorder builds it (``<object>.<hex time>``)."""
        now = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        group, version = GROUP_VERSIONS.get(kind, (GROUP, VERSION))
        involved: dict[str, Any] = {"apiVersion": f"{group}/{version}", "kind": kind, "name": name}
        if uid:
            involved["uid"] = uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{self._unique():x}", "namespace": EVENT_NAMESPACE},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type,
            "source": {"component": self.component, "host": self.node},
            "reportingComponent": self.component,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
