"""Run ``vgpuctl`` in a subprocess against a simulated host built in a temporary directory.

Shared by the integration, security and reliability tests (fixtures: ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
NODE = "harvester-kgd9c"

#: The seed's host with its four vGPUs, as ``reconciler.sim.build_host`` takes it, and what the
#: device plugins advertise for it: two resources, one socket each.
A2_4A = "nvidia.com/NVIDIA_A2-4A"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
SOCKETS = ("vgpuctl-nvidia.com_NVIDIA_A2-4A.sock", "vgpuctl-nvidia.com_NVIDIA_A2-4Q.sock")
SEED_SPEC = {
    "gpus": [
        {
            "model": "A2",
            "address": "0000:08:00.0",
            "vgpus": {
                "0000:08:00.4": "NVIDIA A2-4A",
                "0000:08:00.5": "NVIDIA A2-4Q",
                "0000:08:00.6": "NVIDIA A2-4A",
                "0000:08:00.7": "NVIDIA A2-4Q",
            },
        }
    ]
}


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
