"""Fixtures shared by several test packages: a simulated A2 node with the seed's desired
state, the watch agent, and the API-server emulator with our CRDs. Their helpers are modules of
their own (``simnode.py``, ``watch_agent.py``, ``cluster_node.py``, ``doubles/``): no test
imports another test module."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster_node import kubevirt_cr, register_crds
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import SimNode, make_sim
from tests.watch_agent import Watch, seed_text

# Hermetic: a test run inside a pod must not hand the pod's cluster to the vgpuctl it starts
# (without --kubeconfig, vgpuctl in a pod uses the in-cluster service account). Every cluster a
# test wants is the API emulator, named by a kubeconfig. (A simulated host's kubelet checkpoint
# is its own DIR/kubelet: the machine's /var/lib/kubelet is never read either.)
for _variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_variable, None)


@pytest.fixture
def start_watch() -> Iterator[Callable[..., Watch]]:
    """Starts ``vgpuctl watch`` agents; each is killed at teardown whatever happened."""
    started: list[Watch] = []

    def start(node: SimNode, target: Path, *extra: str) -> Watch:
        watch = Watch(node, target, *extra)
        started.append(watch)
        return watch

    yield start
    for watch in started:
        watch.kill()


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    """The seed's host: one A2 at 0000:08:00.0, SR-IOV off."""
    return make_sim(tmp_path / "host", ["A2@0000:08:00.0"])


@pytest.fixture
def desired_dir(tmp_path: Path) -> Path:
    """A desired-state directory holding the seed's file."""
    directory = tmp_path / "desired-state"
    directory.mkdir()
    (directory / "harvester-kgd9c.yaml").write_text(seed_text())
    return directory


@pytest.fixture
def emu() -> Iterator[ApiServerEmulator]:
    """The API-server emulator serving our CRDs, KubeVirt's and its CR in harvester-system."""
    with ApiServerEmulator() as server:
        register_crds(server)
        server.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        server.seed(kubevirt_cr())
        yield server
