"""``vgpuctl watch`` with its embedded device plugins, against the fake kubelet (real gRPC).

The kubelet's view is what counts: after a reboot it must list the same UUIDs, healthy again,
and a profile change must move a device from one resource to another without leaving a
tombstone behind.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.doubles.fake_kubelet import FakeKubelet, make_plugin_dir, remove_plugin_dir
from tests.simnode import SimNode, run_vgpuctl
from tests.watch_agent import U4, U5, U6, U7, Watch, seed_text, wait_for

A2_4A = "nvidia.com/NVIDIA_A2-4A"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
A2_4C = "nvidia.com/NVIDIA_A2-4C"


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    directory = make_plugin_dir("wdp")  # AF_UNIX paths are short: not under tmp_path
    yield directory
    remove_plugin_dir(directory)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin_dir) as k:
        yield k


def seed_advertised(kubelet: FakeKubelet) -> Callable[[], bool]:
    return lambda: kubelet.healthy_ids(A2_4A) == {U4, U6} and kubelet.healthy_ids(A2_4Q) == {U5, U7}


def test_plugins_readvertise_the_same_uuids_after_a_reboot(
    node: SimNode,
    desired_dir: Path,
    plugin_dir: Path,
    kubelet: FakeKubelet,
    start_watch: Callable[..., Watch],
) -> None:
    watch = start_watch(node, desired_dir, "--plugin-dir", str(plugin_dir))
    wait_for(watch.ready, "the first convergence")
    kubelet.wait_for(seed_advertised(kubelet), timeout=10, what="the seed's vGPUs advertised")
    seen = kubelet.update_count()

    assert run_vgpuctl("sim", "reboot", node.dir).returncode == 0
    kubelet.wait_for(
        lambda: any(not d.healthy for u in kubelet.updates()[seen:] for d in u.devices),
        timeout=10,
        what="the vanished vGPUs reported Unhealthy",
    )
    kubelet.wait_for(seed_advertised(kubelet), timeout=10, what="the same UUIDs healthy again")
    assert kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2}

    assert watch.stop(signal.SIGTERM) == 0
    assert not [p for p in plugin_dir.iterdir() if p.name.startswith("vgpuctl-")]


def test_a_profile_change_moves_the_device_without_a_tombstone(
    node: SimNode,
    desired_dir: Path,
    plugin_dir: Path,
    kubelet: FakeKubelet,
    start_watch: Callable[..., Watch],
) -> None:
    watch = start_watch(node, desired_dir, "--plugin-dir", str(plugin_dir))
    kubelet.wait_for(seed_advertised(kubelet), timeout=15, what="the seed's vGPUs advertised")
    (desired_dir / "harvester-kgd9c.yaml").write_text(seed_text("NVIDIA A2-4C"))
    kubelet.wait_for(
        lambda: kubelet.healthy_ids(A2_4C) == {U4} and kubelet.device_ids(A2_4A) == {U6},
        timeout=10,
        what="U4 moved from A2-4A to A2-4C",
    )
    assert kubelet.allocatable_all() == {A2_4A: 1, A2_4Q: 2, A2_4C: 1}
    assert watch.ready()


def test_a_missing_plugin_dir_is_a_clear_error_at_start(node: SimNode, desired_dir: Path) -> None:
    res = node.run(
        "watch", desired_dir, "--plugin-dir", node.dir / "nope", "--listen", "127.0.0.1:0",
        timeout=30,
    )  # fmt: skip
    assert res.returncode == 1
    assert "does not exist" in res.stderr
    assert "--no-device-plugin" in res.stderr
