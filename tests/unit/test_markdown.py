"""The Markdown renderer (``cli/markdown.py``) on hand-built plans: blocked steps highlighted,
failures and converged nodes summarised, and text from outside unable to escape its cell (the
comment is posted on a pull request: no HTML, no link, no mention, no broken table)."""

from __future__ import annotations

from reconciler.cli.markdown import cell, describe_change, plans_markdown
from reconciler.model import (
    Blocked,
    Observation,
    PciAddress,
    Plan,
    PlanError,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.plan import FieldChange

GPU = PciAddress.parse("0000:08:00.0")
VF = PciAddress.parse("0000:08:00.5")


def test_a_blocked_step_is_bold_marked_and_announced_first() -> None:
    remove = VgpuRemove(target=str(VF), reason="in use by VM default/win11", gpu=GPU,
                        vf_index=1, type_name="NVIDIA A2-4Q", uuid="u5")  # fmt: skip
    create = VgpuCreate(target="0000:08:00.4", reason="VF hosts nothing; desired NVIDIA A2-4A",
                        gpu=GPU, vf_index=0, type_name="NVIDIA A2-4A", uuid="u4")  # fmt: skip
    plans = [
        Plan(
            "n1",
            "mdev",
            Observation("sha256:x"),
            actions=(create.numbered(1),),
            blocked=(Blocked(remove),),
        ),
        Plan("n2", "mdev", Observation("sha256:y")),
    ]
    text = plans_markdown(plans, observed="cluster")
    lines = text.splitlines()
    assert lines[2] == (
        "**2 nodes, 1 with changes: 1 to create, 0 to change, 0 to remove, 1 blocked** "
        "(observed: cluster)"
    )
    assert lines[4:6] == [
        "> [!WARNING]",
        "> 1 step blocked on n1: a VM uses the vGPU, or the step waits for one that does. "
        "They are not applied.",
    ]
    assert "| `+` | 0000:08:00.0 | vgpu 0000:08:00.4  NVIDIA A2-4A  (uuid u4) " in text
    assert (
        "| ⛔ | 0000:08:00.0 | **blocked: vgpu-remove 0000:08:00.5  NVIDIA A2-4Q** "
        "| **in use by VM default/win11** |"
    ) in lines
    assert lines[-6:] == ["<details>", "<summary>1 node without changes</summary>", "", "n2",
                          "", "</details>"]  # fmt: skip


def test_a_node_that_cannot_be_planned_is_a_caution_and_its_problems_are_listed() -> None:
    error = PlanError("GPU 0000:08:00.0 is not on this node")
    text = plans_markdown([], failures={"n3": error}, observed="cluster")
    assert "> [!CAUTION]\n> Could not be planned: n3." in text
    assert "### Node n3: cannot be planned\n\n- GPU 0000:08:00.0 is not on this node\n" in text


def test_text_from_outside_cannot_leave_its_cell() -> None:
    assert cell("a | b") == r"a \| b"
    assert cell("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    # A word joiner (U+2060, invisible) where GitHub would link, mention or reference.
    assert cell("[click](https://evil.example)") == "\\[click\\](https:\u2060//evil.example)"
    assert cell("ping @octocat") == "ping @\u2060octocat"
    assert (
        cell("a@b.com www.x.io fix #12, GH-3")
        == "a@\u2060b.com www\u2060.x.io fix #\u206012, GH-\u20603"
    )
    assert cell("`code` *bold* _it_ ~~s~~") == r"\`code\` \*bold\* \_it\_ \~\~s\~\~"
    assert cell("# heading") == "\\#\u2060 heading"
    assert cell("- item") == r"\- item"
    assert cell("3. item") == r"3\. item"
    assert cell("two\nlines\x1b[2J") == r"two\\nlines\\x1b\[2J"
    # A reason with all of it stays one row of four cells.
    bad = VgpuCreate(target="0000:08:00.4", reason="x | y\n| z | <b>", gpu=GPU, vf_index=0,
                     type_name="NVIDIA A2-4A", uuid="u4")  # fmt: skip
    text = plans_markdown(
        [Plan("n1", "mdev", Observation("s"), actions=(bad.numbered(1),))], observed="host"
    )
    (row,) = [line for line in text.splitlines() if line.startswith("| `+`")]
    assert row.replace(r"\|", "").count("|") == 5


# ---------------------------------------------------------------- issue 34, item 1

#: Notes longer than the note a shortened comment gets: leaving one out makes it shorter.
NOTE_ONE = "first note, " * 20
NOTE_TWO = "second note, " * 20
CREATE_ROW = (
    "| `+` | 0000:08:00.0 | vgpu 0000:08:00.4  NVIDIA A2-4A  (uuid u4) "
    "| VF hosts nothing; desired NVIDIA A2-4A |"
)
BLOCKED_ROW = (
    "| ⛔ | 0000:08:00.0 | **blocked: vgpu-remove 0000:08:00.5  NVIDIA A2-4Q** "
    "| **in use by VM default/win11** |"
)


def _fleet(extra: int = 0) -> list[Plan]:
    """n1: a create and a blocked removal, a long note; n2 (and ``extra`` more like it): a
    create and a long note; n9: nothing to do."""
    remove = VgpuRemove(target=str(VF), reason="in use by VM default/win11", gpu=GPU,
                        vf_index=1, type_name="NVIDIA A2-4Q", uuid="u5")  # fmt: skip
    create = VgpuCreate(target="0000:08:00.4", reason="VF hosts nothing; desired NVIDIA A2-4A",
                        gpu=GPU, vf_index=0, type_name="NVIDIA A2-4A", uuid="u4")  # fmt: skip
    seen = Observation("sha256:x")
    n1 = Plan("n1", "mdev", seen, actions=(create.numbered(1),), blocked=(Blocked(remove),),
              notes=(NOTE_ONE,))  # fmt: skip
    others = [Plan(f"n{i}", "mdev", seen, actions=(create.numbered(1),), notes=(NOTE_TWO,))
              for i in range(2, 3 + extra)]  # fmt: skip
    return [n1, *others, Plan("n9", "mdev", seen)]


HEAD = [
    "## vgpuctl plan",
    "",
    "**3 nodes, 2 with changes: 2 to create, 0 to change, 0 to remove, 1 blocked** "
    "(observed: cluster)",
    "",
    "> [!WARNING]",
    "> 1 step blocked on n1: a VM uses the vGPU, or the step waits for one that does. They "
    "are not applied.",
]
TABLE = ["", "| | GPU | Change | Why |", "| :-: | --- | --- | --- |"]
UNCHANGED = ["", "<details>", "<summary>1 node without changes</summary>", "", "n9", "",
             "</details>"]  # fmt: skip


def _note(what: str) -> list[str]:
    return [
        "",
        "> [!NOTE]",
        f"> Shortened to fit its size: left out {what}. Every blocked step and every node's "
        "counts are shown. The full plan: the run's artifact.",
    ]


def _notes(text: str) -> list[str]:
    return ["", "<details>", "<summary>Notes (1)</summary>", "", f"- {text}", "", "</details>"]


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def test_a_heading_counts_its_tables_rows_apart_from_cluster_writes() -> None:
    text = plans_markdown(_fleet(), observed="cluster", max_bytes=0)
    assert text == _text([
        *HEAD,
        "",
        "### Node n1: 2 GPU steps (1 to create, 1 blocked) · 0 cluster writes",
        *TABLE, CREATE_ROW, BLOCKED_ROW, *_notes(NOTE_ONE),
        "",
        "### Node n2: 1 GPU step (1 to create) · 0 cluster writes",
        *TABLE, CREATE_ROW, *_notes(NOTE_TWO),
        *UNCHANGED,
    ])  # fmt: skip


def test_the_bound_leaves_out_notes_then_unblocked_rows_from_the_last_node_back() -> None:
    # The notes of n2 only: the bound is the size of that comment.
    notes_of_n2 = _text([
        *HEAD, *_note("the notes of 1 node"),
        "",
        "### Node n1: 2 GPU steps (1 to create, 1 blocked) · 0 cluster writes",
        *TABLE, CREATE_ROW, BLOCKED_ROW, *_notes(NOTE_ONE),
        "",
        "### Node n2: 1 GPU step (1 to create) · 0 cluster writes",
        *TABLE, CREATE_ROW,
        *UNCHANGED,
    ])  # fmt: skip
    bound = len(notes_of_n2.encode())
    text = plans_markdown(_fleet(), observed="cluster", max_bytes=bound,
                          full_plan="the run's artifact")  # fmt: skip
    assert text == notes_of_n2
    # One byte less: n1's notes go too, then n2's row, then n1's unblocked row (its blocked
    # one stays, and both headings with their counts).
    rows = "the GPU steps that are not blocked of 2 nodes (counted in their headings)"
    least = _text([
        *HEAD, *_note(f"the notes of 2 nodes; {rows}"),
        "",
        "### Node n1: 2 GPU steps (1 to create, 1 blocked) · 0 cluster writes",
        *TABLE, BLOCKED_ROW,
        "",
        "### Node n2: 1 GPU step (1 to create) · 0 cluster writes",
        *UNCHANGED,
    ])  # fmt: skip
    text = plans_markdown(_fleet(), observed="cluster", max_bytes=len(least.encode()),
                          full_plan="the run's artifact")  # fmt: skip
    assert text == least
    # Below what must stay: the names of the nodes without changes go, then nothing more.
    text = plans_markdown(_fleet(), observed="cluster", max_bytes=100,
                          full_plan="the run's artifact")  # fmt: skip
    assert BLOCKED_ROW in text and "### Node n2: 1 GPU step (1 to create)" in text
    assert "the names of the 1 node without changes" in text
    assert "<summary>1 node without changes</summary>\n\n(names left out)\n" in text


def test_nodes_sharing_their_counts_are_listed_on_one_line() -> None:
    plans = _fleet(extra=3)  # n2..n5 alike
    head = [line.replace("**3 nodes, 2 with changes: 2 to create", "**6 nodes, 5 with "
                         "changes: 5 to create") for line in HEAD]  # fmt: skip
    rows = "the GPU steps that are not blocked of 5 nodes (counted in their headings)"
    grouped = _text([
        *head,
        *_note(f"the notes of 5 nodes; {rows}; the sections of 4 nodes, listed by their "
               "counts instead"),
        "",
        "### Node n1: 2 GPU steps (1 to create, 1 blocked) · 0 cluster writes",
        *TABLE, BLOCKED_ROW,
        "",
        "### Nodes shown by their counts",
        "",
        "- 1 GPU step (1 to create) · 0 cluster writes: n2, n3, n4, n5",
        *UNCHANGED,
    ])  # fmt: skip
    text = plans_markdown(plans, observed="cluster", max_bytes=len(grouped.encode()),
                          full_plan="the run's artifact")  # fmt: skip
    assert text == grouped


def test_a_long_list_field_is_said_as_what_changed() -> None:
    def vgpu(vf: int, profile: str, in_use: bool = False) -> dict[str, object]:
        return {"gpu": "0000:08:00.0", "vf": f"0000:08:00.{vf}", "vfIndex": vf - 4,
                "profile": profile, "uuid": f"u{vf}", "inUse": in_use}  # fmt: skip

    before = [vgpu(4, "NVIDIA A2-4Q"), vgpu(5, "NVIDIA A2-4Q")]
    after = [vgpu(4, "NVIDIA A2-8Q"), vgpu(5, "NVIDIA A2-8Q", True)]
    assert (
        describe_change(FieldChange("status.vgpus", before, after))
        == "status.vgpus: - 2 vGPUs NVIDIA A2-4Q, + 2 vGPUs NVIDIA A2-8Q"
    )
    assert (
        describe_change(FieldChange("status.vgpus", None, [vgpu(4, "NVIDIA A2-8Q")]))
        == "status.vgpus: + 1 vGPU NVIDIA A2-8Q"
    )
    # Same profiles, an entry changed (a VM took one): said so, not dumped.
    assert (
        describe_change(
            FieldChange("status.vgpus", before, [before[0], vgpu(5, "NVIDIA A2-4Q", True)])
        )
        == "status.vgpus: ~ 1 vGPU NVIDIA A2-4Q changed"
    )
    vfs = [f"0000:41:0{i // 8}.{i % 8}" for i in range(4, 36)]
    assert (
        describe_change(FieldChange("status.vfAddresses", None, vfs))
        == "status.vfAddresses: 32 added (0 → 32 entries)"
    )
    # Short values as they are.
    assert describe_change(FieldChange("spec.enabled", False, True)) == "spec.enabled: false → true"
    assert describe_change(FieldChange("a", "x", None)) == 'a: "x" → null'


def test_the_default_bound_is_the_renderers_and_fits_githubs_limit() -> None:
    from reconciler.cli.main import build_parser
    from reconciler.cli.markdown import DEFAULT_MAX_BYTES, GITHUB_COMMENT_LIMIT

    assert build_parser().parse_args(["plan", "f.yaml"]).max_bytes == DEFAULT_MAX_BYTES
    # Room for what the example's comment script adds (marker, commit, caution, foot).
    assert DEFAULT_MAX_BYTES + 2_000 <= GITHUB_COMMENT_LIMIT == 65_536
