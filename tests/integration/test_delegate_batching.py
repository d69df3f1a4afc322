"""Delegate mode within a node (issue 33, item 3): the enables of one GPU's VFs go out together
and are waited for together.

The rule, from pcidevices' code (bdd8025) as the double follows it (tests/doubles/pcidevices.py):
the webhook admits a VGPUDevice's enable against that object's own old
``status.availableTypes`` (pkg/webhook/vgpu.go ``Update``, ``validateVGPUProfiles``), and the
controller carries each object's spec out on its own (pkg/controller/gpudevice/
vgpu_controller.go ``OnVGPUChange`` → ``enableVGPU``): nothing orders one VF's enable after
another's. So the seed's four enables are written before any of them is waited for: in the
request log, no VF written is read again before the last of the four patches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.emulator import ApiServerEmulator
from tests.harvester_node import NODE, SEED, VFS, Cluster, harvester_node

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
