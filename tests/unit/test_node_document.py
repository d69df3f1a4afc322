"""The desired state a saved plan embeds (``cli/documents.node_document``): loaded back, it is
the node it was written from, every field that decides a plan included (a lost ``mode`` made a
saved mixed-size plan refuse to apply)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.cli.documents import node_document, node_from_document
from reconciler.model import DesiredGpu, DesiredNode, VgpuMode
from tests.gpus import A2, A2_B, CATALOG, want


def _fields(gpu: DesiredGpu) -> tuple[object, ...]:
    return (gpu.address, gpu.sriov, gpu.model, gpu.vgpus, gpu.profiles, gpu.mode)


@pytest.mark.parametrize("mode", [VgpuMode.EQUAL_SIZE, VgpuMode.MIXED_SIZE])
def test_a_node_survives_its_document(mode: VgpuMode) -> None:
    layout = {0: "A2-8Q", 1: "A2-4Q"} if mode is VgpuMode.MIXED_SIZE else {0: "A2-4Q", 1: "A2-4Q"}
    node = DesiredNode(
        "node-1",
        (
            replace(want(A2, layout), mode=mode, model="NVIDIA A2"),
            replace(want(A2_B, profiles={"A2-4Q": 2}), mode=mode),
        ),
    )
    loaded = node_from_document(node_document(node), CATALOG, "plan.json#desiredState")
    assert [_fields(g) for g in loaded.gpus] == [_fields(g) for g in node.gpus]
    written = node_document(node)["spec"]["nodes"]["node-1"]["gpus"]
    # The default is left out, as a person writes it; mixed-size is always written.
    assert [g.get("mode") for g in written] == [
        None if mode is VgpuMode.EQUAL_SIZE else "mixed-size"
    ] * 2


@pytest.mark.parametrize("max_parallel", [None, 3])
def test_the_fleet_budget_survives_the_document(max_parallel: int | None) -> None:
    """``spec.rollout.maxParallel``, the node agents' fleet budget, goes with the node: a saved
    plan applied later takes a rollout slot as the files would have it do."""
    node = DesiredNode("node-1", (want(A2, {0: "A2-4Q"}),), max_parallel=max_parallel)
    document = node_document(node)
    assert document["spec"].get("rollout") == (
        None if max_parallel is None else {"maxParallel": max_parallel}
    )
    loaded = node_from_document(document, CATALOG, "plan.json#desiredState")
    assert loaded.max_parallel == max_parallel
