"""The intent a run publishes in its own VGPUNodeState before its allow-list check (the
kubevirt-allow's ``intent``: docs/architecture.md, "The KubeVirt allow-list"): planned only for
the types the stored summary does not show, written by the cluster executor before the CR is
read (merged into the stored status, conflicts retried), and a failure fails the step."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from reconciler.apply.cluster import execute_cluster, intent_status
from reconciler.apply.executor import OutcomeStatus
from reconciler.model import (
    ClusterUnavailableError,
    CrCreate,
    CrUpdate,
    Intent,
    Inventory,
    KubevirtAllow,
    MediatedDevice,
    WantedProfile,
)
from reconciler.model.cluster import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_LABEL,
    NODE_STATE_KIND,
    ClusterState,
    KubeObject,
)
from reconciler.plan import plan_node
from reconciler.plan.cluster import intent_for
from tests.cluster_a2 import CATALOG, NODE, a2_desired, kubevirt_config, mdev_a2
from tests.doubles.cluster import FakeCluster

X, Y = "NVIDIA A2-4C", "NVIDIA A2-4Q"
STATES = "vgpunodestates"


def _profile(name: str, **counts: int) -> dict[str, Any]:
    base = {"wanted": 0, "vgpus": 0, "inUse": 0, "creatable": 0}
    return {"name": name, "resourceName": "nvidia.com/" + name.replace(" ", "_"), **base, **counts}


def _state(profiles: list[dict[str, Any]], *, managed_by: str = MANAGED_BY) -> dict[str, Any]:
    return {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": NODE_STATE_KIND,
        "metadata": {"name": NODE, "labels": {NODE_LABEL: NODE, MANAGED_BY_LABEL: managed_by}},
        "spec": {"nodeName": NODE},
        "status": {
            "vgpuctlVersion": "1.0",
            "counts": {"vgpus": 1},
            "vgpus": [{"vf": "0000:08:00.4", "profile": Y, "uuid": "u-4", "inUse": True}],
            "profiles": profiles,
            "conditions": [
                {"type": "Converged", "status": "True", "reason": "Converged", "message": "m",
                 "lastTransitionTime": "2026-12-07T18:00:00Z"},
            ],
            "lastChange": {"time": "2026-12-07T18:00:00Z", "result": "applied 1 action"},
        },
    }  # fmt: skip


def _allow(rv: str, intent: Intent | None) -> KubevirtAllow:
    return KubevirtAllow(
        seq=1, target="kubevirt/kubevirt/kubevirt", reason="r", namespace="kubevirt",
        name="kubevirt", resource_version=rv,
        add=(MediatedDevice(X, "nvidia.com/NVIDIA_A2-4C"),), owned=(X,), unmark=(X,),
        intent=intent,
    )  # fmt: skip


def _cluster(state: dict[str, Any] | None) -> tuple[FakeCluster, str]:
    fake = FakeCluster()
    cr = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"permittedHostDevices": {"mediatedDevices": []}}},
    }
    planned = fake.put("kubevirts", cr, "kubevirt")
    if state is not None:
        fake.put(STATES, state)
    return fake, planned


INTENT = Intent(NODE, (WantedProfile(X, 2),))


# -- the planner ---------------------------------------------------------------------------------


def test_intent_only_for_created_types_the_stored_summary_does_not_show_configured() -> None:
    """Shown configured: wanted or vgpus above 0. A type only creatable there, or absent, or a
    summary that does not exist yet, gets intent, with the desired state's count."""
    stored = KubeObject.from_json(
        _state(
            [_profile(X, creatable=16), _profile(Y, vgpus=1), _profile("NVIDIA A2-4A", wanted=1)]
        )
    )
    created = frozenset({X, Y, "NVIDIA A2-4A", "NVIDIA A2-8Q"})
    wanted = {X: 3, Y: 1, "NVIDIA A2-4A": 1}
    assert intent_for(NODE, stored, created, wanted) == Intent(
        NODE, (WantedProfile(X, 3), WantedProfile("NVIDIA A2-8Q", 1))
    )
    assert intent_for(NODE, None, frozenset({Y}), {Y: 2}) == Intent(NODE, (WantedProfile(Y, 2),))
    assert intent_for(NODE, stored, frozenset({Y}), {Y: 2}) is None
    assert intent_for(NODE, stored, frozenset(), {}) is None
    # Another controller's object of that name: vgpuctl writes no summary there.
    foreign = KubeObject.from_json(_state([], managed_by="someone"))
    assert intent_for(NODE, foreign, frozenset({X}), {X: 1}) is None


def test_the_plan_publishes_intent_in_its_kubevirt_allow_and_not_once_the_summary_shows_it() -> (
    None
):
    inventory = Inventory(NODE, (mdev_a2({}),))
    desired = a2_desired({0: X, 1: X, 2: Y})
    cluster = ClusterState(
        NODE, kubevirt=kubevirt_config([], []), observed_at="2026-12-07T19:00:00Z"
    )
    plan = plan_node(desired, inventory, catalog=CATALOG, cluster=cluster)
    allow = plan.actions[0]
    assert isinstance(allow, KubevirtAllow)
    assert allow.intent == Intent(NODE, (WantedProfile(X, 2), WantedProfile(Y, 1)))
    # The node state the same plan writes shows the same wanted counts (no diff loop).
    (write,) = [a for a in plan.actions if a.target == NODE]
    assert isinstance(write, CrCreate | CrUpdate)
    shown = {p["name"]: p["wanted"] for p in write.object.status["profiles"]}
    assert (shown[X], shown[Y]) == (2, 1)
    # A summary showing Y (a vGPU of it) and X wanted: nothing to publish.
    stored = KubeObject.from_json(_state([_profile(X, wanted=2), _profile(Y, vgpus=1)]))
    again = plan_node(
        desired, inventory, catalog=CATALOG, cluster=replace(cluster, node_state=stored)
    )
    first = again.actions[0]
    assert isinstance(first, KubevirtAllow) and first.intent is None


# -- the executor --------------------------------------------------------------------------------


def test_intent_status_sets_wanted_and_keeps_every_other_field() -> None:
    status = _state([_profile(Y, vgpus=1, inUse=1), _profile(X, creatable=16)])["status"]
    before = copy.deepcopy(status)
    out = intent_status(
        status, Intent(NODE, (WantedProfile(X, 2), WantedProfile("NVIDIA A2-4A", 1)))
    )
    assert status == before  # not touched
    assert out["profiles"] == [
        _profile("NVIDIA A2-4A", wanted=1),
        _profile(X, wanted=2, creatable=16),
        _profile(Y, vgpus=1, inUse=1),
    ]
    assert {k: v for k, v in out.items() if k != "profiles"} == {
        k: v for k, v in before.items() if k != "profiles"
    }
    assert intent_status({}, INTENT) == {"profiles": [_profile(X, wanted=2)]}


def test_the_intent_is_written_merged_before_the_kubevirt_cr_is_read() -> None:
    fake, planned = _cluster(_state([_profile(Y, vgpus=1)]))
    stored_before = copy.deepcopy(fake.store[(STATES, None, NODE)])
    result = execute_cluster([_allow(planned, INTENT)], api=fake)
    assert result.ok
    (outcome,) = result.outcomes
    assert outcome.status is OutcomeStatus.DONE
    assert outcome.message.startswith(
        f"{STATES}/{NODE}: intent to create {X} (wanted 2) published; "
    )
    assert outcome.message.endswith(f"allowed {X}")
    # The status write (with the version read) comes before the CR's read and patch.
    verbs = [(v, p) for v, p, _ in fake.calls]
    assert verbs.index(("update/status", STATES)) < verbs.index(("get", "kubevirts"))
    assert verbs.index(("update/status", STATES)) < verbs.index(("patch", "kubevirts"))
    (status_write,) = [w for w in fake.writes if w.plural == STATES]
    assert (
        status_write.body["metadata"]["resourceVersion"]
        == stored_before["metadata"]["resourceVersion"]
    )
    stored = fake.store[(STATES, None, NODE)]["status"]
    assert stored["profiles"] == [_profile(X, wanted=2), _profile(Y, vgpus=1)]
    assert {k: v for k, v in stored.items() if k != "profiles"} == {
        k: v for k, v in stored_before["status"].items() if k != "profiles"
    }


def test_a_missing_summary_is_created_with_the_intent_and_the_plans_create_follows() -> None:
    """No VGPUNodeState yet: the intent creates it (labelled as vgpuctl's, for the node) with
    just the intent; the cluster phase's cr-create of it then writes its status over the
    version the intent made, with no conflict and no second create."""
    fake, planned = _cluster(None)
    versions: dict[str, str] = {}
    assert execute_cluster([_allow(planned, INTENT)], api=fake, versions=versions).ok
    obj = fake.store[(STATES, None, NODE)]
    assert obj["metadata"]["labels"] == {NODE_LABEL: NODE, MANAGED_BY_LABEL: MANAGED_BY}
    assert obj["spec"] == {"nodeName": NODE}
    assert obj["status"] == {"profiles": [_profile(X, wanted=2)]}
    rendered = KubeObject(
        kind=NODE_STATE_KIND,
        name=NODE,
        labels={NODE_LABEL: NODE, MANAGED_BY_LABEL: MANAGED_BY},
        spec={"nodeName": NODE},
        status={"profiles": [_profile(X, wanted=2, vgpus=2)], "counts": {"vgpus": 2}},
    )
    create = CrCreate(seq=5, target=NODE, reason="r", object=rendered)
    calls = len(fake.calls)
    result = execute_cluster([create], api=fake, versions=versions)
    assert result.ok, result.outcomes
    assert [(v, p) for v, p, _ in fake.calls[calls:]] == [("update/status", STATES)]
    assert "conflict" not in result.outcomes[0].message
    assert fake.store[(STATES, None, NODE)]["status"] == dict(rendered.status)


def test_the_plans_update_of_the_summary_goes_over_the_intents_version() -> None:
    fake, planned = _cluster(_state([_profile(Y, vgpus=1)]))
    read = fake.store[(STATES, None, NODE)]["metadata"]["resourceVersion"]
    versions: dict[str, str] = {}
    assert execute_cluster([_allow(planned, INTENT)], api=fake, versions=versions).ok
    current = KubeObject.from_json({**fake.store[(STATES, None, NODE)], "kind": NODE_STATE_KIND})
    rendered = replace(current, status={"profiles": [_profile(X, wanted=2, vgpus=2)]})
    update = CrUpdate(
        seq=5, target=NODE, reason="r", resource_version=read, object=rendered,
        spec_changed=False, status_changed=True,
    )  # fmt: skip
    result = execute_cluster([update], api=fake, versions=versions)  # no replan: no conflict
    assert result.ok, result.outcomes
    assert fake.store[(STATES, None, NODE)]["status"] == {
        "profiles": [_profile(X, wanted=2, vgpus=2)]
    }


def test_a_conflicting_intent_write_is_read_again_and_merged_over_the_change() -> None:
    fake, planned = _cluster(_state([_profile(Y, vgpus=1)]))
    changed: list[str] = []

    def meanwhile(verb: str, key: Any) -> None:
        if key[0] == STATES and not changed:
            # Someone writes the status between our read and our write.
            obj = copy.deepcopy(fake.store[key])
            obj["status"]["vgpuctlVersion"] = "2.0"
            changed.append(fake.put(STATES, obj))

    fake.before_write = meanwhile
    result = execute_cluster([_allow(planned, INTENT)], api=fake)
    assert result.ok
    assert "(after 1 conflict: re-read and re-planned)" in result.outcomes[0].message
    stored = fake.store[(STATES, None, NODE)]["status"]
    assert stored["vgpuctlVersion"] == "2.0"
    assert stored["profiles"] == [_profile(X, wanted=2), _profile(Y, vgpus=1)]


def test_an_intent_that_cannot_be_written_fails_the_step_and_nothing_after_runs() -> None:
    """The API server refuses the write, or keeps changing the object, or it is another
    controller's: the kubevirt-allow fails before the CR is patched, and the actions after it
    (the host phase's, for the engine: it stops on a failed allow-list phase) do not run."""
    unreachable, planned = _cluster(_state([_profile(Y, vgpus=1)]))
    unreachable.fail[STATES] = ClusterUnavailableError("cannot reach the API server")
    foreign, planned_f = _cluster(_state([], managed_by="someone"))
    busy, planned_b = _cluster(_state([_profile(Y, vgpus=1)]))

    def always(verb: str, key: Any) -> None:
        if key[0] == STATES:
            busy.put(STATES, copy.deepcopy(busy.store[key]))

    busy.before_write = always
    for fake, rv, words in (
        (unreachable, planned, "cannot reach the API server"),
        (foreign, planned_f, "is not vgpuctl's VGPUNodeState"),
        (busy, planned_b, "kept changing under us: gave up after 4 conflicts"),
    ):
        later = replace(_allow(rv, None), seq=2)
        result = execute_cluster([_allow(rv, INTENT), later], api=fake)
        assert not result.ok
        (failed,) = result.outcomes
        assert failed.status is OutcomeStatus.FAILED and words in failed.message, failed.message
        assert result.not_run == (later,)
        assert not [c for c in fake.calls if c[1] == "kubevirts" and c[0] != "get"]
