"""``export --observed cluster -o snapshot`` and ``plan --observed FILE``: a fleet's observed
state in a file, so CI plans without cluster credentials (``reconciler/kube/snapshot.py``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from reconciler.cli.host import Host
from reconciler.cli.options import parse_duration
from reconciler.cli.render import safe
from reconciler.kube.snapshot import (
    CLOCK_SKEW_S,
    DEFAULT_MAX_AGE_S,
    MAX_SNAPSHOT_BYTES,
    RecordingApi,
    SnapshotApi,
    check_items,
    taken_at,
)
from reconciler.model import UsageError
from reconciler.model.errors import excerpt

SCHEMA = "cluster-snapshot.schema.json"


def max_age(text: str | None) -> float:
    """``--max-snapshot-age`` in seconds (default :data:`DEFAULT_MAX_AGE_S`)."""
    if text is None:
        return DEFAULT_MAX_AGE_S
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--max-snapshot-age: {e}") from None
    if seconds <= 0:
        raise UsageError("--max-snapshot-age must be positive")
    return seconds


def age_text(seconds: float) -> str:
    """``3h 5m``, ``12m``, ``40s``: a snapshot's age as a person reads it."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m" if minutes else f"{secs}s"


def take_snapshot(host: Host) -> dict[str, Any]:
    """Read the cluster as ``plan --observed cluster`` reads it, every node, and return the
    snapshot of those reads."""
    from reconciler import __version__
    from reconciler.observe import FleetReader
    from reconciler.observe.harvester import observe_pcidevices_controller
    from reconciler.observe.nodes import all_node_labels

    api = host.cluster_api
    if api is None:
        raise UsageError("export --observed cluster needs a cluster: pass --kubeconfig")
    recording = RecordingApi(api)
    started = time.time()
    reader = FleetReader(recording, kubevirt_namespace=host.options.kubevirt_namespace)
    nodes = sorted(all_node_labels(recording))
    reader.observe(nodes)  # every list the plan makes, whole (the nodes' errors are the plan's)
    observe_pcidevices_controller(recording)
    return recording.snapshot(taken_at=started, version=__version__)


def read_snapshot(path: Path, *, limit_age: float, now: float) -> tuple[SnapshotApi, float]:
    """The snapshot in ``path`` as a read-only cluster, and its time; a :class:`UsageError`
    naming the file and what is wrong (unreadable, too large, not a snapshot, too old)."""
    import orjson
    from jsonschema import Draft202012Validator

    from reconciler.desired import schema_path
    from reconciler.desired.source import read_file

    try:
        raw = read_file(path, limit=MAX_SNAPSHOT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--observed {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_SNAPSHOT_BYTES:
        raise UsageError(f"--observed {path}: larger than {MAX_SNAPSHOT_BYTES >> 20} MiB")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--observed {path}: not JSON: {excerpt(str(exc))}") from None
    del raw
    schema = json.loads(schema_path(SCHEMA).read_text(encoding="utf-8"))
    # The envelope against the schema; the items (a fleet's 265,000) by check_items.
    envelope = doc
    if isinstance(doc, dict) and isinstance(doc.get("resources"), list):
        envelope = {
            **doc,
            "resources": [
                {**r, "items": []} if isinstance(r, dict) and isinstance(r.get("items"), list)
                else r
                for r in doc["resources"]
            ],
        }  # fmt: skip
    error = next(iter(Draft202012Validator(schema).iter_errors(envelope)), None)
    if error is not None:
        where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the document"
        raise UsageError(
            f"--observed {path}: not a vgpuctl cluster snapshot ('vgpuctl export --observed "
            f"cluster -o snapshot'): {safe(where)}: {excerpt(error.message)}"
        )
    problems = check_items(doc)
    if problems:
        raise UsageError(f"--observed {path}: {problems[0]}")
    try:
        when = taken_at(doc)
    except ValueError as exc:
        raise UsageError(f"--observed {path}: {exc}") from None
    age = now - when
    if age < -CLOCK_SKEW_S:
        raise UsageError(
            f"--observed {path}: taken at {doc['takenAt']}, {age_text(-age)} in the future: "
            "check the clocks of the machine that took it and of this one"
        )
    if age > limit_age:
        raise UsageError(
            f"--observed {path}: taken at {doc['takenAt']}, {age_text(age)} ago, older than "
            f"--max-snapshot-age {age_text(limit_age)}: take it again (vgpuctl export --observed "
            "cluster -o snapshot), or allow an older one with --max-snapshot-age"
        )
    return SnapshotApi(doc, source=str(path)), when


def snapshot_document(host: Host) -> str:
    import orjson

    return orjson.dumps(take_snapshot(host)).decode() + "\n"
