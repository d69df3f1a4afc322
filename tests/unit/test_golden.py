"""Golden cases: ``tests/cases/<name>/`` holds a desired state, an observed host and the answer.

Each case directory has ``desired.yaml`` (as an operator writes it), ``observed.json`` (the host
as ``observe`` reports it, ``Inventory.to_json``) and either ``expected-plan.json`` (the exact
``plan_to_json``) or ``expected-error.txt`` (the expected problem lines, one per line, from
the loader or the planner). New behaviour = a new directory.

A case may also have ``cluster.json`` (the cluster as ``observe_cluster`` reports it,
``ClusterState.to_json``): the plan then includes the cluster actions; without it the plan is
node-local. ``options.json`` holds planner options: ``{"adopt": true}``.

``UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py`` rewrites the expectations. Read every
changed file before committing: they are the spec.

Each case also has ``expect.yaml``: what the answer means, written by hand from the case's story
(``tests/golden_expect.py``). The planner's answer must meet it too, so a regenerated golden
file cannot silently change meaning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reconciler.catalog import default_catalog
from reconciler.desired import load_desired
from reconciler.model import Inventory, PlanError, ValidationError
from reconciler.model.cluster import ClusterState
from reconciler.model.plan_json import plan_from_json, plan_to_json
from reconciler.plan import plan_node
from tests.golden_expect import check_errors, check_plan, load_expectation

CASES = Path(__file__).resolve().parents[1] / "cases"
PLAN_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
EXPECTATIONS = ("expected-plan.json", "expected-error.txt")
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "desired.yaml").is_file())


def _run(case: Path) -> tuple[str, str]:
    """(expectation file name, its text) for one case."""
    catalog = default_catalog()
    observed = json.loads((case / "observed.json").read_text(encoding="utf-8"))
    inventory = Inventory.from_json(observed)
    cluster_file = case / "cluster.json"
    cluster = None
    if cluster_file.is_file():
        cluster = ClusterState.from_json(json.loads(cluster_file.read_text(encoding="utf-8")))
    options_file = case / "options.json"
    options = json.loads(options_file.read_text(encoding="utf-8")) if options_file.is_file() else {}
    try:
        # A relative path, read from the case directory: problems then say "desired.yaml:…".
        desired = load_desired([Path("desired.yaml")], catalog=catalog)
        plan = plan_node(
            desired.node(inventory.node),
            inventory,
            catalog=catalog,
            cluster=cluster,
            adopt=bool(options.get("adopt", False)),
        )
    except (ValidationError, PlanError) as exc:
        return "expected-error.txt", "".join(f"{line}\n" for line in exc.lines())
    return "expected-plan.json", json.dumps(plan_to_json(plan), indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("name", NAMES)
def test_golden_case(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES / name
    monkeypatch.chdir(case)
    expected_name, got = _run(case)
    other = next(n for n in EXPECTATIONS if n != expected_name)
    if UPDATE:
        (case / expected_name).write_text(got, encoding="utf-8")
        (case / other).unlink(missing_ok=True)
    assert not (case / other).exists(), f"{name}: expected {other}, got {expected_name}"
    assert (case / expected_name).read_text(encoding="utf-8") == got


def test_there_are_golden_cases() -> None:
    # A wrong CASES path would otherwise parametrise nothing and pass.
    assert len(NAMES) >= 18


@pytest.mark.parametrize("name", NAMES)
def test_observed_json_is_canonical(name: str) -> None:
    """observed.json is exactly what ``Inventory.to_json`` writes: nothing in it is ignored."""
    raw = json.loads((CASES / name / "observed.json").read_text(encoding="utf-8"))
    assert Inventory.from_json(raw).to_json() == raw


CLUSTER_NAMES = sorted(p.parent.name for p in CASES.glob("*/cluster.json"))


@pytest.mark.parametrize("name", CLUSTER_NAMES)
def test_cluster_json_is_canonical(name: str) -> None:
    """cluster.json is exactly what ``ClusterState.to_json`` writes: nothing in it is ignored."""
    raw = json.loads((CASES / name / "cluster.json").read_text(encoding="utf-8"))
    assert ClusterState.from_json(raw).to_json() == raw


def test_there_are_cluster_cases() -> None:
    assert len(CLUSTER_NAMES) >= 9


@pytest.mark.parametrize("name", sorted(p.parent.name for p in CASES.glob("*/options.json")))
def test_options_json_names_known_options(name: str) -> None:
    raw = json.loads((CASES / name / "options.json").read_text(encoding="utf-8"))
    assert set(raw) <= {"adopt"}


def _expected_plans() -> list[tuple[str, Any]]:
    return [
        (p.parent.name, json.loads(p.read_text(encoding="utf-8")))
        for p in sorted(CASES.glob("*/expected-plan.json"))
    ]


@pytest.mark.parametrize(("name", "plan"), _expected_plans())
def test_expected_plan_matches_the_plan_schema(name: str, plan: Any) -> None:
    schema = json.loads(PLAN_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(plan)


@pytest.mark.parametrize(("name", "plan"), _expected_plans())
def test_expected_plan_round_trips_through_the_codec(name: str, plan: Any) -> None:
    # A saved plan (``plan --out``) is read back with plan_from_json: nothing may be lost.
    assert plan_to_json(plan_from_json(plan)) == plan


@pytest.mark.parametrize("name", NAMES)
def test_golden_case_meets_its_hand_written_expectation(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES / name
    expect = load_expectation(case / "expect.yaml")
    monkeypatch.chdir(case)
    kind, got = _run(case)
    if "errors" in expect:
        assert kind == "expected-error.txt", f"{name}: expected problems, got a plan"
        problems = check_errors(expect, got.splitlines())
    else:
        assert kind == "expected-plan.json", f"{name}: expected a plan, got {got}"
        problems = check_plan(expect, json.loads(got))
    assert not problems, "\n".join(problems)
