"""``compare_actions``: when a saved plan does what a fresh plan does (``apply PLANFILE``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reconciler.model import Action, ActionKind
from reconciler.plan.compare import compare_actions, effect


def _action(seq: int, what: ActionKind, target: str, **params: Any) -> Action:
    return Action(seq=seq, kind=what, target=target, reason="why", params=params)


REMOVE = _action(1, ActionKind.VGPU_REMOVE, "0000:08:00.5", gpu="0000:08:00.0", vfIndex=1,
                 type="NVIDIA A2-4Q", uuid="5ed3b3e8-ffe3-55db-be73-567bd703a205")  # fmt: skip
CREATE = _action(2, ActionKind.VGPU_CREATE, "0000:08:00.5", gpu="0000:08:00.0", vfIndex=1,
                 type="NVIDIA A2-4A", uuid="5ed3b3e8-ffe3-55db-be73-567bd703a205")  # fmt: skip
UPDATE = _action(
    3, ActionKind.CR_UPDATE, "n1-000008005", kind="VGPUDevice", resourceVersion="41",
    object={"metadata": {"name": "n1-000008005", "resourceVersion": "41"}, "spec": {"a": 1}},
)  # fmt: skip


def test_reasons_seqs_and_planned_from_versions_are_not_what_an_action_does() -> None:
    assert effect(REMOVE) == effect(replace(REMOVE, seq=9, reason="\x1b[2K edited"))
    newer = {**UPDATE.params, "resourceVersion": "57"}
    newer["object"] = {"metadata": {"name": "n1-000008005", "resourceVersion": "57"},
                       "spec": {"a": 1}}  # fmt: skip
    assert effect(UPDATE) == effect(replace(UPDATE, params=newer))
    assert not compare_actions(
        [REMOVE, CREATE, UPDATE], [REMOVE, CREATE, replace(UPDATE, params=newer)]
    )


def test_every_other_param_counts() -> None:
    other_uuid = replace(
        REMOVE, params={**REMOVE.params, "uuid": "00000000-0000-5000-8000-000000000000"}
    )
    difference = compare_actions([other_uuid, CREATE], [REMOVE, CREATE])
    assert [c.params for c in difference.changed] == [("uuid",)]
    assert not difference.only_saved and not difference.only_fresh


def test_added_and_missing_actions_are_named_in_their_own_order() -> None:
    extra = _action(9, ActionKind.SRIOV_ENABLE, "0000:09:00.0", gpu="0000:09:00.0", numVFs=16)
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
