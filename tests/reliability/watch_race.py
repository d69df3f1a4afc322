"""Watch concurrency: a running ``vgpuctl watch`` and two ``vgpuctl apply --yes`` of the same
desired state, started together on one simulated node.

Per trial, one of :data:`~tests.reliability.concurrency.LAYOUTS` (enough work that the others
arrive while the first still acts) and a start order, in rotation: the watch first, the applies
first, or interleaved (an apply, the watch, the other apply), each start a random small offset
(up to 0.4 s; 0.05 s between two applies) after the one before. The watch runs until the host
is settled (the applies ended, and since then the watch rescanned twice, is ready and reports
the node converged), then gets SIGTERM.

The node lock (``<state-dir>/<node>.lock``) lets one process act. An apply takes it before it
observes: another apply, or the watch, holding it makes it fail at once naming the holder's
pid (exit 1). The watch observes and plans without the lock, takes it only when there is
something to do, and plans again under it: when the lock is held it logs a warning (error kind
``lock``) and retries with backoff; when the work was done meanwhile it finds nothing to do.

Judged per trial, from the processes' own words (apply's progress lines, watch's JSON log lines)
and from the tree:

- exactly one process made changes (a ``✓`` line; a ``status: done`` line);
- every other apply failed fast naming the pid of another process of the trial, or found nothing
  to do, or carried out only no-ops (``=``); the watch, if it did not proceed, retried after lock
  conflicts naming another process's pid and/or found nothing to do; a watch reconcile failing
  for any other reason is counted by kind and fails the trial;
- no double work: no UUID created twice and no VF given two vGPUs (double creates), no (kind,
  target) carried out twice across the processes;
- the tree is safe (``hosts.safety``), the host converged (a fresh ``plan``), the watch ready
  at the end, no traceback or internal error, SIGTERM ends the watch with exit 0.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reconciler.sim import build_host
from tests.reliability.concurrency import LAYOUTS, LOCK_HELD, NODE, Role, role_of
from tests.reliability.generators import CATALOG, document
from tests.reliability.hosts import (
    CREATED_UUID,
    Run,
    SimNode,
    Started,
    histogram,
    kernel_quiet,
    read_truth,
    run_cases,
    safety,
)
from tests.reliability.sizes import Context
from tests.reliability.watching import WatchProcess

#: Start orders, in rotation over the trials (so even two trials see different races).
MODES = ("applies-first", "watch-first", "interleaved")
APPLY_TIMEOUT = 120.0
#: Generous: the machine is shared, a slow one must not fail a trial.
WATCH_START_TIMEOUT = 60.0
#: Longest offset between the start of the watch and an apply's, either way (seconds).
MAX_OFFSET = 0.4
SETTLE_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
#: Rescans the watch must complete after the last apply ended before it counts as settled: the
#: first sees the host as the applies left it, the second comes after the reconcile it started.
SETTLE_RESCANS = 2
FAILURES_SHOWN = 10
WATCH = "watch"
APPLIES = ("apply-a", "apply-b")

_PID = re.compile(r"\bpid (\d+)\b")


@dataclass(frozen=True, slots=True)
class Work:
    """One action a process reports it carried out."""

    process: str
    kind: str
    target: str
    message: str


@dataclass(slots=True)
class WatchRole:
    """What the watch of a trial turned out to do."""

    #: proceeded | lock-conflict | nothing-to-do | stale-plan-noops | failed-reconcile |
    #: broken | unexpected
    role: str = "unexpected"
    exit: str = ""
    done: int = 0
    noops: int = 0
    failed_actions: int = 0
    lock_retries: int = 0
    lock_retries_naming_another: int = 0
    #: Reconcile failures other than the lock, by error kind (``observe``, ``apply``, ...).
    other_failures: Counter[str] = field(default_factory=Counter)
    failure_messages: list[str] = field(default_factory=list)
    bugs: list[str] = field(default_factory=list)
    ready_at_end: bool = False
    settled: bool = False


@dataclass(slots=True)
class Trial:
    index: int
    layout: int
    mode: str
    offsets: dict[str, float] = field(default_factory=dict)
    applies: list[Role] = field(default_factory=list)
    #: Refused apply → the process its lock message named as the holder ("?" when none of them).
    named: dict[str, str] = field(default_factory=dict)
    watch: WatchRole = field(default_factory=WatchRole)
    double_creates: list[str] = field(default_factory=list)
    double_work: list[str] = field(default_factory=list)
    safety: list[str] = field(default_factory=list)
    converged: bool = False
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def proceeded(self) -> list[str]:
        who = [r.label for r in self.applies if r.role == "proceeded"]
        return [WATCH, *who] if self.watch.role == "proceeded" else who

    def _apply_fine(self, r: Role) -> bool:
        return (
            r.role in ("proceeded", "nothing-to-do", "stale-plan-noops")
            or (r.role == "lock-conflict" and r.names_holder)
        )  # fmt: skip

    def _watch_fine(self) -> bool:
        w = self.watch
        return (
            w.role in ("proceeded", "lock-conflict", "nothing-to-do", "stale-plan-noops")
            and w.lock_retries_naming_another == w.lock_retries
            and not w.other_failures
            and not w.bugs
            and w.exit == "exit 0"
            and w.ready_at_end
            and w.settled
        )

    @property
    def ok(self) -> bool:
        return (
            len(self.proceeded) == 1
            and all(self._apply_fine(r) for r in self.applies)
            and self._watch_fine()
            and not self.double_creates
            and not self.double_work
            and not self.safety
            and self.converged
            and not self.errors
        )

    def failure(self) -> str:
        w = self.watch
        roles = ", ".join(f"{r.label}: {r.role} ({r.run.outcome()})" for r in self.applies)
        roles += f", watch: {w.role} ({w.exit or 'not stopped'})"
        details = [*self.errors, *self.double_creates, *self.double_work, *self.safety]
        if len(self.proceeded) != 1:
            details.append(f"{len(self.proceeded)} processes made changes: {self.proceeded}")
        if not self.converged:
            details.append("host not converged")
        details += [f"watch: {b}" for b in w.bugs[:2]]
        if w.other_failures or w.lock_retries_naming_another != w.lock_retries:
            details += [f"watch: {m}" for m in w.failure_messages[:2]]
        if not w.settled:
            details.append("watch did not settle (ready, converged, rescanned) in time")
        elif not w.ready_at_end:
            details.append("watch /readyz not ready at the end")
        for r in self.applies:
            if not self._apply_fine(r):
                details.append(f"{r.label}: {r.run.messages(2)}")
        return (
            f"trial {self.index} (layout {self.layout}, {self.mode}, offsets {self.offsets}): "
            f"{roles}; " + "; ".join(details[:5])
        )


# --- the watch's side -------------------------------------------------------------------------


def _rescans(watch: WatchProcess) -> float | None:
    return watch.metric("vgpuctl_rescan_duration_seconds_count")


def _settle(watch: WatchProcess) -> bool:
    """Wait (bounded) until the watch looked at the host as the applies left it and is done with
    it: ``SETTLE_RESCANS`` rescans since now, ready, and the last reconcile converged."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    # Needed before any GET: ``WatchProcess.get`` alone never reads the address from the log.
    if not watch.wait_listening(timeout=WATCH_START_TIMEOUT):
        return False
    base: float | None = None
    while time.monotonic() < deadline and watch.alive():
        if base is None:
            base = _rescans(watch)
        else:
            count = _rescans(watch)
            if (
                count is not None
                and count >= base + SETTLE_RESCANS
                and watch.metric("vgpuctl_converged") == 1
                and watch.ready()
            ):
                return True
        time.sleep(0.1)
    return False


def judge_watch(
    logs: list[dict[str, Any]], bugs: list[str], run: Run, others: list[int], role: WatchRole
) -> None:
    """Fill in ``role`` from the watch's log lines; ``others``: the applies' pids."""
    role.exit = run.outcome()
    role.bugs = bugs
    statuses = Counter(str(d.get("status")) for d in logs if "status" in d)
    role.done, role.noops = statuses["done"], statuses["noop"]
    role.failed_actions = statuses["failed"] + statuses["skipped"]
    for d in logs:
        message = str(d.get("msg", ""))
        if not message.startswith("reconcile failed:"):
            continue
        kind = str(d.get("error"))
        if kind == "lock" and LOCK_HELD in message:
            role.lock_retries += 1
            named = _PID.search(message)
            if named and int(named[1]) in others:
                role.lock_retries_naming_another += 1
            else:
                role.failure_messages.append(message[:300])
        else:
            role.other_failures[kind] += 1
            role.failure_messages.append(f"[{kind}] {message[:300]}")
    if role.bugs or run.hung or run.killed:
        role.role = "broken"
    elif role.failed_actions:
        role.role = "unexpected"
    elif role.done:
        role.role = "proceeded"
    elif role.other_failures:
        role.role = "failed-reconcile"
    elif role.lock_retries:
        role.role = "lock-conflict"
    elif role.noops:
        role.role = "stale-plan-noops"
    else:
        role.role = "nothing-to-do"


# --- double work ------------------------------------------------------------------------------


def _work(applies: dict[str, Run], watch: WatchProcess) -> list[Work]:
    found = [
        Work(label, p.kind, p.target, p.message)
        for label, run in applies.items()
        for p in run.progress()
        if p.mark == "✓"
    ]
    found += [Work(WATCH, d.kind, d.target, d.message) for d in watch.done()]
    return found


def find_double_work(work: list[Work], trial: Trial) -> None:
    creates = [w for w in work if w.kind == "vgpu-create"]
    uuids: Counter[str] = Counter()
    for w in creates:
        m = CREATED_UUID.search(w.message)
        if m is None:  # the check must not go blind on a changed message
            trial.errors.append(f"no UUID in {w.process}'s create message: {w.message!r}")
        else:
            uuids[m[1]] += 1
    vfs = Counter(w.target for w in creates)
    trial.double_creates = [f"vGPU {u} created {n} times" for u, n in uuids.items() if n > 1]
    trial.double_creates += [f"VF {vf} given a vGPU {n} times" for vf, n in vfs.items() if n > 1]
    by_action: dict[tuple[str, str], list[str]] = {}
    for w in work:
        by_action.setdefault((w.kind, w.target), []).append(w.process)
    trial.double_work = [
        f"{kind} {target} carried out {len(who)} times ({', '.join(who)})"
        for (kind, target), who in by_action.items()
        if len(who) > 1
    ]


# --- one trial --------------------------------------------------------------------------------


def run_trial(index: int, rng: random.Random, directory: Path) -> Trial:
    started_at = time.monotonic()
    layout = rng.randrange(len(LAYOUTS))
    host_spec, desired_gpus = LAYOUTS[layout]
    trial = Trial(index, layout, MODES[index % len(MODES)])
    host_dir = directory / "host"
    build_host(host_dir, {**host_spec, "extraDevices": False}, catalog=CATALOG)
    desired_file = directory / "desired.yaml"
    desired_file.write_text(yaml.safe_dump(document(NODE, desired_gpus), sort_keys=False))
    node = SimNode(host_dir, NODE)

    # "apply-a" is the first of the two applies to start. Offsets are drawn for every trial
    # (the same draws whatever the mode); each mode uses those between its starts.
    offsets = {
        "apply->apply": round(rng.uniform(0.0, 0.05), 3),
        # Each process needs about 0.3 s (here) from its start to the lock: a process started
        # up to about that much later may still take it first.
        "apply->watch": round(rng.uniform(0.0, MAX_OFFSET), 3),
        "watch->apply": round(rng.uniform(0.0, MAX_OFFSET), 3),
    }
    trial.offsets = offsets
    watch: WatchProcess | None = None
    applies: dict[str, Started] = {}

    def start_apply(label: str) -> None:
        applies[label] = node.start("apply", desired_file, "--yes", out_dir=directory, label=label)

    def start_watch() -> WatchProcess:
        return WatchProcess(node, desired_file, out_dir=directory, label=WATCH)

    try:
        if trial.mode == "watch-first":
            watch = start_watch()
            time.sleep(offsets["watch->apply"])
            start_apply("apply-a")
            time.sleep(offsets["apply->apply"])
            start_apply("apply-b")
        elif trial.mode == "applies-first":
            start_apply("apply-a")
            time.sleep(offsets["apply->apply"])
            start_apply("apply-b")
            time.sleep(offsets["apply->watch"])
            watch = start_watch()
        else:  # interleaved
            start_apply("apply-a")
            time.sleep(offsets["apply->watch"])
            watch = start_watch()
            time.sleep(offsets["watch->apply"])
            start_apply("apply-b")

        runs = {label: s.finish(timeout=APPLY_TIMEOUT) for label, s in applies.items()}
        trial.watch.settled = _settle(watch)
        trial.watch.ready_at_end = watch.ready()
        watch_run = watch.terminate(timeout=STOP_TIMEOUT)
    finally:
        # Only on a harness error is anything still running: stop it with the kernel quiet.
        with kernel_quiet(node.sysfs_root):
            for s in applies.values():
                if s.proc.poll() is None:
                    s.kill()
            if watch is not None and watch.alive():
                watch.kill()

    assert watch is not None
    pids = {label: s.pid for label, s in applies.items()}
    pids[WATCH] = watch.pid
    for label, run in runs.items():
        others = [pid for other, pid in pids.items() if other != label]
        trial.applies.append(role_of(label, run, others))
        if LOCK_HELD in run.stderr:
            named = _PID.search(run.stderr.split(LOCK_HELD, 1)[1])
            holder = [o for o, pid in pids.items() if named and pid == int(named[1])]
            trial.named[label] = holder[0] if holder else "?"
    judge_watch(
        watch.logs(), watch.bugs(), watch_run, [pids[label] for label in APPLIES], trial.watch
    )
    for r in trial.applies:
        if r.run.bug:
            trial.errors.append(f"{r.label}: {r.run.bug}")
    find_double_work(_work(runs, watch), trial)

    gpus = [g["address"] for g in host_spec["gpus"]]
    trial.safety = safety(read_truth(node.sysfs_root, gpus), {}).problems()
    left = node.converged(desired_file)
    trial.converged = not left
    trial.errors += left[:3]
    trial.seconds = round(time.monotonic() - started_at, 2)
    return trial


# --- the scenario -----------------------------------------------------------------------------


def watch_concurrency(ctx: Context) -> dict[str, Any]:
    """Scenario: a watch and two applies racing on one node. Returns its figures."""
    started = time.monotonic()

    def broken(i: int, message: str) -> Trial:
        trial = Trial(i, -1, MODES[i % len(MODES)])
        trial.errors.append(message)
        return trial

    # One trial at a time: the race is between the trial's own processes.
    trials = run_cases(
        range(ctx.size.watch_race_trials),
        lambda i, directory: run_trial(i, ctx.rng("watch_race", i), directory),
        broken,
        base=ctx.scratch("watch_race"),
        budget=ctx.size.budget,
        jobs=1,
        index=lambda i: i,
    )

    applies = [r for t in trials for r in t.applies]
    conflicts = [r for r in applies if r.role == "lock-conflict"]
    watches = [t.watch for t in trials]
    failed = [t for t in trials if not t.ok]
    other_failures: Counter[str] = Counter()
    for w in watches:
        other_failures.update(w.other_failures)
    figures: dict[str, Any] = {
        "trials": len(trials),
        "planned_trials": ctx.size.watch_race_trials,
        "modes": histogram(t.mode for t in trials),
        "layouts": histogram(t.layout for t in trials),
        "who_proceeded": histogram("+".join(t.proceeded) or "nobody" for t in trials),
        "who_proceeded_by_mode": {
            mode: histogram("+".join(t.proceeded) or "nobody" for t in trials if t.mode == mode)
            for mode in MODES
        },
        "trials_with_exactly_one_proceeding": sum(1 for t in trials if len(t.proceeded) == 1),
        "roles": {
            WATCH: histogram(w.role for w in watches),
            **{label: histogram(r.role for r in applies if r.label == label) for label in APPLIES},
        },
        "apply_lock_conflicts": len(conflicts),
        "apply_lock_conflicts_naming_the_holder": sum(1 for r in conflicts if r.names_holder),
        "apply_lock_holders_named": histogram(
            f"{label} named {holder}" for t in trials for label, holder in t.named.items()
        ),
        "lock_conflict_max_seconds": round(max((r.run.seconds for r in conflicts), default=0), 2),
        "watch_lock_retries": sum(w.lock_retries for w in watches),
        "watch_lock_retries_naming_an_apply": sum(w.lock_retries_naming_another for w in watches),
        "trials_with_a_watch_lock_retry": sum(1 for w in watches if w.lock_retries),
        "watch_other_reconcile_failures": dict(sorted(other_failures.items())),
        "trials_with_a_lock_conflict": sum(
            1
            for t in trials
            if t.watch.lock_retries or any(r.role == "lock-conflict" for r in t.applies)
        ),
        "nothing_to_do": {
            WATCH: sum(1 for w in watches if w.role == "nothing-to-do"),
            "applies": sum(1 for r in applies if r.role == "nothing-to-do"),
        },
        "stale_plan_all_noops": sum(1 for r in applies if r.role == "stale-plan-noops")
        + sum(1 for w in watches if w.role == "stale-plan-noops"),
        "broken_or_unexpected": sum(1 for r in applies if r.role in ("broken", "unexpected"))
        + sum(1 for w in watches if w.role in ("broken", "unexpected", "failed-reconcile")),
        "double_creates": sum(len(t.double_creates) for t in trials),
        "double_work": sum(len(t.double_work) for t in trials),
        "host_safety_violations": sum(len(t.safety) for t in trials),
        "converged": sum(1 for t in trials if t.converged),
        "watch_settled": sum(1 for w in watches if w.settled),
        "watch_ready_at_end": sum(1 for w in watches if w.ready_at_end),
        "watch_exit_codes": histogram(w.exit or "not stopped" for w in watches),
        "tracebacks": sum(len(w.bugs) for w in watches)
        + sum(1 for r in applies if r.run.bug is not None),
        "trial_max_seconds": max((t.seconds for t in trials), default=0.0),
        "seconds": round(time.monotonic() - started, 1),
        "budget_exceeded": len(trials) < ctx.size.watch_race_trials,
        "failures": [t.failure() for t in failed[:FAILURES_SHOWN]],
    }
    figures["ok"] = not failed and not figures["budget_exceeded"]
    return figures
