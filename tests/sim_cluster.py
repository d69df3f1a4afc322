"""``vgpuctl sim cluster`` as a user runs it, for the tests that drive it: started as a process
in the foreground (its first line is the export line a user pastes), stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simnode import REPO


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


def start_sim_cluster(directory: Path, *args: str) -> Running:
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


def stop_sim_cluster(running: Running) -> tuple[int, str]:
    running.proc.send_signal(signal.SIGTERM)
    try:
        _, err = running.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        pytest.fail("sim cluster did not stop within 30 s of SIGTERM")
    return running.proc.returncode, err
