"""actionlint (github.com/rhysd/actionlint), the checker of GitHub Actions workflows, for the
GitOps example's workflow test.

Found on PATH, else in the cache directory ``.ci/run`` builds it into
(``${XDG_CACHE_HOME:-~/.cache}/vgpuctl-ci/actionlint-<VERSION>``), else built there once from
the Go module proxy (``go install``, a few seconds; the same pinned version). Skips, saying why,
where it cannot be had (no Go, no module proxy); with ``VGPUCTL_REQUIRE_ACTIONLINT`` set
(``.ci/run`` sets it) that is a failure instead, so CI cannot pass on a check it never ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

#: The version .ci/run installs (keep the two equal).
VERSION = "v1.7.12"
MODULE = "github.com/rhysd/actionlint/cmd/actionlint"


def _cannot(why: str) -> NoReturn:
    if os.environ.get("VGPUCTL_REQUIRE_ACTIONLINT"):
        pytest.fail(f"{why} (VGPUCTL_REQUIRE_ACTIONLINT is set: .ci/run installs actionlint)")
    pytest.skip(why)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vgpuctl-ci" / f"actionlint-{VERSION}"


def actionlint() -> str:
    """The path of an actionlint to run."""
    found = shutil.which("actionlint")
    if found is not None:
        return found
    cached = cache_dir() / "actionlint"
    if cached.is_file():
        return str(cached)
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None
    )
    if go is None:
        _cannot("actionlint is not installed, and no Go to build it with")
    env = {**os.environ, "GOBIN": str(cache_dir()), "GOTOOLCHAIN": "local"}
    result = subprocess.run(
        [go, "install", f"{MODULE}@{VERSION}"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    if result.returncode != 0 or not cached.is_file():
        _cannot(f"actionlint {VERSION} could not be built: {result.stderr.strip()[-300:]}")
    return str(cached)
