"""The Markdown renderer (``cli/markdown.py``) on hand-built plans: blocked steps highlighted,
failures and converged nodes summarised, and text from outside unable to escape its cell (the
comment is posted on a pull request: no HTML, no link, no mention, no broken table)."""

from __future__ import annotations

from reconciler.cli.markdown import cell, plans_markdown
from reconciler.model import (
    Blocked,
    Observation,
    PciAddress,
    Plan,
    PlanError,
    VgpuCreate,
    VgpuRemove,
)

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
