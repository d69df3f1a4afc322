"""``vgpuctl sim cluster DIR --nodes N`` (issue 34, item 4), run as a user runs it: a process in
the foreground, its export line pasted, then ``apply`` on each simulated node, ``plan --observed
cluster``, ``capacity`` and ``lint-vm`` against it, and SIGTERM.

Expected values by hand: an A2 has 16 GB (docs/domain.md §1), so four A2-4Q or two A2-8Q fill it
(equal-size mode); its VFs are functions 4 and up of 0000:08:00.x.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim_cluster import Running, start_sim_cluster, stop_sim_cluster
from tests.simnode import REPO, run_vgpuctl

#: The README's example for it (its groups: pool=small four A2-4Q, pool=big two A2-8Q).
FLEET = REPO / "desired-state" / "examples" / "sim-cluster.yaml"


@pytest.fixture
def sim_cluster(tmp_path: Path) -> Iterator[Running]:
    running = start_sim_cluster(
        tmp_path / "sim", "--nodes", "3", "--labels", "pool=small", "--labels", "node-2:pool=big"
    )
    yield running
    if running.proc.poll() is None:
        running.proc.kill()
        running.proc.wait()


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
    code, err = stop_sim_cluster(running)
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
    code, err = stop_sim_cluster(sim_cluster)
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


# -- a snapshot: plans without cluster credentials ------------------------------------------------

#: The example with node-1 and node-3 (pool=small) down from four A2-4Q to two: each of them
#: loses two vGPUs, node-2 (pool=big) is unchanged.
SMALLER = FLEET.read_text().replace("profiles: {A2-4Q: 4}", "profiles: {A2-4Q: 2}")


def _snapshot_of(running: Running, tmp_path: Path) -> Path:
    kubeconfig = running.kubeconfig
    for node in ("node-1", "node-2", "node-3"):
        host = running.dir / "nodes" / node
        _ok("apply", FLEET, "--yes", "--node", node, "--sysfs-root", host / "sys",
            "--kubeconfig", kubeconfig)  # fmt: skip
    res = _ok("export", "--observed", "cluster", "-o", "snapshot", "--kubeconfig", kubeconfig)
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(res.stdout)
    return snapshot


def test_a_snapshot_plans_as_the_cluster_did_with_no_cluster(
    sim_cluster: Running, tmp_path: Path
) -> None:
    snapshot = _snapshot_of(sim_cluster, tmp_path)
    doc = json.loads(snapshot.read_text())
    assert doc["apiVersion"] == "vgpu.reconciler.dev/v1alpha1"
    assert doc["kind"] == "ClusterSnapshot"
    taken = time.mktime(time.strptime(doc["takenAt"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert abs(time.time() - taken) < 120
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(SMALLER)
    live = _plan(smaller, "--observed", "cluster", "--kubeconfig", sim_cluster.kubeconfig)
    code, err = stop_sim_cluster(sim_cluster)  # the cluster is gone: the snapshot alone plans
    assert code == 0, err

    from_file = _plan(smaller, "--observed", snapshot)
    assert from_file.returncode == live.returncode == 2  # --detailed-exitcode: changes
    assert from_file.stdout == live.stdout
    summary = from_file.stdout.splitlines()[-1]
    assert summary.startswith("Cluster plan: 3 nodes, 2 with changes; 0 to create, ")
    assert summary.endswith(" 4 to remove, 0 blocked.")
    assert f"Planned from the snapshot {snapshot}, taken at {doc['takenAt']} (" in (
        from_file.stderr
    )
    as_json = _plan(smaller, "--observed", snapshot, "-o", "json")
    assert json.loads(as_json.stdout)["snapshotTakenAt"] == doc["takenAt"]
    # A pull request's comment says what it was planned from, and when that was.
    markdown = _plan(smaller, "--observed", snapshot, "-o", "markdown").stdout
    assert markdown.splitlines()[2].endswith(f" (observed: cluster snapshot of {doc['takenAt']})")


def _plan(desired: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    res = run_vgpuctl("plan", desired, "--detailed-exitcode", *args)
    assert "Traceback" not in res.stderr
    return res


def _aged(snapshot: Path, seconds: float, tmp_path: Path) -> Path:
    doc = json.loads(snapshot.read_text())
    doc["takenAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))
    aged = tmp_path / f"aged-{int(seconds)}.json"
    aged.write_text(json.dumps(doc))
    return aged


def test_a_stale_snapshot_is_refused_saying_how_old(sim_cluster: Running, tmp_path: Path) -> None:
    snapshot = _snapshot_of(sim_cluster, tmp_path)
    stop_sim_cluster(sim_cluster)
    old = _aged(snapshot, 2 * 3600 + 5 * 60 + 30, tmp_path)  # 2h 5m
    res = _plan(FLEET, "--observed", old)
    assert res.returncode == 1
    assert "2h 5m ago, older than --max-snapshot-age 1h: take it again" in res.stderr
    res = _plan(FLEET, "--observed", old, "--max-snapshot-age", "3h")
    assert res.returncode == 0, res.stderr
    assert "Cluster plan: 3 nodes, 0 with changes" in res.stdout
    future = _aged(snapshot, -3630, tmp_path)
    res = _plan(FLEET, "--observed", future)
    assert res.returncode == 1
    assert "1h in the future" in res.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"kind": "ClusterSnapshot"}', "not a vgpuctl cluster snapshot"),
        (
            '{"apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "ClusterSnapshot", '
            '"takenAt": "2026-01-01T00:00:00Z", "resources": [{"group": "", "version": "v1", '
            '"plural": "nodes", "served": true, "complete": true, "items": [{"metadata": 7}]}]}',
            "resources[0].items[0]: expected an object with metadata.name",
        ),
        (
            '{"apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "ClusterSnapshot", '
            '"takenAt": "yesterday", "resources": []}',
            "['takenAt']",
        ),
    ],
)
def test_a_file_that_is_no_snapshot_is_one_clear_line(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "snapshot.json"
    path.write_text(content)
    res = _plan(FLEET, "--observed", path)
    assert res.returncode == 1
    assert f"--observed {path}: " in res.stderr
    assert message in res.stderr


def test_snapshot_flags_go_together(tmp_path: Path) -> None:
    res = run_vgpuctl("export", "-o", "snapshot")
    assert res.returncode == 1
    assert "export --observed cluster -o snapshot" in res.stderr
    res = run_vgpuctl("plan", FLEET, "--observed", "cluster", "--max-snapshot-age", "1h")
    assert res.returncode == 1
    assert "--max-snapshot-age goes with --observed FILE" in res.stderr
