"""Crash safety: ``vgpuctl apply`` SIGKILLed at random points, with faults, then run again.

Each run builds a random simulated host (catalogue GPUs, SR-IOV states, starting vGPUs) and a
random valid desired state (``generators.py``); a VM holds some of the vGPUs the desired state
would remove (``vgpuctl sim hold``); random one-shot faults are armed with ``vgpuctl sim fail``
(``--writes N``: EIO on the next N sysfs writes; ``--sriov error|silent``). Then
``apply --yes`` dies one of two ways:

- ``sim fail --crash-after N``: the simulator SIGKILLs it right after its Nth change took effect,
  the worst moment (done, neither verified nor journalled);
- SIGKILL from outside after a random delay, timed from the start or from the first action
  reported done, and sent while the simulated kernel is idle (``kernel_quiet``: a real sysfs
  write cannot be interrupted half done either).

- or SIGKILLed by the API-server emulator the moment its KubeVirt allow-list write arrives
  (``allow-list``: the write lands, nothing on the host has changed yet): the window between
  the allow-list write and the first vGPU create.

Every run has a cluster (the API-server emulator, with a KubeVirt CR allow-listing the types
the host starts with, as a node reconciled before would have it), and KubeVirt's virt-handler
beside it (:mod:`reconciler.sim.virt_handler`, run by ``sweeper.py``, as ``watch_crash.py``
runs it too): a heartbeat after every vgpuctl process, its sweep of mdevs whose type is not
allow-listed counted (``sweeper``: vGPUs lost, held ones among them; both must be 0).

Every host is built by the simulator directly (``build_host``), so vgpuctl has no record of the
vGPUs it starts with (its mdev ones are counted as ``unrecorded_mdev_vgpus_at_start``): on a GPU
of NVIDIA's vendor-specific VFIO interface at a type's maximum no VF lists their type any more,
and only the driver names it (``nvidia-smi vgpu -s -v``, issue 31; counted as
``unlisted_vfio_vgpus_at_start``; runs with both kinds as ``runs_unrecorded_on_both_interfaces``).
In some runs (``full``) one GPU is made a vfio GPU at a type's maximum
(``generators.at_a_maximum``, shared with ``watch_crash.py``) before the host is built, so that
every such run starts with vGPUs whose type no list names. In some runs (``forget``) the state
directory (the record of vfio types, the journal) is deleted after the killed apply, before the
reruns, as a node whose disk was lost would have it (``state_dir_deleted``).

Faults left unused are cleared, and apply runs again (at most ``MAX_RERUNS`` times) until the
tests' oracle (``tests/oracle.py``: the tree against the desired file) finds the host converged,
held vGPUs excepted, and a fresh plan agrees. After every process: no UUID twice, no VF with two
vGPUs, no dangling mdev link, every held vGPU still on its VF with its type. At the end: no
orphan (each vGPU on a managed GPU desired or held), unmanaged GPUs untouched, no traceback, no
``sriov-manage`` left running.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from reconciler.model import VgpuRemove
from reconciler.sim import SimHost, build_host
from tests.doubles.emulator import ApiServerEmulator, Request
from tests.holds import asked
from tests.reliability.faults import emulator as cluster_emulator
from tests.reliability.generators import (
    CATALOG,
    at_a_maximum,
    draw_examples,
    has_work,
    host_and_desired,
)
from tests.reliability.hosts import (
    Findings,
    Run,
    SimNode,
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

NODE = "crash-node"
MAX_RERUNS = 4
#: ``--verify-timeout``: the simulator's effects are immediate, so a short wait is plenty, and a
#: silent sriov-manage failure costs seconds, not the default two minutes.
APPLY = ("--yes", "--timeout", "30", "--verify-timeout", "3")
APPLY_TIMEOUT = 90.0
#: Figures keep this many failure descriptions.
FAILURES_SHOWN = 10


@dataclass(frozen=True, slots=True)
class Case:
    index: int
    host: dict[str, Any]
    desired: dict[str, Any]
    kill: str  # crash-after | sigkill | allow-list
    writes: int
    sriov: str | None
    holds: int
    #: crash-after: N = 1 + int(pick × host actions); above 1.0 the crash may never come.
    pick: float
    #: sigkill: when the delay starts: at "start", or at the "first-action" reported done.
    anchor: str
    seed: str
    #: Delete the state directory after the killed apply, before the reruns.
    forget: bool = False
    #: Whether :func:`at_a_maximum` made one of the host's GPUs a full vfio GPU.
    full: bool = False


@dataclass(slots=True)
class Result(Findings):
    """What one run did and found (filled in as it goes)."""

    index: int
    kill: str
    gpus: list[str]
    actions: int = 0
    crash_after: int | None = None
    delay: float | None = None
    anchor: str | None = None
    first: str = ""
    first_seconds: float = 0.0
    host_calls: int = 0
    holds: int = 0
    armed: dict[str, Any] = field(default_factory=dict)
    left_unused: dict[str, Any] = field(default_factory=dict)
    reruns: int | None = None  # None: never converged
    rerun_outcomes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: virt-handler heartbeats run, and the vGPUs their sweeps took.
    sweeps: Sweeps = field(default_factory=Sweeps)
    #: allow-list kills: whether the allow-list write came (and the kill with it).
    allow_write_seen: bool = False
    #: vfio vGPUs the host started with whose type id no VF listed (only the driver names it).
    unlisted_at_start: int = 0
    #: mdev vGPUs the host started with (the simulator made them: vgpuctl has no record).
    mdev_at_start: int = 0
    #: Whether the state directory was deleted before the reruns (and existed then).
    forgot: bool = False
    #: Whether the host started with a vfio GPU at a type's maximum (``Case.full``).
    full: bool = False

    @property
    def ok(self) -> bool:
        return self.reruns is not None and not self.problems() and not self.sweeps.lost

    def failure(self) -> str:
        parts = self.problems()
        if self.sweeps.lost:
            parts.insert(0, self.sweeps.describe())
        if self.reruns is None:
            parts.insert(0, f"not converged after {MAX_RERUNS} reruns {self.rerun_outcomes}")
        head = (
            f"run {self.index} ({self.kill}, crash-after {self.crash_after}, delay "
            f"{self.delay}, armed {self.armed}, first {self.first})"
        )
        return f"{head}: " + "; ".join(parts[:4])


def make_cases(ctx: Context) -> list[Case]:
    examples = draw_examples(
        host_and_desired(NODE), count=ctx.size.crash_runs, seed_value=ctx.seed, keep=has_work
    )
    cases = []
    for i in range(ctx.size.crash_runs):
        host, desired = examples[i % len(examples)]
        rng = ctx.rng("crash", i)
        case = Case(
            index=i,
            host=host,
            desired=desired,
            kill=rng.choice(("crash-after", "crash-after", "sigkill", "sigkill", "allow-list")),
            writes=rng.choice((0, 0, 0, 0, 0, 0, 1, 2, 3)),
            sriov=rng.choice((None, None, None, None, None, None, "error", "silent")),
            holds=rng.choice((0, 1, 1, 2)),
            pick=rng.uniform(0.0, 1.15),
            anchor=rng.choice(("start", "first-action")),
            seed=f"{ctx.seed}:crash-run:{i}",
            forget=rng.random() < 0.5,
        )
        if rng.random() < 0.5:
            full = at_a_maximum(host, rng)
            if full is not None:
                case = replace(case, host=full, full=True)
        cases.append(case)
    return cases


def _delay(case: Case, actions: int) -> float:
    """Seconds from the anchor to the outside kill.

    An apply spends 0.3 to 0.5 s starting, observing and planning, then 10 to 200 ms per action
    (a silent sriov-manage failure adds the verify wait), then plans again to report. Timed
    from the start, kills land mostly in start-up and planning; timed from the first action
    reported done, among the actions: half the runs each.
    """
    if case.anchor == "start":
        silent = 3.0 if case.sriov == "silent" else 0.0
        return round(0.1 + case.pick / 1.15 * (0.5 + silent), 3)
    return round(case.pick / 1.15 * (0.05 + 0.02 * actions), 3)


def _first_apply(
    node: SimNode,
    desired_file: Path,
    directory: Path,
    delay: float | None,
    anchor: str | None,
    *,
    emu: ApiServerEmulator,
    result: Result,
) -> Run:
    if result.kill == "allow-list":
        return _killed_at_the_allow_list_write(node, desired_file, directory, emu, result)
    if delay is None:
        return node.run("apply", desired_file, *APPLY, timeout=APPLY_TIMEOUT)
    started = node.start("apply", desired_file, *APPLY, out_dir=directory, label="first")
    if anchor == "first-action" and not started.wait_for_progress(timeout=APPLY_TIMEOUT):
        return started.finish(timeout=APPLY_TIMEOUT)  # it ended before any action was done
    try:
        started.proc.wait(timeout=delay)  # it may finish before its time is up
    except subprocess.TimeoutExpired:
        with kernel_quiet(node.sysfs_root):
            started.kill()
            started.proc.wait(timeout=30)
    return started.finish(timeout=APPLY_TIMEOUT)


def _killed_at_the_allow_list_write(
    node: SimNode, desired_file: Path, directory: Path, emu: ApiServerEmulator, result: Result
) -> Run:
    """The first apply, SIGKILLed when its KubeVirt CR write reaches the API server: the write
    is applied (the server has the request), the process is gone before any host action."""
    started = node.start("apply", desired_file, *APPLY, out_dir=directory, label="first")

    def kill(request: Request) -> None:
        if request.resource == "kubevirts" and not result.allow_write_seen:
            result.allow_write_seen = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.pid, signal.SIGKILL)

    emu.on_before_write(kill)
    try:
        return started.finish(timeout=APPLY_TIMEOUT)
    finally:
        emu.on_before_write(None)


def run_case(case: Case, directory: Path) -> Result:
    with cluster_emulator(kubevirt=False) as emu:
        return _run_case(case, directory, emu)


def _run_case(case: Case, directory: Path, emu: ApiServerEmulator) -> Result:
    started = time.monotonic()
    rng = random.Random(case.seed)  # noqa: S311 - reproducible choices, not cryptography
    gpus = [g["address"] for g in case.host["gpus"]]
    result = Result(case.index, case.kill, [g["model"] for g in case.host["gpus"]])
    result.full = case.full
    host_dir = directory / "host"
    build_host(host_dir, case.host, catalog=CATALOG)
    desired_file = directory / "desired.yaml"
    desired_file.write_text(yaml.safe_dump(case.desired, sort_keys=False))
    node = SimNode(host_dir, NODE, extra=seed_cluster(emu, directory, host_dir))
    managed = case.desired["spec"]["nodes"][NODE]["gpus"]
    unmanaged = sorted(set(gpus) - {g["address"] for g in managed})

    # A VM holds some of the vGPUs this desired state would remove.
    removable = sorted(
        a.uuid for a in plan_in_process(node, desired_file).actions if isinstance(a, VgpuRemove)
    )
    for uuid in rng.sample(removable, min(case.holds, len(removable))):
        held_run = node.sim("hold", uuid)
        if held_run.returncode != 0:
            result.errors.append(f"sim hold {uuid}: {held_run.messages()}")
    before = read_truth(node.sysfs_root, gpus)
    result.unlisted_at_start = unlisted_vfio_vgpus(node.sysfs_root, gpus)
    result.mdev_at_start = sum(1 for v in before.vgpus if not v.whole_vf)
    sim = SimHost.open(node.sysfs_root)
    assert sim is not None
    held = before.held(sim.hold_probe().scan(asked(*(v.uuid for v in before.vgpus))).held)
    result.holds = len(held)
    unmanaged_before = {g: before.snapshot(g) for g in unmanaged}

    result.actions = sum(1 for a in plan_in_process(node, desired_file).actions if a.kind.is_host)
    fail_args: list[str] = []
    if case.writes:
        fail_args += ["--writes", str(case.writes)]
        result.armed["writes"] = case.writes
    if case.sriov:
        fail_args += ["--sriov", case.sriov]
        result.armed["sriov"] = case.sriov
    result.sweeps.heartbeat(node, emu)  # the host as it starts: its types are listed
    if case.kill == "crash-after":
        result.crash_after = 1 + int(case.pick * result.actions)
        fail_args += ["--crash-after", str(result.crash_after)]
    elif case.kill == "sigkill":
        result.delay = _delay(case, result.actions)
        result.anchor = case.anchor
    if fail_args:
        armed = node.sim("fail", *fail_args)
        if armed.returncode != 0:
            result.errors.append(f"sim fail {fail_args}: {armed.messages()}")

    calls_before = node.stats()
    first = _first_apply(
        node, desired_file, directory, result.delay, result.anchor, emu=emu, result=result
    )
    result.first = first.outcome()
    result.first_seconds = first.seconds
    result.strays += len(reap_strays(node.sriov_manage))
    calls_after = node.stats()
    result.host_calls = sum(calls_after[k] - calls_before[k] for k in calls_after)
    result.left_unused = disarm_faults(node.sysfs_root)
    result.sweeps.heartbeat(node, emu)
    _check(result, first, node, gpus, held)
    if case.forget:
        # The node lost its disk: no record of the vfio types the killed apply wrote.
        result.forgot = node.forget()

    for attempt in range(1, MAX_RERUNS + 1):
        rerun = node.run("apply", desired_file, *APPLY, timeout=APPLY_TIMEOUT)
        result.rerun_outcomes.append(rerun.outcome())
        result.strays += len(reap_strays(node.sriov_manage))
        result.sweeps.heartbeat(node, emu)
        _check(result, rerun, node, gpus, held)
        left = node.converged(desired_file, held)
        if not left:
            result.reruns = attempt
            break
    else:
        result.not_converged = left[:3]

    after = read_truth(node.sysfs_root, gpus)
    result.orphans = orphans(after, managed, set(held))
    result.unmanaged_touched = [
        f"unmanaged GPU {g} changed" for g in unmanaged if after.snapshot(g) != unmanaged_before[g]
    ]
    result.seconds = time.monotonic() - started
    return result


def _check(result: Result, run: Run, node: SimNode, gpus: list[str], held: Any) -> None:
    """The invariants that hold at every moment, and the process's own health."""
    bug = run.bug
    if bug is not None:
        result.bugs.append(f"{run.outcome()}: {bug}")
    if run.hung:
        result.hung.append(f"apply hung: {run.messages()}")
    result.add_safety(safety(read_truth(node.sysfs_root, gpus), held))


def _broken(case: Case, message: str) -> Result:
    result = Result(case.index, case.kill, [])
    result.errors.append(message)
    return result


def crash_safety(ctx: Context) -> dict[str, Any]:
    """Scenario: randomized kills of apply, then reruns until converged. Returns its figures."""
    started = time.monotonic()
    results = run_cases(
        make_cases(ctx),
        run_case,
        _broken,
        base=ctx.scratch("crash"),
        budget=ctx.size.budget,
        jobs=ctx.jobs,
        index=lambda c: c.index,
    )
    return _figures(ctx, results, seconds=time.monotonic() - started)


def _figures(ctx: Context, results: list[Result], *, seconds: float) -> dict[str, Any]:
    crash = [r for r in results if r.kill == "crash-after"]
    killed_outside = [r for r in results if r.kill == "sigkill"]
    at_allow = [r for r in results if r.kill == "allow-list"]

    def where(r: Result) -> str:
        n, actions = r.crash_after or 0, r.actions
        if n > actions:
            return "beyond the last change"
        return "first change" if n == 1 else ("last change" if n == actions else "in between")

    actions = [r.actions for r in results] or [0]
    converged = sum(1 for r in results if r.reruns is not None)
    figures: dict[str, Any] = {
        "runs": len(results),
        "planned_runs": ctx.size.crash_runs,
        "converged": converged,
        "orphaned": sum(len(r.orphans) for r in results),
        "duplicates": sum(len(r.duplicates) for r in results),
        "vfs_with_two_vgpus": sum(len(r.crowded) for r in results),
        "dangling_mdev_links": sum(len(r.dangling) for r in results),
        "in_use_removed": sum(len(r.in_use_removed) for r in results),
        "not_converged_by_the_oracle": sum(1 for r in results if r.not_converged),
        "tracebacks": sum(len(r.bugs) for r in results),
        "hung_processes": sum(len(r.hung) for r in results),
        "stray_sriov_manage": sum(r.strays for r in results),
        "unmanaged_gpus_touched": sum(len(r.unmanaged_touched) for r in results),
        "max_reruns_needed": max((r.reruns or 0 for r in results), default=0),
        "reruns_needed": histogram(r.reruns for r in results),
        "held_vgpus": sum(r.holds for r in results),
        "unlisted_vfio_vgpus_at_start": sum(r.unlisted_at_start for r in results),
        "runs_with_unlisted_vfio_vgpus": sum(1 for r in results if r.unlisted_at_start),
        "unrecorded_mdev_vgpus_at_start": sum(r.mdev_at_start for r in results),
        "runs_unrecorded_on_both_interfaces": sum(
            1 for r in results if r.unlisted_at_start and r.mdev_at_start
        ),
        "state_dir_deleted": sum(1 for r in results if r.forgot),
        "runs_starting_at_a_maximum": sum(1 for r in results if r.full),
        "runs_with_held_vgpus": sum(1 for r in results if r.holds),
        "first_apply": histogram(r.first for r in results),
        "reruns": histogram(o for r in results for o in r.rerun_outcomes),
        "faults_armed": {
            "writes_eio": sum(1 for r in results if "writes" in r.armed),
            "sriov_error": sum(1 for r in results if r.armed.get("sriov") == "error"),
            "sriov_silent": sum(1 for r in results if r.armed.get("sriov") == "silent"),
            "runs_with_faults_left_unused_at_death": sum(1 for r in results if r.left_unused),
        },
        "sweeper": sweeper_figures([r.sweeps for r in results]),
        "kill_points": {
            "allow_list_write": {
                "runs": len(at_allow),
                "killed": sum(1 for r in at_allow if r.first == "killed"),
                "no_allow_list_write": sum(1 for r in at_allow if not r.allow_write_seen),
            },
            "crash_after": {
                "runs": len(crash),
                "killed": sum(1 for r in crash if r.first == "killed"),
                "N": histogram(r.crash_after for r in crash),
                "where": histogram(where(r) for r in crash),
            },
            "external_sigkill": {
                "runs": len(killed_outside),
                "killed": sum(1 for r in killed_outside if r.first == "killed"),
                "finished_before_the_kill": sum(1 for r in killed_outside if r.first != "killed"),
                "timed_from": histogram(r.anchor for r in killed_outside),
                "killed_timed_from": histogram(
                    r.anchor for r in killed_outside if r.first == "killed"
                ),
                "delay_s": histogram(
                    f"{0.25 * int((r.delay or 0) / 0.25):.2f}" for r in killed_outside
                ),
                "host_calls_before_the_kill": histogram(
                    r.host_calls for r in killed_outside if r.first == "killed"
                ),
            },
        },
        "host_actions_per_run": {
            "min": min(actions),
            "median": statistics.median(actions),
            "max": max(actions),
        },
        "gpu_models": dict(Counter(m for r in results for m in r.gpus).most_common()),
        "seconds": round(seconds, 1),
        "budget_exceeded": len(results) < ctx.size.crash_runs,
    }
    failed = [r for r in results if not r.ok]
    figures["failed_runs"] = len(failed)
    figures["failures"] = [r.failure() for r in failed[:FAILURES_SHOWN]]
    figures["ok"] = not failed and not figures["budget_exceeded"]
    return figures
