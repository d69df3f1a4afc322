"""Shared fixtures: the repository root and a way to run ``vgpuctl`` as a user would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Hermetic: a test run inside a pod must not hand the pod's cluster to the vgpuctl it starts
# (without --kubeconfig, vgpuctl in a pod uses the in-cluster service account). Every cluster a
# test wants is the API emulator, named by a kubeconfig. (A simulated host's kubelet checkpoint
# is its own DIR/kubelet: the machine's /var/lib/kubelet is never read either.)
for _variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_variable, None)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
