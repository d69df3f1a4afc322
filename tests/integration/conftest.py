"""Run ``vgpuctl`` in a subprocess against a simulated host built in a temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
NODE = "harvester-kgd9c"


def run_vgpuctl(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m reconciler ARGS`` with a clean environment, no TTY, output captured."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    full_env.pop("NODE_NAME", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=timeout,
        input=stdin,
        check=False,
    )


@dataclass
class SimNode:
    """A simulated host and the flags that drive it."""

    dir: Path
    node: str = NODE

    @property
    def flags(self) -> list[str]:
        return [
            "--sysfs-root",
            str(self.dir / "sys"),
            "--sriov-manage",
            str(self.dir / "bin" / "sriov-manage"),
            "--node",
            self.node,
        ]

    def run(self, *args: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
        return run_vgpuctl(*args, *self.flags, **kw)  # type: ignore[arg-type]

    def ok(self, *args: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
        res = self.run(*args, **kw)
        assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
        return res


def make_sim(directory: Path, gpus: Sequence[str], node: str = NODE) -> SimNode:
    gpu_args = [a for g in gpus for a in ("--gpu", g)]
    res = run_vgpuctl("sim", "init", directory, *gpu_args)
    assert res.returncode == 0, res.stderr
    return SimNode(directory, node)


@pytest.fixture
def a2_node(tmp_path: Path) -> SimNode:
    """The seed's host: one A2 at 0000:08:00.0, SR-IOV off."""
    return make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
