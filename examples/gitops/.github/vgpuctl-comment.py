"""The pull request's one living plan comment (.github/workflows/vgpuctl.yml runs it).

    python .github/vgpuctl-comment.py post PLAN.md STATUS   # the plan, whatever its exit code
    python .github/vgpuctl-comment.py outdated              # a newer commit's plan is coming

The comment is found by the hidden marker on its first line (``<!-- vgpuctl-plan -->``, as
tfcmt and Atlantis find theirs) among the comments the workflow's own identity wrote (a
comment anyone else writes with the marker is left alone), and updated in place: a pull
request has one plan comment however often it is pushed to, made on the first plan. ``post``
writes the plan (``vgpuctl plan -o markdown``'s output; when vgpuctl exited with an error the
comment says so first, and when it wrote nothing, that the job's log has why); ``outdated``
marks the comment as the plan of an older commit, when a push supersedes it and the new plan
waits (for the environment's reviewers, or its run).

Standard library only. Environment (GitHub Actions sets all but the first two, and PR/HEAD_SHA
which the workflow passes): GH_TOKEN, PR (the pull request's number), HEAD_SHA (its head
commit), GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_SERVER_URL, GITHUB_RUN_ID; optionally
VGPUCTL_COMMENT_AUTHOR (the login the token comments as: github-actions[bot] for the workflow's
GITHUB_TOKEN) and VGPUCTL_PLAN_ARTIFACT (the name of the artifact holding the JSON plan).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

MARKER = "<!-- vgpuctl-plan -->"
#: GitHub refuses a comment body over this many characters.
LIMIT = 65_536
OUTDATED = "> [!IMPORTANT]\n> **Outdated:** "


class Failure(Exception):
    """A request GitHub refused, or an environment variable missing: said in one line."""


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        raise Failure(f"environment variable {name} is not set")
    return value


def request(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    url = env("GITHUB_API_URL", "https://api.github.com").rstrip("/") + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (the API's URL)
    req.add_header("Authorization", f"Bearer {env('GH_TOKEN')}")
    req.add_header("Accept", "application/vnd.github+json")
    req.add_header("X-GitHub-Api-Version", "2022-11-28")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as response:  # noqa: S310
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300]
        raise Failure(f"{method} {path}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise Failure(f"{method} {path}: {e}") from None


def find() -> dict[str, Any] | None:
    """The pull request's plan comment: the first with the marker by our own identity."""
    repo, number = env("GITHUB_REPOSITORY"), env("PR")
    author = os.environ.get("VGPUCTL_COMMENT_AUTHOR") or "github-actions[bot]"
    page = 1
    while True:
        comments = request(
            "GET", f"/repos/{repo}/issues/{number}/comments?per_page=100&page={page}"
        )
        if not isinstance(comments, list):
            raise Failure(f"listing the comments of #{number}: not a list")
        for comment in comments:
            body, user = comment.get("body") or "", (comment.get("user") or {}).get("login")
            if body.startswith(MARKER) and user == author:
                return dict(comment)
        if len(comments) < 100:
            return None
        page += 1


def write(body: str) -> str:
    """Update the plan comment to ``body``, or make it; say which."""
    if len(body) > LIMIT:  # vgpuctl's --max-bytes keeps it under; a wider one is cut here
        cut = "\n\n*(cut at GitHub's limit: the full plan is the run's artifact)*\n"
        body = body[: LIMIT - len(cut)] + cut
    repo = env("GITHUB_REPOSITORY")
    found = find()
    if found is None:
        made = request("POST", f"/repos/{repo}/issues/{env('PR')}/comments", {"body": body})
        return f"made comment {made.get('id')}"
    request("PATCH", f"/repos/{repo}/issues/comments/{found['id']}", {"body": body})
    return f"updated comment {found['id']}"


def _commit_line(sha: str) -> str:
    return f"<!-- commit: {sha} -->"


def post(plan_file: str, status: str) -> str:
    sha = env("HEAD_SHA")
    run = (
        f"{env('GITHUB_SERVER_URL', 'https://github.com')}/{env('GITHUB_REPOSITORY')}"
        f"/actions/runs/{env('GITHUB_RUN_ID')}"
    )
    artifact = os.environ.get("VGPUCTL_PLAN_ARTIFACT") or "vgpuctl-plan"
    try:
        with open(plan_file, encoding="utf-8") as f:
            plan = f.read()
    except OSError:
        plan = ""
    parts = [MARKER, _commit_line(sha)]
    if status not in ("0", "2"):
        said = (
            "its plan is below, and the nodes it could not plan are marked"
            if plan.strip()
            else "it wrote no plan: the job's log says why"
        )
        parts += [
            "> [!CAUTION]",
            f"> `vgpuctl plan` exited {status or 'before it ran'}: the job fails; {said}.",
            "",
        ]
    if plan.strip():
        parts.append(plan.rstrip("\n"))
    parts += [
        "",
        f"<sub>Plan of commit {sha[:12]} · [workflow run]({run}) · the full plan (JSON): the "
        f"run's artifact `{artifact}`</sub>",
    ]
    return write("\n".join(parts) + "\n")


def outdated() -> str:
    sha = env("HEAD_SHA")
    found = find()
    if found is None:
        return "no plan comment yet"
    lines = str(found["body"]).split("\n")
    old = lines[1].removeprefix("<!-- commit: ").removesuffix(" -->") if len(lines) > 1 else ""
    if old == sha:
        return "the plan comment is of this commit already"
    rest = lines[2:]
    if "\n".join(rest).startswith(OUTDATED):  # marked before: the newer push says it again
        rest = rest[rest.index("") + 1 :] if "" in rest else []
    banner = (
        f"{OUTDATED}this plan is of commit {old[:12]}; commit {sha[:12]} has been pushed "
        "since, and its plan replaces this one when its job runs."
    )
    body = "\n".join([MARKER, _commit_line(old), *banner.split("\n"), "", *rest])
    repo = env("GITHUB_REPOSITORY")
    request("PATCH", f"/repos/{repo}/issues/comments/{found['id']}", {"body": body})
    return f"marked comment {found['id']} outdated"


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["post"] and len(argv) == 3:
            print(post(argv[1], argv[2]))
        elif argv == ["outdated"]:
            print(outdated())
        else:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return 2
    except Failure as e:
        print(f"vgpuctl-comment: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
