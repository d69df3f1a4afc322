"""The GitOps example's workflow and its cluster credential (issue 28 item 6).

examples/gitops/ is copied into other repositories as it is, so what it does there is ours:
its actions were named by tags (``actions/checkout@v4``: whoever controls that repository can
move the tag to other code, which then runs with the job's secrets), its checkout left the
job's GitHub token in ``.git/config`` for every later step, and its kubeconfig was a
repository secret that any pull request's edited workflow could read. Now every action is
pinned by a full commit with its tag in a comment, checkout persists no credential, the
kubeconfig is given to one step's ``env:`` only, in a job that names the protected
environment ``cluster-read``, which the example's README tells how to protect.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from tests.actionlint import actionlint
from tests.simnode import REPO

EXAMPLE = REPO / "examples" / "gitops"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "vgpuctl.yml"
SECRET = "secrets.VGPUCTL_KUBECONFIG"  # noqa: S105 (its name, not its value)
ENVIRONMENT = "cluster-read"
PINNED = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}")


def _workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def _steps() -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in _workflow()["jobs"].items() for step in job["steps"]]


def test_every_action_is_pinned_by_a_full_commit_with_its_tag() -> None:
    used = [step["uses"] for _, step in _steps() if "uses" in step]
    assert used, "no action used: the test would prove nothing"
    for uses in used:
        assert PINNED.fullmatch(uses), f"{uses}: not pinned by a 40-hex commit"
    # The line says which release the commit is (so an update can be reviewed).
    lines = [line for line in WORKFLOW.read_text().splitlines() if "uses:" in line]
    assert len(lines) == len(used)
    for line in lines:
        assert re.search(r"@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), line
    # Reusable workflows and container images would be actions too.
    for job in _workflow()["jobs"].values():
        assert "uses" not in job and "container" not in job and "services" not in job


def test_checkout_keeps_no_credential_for_later_steps() -> None:
    checkouts = [
        step for _, step in _steps() if step.get("uses", "").startswith("actions/checkout@")
    ]
    assert checkouts
    for step in checkouts:
        assert step.get("with", {}).get("persist-credentials") is False, step


def test_the_cluster_credential_reaches_one_step_of_a_job_in_the_protected_environment() -> None:
    doc = _workflow()
    assert WORKFLOW.read_text().count(SECRET) == 1
    # Nowhere but in one step's env: not the workflow's or a job's env, not a with: or run:.
    assert SECRET not in str(doc.get("env", {}))
    holders = []
    for name, job in doc["jobs"].items():
        assert SECRET not in str(job.get("env", {})), name
        for step in job["steps"]:
            outside_env = {k: v for k, v in step.items() if k != "env"}
            assert SECRET not in str(outside_env), step
            if SECRET in str(step.get("env", {})):
                holders.append((name, step))
    ((job_name, step),) = holders
    job = doc["jobs"][job_name]
    environment = job.get("environment")
    if isinstance(environment, dict):
        environment = environment.get("name")
    assert environment == ENVIRONMENT
    # The job holding it asks for no more than reading the repository and commenting.
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    # No other job runs in the environment (each would get its secrets on approval).
    others = [n for n, j in doc["jobs"].items() if n != job_name and j.get("environment")]
    assert others == []
    # The step's kubeconfig file is its own and gone when the plan is done.
    assert "umask 077" in step["run"] and 'rm -f "$RUNNER_TEMP/kubeconfig"' in step["run"]


def test_the_readme_says_how_to_protect_the_environment() -> None:
    readme = (EXAMPLE / "README.md").read_text()
    assert f"**`{ENVIRONMENT}`**" in readme
    for words in ("Required reviewers", "Prevent self-review", "Environment secrets"):
        assert words in readme, words
    assert "`VGPUCTL_KUBECONFIG`" in readme


def test_the_workflow_passes_actionlint() -> None:
    """actionlint checks what GitHub would only say when the workflow runs: expressions and
    their contexts (``steps.plan.outputs.status`` of a step with that id), ``needs:`` naming
    jobs, ``if:`` syntax, each action's inputs, and the ``run:`` scripts with shellcheck where
    it is installed (issue 34, item 1)."""
    result = subprocess.run(
        [actionlint(), "-no-color", str(WORKFLOW)],
        capture_output=True, text=True, timeout=120, check=False, cwd=EXAMPLE,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_namespace_is_made_and_the_install_line_is_a_placeholder() -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLE / "ci-rbac.yaml").read_text()) if d]
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert namespace["metadata"]["name"] == account["metadata"]["namespace"]
    # The same object as the agents' (a `kubectl apply` of one drops labels the other set).
    agents = yaml.safe_load((REPO / "deploy" / "namespace.yaml").read_text())
    assert namespace["metadata"] == agents["metadata"]
    text = WORKFLOW.read_text()
    before = text[: text.index("  VGPUCTL: ")]
    assert "PLACEHOLDER, replace it" in before.splitlines()[-3]
