"""The reliability suite's entry point: run the scenarios, print one JSON document of figures.

    python -m tests.reliability.suite [--size full|ci] [--seed N] [--jobs N]
                                      [--only SCENARIO]... [--out FILE] [--keep]

Each scenario is a function ``(Context) -> dict`` registered in ``SCENARIOS``; its dict is its
figures, with ``ok`` (every invariant held) and ``seconds``. Sizes and time budgets are in
``sizes.py``. The same seed (and job count) gives the same hosts, desired states, documents and
kill points; timing-driven outcomes (an outside SIGKILL, a race) vary with the machine.

Scenarios: ``crash_safety`` and ``watch_crash_safety`` (SIGKILLed applies and watches, then
restarted, against the API-server emulator with KubeVirt's virt-handler sweeping beside them:
counted together in ``summary``, the vGPUs the sweeps took included), ``bad_input``,
``concurrency`` (racing applies) and ``watch_concurrency`` (two applies racing a watch),
``faults_survived`` (under apply) and ``watch_faults_survived`` (while watch runs, with a
kubelet restart).

Exit status: 0 when every scenario's invariants held, 1 otherwise. Scratch trees go under
``$TMPDIR`` (``/dev/shm`` when it is unset and writable); they are removed unless ``--keep`` is
given or something failed, in which case the failed runs' trees are kept and ``workdir`` says
where.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.reliability.bad_input import bad_input
from tests.reliability.concurrency import concurrency
from tests.reliability.crash import crash_safety
from tests.reliability.faults import faults_survived
from tests.reliability.hosts import REPO
from tests.reliability.sizes import SIZES, Context
from tests.reliability.watch_crash import watch_crash_safety
from tests.reliability.watch_faults import watch_faults_survived
from tests.reliability.watch_race import watch_concurrency

Scenario = Callable[[Context], dict[str, Any]]

SCENARIOS: dict[str, Scenario] = {
    "crash_safety": crash_safety,
    "watch_crash_safety": watch_crash_safety,
    "bad_input": bad_input,
    "concurrency": concurrency,
    "watch_concurrency": watch_concurrency,
    "faults_survived": faults_survived,
    "watch_faults_survived": watch_faults_survived,
}
DEFAULT_SEED = 5


def summary(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The headline figures across scenarios (of those that ran)."""
    crash = [scenarios[n] for n in ("crash_safety", "watch_crash_safety") if n in scenarios]
    out: dict[str, Any] = {}
    if crash:
        out["killed_and_restarted"] = {
            "runs": sum(f.get("runs", 0) for f in crash),
            "converged": sum(f.get("converged", 0) for f in crash),
            "orphaned": sum(f.get("orphaned", 0) for f in crash),
            "duplicates": sum(f.get("duplicates", 0) for f in crash),
            "in_use_removed": sum(f.get("in_use_removed", 0) for f in crash),
            # Issue 31: runs from hosts with vGPUs vgpuctl has no record of (vfio ones whose
            # type no VF lists; also mdev ones), and runs that lost the state directory.
            "runs_with_unlisted_vfio_vgpus": sum(
                f.get("runs_with_unlisted_vfio_vgpus", 0) for f in crash
            ),
            "runs_unrecorded_on_both_interfaces": sum(
                f.get("runs_unrecorded_on_both_interfaces", 0) for f in crash
            ),
            "state_dir_deleted": sum(f.get("state_dir_deleted", 0) for f in crash),
        }
        swept = [f["sweeper"] for f in crash if "sweeper" in f]
        if swept:
            # KubeVirt's virt-handler beside the runs (both scenarios'): what its sweeps took.
            out["killed_and_restarted"]["sweeper"] = {
                "heartbeats": sum(f["heartbeats"] for f in swept),
                "vgpus_lost": sum(f["vgpus_lost"] for f in swept),
                "in_use_removed": sum(f["in_use_removed"] for f in swept),
            }
    races = [scenarios[n] for n in ("concurrency", "watch_concurrency") if n in scenarios]
    if races:
        out["races"] = {
            "trials": sum(f.get("trials", 0) for f in races),
            "double_creates": sum(f.get("double_creates", 0) for f in races),
        }
    faults = [scenarios[n] for n in ("faults_survived", "watch_faults_survived") if n in scenarios]
    if faults:
        out["faults"] = {
            "kinds": sum(f.get("faults", 0) for f in faults),
            "survived": sum(f.get("survived", 0) for f in faults),
        }
    if "bad_input" in scenarios:
        f = scenarios["bad_input"]
        out["bad_input"] = {
            "documents": f.get("documents", 0),
            "exceptions": f.get("exceptions", 0),
            "unlocated_problems": f.get("unlocated_problems", 0),
        }
    return out


def _scratch_base() -> Path | None:
    if os.environ.get("TMPDIR"):
        return None  # tempfile honours it
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_suite(
    *, size: str, seed: int, jobs: int | None, only: Sequence[str], keep: bool
) -> dict[str, Any]:
    chosen = SIZES[size]
    workdir = Path(tempfile.mkdtemp(prefix="vgpuctl-reliability-", dir=_scratch_base()))
    ctx = Context(chosen, seed=seed, workdir=workdir, jobs=jobs or chosen.jobs)
    started = time.monotonic()
    document: dict[str, Any] = {
        "suite": "vgpuctl reliability",
        "size": size,
        "seed": seed,
        "jobs": ctx.jobs,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "commit": _commit(),
        },
        "scenarios": {},
    }
    for name in only or SCENARIOS:
        print(f"reliability: {name} ({size}) …", file=sys.stderr, flush=True)
        figures = SCENARIOS[name](ctx)
        document["scenarios"][name] = figures
        verdict = "ok" if figures.get("ok") else "FAILED"
        print(
            f"reliability: {name}: {verdict} in {figures.get('seconds', 0):.0f} s",
            file=sys.stderr,
            flush=True,
        )
    document["summary"] = summary(document["scenarios"])
    document["seconds"] = round(time.monotonic() - started, 1)
    document["ok"] = all(f.get("ok") for f in document["scenarios"].values())
    if keep or not document["ok"]:
        document["workdir"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.suite",
        description="Run vgpuctl's reliability scenarios on the simulator and the API-server "
        "emulator; print their figures as one JSON document.",
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--jobs", type=int, help="parallel runs (default: the size's, 2)")
    parser.add_argument(
        "--only", action="append", choices=sorted(SCENARIOS), default=[], metavar="SCENARIO",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the JSON document to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the scratch trees")
    ns = parser.parse_args(argv)
    if ns.jobs is not None and ns.jobs < 1:
        parser.error("--jobs must be 1 or more")
    document = run_suite(size=ns.size, seed=ns.seed, jobs=ns.jobs, only=ns.only, keep=ns.keep)
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if ns.out is not None:
        ns.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
