"""Nothing in the directory vgpuctl runs from becomes code or a program (issue 28, item 1).

Operators run ``vgpuctl apply`` as root from the root of a GitOps checkout, which others write.
The sysfs writer used to start as ``python -m reconciler.cli.sysfs_writer``: ``-m`` puts the
current directory first on ``sys.path``, so a ``reconciler/__init__.py`` committed to the
checkout ran as root at the first sysfs write, and the apply still converged. Likewise a program
named without a path (``--sriov-manage sriov-manage``) was looked up in ``PATH`` as the kernel's
``execvp`` does, where an empty entry means the current directory.

These tests run vgpuctl as a user runs it: its wheel installed by pip, the ``vgpuctl`` script pip
wrote, started from a checkout holding the planted files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.simnode import NODE, SEED, make_sim

#: The planted package: it records who imported it, then lets the import go on from the real
#: vgpuctl (as an attacker would, so nothing looks wrong).
PLANTED_INIT = """\
import os, sys
with open({marker!r}, "a", encoding="utf-8") as f:
    f.write(f"uid={{os.getuid()}} argv={{sys.argv!r}}\\n")
__path__ = [p for p in ({real!r},)] + __path__
"""

#: A planted program: it records that it ran.
PLANTED_PROGRAM = """\
#!/bin/sh
echo "ran as $(id -u): $0 $*" >> {marker}
exit 1
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, vgpuctl_wheel: Path) -> Path:
    """vgpuctl's wheel installed by pip into a directory of its own: ``DIR/bin/vgpuctl`` is the
    script pip writes for the ``vgpuctl`` entry point, ``DIR`` holds the package."""
    target = tmp_path_factory.mktemp("installed")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-index", "--target", str(target), str(vgpuctl_wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert (target / "bin" / "vgpuctl").is_file()
    return target


def run_installed(
    installed: Path, *args: str | Path, cwd: Path, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``vgpuctl ARGS`` through pip's script, from ``cwd``, the package found on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env["PYTHONPATH"] = str(installed)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [str(installed / "bin" / "vgpuctl"), *map(str, args)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False,
    )  # fmt: skip


def vgpus(installed: Path, flags: list[str], cwd: Path) -> dict[str, str]:
    res = run_installed(installed, "status", "-o", "json", *flags, cwd=cwd)
    assert res.returncode == 0, res.stderr
    inventory = json.loads(res.stdout)
    return {
        vf["address"]: vf["vgpu"]["type"]
        for gpu in inventory["gpus"]
        for vf in gpu["vfs"]
        if vf["vgpu"]
    }


def test_a_package_planted_in_the_working_directory_is_never_imported(
    tmp_path: Path, installed: Path
) -> None:
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    checkout = tmp_path / "checkout"
    planted = checkout / "reconciler"
    planted.mkdir(parents=True)
    marker = tmp_path / "imported-from-checkout"
    (planted / "__init__.py").write_text(
        PLANTED_INIT.format(marker=str(marker), real=str(installed / "reconciler"))
    )
    (checkout / "desired-state").mkdir()
    desired = checkout / "desired-state" / f"{NODE}.yaml"
    desired.write_text(SEED.read_text())

    # As the transcript: apply run from the checkout's root, every sysfs write made.
    res = run_installed(
        installed, "apply", "desired-state/" + desired.name, "--yes", *node.flags, cwd=checkout
    )
    assert not marker.exists(), f"the planted package ran:\n{marker.read_text()}"
    assert res.returncode == 0, res.stdout + res.stderr
    assert vgpus(installed, node.flags, checkout) == {
        "0000:08:00.4": "NVIDIA A2-4A",
        "0000:08:00.5": "NVIDIA A2-4Q",
        "0000:08:00.6": "NVIDIA A2-4A",
        "0000:08:00.7": "NVIDIA A2-4Q",
    }


def test_a_program_is_never_looked_up_in_the_working_directory(
    tmp_path: Path, installed: Path
) -> None:
    """``--sriov-manage sriov-manage`` with an empty entry in ``PATH`` (the current directory,
    to ``execvp``): a ``sriov-manage`` in the checkout must not run."""
    node = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    marker = tmp_path / "program-ran"
    program = checkout / "sriov-manage"
    program.write_text(PLANTED_PROGRAM.format(marker=marker))
    program.chmod(0o755)
    flags = ["--sysfs-root", str(node.dir / "sys"), "--sriov-manage", "sriov-manage"]
    flags += ["--node", NODE]
    path = ":" + os.environ.get("PATH", os.defpath)  # leading empty entry: "."
    res = run_installed(installed, "apply", SEED, "--yes", *flags, cwd=checkout, path=path)
    assert not marker.exists(), marker.read_text()
    assert res.returncode != 0
    assert "sriov-manage not found on PATH" in res.stdout + res.stderr
    assert "Traceback" not in res.stderr
