"""Device-plugin sockets are the kubelet's alone, whatever the umask vgpuctl runs with.

A plugin socket takes the mode ``bind()`` gives it: 0777 minus the process umask. Started with
umask 0 (a container runtime or service manager can hand any umask down), the sockets were
0777: any local user, or any process that can traverse the directory, could connect and call
``Allocate`` and ``ListAndWatch``. ``vgpuctl device-plugin`` runs here as a user runs it, with
umask 0, against the fake kubelet (which dials every plugin back over real gRPC).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.sim import build_host
from tests.doubles.fake_kubelet import FakeKubelet, make_plugin_dir, remove_plugin_dir
from tests.simnode import A2_4A, A2_4Q, NODE, REPO, SEED_SPEC, SOCKETS, SimNode

STARTUP_S = 15.0
NOBODY = 65534


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
def device_plugin_umask_0(plugin_dir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    host = build_host(tmp_path / "host", SEED_SPEC)
    node = SimNode(host.directory, NODE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env.pop("NODE_NAME", None)
    with (tmp_path / "dp.log").open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler",
                "device-plugin",
                "--plugin-dir",
                str(plugin_dir),
                "--rescan-interval",
                "0.2",
                *node.flags,
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            umask=0,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def modes(plugin_dir: Path) -> dict[str, int]:
    return {name: stat.S_IMODE((plugin_dir / name).lstat().st_mode) for name in SOCKETS}


def connect_as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    """Connect to ``path`` from a process that dropped root for ``nobody``."""
    script = textwrap.dedent(
        f"""
        import os, socket, sys
        os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
        try:
            socket.socket(socket.AF_UNIX).connect({str(path)!r})
        except OSError as exc:
            sys.exit(f"refused: {{exc.strerror}}")
        print("connected")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )


def test_plugin_sockets_are_0600_with_umask_0_and_the_kubelet_still_connects(
    kubelet: FakeKubelet, device_plugin_umask_0: subprocess.Popen[str], plugin_dir: Path
) -> None:
    # The fake kubelet dials each plugin back on the socket it registered, as the kubelet does.
    kubelet.wait_for(
        lambda: kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2},
        timeout=STARTUP_S,
        what="both profiles advertised to the kubelet",
    )
    assert device_plugin_umask_0.poll() is None
    assert modes(plugin_dir) == dict.fromkeys(SOCKETS, 0o600)
    assert all((plugin_dir / name).lstat().st_uid == os.getuid() for name in SOCKETS)
    # Nothing else is left in the kubelet's directory (no staging directory or socket).
    assert sorted(os.listdir(plugin_dir)) == sorted([*SOCKETS, "kubelet.sock"])

    # A kubelet restart deletes every socket: the plugins serve again, 0600 again.
    kubelet.restart()
    kubelet.wait_for(
        lambda: kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2},
        timeout=STARTUP_S,
        what="both profiles advertised again after a kubelet restart",
    )
    assert modes(plugin_dir) == dict.fromkeys(SOCKETS, 0o600)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_user_cannot_connect_to_a_plugin_socket_even_through_an_open_directory(
    kubelet: FakeKubelet, device_plugin_umask_0: subprocess.Popen[str], plugin_dir: Path
) -> None:
    kubelet.wait_for(
        lambda: kubelet.allocatable_all() == {A2_4A: 2, A2_4Q: 2},
        timeout=STARTUP_S,
        what="both profiles advertised to the kubelet",
    )
    plugin_dir.chmod(0o755)  # a directory others may traverse: the socket itself must refuse
    for name in SOCKETS:
        result = connect_as_nobody(plugin_dir / name)
        assert result.returncode != 0, result.stdout
        assert "refused: Permission denied" in result.stderr
    # Root (the kubelet) still can: the fake kubelet's streams are up.
    assert kubelet.streaming(A2_4A)
    assert kubelet.streaming(A2_4Q)
