"""``vgpuctl sim cluster DIR --nodes N`` (issue 34, item 4), run as a user runs it: a process in
the foreground, its export line pasted, then ``apply`` on each simulated node, ``plan --observed
cluster``, ``capacity`` and ``lint-vm`` against it, and SIGTERM.

Expected values by hand: an A2 has 16 GB (docs/domain.md §1), so four A2-4Q or two A2-8Q fill it
(equal-size mode); its VFs are functions 4 and up of 0000:08:00.x.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.simnode import REPO, run_vgpuctl

#: The README's example for it (its groups: pool=small four A2-4Q, pool=big two A2-8Q).
FLEET = REPO / "desired-state" / "examples" / "sim-cluster.yaml"


class Running:
    def __init__(self, proc: subprocess.Popen[str], export: str, directory: Path) -> None:
        self.proc = proc
        self.export = export
        self.dir = directory

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def url(self) -> str:
        config = json.loads(self.kubeconfig.read_text())
        server: str = config["clusters"][0]["cluster"]["server"]
        return server


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    return env


def _start(directory: Path, *args: str) -> Running:
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "sim", "cluster", str(directory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=60):
            proc.kill()
            pytest.fail("sim cluster printed nothing in 60 s")
    line = proc.stdout.readline()
    return Running(proc, line, directory)


@pytest.fixture
def sim_cluster(tmp_path: Path) -> Iterator[Running]:
    running = _start(
        tmp_path / "sim", "--nodes", "3", "--labels", "pool=small", "--labels", "node-2:pool=big"
    )
    yield running
    if running.proc.poll() is None:
        running.proc.kill()
        running.proc.wait()


def _stop(running: Running) -> tuple[int, str]:
    running.proc.send_signal(signal.SIGTERM)
    try:
        _, err = running.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        pytest.fail("sim cluster did not stop within 30 s of SIGTERM")
    return running.proc.returncode, err


def _ok(*args: str | Path) -> subprocess.CompletedProcess[str]:
    res = run_vgpuctl(*args)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res


def test_a_fleet_to_try_plan_apply_capacity_on_then_a_clean_stop(
    sim_cluster: Running, tmp_path: Path
) -> None:
    running = sim_cluster
    kubeconfig = running.kubeconfig
    assert running.export == f"export VGPUCTL_KUBECONFIG={kubeconfig.absolute()}\n"
    assert kubeconfig.stat().st_mode & 0o777 == 0o600  # its token is the way in
    assert running.url.startswith("http://127.0.0.1:")
    fleet = FLEET

    # Nothing applied yet: no node has a VGPUNodeState to plan from.
    res = run_vgpuctl("plan", fleet, "--observed", "cluster", "--kubeconfig", kubeconfig)
    assert res.returncode == 1, res.stderr
    assert "has no VGPUNodeState" in res.stdout + res.stderr

    for node in ("node-1", "node-2", "node-3"):
        host = running.dir / "nodes" / node
        _ok("apply", fleet, "--yes", "--node", node, "--sysfs-root", host / "sys",
            "--kubeconfig", kubeconfig)  # fmt: skip
    # node-2 is the big one by its own label; the others by the label every Node has.
    vfs = sorted(p.name for p in (running.dir / "nodes/node-2/sys/bus/mdev/devices").iterdir())
    assert len(vfs) == 2

    res = _ok("plan", fleet, "--observed", "cluster", "--kubeconfig", kubeconfig)
    assert "Cluster plan: 3 nodes, 0 with changes" in res.stdout

    res = _ok("capacity", "--kubeconfig", kubeconfig)
    rows = {tuple(line.split()[:3]) for line in res.stdout.splitlines()[1:]}
    assert rows == {
        ("node-1", "nvidia.com/NVIDIA_A2-4Q", "4"),
        ("node-2", "nvidia.com/NVIDIA_A2-8Q", "2"),
        ("node-3", "nvidia.com/NVIDIA_A2-4Q", "4"),
        ("(cluster)", "nvidia.com/NVIDIA_A2-4Q", "8"),
        ("(cluster)", "nvidia.com/NVIDIA_A2-8Q", "2"),
    }

    vm = tmp_path / "vm.yaml"
    vm.write_text(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: vm}\nspec:\n"
        "  template:\n    spec:\n      domain:\n        devices:\n          gpus:\n"
        "            - {name: g, deviceName: nvidia.com/NVIDIA_A2-4Q}\n"
    )
    res = run_vgpuctl("lint-vm", vm, "--kubeconfig", kubeconfig)
    # No device plugin runs on a simulated node: the cluster's 3 Nodes offer nothing yet.
    assert "no node of the cluster's 3" in res.stdout + res.stderr

    pid = running.proc.pid
    code, err = _stop(running)
    assert code == 0, err
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    host, port = running.url.removeprefix("http://").split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass


def test_it_answers_only_its_kubeconfigs_token(sim_cluster: Running) -> None:
    url = sim_cluster.url
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"{url}/api/v1/nodes", timeout=10)  # noqa: S310 (local http)
    assert error.value.code == 401
    token = json.loads(sim_cluster.kubeconfig.read_text())["users"][0]["user"]["token"]
    request = urllib.request.Request(  # noqa: S310
        f"{url}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        nodes = json.loads(answer.read())["items"]
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    assert labels == {
        "node-1": {"kubernetes.io/hostname": "node-1", "pool": "small"},
        "node-2": {"kubernetes.io/hostname": "node-2", "pool": "big"},
        "node-3": {"kubernetes.io/hostname": "node-3", "pool": "small"},
    }
    code, err = _stop(sim_cluster)
    assert code == 0, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "1001"], "--nodes must be between 1 and 1000, got 1001"),
        (["--nodes", "0"], "--nodes must be between 1 and 1000, got 0"),
        (["--nodes", "2", "--labels", "node-5:a=b"], "--labels names node 'node-5'"),
        (["--labels", "a b=c"], "--labels: 'a b' is not a Kubernetes label key"),
        (["--gpu", "Z9"], "Z9"),
    ],
)
def test_bad_arguments_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    started = time.monotonic()
    res = run_vgpuctl("sim", "cluster", tmp_path / "sim", *args, timeout=60)
    assert res.returncode == 1, res.stderr  # a usage error (reconciler/cli/main.py)
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "sim" / "kubeconfig").exists()
    assert time.monotonic() - started < 60
