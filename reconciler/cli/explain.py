"""``vgpuctl validate FILE --explain NODE [--labels k=v,…] [--inventory FILE]``: which entry
configures each GPU of a node.

Offline, like ``validate``: the node's labels are given on the command line (the cluster's are
not read). Without ``--inventory`` the node's GPUs are not known, so each GPU entry is shown
with what it matches (an address, a model, a device ID); with it (the node's GPUs as
``vgpuctl status -o json`` prints them), each GPU of the node is named with the entry that
configures it, exactly as planning that node would match them. What it says, in order:

- whether the node's own entry under ``spec.nodes`` configures it (then every group is
  replaced for it: the groups that would have selected it are listed as replaced);
- else each node group and whether it selects the node, and why (names, labels), with the GPU
  entries of those that do;
- entries of two selecting groups that match GPUs alike and give them different layouts: the
  plan of this node would fail (exit 1);
- groups whose say depends on labels not given (exit 0: nothing is wrong, but the answer is
  partial, and the output says so);
- with an inventory, each GPU of the node and the entry that configures it, or that none does
  (left alone), or the two entries that give it two layouts (exit 1).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from reconciler.cli.render import safe
from reconciler.model import (
    Desired,
    DesiredGpu,
    GroupGpu,
    Inventory,
    NodeGroup,
    SourceLocation,
    UsageError,
)
from reconciler.model.errors import excerpt

#: The largest inventory file read: an 8×L40S node's is 79 kB.
MAX_INVENTORY_BYTES = 8 * 1024 * 1024
#: Levels of nesting in an inventory, values included: it has 7 (``gpus[i].vfs[j].vgpu.uuid``).
MAX_INVENTORY_DEPTH = 64

_LABEL = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def parse_labels(text: str) -> Mapping[str, str]:
    """``k=v,k2=v2`` (``kubectl label``'s form; a value may be empty) as a mapping."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise UsageError(f"--labels: {safe(part)!r} is not KEY=VALUE")
        if not _LABEL.match(key) or len(key) > 317:
            raise UsageError(f"--labels: {safe(key)!r} is not a Kubernetes label key")
        if not _VALUE.match(value):
            raise UsageError(f"--labels: {safe(value)!r} is not a Kubernetes label value")
        labels[key] = value
    return MappingProxyType(labels)


def read_inventory(path: Path) -> Inventory:
    """A node's GPUs from ``vgpuctl status -o json`` output, checked against the inventory
    contract (``schemas/inventory.schema.json``). Raises :class:`UsageError` naming the file
    and what is wrong."""
    from reconciler.cli.files import nesting_depth
    from reconciler.desired.source import read_file

    try:  # a regular file only, never waited on, at most the bound read (cli/files.py)
        raw = read_file(path, limit=MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--inventory {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_INVENTORY_BYTES:
        raise UsageError(f"--inventory {path}: larger than {MAX_INVENTORY_BYTES >> 20} MiB")
    deep = f"--inventory {path}: nested more than {MAX_INVENTORY_DEPTH} levels deep"
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise UsageError(deep) from None
    except ValueError as exc:
        raise UsageError(f"--inventory {path}: not JSON: {excerpt(str(exc))}") from None
    if nesting_depth(doc, MAX_INVENTORY_DEPTH) > MAX_INVENTORY_DEPTH:  # before the schema's walk
        raise UsageError(deep)
    from jsonschema import Draft202012Validator

    from reconciler.desired import schema_path

    schema = json.loads(schema_path("inventory.schema.json").read_text(encoding="utf-8"))
    error = next(iter(Draft202012Validator(schema).iter_errors(doc)), None)
    if error is not None:
        where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the document"
        raise UsageError(
            f"--inventory {path}: not a vgpuctl inventory ('vgpuctl status -o json'): "
            f"{where}: {excerpt(error.message)}"
        )
    try:
        return Inventory.from_json(doc)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"--inventory {path}: not a vgpuctl inventory: {excerpt(str(exc))}"
        ) from None


def explain(
    desired: Desired,
    node: str,
    labels: Mapping[str, str] | None,
    inventory: Inventory | None = None,
) -> tuple[str, bool]:
    """The explanation of ``node`` as text, and whether its plan would certainly fail (two
    selecting groups give GPUs they match alike different layouts, or, with ``inventory``,
    one of its GPUs two layouts)."""
    lines: list[str] = []
    if labels is None:
        shown_labels = "no labels given"
    elif labels:
        shown_labels = "labels " + ", ".join(f"{k}={v}" for k, v in labels.items())
    else:
        shown_labels = "no labels"
    lines.append(f"Node {safe(node)} ({safe(shown_labels)}):")
    own = desired.nodes.get(node)
    if own is not None:
        lines.append(
            f"  configured by its own entry spec.nodes.{safe(node)}{_at(own.location)}; "
            "node groups do not apply to it"
        )
        for gpu in own.gpus:
            lines.append(f"    GPU {gpu.address}{_at(gpu.location)}: {_layout(gpu)}")
        if not own.gpus:
            lines.append("    (no GPU listed: every GPU of the node is left alone)")
        for group in desired.groups:
            verdict = _selects(group, node, labels)
            if verdict is not False:
                would = "would select it" if verdict else "may select it (its labels decide)"
                lines.append(
                    f"  node group '{safe(group.name)}'{_at(group.location)} {would}: "
                    "replaced by the node's own entry"
                )
        if inventory is not None:
            lines.append(f"  its GPUs ({len(inventory.gpus)}):")
            for observed in sorted(inventory.gpus, key=lambda g: g.address):
                listed = own.gpu(observed.address)
                lines.append(
                    f"    GPU {observed.address}{_model(observed.model)}: "
                    + (
                        f"its own entry{_at(listed.location)}"
                        if listed is not None
                        else "not listed: left alone"
                    )
                )
        return "\n".join(lines) + "\n", False

    selecting: list[NodeGroup] = []
    undecided: list[NodeGroup] = []
    for group in desired.groups:
        verdict = _selects(group, node, labels)
        head = f"  node group '{safe(group.name)}'{_at(group.location)}"
        if verdict is None:
            undecided.append(group)
            lines.append(
                f"{head} may select it: its labels ({safe(_labels(group))}) decide; pass "
                "--labels to say them"
            )
        elif verdict:
            selecting.append(group)
            lines.append(f"{head} selects it ({safe(group.selector)})")
            for entry in group.gpus:
                lines.append(f"    GPUs {safe(entry.match)}{_at(entry.location)}: {_layout(entry)}")
            if not group.gpus:
                lines.append("    (no GPU entry)")
        else:
            lines.append(f"{head} does not select it: {_why_not(group, node, labels or {})}")
    if not desired.groups:
        lines.append("  no entry of its own under spec.nodes and no node groups: not configured")
    elif not selecting and not undecided:
        lines.append("  no node group selects it: every GPU of the node is left alone")
    conflicts = _conflicts(selecting)
    lines.extend(conflicts)
    if inventory is not None:
        failing = _per_gpu(selecting, inventory, undecided=bool(undecided), lines=lines)
        return "\n".join(lines) + "\n", bool(conflicts) or failing
    if selecting:
        lines.append(
            "  GPUs no entry matches are left alone; which GPUs an entry matches is known when "
            "the node is planned (--inventory: the node's GPUs, from 'vgpuctl status -o json')"
        )
    return "\n".join(lines) + "\n", bool(conflicts)


def _per_gpu(
    selecting: Sequence[NodeGroup], inventory: Inventory, *, undecided: bool, lines: list[str]
) -> bool:
    """Each GPU of ``inventory`` with the entries that match it, as planning matches them
    (``plan.groups``); True when one gets two layouts."""
    failing = False
    entries = [entry for group in selecting for entry in group.gpus]
    maybe = " (groups its labels decide may add entries)" if undecided else ""
    lines.append(f"  its GPUs ({len(inventory.gpus)}){maybe}:")
    for gpu in sorted(inventory.gpus, key=lambda g: g.address):
        matching = [e for e in entries if e.match.matches(gpu)]
        head = f"    GPU {gpu.address}{_model(gpu.model)}: "
        if not matching:
            lines.append(head + "no entry matches it: left alone")
            continue
        first = matching[0]
        other = next((e for e in matching[1:] if e.layout != first.layout), None)
        if other is not None:
            failing = True
            lines.append(
                f"{head}error: node groups '{safe(first.group)}'{_at(first.location)} and "
                f"'{safe(other.group)}'{_at(other.location)} give it different layouts"
            )
            continue
        named = " and ".join(f"node group '{safe(e.group)}'{_at(e.location)}" for e in matching)
        lines.append(f"{head}{named}: {_layout(first)}")
    return failing


def _model(model: str | None) -> str:
    return f" ({safe(model)})" if model else ""


def _selects(group: NodeGroup, node: str, labels: Mapping[str, str] | None) -> bool | None:
    """Whether ``group`` selects ``node``; None: it depends on labels not given."""
    if not group.selector.admits_name(node):
        return False
    if group.selector.labels and labels is None:
        return None
    return group.selector.matches(node, labels or {})


def _why_not(group: NodeGroup, node: str, labels: Mapping[str, str]) -> str:
    if not group.selector.admits_name(node):
        return f"no name matches ({', '.join(safe(n) for n in group.selector.names)})"
    missing = [
        f"{k}={v}" if k not in labels else f"{k}={v} (the node has {labels[k]!r})"
        for k, v in group.selector.labels.items()
        if labels.get(k) != v
    ]
    return "labels not present: " + safe(", ".join(missing))


def _conflicts(groups: Sequence[NodeGroup]) -> list[str]:
    seen: dict[object, GroupGpu] = {}
    found: list[str] = []
    for group in groups:
        for entry in group.gpus:
            first = seen.setdefault(entry.match, entry)
            if first is not entry and first.layout != entry.layout:
                found.append(
                    f"  error: node groups '{safe(first.group)}'{_at(first.location)} and "
                    f"'{safe(entry.group)}'{_at(entry.location)} give the GPUs "
                    f"{safe(entry.match)} different layouts: planning this node fails"
                )
    return found


def _labels(group: NodeGroup) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.selector.labels.items())


def _layout(gpu: DesiredGpu | GroupGpu) -> str:
    if not gpu.sriov:
        return "SR-IOV disabled"
    parts = ["SR-IOV enabled"]
    if gpu.mode.value != "equal-size":
        parts.append(gpu.mode.value)
    if gpu.profiles:
        parts.append(", ".join(f"{safe(p)} × {n}" for p, n in gpu.profiles.items()))
    elif gpu.vgpus:
        parts.append(
            ", ".join(f"VF {safe(vf)} {safe(profile)}" for vf, profile in gpu.vgpus.items())
        )
    else:
        parts.append("no vGPUs")
    return "; ".join(parts)


def _at(location: SourceLocation | None) -> str:
    return f" ({safe(location)})" if location is not None else ""
