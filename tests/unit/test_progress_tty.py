"""The terminal renderer of a rollout's progress (``reconciler/cli/progress.py`` TtyProgress) on
a real pseudo-terminal: a node whose name carries an ESC (a name read from the cluster is
untrusted: an API server, or whatever stands in for one, can send anything) is shown escaped,
and no control character of it reaches the terminal.

The real API server refuses such a Node name, and so does the emulator's double of
pcidevices-controller's objects, so the rollout's events are fed to the renderer directly, in
a child process whose stderr is the pty; the screen is played back by ``tests/terminal.py``
(which fails on any escape sequence it does not know, and on any raw control character).
"""

from __future__ import annotations

from tests.terminal import run_in_pty

EVIL = "node-\x1b[2J\x1b]0;pwned\x07-x"

PROGRAM = f"""
import sys
from reconciler.apply.executor import Outcome, OutcomeStatus
from reconciler.cli.progress import TtyProgress
from reconciler.engine.rollout import *
from reconciler.model import PciAddress, SriovGpuDeviceEnable

evil = {EVIL!r}
show = TtyProgress(sys.stderr, tick=0)
show(RolloutStarted(at=0.0, nodes=((evil, 1), ("node-b", 1), ("node-c", 1)), parallel=2,
                    canary=0, max_failed_nodes=0))
show(NodeStarted(at=0.0, node=evil))
show(NodeStarted(at=0.0, node="node-b"))
step = SriovGpuDeviceEnable(seq=1, target=evil + "-000008000", reason="", node=evil,
                            gpu=PciAddress.parse("0000:08:00.0"), resource_version="1")
show(StepStarted(at=0.5, node=evil, action=step))
show.ended_at = None
show.clock = lambda: 2.0
show.draw([])
print("--- frame ---", file=sys.stderr, flush=True)
show.drawn = 0  # the frame above stays; the next one is drawn below the marker
show(NodeEnded(at=3.0, node="node-b", result="converged", state=NodeState.DONE, seconds=3.0,
               applied=1))
show(NodeEnded(at=4.0, node=evil, result="failed", state=NodeState.FAILED, seconds=4.0,
               applied=0, message="refused: " + evil))
show(RolloutEnded(at=4.0, result="failed", message="", stopped="1 failed",
                  not_started=("node-c",)))
"""


def test_a_node_name_with_an_escape_is_shown_escaped_never_raw() -> None:
    run = run_in_pty(["-c", PROGRAM], python=True)
    assert run.returncode == 0, run.output
    assert "\x1b[2J" not in run.output and "\x1b]0;" not in run.output and "\x07" not in run.output
    escaped = "node-\\x1b[2J\\x1b]0;pwned\\x07-x"
    screen = run.screen()  # raises on any raw control character or unknown escape sequence
    frame = screen.index("--- frame ---")
    live = screen[:frame]
    # The frame: the evil node in flight with its step, node-b without one yet, the bar.
    assert live[-3] == f"  {escaped}  step 1/1 sriovgpudevice-enable {escaped}-000008000  2.0 s"
    assert live[-2].startswith("  node-b")
    assert live[-1] == (
        "[▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒░░░░░░░░] 0/3: 0 done, 2 in flight, 1 waiting, 0 blocked, 0 failed"
        " · 2.0 s, ETA …"
    )
    after = screen[frame + 1 :]
    assert after == [
        "[1/3] node node-b: converged in 3.0 s, 1 step applied",
        f"[2/3] node {escaped}: failed in 4.0 s, 0 steps applied: refused: {escaped}",
        "[████████████████░░░░░░░░] 2/3: 1 done, 0 in flight, 1 waiting, 0 blocked, 1 failed"
        " · 4.0 s",
    ]


CROWDED = """
import sys
from reconciler.cli.progress import TtyProgress
from reconciler.engine.rollout import NodeStarted, RolloutEnded, RolloutStarted

show = TtyProgress(sys.stderr, tick=0)
nodes = tuple((f"node-{i}", 1) for i in range(8))
show(RolloutStarted(at=0.0, nodes=nodes, parallel=8, canary=0, max_failed_nodes=0))
for name, _ in nodes:
    show(NodeStarted(at=0.0, node=name))
print("--- frame ---", file=sys.stderr, flush=True)
"""


def test_more_nodes_in_flight_than_the_screen_holds_are_counted_not_drawn() -> None:
    """On a screen 6 rows high the block keeps to 4 lines (the height less two): a block taller
    than the screen would scroll, and moving the cursor up over it would then miss."""
    run = run_in_pty(["-c", CROWDED], python=True, size=(6, 80))
    assert run.returncode == 0, run.output
    screen = run.screen()
    block = screen[: screen.index("--- frame ---")][-4:]
    assert block[0].startswith("  node-0  planning  ")
    assert block[1].startswith("  node-1  planning  ")
    assert block[2] == "  … and 6 more in flight"
    assert block[3].startswith("[▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒▒] 0/8: 0 done, 8 in flight, 0 waiting,")


def test_auto_is_a_terminal_s_block_unless_ci_or_a_dumb_terminal() -> None:
    """``--progress auto`` through the command's own choice (cli/progress.py ``choose``), on a
    pty: CI set to anything but empty/0/false, or TERM=dumb, gives lines."""
    program = (
        "import sys\nfrom reconciler.cli.progress import choose\n"
        "print(choose(None, sys.stderr), choose('auto', sys.stderr), choose('none', sys.stderr))\n"
    )
    for env, expected in (
        ({}, "tty tty none"),
        ({"CI": "false"}, "tty tty none"),
        ({"CI": "0"}, "tty tty none"),
        ({"CI": "true"}, "lines lines none"),
        ({"CI": "1"}, "lines lines none"),
        ({"TERM": "dumb"}, "lines lines none"),
    ):
        run = run_in_pty(["-c", program], python=True, env=env)
        assert run.output.strip() == expected, env
