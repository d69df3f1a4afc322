"""``plan``, ``apply`` and ``assert`` in delegate mode (``--delegate harvester``, or found on
its own where Harvester's pcidevices-controller runs): every node of the desired state, through
Harvester's objects, never a host (docs/delegate.md).

Apply shows the plans, asks, then runs the engine's rounds (``reconciler.engine.delegate``, the
pipeline ``watch --delegate harvester`` runs too) and reports how they ended.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from reconciler.cli.commands import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    _err,
    _out,
    _progress,
    _style,
    load,
    markdown_bounds,
)
from reconciler.cli.delegation import rollout_flags
from reconciler.cli.host import Host
from reconciler.cli.progress import (
    JsonProgress,
    LineProgress,
    NoProgress,
    Progress,
    TtyProgress,
    choose,
)
from reconciler.cli.render import plan_text, safe
from reconciler.engine.rollout import RolloutEnded, RolloutEvent
from reconciler.model import AbsentError, Desired, Plan, UsageError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.plan import FORMAT_VERSION
from reconciler.model.plan_json import plan_to_json

if TYPE_CHECKING:
    from reconciler.engine.delegate import DelegatePlans, Pace


def _plan_all(desired: Desired, host: Host, api: ClusterApi) -> DelegatePlans:
    """Every node of ``desired``, observed now and planned. The desired state is read once per
    command: a later round of apply plans from the state the user confirmed, not from a file
    edited since."""
    from reconciler.engine.delegate import plan_all

    return plan_all(desired, api, host.catalog)


def _api(host: Host) -> ClusterApi:
    api = host.cluster_api
    if api is None:  # delegating() checked
        raise UsageError("delegate mode needs a cluster: pass --kubeconfig")
    return api


def cmd_plan_delegate(ns: argparse.Namespace, host: Host) -> int:
    if getattr(ns, "out", None):
        raise UsageError("--out saves a plan for one node's apply; not in delegate mode")
    planned = _plan_all(load(ns.file, host), host, _api(host))
    changed = [p for p in planned.plans if p.has_changes]
    if ns.output == "json":
        totals = {"create": 0, "change": 0, "remove": 0, "blocked": 0}
        for p in planned.plans:
            for key, value in p.summary.to_json().items():
                totals[key] += value
        doc = {
            "formatVersion": FORMAT_VERSION,
            "observed": "harvester",
            "plans": [plan_to_json(p) for p in planned.plans],
            "errors": {n: e.lines() for n, e in planned.failures.items()},
            "summary": {
                "nodes": len(planned.plans) + len(planned.failures),
                "nodesWithChanges": len(changed),
                **totals,
            },
        }
        _out(json.dumps(doc, indent=2) + "\n")
    elif ns.output == "markdown":
        from reconciler.cli.markdown import plans_markdown

        _out(
            plans_markdown(
                planned.plans,
                failures=planned.failures,
                observed="harvester",
                **markdown_bounds(ns),
            )
        )
    else:
        _show(planned, host, verbose=ns.verbose)
    if planned.failures:
        return EXIT_ERROR
    return EXIT_CHANGES if ns.detailed_exitcode and changed else EXIT_OK


def cmd_assert_delegate(ns: argparse.Namespace, host: Host) -> int:
    planned = _plan_all(load(ns.file, host), host, _api(host))
    for name, error in planned.failures.items():
        _out(f"node {safe(name)}: {safe(error.message)}\n")
    drifted = [p for p in planned.plans if p.has_changes]
    for p in planned.plans:
        if p.has_changes:
            s = p.summary
            pending = sum(getattr(a, "pending", False) for a in p.actions)
            waiting = f" ({pending} pending: written, not carried out)" if pending else ""
            _out(
                f"node {safe(p.node)} has drifted: {s.create} to create, {s.change} to change, "
                f"{s.remove} to remove, {s.blocked} blocked{waiting}\n"
            )
        else:
            _out(f"node {safe(p.node)} matches the desired state\n")
    # A node only short of what its desired state wants (AbsentError) has drifted; any other
    # failure is an error.
    if any(not isinstance(e, AbsentError) for e in planned.failures.values()):
        return EXIT_ERROR
    return EXIT_CHANGES if drifted or planned.failures else EXIT_OK


def cmd_apply_delegate(ns: argparse.Namespace, host: Host) -> int:
    from reconciler.apply.delegate import DEFAULT_TIMEOUT
    from reconciler.apply.throttle import RateLimitedApi, TokenBucket
    from reconciler.engine.delegate import Result, converge, pace

    api = _api(host)
    style = _style(host.options)
    events = getattr(ns, "rollout_output", None) == "json"
    if events and not ns.yes:
        raise UsageError("-o json needs --yes: the plans are not shown to confirm (nothing was "
                         "changed)")  # fmt: skip
    desired = load(ns.file, host)
    planned = _plan_all(desired, host, api)
    if not events:
        _show(planned, host, verbose=ns.verbose)
    if planned.failures:
        for name, error in planned.failures.items() if events else ():
            for line in map(safe, error.lines()):
                _err(f"error: node {safe(name)}: {line}")
        _json_end(events, "unplannable", "; ".join(
            f"node {n}: {e.message}" for n, e in planned.failures.items()
        ))  # fmt: skip
        return EXIT_ERROR
    if planned.steps == 0:
        if planned.blocked:
            _json_end(events, "blocked", f"{planned.blocked} blocked steps, nothing to do")
            return EXIT_CHANGES
        _json_end(events, "converged", "converged: every node matches the desired state")
        return EXIT_OK
    if not ns.yes:
        _confirm_all(planned.steps, len([p for p in planned.plans if p.actions]))

    timeout = getattr(ns, "timeout", None) or DEFAULT_TIMEOUT
    policy = rollout_flags(ns).over(desired.rollout)
    nodes = len([p for p in planned.plans if p.actions])
    rollout = pace(policy, nodes)
    if nodes > 1:
        _err(style.bold(f"Rolling out to {nodes} nodes: {_pace_text(rollout, nodes)}."))
    limited = RateLimitedApi(api, TokenBucket(ns.qps, ns.burst))
    mode = choose(getattr(ns, "progress", None), sys.stderr)
    shown = _renderer(mode, host)
    listeners: list[Progress] = [shown]
    if events:
        listeners.append(JsonProgress(_out))

    def announce(plan: Plan, round_number: int) -> None:
        _err(style.bold(f"node {safe(plan.node)}, round {round_number}:"))

    def tell(event: RolloutEvent) -> None:
        for listener in listeners:
            listener(event)

    steps = mode == "lines"  # the steps' own lines: a log's (a terminal has the live block)
    try:
        done = converge(
            desired,
            limited,
            host.catalog,
            first=planned,
            timeout=timeout,
            on_outcome=_progress(style) if steps else None,
            on_round=announce if steps else None,
            on_event=tell,
            policy=policy,
        )
    finally:
        for listener in listeners:
            listener.close()
    if done.stopped:
        _err(f"Rollout stopped: {safe(done.stopped)}.")
    if done.not_started:
        names = ", ".join(map(safe, done.not_started))
        _err(f"Not started ({len(done.not_started)}): {names}.")
    if len(done.failed_nodes) > 1:
        _err(f"Failed nodes ({len(done.failed_nodes)}): {', '.join(map(safe, done.failed_nodes))}.")
    show_left = not events
    match done.result:
        case Result.FAILED:
            _err(f"error: {safe(done.message)}")
            return EXIT_ERROR
        case Result.UNPLANNABLE:
            if show_left:
                _show(done.plans, host, verbose=False)
            return EXIT_ERROR
        case Result.CONTROLLER_SILENT:
            _err(f"Not converged: pcidevices-controller made no VGPUDevices within {timeout:g} s.")
            if show_left:
                _show(done.plans, host, verbose=False)
            return EXIT_ERROR
        case Result.NOT_CONVERGED:
            _err(f"Not converged: {safe(done.message)}.")
            if show_left:
                _show(done.plans, host, verbose=False)
            return EXIT_ERROR
        case Result.BLOCKED:
            _err(f"{safe(done.message[0].upper() + done.message[1:])}.")
            return EXIT_CHANGES
    _err("Converged: every node matches the desired state.")
    return EXIT_OK


def _renderer(mode: str, host: Host) -> Progress:
    """``--progress``'s renderer on stderr (cli/progress.py)."""
    if mode == "tty":
        return TtyProgress(sys.stderr, style=_style(host.options, sys.stderr))
    if mode == "lines":
        return LineProgress(_err)
    return NoProgress()


def _json_end(events: bool, result: str, message: str) -> None:
    """With ``-o json``, the one event of a run that starts no rollout (nothing to do, or a node
    that cannot be planned)."""
    if events:
        import time

        JsonProgress(_out)(RolloutEnded(at=time.monotonic(), result=result, message=message))


def _pace_text(rollout: Pace, nodes: int) -> str:
    parts = [f"at most {min(rollout.parallel, nodes)} at once"]
    if rollout.canary:
        parts.append(f"the first {min(rollout.canary, nodes)} first (canary)")
    parts.append(
        f"no new node after {rollout.max_failed_nodes + 1} failed"
        if rollout.max_failed_nodes
        else "no new node after a failure"
    )
    return ", ".join(parts)


def _confirm_all(actions: int, nodes: int) -> None:
    if not sys.stdin.isatty():
        raise UsageError("apply needs --yes when not run from a terminal (nothing was changed)")
    sys.stderr.write(
        f"\nApply {actions} step{'s' * (actions != 1)} on {nodes} node{'s' * (nodes != 1)} "
        "through pcidevices-controller? Only 'yes' will be accepted: "
    )
    sys.stderr.flush()
    if sys.stdin.readline().strip() != "yes":
        raise UsageError("apply cancelled (nothing was changed)")


def _show(planned: DelegatePlans, host: Host, *, verbose: bool) -> None:
    style = _style(host.options)
    for p in planned.plans:
        _out(style.bold(f"=== node {safe(p.node)} (through pcidevices-controller) ===") + "\n")
        _out(plan_text(p, style=style, verbose=verbose) + "\n")
    for name, error in planned.failures.items():
        _out(style.bold(f"=== node {safe(name)} ===") + "\n")
        for line in map(safe, error.lines()):
            _err(f"error: {line}")
