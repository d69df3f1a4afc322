"""The Containerfile (issue 15 item 6): its first stage's wheel, installed as its second stage
installs it (a fresh virtual environment, from the wheel directory alone, no index), gives the
`vgpuctl` entry point, which runs the command the image runs by default; and that command is
the DaemonSet's. (No image is built here: this machine has no container runtime. What the
stages do is done directly, with the same pip commands.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import yaml

from tests.containerfile import instructions
from tests.simnode import REPO


def test_two_stages_the_second_from_the_first_wheels_only() -> None:
    steps = instructions()
    froms = [rest for word, rest in steps if word == "FROM"]
    # One base, pinned by digest (tests/security/test_image_supply_chain.py).
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    runs = [rest for word, rest in steps if word == "RUN"]
    assert (
        "pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels ." in runs[0]
    )
    assert "--dest /wheels -r requirements.lock" in runs[0]
    assert "--no-index --find-links /wheels --require-hashes" in runs[1]
    assert "--no-index --no-deps /wheels/vgpuctl-*.whl" in runs[1]
    assert "from=build,source=/wheels" in runs[1]  # bound for the install, never copied in


def test_the_default_command_is_the_daemonsets() -> None:
    steps = dict(instructions())
    daemonset = next(
        d for d in yaml.safe_load_all((REPO / "deploy" / "daemonset.yaml").read_text()) if d
    )
    (agent,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert json.loads(steps["ENTRYPOINT"]) == agent["command"]
    assert json.loads(steps["CMD"]) == agent["args"]


def test_the_wheel_installs_alone_and_its_entry_point_runs(
    tmp_path: Path, vgpuctl_wheel: Path
) -> None:
    # The first stage's command made vgpuctl's own wheel (tests/conftest.py).
    wheel = vgpuctl_wheel
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # vgpuctl's dependencies from this interpreter's environment (the image installs them from
    # the first stage's wheels), after the venv's own site-packages, where the wheel goes.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site) / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-cache-dir",
         "--no-index", "--no-deps", "--quiet", str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    vgpuctl = env_dir / "bin" / "vgpuctl"
    # As in the image: nothing but the installed package (no PYTHONPATH pointing here).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("VGPUCTL")}
    version = subprocess.run(
        [str(vgpuctl), "--version"], capture_output=True, text=True, check=False, env=env
    )
    assert version.returncode == 0, version.stderr
    assert re.fullmatch(r"vgpuctl \d+\.\d+\.\d+\n", version.stdout)
    steps = dict(instructions())
    argv = json.loads(steps["CMD"])
    helped = subprocess.run(
        [str(vgpuctl), argv[0], "--help"], capture_output=True, text=True, check=False, env=env
    )
    assert helped.returncode == 0 and "--delegate" in helped.stdout
    # It is the installed copy that runs, not this checkout.
    where = subprocess.run(
        [str(python), "-c", "import reconciler; print(reconciler.__file__)"],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=env,
    ).stdout  # fmt: skip
    assert str(env_dir) in where
