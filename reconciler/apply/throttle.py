"""A client-side rate limit on the requests to the API server, shared by every worker of a
delegate rollout (docs/delegate.md).

client-go bounds each client's requests with a token bucket (``rest/config.go``: ``QPS`` and
``Burst``, ``DefaultQPS float32 = 5.0`` and ``DefaultBurst int = 10`` when left zero;
``RESTClientFor`` builds ``flowcontrol.NewTokenBucketRateLimiter(qps, burst)``, and every
request, a watch's included, waits for a token first). The ``kubernetes`` Python client has no
such limit: :class:`RateLimitedApi` puts the same bucket in front of a :class:`ClusterApi`, so
ten nodes polled side by side still ask the API server for at most ``qps`` requests a second
after an initial ``burst``.

The bucket hands out reservations, as ``golang.org/x/time/rate``'s ``Limiter.Wait`` does: a
request that finds it empty takes a token from the future and sleeps until that token is due,
outside the lock, so waiting workers do not hold each other up and come out ``1/qps`` apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a cold node-local plan imports no cluster port
    from reconciler.model.clusterapi import ClusterApi, ObjectList, WatchStream

#: kube-controller-manager's client defaults (k8s.io/kubernetes v1.37.2
#: pkg/controller/apis/config/v1alpha1/defaults.go: ``ClientConnection.QPS = 20.0``, ``Burst =
#: 30``): the rate the control plane gives its own client that drives objects on every node.
#: client-go's bare ``DefaultQPS`` 5 / ``DefaultBurst`` 10 (rest/config.go) would make a
#: delegate apply slower than one node after another (a node's waits poll: about 70 requests).
DEFAULT_QPS = 20.0
DEFAULT_BURST = 30


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved; thread-safe."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1, not {qps}, {burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Waits for a token; returns how long it waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class RateLimitedApi:
    """``api`` with a token taken from ``bucket`` before every request (a ``ClusterApi``)."""

    def __init__(self, api: ClusterApi, bucket: TokenBucket) -> None:
        self.api = api
        self.bucket = bucket

    def list_objects(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[dict[str, Any]]:
        self.bucket.take()
        return self.api.list_objects(
            group=group,
            version=version,
            plural=plural,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
        )

    def list_collection(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> ObjectList:
        self.bucket.take()
        return self.api.list_collection(
            group=group,
            version=version,
            plural=plural,
            namespace=namespace,
            label_selector=label_selector,
        )

    def watch_objects(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str = "",
        timeout_seconds: int = 300,
    ) -> WatchStream:
        self.bucket.take()
        return self.api.watch_objects(
            group=group,
            version=version,
            plural=plural,
            resource_version=resource_version,
            namespace=namespace,
            label_selector=label_selector,
            timeout_seconds=timeout_seconds,
        )

    def get_object(
        self, *, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        self.bucket.take()
        return self.api.get_object(
            group=group, version=version, plural=plural, name=name, namespace=namespace
        )

    def create_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self.bucket.take()
        return self.api.create_object(
            group=group, version=version, plural=plural, body=body, namespace=namespace
        )

    def replace_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self.bucket.take()
        return self.api.replace_object(
            group=group, version=version, plural=plural, name=name, body=body, namespace=namespace
        )

    def patch_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        patch: Sequence[Mapping[str, Any]],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self.bucket.take()
        return self.api.patch_object(
            group=group, version=version, plural=plural, name=name, patch=patch, namespace=namespace
        )

    def replace_status(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        body: Mapping[str, Any],
        namespace: str | None = None,
    ) -> dict[str, Any]:
        self.bucket.take()
        return self.api.replace_status(
            group=group, version=version, plural=plural, name=name, body=body, namespace=namespace
        )

    def delete_object(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self.bucket.take()
        self.api.delete_object(
            group=group,
            version=version,
            plural=plural,
            name=name,
            namespace=namespace,
            resource_version=resource_version,
        )
