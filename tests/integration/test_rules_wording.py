"""One sentence per broken driver rule, whichever command finds it (issue 11 item 4).

Each desired-state file below breaks one of the NVIDIA driver's placement rules (docs/domain.md §4).
``vgpuctl validate`` judges it against the catalogue's offer, ``vgpuctl plan`` against the
driver's, read from a simulated host's sysfs; both must print the sentence written here by hand,
at the entry's ``file:line:column``.

``plan`` also reads the file through the same loader as ``validate``, so on a GPU the catalogue
knows the rule may be found there first; the cases on a GPU the catalogue does not know (a model
built from a catalogue of this test's own) are found by the planner alone, against the types its
driver lists, and must use the same sentences.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from reconciler.catalog import Catalog, PciId, default_catalog
from reconciler.sim import build_host
from tests.simnode import NODE, SimNode, run_vgpuctl

HEADER = f"""apiVersion: vgpu.reconciler.dev/v1alpha1
kind: VGPUDesiredState
metadata: {{name: t}}
spec:
  nodes:
    {NODE}:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
"""  # the GPU's entries start on line 10, so its first VF or profile is on line 11


def _host(directory: Path, model: str, catalog: Catalog | None = None) -> SimNode:
    spec = {"gpus": [{"model": model, "address": "0000:08:00.0", "sriov": "enabled"}]}
    build_host(directory, spec, catalog=catalog)
    return SimNode(directory)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "desired.yaml"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def _problems(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" not in res.stdout + res.stderr
    return res.stderr


def _both(node: SimNode, path: Path) -> tuple[str, str]:
    """What ``validate`` and ``plan`` say of ``path``: both must refuse it."""
    return _problems(run_vgpuctl("validate", path)), _problems(node.run("plan", path))


# A catalogue-known GPU: (host model, desired entries, where and what validate and plan say).
KNOWN = {
    "equal-size": (
        "A2",
        "          vgpus:\n            0: A2-4A\n            1: A2-2Q\n",
        "12:13: mixed framebuffer sizes on GPU 0000:08:00.0: 'NVIDIA A2-2Q' (2 GB) and "
        "'NVIDIA A2-4A' (4 GB, line 11); time-sliced vGPUs on one GPU share one size "
        "(equal-size mode)",
    ),
    "per-size maximum (4A and 4Q count together)": (
        "A2",
        "          profiles:\n            A2-4Q: 3\n            A2-4A: 2\n",
        "12:13: 5 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA A2-4A' allows at most 4 per "
        "NVIDIA A2",
    ),
    "per-size maximum, first VF over the limit": (
        "A2",
        "          vgpus:\n"
        + "".join(f'            "0000:08:00.{4 + i}": A2-8Q\n' for i in range(3)),
        "13:13: 3 vGPUs of 8 GB on GPU 0000:08:00.0, but 'NVIDIA A2-8Q' allows at most 2 per "
        "NVIDIA A2; first over the limit: VF 0000:08:00.6",
    ),
    "per-size maximum, VFs by index": (
        # Named by index, the VF is named by its address, as the planner resolves it.
        "A2",
        "          vgpus:\n            0: A2-8Q\n            1: A2-8Q\n            2: A2-8Q\n",
        "13:13: 3 vGPUs of 8 GB on GPU 0000:08:00.0, but 'NVIDIA A2-8Q' allows at most 2 per "
        "NVIDIA A2; first over the limit: VF 0000:08:00.6",
    ),
    "one vGPU per VF": (
        # A2-3Q: a name the catalogue does not list (no maximum known), 3 GB; 17 > 16 VFs.
        "A2",
        "          profiles:\n            A2-3Q: 17\n",
        "11:13: 17 vGPUs requested on GPU 0000:08:00.0, but NVIDIA A2 has 16 VFs (one vGPU per VF)",
    ),
    "a VF named twice": (
        "A2",
        '          vgpus:\n            "0000:08:00.4": A2-4Q\n            0: A2-4Q\n',
        "12:13: VF 0000:08:00.4 of GPU 0000:08:00.0 is named twice: as index 0 (line 12) and "
        "by its address (line 11) (one vGPU per VF)",
    ),
    "a VF index beyond the VFs": (
        "A2",
        "          vgpus:\n            16: A2-4Q\n",
        "11:13: VF index 16 is out of range for GPU 0000:08:00.0: NVIDIA A2 has 16 VFs "
        "(indexes 0..15)",
    ),
    "a profile of another model": (
        "A2",
        "          model: NVIDIA A2\n          vgpus:\n            0: L4-4Q\n",
        "12:13: VF 0000:08:00.4: GPU 0000:08:00.0 (NVIDIA A2) does not offer 'NVIDIA L4-4Q' "
        "(a profile of NVIDIA L4); offered: NVIDIA A2-1B, -2B, -1Q, -2Q, -4Q, -8Q, -16Q, -1A, "
        "-2A, -4A, -8A, -16A, -4C, -8C, -16C",
    ),
    "MIG-backed next to time-sliced": (
        "A100-40GB",
        "          profiles:\n            A100-5C: 1\n            A100-1-10C: 1\n",
        "12:13: MIG-backed and time-sliced profiles on GPU 0000:08:00.0: 'GRID A100-1-10C' and "
        "'GRID A100-5C' (line 11); a GPU in MIG mode hosts MIG-backed vGPUs only",
    ),
    "MIG-backed maximum (per profile)": (
        "A100-40GB",
        "          profiles:\n            A100-1-10C: 5\n",
        "11:13: 5 vGPUs of 'GRID A100-1-10C' on GPU 0000:08:00.0, but it allows at most 4 per "
        "NVIDIA A100 40GB",
    ),
}


@pytest.mark.parametrize("rule", list(KNOWN))
def test_validate_and_plan_say_the_same_sentence(tmp_path: Path, rule: str) -> None:
    model, body, sentence = KNOWN[rule]
    path = _write(tmp_path, body)
    validate, plan = _both(_host(tmp_path / "host", model), path)
    assert f"{path}:{sentence}" in validate, validate
    assert f"{path}:{sentence}" in plan, plan


def _x2() -> Catalog:
    """A GPU like an A2 that the shipped catalogue does not know: 'NVIDIA X2', PCI id 10de:1eef,
    types 'NVIDIA X2-…' (the simulator copies them into the host; vgpuctl sees only sysfs)."""
    a2 = default_catalog().model("A2")
    assert a2 is not None
    x2 = dataclasses.replace(
        a2,
        name="NVIDIA X2",
        short="X2",
        aliases=(),
        pci_ids=(PciId("10de", "1eef", "10de", "0001"),),
        profiles=tuple(
            dataclasses.replace(p, name=p.name.replace("NVIDIA A2-", "NVIDIA X2-"))
            for p in a2.profiles
        ),
    )
    return Catalog((x2,))


# A GPU the catalogue does not know: (desired entries, plan's sentence). validate cannot judge
# these (it accepts the names, with a note) and must say nothing of the rule.
UNKNOWN = {
    "per-size maximum": (
        "          profiles:\n            X2-4Q: 3\n            X2-4A: 2\n",
        "12:13: 5 vGPUs of 4 GB on GPU 0000:08:00.0, but 'NVIDIA X2-4A' allows at most 4 per GPU",
    ),
    "per-size maximum, first VF over the limit": (
        "          vgpus:\n"
        + "".join(f'            "0000:08:00.{4 + i}": X2-8Q\n' for i in range(3)),
        "13:13: 3 vGPUs of 8 GB on GPU 0000:08:00.0, but 'NVIDIA X2-8Q' allows at most 2 per "
        "GPU; first over the limit: VF 0000:08:00.6",
    ),
    "per-size maximum, VFs by index": (
        "          vgpus:\n            0: X2-8Q\n            1: X2-8Q\n            2: X2-8Q\n",
        "13:13: 3 vGPUs of 8 GB on GPU 0000:08:00.0, but 'NVIDIA X2-8Q' allows at most 2 per "
        "GPU; first over the limit: VF 0000:08:00.6",
    ),
    "a VF named twice": (
        '          vgpus:\n            "0000:08:00.4": X2-4Q\n            0: X2-4Q\n',
        "12:13: VF 0000:08:00.4 of GPU 0000:08:00.0 is named twice: as index 0 (line 12) and "
        "by its address (line 11) (one vGPU per VF)",
    ),
    "a VF index beyond the VFs": (
        "          vgpus:\n            16: X2-4Q\n",
        "11:13: VF index 16 is out of range for GPU 0000:08:00.0: it has 16 VFs (indexes 0..15)",
    ),
    "a type the driver does not list": (
        "          vgpus:\n            0: X2-3Q\n",
        "11:13: VF 0000:08:00.4: GPU 0000:08:00.0 does not offer 'NVIDIA X2-3Q'; offered: "
        "NVIDIA X2-1B, -2B, -1Q, -2Q, -4Q, -8Q, -16Q, -1A, -2A, -4A, -8A, -16A, -4C, -8C, -16C",
    ),
}


@pytest.mark.parametrize("rule", list(UNKNOWN))
def test_plan_judges_the_drivers_offer_with_the_same_sentences(tmp_path: Path, rule: str) -> None:
    body, sentence = UNKNOWN[rule]
    path = _write(tmp_path, body)
    node = _host(tmp_path / "host", "X2", _x2())
    checked = run_vgpuctl("validate", path)
    assert checked.returncode == 0, checked.stderr
    assert "the catalogue does not know" in checked.stderr
    plan = _problems(node.run("plan", path))
    assert f"{path}:{sentence}" in plan, plan
