"""A delegate rollout's progress, seen from outside (issue 33, item 4; docs/delegate.md
"Progress"): the lines a log gets, the JSON Lines events of ``-o json`` (against
schemas/rollout-event.schema.json), the live block on a terminal (the command run in a
pseudo-terminal, its output played back on a screen, ``tests/terminal.py``), and the delegate
watch's rollout metrics and ``/readyz``.

The fleet: one simulated A2 per node, each with its double of pcidevices-controller
(``tests/harvester_node.py`` ``harvester_fleet``); a node is made to fail the way a host can
(its controller's ``enableVGPU`` write is refused: the wait for the vGPU times out).
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

from tests.doubles.emulator import ApiServerEmulator
from tests.harvester_node import Fleet, harvester_fleet
from tests.simnode import REPO
from tests.terminal import run_in_pty
from tests.watch_agent import Watch, wait_for

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)

SCHEMA = json.loads((REPO / "schemas" / "rollout-event.schema.json").read_text("utf-8"))
#: How a time shows in a line: ``2.0 s`` (or ``1m05s`` past a minute).
T = r"(\d+\.\d s|\d+m\d\ds)"
#: The wait that times out on a node whose controller refuses the vGPU (``--timeout 5``: the
#: healthy nodes' waits must not time out on a loaded machine).
REFUSED = (
    "vgpudevice-enable {node}-000008004: pcidevices-controller has not carried out the enable "
    "of NVIDIA A2-4A on {node}-000008004 after 5 s"
)


@pytest.fixture
def fleet3(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Fleet]:
    with harvester_fleet(emu, tmp_path, ["node-a", "node-b", "node-c"]) as fleet:
        yield fleet


@pytest.fixture
def fleet4(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Fleet]:
    with harvester_fleet(emu, tmp_path, ["node-a", "node-b", "node-c", "node-d"]) as fleet:
        yield fleet


def test_a_log_gets_a_line_per_node_and_a_machine_the_events_as_json_lines(
    fleet3: Fleet, tmp_path: Path
) -> None:
    fleet3.nodes["node-b"].ctl.refuse_enable = errno.EIO
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    res = fleet3.run(
        "apply", desired, "--yes", "--max-parallel", "1", "--max-failed-nodes", "1",
        "--timeout", "5", "-o", "json",
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    # stderr is no terminal: lines. One node at a time, in node order; node-b failed (one
    # failure tolerated), node-c went on.
    ends = [line for line in res.stderr.splitlines() if line.startswith(("[", "Fleet:"))]
    expected = [
        rf"\[1/3\] node node-a: converged in {T}, 5 steps applied",
        rf"\[2/3\] node node-b: failed in {T}, 1 step applied: "
        + re.escape(REFUSED.format(node="node-b")) + r" \(.*",
        rf"\[3/3\] node node-c: converged in {T}, 5 steps applied",
        rf"Fleet: 2 done, 0 in flight, 0 waiting, 0 blocked, 1 failed \({T}\)\.",
    ]  # fmt: skip
    assert len(ends) == len(expected), res.stderr
    for line, pattern in zip(ends, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    # A node's line follows its steps' lines.
    err = res.stderr.splitlines()
    a_line = err.index(ends[0])
    assert err[a_line - 1].startswith("  ✓   5 vgpudevice-enable node-a-000008007: enabled")

    # stdout: only the events, one JSON object a line, each valid.
    events = [json.loads(line) for line in res.stdout.splitlines()]
    for e in events:
        jsonschema.validate(e, SCHEMA)
    assert events[0]["event"] == "rollout-started"
    assert events[0]["nodes"] == [
        {"node": "node-a", "steps": 5},
        {"node": "node-b", "steps": 5},
        {"node": "node-c", "steps": 5},
    ]
    assert (events[0]["maxParallel"], events[0]["canary"], events[0]["maxFailedNodes"]) == (
        1,
        0,
        1,
    )
    # node-a: started, its five steps (the SR-IOV enable, then the four VF enables, each begun
    # and ended), ended.
    a = [(e["event"], e.get("kind"), e.get("target"), e.get("status")) for e in events[1:13]]
    assert a == [
        ("node-started", None, None, None),
        ("step-started", "sriovgpudevice-enable", "node-a-000008000", None),
        ("step-ended", "sriovgpudevice-enable", "node-a-000008000", "done"),
        ("step-started", "vgpudevice-enable", "node-a-000008004", None),
        ("step-started", "vgpudevice-enable", "node-a-000008005", None),
        ("step-started", "vgpudevice-enable", "node-a-000008006", None),
        ("step-started", "vgpudevice-enable", "node-a-000008007", None),
        ("step-ended", "vgpudevice-enable", "node-a-000008004", "done"),
        ("step-ended", "vgpudevice-enable", "node-a-000008005", "done"),
        ("step-ended", "vgpudevice-enable", "node-a-000008006", "done"),
        ("step-ended", "vgpudevice-enable", "node-a-000008007", "done"),
        ("node-ended", None, None, None),
    ]
    assert all(e["node"] == "node-a" for e in events[1:13])
    ended = {e["node"]: e for e in events if e["event"] == "node-ended"}
    assert {n: (e["result"], e["state"], e["applied"]) for n, e in ended.items()} == {
        "node-a": ("converged", "done", 5),
        "node-b": ("failed", "failed", 1),
        "node-c": ("converged", "done", 5),
    }
    assert ended["node-b"]["message"].startswith(REFUSED.format(node="node-b"))
    assert ended["node-a"]["message"] == ""
    last = events[-1]
    assert last["event"] == "rollout-ended"
    assert last["result"] == "failed" and last["notStarted"] == [] and last["stopped"] == ""
    assert last["counts"] == {"done": 2, "inFlight": 0, "waiting": 0, "blocked": 0, "failed": 1}
    assert [e["elapsed"] for e in events] == sorted(e["elapsed"] for e in events)


def test_json_events_need_yes_and_nothing_to_do_is_one_event(fleet3: Fleet, tmp_path: Path) -> None:
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    res = fleet3.run("apply", desired, "-o", "json")
    assert res.returncode == 1 and res.stdout == ""
    assert "-o json needs --yes" in res.stderr
    fleet3.run("apply", desired, "--yes", "--progress", "none")
    res = fleet3.run("apply", desired, "--yes", "-o", "json")
    assert res.returncode == 0, res.stderr
    (only,) = map(json.loads, res.stdout.splitlines())
    jsonschema.validate(only, SCHEMA)
    assert (only["event"], only["result"]) == ("rollout-ended", "converged")


def test_progress_none_shows_only_the_summary(fleet3: Fleet, tmp_path: Path) -> None:
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    res = fleet3.run("apply", desired, "--yes", "--progress", "none", "--max-parallel", "3")
    assert res.returncode == 0, res.stderr
    assert "round 1" not in res.stderr and "[1/3]" not in res.stderr
    assert "Fleet:" not in res.stderr
    assert res.stderr.rstrip().endswith("Converged: every node matches the desired state.")


def test_a_terminal_gets_the_live_block_and_its_last_frame_has_the_fleet_bar(
    fleet4: Fleet, tmp_path: Path
) -> None:
    fleet4.nodes["node-c"].ctl.refuse_enable = errno.EIO
    desired = fleet4.desired(tmp_path / "fleet.yaml")
    run = run_in_pty(
        ["apply", desired, "--yes", "--max-parallel", "2", "--max-failed-nodes", "1",
         "--timeout", "5", "--qps", "1000", "--burst", "1000",
         "--kubeconfig", fleet4.kubeconfig],
    )  # fmt: skip
    assert run.returncode == 1, run.output
    # The live block was redrawn in place: the cursor went up over it.
    assert re.search(r"\x1b\[\d+F\x1b\[J", run.output)
    # Each step's own line is a log's, not a terminal's.
    assert "round 1:" not in run.output
    screen = run.screen()
    ends = [line for line in screen if line.startswith("[") and "] node " in line]
    assert sorted(ends, key=lambda line: line.split()[2]) == sorted(
        ends, key=lambda line: line.split()[2]
    )
    assert {line.split(" node ", 1)[1].split(":")[0] for line in ends} == {
        "node-a", "node-b", "node-c", "node-d",
    }  # fmt: skip
    assert [line[:6] for line in ends] == ["[1/4] ", "[2/4] ", "[3/4] ", "[4/4] "]
    (c_line,) = [line for line in ends if " node node-c: " in line]
    assert re.match(rf"\[\d/4\] node node-c: failed in {T}, 1 step applied: ", c_line)
    # The last frame: the bar, full, with the counts; nothing in flight any more.
    bars = [line for line in screen if line.startswith("[█")]
    assert len(bars) == 1, screen
    assert re.fullmatch(
        rf"\[█{{24}}\] 4/4: 3 done, 0 in flight, 0 waiting, 0 blocked, 1 failed · {T}", bars[0]
    ), bars[0]
    assert screen.index(bars[0]) > max(screen.index(line) for line in ends)
    assert screen[-1].startswith("error: " + REFUSED.format(node="node-c"))
    # Mid-run frames showed a node in flight with its step and time, and an ETA once a node
    # had finished.
    assert re.search(
        rf"\n  node-[abcd]  step [1-5]/5 (sriov)?gpudevice-enable node-[abcd]-00000800[0-7]  {T}\n",
        run.output.replace("vgpudevice", "gpudevice"),
    )
    assert re.search(
        r"1 done, \d in flight, \d waiting, 0 blocked, 0 failed · .*, ETA ", run.output
    )


def test_ci_on_a_terminal_gets_lines(fleet3: Fleet, tmp_path: Path) -> None:
    desired = fleet3.desired(tmp_path / "fleet.yaml")
    run = run_in_pty(
        ["apply", desired, "--yes", "--max-parallel", "3", "--qps", "1000", "--burst", "1000",
         "--kubeconfig", fleet3.kubeconfig],
        env={"CI": "true"},
    )  # fmt: skip
    assert run.returncode == 0, run.output
    assert not re.search(r"\x1b\[\d+F", run.output)  # no cursor movement
    screen = run.screen()
    assert "Fleet: 3 done, 0 in flight, 0 waiting, 0 blocked, 0 failed" in "\n".join(screen)
    assert sum(line.startswith("node node-") and "round 1:" in line for line in screen) == 3


@dataclass
class _Replica:
    flags: list[str]
    dir: Path


def test_the_delegate_watch_exports_the_rollout_and_is_not_ready_past_its_failure_budget(
    fleet3: Fleet, tmp_path: Path
) -> None:
    fleet3.nodes["node-a"].ctl.refuse_enable = errno.EIO
    desired = tmp_path / "desired"
    desired.mkdir()
    fleet3.desired(desired / "fleet.yaml", rollout={"canary": 1, "maxParallel": 3})
    home = tmp_path / "replica"
    home.mkdir()
    watch = Watch(
        _Replica(["--kubeconfig", str(fleet3.kubeconfig)], home),
        desired,
        "--delegate", "harvester", "--lease-namespace", "default", "--timeout", "5",
        "--qps", "1000", "--burst", "1000",
    )  # fmt: skip
    try:
        wait_for(
            lambda: watch.metric("vgpuctl_rollout_node_results_total", result="failed") >= 1,
            "the canary's failure",
            120,
        )

        # The canary failed: the other two were not started, and stay waiting (until the
        # retry's rollout, which starts the canary again: in flight, then failed again).
        def state() -> tuple[float, ...]:
            return tuple(
                watch.metric("vgpuctl_rollout_nodes", state=s)
                for s in ("done", "in_flight", "waiting", "blocked", "failed")
            )

        wait_for(lambda: state() == (0, 0, 2, 0, 1), "1 failed, 2 waiting", 60)
        assert watch.metric("vgpuctl_rollout_node_results_total", result="converged") == 0
        code, body = watch.get("/readyz")
        assert code == 503, body
        assert body.startswith("rollout stopped: a canary node failed; not converged yet: ")
        # The counts: the failed canary's rollout, or its retry's under way.
        assert re.search(
            r"; rollout: 0 done, [01] in flight, 2 waiting, 0 blocked, [01] failed$", body
        )
        # The host lets the canary's vGPUs be made: a retry converges it, then the others,
        # within the budget: ready again.
        fleet3.nodes["node-a"].ctl.refuse_enable = None
        wait_for(lambda: watch.get("/readyz")[0] == 200, "ready", 180)
        # The last rollout: every node it had done (node-a may have converged on its own
        # first, pcidevices-controller retrying the enable: then it was no part of it).
        assert state()[1:] == (0, 0, 0, 0), state()
        done = int(state()[0])
        assert done in (2, 3)
        assert watch.metric("vgpuctl_rollout_node_results_total", result="converged") >= 2
        code, body = watch.get("/readyz")
        assert body.startswith("ready: ")
        assert body.rstrip().endswith(
            f"rollout: {done} done, 0 in flight, 0 waiting, 0 blocked, 0 failed"
        ), body
    finally:
        watch.stop()
