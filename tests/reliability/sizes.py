"""How big each reliability scenario runs, and what every scenario function is given.

``full`` is the suite's real size (``just reliability``: about sixteen minutes on two cores);
``ci`` is the size pytest runs (``just test``: well under a minute). Each scenario also has a
time budget: past it, no new run starts and the figures say so (``budget_exceeded``), so the
suite's time is bounded whatever the machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Size:
    name: str
    crash_runs: int
    #: Crash-safety runs that kill ``vgpuctl watch`` (counted with ``crash_runs``'s applies).
    watch_crash_runs: int
    bad_documents: int
    bad_cli_sample: int
    concurrency_trials: int
    #: Trials of two applies racing a running ``vgpuctl watch``.
    watch_race_trials: int
    fault_repeats: int
    jobs: int
    #: Seconds per scenario before it stops starting new runs.
    budget: float


SIZES = {
    "full": Size(
        name="full",
        crash_runs=240,
        watch_crash_runs=120,
        bad_documents=10_000,
        bad_cli_sample=200,
        concurrency_trials=30,
        watch_race_trials=20,
        fault_repeats=3,
        jobs=2,
        budget=540.0,
    ),
    "ci": Size(
        name="ci",
        crash_runs=8,
        watch_crash_runs=4,
        bad_documents=400,
        bad_cli_sample=12,
        concurrency_trials=3,
        watch_race_trials=2,
        fault_repeats=1,
        jobs=2,
        budget=120.0,
    ),
}


@dataclass(frozen=True, slots=True)
class Context:
    """What a scenario function gets: its size, a seed, a scratch directory, a worker count."""

    size: Size
    seed: int
    workdir: Path
    jobs: int

    def rng(self, *labels: object) -> random.Random:
        """A random source of its own for each labelled thing (a run, a trial): reproducible
        whatever order parallel runs finish in."""
        return random.Random(":".join(map(str, (self.seed, *labels))))  # noqa: S311 - not crypto

    def scratch(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


#: The seed the ci-size tests run with (``just test``).
CI_SEED = 5


def ci_context(workdir: Path) -> Context:
    """What a ci-size test gives a scenario."""
    ci = SIZES["ci"]
    return Context(ci, seed=CI_SEED, workdir=workdir, jobs=ci.jobs)


def show(figures: dict[str, Any]) -> str:
    """A scenario's figures as an assertion message shows them (bounded)."""
    return json.dumps(figures, indent=1, ensure_ascii=False)[:6000]
