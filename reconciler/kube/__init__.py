"""The Kubernetes adapter: the only package that imports ``kubernetes`` (lazily, inside
functions, so node-local commands start fast).

:func:`connect` finds the cluster and returns a :class:`KubernetesApi`, which implements the
engine's :class:`~reconciler.model.clusterapi.ClusterApi` port with the unmodified client and
translates every failure into a one-line :class:`~reconciler.model.ClusterError`.
:class:`EventRecorder` records Events on our custom resources.
"""

from reconciler.kube.api import KubernetesApi
from reconciler.kube.connect import connect
from reconciler.kube.errors import Request
from reconciler.kube.events import EVENT_NAMESPACE, EventRecorder

__all__ = ["EVENT_NAMESPACE", "EventRecorder", "KubernetesApi", "Request", "connect"]
