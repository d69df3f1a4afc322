"""``vgpuctl validate FILE --explain NODE [--labels k=v,…]``: which entry configures each GPU.

Offline, like ``validate``: the node's labels are given on the command line (the cluster's are
not read), and its GPUs are not known, so each GPU entry is shown with what it matches (an
address, a model, a device ID). What it says, in order:

- whether the node's own entry under ``spec.nodes`` configures it (then every group is
  replaced for it: the groups that would have selected it are listed as replaced);
- else each node group and whether it selects the node, and why (names, labels), with the GPU
  entries of those that do;
- entries of two selecting groups that match GPUs alike and give them different layouts: the
  plan of this node would fail (exit 1);
- groups whose say depends on labels not given (exit 0: nothing is wrong, but the answer is
  partial, and the output says so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from reconciler.cli.render import safe
from reconciler.model import (
    Desired,
    DesiredGpu,
    GroupGpu,
    NodeGroup,
    SourceLocation,
    UsageError,
)

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


def explain(desired: Desired, node: str, labels: Mapping[str, str] | None) -> tuple[str, bool]:
    """The explanation of ``node`` as text, and whether its plan would certainly fail (two
    selecting groups give GPUs they match alike different layouts)."""
    lines: list[str] = []
    shown_labels = (
        "no labels given"
        if labels is None
        else ("labels " + ", ".join(f"{k}={v}" for k, v in labels.items()) or "no labels")
    )
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
    if selecting:
        lines.append(
            "  GPUs no entry matches are left alone; which GPUs an entry matches is known when "
            "the node is planned"
        )
    return "\n".join(lines) + "\n", bool(conflicts)


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
