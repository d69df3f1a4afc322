"""Plans as GitHub-flavoured Markdown (``plan -o markdown``), for a pull request's comment.

Summary first (nodes, nodes with changes, the totals; a warning callout when steps are blocked,
a caution callout when a node could not be planned), then one section per node with changes: a
table of its GPUs' changes (blocked steps in bold, marked ⛔), and its cluster writes,
device-plugin refreshes and notes folded in ``<details>``. Nodes without changes are one folded
list, so a fleet's comment stays short.

Every value from outside (reasons, object names, holders, the desired state's names) is
escaped twice: control characters as in the terminal (:func:`render.safe`), then Markdown and
HTML (:func:`cell`), so a reason cannot close a table cell, open a link or inject HTML into the
comment. What GitHub makes of plain text is neutralised too: a word joiner (U+2060, invisible)
after every ``@`` and ``#``, inside ``www.``, after the ``:`` of ``://`` and after ``GH-``, so a
holder such as ``@org/admins see https://evil.example`` notifies no one, links nowhere and
references no issue (an entity such as ``&#64;`` would not do: GitHub decodes it first).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from reconciler.cli.render import cluster_lines, gpu_sections, plugin_lines, safe
from reconciler.model import Inventory, Plan, ReconcilerError

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


def _counts(plan: Plan) -> str:
    s = plan.summary
    return f"{s.create} to create, {s.change} to change, {s.remove} to remove, {s.blocked} blocked"


def plans_markdown(
    plans: Sequence[Plan],
    *,
    failures: Mapping[str, ReconcilerError] | None = None,
    inventories: Mapping[str, Inventory] | None = None,
    observed: str,
) -> str:
    """The comment for ``plans`` (and the nodes in ``failures``), observed from ``observed``
    (``host``, ``cluster`` or ``harvester``)."""
    failures = failures or {}
    inventories = inventories or {}
    changed = [p for p in plans if p.has_changes]
    totals = {"create": 0, "change": 0, "remove": 0, "blocked": 0}
    for p in plans:
        for key, value in p.summary.to_json().items():
            totals[key] += value
    nodes = len(plans) + len(failures)
    out = [
        "## vgpuctl plan",
        "",
        f"**{nodes} node{'s' * (nodes != 1)}, {len(changed)} with changes: "
        f"{totals['create']} to create, {totals['change']} to change, {totals['remove']} to "
        f"remove, {totals['blocked']} blocked** (observed: {cell(observed)})",
    ]
    blocked = [p for p in plans if p.blocked]
    if blocked:
        where = ", ".join(cell(p.node) for p in blocked)
        out += [
            "",
            "> [!WARNING]",
            f"> {totals['blocked']} step{'s' * (totals['blocked'] != 1)} blocked on {where}: a "
            "VM uses the vGPU, or the step waits for one that does. They are not applied.",
        ]
    if failures:
        where = ", ".join(cell(n) for n in sorted(failures))
        out += ["", "> [!CAUTION]", f"> Could not be planned: {where}."]
    for plan in changed:
        out += ["", *_node(plan, inventories.get(plan.node))]
    for name in sorted(failures):
        out += ["", f"### Node {cell(name)}: cannot be planned", ""]
        out += [f"- {cell(line)}" for line in failures[name].lines()]
    unchanged = [p.node for p in plans if not p.has_changes]
    if unchanged:
        n = len(unchanged)
        out += [
            "",
            "<details>",
            f"<summary>{n} node{'s' * (n != 1)} without changes</summary>",
            "",
            ", ".join(cell(name) for name in unchanged),
            "",
            "</details>",
        ]
    return "\n".join(out) + "\n"


def _node(plan: Plan, inventory: Inventory | None) -> list[str]:
    out = [f"### Node {cell(plan.node)}: {_counts(plan)}"]
    sections = gpu_sections(plan, inventory=inventory)
    if sections:
        out += ["", "| | GPU | Change | Why |", "| :-: | --- | --- | --- |"]
        for section in sections:
            for line in section.lines:
                if line.blocked:
                    out.append(
                        f"| ⛔ | {cell(section.heading)} | **blocked: {cell(line.title)}** "
                        f"| **{cell(line.reason)}** |"
                    )
                else:  # the symbol is ours (+, -, -/+, ~): shown as code, as in the terminal
                    out.append(
                        f"| `{line.symbol}` | {cell(section.heading)} | {cell(line.title)} "
                        f"| {cell(line.reason)} |"
                    )
    for title, lines in (
        ("Cluster objects", cluster_lines(plan)),
        ("Device plugins", plugin_lines(plan)),
    ):
        if lines:
            out += _details(title, [line.removeprefix("    ") for line in lines], code=True)
    if plan.notes:
        out += _details(f"Notes ({len(plan.notes)})", [f"- {cell(n)}" for n in plan.notes])
    return out


def _details(title: str, body: Sequence[str], *, code: bool = False) -> list[str]:
    """A folded block; ``code`` shows ``body`` as a fenced text block (already escaped for a
    terminal: nothing in a fence is Markdown, and a fence line inside it is broken)."""
    lines = [line.replace("```", "`\u200b``") for line in body] if code else list(body)
    inner = ["```text", *lines, "```"] if code else lines
    return ["", "<details>", f"<summary>{cell(title)}</summary>", "", *inner, "", "</details>"]
