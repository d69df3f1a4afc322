"""Plans as GitHub-flavoured Markdown (``plan -o markdown``), for a pull request's comment.

Summary first (nodes, nodes with changes, the totals; a warning callout when steps are blocked,
a caution callout when a node could not be planned), then one section per node with changes: a
heading counting its table's rows (its GPU steps) apart from its cluster writes, a table of its
GPUs' changes (blocked steps in bold, marked ⛔), and its cluster writes, device-plugin refreshes
and notes folded in ``<details>``. Nodes without changes are one folded list, so a fleet's
comment stays short. A cluster object's field whose values are long (a VGPUNodeState's
``status.vgpus``, a list of every vGPU) is said as what changed (``+ 2 vGPUs NVIDIA A2-8Q``,
``32 added (0 → 32 entries)``), never as its JSON.

GitHub refuses a comment over 65,536 characters: the comment is bounded to ``max_bytes`` bytes
of UTF-8 (a character is at least a byte). When the whole of it does not fit, detail is left
out in this order, each kind from the last node with changes back to the first, until it fits
(:data:`FOLD_ORDER`): the device-plugin refreshes, the cluster writes, the notes, the GPU steps
that are not blocked, then the nodes' headings (every node left with its heading alone is
listed instead, on the line of its counts, among the nodes shown by their counts), and last the
names of the nodes without changes. A note after the summary says what was left out and where
the full plan is. Never left out: the summary and its callouts, every blocked step, every
node's counts (in its heading or in that list), and what made a node unplannable; when those
alone are over the bound they are written whole (and a warning says so on stderr).

Every value from outside (reasons, object names, holders, the desired state's names) is
escaped twice: control characters as in the terminal (:func:`render.safe`), then Markdown and
HTML (:func:`cell`), so a reason cannot close a table cell, open a link or inject HTML into the
comment. What GitHub makes of plain text is neutralised too: a word joiner (U+2060, invisible)
after every ``@`` and ``#``, inside ``www.``, after the ``:`` of ``://`` and after ``GH-``, so a
holder such as ``@org/admins see https://evil.example`` notifies no one, links nowhere and
references no issue (an entity such as ``&#64;`` would not do: GitHub decodes it first).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.cli.render import cluster_lines, gpu_sections, plugin_lines, safe
from reconciler.model import (
    CrCreate,
    CrDelete,
    CrUpdate,
    Inventory,
    KubevirtUpdate,
    Plan,
    ReconcilerError,
)
from reconciler.model.plan import FieldChange
from reconciler.model.record import record

#: GitHub's limit on a comment's body, in characters (an API call with a longer one is refused:
#: "Body is too long (maximum is 65536 characters)").
GITHUB_COMMENT_LIMIT = 65_536
#: ``plan -o markdown``'s default ``--max-bytes``: GitHub's limit less room for what a posting
#: script adds around the plan (examples/gitops/.github/vgpuctl-comment.py: a hidden marker, a
#: head saying the commit and the exit code, a foot linking the run: under 2 kB).
DEFAULT_MAX_BYTES = 60_000
#: What is left out, first to last, of the nodes with changes (each kind from the last node
#: back to the first), then of the nodes without (their names).
FOLD_ORDER = ("plugins", "cluster", "notes", "rows", "heading", "unchanged")
_LEFT_OUT = {
    "plugins": "the device-plugin refreshes of {n}",
    "cluster": "the cluster writes of {n} (counted in their headings)",
    "notes": "the notes of {n}",
    "rows": "the GPU steps that are not blocked of {n} (counted in their headings)",
    "heading": "the sections of {n}, listed by their counts instead",
    "unchanged": "the names of the {n} without changes",
}

#: Backslash-escaped anywhere: what can open inline syntax in GitHub-flavoured Markdown (code,
#: emphasis, links and images, strikethrough, a table cell's end) and the escape itself.
_INLINE = frozenset("\\`*_[]|~")
#: Replaced by entities: HTML (``<``, ``&``) and what could end an attribute.
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}
#: U+2060 WORD JOINER: invisible, no word character, and not in any name vgpuctl reads (those
#: arrive through :func:`render.safe`, which escapes it as ``\u2060``).
_JOINER = "\u2060"
#: Where GitHub turns plain text into a notification, a link or a reference: an ``@`` (a user,
#: a team, an e-mail address: ``a@b.com``, ``mailto:``/``xmpp:``), a ``#`` (``#12``,
#: ``org/repo#12``), the ``://`` of a URL (``http``, ``https``, ``ftp``), ``www.`` and ``GH-12``.
#: A joiner goes after each ``@``, ``#`` and such ``:``, and between ``www`` and its ``.`` and
#: ``GH-`` and its number; the text reads the same.
_AUTOLINK = re.compile(r"[@#]|:(?=//)|(?<=www)(?=\.)|(?<=gh-)(?=\d)", re.IGNORECASE)
#: What starts a block when it opens a line (a heading, a list, a thematic break, a setext
#: underline): escaped there only.
_BLOCK_START = re.compile(r"^(#|[-+=]|\d+[.)])")


def cell(text: str) -> str:
    """``text`` safe in a Markdown table cell or list item: one line, nothing it can start
    (no HTML, no Markdown, no mention, autolink or issue reference)."""
    out = []
    plain = _AUTOLINK.sub(lambda m: m.group() + _JOINER, safe(text).replace("\n", " "))
    for ch in plain:
        if ch in _HTML:
            out.append(_HTML[ch])
        elif ch in _INLINE:
            out.append("\\" + ch)
        else:
            out.append(ch)
    line = "".join(out)
    match = _BLOCK_START.match(line)
    if match is not None:
        head = match.group(1)
        line = head[:-1] + "\\" + head[-1] + line[len(head) :]
    return line


#: A table row's symbol (render.Line) as the count it adds to.
_ROW_COUNT = {"+": "create", "-": "remove", "-/+": "change", "~": "change"}
_COUNT_ORDER = ("create", "change", "remove", "blocked")
#: A field value whose JSON is longer is said as what changed, not dumped.
_SHORT = 80


def _counted(n: int, what: str, counts: Counter[str]) -> str:
    parts = ", ".join(f"{counts[k]} to {k}" if k != "blocked" else f"{counts[k]} blocked"
                      for k in _COUNT_ORDER if counts[k])  # fmt: skip
    return f"{n} {what}{'s' * (n != 1)}" + (f" ({parts})" if parts else "")


def _cluster_counts(plan: Plan) -> Counter[str]:
    """The plan's cluster writes by kind, as render.cluster_lines shows them (one each)."""
    counts: Counter[str] = Counter()
    for a in plan.actions:
        if isinstance(a, CrCreate):
            counts["create"] += 1
        elif isinstance(a, CrDelete):
            counts["remove"] += 1
        elif isinstance(a, KubevirtUpdate | CrUpdate):
            counts["change"] += 1
    return counts


def _short(value: object) -> bool:
    return len(json.dumps(value, ensure_ascii=False)) <= _SHORT


def _abridged(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"
    return safe(text if not isinstance(value, str) else f'"{text}"')


def describe_change(change: FieldChange) -> str:
    """A cluster object's field change for the comment: ``path: old → new`` when both are
    short; a list (``status.vgpus``, ``status.vfAddresses``) as what it gains and loses —
    vGPU entries (objects with a ``profile``) counted per profile, ``+ 2 vGPUs NVIDIA A2-8Q``,
    other entries counted, ``32 added (0 → 32 entries)``; anything else long cut short."""
    path, old, new = safe(change.path), change.old, change.new
    if _short(old) and _short(new):
        return f"{path}: {_abridged(old)} → {_abridged(new)}"
    if isinstance(old, list | None) and isinstance(new, list | None):
        return f"{path}: {_list_change(old or [], new or [])}"
    return f"{path}: {_abridged(old)} → {_abridged(new)}"


def _profile(entry: object) -> str | None:
    if isinstance(entry, dict) and isinstance(entry.get("profile"), str):
        return str(entry["profile"])
    return None


def _list_change(old: list[Any], new: list[Any]) -> str:
    def key(v: object) -> str:
        return json.dumps(v, sort_keys=True, ensure_ascii=False)

    before, after = Counter(map(key, old)), Counter(map(key, new))
    added, removed = after - before, before - after
    if all(_profile(e) is not None for e in (*old, *new)):
        had = Counter(_profile(e) for e in old)
        has = Counter(_profile(e) for e in new)
        moved = Counter(_profile(json.loads(k)) for k in added.elements())
        gone = Counter(_profile(json.loads(k)) for k in removed.elements())
        parts = []
        for name in sorted(set(had) | set(has), key=str):
            net = has[name] - had[name]
            changed = min(moved[name], gone[name])
            label = safe(name)
            if net:
                parts.append(f"{'+' if net > 0 else '-'} {abs(net)} vGPU{'s' * (abs(net) != 1)} "
                             f"{label}")  # fmt: skip
            if changed:
                parts.append(f"~ {changed} vGPU{'s' * (changed != 1)} {label} changed")
        return ", ".join(parts) or "reordered"
    plus, minus = sum(added.values()), sum(removed.values())
    changed = min(plus, minus)
    parts = [
        f"{n} {word}"
        for n, word in (
            (plus - changed, "added"),
            (minus - changed, "removed"),
            (changed, "changed"),
        )
        if n
    ]
    entries = "entry" if len(new) == 1 else "entries"
    return f"{', '.join(parts) or 'reordered'} ({len(old)} → {len(new)} {entries})"


@record(frozen=False, slots=True)
class _Node:
    """A node's section, in the blocks the bound may leave out (each a list of lines)."""

    name: str
    counts: str  # its heading's counts
    rows: list[tuple[str, bool]]  # its table's rows, and whether each is a blocked step's
    details: dict[str, list[str]]  # "cluster", "plugins", "notes"
    heading: bool = True  # False: listed by its counts among the nodes shown so

    def lines(self) -> list[str]:
        out = ["", f"### Node {cell(self.name)}: {self.counts}"]
        if self.rows:
            out += ["", "| | GPU | Change | Why |", "| :-: | --- | --- | --- |"]
            out += [row for row, _ in self.rows]
        for kind in ("cluster", "plugins", "notes"):
            out += self.details.get(kind, [])
        return out

    @property
    def blocked(self) -> bool:
        return any(blocked for _, blocked in self.rows)


def _size(lines: Sequence[str]) -> int:
    """The bytes ``lines`` take in the comment (each line and its newline)."""
    return sum(len(line.encode()) + 1 for line in lines)


def plans_markdown(
    plans: Sequence[Plan],
    *,
    failures: Mapping[str, ReconcilerError] | None = None,
    inventories: Mapping[str, Inventory] | None = None,
    observed: str,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    full_plan: str | None = None,
) -> str:
    """The comment for ``plans`` (and the nodes in ``failures``), observed from ``observed``
    (``host``, ``cluster`` or ``harvester``), at most ``max_bytes`` bytes (None or 0: no
    bound) but for what is never left out (the module's docstring); ``full_plan`` says where
    the whole plan is, for the note a shortened comment has."""
    failures = failures or {}
    inventories = inventories or {}
    changed = [p for p in plans if p.has_changes]
    totals = {"create": 0, "change": 0, "remove": 0, "blocked": 0}
    for p in plans:
        for key, value in p.summary.to_json().items():
            totals[key] += value
    nodes = len(plans) + len(failures)
    head = [
        "## vgpuctl plan",
        "",
        f"**{nodes} node{'s' * (nodes != 1)}, {len(changed)} with changes: "
        f"{totals['create']} to create, {totals['change']} to change, {totals['remove']} to "
        f"remove, {totals['blocked']} blocked** (observed: {cell(observed)})",
    ]
    blocked = [p for p in plans if p.blocked]
    if blocked:
        where = ", ".join(cell(p.node) for p in blocked)
        head += [
            "",
            "> [!WARNING]",
            f"> {totals['blocked']} step{'s' * (totals['blocked'] != 1)} blocked on {where}: a "
            "VM uses the vGPU, or the step waits for one that does. They are not applied.",
        ]
    if failures:
        where = ", ".join(cell(n) for n in sorted(failures))
        head += ["", "> [!CAUTION]", f"> Could not be planned: {where}."]
    sections = [_node(plan, inventories.get(plan.node)) for plan in changed]
    tail: list[str] = []
    for name in sorted(failures):
        tail += ["", f"### Node {cell(name)}: cannot be planned", ""]
        tail += [f"- {cell(line)}" for line in failures[name].lines()]
    unchanged = [p.node for p in plans if not p.has_changes]
    bound = _Bound(head, sections, tail, unchanged, full_plan)
    if max_bytes:
        bound.fit(max_bytes)
    return bound.text()


class _Bound:
    """The comment's parts and what of them is left out (:data:`FOLD_ORDER`), its size kept
    as parts go so that fitting a fleet's comment renders it once."""

    def __init__(
        self,
        head: list[str],
        sections: list[_Node],
        tail: list[str],
        unchanged: list[str],
        full_plan: str | None,
    ) -> None:
        self.head, self.sections, self.tail = head, sections, tail
        self.unchanged, self.unchanged_names = unchanged, True
        self.full_plan = full_plan or "`vgpuctl plan` of the same files with -o json or -o text"
        self.left_out: Counter[str] = Counter()

    def _unchanged_lines(self) -> list[str]:
        n = len(self.unchanged)
        if not n:
            return []
        names = ", ".join(cell(name) for name in self.unchanged) if self.unchanged_names else (
            "(names left out)")  # fmt: skip
        return ["", "<details>", f"<summary>{n} node{'s' * (n != 1)} without changes</summary>",
                "", names, "", "</details>"]  # fmt: skip

    def _grouped(self) -> list[str]:
        groups: dict[str, list[str]] = {}
        for node in self.sections:
            if not node.heading:
                groups.setdefault(node.counts, []).append(cell(node.name))
        if not groups:
            return []
        out = ["", "### Nodes shown by their counts", ""]
        for counts, names in groups.items():
            out.append(f"- {counts}: {', '.join(names)}")
        return out

    def _note(self) -> list[str]:
        if not self.left_out:
            return []
        what = "; ".join(
            _LEFT_OUT[kind].format(n=f"{n} node{'s' * (n != 1)}")
            for kind in FOLD_ORDER
            if (n := self.left_out[kind])
        )
        return [
            "",
            "> [!NOTE]",
            f"> Shortened to fit its size: left out {what}. Every blocked step and every "
            f"node's counts are shown. The full plan: {cell(self.full_plan)}.",
        ]

    def text(self) -> str:
        out = [*self.head, *self._note()]
        for node in self.sections:
            if node.heading:
                out += node.lines()
        out += self._grouped() + self.tail + self._unchanged_lines()
        return "\n".join(out) + "\n"

    def fit(self, max_bytes: int) -> None:
        """Leave out what :data:`FOLD_ORDER` says, in its order, until the comment is at most
        ``max_bytes`` bytes (its size is added up as parts go, not rendered again)."""
        sizes = [_size(n.lines()) for n in self.sections]
        fixed = _size(self.head) + _size(self.tail)
        grouped = 0  # the bytes of the list of nodes shown by their counts

        def total() -> int:
            unchanged = _size(self._unchanged_lines())
            return fixed + sum(sizes) + grouped + unchanged + _size(self._note())

        for kind in FOLD_ORDER:
            if kind == "unchanged":
                if self.unchanged and total() > max_bytes:
                    self.unchanged_names = False
                    self.left_out[kind] = len(self.unchanged)
                break
            for i in reversed(range(len(self.sections))):
                if total() <= max_bytes:
                    return
                node = self.sections[i]
                if node.details.get(kind):
                    node.details[kind] = []
                elif kind == "rows" and not all(blocked for _, blocked in node.rows):
                    node.rows = [(row, True) for row, blocked in node.rows if blocked]
                elif kind == "heading" and node.heading and not node.blocked:
                    # Each node left with its heading alone goes to the list (one line a count),
                    # when that is shorter (it is for a fleet: nodes share their counts).
                    bare = [j for j, n in enumerate(self.sections) if n.heading and not n.blocked]
                    for j in bare:
                        self.sections[j].heading = False
                    if _size(self._grouped()) >= sum(sizes[j] for j in bare):
                        for j in bare:
                            self.sections[j].heading = True
                        break
                    for j in bare:
                        sizes[j] = 0
                    self.left_out[kind] = len(bare)
                    grouped = _size(self._grouped())
                    break
                else:
                    continue
                self.left_out[kind] += 1
                sizes[i] = _size(node.lines()) if node.heading else 0
        if total() > max_bytes:
            print(
                f"warning: the Markdown plan is {total()} bytes, over --max-bytes {max_bytes}, "
                "with nothing more to leave out (every blocked step, every node's counts)",
                file=sys.stderr,
            )


def _node(plan: Plan, inventory: Inventory | None) -> _Node:
    rows: list[tuple[str, bool]] = []
    counts: Counter[str] = Counter()
    for section in gpu_sections(plan, inventory=inventory):
        for line in section.lines:
            if line.blocked:
                counts["blocked"] += 1
                row = (
                    f"| ⛔ | {cell(section.heading)} | **blocked: {cell(line.title)}** "
                    f"| **{cell(line.reason)}** |"
                )
            else:  # the symbol is ours (+, -, -/+, ~): shown as code, as in the terminal
                counts[_ROW_COUNT.get(line.symbol, "change")] += 1
                row = (
                    f"| `{line.symbol}` | {cell(section.heading)} | {cell(line.title)} "
                    f"| {cell(line.reason)} |"
                )
            rows.append((row, line.blocked))
    cluster = _cluster_counts(plan)
    heading = (
        f"{_counted(len(rows), 'GPU step', counts)} · "
        f"{_counted(sum(cluster.values()), 'cluster write', cluster)}"
    )
    details: dict[str, list[str]] = {}
    for kind, title, lines in (
        ("cluster", "Cluster objects", cluster_lines(plan, describe=describe_change)),
        ("plugins", "Device plugins", plugin_lines(plan)),
    ):
        if lines:
            details[kind] = _details(
                title, [line.removeprefix("    ") for line in lines], code=True
            )
    if plan.notes:
        details["notes"] = _details(
            f"Notes ({len(plan.notes)})", [f"- {cell(n)}" for n in plan.notes]
        )
    return _Node(plan.node, heading, rows, details)


def _details(title: str, body: Sequence[str], *, code: bool = False) -> list[str]:
    """A folded block; ``code`` shows ``body`` as a fenced text block (already escaped for a
    terminal: nothing in a fence is Markdown, and a fence line inside it is broken)."""
    lines = [line.replace("```", "`\u200b``") for line in body] if code else list(body)
    inner = ["```text", *lines, "```"] if code else lines
    return ["", "<details>", f"<summary>{cell(title)}</summary>", "", *inner, "", "</details>"]
