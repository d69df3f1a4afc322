"""The KubeVirt allow-list's retiring marks: two-phase removal of vgpuctl's entries (pure).

KubeVirt's virt-handler removes, on every node, every mdev whose type its CR does not
allow-list, in use or not (docs/domain.md §10). A node learns that another node has (or is
about to have) vGPUs of a type only from that node's VGPUNodeState, which the other node
writes after its host phase (and, for a type it is about to create first, its intent before
its allow-list check): a node that removed an entry as soon as no summary showed the type
could race another node's first create of it. So an entry vgpuctl owns and no node keeps
is first *marked* retiring (an annotation on the KubeVirt CR: selector → the RFC 3339 time the
mark was written, stamped by the cluster executor), and removed by a later run only when it is
still kept by no node and the mark is older than the grace period, judged against the time the
run read the other nodes' summaries (``ClusterState.observed_at``); a run that creates vGPUs of
a type its own summary does not show publishes that intent in it, then clears the type's mark,
before its host phase (docs/architecture.md, "The KubeVirt allow-list").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

from reconciler.model.clustertext import ClusterTextError, parse_json

#: Annotation on the KubeVirt CR: a JSON object, mdevNameSelector → RFC 3339 time its mark was
#: written (the prefix of :data:`reconciler.model.cluster.KUBEVIRT_OWNED_ANNOTATION`).
KUBEVIRT_RETIRING_ANNOTATION = "vgpu.reconciler.dev/retiring"
#: The grace period's default, in seconds. Any grace above 0 is safe (a run publishes the types
#: it is about to create in its VGPUNodeState before its allow-list check); the length only
#: keeps an entry a node drops from churning when another takes the type up soon after.
DEFAULT_ALLOW_LIST_GRACE = 15 * 60.0
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def parse_marks(text: object) -> dict[str, str]:
    """The marks of the annotation's ``text`` (None or "": none). Raises
    :class:`ClusterTextError` when it is not a JSON object of strings: the caller decides what
    that means (the safe way: no mark is old enough to remove anything)."""
    if text is None or text == "":
        return {}
    value = parse_json(text)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ClusterTextError("is not a JSON object of selector to time")
    return {str(k): str(v) for k, v in value.items()}


def format_marks(marks: Mapping[str, str]) -> str | None:
    """The annotation's text for ``marks`` (sorted keys, compact); None when there are none."""
    if not marks:
        return None
    return json.dumps(dict(sorted(marks.items())), separators=(",", ":"))


def seconds(text: str) -> float | None:
    """An RFC 3339 UTC time to the second (``2026-12-02T03:07:13Z``) as seconds since the
    epoch; None when it is not one."""
    try:
        return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return None


def rfc3339(when: float) -> str:
    """Seconds since the epoch as an RFC 3339 UTC time to the second."""
    return datetime.fromtimestamp(when, UTC).strftime(_FORMAT)


def expired(mark: str | None, observed_at: str, grace: float) -> bool:
    """Whether a mark written at ``mark`` is at least ``grace`` seconds older than
    ``observed_at`` (when the other nodes' summaries were read). A grace of 0 needs no mark; a
    mark or an observation time that cannot be read is never expired (fail closed)."""
    if grace <= 0:
        return True
    if mark is None:
        return False
    marked, observed = seconds(mark), seconds(observed_at)
    if marked is None or observed is None:
        return False
    return observed - marked >= grace
