"""Fixtures shared by several test packages: a simulated A2 node with the seed's desired
state, the watch agent, and the API-server emulator with our CRDs. Their helpers are modules of
their own (``simnode.py``, ``watch_agent.py``, ``cluster_node.py``, ``doubles/``): no test
imports another test module."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import real_apiserver
from tests.api_servers import (
    PolicedAgent,
    Served,
    harvester_cluster,
    served_emulator,
    served_real,
)
from tests.cluster_node import kubevirt_cr, register_crds
from tests.doubles.emulator import ApiServerEmulator
from tests.simnode import REPO, SimNode, make_sim
from tests.watch_agent import Watch, seed_text

# Hermetic: a test run inside a pod must not hand the pod's cluster to the vgpuctl it starts
# (without --kubeconfig, vgpuctl in a pod uses the in-cluster service account). Every cluster a
# test wants is the API emulator, named by a kubeconfig. (A simulated host's kubelet checkpoint
# is its own DIR/kubelet: the machine's /var/lib/kubelet is never read either.)
for _variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_variable, None)
# Nor the machine's vgpuctl settings (a VGPUCTL_SYSFS_ROOT, a NODE_NAME): every test names its
# simulated host, state directory and node itself.
# (VGPUCTL_REQUIRE_* are the suite's own switches, kept: .ci/run sets VGPUCTL_REQUIRE_KUSTOMIZE
# so a missing kustomize fails its tests instead of skipping them; VGPUCTL_REQUIRE_REALAPI
# makes a missing real API server fail the real tier.)
for _variable in [v for v in os.environ if v.startswith("VGPUCTL_")] + ["NODE_NAME"]:
    if not _variable.startswith("VGPUCTL_REQUIRE_"):
        os.environ.pop(_variable, None)

#: What no test may read: the machine's sysfs, kubelet directory and kubeconfigs.
FORBIDDEN = ("/sys", "/var/lib/kubelet", os.path.expanduser("~/.kube"))
_touched: list[str] = []


def _forbidden(path: Any) -> str | None:
    if isinstance(path, int):
        return None  # a descriptor (openat): its directory was checked when it was opened
    try:
        text = os.fsdecode(path)
    except TypeError:
        return None
    full = os.path.normpath(os.path.abspath(text))
    for root in FORBIDDEN:
        if full == root or full.startswith(root + "/"):
            return full
    return None


def _guard(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook: opening or listing a forbidden path fails the open and the test."""
    if event in ("open", "os.listdir", "os.scandir", "os.chdir", "shutil.rmtree") and args:
        found = _forbidden(args[0])
        if found is not None:
            _touched.append(f"{event} {found}")
            raise PermissionError(f"hermetic tests: {event} {found} is the machine's, not a test's")


sys.addaudithook(_guard)


@pytest.fixture(autouse=True)
def _hermetic() -> Iterator[None]:
    """Fail a test that touched the machine's sysfs, kubelet directory or kubeconfig, even if
    the code under test caught the error."""
    del _touched[:]
    yield
    touched, _touched[:] = list(_touched), []
    assert not touched, f"the test touched the machine's files: {touched}"


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module's ``CRD_SETS`` runs each of its tests that uses ``emu`` once per CRD set."""
    sets = getattr(metafunc.module, "CRD_SETS", None)
    if sets and "emu" in metafunc.fixturenames:
        metafunc.parametrize("emu", sets, indirect=True)


@pytest.fixture
def emu(request: pytest.FixtureRequest) -> Iterator[ApiServerEmulator]:
    """The API-server emulator serving our CRDs, KubeVirt's and its CR in harvester-system.

    A module may run its tests against Harvester's own CRDs too: ``CRD_SETS = ("ours",
    "harvester")`` (:func:`pytest_generate_tests`)."""
    harvester = getattr(request, "param", "ours") == "harvester"
    with ApiServerEmulator() as server:
        register_crds(server, harvester=harvester)
        server.seed(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harvester-system"}}
        )
        server.seed(kubevirt_cr())
        yield server


@pytest.fixture(scope="session")
def vgpuctl_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vgpuctl's own wheel, built once per test process as the Containerfile's first stage
    builds it (``pip wheel --no-cache-dir``; its dependencies are on this machine already, so
    ``--no-deps --no-build-isolation``)."""
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps",
         "--no-build-isolation", "--quiet", "--wheel-dir", str(wheels), str(REPO)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("vgpuctl-*.whl")
    return wheel


# --- the real API server (tests/real_apiserver.py, tests/api_servers.py) ---


def pytest_report_header(config: pytest.Config) -> str:
    """Whether the real-API tier can run here, and with which binaries."""
    if real_apiserver.built():
        return (
            f"real API server: kube-apiserver {real_apiserver.KUBERNETES_VERSION}, etcd "
            f"{real_apiserver.ETCD_VERSION} ({real_apiserver.binaries_dir()})"
        )
    return f"real API server: {real_apiserver.NOT_BUILT}"


@pytest.fixture(scope="session")
def real_api(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[real_apiserver.RealApiServer]:
    """etcd and kube-apiserver, one pair per test process, stopped at its end. Skipped where
    they are not built (``VGPUCTL_REQUIRE_REALAPI``: failed instead)."""
    if not real_apiserver.built():
        if os.environ.get(real_apiserver.REQUIRE):
            pytest.fail(real_apiserver.NOT_BUILT)
        pytest.skip(real_apiserver.NOT_BUILT)
    with real_apiserver.real_apiserver(tmp_path_factory.mktemp("realapi")) as server:
        line = (
            f"real API server {server.version.get('gitVersion')} "
            f"({server.version.get('goVersion')}, etcd {real_apiserver.ETCD_VERSION}) at "
            f"{server.url}"
        )
        worker_output = getattr(pytestconfig, "workeroutput", None)
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if worker_output is not None:
            # A worker of pytest-xdist: its controller prints it (pytest_terminal_summary).
            worker_output[_REAL_API_LINE] = line.rsplit(" at ", 1)[0]
        elif reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():  # past the capture of the setup
                reporter.write_line(f"\n{line}")
        else:
            print(line)
        yield server


#: What each pytest-xdist worker's real API server said it is (the controller's to print).
_REAL_API_LINE = "vgpuctl_real_api_server"
_REAL_API_SEEN: dict[str, int] = {}


def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: a worker ended; keep the real API server it started, if any."""
    line = getattr(node, "workeroutput", {}).get(_REAL_API_LINE)
    if line:
        _REAL_API_SEEN[line] = _REAL_API_SEEN.get(line, 0) + 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The real API servers the workers ran the tests against, with their version."""
    for line, workers in sorted(_REAL_API_SEEN.items()):
        terminalreporter.write_line(f"{line}: one in each of {workers} worker processes")


@pytest.fixture(params=["emulator", pytest.param("real", marks=pytest.mark.realapi)])
def api_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """The test once against the emulator, once against the real API server (``realapi``)."""
    if request.param == "emulator":
        emulator, served = served_emulator(tmp_path)
        try:
            yield served
        finally:
            served.api.close()
            emulator.stop()
        return
    served = served_real(request.getfixturevalue("real_api"), tmp_path)
    try:
        yield served
    finally:
        served.clean()
        served.api.close()


@pytest.fixture
def agent_kubeconfig(api_server: Served, tmp_path: Path) -> Iterator[Path]:
    """Harvester's cluster on each server (``api_server``), and the agent's kubeconfig with
    deploy/'s role and policy in force (taken away again afterwards)."""
    harvester_cluster(api_server)
    with PolicedAgent(api_server, tmp_path / "agent") as path:
        yield path
