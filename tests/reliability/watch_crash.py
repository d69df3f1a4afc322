"""Crash safety of ``vgpuctl watch``: SIGKILLed at random points, with faults, then restarted.

Each run builds a random simulated host and two random valid desired states for it, A and B
(``generators.py``), and kills a running ``vgpuctl watch`` in one of three phases:

- **start**: watch is started on A and dies during its first reconcile;
- **edit**: watch first converges on A (``/readyz``), then the file is replaced the way an
  editor saves it (write a temporary file, rename it over) with B, and watch dies during the
  reconcile of B;
- **idle**: watch converges on A and dies at a random moment while nothing happens (a rescan
  may be under way).

A VM holds some of the vGPUs the desired state in force at the kill would remove
(``vgpuctl sim hold``: before the start, or, in the edit phase, once A is converged), and
random one-shot faults are armed with ``vgpuctl sim fail`` (``--writes N``, ``--sriov
error|silent``) just before the reconcile that is to die. Watch dies one of two ways:

- ``sim fail --crash-after N``: the simulator SIGKILLs the process that made the Nth change
  right after it took effect (for a change ``sriov-manage`` made: its parent, watch);
- SIGKILL of watch's process group from outside after a random delay, timed from the start (or
  the edit) or from the first action it logs done after it, sent while the simulated kernel is
  idle (``kernel_quiet``).

Then the faults left unused are cleared, stray ``sriov-manage`` processes reaped, the safety
invariants checked on the tree, and watch is **restarted** on the same file (the desired state
in force: A, or B after an edit). It must become ready (bounded), after which ``plan -o json``
must find nothing to do but changes a held vGPU blocks, and ``/metrics`` must agree
(``vgpuctl_converged``, ``vgpuctl_blocked_actions``). SIGTERM must then end it with exit 0
within a bound. Over the whole run: no UUID twice, no VF with two vGPUs, no dangling mdev link,
every held vGPU still on its VF with its type, no orphan, unmanaged GPUs untouched, no traceback
or internal error in either watch's log, no hung process, no ``sriov-manage`` left running.

Every run has a cluster, as ``crash.py``'s runs have (``sweeper.py``): the API-server emulator
with a KubeVirt CR allow-listing the types the host starts with, every watch (and ``plan``)
pointed at it, and KubeVirt's virt-handler beside them (:mod:`reconciler.sim.virt_handler`).
Its heartbeat runs after each watch starts, every ``HEARTBEAT_EVERY`` seconds while the harness
waits on a watch (to be ready, to settle, to log an action done), after the kill, once the
restarted watch is ready and after it exited; what its sweeps of mdevs not allow-listed took is
counted (``sweeper``: vGPUs lost, held ones among them; both must be 0).

Every host is built by the simulator directly (``build_host``), so vgpuctl has no record of the
vGPUs it starts with. Half the runs (``unrecorded``) start from a host with such vGPUs on both
interfaces (``generators.unrecorded_on_both``, shared with ``crash.py``'s ``at_a_maximum``): one
GPU made a vfio GPU filled to a type's maximum, so no VF lists that type any more and only the
driver names it (``nvidia-smi vgpu -s -v``, issue 31), and another (if the host has one) an mdev
GPU with vGPUs the simulator made. Half the runs (``forget``) delete the state directory (the
record of vfio types, the journal) between the killed watch and its restart, as a node whose
disk was lost would have it: after an edit, the record the first watch wrote on A is gone too.
The two rotate against the phases and kill methods (``make_cases``). Counted: mdev vGPUs and
vfio vGPUs no list names at the start (``unrecorded_mdev_vgpus_at_start``,
``unlisted_vfio_vgpus_at_start``), the runs with the latter, with both
(``runs_unrecorded_on_both_interfaces``), the deletions (``state_dir_deleted``) and the restarts
that then found vfio vGPUs no list named
(``restarts_without_record_with_unlisted_vfio_vgpus``), and the runs whose first or restarted
watch asked the driver to name a type (``driver_asked_for_type_names``: the simulator's
``nvidiaSmiTypeQueries``).

A kill is classed by what it interrupted, from the tree after it: *mid-reconcile* (host work was
left and the dying reconcile had logged an action done, or the simulator killed it at a change),
*before the first action* (work left, nothing done yet) or *after the reconcile* (nothing left
to do: it had finished before the kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from reconciler.model import VgpuRemove
from reconciler.sim import SimHost, build_host
from tests import oracle
from tests.doubles.emulator import ApiServerEmulator
from tests.holds import asked
from tests.reliability.faults import emulator as cluster_emulator
from tests.reliability.generators import (
    CATALOG,
    MODELS,
    desired_gpu,
    document,
    draw_examples,
    has_work,
    host_and_desired,
    unrecorded_on_both,
)
from tests.reliability.hosts import (
    Findings,
    Held,
    Run,
    SimNode,
    body,
    disarm_faults,
    histogram,
    kernel_quiet,
    orphans,
    plan_in_process,
    read_truth,
    reap_strays,
    run_cases,
    safety,
    unlisted_vfio_vgpus,
)
from tests.reliability.sizes import Context
from tests.reliability.sweeper import Sweeps, seed_cluster
from tests.reliability.sweeper import figures as sweeper_figures
from tests.reliability.watching import WatchProcess

NODE = "watch-crash-node"
#: Bounds (generous: two shared cores). A run that needs more has found something.
READY_TIMEOUT = 90.0  # a (re)started watch settles the node
SETTLE_TIMEOUT = 90.0  # a reconcile that is to die gets that far
EXIT_TIMEOUT = 30.0  # a killed process is gone; a SIGTERMed one has exited
#: Idle kills land this many seconds (at most) after watch settled.
IDLE_DELAY = 1.5
#: Seconds between virt-handler heartbeats while the harness waits on a watch (KubeVirt's come
#: every minute or two: these are many more, for the sweeps to land in a reconcile).
HEARTBEAT_EVERY = 0.25
#: Figures keep this many failure descriptions.
FAILURES_SHOWN = 10
PHASES = ("start", "edit", "idle")
#: The moment a kill point is timed from, by phase: "trigger" is the start or the edit.
ANCHORS = ("trigger", "first-action")

Example = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


@st.composite
def host_and_two_desired(draw: st.DrawFn, node: str) -> Example:
    """A simulator spec and two valid desired states for it (A as ``host_and_desired`` draws
    it, then B drawn afresh for the same GPUs, managed or not independently of A)."""
    host, first = draw(host_and_desired(node))
    models = {m.short: m for m in MODELS}
    second = [
        entry
        for gpu in host["gpus"]
        if (entry := desired_gpu(draw, gpu["address"], models[gpu["model"]])) is not None
    ]
    return host, first, document(node, second)


def _entry_key(entry: dict[str, Any]) -> object:
    """What a GPU's desired entry asks for, whatever its form's spelling."""
    if entry["sriov"] != "enabled":
        return "disabled"
    if "profiles" in entry:
        return ("counts", sorted((body(p), n) for p, n in entry["profiles"].items() if n))
    return ("vfs", sorted((str(k), body(p)) for k, p in (entry.get("vgpus") or {}).items()))


def _keep(example: Example) -> bool:
    """Work at the start, and an edit that changes what some GPU managed by both asks for."""
    host, first, second = example
    (a_node,) = first["spec"]["nodes"].values()
    (b_node,) = second["spec"]["nodes"].values()
    a = {e["address"]: _entry_key(e) for e in a_node["gpus"]}
    b = {e["address"]: _entry_key(e) for e in b_node["gpus"]}
    return has_work((host, first)) and any(a[g] != b[g] for g in a.keys() & b.keys())


@dataclass(frozen=True, slots=True)
class Case:
    index: int
    host: dict[str, Any]
    first: dict[str, Any]  # A: the desired state watch starts on
    second: dict[str, Any]  # B: the edit (phase "edit" only)
    phase: str  # start | edit | idle
    kill: str  # crash-after | sigkill
    writes: int
    sriov: str | None
    holds: int
    #: crash-after: N = 1 + int(pick × host actions); sigkill: the delay's share of its range
    #: (above 1.0 the reconcile may be over first).
    pick: float
    anchor: str  # trigger | first-action
    seed: str
    #: Whether :func:`unrecorded_on_both` filled the host: a vfio GPU at a type's maximum and
    #: an mdev GPU with vGPUs, none of which vgpuctl has a record of.
    unrecorded: bool = False
    #: Delete the state directory between the killed watch and its restart.
    forget: bool = False

    @property
    def final(self) -> dict[str, Any]:
        """The desired state in force at the kill, and on restart."""
        return self.second if self.phase == "edit" else self.first


@dataclass(slots=True)
class Result(Findings):
    """What one run did and found (filled in as it goes)."""

    index: int
    phase: str
    kill: str
    gpus: list[str]
    actions: int = 0  # host actions of the reconcile that was to die
    crash_after: int | None = None
    delay: float | None = None
    anchor: str | None = None
    first: str = ""  # how the first watch ended: killed, or (a finding) anything else
    #: mid-reconcile | before-first-action | after-the-reconcile | finished (crash never came)
    landed: str = ""
    work_left: int = 0  # host actions a fresh plan found right after the kill
    host_calls: int = 0
    holds: int = 0
    armed: dict[str, Any] = field(default_factory=dict)
    left_unused: dict[str, Any] = field(default_factory=dict)
    restart_ready: float | None = None  # seconds from restart to /readyz 200; None: never
    #: Reconciles of the restarted watch that failed before it settled (not a failure: retried).
    restart_failed: int = 0
    converged: bool = False  # restarted, ready, and plan -o json agrees
    sigterm: str = ""
    metrics_wrong: list[str] = field(default_factory=list)
    #: virt-handler heartbeats run, and the vGPUs their sweeps took.
    sweeps: Sweeps = field(default_factory=Sweeps)
    #: The host as built (vgpuctl has no record of any of it): mdev vGPUs, and vfio vGPUs
    #: whose type id no VF listed (only the driver names it).
    mdev_at_start: int = 0
    unlisted_at_start: int = 0
    #: Whether :func:`unrecorded_on_both` filled the host (``Case.unrecorded``).
    unrecorded: bool = False
    #: Whether the state directory was deleted before the restart (and existed then), and the
    #: vfio vGPUs whose type no VF listed that the restarted watch then found.
    forgot: bool = False
    unlisted_at_restart: int = 0
    #: ``nvidia-smi vgpu -s -v`` calls (vgpuctl asking the driver to name a vfio type id no
    #: list or record names): by the first watch, and by the restarted one.
    driver_asked: int = 0
    driver_asked_on_restart: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.converged
            and self.sigterm == "exit 0"
            and not self.metrics_wrong
            and not self.problems()
            and not self.sweeps.lost
        )

    def failure(self) -> str:
        parts = [*self.problems(), *self.metrics_wrong]
        if self.sweeps.lost:
            parts.insert(0, self.sweeps.describe())
        if not self.converged:
            parts.insert(0, "not converged after the restart")
        if self.sigterm != "exit 0":
            parts.append(f"SIGTERM: {self.sigterm or 'not sent'}")
        head = (
            f"run {self.index} ({self.phase}, {self.kill}, crash-after {self.crash_after}, "
            f"delay {self.delay} from {self.anchor}, armed {self.armed}, first {self.first}, "
            f"landed {self.landed})"
        )
        return f"{head}: " + "; ".join(parts[:4])


def make_cases(ctx: Context) -> list[Case]:
    """The runs: phases and kill methods alternate (every four runs cover start and edit,
    crash-after and an outside SIGKILL; about one run in twelve is an idle kill); kill points,
    faults and holds are drawn per run.

    Half the runs start from a host :func:`unrecorded_on_both` filled (vGPUs vgpuctl has no
    record of on both interfaces, a vfio GPU's at a type's maximum), and half lose the state
    directory before the restart: the two rotate against the phases and kill methods, so every
    four runs have two of each, and every sixteen each pairing of the two with each phase and
    kill method."""
    count = ctx.size.watch_crash_runs
    examples = draw_examples(
        host_and_two_desired(NODE), count=count, seed_value=ctx.seed, keep=_keep
    )
    cases = []
    for i in range(count):
        host, first, second = examples[i % len(examples)]
        rng = ctx.rng("watch-crash", i)
        phase = "idle" if rng.random() < 1 / 12 else ("start", "edit")[i % 2]
        turn = (i + i // 4) % 4
        case = Case(
            index=i,
            host=host,
            first=first,
            second=second,
            phase=phase,
            kill="sigkill" if phase == "idle" else ("crash-after", "sigkill")[i // 2 % 2],
            writes=rng.choice((0, 0, 0, 0, 0, 0, 1, 2, 3)),
            sriov=rng.choice((None, None, None, None, None, None, "error", "silent")),
            holds=rng.choice((0, 1, 1, 2)),
            pick=rng.uniform(0.0, 1.15),
            anchor=rng.choice(ANCHORS),
            seed=f"{ctx.seed}:watch-crash-run:{i}",
            forget=turn in (0, 1),
        )
        if turn in (0, 3) and (filled := unrecorded_on_both(host, rng)) is not None:
            case = replace(case, host=filled, unrecorded=True)
        cases.append(case)
    return cases


def _delay(case: Case, actions: int) -> float:
    """Seconds from the anchor to the outside kill.

    Watch spends 0.25 to 0.5 s starting (imports, the operations port, the first observation
    and plan); after an edit, 50 to 100 ms pass before its first action (file event, debounce,
    reading, planning). An action takes 5 to 40 ms (a vGPU is quick, an ``sriov-manage`` call a
    process of its own; a silent sriov-manage failure adds the verify wait and a retry a second
    later). Timed from the trigger, kills land in start-up, planning and the first actions;
    timed from the first action logged done (seen some milliseconds late), among the actions.
    """
    share = case.pick / 1.15
    if case.anchor == "first-action":
        return round(share * (0.02 + 0.01 * actions), 3)
    silent = 4.0 if case.sriov == "silent" else 0.0
    if case.phase == "start":
        return round(0.15 + share * (0.35 + 0.015 * actions + silent), 3)
    return round(share * (0.12 + 0.015 * actions + silent), 3)


def _write_desired(path: Path, doc: dict[str, Any]) -> None:
    """As an editor saves: the whole file written beside it, then renamed over it."""
    temp = path.with_name(f".{path.name}.swp")
    temp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(temp, path)


def _host_actions(node: SimNode, desired_file: Path) -> list[Any]:
    return [a for a in plan_in_process(node, desired_file).actions if a.kind.is_host]


def _since(watch: WatchProcess, mark: int) -> list[dict[str, Any]]:
    return watch.logs()[mark:]


def _settled_line(doc: dict[str, Any]) -> bool:
    """A reconcile that ended without failing (converged, or only VM-blocked changes left)."""
    return doc.get("result") in ("converged", "blocked")


def _wait(watch: WatchProcess, mark: int, want: str, *, timeout: float) -> bool:
    """Wait (bounded) for a log line after ``mark``: ``want`` is "done" (an action carried out)
    or "settled" (a reconcile ended well). False if it exited or the time ran out first."""
    match = (lambda d: d.get("status") == "done") if want == "done" else _settled_line
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(match(d) for d in _since(watch, mark)):
            return True
        if not watch.alive():
            return False
        watch.tick()
        time.sleep(0.005)
    return False


@dataclass(slots=True)
class _Run:
    """One run under way: its case, host, files and processes, and what it found so far."""

    case: Case
    directory: Path
    result: Result
    node: SimNode
    gpus: list[str]
    desired_file: Path
    rng: random.Random
    emu: ApiServerEmulator
    held: dict[str, Held] = field(default_factory=dict)
    watches: list[WatchProcess] = field(default_factory=list)
    #: The host when the final desired state took over (an edit: once A had converged).
    since: oracle.Snapshot | None = None
    #: Where the dying reconcile's log lines begin, and when it was set off.
    mark: int = 0
    triggered: float = 0.0

    def unmanaged(self, doc: dict[str, Any]) -> list[str]:
        managed = {g["address"] for g in doc["spec"]["nodes"][NODE]["gpus"]}
        return sorted(set(self.gpus) - managed)

    def snapshot(self, gpus: list[str]) -> dict[str, tuple[object, ...]]:
        truth = read_truth(self.node.sysfs_root, self.gpus)
        return {g: truth.snapshot(g) for g in gpus}

    def watch(self, label: str) -> WatchProcess:
        """A watch started on the desired file, a heartbeat right after, and more while the
        harness waits on it."""
        w = WatchProcess(
            self.node, self.desired_file, out_dir=self.directory, label=label, tick=self.tick
        )
        self.watches.append(w)
        self.heartbeat()
        return w

    def heartbeat(self) -> None:
        """One virt-handler heartbeat beside the node."""
        self.result.sweeps.heartbeat(self.node, self.emu)

    def tick(self) -> None:
        """A waiting loop's poll: a heartbeat when the last is old enough."""
        self.result.sweeps.every(HEARTBEAT_EVERY, self.node, self.emu)

    # -- setting the stage -----------------------------------------------------------------

    def hold(self, desired_file: Path) -> None:
        """A VM holds up to ``case.holds`` of the vGPUs ``desired_file`` would remove; when
        that blocks every change, it lets go of them one by one until a change is left to do
        (a reconcile to kill)."""
        removable = sorted(
            a.uuid for a in _host_actions(self.node, desired_file) if isinstance(a, VgpuRemove)
        )
        holding = self.rng.sample(removable, min(self.case.holds, len(removable)))
        for uuid in holding:
            held_run = self.node.sim("hold", uuid)
            if held_run.returncode != 0:
                self.result.errors.append(f"sim hold {uuid}: {held_run.messages()}")
        while holding and not _host_actions(self.node, desired_file):
            uuid = holding.pop()
            released = self.node.sim("release", uuid)
            if released.returncode != 0:
                self.result.errors.append(f"sim release {uuid}: {released.messages()}")
        sim = SimHost.open(self.node.sysfs_root)
        assert sim is not None
        truth = read_truth(self.node.sysfs_root, self.gpus)
        self.held = truth.held(sim.hold_probe().scan(asked(*(v.uuid for v in truth.vgpus))).held)
        self.result.holds = len(self.held)

    def arm(self) -> None:
        """This run's one-shot faults (and crash point), for the reconcile that is to die."""
        case, result = self.case, self.result
        fail_args: list[str] = []
        if case.writes:
            fail_args += ["--writes", str(case.writes)]
            result.armed["writes"] = case.writes
        if case.sriov:
            fail_args += ["--sriov", case.sriov]
            result.armed["sriov"] = case.sriov
        if case.kill == "crash-after":
            result.crash_after = 1 + int(case.pick * result.actions)
            fail_args += ["--crash-after", str(result.crash_after)]
        if fail_args:
            armed = self.node.sim("fail", *fail_args)
            if armed.returncode != 0:
                result.errors.append(f"sim fail {fail_args}: {armed.messages()}")

    # -- the kill --------------------------------------------------------------------------

    def kill_outside(self, watch: WatchProcess) -> None:
        if watch.alive():
            with kernel_quiet(self.node.sysfs_root):
                watch.kill()
                watch.proc.wait(timeout=EXIT_TIMEOUT)

    def kill(self, watch: WatchProcess) -> None:
        """Let the reconcile after ``mark`` (set off by the start or the edit) die."""
        case, result = self.case, self.result
        if case.phase == "idle":
            if not watch.wait_ready(timeout=READY_TIMEOUT):
                result.errors.append(
                    f"watch never ready on the desired state (idle phase): {watch.get('/readyz')}"
                )
            result.anchor = "ready"
            result.delay = round(self.rng.uniform(0.0, IDLE_DELAY), 3)
            time.sleep(result.delay)
            self.kill_outside(watch)
            return
        if case.kill == "crash-after":
            if result.actions == 0:
                # Nothing to change, so no change to die at: killed once it settled (a
                # reconcile with nothing to do logs nothing: after an edit, once it read it).
                if case.phase == "start":
                    watch.wait_ready(timeout=READY_TIMEOUT)
                else:
                    watch.wait_log(
                        lambda d: d.get("msg") == "the desired state changed", timeout=30
                    )
                    time.sleep(0.2)
            elif not _wait(watch, self.mark, "settled", timeout=SETTLE_TIMEOUT) and watch.alive():
                result.errors.append(
                    f"watch neither settled nor was killed within {SETTLE_TIMEOUT:.0f} s"
                )
            self.kill_outside(watch)  # the crash never came: killed now, idle
            return
        result.anchor = case.anchor
        result.delay = _delay(case, result.actions)
        start = self.triggered
        if case.anchor == "first-action" and result.actions:
            if _wait(watch, self.mark, "done", timeout=SETTLE_TIMEOUT):
                start = time.monotonic()
            elif watch.alive():
                result.errors.append(f"no action done within {SETTLE_TIMEOUT:.0f} s")
        remaining = start + result.delay - time.monotonic()
        if remaining > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):  # still running, as it should
                watch.proc.wait(timeout=remaining)
        self.kill_outside(watch)

    def classify(self, watch: WatchProcess) -> None:
        """Where the kill landed, from what a fresh plan finds left to do."""
        case, result = self.case, self.result
        try:
            result.work_left = len(_host_actions(self.node, self.desired_file))
        except Exception as exc:
            result.errors.append(f"the tree a killed watch left cannot be planned: {exc}")
            return
        if case.kill == "crash-after" and case.phase != "idle":
            # The simulator's crash came when its countdown is used up; else the harness
            # killed it idle.
            sim_killed = result.first == "killed" and "crashAfter" not in result.left_unused
            result.landed = "mid-reconcile" if sim_killed else "finished"
        elif not result.work_left:
            result.landed = "after-the-reconcile"
        elif any(d.get("status") == "done" for d in _since(watch, self.mark)):
            result.landed = "mid-reconcile"
        else:
            result.landed = "before-first-action"

    # -- checks ----------------------------------------------------------------------------

    def check(self, run: Run, watch: WatchProcess) -> None:
        """The invariants that hold at every moment, and the process's own health."""
        result = self.result
        result.bugs += [f"{watch.label}: {b}" for b in watch.bugs()]
        if run.hung:
            result.hung.append(f"{watch.label} watch hung: {run.messages()}")
        found = safety(read_truth(self.node.sysfs_root, self.gpus), self.held)
        result.add_safety(found)

    def restart(self) -> None:
        """Watch again on the same file: ready, nothing left but blocked changes, metrics that
        say so, and a clean exit on SIGTERM."""
        result = self.result
        watch = self.watch("restart")
        started = time.monotonic()
        ready = watch.wait_ready(timeout=READY_TIMEOUT)
        if ready:
            result.restart_ready = round(time.monotonic() - started, 3)
            self.heartbeat()  # converged: the allow-list has every type the host has
        else:
            result.errors.append(
                f"restarted watch not ready within {READY_TIMEOUT:.0f} s: "
                f"{watch.get('/readyz')} {watch.errors()[-2:]}"
            )
        left, plan = self.node.verdict(self.desired_file, self.held, since=self.since)
        result.converged = ready and not left
        if ready and left:
            result.not_converged = [f"ready, yet not converged: {p}" for p in left[:3]]
            if plan is not None:
                # What vgpuctl still plans, and why, beside the watches' logs in the run's kept
                # tree: watch said converged, so the two disagree (the plan has the reasons
                # and each update's changed fields).
                text = json.dumps(plan, indent=1, sort_keys=True)
                (self.directory / "plan-after-restart.json").write_text(text)
                result.not_converged += [
                    f"{a.get('kind')} {a.get('target')}: {a.get('reason')}"
                    for a in plan.get("actions", [])[:3]
                ]
        if ready and plan is not None:
            self.check_metrics(watch, plan)
        failed = watch.metric("vgpuctl_reconciles_total", result="failed")
        result.restart_failed = int(failed or 0)
        term = watch.terminate(timeout=EXIT_TIMEOUT)
        result.sigterm = term.outcome()
        result.strays += len(reap_strays(self.node.sriov_manage))
        self.heartbeat()
        self.check(term, watch)

    def check_metrics(self, watch: WatchProcess, plan: dict[str, Any]) -> None:
        wrong = self.result.metrics_wrong
        blocked = len(plan.get("blocked", []))
        converged = watch.metric("vgpuctl_converged")
        blocked_metric = watch.metric("vgpuctl_blocked_actions")
        if converged != (0.0 if blocked else 1.0):
            wrong.append(f"vgpuctl_converged {converged} with {blocked} blocked change(s)")
        if blocked_metric != float(blocked):
            wrong.append(f"vgpuctl_blocked_actions {blocked_metric}, the plan has {blocked}")
        if blocked and not self.held:
            wrong.append(f"{blocked} blocked change(s) with no vGPU held")


def run_case(case: Case, directory: Path) -> Result:
    with cluster_emulator(kubevirt=False) as emu:
        return _run_case(case, directory, emu)


def _run_case(case: Case, directory: Path, emu: ApiServerEmulator) -> Result:
    started = time.monotonic()
    host_dir = directory / "host"
    build_host(host_dir, case.host, catalog=CATALOG)
    # A directory of its own: watch hears every event there (not its own log files').
    desired_file = directory / "desired" / "desired.yaml"
    desired_file.parent.mkdir()
    _write_desired(desired_file, case.first)
    run = _Run(
        case=case,
        directory=directory,
        result=Result(case.index, case.phase, case.kill, [g["model"] for g in case.host["gpus"]]),
        node=SimNode(host_dir, NODE, extra=seed_cluster(emu, directory, host_dir)),
        gpus=[g["address"] for g in case.host["gpus"]],
        desired_file=desired_file,
        rng=random.Random(case.seed),  # noqa: S311 - reproducible choices, not cryptography
        emu=emu,
    )
    result, truth = run.result, read_truth(run.node.sysfs_root, run.gpus)
    result.unrecorded = case.unrecorded
    result.mdev_at_start = sum(1 for v in truth.vgpus if not v.whole_vf)
    result.unlisted_at_start = unlisted_vfio_vgpus(run.node.sysfs_root, run.gpus)
    try:
        _run(run)
    finally:
        for w in run.watches:
            run.kill_outside(w)
    run.result.seconds = time.monotonic() - started
    return run.result


def _run(run: _Run) -> None:
    case, result, node = run.case, run.result, run.node
    before_a = run.snapshot(run.unmanaged(case.first))
    before_final = before_a
    if case.phase != "edit":
        run.hold(run.desired_file)
        result.actions = len(_host_actions(node, run.desired_file))
        if case.phase == "start":
            run.arm()
    calls_before = node.stats()
    watch = run.watch("first")
    run.triggered = time.monotonic()
    if case.phase == "edit":
        if not watch.wait_ready(timeout=READY_TIMEOUT):
            result.errors.append(
                f"watch not ready on A within {READY_TIMEOUT:.0f} s: {watch.get('/readyz')}"
            )
        now = run.snapshot(list(before_a))
        result.unmanaged_touched += [
            f"GPU {g}, unmanaged in A, changed while converging on A"
            for g in before_a
            if now[g] != before_a[g]
        ]
        # B in a file of its own first (out of watch's sight), to plan it and to choose what
        # a VM holds.
        planned_b = run.directory / "b.yaml"
        planned_b.write_text(yaml.safe_dump(case.second, sort_keys=False))
        run.hold(planned_b)
        result.actions = len(_host_actions(node, planned_b))
        before_final = run.snapshot(run.unmanaged(case.second))
        run.since = oracle.snapshot(node.sysfs_root)
        run.arm()
        calls_before = node.stats()
        run.mark = len(watch.logs())
        run.triggered = time.monotonic()
        _write_desired(run.desired_file, case.second)
    run.kill(watch)
    first = watch.finish(timeout=EXIT_TIMEOUT)
    result.first = first.outcome()
    if not first.killed:
        result.errors.append(f"the first watch ended on its own: {first.outcome()}")
    result.strays += len(reap_strays(node.sriov_manage))
    calls_after = node.stats()
    result.host_calls = sum(calls_after[k] - calls_before[k] for k in calls_after)
    result.left_unused = disarm_faults(node.sysfs_root)
    run.heartbeat()  # the host as the kill left it
    run.check(first, watch)
    run.classify(watch)
    result.driver_asked = node.driver_type_queries()
    if case.forget:
        # The node lost its disk: no record of the vfio types either watch wrote.
        result.forgot = node.forget()
        result.unlisted_at_restart = unlisted_vfio_vgpus(node.sysfs_root, run.gpus)

    run.restart()
    result.driver_asked_on_restart = node.driver_type_queries() - result.driver_asked

    after = read_truth(node.sysfs_root, run.gpus)
    result.orphans = orphans(after, case.final["spec"]["nodes"][NODE]["gpus"], set(run.held))
    result.unmanaged_touched += [
        f"unmanaged GPU {g} changed" for g in before_final if after.snapshot(g) != before_final[g]
    ]


def _broken(case: Case, message: str) -> Result:
    result = Result(case.index, case.phase, case.kill, [])
    result.errors.append(message)
    return result


def watch_crash_safety(ctx: Context) -> dict[str, Any]:
    """Scenario: randomized kills of watch, then a restart that must converge. Its figures."""
    started = time.monotonic()
    results = run_cases(
        make_cases(ctx),
        run_case,
        _broken,
        base=ctx.scratch("watch-crash"),
        budget=ctx.size.budget,
        jobs=ctx.jobs,
        index=lambda c: c.index,
    )
    return _figures(ctx, results, seconds=time.monotonic() - started)


def _where(r: Result) -> str:
    n, actions = r.crash_after or 0, r.actions
    if n > actions:
        return "beyond the last change"
    return "first change" if n == 1 else ("last change" if n == actions else "in between")


def _kill_points(results: list[Result]) -> dict[str, Any]:
    points: dict[str, Any] = {}
    for phase in PHASES:
        of_phase = [r for r in results if r.phase == phase]
        crash = [r for r in of_phase if r.kill == "crash-after"]
        outside = [r for r in of_phase if r.kill == "sigkill"]
        entry: dict[str, Any] = {"runs": len(of_phase)}
        if crash:
            entry["crash_after"] = {
                "runs": len(crash),
                "killed": sum(1 for r in crash if r.landed == "mid-reconcile"),
                "finished_before_the_kill": sum(1 for r in crash if r.landed == "finished"),
                "N": histogram(r.crash_after for r in crash),
                "where": histogram(_where(r) for r in crash),
            }
        if outside:
            entry["external_sigkill"] = {
                "runs": len(outside),
                "killed": sum(1 for r in outside if r.work_left),
                "killed_mid_reconcile": sum(1 for r in outside if r.landed == "mid-reconcile"),
                "killed_before_the_first_action": sum(
                    1 for r in outside if r.landed == "before-first-action"
                ),
                "finished_before_the_kill": sum(
                    1 for r in outside if r.landed == "after-the-reconcile"
                ),
                "timed_from": histogram(r.anchor for r in outside),
                "delay_s": histogram(f"{0.25 * int((r.delay or 0) / 0.25):.2f}" for r in outside),
                "host_calls_before_the_kill": histogram(r.host_calls for r in outside),
            }
        points[phase] = entry
    points["killed_mid_reconcile"] = sum(1 for r in results if r.landed == "mid-reconcile")
    return points


def _figures(ctx: Context, results: list[Result], *, seconds: float) -> dict[str, Any]:
    actions = [r.actions for r in results] or [0]
    ready = [r.restart_ready for r in results if r.restart_ready is not None]
    figures: dict[str, Any] = {
        "runs": len(results),
        "planned_runs": ctx.size.watch_crash_runs,
        "converged": sum(1 for r in results if r.converged),
        "orphaned": sum(len(r.orphans) for r in results),
        "duplicates": sum(len(r.duplicates) for r in results),
        "vfs_with_two_vgpus": sum(len(r.crowded) for r in results),
        "dangling_mdev_links": sum(len(r.dangling) for r in results),
        "in_use_removed": sum(len(r.in_use_removed) for r in results),
        "not_converged_by_the_oracle": sum(1 for r in results if r.not_converged),
        "metrics_inconsistent": sum(len(r.metrics_wrong) for r in results),
        "tracebacks": sum(len(r.bugs) for r in results),
        "hung_processes": sum(len(r.hung) for r in results),
        "stray_sriov_manage": sum(r.strays for r in results),
        "unmanaged_gpus_touched": sum(len(r.unmanaged_touched) for r in results),
        "held_vgpus": sum(r.holds for r in results),
        "runs_with_held_vgpus": sum(1 for r in results if r.holds),
        "unrecorded_mdev_vgpus_at_start": sum(r.mdev_at_start for r in results),
        "unlisted_vfio_vgpus_at_start": sum(r.unlisted_at_start for r in results),
        "runs_with_unlisted_vfio_vgpus": sum(1 for r in results if r.unlisted_at_start),
        "runs_unrecorded_on_both_interfaces": sum(
            1 for r in results if r.unlisted_at_start and r.mdev_at_start
        ),
        "runs_filled_unrecorded": sum(1 for r in results if r.unrecorded),
        "state_dir_deleted": sum(1 for r in results if r.forgot),
        "restarts_without_record_with_unlisted_vfio_vgpus": sum(
            1 for r in results if r.forgot and r.unlisted_at_restart
        ),
        "driver_asked_for_type_names": {
            "first_watch": sum(1 for r in results if r.driver_asked),
            "restarted_watch": sum(1 for r in results if r.driver_asked_on_restart),
        },
        "first_watch": histogram(r.first for r in results),
        "kill_landed": histogram(r.landed for r in results),
        "kill_points": _kill_points(results),
        "restart_to_ready_s": {
            "p50": round(statistics.median(ready), 2) if ready else None,
            "max": round(max(ready), 2) if ready else None,
        },
        "restarts_with_a_failed_reconcile": sum(1 for r in results if r.restart_failed),
        "sigterm_exit": histogram(r.sigterm for r in results),
        "faults_armed": {
            "writes_eio": sum(1 for r in results if "writes" in r.armed),
            "sriov_error": sum(1 for r in results if r.armed.get("sriov") == "error"),
            "sriov_silent": sum(1 for r in results if r.armed.get("sriov") == "silent"),
            "runs_with_faults_left_unused_at_death": sum(1 for r in results if r.left_unused),
        },
        "host_actions_per_run": {
            "min": min(actions),
            "median": statistics.median(actions),
            "max": max(actions),
        },
        "edit_runs_without_host_work": sum(
            1 for r in results if r.phase == "edit" and not r.actions
        ),
        "sweeper": sweeper_figures([r.sweeps for r in results]),
        "gpu_models": dict(Counter(m for r in results for m in r.gpus).most_common()),
        "seconds": round(seconds, 1),
        "seconds_per_run": round(seconds / len(results), 2) if results else None,
        "budget_exceeded": len(results) < ctx.size.watch_crash_runs,
    }
    failed = [r for r in results if not r.ok]
    figures["failed_runs"] = len(failed)
    figures["failures"] = [r.failure() for r in failed[:FAILURES_SHOWN]]
    figures["ok"] = not failed and not figures["budget_exceeded"]
    return figures
