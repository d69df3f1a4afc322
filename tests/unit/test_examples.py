"""examples/gitops/: the GitHub Actions workflow a GitOps repository copies (issue 15 item 4).
It validates on pull requests and pushes to the default branch, plans against the cluster on
pull requests and posts the Markdown,
and applies nothing; its vgpuctl command lines are the CLI's own (parsed by its parser), and it
asks GitHub for no more than it needs."""

from __future__ import annotations

import glob
import shlex
from pathlib import Path
from typing import Any

import yaml

from reconciler.cli.main import build_parser
from tests.simnode import REPO, run_vgpuctl

WORKFLOW = REPO / "examples" / "gitops" / ".github" / "workflows" / "vgpuctl.yml"


def _workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def _vgpuctl_commands(job: dict[str, Any]) -> list[list[str]]:
    """Each ``vgpuctl`` command line of a job's steps, continuation lines joined."""
    out = []
    for step in job["steps"]:
        script = step.get("run", "").replace("\\\n", " ")
        for line in script.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "vgpuctl":
                out.append(words[1 : words.index(">")] if ">" in words else words[1:])
    return out


def test_validate_on_every_push_plan_on_pull_requests_and_never_apply() -> None:
    doc = _workflow()
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as true
    assert set(on) == {"push", "pull_request"}
    # A pull request's push runs once (as pull_request); push runs for the default branch.
    assert on["push"] == {"branches": ["main"]} and on["pull_request"] is None
    jobs = doc["jobs"]
    assert jobs["plan"]["if"] == "github.event_name == 'pull_request'"
    assert jobs["plan"]["needs"] == ["validate", "supersede"]
    commands = [c for job in jobs.values() for c in _vgpuctl_commands(job)]
    # The plan twice: the comment's Markdown, and the JSON kept as the run's artifact.
    assert [c[0] for c in commands] == ["validate", "plan", "plan"]
    assert not any(word in ("apply", "watch") for c in commands for word in c)


def test_the_command_lines_are_the_clis_own() -> None:
    jobs = _workflow()["jobs"]
    (validate,) = _vgpuctl_commands(jobs["validate"])
    markdown, as_json = _vgpuctl_commands(jobs["plan"])
    ns = build_parser().parse_args([w.replace("$RUNNER_TEMP", "/tmp") for w in markdown])
    assert (ns.command, ns.observed, ns.output, ns.detailed_exitcode) == (
        "plan", "cluster", "markdown", True
    )  # fmt: skip
    assert ns.kubeconfig == "/tmp/kubeconfig" and ns.max_bytes == 60_000
    assert ns.full_plan == "the JSON plan, artifact vgpuctl-plan of this workflow run"
    ns = build_parser().parse_args([w.replace("$RUNNER_TEMP", "/tmp") for w in as_json])
    assert (ns.command, ns.observed, ns.output, ns.file) == (
        "plan", "cluster", "json", ["desired-state/*.yaml"]
    )  # fmt: skip
    # Run as the workflow runs it from a repository like ours (its desired-state/ directory).
    files = sorted(glob.glob(str(REPO / validate[1])))
    assert files
    res = run_vgpuctl(validate[0], *files)
    assert res.returncode == 0, res.stdout + res.stderr


def test_it_asks_github_for_the_least() -> None:
    doc = _workflow()
    assert doc["permissions"] == {"contents": "read"}
    assert doc["jobs"]["plan"]["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert "permissions" not in doc["jobs"]["validate"]
    # The job marking the comment outdated: the comment only, no environment, no secret.
    supersede = doc["jobs"]["supersede"]
    assert supersede["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert "environment" not in supersede and "secrets." not in str(supersede)
    # The kubeconfig only reaches the plan step, and is removed after it.
    steps = doc["jobs"]["plan"]["steps"]
    with_secret = [s for s in steps if "secrets." in str(s.get("env", {}))]
    assert len(with_secret) == 1
    assert 'rm -f "$RUNNER_TEMP/kubeconfig"' in with_secret[0]["run"]
    assert Path(WORKFLOW).read_text().count("secrets.VGPUCTL_KUBECONFIG") == 1
