"""What a pull request's comment (``plan -o markdown``) shows of outside text notifies no one,
links nowhere and references no issue.

The attack (issue 28, item 4): a holder string such as ``@org/admins see https://evil.example``
in a node's VGPUNodeState (or a process name on the host, or a value an error quotes) reached the
bot's comment as a team notification and a live link: ``@`` was written as ``&#64;``, which
GitHub decodes before it resolves mentions, and bare URLs, ``www.``, e-mail addresses and
``#12`` were left alone. The comment is rendered here as GitHub renders it (cmark-gfm with its
autolink extension, raw HTML kept: GitHub sanitises it afterwards) and read as GitHub's mention
and reference filters do: the text outside code and links.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options

from reconciler.sim import hold
from tests.cluster_node import NODE_STATES, cluster_node, stored
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import NODE, SEED, make_sim, run_vgpuctl

#: Every kind of mention, autolink and reference GitHub makes of plain text.
HOSTILE = (
    "@org/admins see https://evil.example/x www.evil.example HTTP://a.example ftp://b.example "
    "mailto:c@d.example e@f.example xmpp:g@h.example #12 GH-3 org/repo#4 @octocat"
)
#: The seed's vGPU on VF 0000:08:00.5 (NVIDIA A2-4Q).
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
#: What GitHub's filters key on in text outside code and links: ``@name`` (a user, a team, an
#: e-mail address's domain), ``#12``/``org/repo#12``/``GH-12``, and what cmark-gfm's autolink
#: extension starts a URL at (a link it made would be an ``<a>``, and is looked for too).
TRIGGER = re.compile(r"@[a-z0-9]|#\d|\bgh-\d|://|\bwww\.", re.IGNORECASE)


class _Visible(HTMLParser):
    """The text of rendered HTML outside ``<code>``, ``<pre>`` and ``<a>`` (where GitHub
    resolves no mention or reference), and the links."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.links: list[str] = []
        self._inside = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(str(dict(attrs).get("href")))
        if tag in {"a", "code", "pre"}:
            self._inside += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in {"a", "code", "pre"}:
            self._inside -= 1

    def handle_data(self, data: str) -> None:
        if not self._inside:
            self.text.append(data)


def assert_inert(markdown: str, shown: str = HOSTILE) -> None:
    """``markdown``, rendered as GitHub renders a comment, has no link and nothing a mention
    or reference filter would resolve; the hostile text (``shown`` of it: an error quotes a
    bad value's first characters only) is still there to read."""
    html = cmarkgfm.markdown_to_html_with_extensions(
        markdown,
        options=Options.CMARK_OPT_UNSAFE,
        extensions=["table", "autolink", "strikethrough", "tagfilter", "tasklist"],
    )
    seen = _Visible()
    seen.feed(html)
    text = "".join(seen.text)
    assert seen.links == [], html
    assert TRIGGER.findall(text) == [], text
    assert shown in text.replace("\u2060", ""), text


def test_a_holder_on_the_host_is_inert_in_the_comment(tmp_path: Path) -> None:
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    node.ok("apply", SEED, "--yes")
    all_4a = tmp_path / "all-4a.yaml"
    all_4a.write_text(SEED.read_text().replace("NVIDIA A2-4Q", "NVIDIA A2-4A"))
    # A process names itself: the hold probe reports whatever it set.
    hold(node.dir, U5, holder=HOSTILE)
    markdown = node.ok("plan", all_4a, "-o", "markdown").stdout
    assert_inert(markdown)
    assert "in use by @\u2060org/admins" in markdown  # a word joiner: invisible


@pytest.mark.parametrize("field", ["holder", "vf"])
def test_a_node_states_text_is_inert_in_the_comment(
    field: str, tmp_path: Path, emu: ApiServerEmulator
) -> None:
    """Whoever may write a VGPUNodeState's status (a node's agent) writes what the fleet's
    comment shows: a holder in a blocked step's reason, or a bad value the node's error
    quotes."""
    node = cluster_node(tmp_path, emu)
    node.ok("apply", SEED, "--yes")
    state = stored(emu, NODE_STATES, NODE)
    (vgpu,) = [v for v in state["status"]["vgpus"] if v["uuid"] == U5]
    vgpu.update({"inUse": True, field: HOSTILE})
    emu.seed(state)
    all_4a = tmp_path / "all-4a.yaml"
    all_4a.write_text(SEED.read_text().replace("NVIDIA A2-4Q", "NVIDIA A2-4A"))
    res = run_vgpuctl(
        "plan", all_4a, "--observed", "cluster", "--kubeconfig", node.kubeconfig,
        "--sysfs-root", tmp_path / "no-such-host", "-o", "markdown",
    )  # fmt: skip
    assert res.returncode == (0 if field == "holder" else 1), res.stderr
    # An error quotes at most 80 characters of a bad value (model/clustertext.py).
    assert_inert(res.stdout, HOSTILE if field == "holder" else HOSTILE[:60])
    expected = "in use by @\u2060org" if field == "holder" else "is not a PCI address: '@\u2060org"
    assert expected in res.stdout
