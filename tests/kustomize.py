"""``kubectl kustomize`` of a directory of deploy/, for the deploy tests (no cluster needed).

Skips, saying why, where kubectl is not installed or its kustomize predates components (Debian
12's kubectl 1.20; ``.ci/run`` installs kubectl where there is none)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

#: The placeholder image deploy/ names (``kustomize edit set image`` rewrites it).
IMAGE = "ghcr.io/vgpuctl/vgpuctl:0.1.0"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: kustomize builds are not checked")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0 and 'unknown field "components"' in result.stderr:
        # Debian 12's kubernetes-client is kubectl 1.20, whose kustomize (v2.0.3) predates
        # components (kustomize 3.7, kubectl 1.21): only the base can be built with it.
        pytest.skip(f"{kubectl}'s kustomize has no components (kubectl 1.21 or newer needed)")
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]
