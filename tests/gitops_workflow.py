"""The GitOps example's workflow (examples/gitops/.github/workflows/vgpuctl.yml) run here, step by
step as a GitHub runner runs a job's steps, not on GitHub: each ``run:`` script in bash
(``bash -e``, GitHub's default shell), in a copy of a repository that holds the example's
``.github/`` and a ``desired-state/`` directory, with the step's ``env:`` (its ``${{ }}``
expressions given their values by the test: an expression the test does not know fails it),
``GITHUB_OUTPUT`` read back as ``steps.<id>.outputs``, and ``if:`` as GitHub evaluates the
two forms the file uses (none: only while no step has failed; ``${{ !cancelled() }}``: always);
a step with ``continue-on-error: true`` fails no job.

Steps that ``uses:`` an action are not run (checkout: the copy is the checkout; setup-python:
the test's interpreter; upload-artifact: the job's result names the file it would keep), nor
``pip install "$VGPUCTL"``: ``vgpuctl`` on the steps' PATH is this checkout's
(``python -m reconciler``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.simnode import REPO

EXAMPLE = REPO / "examples" / "gitops"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "vgpuctl.yml"
_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def gitops_repository(directory: Path, desired: str) -> Path:
    """A repository as the example's README sets one up: ``.github/`` copied, the desired
    state in ``desired-state/fleet.yaml``."""
    shutil.copytree(EXAMPLE / ".github", directory / ".github")
    (directory / "desired-state").mkdir(parents=True)
    (directory / "desired-state" / "fleet.yaml").write_text(desired)
    return directory


class JobRun:
    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = steps
        self.failed = False
        self.outputs: dict[str, dict[str, str]] = {}
        self.ran: list[tuple[str, int]] = []  # (step name, exit code)
        self.artifacts: list[Path] = []
        self.logs: list[str] = []


def run_job(
    job: str, repo: Path, values: dict[str, str], *, github_api: str, timeout: float = 300
) -> JobRun:
    """Run ``job``'s steps in ``repo``; ``values`` gives each ``${{ }}`` expression of the
    steps' ``env:`` its value (``steps.*.outputs.*`` come from the steps)."""
    steps = workflow()["jobs"][job]["steps"]
    run = JobRun(steps)
    runner_temp = repo.parent / f"runner-temp-{job}"
    runner_temp.mkdir(exist_ok=True)
    shims = repo.parent / "bin"
    shims.mkdir(exist_ok=True)
    vgpuctl = shims / "vgpuctl"
    vgpuctl.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m reconciler "$@"\n')
    vgpuctl.chmod(0o755)
    for n, step in enumerate(steps):
        name = step.get("name") or step.get("run") or step.get("uses")
        condition = step.get("if")
        if condition is None:
            if run.failed:
                continue
        elif condition != "${{ !cancelled() }}":
            raise AssertionError(f"{name}: if: {condition!r} is not an expression this runs")
        if "uses" in step:
            if str(step["uses"]).startswith("actions/upload-artifact@"):
                path = repo / step["with"]["path"]
                if path.exists():
                    run.artifacts.append(path)
            continue
        if step["run"].strip() == 'pip install "$VGPUCTL"':
            continue
        output = runner_temp / f"output-{n}"
        output.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPUCTL", "GITHUB_"))}
        env.update(
            PATH=f"{shims}:{env['PATH']}",
            PYTHONPATH=str(REPO),
            RUNNER_TEMP=str(runner_temp),
            GITHUB_OUTPUT=str(output),
            GITHUB_API_URL=github_api,
            GITHUB_SERVER_URL="https://github.example",
            GITHUB_REPOSITORY=values["github.repository"],
            GITHUB_RUN_ID=values["github.run_id"],
        )
        for key, value in (step.get("env") or {}).items():
            env[key] = _evaluate(str(value), values, run.outputs)
        result = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        run.logs.append(f"--- {name}: exit {result.returncode}\n{result.stdout}{result.stderr}")
        run.ran.append((str(name), result.returncode))
        if "id" in step:
            run.outputs[step["id"]] = dict(
                line.split("=", 1) for line in output.read_text().splitlines() if "=" in line
            )
        if result.returncode != 0 and not step.get("continue-on-error"):
            run.failed = True
    return run


def _evaluate(text: str, values: dict[str, str], outputs: dict[str, dict[str, str]]) -> str:
    def one(match: re.Match[str]) -> str:
        expression = match.group(1)
        step = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expression)
        if step:
            return outputs.get(step.group(1), {}).get(step.group(2), "")
        if expression not in values:
            raise AssertionError(f"the test gives ${{{{ {expression} }}}} no value")
        return values[expression]

    return _EXPRESSION.sub(one, text)
