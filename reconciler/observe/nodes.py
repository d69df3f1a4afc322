"""The labels of Kubernetes nodes, which node groups select by (``spec.nodeGroups[].selector``).

A node agent reads its own Node (one ``get``) when a group may select it (its name admitted):
the Node must be there (``cli.commands.select_node``) and its labels decide a label selector.
``plan --observed cluster`` lists them all (paginated) when the desired state has groups, or
when a node of the files could not be planned (is it a Node at all?). A node configured by its
own entry alone never reads a Node. The objects are the
API server's, so their labels are checked as untrusted data: a label that is not text to text
is left out (no selector can ask for it), and a Node whose ``metadata.labels`` is no mapping
has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from reconciler.model import ObserveError
from reconciler.model.clusterapi import ClusterApi

#: Labels kept per node. A Node has tens; the API server bounds the total size, not the count.
MAX_LABELS = 1024


def node_labels(api: ClusterApi, node: str) -> Mapping[str, str]:
    """Node ``node``'s labels. Raises :class:`ObserveError` when the cluster has no such node
    (a group cannot be decided for a node that is not there)."""
    labels = read_node(api, node)
    if labels is None:
        raise ObserveError(
            f"node {node} is not in the cluster: its labels decide which node groups configure it"
        )
    return labels


def read_node(api: ClusterApi, node: str) -> Mapping[str, str] | None:
    """Node ``node``'s labels, or None when the cluster has no Node of that name (one get)."""
    raw = api.get_object(group="", version="v1", plural="nodes", name=node)
    return None if raw is None else labels_of(raw)


def all_node_labels(api: ClusterApi) -> Mapping[str, Mapping[str, str]]:
    """Every node of the cluster by name, with its labels (one paginated list)."""
    found: dict[str, Mapping[str, str]] = {}
    for raw in api.list_objects(group="", version="v1", plural="nodes"):
        metadata = raw.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if isinstance(name, str) and name:
            found[name] = labels_of(raw)
    return MappingProxyType(found)


def labels_of(raw: Mapping[str, Any]) -> Mapping[str, str]:
    metadata = raw.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if not isinstance(labels, Mapping):
        return MappingProxyType({})
    kept: dict[str, str] = {}
    for key, value in labels.items():
        if len(kept) == MAX_LABELS:
            break
        if isinstance(key, str) and isinstance(value, str):
            kept[key] = value
    return MappingProxyType(kept)
