"""``vgpuctl validate`` as CI runs it (issue 34, item 2): a typo of an A2 profile fails the
push-time check with the name meant, ``--lenient`` lets a newer driver's name through with a
note, and ``validate``/``plan`` take a directory of desired-state files."""

from __future__ import annotations

from pathlib import Path

from tests.simnode import REPO, SEED, run_vgpuctl

TYPO = (
    "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"
    "spec:\n  nodes:\n    n1:\n      gpus:\n"
    '        - address: "0000:08:00.0"\n          model: NVIDIA A2\n          sriov: enabled\n'
    '          vgpus:\n            "0000:08:00.4": NVIDIA A2-4QQ\n'
)


def test_validate_fails_on_a_typo_of_an_a2_profile(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    res = run_vgpuctl("validate", path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout == ""
    assert (
        f"{path}:12:13: unknown profile 'NVIDIA A2-4QQ': not one of NVIDIA A2's, which the "
        "catalogue lists in full; did you mean 'NVIDIA A2-4Q'?"
    ) in res.stderr
    assert "Traceback" not in res.stderr


def test_lenient_accepts_it_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    res = run_vgpuctl("validate", "--lenient", path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == f"{path}: valid (1 node, 1 GPU, 1 vGPU)\n"
    assert "note: the catalogue does not know 1 name" in res.stderr
    assert f"{path}:12:13: 'NVIDIA A2-4QQ'" in res.stderr


def test_validate_takes_a_directory(tmp_path: Path) -> None:
    (tmp_path / "seed.yaml").write_text(SEED.read_text())
    (tmp_path / "notes.txt").write_text("not a desired-state file")
    res = run_vgpuctl("validate", tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == f"{tmp_path / 'seed.yaml'}: valid (1 node, 1 GPU, 4 vGPUs)\n"


def test_plan_takes_a_directory(tmp_path: Path) -> None:
    """The seed's directory planned on a simulated A2 node: the same plan as its file."""
    sim = tmp_path / "sim"
    assert run_vgpuctl("sim", "init", sim, "--gpu", "A2@0000:08:00.0").returncode == 0
    desired = tmp_path / "desired"
    desired.mkdir()
    (desired / "seed.yaml").write_text(SEED.read_text())
    host = ("--sysfs-root", sim / "sys", "--sriov-manage", sim / "bin" / "sriov-manage")
    env = {"VGPUCTL_NODE": "harvester-kgd9c"}
    by_dir = run_vgpuctl("plan", desired, *host, env=env)
    by_file = run_vgpuctl("plan", desired / "seed.yaml", *host, env=env)
    assert by_dir.returncode == 0, by_dir.stdout + by_dir.stderr
    assert by_dir.stdout == by_file.stdout
    assert "+ sriov 0000:08:00.0  enable 16 VFs" in by_dir.stdout


def test_the_shipped_examples_pass_strict_validation() -> None:
    res = run_vgpuctl("validate", REPO / "desired-state", REPO / "desired-state" / "examples")
    assert res.returncode == 0, res.stdout + res.stderr
