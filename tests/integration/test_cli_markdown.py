"""``vgpuctl plan -o markdown``: a plan as a pull request's comment (issue 15 item 4).

The expected comment for the seed's node is written by hand from the facts: a fresh A2 at
0000:08:00.0 with SR-IOV off (16 VFs when enabled, docs/domain.md §1), the seed's four 4 GB
vGPUs on functions 4-7 with their deterministic UUIDs (uuid5 of ``<node>/<VF>``, as the README
shows them), two profiles of two devices each for the device plugins, and no cluster.
"""

from __future__ import annotations

from tests.simnode import SEED, SimNode

U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
U6 = "ec1a8b91-526b-5a21-87ce-cae919e6adf0"
U7 = "f3bfb674-5828-5d43-bd4f-47222aae9d34"
GPU = "0000:08:00.0 (NVIDIA A2)"


def vgpu_row(function: int, profile: str, uuid: str) -> str:
    vf = f"0000:08:00.{function}"
    return (
        f"| `+` | {GPU} | vgpu {vf}  NVIDIA A2-{profile}  (uuid {uuid}) "
        f"| VF {vf} appears when SR-IOV is enabled; desired NVIDIA A2-{profile} |"
    )


EXPECTED = "\n".join(
    [
        "## vgpuctl plan",
        "",
        "**1 node, 1 with changes: 5 to create, 0 to change, 0 to remove, 0 blocked** "
        "(observed: host)",
        "",
        # The heading counts the table's rows (its GPU steps), its cluster writes apart.
        "### Node harvester-kgd9c: 5 GPU steps (5 to create) · 0 cluster writes",
        "",
        "| | GPU | Change | Why |",
        "| :-: | --- | --- | --- |",
        f"| `+` | {GPU} | sriov 0000:08:00.0  enable 16 VFs | SR-IOV is off; desired enabled |",
        vgpu_row(4, "4A", U4),
        vgpu_row(5, "4Q", U5),
        vgpu_row(6, "4A", U6),
        vgpu_row(7, "4Q", U7),
        "",
        "<details>",
        "<summary>Device plugins</summary>",
        "",
        "```text",
        "~ nvidia.com/NVIDIA_A2-4A: 2 device(s)",
        "    NVIDIA A2-4A: 2 added; 2 advertised after",
        "~ nvidia.com/NVIDIA_A2-4Q: 2 device(s)",
        "    NVIDIA A2-4Q: 2 added; 2 advertised after",
        "```",
        "",
        "</details>",
        "",
        "<details>",
        "<summary>Notes (1)</summary>",
        "",
        "- cluster actions skipped: no cluster configured",
        "",
        "</details>",
        "",
    ]
)


def test_the_seeds_plan_as_a_pull_request_comment(a2_node: SimNode) -> None:
    res = a2_node.ok("plan", SEED, "-o", "markdown")
    assert res.stdout == EXPECTED


def test_a_converged_node_is_folded_and_the_exit_code_still_says_no_changes(
    a2_node: SimNode,
) -> None:
    a2_node.ok("apply", SEED, "--yes")
    res = a2_node.run("plan", SEED, "-o", "markdown", "--detailed-exitcode")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "\n".join(
        [
            "## vgpuctl plan",
            "",
            "**1 node, 0 with changes: 0 to create, 0 to change, 0 to remove, 0 blocked** "
            "(observed: host)",
            "",
            "<details>",
            "<summary>1 node without changes</summary>",
            "",
            "harvester-kgd9c",
            "",
            "</details>",
            "",
        ]
    )
