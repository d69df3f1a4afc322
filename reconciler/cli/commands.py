"""The node-local subcommands: validate, plan, apply, status, export, assert.

Each handler composes the engine (load → observe → plan → apply), renders for people or
machines, and returns an exit code. Errors travel as ``ReconcilerError`` to ``main``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.cli.budget import EXIT_NO_SLOT, add_budget_options
from reconciler.cli.delegation import (
    add_delegate_option,
    add_progress_options,
    add_rollout_options,
    delegating,
)
from reconciler.cli.host import DEFAULT_WRITE_TIMEOUT, Host
from reconciler.cli.options import GlobalOptions
from reconciler.cli.render import (
    Style,
    gpu_summary,
    plan_text,
    safe,
    safe_lines,
    status_table,
    summary_line,
)
from reconciler.model import (
    AbsentError,
    ApplyError,
    Desired,
    DesiredNode,
    Inventory,
    ObserveError,
    Plan,
    UsageError,
    ValidationError,
)
from reconciler.model.errors import ClusterUnavailableError, ReconcilerError, excerpt
from reconciler.model.plan import FORMAT_VERSION

if TYPE_CHECKING:
    from reconciler.apply import Outcome
    from reconciler.apply.slots import SlotsBusy
    from reconciler.cli.planfile import SavedPlan
    from reconciler.engine import Expected, Planned, Reconciled, Verification
    from reconciler.model.clusterapi import ClusterApi

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2

Subparsers = Any  # argparse's private _SubParsersAction


def _style(options: GlobalOptions, stream: Any = None) -> Style:
    stream = stream or sys.stdout
    return Style(enabled=not options.no_color and stream.isatty())


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    print(text, file=sys.stderr)


# ---------------------------------------------------------------- shared steps


def load(paths: Sequence[str], host: Host, *, strict: bool = False) -> Desired:
    """The desired state of ``paths``: files, and directories standing for their ``*.yaml``
    and ``*.yml`` files (as ``watch`` reads one). ``strict``: see ``load_desired``."""
    from reconciler.desired import load_desired

    return load_desired(
        [Path(p) for p in paths], catalog=host.catalog, directories=True, strict=strict
    )


def select_node(
    desired: Desired, node: str, host: Host, labels: Mapping[str, str] | None = None
) -> DesiredNode:
    """What ``desired`` wants of ``node``: its own entry, else what the node groups that
    select it say. With a cluster, a node groups may select must be a Node of it (one get,
    which gives its labels): a mistyped name a glob admits would otherwise plan a group's
    layout onto the host (README, "Node groups"). Without one, ``labels`` (``--labels``)
    stand for the cluster's."""
    api = host.cluster_api
    if api is not None and desired.may_select(node):
        from reconciler.observe.nodes import read_node

        labels = read_node(api, node)
        if labels is None:
            from reconciler.desired.shape import did_you_mean

            close = did_you_mean(node, desired.nodes)
            hint = f"; did you mean {close!r}?" * (close is not None)
            raise UsageError(
                f"no Node named {node!r} in the cluster{hint} (node groups select among the "
                "cluster's Nodes: pass --node NAME or set NODE_NAME)"
            )
    found = desired.node(node, labels)
    if found is None:
        names = ", ".join(sorted(desired.nodes)) or "none"
        files = ", ".join(desired.files)
        groups = f"; no node group selects it ({len(desired.groups)} in all)" * bool(desired.groups)
        raise UsageError(
            f"node {node!r} is not in {files} (nodes there: {names}{groups}); "
            "pass --node NAME or set NODE_NAME"
        )
    return found


def add_labels_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--labels",
        metavar="K=V[,K=V…]",
        help="without a cluster: this node's labels, for node groups that select by labels "
        "(with one, its Node's labels decide)",
    )


def given_labels(ns: argparse.Namespace, host: Host) -> Mapping[str, str] | None:
    """``--labels`` as a mapping (None: not given); a usage error with a cluster, whose Node's
    labels are the ones node groups select by."""
    if ns.labels is None:
        return None
    if host.has_cluster:
        raise UsageError(
            "--labels stands for a node's labels where there is no cluster; with a cluster, "
            "its Node's labels decide (label the Node instead)"
        )
    from reconciler.cli.explain import parse_labels

    return parse_labels(ns.labels)


def plan_for(
    node: DesiredNode, host: Host, *, adopt: bool = False, partial: bool = False
) -> Planned:
    """Observe the host and the cluster, then plan (the engine's first step)."""
    from reconciler.engine.observe import observe_and_plan

    return observe_and_plan(host.ports(), node, adopt=adopt, partial=partial)


def plan_files(
    files: Sequence[str],
    host: Host,
    *,
    adopt: bool = False,
    partial: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Planned:
    """Load the desired state, pick this node (``labels``: see :func:`select_node`), observe,
    plan."""
    node = select_node(load(files, host), host.options.node, host, labels)
    return plan_for(node, host, adopt=adopt, partial=partial)


# ---------------------------------------------------------------- validate


def _add_validate(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "validate",
        help="check desired-state files offline (schema and catalogue rules)",
        description="Check desired-state files against the schema and the profile rules the "
        "catalogue knows (equal size, maxima, VF counts), without a host. Problems are "
        "printed as file:line:col: message. A profile name the catalogue does not know is an "
        "error for a model whose every profile it lists (a typo: 'did you mean'), a note "
        "otherwise (plan checks it against the host). With --explain NODE, also show which "
        "entry configures that node: its own entry under spec.nodes, or the node groups that "
        "select it and their GPU entries.",
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="desired-state files, or directories (their *.yaml and *.yml files)",
    )
    p.add_argument(
        "--lenient",
        action="store_true",
        help="accept, with a note, profile names the catalogue does not list even for a model "
        "it lists in full (hosts whose driver is newer than the catalogue)",
    )
    p.add_argument(
        "--explain",
        metavar="NODE",
        help="show which entry (the node's own, or which node groups) configures each GPU of "
        "node NODE; exit 1 when two groups would give one of its GPUs two layouts",
    )
    p.add_argument(
        "--labels",
        metavar="K=V[,K=V…]",
        help="with --explain: the node's labels (as the cluster has them), for node groups "
        "that select by labels",
    )
    p.add_argument(
        "--inventory",
        metavar="FILE",
        help="with --explain: the node's GPUs, as 'vgpuctl status -o json' prints them on "
        "it; each is then named with the entry that configures it",
    )
    p.add_argument(
        "--delegate",
        choices=("harvester", "none"),
        default="none",
        help="harvester: also apply delegate mode's offline rules (no cluster needed): "
        "MIG-backed profiles are refused, and time-sliced ones on a MIG-capable GPU "
        "(pcidevices-controller turns MIG mode on when it enables SR-IOV); none (default): "
        "the rules every mode shares",
    )
    p.set_defaults(handler=cmd_validate)
    return p


def cmd_validate(ns: argparse.Namespace, options: GlobalOptions) -> int:
    labels = None
    for given, flag in ((ns.labels, "--labels"), (ns.inventory, "--inventory")):
        if given is not None and ns.explain is None:
            raise UsageError(f"{flag} goes with --explain NODE")
    if ns.labels is not None:
        from reconciler.cli.explain import parse_labels

        labels = parse_labels(ns.labels)
    inventory = None
    if ns.inventory is not None:
        from reconciler.cli.explain import read_inventory

        inventory = read_inventory(Path(ns.inventory))
    host = Host(options)
    desired = load(ns.files, host, strict=not ns.lenient)
    if ns.delegate == "harvester":
        from reconciler.plan.mig import offline_problems

        refused = offline_problems(desired, host.catalog)
        if refused:
            count = len(refused)
            raise ValidationError(
                f"desired state is invalid in delegate mode: {count} problem{'s' * (count != 1)}",
                sorted(refused, key=lambda p: (p.file or "", p.line or 0, p.column or 0)),
            )
    gpus = sum(len(n.gpus) for n in desired.nodes.values())
    vgpus = 0
    for n in desired.nodes.values():
        for g in n.gpus:
            vgpus += len(g.vgpus or {}) + sum((g.profiles or {}).values())
    files = safe(", ".join(desired.files))
    for note in desired.notes:
        _err(f"note: {safe_lines(note)}")
    groups = ""
    if desired.groups:
        count = len(desired.groups)
        entries = sum(len(g.gpus) for g in desired.groups)
        groups = (
            f"; {count} node group{'s' * (count != 1)} with {entries} GPU "
            f"entr{'ies' if entries != 1 else 'y'}"
        )
    _out(
        f"{files}: valid ({len(desired.nodes)} node{'s' * (len(desired.nodes) != 1)}, "
        f"{gpus} GPU{'s' * (gpus != 1)}, {vgpus} vGPU{'s' * (vgpus != 1)}{groups})\n"
    )
    if ns.explain is not None:
        from reconciler.cli.explain import explain

        text, failing = explain(desired, ns.explain, labels, inventory)
        _out(text)
        return EXIT_ERROR if failing else EXIT_OK
    return EXIT_OK


# ---------------------------------------------------------------- plan


def _add_plan(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="show what apply would change on this node",
        description="Observe this node, compare it with the desired state and print the ordered "
        "actions that would converge it: + create, - remove, -/+ replace, ! blocked.",
    )
    p.add_argument(
        "file",
        metavar="FILE",
        nargs="+",
        help="desired-state files, or directories (their *.yaml and *.yml files)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "markdown"),
        default="text",
        help="text (default), json (the plan contract), or markdown (for a pull request's "
        "comment: summary first, a table per node, blocked steps highlighted)",
    )
    p.add_argument("--out", metavar="PLANFILE", help="also save the plan (JSON) for 'apply'")
    add_markdown_options(p)
    p.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 2 when there are changes (or blocked ones), 0 when none",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also list what is unchanged")
    p.add_argument(
        "--observed",
        metavar="host|cluster|FILE",
        default="host",
        help="where the current state comes from: this node's host (default), or the "
        "cluster's CR statuses — plans every node in the file, touching no host (for CI) — or "
        "a snapshot FILE of them ('export --observed cluster -o snapshot'; no cluster needed)",
    )
    p.add_argument(
        "--max-snapshot-age",
        metavar="DURATION",
        help="with --observed FILE: refuse a snapshot older than this (default 1h)",
    )
    add_adopt_option(p)
    add_partial_option(p, planning=True)
    add_labels_option(p)
    add_delegate_option(p)
    p.set_defaults(handler=cmd_plan)
    return p


def _byte_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 (no bound) or more bytes")
    return value


def add_markdown_options(p: argparse.ArgumentParser) -> None:
    """``-o markdown``'s bound (cli/markdown.py says what it leaves out, in which order)."""
    p.add_argument(
        "--max-bytes",
        type=_byte_count,
        default=60_000,  # markdown.DEFAULT_MAX_BYTES (not imported: plan's start stays light)
        metavar="N",
        help="-o markdown: at most N bytes of UTF-8 (default %(default)s, within GitHub's "
        "65,536-character comment; 0: no bound). Detail is left out to fit (device-plugin "
        "refreshes, cluster writes, notes, GPU steps not blocked, then node sections), with a "
        "note saying what; every blocked step and every node's counts are kept",
    )
    p.add_argument(
        "--full-plan",
        metavar="WHERE",
        help="-o markdown: where the full plan is, for the note of a shortened comment (e.g. "
        "'the JSON plan, artifact vgpuctl-plan of this workflow run')",
    )


def markdown_bounds(ns: argparse.Namespace) -> dict[str, Any]:
    """``plans_markdown``'s bound arguments from the command line."""
    return {"max_bytes": ns.max_bytes, "full_plan": ns.full_plan}


def cmd_plan(ns: argparse.Namespace, options: GlobalOptions) -> int:
    host = Host(options)
    labels = given_labels(ns, host)
    if ns.max_snapshot_age is not None and ns.observed in ("host", "cluster"):
        raise UsageError("--max-snapshot-age goes with --observed FILE (a snapshot)")
    if ns.observed != "host":
        return _plan_from_cluster(ns, host)
    if delegating(ns, host):
        from reconciler.cli.delegate import cmd_plan_delegate

        return cmd_plan_delegate(ns, host)
    planned = plan_files(ns.file, host, adopt=ns.adopt, partial=ns.partial, labels=labels)
    plan, inventory = planned.plan, planned.inventory
    if ns.out:
        # The desired GPUs as planned: a node group's entries made this host's GPUs.
        _write_plan_file(Path(ns.out), saved_plan_document(plan, planned.desired))
    if ns.output == "json":
        from reconciler.model.plan_json import plan_to_json

        _out(json.dumps(plan_to_json(plan), indent=2) + "\n")
    elif ns.output == "markdown":
        from reconciler.cli.markdown import plans_markdown

        _out(
            plans_markdown(
                [plan], inventories={plan.node: inventory}, observed="host", **markdown_bounds(ns)
            )
        )
    else:
        _out(plan_text(plan, inventory=inventory, style=_style(options), verbose=ns.verbose))
        if ns.out:
            _err(f"Saved the plan to {ns.out}: run 'vgpuctl apply {ns.out}' to apply exactly it.")
    return EXIT_CHANGES if ns.detailed_exitcode and plan.has_changes else EXIT_OK


def add_apply_options(p: argparse.ArgumentParser) -> None:
    """The options every command that applies takes (``apply``, ``watch``)."""
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long one sriov-manage call may take before it is killed (default 300); in "
        "delegate mode, how long to wait for pcidevices-controller at each step",
    )
    p.add_argument(
        "--verify-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for an action's effect to appear in sysfs (default 120: "
        "enabling VFs on many GPUs takes tens of seconds)",
    )
    p.add_argument(
        "--write-timeout",
        type=_positive_seconds,
        default=DEFAULT_WRITE_TIMEOUT,
        metavar="SECONDS",
        help="how long one sysfs write may take (default %(default)g): a kernel call that has "
        "not returned by then (removing a vGPU a VM vgpuctl could not see still holds) fails "
        "the action and is left to finish on its own",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def add_partial_option(p: argparse.ArgumentParser, *, planning: bool = False) -> None:
    what = "plan as 'apply --partial' would: " if planning else ""
    p.add_argument(
        "--partial",
        action="store_true",
        help=f"{what}give capacity up early. By default, while a VM holds a vGPU that a change "
        "needs gone, the removals that would only make room for the new vGPUs wait too, so the "
        "GPU keeps its working vGPUs; --partial removes them now and creates the rest once the "
        "VM lets go (node-local mode only)"
        + (". A saved plan made with it runs only with 'apply --partial'" if planning else ""),
    )


def add_adopt_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--adopt",
        action="store_true",
        help="take over SRIOVGPUDevice/VGPUDevice objects another controller manages "
        "(by default they are left alone)",
    )


def _plan_from_cluster(ns: argparse.Namespace, host: Host) -> int:
    """Plan every node of the desired state from the CR statuses in the cluster (CI)."""
    from reconciler.engine.observe import with_refusal_note
    from reconciler.observe import FleetReader
    from reconciler.observe.cluster import NoNodeStateError
    from reconciler.observe.harvester import observe_pcidevices_controller
    from reconciler.observe.nodes import all_node_labels
    from reconciler.plan.fleet import FleetMember, collector_batch, plan_fleet

    snapshot: tuple[str, float] | None = None
    api: ClusterApi
    if ns.observed == "cluster":
        live = host.cluster_api
        if live is None:
            raise UsageError("--observed cluster needs a cluster: pass --kubeconfig")
        api = live
    else:  # a snapshot file: the cluster as it was, no credentials
        from reconciler.cli.snapshot_command import age_text, max_age, read_snapshot

        now = time.time()
        api, taken = read_snapshot(
            Path(ns.observed), limit_age=max_age(ns.max_snapshot_age), now=now
        )
        snapshot = (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(taken)), now - taken)
        _err(
            f"Planned from the snapshot {safe(ns.observed)}, taken at {snapshot[0]} "
            f"({age_text(max(0.0, snapshot[1]))} ago): the cluster may have changed since."
        )
    if ns.out:
        raise UsageError("--out saves a plan for one node's apply; not with --observed cluster")
    # A fleet's desired state and objects are read and planned in one batch, the cyclic
    # collector paused (plan.fleet): it would walk every kept object again and again.
    with collector_batch():
        # The fleet's objects are being read (FleetReader) while the desired state is.
        reader = FleetReader(api, kubevirt_namespace=host.options.kubevirt_namespace)
        desired = load(ns.file, host)
        # Node groups select among the cluster's nodes (one list of them, only with groups).
        labels = all_node_labels(api) if desired.groups else {}
        names = desired.selected(labels)
        observed = reader.observe(names)
        del reader  # what it read is in ``observed`` now, and nowhere else
        unread = {n: o for n, o in observed.items() if isinstance(o, ReconcilerError)}
        # A node without a VGPUNodeState may be one the cluster does not have (a typo): said so.
        # Any other error of a node's objects is its own, and kept.
        stateless: dict[str, ObserveError] = {
            n: o for n, o in unread.items() if isinstance(o, NoNodeStateError)
        }
        if stateless:
            _name_missing_nodes(stateless, labels if desired.groups else None, api)
            unread.update(stateless)
        fleet = plan_fleet(
            (
                FleetMember(desired.node(name, labels.get(name, {})), *seen)
                for name in names
                # Taken out as planned: a node's objects are let go once its plan is made (a
                # plan keeps none of them), so the fleet's do not all outlive their planning.
                if not isinstance(seen := observed.pop(name), ReconcilerError)
            ),
            catalog=host.catalog,
            adopt=ns.adopt,
            allow_list_grace=host.options.allow_list_grace,
        )
    plans = fleet.plans
    # Where Harvester's pcidevices-controller runs (or may), apply and watch on each node refuse
    # to act: each plan says so first, as a node's own plan does.
    controller = observe_pcidevices_controller(api)
    plans = tuple(with_refusal_note(p, controller) for p in plans)
    failures = {n: e for n in names if (e := unread.get(n) or fleet.failures.get(n)) is not None}
    changed = [p for p in plans if p.has_changes]
    totals = {"create": 0, "change": 0, "remove": 0, "blocked": 0}
    for p in plans:
        for key, value in p.summary.to_json().items():
            totals[key] += value
    if ns.output == "json":
        from reconciler.model.plan_json import plan_to_json

        doc = {
            "formatVersion": FORMAT_VERSION,
            "observed": "cluster",
            **({"snapshotTakenAt": snapshot[0]} if snapshot else {}),
            "plans": [plan_to_json(p) for p in plans],
            "errors": {n: e.lines() for n, e in failures.items()},
            "summary": {"nodes": len(names), "nodesWithChanges": len(changed), **totals},
        }
        _out(json.dumps(doc, indent=2) + "\n")
    elif ns.output == "markdown":
        from reconciler.cli.markdown import plans_markdown

        # A reviewer reads how old the state planned from is (examples/gitops/snapshot.md).
        where = f"cluster snapshot of {snapshot[0]}" if snapshot else "cluster"
        _out(plans_markdown(plans, failures=failures, observed=where, **markdown_bounds(ns)))
    else:
        style = _style(host.options)
        for p in plans:
            _out(style.bold(f"=== node {safe(p.node)} ===") + "\n")
            _out(plan_text(p, style=style, verbose=ns.verbose) + "\n")
        for name, error in failures.items():
            _out(style.bold(f"=== node {safe(name)} ===") + "\n")
            for line in map(safe, error.lines()):
                _err(line if _is_located(line) else f"error: {line}")
            _out("\n")
        _out(
            f"Cluster plan: {len(names)} node{'s' * (len(names) != 1)}, {len(changed)} with "
            f"changes; {totals['create']} to create, {totals['change']} to change, "
            f"{totals['remove']} to remove, {totals['blocked']} blocked.\n"
        )
    if failures:
        return EXIT_ERROR
    return EXIT_CHANGES if ns.detailed_exitcode and changed else EXIT_OK


def _name_missing_nodes(
    unread: dict[str, ObserveError],
    nodes: Mapping[str, object] | None,
    api: ClusterApi,
) -> None:
    """Each node of ``unread`` the cluster has no Node of gets that as its error (a node of the
    files vgpuctl cannot have reconciled): ``nodes`` the cluster's (None: not listed yet; then
    one list, only now, and the errors are left as they are if it fails)."""
    from reconciler.desired.shape import did_you_mean
    from reconciler.observe.nodes import all_node_labels

    if nodes is None:
        try:
            nodes = all_node_labels(api)
        except ReconcilerError:
            return
    for name in [n for n in unread if n not in nodes]:
        close = did_you_mean(name, nodes)
        hint = f"; did you mean {close!r}?" * (close is not None)
        unread[name] = ObserveError(
            f"no Node named {name!r} in the cluster{hint} (the desired state names it: a "
            "mistyped name, or a node not joined yet)"
        )


def _is_located(line: str) -> bool:
    head = line.split(": ", 1)[0]
    return head.rsplit(":", 1)[-1].isdigit()


def saved_plan_document(plan: Plan, node: DesiredNode) -> dict[str, Any]:
    """The plan JSON plus the desired state it was planned from (to re-check after apply)."""
    from reconciler.cli.documents import node_document
    from reconciler.model.plan_json import plan_to_json

    doc = plan_to_json(plan)
    doc["desiredState"] = node_document(node)
    return doc


def _write_plan_file(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` saved at ``path`` as a new file renamed into place (``cli/files.py``). A link,
    FIFO, device or directory at ``path`` is refused, not followed nor replaced: vgpuctl runs as
    root, and a link planted where the operator saves plans would make it overwrite the link's
    target. (Should one be planted between the check and the rename, it is replaced.)"""
    from reconciler.cli.files import replace_file, special_file

    try:
        kind = special_file(path)
        if kind is not None:
            raise UsageError(
                f"cannot write the plan to {path}: it is {kind}, which vgpuctl neither follows "
                "nor replaces (remove it, or save the plan elsewhere)"
            )
        replace_file(path, json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- apply


def _add_apply(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "apply",
        help="converge this node on a desired state (or run a saved plan)",
        description="Plan and apply: each action re-checks its precondition, acts, and verifies "
        "its effect; the first failure stops the run (exit 1). A saved plan (from "
        "'plan --out') is planned again from the desired state it carries and runs only if "
        "that fresh plan has the same actions; otherwise nothing is changed and the difference "
        "is named. vGPUs in use by a VM are never removed. Without a terminal, --yes is "
        "required.",
    )
    p.add_argument("file", metavar="FILE|PLANFILE", nargs="+")
    p.add_argument("-y", "--yes", action="store_true", help="apply without asking")
    add_adopt_option(p)
    add_partial_option(p)
    p.add_argument("-v", "--verbose", action="store_true", help="also list what is unchanged")
    add_apply_options(p)
    add_labels_option(p)
    add_delegate_option(p)
    add_rollout_options(p)
    add_progress_options(p)
    add_budget_options(p, waits=True)
    p.set_defaults(handler=cmd_apply)
    return p


def cmd_apply(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.apply import NodeLock

    host = Host(options)
    given_labels(ns, host)  # a usage error before the lock
    if delegating(ns, host):
        from reconciler.cli.delegate import cmd_apply_delegate

        return cmd_apply_delegate(ns, host)
    # The lock comes first: a second apply fails at once naming the holder, never plans from
    # a host the first one is still changing, and the plan shown (and confirmed) is the one
    # the engine runs, planned under the lock.
    command = " ".join(["vgpuctl", *sys.argv[1:]])
    with NodeLock(host.state_dir, options.node, command=command), _terminable():
        return _apply_locked(ns, options, host, command=command)


@contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM ends the run as SIGINT does, unwinding: the node lock and a rollout slot held
    are released on the way out (exit 143), instead of the slot waiting out its lease."""
    import signal

    def terminate(signum: int, frame: object) -> None:
        _err("terminated: stopping (the node lock and any rollout slot are released)")
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread (a test calling main): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _apply_locked(
    ns: argparse.Namespace, options: GlobalOptions, host: Host, *, command: str
) -> int:
    from reconciler.apply.slots import SlotUnavailableError
    from reconciler.cli.budget import node_budget
    from reconciler.cli.planfile import read_saved_plan
    from reconciler.engine import RunSettings, reconcile

    saved = read_saved_plan(Path(ns.file[0])) if len(ns.file) == 1 else None
    expected: Expected | None = None
    labels = given_labels(ns, host)
    if saved is not None:
        if labels is not None:
            raise UsageError("--labels goes with a desired state: a saved plan carries its GPUs")
        node, expected = _saved_promise(saved, host)
    else:
        node = select_node(load(ns.file, host), host.options.node, host, labels)

    style = _style(options)

    def review(planned: Planned) -> bool:
        plan = planned.plan
        _out(plan_text(plan, inventory=planned.inventory, style=style, verbose=ns.verbose))
        if not plan.actions:
            return False
        if not ns.yes:
            _confirm(plan)
        return True

    said: list[str] = []

    def waiting(busy: SlotsBusy) -> None:
        if busy.message not in said:  # once per distinct set of holders
            said.append(busy.message)
            _err(f"{safe(busy.message[0].upper() + busy.message[1:])}…")

    try:
        result = reconcile(
            host.ports(command_timeout=ns.timeout, write_timeout=ns.write_timeout),
            node,
            settings=RunSettings(
                adopt=ns.adopt,
                partial=ns.partial,
                verify_timeout=ns.verify_timeout,
                command=command,
            ),
            expected=expected,
            review=review,
            on_outcome=_progress(style),
            lock_held=True,
            budget=node_budget(ns, host, wait=ns.slot_timeout, on_wait=waiting),
        )
    except SlotUnavailableError as exc:
        _err(style.red(f"error: {safe(exc.message)}"))
        return EXIT_NO_SLOT
    if not result.ran:
        return EXIT_CHANGES if result.planned.plan.blocked else EXIT_OK
    if not _report_run(result, style):
        return EXIT_ERROR
    verification = result.verification
    if verification is None:  # pragma: no cover - a run that went well is verified
        raise ApplyError("the run was not verified")
    return _report_convergence(verification)


def _saved_promise(saved: SavedPlan, host: Host) -> tuple[DesiredNode, Expected]:
    """The desired state ``saved`` carries, and its actions as the promise a fresh plan under
    the node lock must keep (the engine checks it; the file's own actions never run: whoever
    can write the file could have put anything in them)."""
    from reconciler.cli.documents import node_from_document
    from reconciler.engine import Expected

    name = str(saved.path)
    plan = saved.plan
    if plan.node != host.options.node:
        raise UsageError(
            f"{name} was planned for node {excerpt(plan.node)}, this is {host.options.node!r} "
            "(pass --node to pick the node)"
        )
    node = node_from_document(saved.desired, host.catalog, f"{name}#desiredState")
    if node.name != plan.node:
        raise ValidationError(
            f"{name}: not a valid saved plan: its desiredState is for node "
            f"{excerpt(node.name)}, the plan for node {excerpt(plan.node)}"
        )
    return node, Expected(plan.actions, name=name, fingerprint=plan.observed_fingerprint)


def _confirm(plan: Plan) -> None:
    if not sys.stdin.isatty():
        raise UsageError("apply needs --yes when not run from a terminal (nothing was changed)")
    n = len(plan.actions)
    sys.stderr.write(
        f"\nApply {n} action{'s' * (n != 1)} to node {safe(plan.node)}? "
        "Only 'yes' will be accepted: "
    )
    sys.stderr.flush()
    answer = sys.stdin.readline().strip()
    if answer != "yes":
        raise UsageError("apply cancelled (nothing was changed)")


def _report_run(result: Reconciled, style: Style) -> bool:
    """Say how the run went (its progress was shown as it happened). True when it went well."""
    failed = result.failed
    if failed is not None:
        _err(style.red(f"Apply failed: {safe(failed.message)}"))
        _err("Nothing after the failed action ran; fix the cause and run apply again.")
        return False
    if result.mismatch is not None:
        _err(style.red(f"Apply stopped: {safe(result.mismatch.message)}"))
        return False
    if result.refreshes:
        _err(
            f"Device plugins: {safe(', '.join(a.target for a in result.refreshes))} change; a "
            "running device plugin picks this up on its next rescan."
        )
    _err(f"Applied {result.applied} actions in {result.seconds:.1f} s.")
    refreshed = result.verification.refreshed if result.verification else None
    if refreshed is not None:
        n = len(refreshed.outcomes)
        _err(
            f"Wrote the status of {n} object{'s' * (n != 1)} again from the host as it now is "
            "(what a plan can only predict: the driver's type ids once SR-IOV is on, the types "
            "still creatable, who holds a vGPU)."
        )
    return True


def _progress(style: Style) -> Callable[[Outcome], None]:
    marks = {"done": style.green("✓"), "noop": "=", "failed": style.red("✗"), "skipped": "-"}

    def show(outcome: Outcome) -> None:
        a = outcome.action
        status = outcome.status.value
        _err(
            f"  {marks.get(status, ' ')} {a.seq:>3} {a.kind.value} {safe(a.target)}: "
            f"{safe(outcome.message)} ({outcome.seconds:.2f} s)"
        )

    return show


def _report_convergence(verification: Verification) -> int:
    from reconciler.engine import Convergence

    after, inventory = verification.remaining, verification.planned.inventory
    if verification.verdict is Convergence.CONVERGED:
        _out("Converged: the node matches the desired state.\n")
        return EXIT_OK
    if verification.verdict is Convergence.BLOCKED:
        _out(f"Applied; {len(after.blocked)} change(s) remain blocked:\n")
        for b in after.blocked:
            _out(f"  ! {b.kind.value} {safe(b.target)}: {safe(b.reason)}\n")
        return EXIT_CHANGES
    _out("Not converged: a fresh plan still has changes:\n")
    _out(plan_text(after, inventory=inventory))
    return EXIT_ERROR


# ---------------------------------------------------------------- status / export / assert


def _add_status(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="show the node's GPUs, VFs and vGPUs",
        description="Observe the host. 'table' is the 'kubectl get vgpudevices' view; 'json' is "
        "the inventory contract (schemas/inventory.schema.json); 'crds' prints the "
        "SRIOVGPUDevice and VGPUDevice objects vgpuctl writes for what the host has now. In "
        "delegate mode (--delegate harvester, or auto where pcidevices-controller runs): the "
        "nodes' vGPUs as Harvester's objects show them, every node that has any (or the NODEs "
        "named), each VF's spec, what its status says it hosts, whether the spec is PENDING "
        "(not carried out) and why, and which VM uses it; 'json' is "
        "schemas/delegate-status.schema.json. Reads only.",
    )
    p.add_argument("-o", "--output", choices=("table", "json", "yaml", "crds"), default="table")
    p.add_argument(
        "nodes",
        metavar="NODE",
        nargs="*",
        help="delegate mode: only these nodes (default: every node with an SRIOVGPUDevice or "
        "VGPUDevice object)",
    )
    add_delegate_option(p)
    p.set_defaults(handler=cmd_status)
    return p


def cmd_status(ns: argparse.Namespace, options: GlobalOptions) -> int:
    host = Host(options)
    if _status_delegating(ns, host):
        from reconciler.cli.delegate_status import cmd_status_delegate

        return cmd_status_delegate(ns, host)
    if ns.nodes:
        raise UsageError(
            "status NODE …: node names select nodes of the delegate view (--delegate harvester); "
            "node-local status shows this node's host (--node names it)"
        )
    inventory = host.observe_all()
    if ns.output == "crds":
        import yaml

        from reconciler.cli.documents import crd_objects

        objects = crd_objects(inventory, host.catalog)
        _out(yaml.safe_dump_all(objects, sort_keys=False, width=1 << 16) if objects else "")
    elif ns.output == "json":
        _out(json.dumps(inventory.to_json(), indent=2) + "\n")
    elif ns.output == "yaml":
        import yaml

        _out(yaml.safe_dump(inventory.to_json(), sort_keys=False))
    else:
        if not inventory.gpus:
            _err(f"No NVIDIA SR-IOV vGPU-capable GPU found under {safe(options.sysfs_root)}.")
            return EXIT_OK
        _out(_pictures(inventory, host, style=_style(options)))
        _out(status_table(inventory))
        _err(gpu_summary(inventory))
        for note in inventory.notes:
            _err(f"note: {safe_lines(note)}")
    return EXIT_OK


def _status_delegating(ns: argparse.Namespace, host: Host) -> bool:
    """Whether ``status`` shows Harvester's objects. As every command decides, except that in
    auto mode a cluster that cannot be reached shows this node's host, with a note: status
    only reads, and the host is what an operator looks at while the cluster is down (a plan or
    an apply fails closed there instead, since writing the host could race pcidevices)."""
    try:
        return delegating(ns, host)
    except ClusterUnavailableError as e:
        if getattr(ns, "delegate", "auto") != "auto":
            raise
        _err(
            f"note: {safe_lines(e.message)}; cannot tell whether pcidevices-controller runs: "
            "showing this node's host (--delegate harvester: Harvester's objects)"
        )
        return False


def _pictures(inventory: Inventory, host: Host, *, style: Style) -> str:
    """One line per GPU (its framebuffer split by vGPU, and what more fits), then a blank line;
    the bar narrows to the terminal (COLUMNS, else the terminal's width, else 100)."""
    import shutil

    from reconciler.cli.render import HELD, gpu_picture

    columns = shutil.get_terminal_size((100, 24)).columns
    lines = []
    for gpu in inventory.gpus:
        model = host.catalog.model(gpu.model) if gpu.model else None
        lines.append(
            gpu_picture(
                gpu,
                total_mib=model.framebuffer_mib if model else None,
                model_short=model.short if model else "",
                columns=columns,
                style=style,
            )
        )
    if any(vf.vgpu and vf.vgpu.in_use for g in inventory.gpus for vf in g.vfs):
        lines.append(f"({HELD}: held by a VM, never removed)")
    return "\n".join(lines) + "\n\n"


def _add_export(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "export",
        help="print the observed state as a desired-state file",
        description="Write what this node has now as a desired-state document; planning it "
        "against the same host gives 'No changes.'",
    )
    p.add_argument("--name", default=None, help="metadata.name (default: the node name)")
    p.add_argument(
        "--observed",
        choices=("host", "cluster"),
        default="host",
        help="this node's host (default), or the cluster: with -o snapshot, every node's "
        "observed state as 'plan --observed cluster' reads it, for 'plan --observed FILE'",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("yaml", "snapshot"),
        default="yaml",
        help="yaml: a desired-state file (default); snapshot: a cluster snapshot (JSON, "
        "schemas/cluster-snapshot.schema.json)",
    )
    p.set_defaults(handler=cmd_export)
    return p


def cmd_export(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import yaml

    from reconciler.cli.documents import export_document, unexportable

    if (ns.observed == "cluster") != (ns.output == "snapshot"):
        raise UsageError("a snapshot is of the cluster: export --observed cluster -o snapshot")
    if ns.output == "snapshot":
        from reconciler.cli.snapshot_command import snapshot_document

        _out(snapshot_document(Host(options)))
        return EXIT_OK
    inventory = Host(options).observe_all()
    doc = export_document(inventory, name=ns.name or inventory.node)
    for gpu in inventory.gpus:
        reason = unexportable(gpu)
        if reason is not None:
            _err(f"note: left out: {safe(reason)}")
    _out(
        f"# Exported by vgpuctl {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
        f"from node {safe(inventory.node)}\n"
    )
    _out(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return EXIT_OK


def _add_assert(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "assert",
        help="exit 0 if the node matches the desired state, 2 if it drifted",
        description="Plan silently; print a one-line verdict. Exit 0 matches, 2 drift, 1 error.",
    )
    p.add_argument("file", metavar="FILE", nargs="+")
    add_delegate_option(p)
    p.set_defaults(handler=cmd_assert)
    return p


def cmd_assert(ns: argparse.Namespace, options: GlobalOptions) -> int:
    host = Host(options)
    if delegating(ns, host):
        from reconciler.cli.delegate import cmd_assert_delegate

        return cmd_assert_delegate(ns, host)
    try:
        planned = plan_files(ns.file, host)
    except AbsentError as exc:
        # What the desired state wants is not on the host: drift, never "matches".
        _out(f"node {safe(host.options.node)} has drifted: {safe(exc.message)}\n")
        for line in exc.lines():
            _out(f"  {safe(line)}\n")
        return EXIT_CHANGES
    plan = planned.plan
    if not plan.has_changes and not planned.mode_drift:
        _out(f"node {safe(plan.node)} matches the desired state\n")
        return EXIT_OK
    # A GPU declared in mixed-size mode but read in another, which no step switches, differs
    # from the desired state even with nothing to change: drift, never "matches".
    verdict = summary_line(plan) if plan.has_changes else "its vGPU mode differs"
    _out(f"node {safe(plan.node)} has drifted: {verdict}\n")
    for a in plan.actions:
        _out(f"  {a.kind.value} {safe(a.target)}: {safe(a.reason)}\n")
    for b in plan.blocked:
        _out(f"  ! {b.kind.value} {safe(b.target)}: {safe(b.reason)}\n")
    for text in planned.mode_drift:
        _out(f"  ~ {safe(text)}\n")
    return EXIT_CHANGES


# ---------------------------------------------------------------- doctor


def _add_doctor(sub: Subparsers) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check this node's preconditions, one line each with what to do",
        description="Check what a vGPU node needs: the IOMMU on, the NVIDIA host driver loaded "
        "(and its version), each GPU's vGPU side (mdev types or NVIDIA's vendor-specific "
        "files) and bound driver (a GPU passed through whole is left alone), sriov-manage "
        "runnable, the hold probe seeing every process of the host, the kubelet's "
        "device-plugin directory writable, and KubeVirt: without a cluster, whether its "
        "virt-handler (which removes mdevs its CR does not allow-list) runs on the host; with "
        "one, whether its CR allow-lists every mdev vGPU type of the host. Reads only. Exit 0 "
        "when every check holds, 1 otherwise.",
    )
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(handler=cmd_doctor)
    return p


def cmd_doctor(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.observe.doctor import CheckStatus, examine_node

    host = Host(options)
    report = examine_node(
        sysfs_root=options.sysfs_root,
        node=options.node,
        catalog=host.catalog,
        sriov_manage=host.sriov_manage_argv,
        hold_probe=host.hold_probe(),
        kubelet_dir=host.kubelet_dir,
        kubelet_expected=host.has_cluster,
        kubevirt_sighting=host.kubevirt_sighting,
        cluster_api=_cluster_api(host) if host.has_cluster else None,
        kubevirt_namespace=options.kubevirt_namespace,
        unsafe_kubevirt_allow_listed=options.kubevirt_allow_listed,
    )
    if ns.output == "json":
        _out(json.dumps(report.to_json(), indent=2) + "\n")
        return EXIT_OK if report.ok else EXIT_ERROR
    style = _style(options)
    marks = {
        CheckStatus.OK: style.green("ok  "),
        CheckStatus.FAIL: style.red("FAIL"),
        CheckStatus.INFO: style.dim("info"),
    }
    width = max(len(safe(c.name)) for c in report.checks)
    for check in report.checks:
        _out(f"{marks[check.status]}  {safe(check.name).ljust(width)}  {safe(check.found)}\n")
        if check.status is CheckStatus.FAIL and check.fix:
            _out(f"      {' ' * width}  → {safe(check.fix)}\n")
    failed = sum(1 for c in report.checks if c.status is CheckStatus.FAIL)
    node = safe(options.node)
    if failed:
        _out(f"\n{failed} of {len(report.checks)} checks failed on node {node}.\n")
        return EXIT_ERROR
    _out(f"\nNode {node} is ready for vGPUs ({len(report.checks)} checks).\n")
    return EXIT_OK


def _cluster_api(host: Host) -> Callable[[], ClusterApi]:
    """The cluster's API, connected when ``doctor`` first asks (a failure is its check's)."""

    def connect() -> ClusterApi:
        api = host.cluster_api
        if api is None:  # pragma: no cover - asked only when a cluster is configured
            raise UsageError("no cluster configured")
        return api

    return connect


#: Each command of this module, by name, with the function that adds it to the parser.
REGISTRY: dict[str, Callable[[Subparsers], argparse.ArgumentParser]] = {
    "validate": _add_validate,
    "plan": _add_plan,
    "apply": _add_apply,
    "status": _add_status,
    "export": _add_export,
    "assert": _add_assert,
    "doctor": _add_doctor,
}
