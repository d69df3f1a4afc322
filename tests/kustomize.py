"""A kustomize build of a directory of deploy/, for the deploy tests (no cluster needed).

``kustomize build`` where a kustomize is installed (``.ci/run`` installs one from the Go module
proxy, pinned, so the optional components are built in CI too), else ``kubectl kustomize``.
Skips, saying why, where neither is installed or kubectl's kustomize predates components
(Debian 12's kubectl 1.20); with ``VGPUCTL_REQUIRE_KUSTOMIZE`` set (``.ci/run`` sets it) that
is a failure instead, so CI cannot pass on builds it never made."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests.simnode import REPO

#: The placeholder image deploy/ names (``kustomize edit set image`` rewrites it).
IMAGE = "ghcr.io/vgpuctl/vgpuctl:0.1.0"


def _cannot(why: str) -> NoReturn:
    if os.environ.get("VGPUCTL_REQUIRE_KUSTOMIZE"):
        pytest.fail(f"{why} (VGPUCTL_REQUIRE_KUSTOMIZE is set: .ci/run installs kustomize)")
    pytest.skip(why)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    standalone = shutil.which("kustomize")
    kubectl = shutil.which("kubectl")
    if standalone is not None:
        command = [standalone, "build", str(directory)]
    elif kubectl is not None:
        command = [kubectl, "kustomize", str(directory)]
    else:
        _cannot("neither kustomize nor kubectl is installed: kustomize builds are not checked")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0 and 'unknown field "components"' in result.stderr:
        # Debian 12's kubernetes-client is kubectl 1.20, whose kustomize (v2.0.3) predates
        # components (kustomize 3.7, kubectl 1.21): only the base can be built with it.
        _cannot(f"{command[0]}'s kustomize has no components (kustomize 3.7 or newer needed)")
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def kustomize_with_component(tmp_path: Path, component: str) -> list[dict[str, Any]]:
    """deploy/ built with its optional ``component`` (``git-sync``), from an overlay outside
    deploy/ as deploy/README.md shows (a copy of deploy/ beside it, under ``tmp_path``)."""
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources: [../deploy]\n"
        f"components: [../deploy/{component}]\n",
        "utf-8",
    )
    return kustomize(overlay)
