"""``compare_actions``: when a saved plan does what a fresh plan does (``apply PLANFILE``)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model import CrUpdate, PciAddress, SriovEnable, VgpuCreate, VgpuRemove
from reconciler.model.cluster import KubeObject
from reconciler.model.plan import FieldChange
from reconciler.plan.compare import compare_actions, effect

GPU = PciAddress.parse("0000:08:00.0")
UUID = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
REMOVE = VgpuRemove(seq=1, target="0000:08:00.5", reason="why", gpu=GPU, vf_index=1,
                    type_name="NVIDIA A2-4Q", uuid=UUID)  # fmt: skip
CREATE = VgpuCreate(seq=2, target="0000:08:00.5", reason="why", gpu=GPU, vf_index=1,
                    type_name="NVIDIA A2-4A", uuid=UUID)  # fmt: skip
OBJECT = KubeObject("VGPUDevice", "n1-000008005", spec={"a": 1}, resource_version="41")
UPDATE = CrUpdate(
    seq=3, target="n1-000008005", reason="why", resource_version="41", object=OBJECT,
    spec_changed=True, status_changed=False, changes=(FieldChange("spec.a", 0, 1),),
)  # fmt: skip


def test_reasons_seqs_and_planned_from_versions_are_not_what_an_action_does() -> None:
    assert effect(REMOVE) == effect(replace(REMOVE, seq=9, reason="\x1b[2K edited"))
    newer = replace(UPDATE, resource_version="57", object=replace(OBJECT, resource_version="57"))
    assert effect(UPDATE) == effect(newer)
    assert not compare_actions([REMOVE, CREATE, UPDATE], [REMOVE, CREATE, newer])


def test_every_other_field_counts() -> None:
    other_uuid = replace(REMOVE, uuid="00000000-0000-5000-8000-000000000000")
    difference = compare_actions([other_uuid, CREATE], [REMOVE, CREATE])
    assert [c.fields for c in difference.changed] == [("uuid",)]
    assert not difference.only_saved and not difference.only_fresh
    other_body = replace(UPDATE, object=replace(OBJECT, spec={"a": 2}), drift=True)
    difference = compare_actions([REMOVE, CREATE, other_body], [REMOVE, CREATE, UPDATE])
    assert [c.fields for c in difference.changed] == [("drift", "object")]


def test_added_and_missing_actions_are_named_in_their_own_order() -> None:
    other = PciAddress.parse("0000:09:00.0")
    extra = SriovEnable(seq=9, target=str(other), reason="why", gpu=other, num_vfs=16)
    difference = compare_actions([REMOVE, extra, CREATE], [REMOVE, CREATE, UPDATE])
    assert difference.only_saved == (extra,)
    assert difference.only_fresh == (UPDATE,)
    assert not difference.changed and not difference.reordered


def test_the_same_actions_in_another_order_differ() -> None:
    difference = compare_actions([CREATE, REMOVE], [REMOVE, CREATE])
    assert difference and difference.reordered
    assert not difference.only_saved and not difference.only_fresh


def test_a_duplicated_action_is_a_difference() -> None:
    difference = compare_actions([REMOVE, REMOVE, CREATE], [REMOVE, CREATE])
    assert difference.only_saved == (REMOVE,)
