"""Which mode a run is in: node-local, or delegate (``--delegate``; docs/delegate.md).

Apart from the delegate commands themselves (``cli/delegate.py``) so that every command can ask
without importing them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from reconciler.cli.host import Host
from reconciler.model import UsageError

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
    return chosen


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
