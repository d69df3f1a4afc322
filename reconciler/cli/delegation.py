"""Which mode a run is in: node-local, or delegate (``--delegate``; docs/delegate.md).

Apart from the delegate commands themselves (``cli/delegate.py``) so that every command can ask
without importing them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from reconciler.apply.throttle import DEFAULT_BURST, DEFAULT_QPS
from reconciler.cli.host import Host
from reconciler.model import UsageError
from reconciler.model.desired import Rollout

MODES = ("auto", "harvester", "none")


def add_delegate_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--delegate",
        choices=MODES,
        default="auto",
        help="harvester: write only the specs of Harvester's SRIOVGPUDevice/VGPUDevice objects "
        "and let its pcidevices-controller act, for every node of the desired state (no host "
        "is touched); none: act on this node's host; auto (default): harvester where "
        "pcidevices-controller runs, else none",
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def delegating(
    ns: argparse.Namespace, host: Host, *, announce: Callable[[str], None] = _stderr
) -> bool:
    """Whether this run is in delegate mode; in auto mode says so in one line (on stderr, or
    through ``announce``: the watch logs it, in its log format)."""
    chosen = _delegating(ns, host, announce=announce)
    if chosen and getattr(ns, "partial", False):
        # Node-local only: in delegate mode pcidevices-controller carries out each step (and
        # its webhook refuses to disable a device in use): nothing to give up early.
        raise UsageError(
            "--partial is for node-local mode, and this run is in delegate mode "
            "(--delegate none: this node's host)"
        )
    given = [flag for flag, value in _ROLLOUT_FLAGS.items() if getattr(ns, value, None) is not None]
    if not chosen and given:
        raise UsageError(
            f"{given[0]} paces a rollout across nodes in delegate mode (--delegate harvester); "
            "this run acts on this node's host alone"
        )
    shown = [flag for flag, value in _PROGRESS_FLAGS.items() if getattr(ns, value, None)]
    if not chosen and shown:
        raise UsageError(
            f"{shown[0]} shows a rollout across nodes in delegate mode (--delegate harvester); "
            "this run acts on this node's host alone"
        )
    return chosen


#: ``plan`` has an ``--output`` of its own (every mode): apply's is kept apart by its dest.
_PROGRESS_FLAGS = {"--progress": "progress", "--output": "rollout_output"}

_ROLLOUT_FLAGS = {
    "--max-parallel": "max_parallel",
    "--canary": "canary",
    "--max-failed-nodes": "max_failed_nodes",
}


def _delegating(ns: argparse.Namespace, host: Host, *, announce: Callable[[str], None]) -> bool:
    mode = getattr(ns, "delegate", "auto")
    if mode == "none":
        return False
    api = host.cluster_api
    if mode == "harvester":
        if api is None:
            raise UsageError("--delegate harvester needs a cluster: pass --kubeconfig")
        return True
    if api is None:
        return False
    from reconciler.observe.harvester import observe_pcidevices_controller

    presence = observe_pcidevices_controller(api)
    if not presence.running:
        return False
    announce(
        f"Harvester's pcidevices-controller runs ({'; '.join(presence.signals)}): delegate mode, "
        "every node of the desired state through its objects (--delegate none: this node's host)"
    )
    return True


def add_rollout_options(p: argparse.ArgumentParser) -> None:
    """A delegate rollout's pace (``apply`` and ``watch`` with ``--delegate harvester``;
    docs/delegate.md "Rollouts"). A flag given wins over the desired state's ``spec.rollout``,
    which wins over the default."""
    g = p.add_argument_group(
        "delegate rollouts (--delegate harvester)",
        "How many nodes change at once and when to stop; a flag given here wins over the "
        "desired state's spec.rollout (docs/delegate.md).",
    )
    g.add_argument(
        "--max-parallel",
        type=_count(1),
        metavar="N",
        help="change at most N nodes at once (default: a quarter of the nodes to change, at "
        "least 1)",
    )
    g.add_argument(
        "--canary",
        type=_count(0),
        metavar="N",
        help="change the first N nodes first, alone, and stop if any of them fails (default 0)",
    )
    g.add_argument(
        "--max-failed-nodes",
        type=_count(0),
        metavar="M",
        help="start no new node once more than M nodes failed; the ones under way finish "
        "(default 0: the first failure)",
    )
    g.add_argument(
        "--qps",
        type=_rate,
        default=DEFAULT_QPS,
        metavar="N",
        help="at most N requests a second to the API server, all nodes together, after a burst "
        "(default %(default)g, kube-controller-manager's)",
    )
    g.add_argument(
        "--burst",
        type=_count(1),
        default=DEFAULT_BURST,
        metavar="N",
        help="requests allowed at once above --qps (default %(default)s, kube-controller-"
        "manager's)",
    )


def add_progress_options(p: argparse.ArgumentParser) -> None:
    """How ``apply --delegate harvester`` shows a rollout (docs/delegate.md "Progress")."""
    g = p.add_argument_group("delegate rollouts' progress (--delegate harvester)")
    g.add_argument(
        "--progress",
        choices=("auto", "tty", "lines", "none"),
        help="how the rollout's progress is shown on stderr. tty: a live line per node in "
        "flight (its current step, how long it has run) and a bar for the fleet (done, in "
        "flight, waiting, blocked, failed, ETA), redrawn in place; lines: each step as it "
        "ends and a line per node when it finishes (CI, logs); none: only the summary at the "
        "end. auto (default): tty when stderr is a terminal and CI is not set, else lines",
    )
    g.add_argument(
        "-o",
        "--output",
        dest="rollout_output",
        choices=("text", "json"),
        help="text (default): the plans on stdout before the rollout; json: instead, the "
        "rollout's events on stdout as JSON Lines, one object per event "
        "(schemas/rollout-event.schema.json); needs --yes",
    )


def rollout_flags(ns: argparse.Namespace) -> Rollout:
    """The rollout policy the command line gives (None where a flag is not given)."""
    return Rollout(
        max_parallel=getattr(ns, "max_parallel", None),
        canary=getattr(ns, "canary", None),
        max_failed_nodes=getattr(ns, "max_failed_nodes", None),
    )


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at least {least}")
        return value

    return parse


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return value
