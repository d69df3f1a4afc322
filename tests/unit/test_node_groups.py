"""Node groups (``spec.nodeGroups``): which nodes a group selects, which GPUs its entries match,
what a node's own entry replaces, and the errors that name both entries of a conflict.

Expected values are written from the format's rules (README, "Node groups"): names are globs
(any may match), labels must all be present with their values, both parts must hold when both
are given; a node's own entry replaces every group; a GPU entry's criteria (model, device ID,
address) must all hold; entries that agree on a GPU are one, entries that disagree fail the
node's plan only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.desired import load_desired
from reconciler.model import (
    AbsentError,
    Desired,
    DesiredGpu,
    Inventory,
    PciAddress,
    PlanError,
    UsageError,
    VgpuMode,
)
from reconciler.plan import plan_node, resolve_groups
from tests.gpus import A2 as A2_AT_08
from tests.gpus import A2_B as A2_AT_09
from tests.gpus import CATALOG, card

HEADER = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"
L40S_AT_41 = PciAddress.parse("0000:41:00.0")

FLEET = (
    HEADER
    + """spec:
  nodes:
    vdi-07:
      gpus:
        - address: "0000:08:00.0"
          sriov: enabled
          vgpus: {0: A2-8Q}
  nodeGroups:
    - name: vdi
      selector: {names: ["vdi-*", "desk-[0-9]"]}
      gpus:
        - match: {model: A2}
          sriov: enabled
          profiles: {A2-4Q: 4}
    - name: pool
      selector: {labels: {example.com/pool: inference, zone: a}}
      gpus:
        - match: {deviceId: "26B9"}
          sriov: enabled
          mode: mixed-size
          profiles: {L40S-8Q: 1, L40S-16Q: 1}
    - name: both
      selector: {names: ["gpu-*"], labels: {tier: gold}}
      gpus:
        - match: {address: "0000:09:00.0"}
          sriov: disabled
"""
)


def load(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Desired:
    path = tmp_path / name
    path.write_text(text)
    return load_desired([path], catalog=CATALOG)


def groups_of(desired: Desired, node: str, labels: dict[str, str] | None) -> list[str]:
    found = desired.node(node, labels)
    assert found is not None
    return sorted({entry.group for entry in found.matched})


def test_names_are_globs_any_of_which_may_match(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    assert groups_of(desired, "vdi-01", {}) == ["vdi"]
    assert groups_of(desired, "desk-3", {}) == ["vdi"]
    assert desired.node("desk-33", {}) is None  # [0-9] is one character
    assert desired.node("xvdi-01", {}) is None  # a glob matches the whole name


def test_labels_must_all_match_and_both_parts_must_hold(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    inference = {"example.com/pool": "inference", "zone": "a", "other": "x"}
    assert groups_of(desired, "anything", inference) == ["pool"]
    assert desired.node("anything", {"example.com/pool": "inference"}) is None
    assert desired.node("anything", {"example.com/pool": "inference", "zone": "b"}) is None
    # "both": the name and the label.
    assert groups_of(desired, "gpu-1", {"tier": "gold"}) == ["both"]
    assert desired.node("gpu-1", {"tier": "silver"}) is None
    assert desired.node("cpu-1", {"tier": "gold"}) is None
    # A node in two groups gets the entries of both, in file order.
    found = desired.node("gpu-1", {"tier": "gold", **inference})
    assert found is not None
    assert [e.group for e in found.matched] == ["pool", "both"]


def test_a_nodes_own_entry_replaces_every_group(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    own = desired.node("vdi-07", None)  # labels are not even needed
    assert own is not None and own.matched == ()
    assert [(str(g.address), dict(g.vgpus or {})) for g in own.gpus] == [
        ("0000:08:00.0", {0: "NVIDIA A2-8Q"})
    ]
    assert desired.needs_labels("vdi-07") == ()


def test_labels_that_are_not_known_are_never_guessed(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    assert [g.name for g in desired.needs_labels("gpu-1")] == ["pool", "both"]
    assert [g.name for g in desired.needs_labels("vdi-01")] == ["pool"]
    with pytest.raises(UsageError, match=r"node group 'pool' \(.*fleet.yaml:18:7\) selects"):
        desired.node("vdi-01", None)


def test_the_cluster_nodes_a_fleet_plan_concerns(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    nodes = {
        "vdi-01": {},
        "gpu-1": {"tier": "gold"},
        "gpu-2": {"tier": "silver"},
        "infer-1": {"example.com/pool": "inference", "zone": "a"},
    }
    # vdi-07 has its own entry: planned whether or not the cluster lists it.
    assert desired.selected(nodes) == ["gpu-1", "infer-1", "vdi-01", "vdi-07"]


def test_entries_become_the_gpus_they_match(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    node = desired.node("gpu-1", {"tier": "gold", "example.com/pool": "inference", "zone": "a"})
    assert node is not None
    inventory = Inventory(
        node="gpu-1",
        gpus=(card("A2", A2_AT_08), card("A2", A2_AT_09), card("L40S", L40S_AT_41)),
    )
    resolved = resolve_groups(node, inventory)
    assert resolved.matched == ()
    by_address = {g.address: g for g in resolved.gpus}
    # The A2 at 08 matches nothing of these groups ("vdi" does not select gpu-1): left alone.
    assert set(by_address) == {A2_AT_09, L40S_AT_41}
    assert by_address[A2_AT_09].sriov is False
    l40s = by_address[L40S_AT_41]
    assert l40s.sriov and l40s.mode is VgpuMode.MIXED_SIZE
    assert dict(l40s.profiles or {}) == {"NVIDIA L40S-8Q": 1, "NVIDIA L40S-16Q": 1}
    assert l40s.location is not None and l40s.location.line == 21  # the entry, for errors


def test_a_model_match_needs_the_catalogue_to_know_the_gpu(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    node = desired.node("vdi-01", {})
    assert node is not None
    known = Inventory(node="vdi-01", gpus=(card("A2", A2_AT_08),))
    # The same A2, its PCI ids not in the catalogue: it has no model, and no model matches it.
    stranger = Inventory(node="vdi-01", gpus=(replace(known.gpus[0], model=None),))
    assert [g.address for g in resolve_groups(node, known).gpus] == [A2_AT_08]
    # Nothing the selecting group wants is on the node: an error for it, never "converged".
    with pytest.raises(AbsentError) as caught:
        resolve_groups(node, stranger)
    (problem,) = caught.value.problems
    assert problem.message == (
        "node group 'vdi' selects node vdi-01, and none of its GPU entries matches a GPU "
        "there (it wants GPUs matching model 'NVIDIA A2'): its GPUs are 0000:08:00.0. Narrow "
        "the group's selector, or see why the GPU is missing (vgpuctl doctor)"
    )
    assert (problem.line, problem.column) == (15, 11)  # the entry: "- match: {model: A2}"


def test_agreeing_entries_are_one_and_disagreeing_ones_fail_the_node_only(
    tmp_path: Path,
) -> None:
    text = (
        HEADER
        + """spec:
  nodeGroups:
    - name: all-a2
      selector: {names: ["*"]}
      gpus:
        - match: {model: A2}
          sriov: enabled
          profiles: {A2-4Q: 4}
    - name: same
      selector: {labels: {x: "1"}}
      gpus:
        - match: {deviceId: 25b6}
          sriov: enabled
          profiles: {NVIDIA A2-4Q: 4}
    - name: clash
      selector: {labels: {x: "2"}}
      gpus:
        - match: {address: "0000:09:00.0"}
          sriov: enabled
          profiles: {A2-2Q: 8}
"""
    )
    desired = load(tmp_path, text)  # different selectors: nothing to say offline
    inventory = Inventory(node="n", gpus=(card("A2", A2_AT_08), card("A2", A2_AT_09)))
    agreeing = desired.node("n", {"x": "1"})
    assert agreeing is not None
    resolved = resolve_groups(agreeing, inventory)
    assert [(g.address, dict(g.profiles or {})) for g in resolved.gpus] == [
        (A2_AT_08, {"NVIDIA A2-4Q": 4}),
        (A2_AT_09, {"NVIDIA A2-4Q": 4}),
    ]
    clashing = desired.node("n", {"x": "2"})
    assert clashing is not None
    with pytest.raises(PlanError) as info:
        plan_node(clashing, inventory, catalog=CATALOG)
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.column) == (str(tmp_path / "fleet.yaml"), 21, 11)
    assert problem.message == (
        "GPU 0000:09:00.0 of node n is matched by node group 'clash' (matching address "
        "0000:09:00.0) and by node group 'all-a2' (matching model 'NVIDIA A2', "
        f"{tmp_path / 'fleet.yaml'}:9:11), which give it different layouts: a GPU has one "
        "layout; make the entries agree, or narrow a group's selector or match"
    )
    assert info.value.message == "node groups give 1 GPU of node n two layouts"


def test_a_resolved_gpu_is_planned_like_a_listed_one(tmp_path: Path) -> None:
    """The plan of a node a group configures equals the plan of the same layout listed under
    the node's own entry (the group's entry is the desired GPU at the matched address)."""
    grouped = load(
        tmp_path,
        HEADER
        + """spec:
  nodeGroups:
    - {name: g, selector: {names: [n]}, gpus: [{match: {model: A2}, sriov: enabled,
       vgpus: {0: A2-4Q, 3: A2-4Q}}]}
""",
        "grouped.yaml",
    )
    listed = load(
        tmp_path,
        HEADER
        + """spec:
  nodes:
    n: {gpus: [{address: "0000:08:00.0", sriov: enabled, vgpus: {0: A2-4Q, 3: A2-4Q}}]}
""",
        "listed.yaml",
    )
    inventory = Inventory(node="n", gpus=(card("A2", A2_AT_08, enabled=False),))
    plans = [plan_node(d.node("n", {}), inventory, catalog=CATALOG) for d in (grouped, listed)]
    assert [a.target for a in plans[0].actions] == [a.target for a in plans[1].actions]
    assert [a.kind for a in plans[0].actions] == [a.kind for a in plans[1].actions]
    assert len(plans[0].actions) == 4  # enable, two vGPUs, the device-plugin refresh
    # Only the grouped plan says where the layout came from.
    assert [n for n in plans[0].notes if n not in plans[1].notes] == [
        f"node group 'g' ({tmp_path / 'grouped.yaml'}:6:48) configures GPU 0000:08:00.0"
    ]


def test_a_desired_gpu_from_a_group_keeps_where_it_was_written(tmp_path: Path) -> None:
    desired = load(tmp_path, FLEET)
    node = desired.node("vdi-01", {})
    assert node is not None
    (gpu,) = resolve_groups(node, Inventory(node="vdi-01", gpus=(card("A2", A2_AT_08),))).gpus
    assert isinstance(gpu, DesiredGpu)
    assert gpu.location is not None and (gpu.location.line, gpu.location.column) == (15, 11)
    profile_at = gpu.location_of("NVIDIA A2-4Q")
    assert profile_at is not None and (profile_at.line, profile_at.column) == (17, 22)
