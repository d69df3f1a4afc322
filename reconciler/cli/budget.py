"""The node agents' rollout budget on the command line: where the slots live, how long ``apply``
waits for one, and the budget handed to the engine (``apply/slots.py``; docs/architecture.md,
"The node agents' rollout budget").

There is a budget only with a cluster (``--kubeconfig``, or in a pod) and only when the desired
state says ``spec.rollout.maxParallel`` (the engine reads it from the desired node): without
either, a node agent changes its host alone, as before.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.model import UsageError

if TYPE_CHECKING:
    from reconciler.apply.slots import NodeBudget, SlotsBusy
    from reconciler.cli.host import Host

#: ``apply``'s exit code when no rollout slot became free within --slot-timeout: sysexits.h's
#: EX_TEMPFAIL ("a temporary failure ... the user is invited to retry"), apart from 1 (an
#: error) and 2 (changes left), so a script or a Job can retry on it alone.
EXIT_NO_SLOT = 75
DEFAULT_SLOT_TIMEOUT = 600.0
#: Where a pod's service account says its namespace.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def add_budget_options(p: argparse.ArgumentParser, *, waits: bool) -> None:
    """``--rollout-namespace`` (``apply`` and ``watch``), ``--slot-timeout`` (``apply``)."""
    g = p.add_argument_group(
        "rollout budget (node-local, with a cluster)",
        "When the desired state sets spec.rollout.maxParallel, at most that many node agents "
        "change their hosts at once: each holds one of the Leases vgpuctl-rollout-<i> while "
        "it does (docs/architecture.md). Without a cluster, or without maxParallel, no budget.",
    )
    g.add_argument(
        "--rollout-namespace",
        metavar="NAMESPACE",
        help="the namespace of the rollout slots' Leases (env VGPUCTL_ROLLOUT_NAMESPACE, else "
        "POD_NAMESPACE, else the pod's service-account namespace, else vgpuctl-system)",
    )
    if waits:
        g.add_argument(
            "--slot-timeout",
            type=_seconds,
            default=DEFAULT_SLOT_TIMEOUT,
            metavar="SECONDS",
            help="how long to wait for a free rollout slot before giving up with exit code "
            f"{EXIT_NO_SLOT}, nothing changed (default %(default)g)",
        )


def node_budget(
    ns: argparse.Namespace,
    host: Host,
    *,
    wait: float | None,
    on_wait: Callable[[SlotsBusy], None] = lambda _: None,
) -> NodeBudget | None:
    """The budget for this node (None without a cluster). ``wait``: how long ``acquire``
    waits for a slot (None: it does not wait)."""
    namespace = rollout_namespace(ns)
    api = host.cluster_api
    if api is None:
        return None
    from reconciler.apply.slots import NodeBudget, SlotBudget

    return NodeBudget(SlotBudget(api, namespace, host.options.node), wait=wait, on_wait=on_wait)


def rollout_namespace(ns: argparse.Namespace) -> str:
    from reconciler.apply.slots import DEFAULT_NAMESPACE

    namespace = (
        getattr(ns, "rollout_namespace", None)
        or os.environ.get("VGPUCTL_ROLLOUT_NAMESPACE")
        or os.environ.get("POD_NAMESPACE")
        or _service_account_namespace()
        or DEFAULT_NAMESPACE
    )
    if not _LABEL.fullmatch(namespace):
        raise UsageError(f"--rollout-namespace {namespace[:80]!r} is not a namespace name")
    return namespace


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="ascii").strip()[:63]
    except (OSError, UnicodeDecodeError):
        return ""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds, 0 or more")
    return value
