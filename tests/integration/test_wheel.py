"""A non-editable install (a wheel) carries the schemas and the catalogue; it works anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.simnode import SEED


def test_wheel_ships_schemas_and_catalogue(tmp_path: Path, vgpuctl_wheel: Path) -> None:
    wheel = vgpuctl_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    for schema in ("desired-state.schema.json", "plan.schema.json", "inventory.schema.json"):
        assert f"reconciler/_schemas/{schema}" in names
    assert "reconciler/catalog/catalog.json" in names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seed = elsewhere / "seed.yaml"
    seed.write_text(SEED.read_text())
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c",
         "import reconciler; from reconciler.desired import schema_path; "
         "print(reconciler.__file__); print(schema_path('desired-state.schema.json'))"],
        check=True, capture_output=True, text=True, cwd=elsewhere, env=env,
    )  # fmt: skip
    module, schema = probe.stdout.split()
    assert Path(module).is_relative_to(site) and Path(schema).is_relative_to(site)
    res = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", str(seed)],
        capture_output=True, text=True, cwd=elsewhere, env=env, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "valid (1 node, 1 GPU, 4 vGPUs)" in res.stdout


def test_wheel_serves_a_simulated_cluster(tmp_path: Path, vgpuctl_wheel: Path) -> None:
    """``vgpuctl sim cluster`` from the wheel alone: the emulator is in the package, and the CRDs
    it installs come with it (``reconciler/_schemas/crds``), not from a checkout's tests/."""
    names = set(zipfile.ZipFile(vgpuctl_wheel).namelist())
    assert "reconciler/sim/cluster/emulator.py" in names
    assert "reconciler/_schemas/crds/vgpudevices.devices.harvesterhci.io.yaml" in names
    site = tmp_path / "site"
    zipfile.ZipFile(vgpuctl_wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "sim", "cluster", str(tmp_path / "sim"),
         "--nodes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the export line, once it serves
        assert line == f"export VGPUCTL_KUBECONFIG={tmp_path / 'sim' / 'kubeconfig'}\n"
        res = subprocess.run(
            [sys.executable, "-m", "reconciler", "capacity",
             "--kubeconfig", str(tmp_path / "sim" / "kubeconfig")],
            capture_output=True, text=True, cwd=tmp_path, env=env, check=False, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
