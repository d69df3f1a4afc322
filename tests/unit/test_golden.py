"""Golden cases: ``tests/cases/<name>/`` holds a desired state, an observed host and the answer.

Each case directory has ``desired.yaml`` (as an operator writes it), ``observed.json`` (the host
as ``observe`` reports it, ``Inventory.to_json``) and either ``expected-plan.json`` (the exact
``Plan.to_json()``) or ``expected-error.txt`` (the expected problem lines, one per line, from
the loader or the planner). New behaviour = a new directory.

``UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py`` rewrites the expectations. Read every
changed file before committing: they are the spec.
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
from reconciler.plan import plan_node

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
    try:
        # A relative path, read from the case directory: problems then say "desired.yaml:…".
        desired = load_desired([Path("desired.yaml")], catalog=catalog)
        plan = plan_node(desired.node(inventory.node), inventory, catalog=catalog)
    except (ValidationError, PlanError) as exc:
        return "expected-error.txt", "".join(f"{line}\n" for line in exc.lines())
    return "expected-plan.json", json.dumps(plan.to_json(), indent=2, ensure_ascii=False) + "\n"


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


def _expected_plans() -> list[tuple[str, Any]]:
    return [
        (p.parent.name, json.loads(p.read_text(encoding="utf-8")))
        for p in sorted(CASES.glob("*/expected-plan.json"))
    ]


@pytest.mark.parametrize(("name", "plan"), _expected_plans())
def test_expected_plan_matches_the_plan_schema(name: str, plan: Any) -> None:
    schema = json.loads(PLAN_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(plan)
