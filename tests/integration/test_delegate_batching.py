"""Delegate mode within a node (issue 33, item 3): the enables of one GPU's VFs go out together
and are waited for together, and so do the disables of a node's VFs.

The rule, from pcidevices' code (bdd8025) as the double follows it (tests/doubles/pcidevices.py):
the webhook admits a VGPUDevice's enable against that object's own old
``status.availableTypes`` (pkg/webhook/vgpu.go ``Update``, ``validateVGPUProfiles``), and the
controller carries each object's spec out on its own (pkg/controller/gpudevice/
vgpu_controller.go ``OnVGPUChange`` → ``enableVGPU``): nothing orders one VF's enable after
another's. So the seed's four enables are written before any of them is waited for: in the
request log, no VF written is read again before the last of the four patches.

Disables: the webhook judges each VGPUDevice's disable on that object alone
(pkg/webhook/vgpu.go ``Update`` → ``checkVGPUUsage`` of its name) and the controller removes
each VF's vGPU on its own (vgpu_controller.go ``disableVGPU``: ``0`` to that VF's
``nvidia/current_vgpu_type``); so the four disables of the seed's vGPUs are written before any
is waited for. Who uses a VF is still read right before its own write: a VM that takes one
while the others go out keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.emulator import ApiServerEmulator, Request
from tests.harvester_node import NODE, SEED, VFS, Cluster, harvester_node, layout, vm_holds

CRD_SETS = ("harvester",)  # the emu fixture serves Harvester's own CRDs (tests/conftest.py)


@pytest.fixture
def harvester(emu: ApiServerEmulator, tmp_path: Path) -> Iterator[Cluster]:
    with harvester_node(emu, tmp_path) as cluster:
        yield cluster


def _name(vf: str) -> str:
    return f"{NODE}-0000{vf[5:7]}{vf[8:10]}{vf[11]}"


def test_the_seeds_four_enables_are_written_then_waited_for_together(harvester: Cluster) -> None:
    harvester.ok("apply", SEED, "--yes")
    # The simulator's type ids: A2-4A is 751, A2-4Q 746.
    assert harvester.types() == {VFS[0]: "751", VFS[1]: "746", VFS[2]: "751", VFS[3]: "746"}
    log = harvester.emu.requests
    names = [_name(vf) for vf in VFS]
    patches = [
        i
        for i, r in enumerate(log)
        if r.verb == "patch" and r.resource == "vgpudevices" and r.name in names
    ]
    assert [log[i].name for i in patches] == names  # one patch each, in the plan's order
    first, last = patches[0], patches[-1]
    # Between the first VF's patch and the last's, no VF already written is read: no step
    # waited for the controller before the next was written.
    written: set[str] = set()
    for i in range(first, last + 1):
        r = log[i]
        if r.verb == "patch" and r.name in names:
            written.add(str(r.name))
        elif r.verb == "get" and r.resource == "vgpudevices":
            assert r.name not in written, f"{r.name} read at {i}, before the last enable's write"


def _written_then_waited(harvester: Cluster, names: list[str], since: int) -> None:
    """One patch of each of ``names`` after request ``since``, in that order, and between the
    first and the last, no object already patched is read (no step waited in between)."""
    log = harvester.emu.requests[since:]
    patches = [
        i
        for i, r in enumerate(log)
        if r.verb == "patch" and r.resource == "vgpudevices" and r.name in names
    ]
    assert [log[i].name for i in patches] == names
    written: set[str] = set()
    for i in range(patches[0], patches[-1] + 1):
        r = log[i]
        if r.verb == "patch" and r.name in names:
            written.add(str(r.name))
        elif r.verb == "get" and r.resource == "vgpudevices":
            assert r.name not in written, f"{r.name} read at {i}, before the last disable's write"


def test_the_seeds_four_disables_are_written_then_waited_for_together(
    harvester: Cluster, tmp_path: Path
) -> None:
    harvester.ok("apply", SEED, "--yes")
    empty = layout(tmp_path, {})  # SR-IOV stays on, no vGPU
    doc = json.loads(harvester.ok("plan", empty, "-o", "json").stdout)
    (node_plan,) = doc["plans"]
    names = [_name(vf) for vf in VFS]
    assert [(a["kind"], a["target"]) for a in node_plan["actions"]] == [
        ("vgpudevice-disable", n) for n in names
    ]
    since = len(harvester.emu.requests)
    harvester.ok("apply", empty, "--yes")
    assert harvester.types() == {}
    _written_then_waited(harvester, names, since)
    assert "No changes" in harvester.ok("plan", empty).stdout


def test_a_vm_that_takes_a_vf_while_the_disables_go_out_keeps_it(
    harvester: Cluster, tmp_path: Path
) -> None:
    """The third VF's VGPUDevice is taken by a VM when the first disable is written: its own
    check, read right before its write, refuses it; the two written before are waited for and
    done, the fourth is not run (a failure stops the writes), and the VM's vGPU stays."""
    harvester.ok("apply", SEED, "--yes")
    names = [_name(vf) for vf in VFS]
    taken: list[str] = []

    def a_vm_starts(request: Request) -> None:
        if not taken and request.resource == "vgpudevices" and request.name == names[0]:
            taken.append(vm_holds(harvester, VFS[2]))

    harvester.emu.on_before_write(a_vm_starts)
    try:
        res = harvester.run("apply", layout(tmp_path, {}), "--yes")
    finally:
        harvester.emu.on_before_write(None)
    assert taken == [names[2]]
    assert res.returncode == 1, res.stdout + res.stderr
    assert "in use by VM default/win11" in res.stdout + res.stderr
    # The simulator's type ids: A2-4A is 751, A2-4Q 746 (the seed's third VF hosts a 4A).
    assert harvester.types() == {VFS[2]: "751", VFS[3]: "746"}
    patched = [
        r.name
        for r in harvester.emu.requests
        if r.verb == "patch" and r.resource == "vgpudevices" and r.name in names
    ]
    assert patched[-2:] == names[:2]  # the seed's four enables, then two disables
