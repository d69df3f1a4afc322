"""Concurrency: two ``vgpuctl apply`` started together on one simulated node, a third a little
later.

The node lock (``<state-dir>/<node>.lock``) lets one apply act; another must fail fast naming
the holder (exit 1), or find nothing to do. One that fails reading a host the holder is busy
changing (it observes before it takes the lock) breaks that promise: it is counted apart and
fails the trial. Since a run plans before it takes the lock, a run
that finds the lock free only after the first finished carries out a plan made before: each of
its actions must then find its work already done (``=``, a no-op), never do it again.

Per trial, from the processes' own progress lines and from the tree: exactly one process made
changes, no UUID created twice and no VF given two vGPUs (double creates), no duplicate UUID on
the host, a refusal names the pid of another apply of the trial, and the host is converged.
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
from tests.reliability.generators import CATALOG, document
from tests.reliability.hosts import (
    CREATED_UUID,
    Run,
    SimNode,
    histogram,
    read_truth,
    run_cases,
    safety,
)
from tests.reliability.sizes import Context

NODE = "race-node"
LOCK_HELD = "another apply holds the lock for node"
CHANGING = "devices are changing"
FAILURES_SHOWN = 10
APPLY_TIMEOUT = 120.0

#: Hosts and desired states with enough work (SR-IOV changes, removals, tens of creations)
#: that a second apply arrives while the first still holds the lock.
LAYOUTS: tuple[tuple[dict[str, Any], list[dict[str, Any]]], ...] = (
    (
        {"gpus": [{"model": "A2", "address": "0000:08:00.0"},
                  {"model": "L4", "address": "0000:41:00.0"}]},
        [{"address": "0000:08:00.0", "sriov": "enabled",
          "vgpus": dict.fromkeys(range(8), "NVIDIA A2-2Q")},
         {"address": "0000:41:00.0", "sriov": "enabled", "profiles": {"NVIDIA L4-2Q": 12}}],
    ),
    (
        {"gpus": [{"model": "A2", "address": "0000:08:00.0",
                   "vgpus": dict.fromkeys(range(4), "NVIDIA A2-4Q")},
                  {"model": "L40S", "address": "0000:41:00.0"}]},
        [{"address": "0000:08:00.0", "sriov": "enabled",
          "vgpus": dict.fromkeys(range(8), "NVIDIA A2-2A")},
         {"address": "0000:41:00.0", "sriov": "enabled", "profiles": {"NVIDIA L40S-4Q": 12}}],
    ),
    (
        {"gpus": [{"model": "A10", "address": "0000:08:00.0"},
                  {"model": "L4", "address": "0000:41:00.0",
                   "vgpus": dict.fromkeys(range(6), "NVIDIA L4-4C")},
                  {"model": "A2", "address": "0000:81:00.0"}]},
        [{"address": "0000:08:00.0", "sriov": "enabled", "profiles": {"NVIDIA A10-2Q": 12}},
         {"address": "0000:41:00.0", "sriov": "disabled"},
         {"address": "0000:81:00.0", "sriov": "enabled",
          "vgpus": dict.fromkeys(range(16), "NVIDIA A2-1B")}],
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Role:
    """What one apply of a trial turned out to do."""

    label: str
    run: Run
    #: proceeded | lock-conflict | nothing-to-do | stale-plan-noops |
    #: failed-observing-a-changing-host | broken | unexpected
    role: str
    names_holder: bool = False


@dataclass(slots=True)
class Trial:
    index: int
    layout: int
    third_after: float
    roles: list[Role] = field(default_factory=list)
    double_creates: list[str] = field(default_factory=list)
    safety: list[str] = field(default_factory=list)
    converged: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        proceeded = [r for r in self.roles if r.role == "proceeded"]
        others_fine = all(
            r.role in ("nothing-to-do", "stale-plan-noops")
            or (r.role == "lock-conflict" and r.names_holder)
            for r in self.roles
            if r.role != "proceeded"
        )
        return (
            len(proceeded) == 1
            and others_fine
            and not self.double_creates
            and not self.safety
            and self.converged
            and not self.errors
        )

    def failure(self) -> str:
        roles = ", ".join(f"{r.label}: {r.role} ({r.run.outcome()})" for r in self.roles)
        details = [*self.errors, *self.double_creates, *self.safety]
        if not self.converged:
            details.append("host not converged")
        for r in self.roles:
            if r.role not in ("proceeded", "nothing-to-do", "stale-plan-noops") and not (
                r.role == "lock-conflict" and r.names_holder
            ):
                details.append(f"{r.label}: {r.run.messages(2)}")
        return f"trial {self.index} (layout {self.layout}): {roles}; " + "; ".join(details[:4])


def role_of(label: str, run: Run, others: list[int]) -> Role:
    progress = run.progress()
    made = [p for p in progress if p.mark == "✓"]
    if run.bug or run.hung or run.killed:
        return Role(label, run, "broken")
    if run.returncode == 1 and not made and CHANGING in run.stderr:
        # It observed the host before taking the lock, while the holder was changing it.
        return Role(label, run, "failed-observing-a-changing-host")
    if LOCK_HELD in run.stderr:
        named = any(re.search(rf"\bpid {pid}\b", run.stderr) for pid in others)
        role = "lock-conflict" if run.returncode == 1 and not made else "unexpected"
        return Role(label, run, role, names_holder=named)
    if run.returncode in (0, 2):
        if made:
            return Role(label, run, "proceeded")
        if not progress:
            return Role(label, run, "nothing-to-do")
        if all(p.mark == "=" for p in progress):
            return Role(label, run, "stale-plan-noops")
    return Role(label, run, "unexpected")


def run_trial(index: int, rng: random.Random, directory: Path) -> Trial:
    layout = rng.randrange(len(LAYOUTS))
    host_spec, desired_gpus = LAYOUTS[layout]
    trial = Trial(index, layout, third_after=round(rng.uniform(0.1, 1.5), 3))
    host_dir = directory / "host"
    build_host(host_dir, {**host_spec, "extraDevices": False}, catalog=CATALOG)
    desired_file = directory / "desired.yaml"
    desired_file.write_text(yaml.safe_dump(document(NODE, desired_gpus), sort_keys=False))
    node = SimNode(host_dir, NODE)

    first = node.start("apply", desired_file, "--yes", out_dir=directory, label="a")
    time.sleep(rng.uniform(0.0, 0.03))
    second = node.start("apply", desired_file, "--yes", out_dir=directory, label="b")
    time.sleep(trial.third_after)
    third = node.start("apply", desired_file, "--yes", out_dir=directory, label="c")
    started = {"a": first, "b": second, "c": third}
    runs = {label: s.finish(timeout=APPLY_TIMEOUT) for label, s in started.items()}
    pids = {label: s.pid for label, s in started.items()}
    for label, run in runs.items():
        others = [pid for other, pid in pids.items() if other != label]
        trial.roles.append(role_of(label, run, others))

    # Double creates, from what the processes say they did: one UUID or one VF created twice.
    made = [p for r in runs.values() for p in r.progress() if p.mark == "✓"]
    creates = [p for p in made if p.kind == "vgpu-create"]
    uuids = Counter(m[1] for p in creates if (m := CREATED_UUID.search(p.message)))
    vfs = Counter(p.target for p in creates)
    trial.double_creates = [f"vGPU {u} created {n} times" for u, n in uuids.items() if n > 1]
    trial.double_creates += [f"VF {vf} given a vGPU {n} times" for vf, n in vfs.items() if n > 1]

    gpus = [g["address"] for g in host_spec["gpus"]]
    trial.safety = safety(read_truth(node.sysfs_root, gpus), {}).problems()
    left = node.converged(desired_file)
    trial.converged = not left
    trial.errors += left[:3]
    return trial


def concurrency(ctx: Context) -> dict[str, Any]:
    """Scenario: racing applies on one node. Returns its figures."""
    started = time.monotonic()
    # One trial at a time: the race is between the trial's own processes.
    trials = run_cases(
        range(ctx.size.concurrency_trials),
        lambda i, directory: run_trial(i, ctx.rng("concurrency", i), directory),
        lambda i, message: Trial(i, -1, 0.0, errors=[message]),
        base=ctx.scratch("concurrency"),
        budget=ctx.size.budget,
        jobs=1,
        index=lambda i: i,
    )

    roles = [r for t in trials for r in t.roles]
    conflicts = [r for r in roles if r.role == "lock-conflict"]
    failed = [t for t in trials if not t.ok]
    figures: dict[str, Any] = {
        "trials": len(trials),
        "planned_trials": ctx.size.concurrency_trials,
        "processes": len(roles),
        "proceeded": sum(1 for r in roles if r.role == "proceeded"),
        "trials_with_exactly_one_proceeding": sum(
            1 for t in trials if sum(r.role == "proceeded" for r in t.roles) == 1
        ),
        "lock_conflicts": len(conflicts),
        "lock_conflicts_naming_the_holder": sum(1 for r in conflicts if r.names_holder),
        "lock_conflict_max_seconds": round(max((r.run.seconds for r in conflicts), default=0), 2),
        "nothing_to_do": sum(1 for r in roles if r.role == "nothing-to-do"),
        "stale_plan_all_noops": sum(1 for r in roles if r.role == "stale-plan-noops"),
        "failed_observing_a_changing_host": sum(
            1 for r in roles if r.role == "failed-observing-a-changing-host"
        ),
        "broken_or_unexpected": sum(1 for r in roles if r.role in ("broken", "unexpected")),
        "roles_by_start_order": {
            label: histogram(r.role for r in roles if r.label == label) for label in "abc"
        },
        "double_creates": sum(len(t.double_creates) for t in trials),
        "host_safety_violations": sum(len(t.safety) for t in trials),
        "converged": sum(1 for t in trials if t.converged),
        "layouts": histogram(t.layout for t in trials),
        "seconds": round(time.monotonic() - started, 1),
        "budget_exceeded": len(trials) < ctx.size.concurrency_trials,
        "failures": [t.failure() for t in failed[:FAILURES_SHOWN]],
    }
    figures["ok"] = not failed and not figures["budget_exceeded"]
    return figures
