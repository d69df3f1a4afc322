"""What a cold ``vgpuctl plan`` imports: nothing it does not use. Each module below cost a
measurable share of its start (``just bench``, ``cold_plan_over_import_yaml``); this keeps them
out without timing anything."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import build_parser, command_of
from reconciler.model import UsageError
from tests.simnode import REPO, SimNode, make_sim

#: Modules a plan on a (simulated) host has no use for, with what pulled them in before.
NOT_IMPORTED = {
    "logging": "the watch and device-plugin commands, imported to build the parser",
    "uuid": "the vGPU UUID namespace (uuid imports platform, which compiles regexes)",
    "platform": "uuid",
    "socket": "the default node name (os.uname() says the same)",
    "reconciler.sim.state": "the simulated hold probe, which needs the holders only",
    "reconciler.sim.rules": "reconciler.sim.state",
    "reconciler.plan.fleet": "planning many nodes in one batch (plan --observed cluster)",
    # The other commands' modules, imported to build the parser of every command: a run builds
    # its own command's parser only (reconciler.cli.main.build_parser).
    "reconciler.cli.watch_command": "the parser of every command",
    "reconciler.cli.capacity_command": "the parser of every command",
    "reconciler.cli.lint_vm": "the parser of every command",
    "reconciler.cli.deviceplugin_command": "the parser of every command",
    "reconciler.cli.sim_commands": "the parser of every command",
    "signal": "reconciler.cli.deviceplugin_command",
    "reconciler.observe.cluster": "reconciler.observe, which imported every observer up front",
    "reconciler.model.clusterapi": "reconciler.engine.ports (an annotation) and observe.cluster",
    "dataclasses": "every record (reconciler.model.record collects the fields itself)",
    "inspect": "dataclasses",
    "ast": "inspect",
    "shutil": "argparse's help formatter (made for every argument), for the terminal's width",
    "bz2": "shutil",
    "lzma": "shutil",
    "unicodedata": "reconciler.desired.ascii_names, which names a character no ASCII name has",
    "reconciler.plan.cluster": "reconciler.plan, which imported the cluster half up front",
    "reconciler.plan.render": "reconciler.plan.cluster",
    "reconciler.plan.nodestate": "reconciler.plan.planner",
    "reconciler.model.nodestate": "reconciler.plan.nodestate",
    "reconciler.model.plan_json": "the saved-plan document, made when no --out asked for it",
    "reconciler.cli.documents": "reconciler.model.plan_json",
    "reconciler.observe.vgpumode": "reconciler.engine.observe, for a mode only mixed size asks",
}

_RUN = (
    "import sys\n"
    "from reconciler.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _two_vgpus(sim: SimNode, path: Path) -> Path:
    """A desired state of two A2-4Q vGPUs on the simulated A2, written at ``path``."""
    path.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: d}\nspec:\n  nodes:\n"
        f"    {sim.node}:\n      gpus:\n"
        '        - address: "0000:08:00.0"\n          sriov: enabled\n'
        "          profiles: {A2-4Q: 2}\n"
    )
    return path


def _imported(*argv: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a fresh interpreter holds after running ``argv`` (``python -c …``)."""
    res = subprocess.run(
        [sys.executable, *argv],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return set(res.stderr.split()), res


def test_a_cold_plan_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2"])
    desired = _two_vgpus(sim, tmp_path / "d.yaml")
    sim.ok("apply", desired, "--yes")  # VFs and two vGPUs: the scan and the hold probe work
    desired.write_text(desired.read_text().replace("{A2-4Q: 2}", "{A2-4Q: 3}"))
    imported, res = _imported("-c", _RUN, "plan", str(desired), "--no-color", *sim.flags)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Plan: 1 to create, 0 to change, 0 to remove, 0 blocked." in res.stdout
    assert "reconciler.plan" in imported  # the list is what it claims to be
    # What the interpreter imports before any code of ours runs is not the plan's doing: a
    # site-packages ``.pth`` file may import certifi, and with it tempfile and shutil (CI's
    # interpreter does). Those are the same cost for ``import yaml``, the bench's baseline.
    at_start, _ = _imported("-c", "import sys; print('\\n'.join(sys.modules), file=sys.stderr)")
    assert "sys" in at_start and "reconciler.plan" not in at_start
    assert {m: why for m, why in NOT_IMPORTED.items() if m in imported - at_start} == {}


#: Command lines the parser of one command must parse as the parser of every command does:
#: global options before and after the command, abbreviated, with ``=``; help, version, errors.
COMMAND_LINES = [
    [],
    ["plan"],
    ["plan", "f.yaml"],
    ["--node", "plan", "apply", "f.yaml"],
    ["--nod", "plan", "apply", "f.yaml"],
    ["--node=plan", "apply", "f.yaml"],
    ["--sysfs-root", "/x", "plan", "f.yaml", "--node", "n", "-o", "json"],
    ["--unsafe", "plan", "f.yaml"],
    ["--state-dir", "sim", "sim", "init", "d", "--gpu", "A2"],
    ["--node", "--node", "plan", "f.yaml"],
    ["-h"],
    ["--help"],
    ["--version"],
    ["plan", "-h"],
    ["plan", "f.yaml", "--he"],
    ["plan", "f.yaml", "--vers"],
    ["sim", "init", "-h"],
    ["sim"],
    ["plna", "f.yaml"],
    ["--", "plan", "f.yaml"],
    ["plan", "--", "f.yaml"],
    ["plan", "f.yaml", "--no"],
    ["--no", "plan", "f.yaml"],
    ["--kube", "x", "plan", "f.yaml"],
    ["--output", "json", "plan", "f.yaml"],
    ["-o", "json", "plan", "f.yaml"],
    ["--node"],
    ["plan", "f.yaml", "--node"],
    ["validate", "-"],
    ["-", "plan"],
    ["apply", "f.yaml", "--yes"],
    ["status"],
    ["export", "--help"],
    ["assert", "f.yaml"],
    ["doctor"],
    ["watch", "f.yaml", "--interval", "3"],
    ["capacity"],
    ["lint-vm", "vm.yaml"],
    ["device-plugin", "--help"],
    ["sim", "hold", "d", "x"],
    ["import", "vgpu-device-manager", "c.yaml", "--gpu-address", "0=0000:08:00.0"],
]


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[Any, ...]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            ns = parser.parse_args(argv)
    except UsageError as exc:
        return ("usage error", str(exc))
    except SystemExit as exc:
        return ("exit", exc.code, out.getvalue())
    return ("parsed", vars(ns))


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_the_parser_of_one_command_parses_as_the_parser_of_every_command(argv: list[str]) -> None:
    assert _parsed(build_parser(command_of(argv)), argv) == _parsed(build_parser(), argv)


def test_a_command_line_builds_its_own_command_only() -> None:
    def commands(parser: argparse.ArgumentParser) -> set[str]:
        (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return set(sub.choices)

    every = commands(build_parser())
    for name in every:
        built = commands(build_parser(command_of(["--node", "n", name, "x"])))
        assert name in built
        assert built < every
    assert commands(build_parser(command_of(["plna"]))) == every


def test_a_short_command_runs_without_the_collector_and_gives_it_back(tmp_path: Path) -> None:
    """A cold plan makes no collection while it runs (the collector's passes over what its
    imports made were 3 % of its start); the collector is as it was once main() returns."""
    sim = make_sim(tmp_path / "host", ["A2"])
    desired = _two_vgpus(sim, tmp_path / "d.yaml")
    # The command's own work is what main() dispatches to once the collector is off.
    run = (
        "import gc, sys\n"
        "passes = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and passes.append(1))\n"
        "import reconciler.cli.main as cli\n"
        "inner, during = cli._run, []\n"
        "def counted(*args):\n"
        "    before = len(passes)\n"
        "    try:\n"
        "        return inner(*args)\n"
        "    finally:\n"
        "        during.append(len(passes) - before)\n"
        "cli._run = counted\n"
        "code = cli.main(sys.argv[1:])\n"
        "print(during, gc.isenabled(), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", run, "plan", str(desired), *sim.flags],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr.splitlines()[-1] == "[0] True"
