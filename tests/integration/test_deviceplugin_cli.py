"""``vgpuctl device-plugin`` as a process: it rescans the host by itself, learns from the apply
journal which vGPUs vgpuctl removed, serves the fake kubelet, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.sim import SimHost, build_host
from tests.doubles.fake_kubelet import (
    HEALTHY,
    UNHEALTHY,
    DeviceState,
    FakeKubelet,
    make_plugin_dir,
    remove_plugin_dir,
)
from tests.simnode import A2_4A, A2_4Q, NODE, REPO, SEED, SEED_SPEC, SOCKETS, SimNode, run_vgpuctl

# Startup imports grpc and the rest; CI machines are slow.
STARTUP_S = 15.0
# The standalone mode notices host changes "within a few seconds"; it rescans every 0.2 s here.
RESCAN_S = 0.2
NOTICE_S = 5.0


def sim_uuid(vf: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"sim/{vf}"))


U4, U5, U6, U7 = (sim_uuid(f"0000:08:00.{f}") for f in (4, 5, 6, 7))


def test_device_plugin_cli_help_names_its_options() -> None:
    res = run_vgpuctl("device-plugin", "--help", timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--plugin-dir" in res.stdout
    assert "/var/lib/kubelet/device-plugins" in res.stdout
    assert "--rescan-interval" in res.stdout


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    directory = make_plugin_dir()
    yield directory
    remove_plugin_dir(directory)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin_dir) as k:
        yield k


@pytest.fixture
def seed(tmp_path: Path) -> tuple[SimNode, SimHost]:
    host = build_host(tmp_path / "host", SEED_SPEC)
    return SimNode(host.directory, NODE), host


@pytest.fixture
def device_plugin(
    seed: tuple[SimNode, SimHost], plugin_dir: Path, tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    """``vgpuctl device-plugin`` running against the seed host, output in tmp_path/dp.log."""
    node, _ = seed
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    log = (tmp_path / "dp.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler",
            "device-plugin",
            "--plugin-dir",
            str(plugin_dir),
            "--rescan-interval",
            str(RESCAN_S),
            *node.flags,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    log.close()


def _log(tmp_path: Path) -> str:
    return (tmp_path / "dp.log").read_text(errors="replace")


def test_device_plugin_cli_advertises_follows_the_host_and_the_journal_and_stops_on_sigterm(
    kubelet: FakeKubelet,
    device_plugin: subprocess.Popen[str],
    seed: tuple[SimNode, SimHost],
    plugin_dir: Path,
    tmp_path: Path,
) -> None:
    node, host = seed

    def alive() -> str:
        assert device_plugin.poll() is None, f"exited {device_plugin.returncode}\n" + _log(tmp_path)
        return ""

    # Advertises the seed's node.
    kubelet.wait_for(
        lambda: alive() == "" and kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2},
        timeout=STARTUP_S,
        what="the seed's allocatable from vgpuctl device-plugin",
    )
    assert set(kubelet.devices(A2_4Q)) == {DeviceState(U5, HEALTHY), DeviceState(U7, HEALTHY)}

    # A profile change through the real apply path (journal in the simulator's state dir):
    # VF .7 A2-4Q → A2-4A. The removed vGPU is dropped, not reported Unhealthy.
    desired = tmp_path / "desired.yaml"
    desired.write_text(
        SEED.read_text().replace('"0000:08:00.7": NVIDIA A2-4Q', '"0000:08:00.7": NVIDIA A2-4A')
    )
    node.ok("apply", desired, "--yes")
    kubelet.wait_for(
        lambda: (
            alive() == ""
            and kubelet.allocatable(A2_4A) == 3
            and kubelet.devices(A2_4Q) == (DeviceState(U5, HEALTHY),)
        ),
        timeout=NOTICE_S,
        what="the applied profile change (U7 dropped, a third A2-4A)",
    )

    # Removed out of band: Unhealthy, still listed.
    host.writer().write(f"bus/mdev/devices/{U5}/remove", "1")
    kubelet.wait_for(
        lambda: alive() == "" and kubelet.devices(A2_4Q) == (DeviceState(U5, UNHEALTHY),),
        timeout=NOTICE_S,
        what="the out-of-band removal to show as Unhealthy",
    )
    assert kubelet.allocatable(A2_4Q) == 0

    # A kubelet restart: re-registered within 1 s, nothing lost.
    before = {r: kubelet.devices(r) for r in (A2_4A, A2_4Q)}
    kubelet.restart()
    kubelet.wait_for(
        lambda: {r: kubelet.devices(r) for r in (A2_4A, A2_4Q)} == before,
        timeout=1.0,
        what="re-registration after a kubelet restart",
    )

    # SIGTERM: a clean stop, sockets removed.
    device_plugin.send_signal(signal.SIGTERM)
    assert device_plugin.wait(10) == 0, _log(tmp_path)
    assert not any((plugin_dir / s).exists() for s in SOCKETS)
    kubelet.wait_for(
        lambda: not kubelet.streaming(A2_4A) and not kubelet.streaming(A2_4Q),
        what="the streams to end",
    )


def test_device_plugin_cli_missing_plugin_dir_is_a_clear_error(
    seed: tuple[SimNode, SimHost], tmp_path: Path
) -> None:
    node, _ = seed
    missing = tmp_path / "no-such-dir"
    res = node.run("device-plugin", "--plugin-dir", missing, timeout=30)
    assert res.returncode != 0
    assert str(missing) in res.stderr
    assert "does not exist" in res.stderr
    assert "Traceback" not in res.stderr


def test_device_plugin_cli_advertises_vfio_vgpus_vgpuctl_did_not_make(
    kubelet: FakeKubelet, plugin_dir: Path, tmp_path: Path
) -> None:
    """Two L40-24Q the simulator made on NVIDIA's vendor-specific VFIO interface: vgpuctl has
    no record of them and, at the type's maximum, no VF lists the type. The device plugins
    ask the driver (``nvidia-smi vgpu -s -v``) and advertise both, under the type's name."""
    spec = {
        "interface": "vfio",
        "gpus": [
            {
                "model": "L40",
                "address": "0000:08:00.0",
                "vgpus": {0: "NVIDIA L40-24Q", 1: "NVIDIA L40-24Q"},
            }
        ],
    }
    host = build_host(tmp_path / "host", spec)
    node = SimNode(host.directory, NODE)
    log = (tmp_path / "dp.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    argv = [sys.executable, "-m", "reconciler", "device-plugin", "--plugin-dir", str(plugin_dir)]
    proc = subprocess.Popen(
        [*argv, "--rescan-interval", str(RESCAN_S), *node.flags],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        l40_24q = "nvidia.com/NVIDIA_L40-24Q"
        kubelet.wait_for(
            lambda: proc.poll() is None and kubelet.allocatable_all() == {l40_24q: 2},
            timeout=STARTUP_S,
            what="the two L40-24Q advertised by name",
        )
        assert set(kubelet.devices(l40_24q)) == {
            DeviceState("0000:08:00.4", HEALTHY),
            DeviceState("0000:08:00.5", HEALTHY),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        log.close()
