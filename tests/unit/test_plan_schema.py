"""schemas/plan.schema.json is the contract of ``vgpuctl plan -o json``: it accepts what
the codec (``plan_to_json``) writes (every golden plan is checked in test_golden.py, every
action kind in test_plan_codec.py) and nothing looser."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reconciler.catalog import default_catalog
from reconciler.model import (
    VGPU,
    DesiredGpu,
    DesiredNode,
    Gpu,
    Interface,
    Inventory,
    PciAddress,
    Vf,
)
from reconciler.model.plan_json import plan_to_json
from reconciler.plan import plan_node

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json").read_text("utf-8")
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _plan() -> dict[str, Any]:
    """A plan with every host kind, a replacement and a blocked entry."""
    a2 = PciAddress.parse("0000:08:00.0")
    l4 = PciAddress.parse("0000:09:00.0")
    held = Gpu(
        a2, "10de", "25b6", total_vfs=16, num_vfs=16, vf_offset=4, interface=Interface.MDEV,
        driver="nvidia",
    )  # fmt: skip
    vfs = tuple(
        Vf(held.predicted_vf_address(i), i, VGPU(f"u-{i}", "NVIDIA A2-4Q", in_use=i == 0))
        if i < 2
        else Vf(held.predicted_vf_address(i), i)
        for i in range(16)
    )
    inventory = Inventory(
        "n",
        (
            replace(held, vfs=vfs, model="NVIDIA A2"),
            Gpu(l4, "10de", "27b8", model="NVIDIA L4", total_vfs=32, vf_offset=2, driver="nvidia"),
        ),
    )
    node = DesiredNode(
        "n",
        (
            DesiredGpu(a2, True, vgpus={1: "NVIDIA A2-4A", 2: "NVIDIA A2-4Q"}),
            DesiredGpu(l4, True, profiles={"NVIDIA L4-6Q": 1}),
        ),
    )
    return plan_to_json(plan_node(node, inventory, catalog=default_catalog()))


def test_a_plan_with_every_host_kind_is_valid() -> None:
    plan = _plan()
    kinds = {a["kind"] for a in plan["actions"]} | {b["kind"] for b in plan["blocked"]}
    assert kinds == {"vgpu-remove", "sriov-enable", "vgpu-create", "device-plugin-refresh"}
    VALIDATOR.validate(plan)


#: The index of the plan's first vgpu-create (after a vgpu-remove and a sriov-enable).
CREATE = 2


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda p: p.pop(key)


def _set(path: tuple[Any, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        target: Any = p
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_drop("applyable"), id="no applyable"),
        pytest.param(_drop("notes"), id="no notes"),
        pytest.param(_set(("extra",), 1), id="unknown field"),
        pytest.param(_set(("formatVersion",), 1), id="format version"),
        pytest.param(_set(("interface",), "pci"), id="interface"),
        pytest.param(_set(("observedFingerprint",), "md5:00"), id="fingerprint"),
        pytest.param(_set(("actions", 0, "seq"), 0), id="seq from 1"),
        pytest.param(_set(("actions", 0, "kind"), "vgpu-destroy"), id="kind"),
        pytest.param(_set(("actions", 0, "target"), "0000:08:00.5 "), id="target address"),
        pytest.param(_set(("actions", CREATE, "uuid"), "not-a-uuid"), id="create uuid"),
        pytest.param(_set(("actions", CREATE, "vfIndex"), "1"), id="vf index type"),
        pytest.param(_set(("actions", CREATE, "phase"), "cluster"), id="phase of the kind"),
        pytest.param(_set(("actions", 0, "colour"), "red"), id="unknown field"),
        pytest.param(_set(("actions", 0, "params"), {}), id="format 1 params"),
        pytest.param(_set(("actions", 0, "reason"), ""), id="empty reason"),
        pytest.param(_set(("blocked", 0, "kind"), "cr-delete"), id="blocked cluster action"),
        pytest.param(_set(("blocked", 0, "seq"), 1), id="blocked has no seq"),
        pytest.param(_set(("noops", 0, "why"), "x"), id="noop field"),
        pytest.param(_set(("summary", "create"), -1), id="negative count"),
    ],
)
def test_the_schema_rejects_what_the_codec_never_writes(
    damage: Callable[[dict[str, Any]], None],
) -> None:
    plan = copy.deepcopy(_plan())
    assert plan["actions"][CREATE]["kind"] == "vgpu-create"
    VALIDATOR.validate(plan)
    damage(plan)
    assert not VALIDATOR.is_valid(plan)


def test_sriov_enable_needs_its_vf_count() -> None:
    plan = _plan()
    enable = next(a for a in plan["actions"] if a["kind"] == "sriov-enable")
    del enable["numVFs"]
    assert not VALIDATOR.is_valid(plan)
