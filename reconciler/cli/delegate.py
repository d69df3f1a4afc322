"""``plan``, ``apply`` and ``assert`` in delegate mode (``--delegate harvester``, or found on
its own where Harvester's pcidevices-controller runs): every node of the desired state, through
Harvester's objects, never a host (docs/delegate.md).

Apply runs in rounds: a GPU's VF steps can be planned only once pcidevices-controller has made
their ``VGPUDevice`` objects, so after each round the nodes are read and planned again, until
nothing is left to do, only blocked steps remain, or a round changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from functools import partial

from reconciler.cli.commands import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    _err,
    _out,
    _progress,
    _style,
    load,
)
from reconciler.cli.host import Host
from reconciler.cli.render import plan_text, safe
from reconciler.model import Desired, Plan, ReconcilerError, UsageError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.plan import FORMAT_VERSION
from reconciler.model.plan_json import plan_to_json
from reconciler.observe.delegate import devices_in_use
from reconciler.plan.delegate import waits_for_controller

#: How often the objects are read while waiting for pcidevices-controller.
POLL_SECONDS = 1.0
#: At most this many rounds of apply (a GPU enable, then its VFs, then what a profile change
#: of another size needs): a run that still has work after them reports it.
MAX_ROUNDS = 6


@dataclass(frozen=True, slots=True)
class _Planned:
    plans: tuple[Plan, ...]
    failures: dict[str, ReconcilerError]


def _plan_all(desired: Desired, host: Host, api: ClusterApi) -> _Planned:
    """Every node of ``desired``, observed now and planned. The desired state is read once per
    command: a later round of apply plans from the state the user confirmed, not from a file
    edited since."""
    from reconciler.observe.delegate import observe_harvester_nodes
    from reconciler.plan.delegate import plan_delegate

    observed = observe_harvester_nodes(api, desired.nodes)
    plans: list[Plan] = []
    failures: dict[str, ReconcilerError] = {}
    for name in sorted(desired.nodes):
        try:
            plans.append(plan_delegate(desired.nodes[name], observed[name], catalog=host.catalog))
        except ReconcilerError as e:
            failures[name] = e
    return _Planned(tuple(plans), failures)


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
            _out(
                f"node {safe(p.node)} has drifted: {s.create} to create, {s.change} to change, "
                f"{s.remove} to remove, {s.blocked} blocked\n"
            )
        else:
            _out(f"node {safe(p.node)} matches the desired state\n")
    if planned.failures:
        return EXIT_ERROR
    return EXIT_CHANGES if drifted else EXIT_OK


def cmd_apply_delegate(ns: argparse.Namespace, host: Host) -> int:
    from reconciler.apply.delegate import DEFAULT_TIMEOUT, DelegateExecutor

    api = _api(host)
    style = _style(host.options)
    desired = load(ns.file, host)
    planned = _plan_all(desired, host, api)
    _show(planned, host, verbose=ns.verbose)
    if planned.failures:
        return EXIT_ERROR
    total = sum(len(p.actions) for p in planned.plans)
    if total == 0:
        return EXIT_CHANGES if any(p.blocked for p in planned.plans) else EXIT_OK
    if not ns.yes:
        _confirm_all(total, len([p for p in planned.plans if p.actions]))

    timeout = getattr(ns, "timeout", None) or DEFAULT_TIMEOUT
    plans = planned
    for round_number in range(1, MAX_ROUNDS + 1):
        ran = 0
        for plan in plans.plans:
            if not plan.actions:
                continue
            _err(style.bold(f"node {safe(plan.node)}, round {round_number}:"))
            executor = DelegateExecutor(
                api,
                used_by=partial(devices_in_use, api, plan.node),
                timeout=timeout,
                on_outcome=_progress(style),
            )
            result = executor.run(plan)
            ran += len(result.outcomes)
            failed = result.failed
            if failed is not None:
                _err(f"error: {safe(failed.action.kind.value)} {safe(failed.action.target)}: "
                     f"{safe(failed.message)}")  # fmt: skip
                return EXIT_ERROR
        plans = _plan_all(desired, host, api)
        if plans.failures:
            _show(plans, host, verbose=False)
            return EXIT_ERROR
        left = sum(len(p.actions) for p in plans.plans)
        if left == 0 and any(map(waits_for_controller, plans.plans)):
            plans = _await_controller(desired, host, api, timeout)
            if plans.failures:
                _show(plans, host, verbose=False)
                return EXIT_ERROR
            left = sum(len(p.actions) for p in plans.plans)
        if left == 0 or ran == 0:
            break
    blocked = sum(len(p.blocked) for p in plans.plans)
    left = sum(len(p.actions) for p in plans.plans)
    if any(map(waits_for_controller, plans.plans)):
        _err(f"Not converged: pcidevices-controller made no VGPUDevices within {timeout:g} s.")
        _show(plans, host, verbose=False)
        return EXIT_ERROR
    if left:
        _err(f"Not converged: {left} step{'s' * (left != 1)} left after {MAX_ROUNDS} rounds.")
        _show(plans, host, verbose=False)
        return EXIT_ERROR
    if blocked:
        _err(f"Converged but for {blocked} blocked step{'s' * (blocked != 1)} (in use).")
        return EXIT_CHANGES
    _err("Converged: every node matches the desired state.")
    return EXIT_OK


def _await_controller(desired: Desired, host: Host, api: ClusterApi, timeout: float) -> _Planned:
    """Plans again until no GPU waits for pcidevices-controller's objects, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        plans = _plan_all(desired, host, api)
        if plans.failures or not any(map(waits_for_controller, plans.plans)):
            return plans
        if time.monotonic() >= deadline:
            return plans
        time.sleep(POLL_SECONDS)


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


def _show(planned: _Planned, host: Host, *, verbose: bool) -> None:
    style = _style(host.options)
    for p in planned.plans:
        _out(style.bold(f"=== node {safe(p.node)} (through pcidevices-controller) ===") + "\n")
        _out(plan_text(p, style=style, verbose=verbose) + "\n")
    for name, error in planned.failures.items():
        _out(style.bold(f"=== node {safe(name)} ===") + "\n")
        for line in map(safe, error.lines()):
            _err(f"error: {line}")
