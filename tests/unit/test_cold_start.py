"""What a cold ``vgpuctl plan`` imports: nothing it does not use. Each module below cost a
measurable share of its start (``just bench``, ``cold_plan_over_import_yaml``); this keeps them
out without timing anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.simnode import REPO, make_sim

#: Modules a plan on a (simulated) host has no use for, with what pulled them in before.
NOT_IMPORTED = {
    "logging": "the watch and device-plugin commands, imported to build the parser",
    "uuid": "the vGPU UUID namespace (uuid imports platform, which compiles regexes)",
    "platform": "uuid",
    "socket": "the default node name (os.uname() says the same)",
    "reconciler.sim.state": "the simulated hold probe, which needs the holders only",
    "reconciler.sim.rules": "reconciler.sim.state",
    "reconciler.plan.fleet": "planning many nodes in one batch (plan --observed cluster)",
}

_RUN = (
    "import sys\n"
    "from reconciler.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def test_a_cold_plan_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    sim = make_sim(tmp_path / "host", ["A2"])
    desired = tmp_path / "d.yaml"
    desired.write_text(
        "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\n"
        "metadata: {name: d}\nspec:\n  nodes:\n"
        f"    {sim.node}:\n      gpus:\n"
        '        - address: "0000:08:00.0"\n          sriov: enabled\n'
        "          profiles: {A2-4Q: 2}\n"
    )
    sim.ok("apply", desired, "--yes")  # VFs and two vGPUs: the scan and the hold probe work
    desired.write_text(desired.read_text().replace("{A2-4Q: 2}", "{A2-4Q: 3}"))
    res = subprocess.run(
        [sys.executable, "-c", _RUN, "plan", str(desired), "--no-color", *sim.flags],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Plan: 1 to create, 0 to change, 0 to remove, 0 blocked." in res.stdout
    imported = set(res.stderr.split())
    assert "reconciler.plan" in imported  # the list is what it claims to be
    assert {m: why for m, why in NOT_IMPORTED.items() if m in imported} == {}
