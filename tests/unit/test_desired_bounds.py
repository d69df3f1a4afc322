"""The bounds of reading a desired state: compose's limits at their edges, the validator's walk
(same verdicts as jsonschema's own), problems capped per file, the catalogue note capped, and
the limits across the files of a directory.

The user-level attacks (a hostile megabyte through ``validate`` and ``watch``) are
``tests/security/test_input_bounds.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from reconciler.catalog import default_catalog
from reconciler.desired import compose, load_desired, validate_files
from reconciler.desired.compose import MAX_DEPTH, MAX_NODES, MAX_SCALAR_CHARS, ComposeError
from reconciler.desired.loader import MAX_FILES, MAX_PROBLEMS_PER_FILE, NOTE_NAMES, NOTE_PLACES
from reconciler.desired.shape import _validator
from reconciler.desired.source import document_from_data, read_document
from reconciler.desired.validator import certainly_valid, inlined
from reconciler.model import Problem, ValidationError
from tests.reliability.bad_input import ANY_VALUE, set_path, value_paths
from tests.reliability.generators import host_and_desired

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "desired"
HEAD = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"


def _refusal(text: str) -> ComposeError:
    with pytest.raises(ComposeError) as info:
        compose.compose(text)
    return info.value


# --- compose: each bound at its edge --------------------------------------------------------


def test_a_value_of_the_longest_length_is_read_one_more_is_refused_where_it_starts() -> None:
    assert compose.compose("a: " + "x" * MAX_SCALAR_CHARS + "\n") is not None
    refused = _refusal("a: b\nc: " + "x" * (MAX_SCALAR_CHARS + 1) + "\n")
    assert (refused.line, refused.column) == (2, 4)
    assert refused.message == "a value of 1,025 characters: no field takes more than 1,024"


def test_keys_are_bounded_like_values() -> None:
    refused = _refusal("k" * (MAX_SCALAR_CHARS + 1) + ": 1\n")
    assert (refused.line, refused.column) == (1, 1)


def test_nesting_to_the_deepest_level_is_read_one_more_is_refused() -> None:
    # The root list is level 1.
    assert compose.compose("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    refused = _refusal("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert (refused.line, refused.column) == (1, MAX_DEPTH + 1)
    assert refused.message == f"nested deeper than {MAX_DEPTH} levels"


def test_an_alias_cannot_nest_past_the_bound_either() -> None:
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    # At level 2 (inside the mapping) the anchored 19 levels end at level 20: fine.
    assert compose.compose(f"a: &d {deep}\nb: *d\n") is not None
    # Inside a list at level 2, the alias sits at level 3: 19 more levels make 21.
    refused = _refusal(f"a: &d {deep}\nb: [*d]\n")
    assert (refused.line, refused.column) == (2, 5)
    assert refused.message == f"alias *d nests deeper than {MAX_DEPTH} levels once expanded"


def test_nodes_are_counted_with_every_alias_expanded() -> None:
    # The root mapping, 2 keys, the list and its items: 1 + 2 + 1 + n, then each alias n + 1.
    n = 1000
    items = ", ".join(["x"] * n)
    fits = (MAX_NODES - (4 + n)) // (n + 1)
    aliases = ", ".join(["*a"] * fits)
    assert compose.compose(f"a: &a [{items}]\nb: [{aliases}]\n") is not None
    refused = _refusal(f"a: &a [{items}]\nb: [{aliases}, *a]\n")
    assert (refused.line, refused.column) == (2, 5 + 4 * fits)
    assert refused.message.startswith(f"document too large: more than {MAX_NODES:,} YAML nodes")


def test_a_recursive_alias_is_refused_where_it_is() -> None:
    refused = _refusal("a: &a [1, *a]\n")
    assert (refused.line, refused.column) == (1, 11)
    assert "refers to the list or mapping it is in" in refused.message


def test_an_alias_needs_its_anchor_before_it_and_an_anchor_is_defined_once() -> None:
    refused = _refusal("a: *nowhere\n")
    assert (refused.line, refused.column, refused.message) == (
        1,
        4,
        "YAML syntax error: alias *nowhere has no anchor &nowhere before it",
    )
    refused = _refusal("a: &x 1\nb: &x 2\n")
    assert (refused.line, refused.column) == (2, 4)
    assert refused.message == "YAML syntax error: anchor &x is defined twice (first at line 1)"


def test_a_second_document_is_refused_at_its_start() -> None:
    refused = _refusal("a: 1\n---\nb: 2\n" * 3)
    assert (refused.line, refused.column) == (2, 1)


def test_an_error_at_the_end_of_a_file_without_a_final_line_break_is_on_its_last_line() -> None:
    refused = _refusal("a: 1\nb: [1, 2")
    assert refused.line == 2 and refused.column is not None and refused.column >= 1


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("!!bool true", True), ("!!bool FALSE", False), ("!!int 0x1f", 31), ("!!int 010", 10),
        ("!!float 1", 1.0), ("!!float -.inf", float("-inf")), ("!!null ~", None),
        ("!!null ''", None), ("!!str 5", "5"), ("! 5", "5"), ("5", 5), ("on", "on"),
        ("0000:08:00.0", "0000:08:00.0"), ("'true'", "true"), ("~", None), ("1e3", 1000.0),
    ],
)  # fmt: skip
def test_scalars_mean_what_the_yaml_1_2_core_schema_says(text: str, value: object) -> None:
    node = compose.compose(text)
    assert isinstance(node, compose.YamlScalar)
    assert compose.scalar_value(node) == value


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("!!bool maybe", "'maybe' is not true or false (tag !!bool)"),
        ("!!bool ''", "'' is not true or false (tag !!bool)"),
        ("!!float ''", "'' is not a number (tag !!float)"),
        ("!!int 1.5", "'1.5' is not an integer"),
        ("!!int " + "9" * 45, "'" + "9" * 37 + "...' is too large a number"),
        ("!!null x", "'x' is not null (tag !!null)"),
        ("!!binary aGk=", "tag !!binary is not supported on text"),
        ("!foo x", "tag !foo is not supported on text"),
        ("!<tag:example.com,2000:x> y", "tag !<tag:example.com,2000:x> is not supported on text"),
    ],
)
def test_a_tagged_value_of_another_type_is_unsupported_with_the_reason(text: str, why: str) -> None:
    node = compose.compose(text)
    assert isinstance(node, compose.YamlScalar)
    with pytest.raises(compose.UnsupportedValue) as info:
        compose.scalar_value(node)
    assert str(info.value).startswith(why)


def _all_fixture_problems() -> list[tuple[str, list[tuple[int | None, int | None, str]]]]:
    found = []
    for path in sorted(FIXTURES.rglob("*.yaml")):
        problems = validate_files([path], catalog=default_catalog())
        found.append(
            (
                path.name,
                [
                    (p.line, p.column, "syntax" if "syntax" in p.message else p.message)
                    for p in problems
                ],
            )
        )
    return found


def test_without_libyaml_the_pure_python_parser_gives_the_same_problems(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_libyaml = _all_fixture_problems()
    monkeypatch.setattr(compose, "uses_libyaml", lambda: False)
    assert _all_fixture_problems() == with_libyaml
    # The bounds hold there too.
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (problem,) = validate_files([path], catalog=default_catalog())
    assert (problem.line, problem.column) == (1, 4 + MAX_DEPTH - 1)


# --- the validator: jsonschema's verdicts, walked in order ----------------------------------


def _verdicts(validator: Any, doc: Any) -> list[tuple[str, str, str]]:
    return sorted(
        (repr(list(e.absolute_path)), str(e.validator), repr(e.instance))
        for e in validator.iter_errors(doc)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_validator_finds_exactly_what_jsonschema_finds(data: st.DataObject) -> None:
    _, drawn = data.draw(host_and_desired("n1", max_gpus=2))
    for _ in range(data.draw(st.integers(0, 3))):
        set_path(drawn, data.draw(st.sampled_from(value_paths(drawn))), data.draw(ANY_VALUE))
    doc = document_from_data(drawn, file="drawn").data  # keys as text, as a file gives them
    schema = json.loads((REPO / "schemas" / "desired-state.schema.json").read_text())
    assert _verdicts(_validator(), doc) == _verdicts(Draft202012Validator(schema), doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_certainly_valid_is_never_wrong(data: st.DataObject) -> None:
    """The fast path that skips jsonschema says "valid" only where jsonschema finds nothing."""
    _, drawn = data.draw(host_and_desired("n1", max_gpus=2))
    for _ in range(data.draw(st.integers(0, 3))):
        set_path(drawn, data.draw(st.sampled_from(value_paths(drawn))), data.draw(ANY_VALUE))
    doc = document_from_data(drawn, file="drawn").data
    schema = json.loads((REPO / "schemas" / "desired-state.schema.json").read_text())
    if certainly_valid(inlined(schema, schema["$defs"]), doc):
        assert list(Draft202012Validator(schema).iter_errors(doc)) == []


def test_every_shipped_desired_state_takes_the_fast_path() -> None:
    """Valid files never need jsonschema: the examples, and the benchmark's 8×L40S node."""
    schema = json.loads((REPO / "schemas" / "desired-state.schema.json").read_text())
    fast = inlined(schema, schema["$defs"])
    files = sorted((REPO / "desired-state").glob("*.yaml"))
    assert files
    for path in files:
        document, problems = read_document(path)
        assert document is not None and not problems, path
        assert certainly_valid(fast, document.data), path
    # A misspelt kind is not certain: jsonschema judges it, and words the problem.
    document, _ = read_document(files[0])
    assert document is not None
    broken = json.loads(json.dumps(document.data))
    broken["kind"] = "VGPUDesiredStat"
    assert not certainly_valid(fast, broken)


def test_the_validator_reports_a_node_maps_entries_in_the_order_written() -> None:
    nodes = {f"n{i}": 0 for i in range(300)}
    doc = {"apiVersion": "vgpu.reconciler.dev/v1alpha1", "kind": "VGPUDesiredState",
           "metadata": {"name": "x"}, "spec": {"nodes": nodes}}  # fmt: skip
    paths = [list(e.absolute_path) for e in _validator().iter_errors(doc)]
    assert paths == [["spec", "nodes", f"n{i}"] for i in range(300)]


def test_a_gpu_lists_at_most_256_vgpus_entries(tmp_path: Path) -> None:
    path = tmp_path / "wide.yaml"
    entries = ", ".join(f"{i}: A16-1Q" for i in range(257))
    path.write_text(
        HEAD + "spec:\n  nodes:\n    n1:\n      gpus:\n        - address: '0000:08:00.0'\n"
        f"          sriov: enabled\n          vgpus: {{{entries}}}\n"
    )
    (problem,) = validate_files([path], catalog=default_catalog())
    assert (problem.line, problem.column) == (10, 11)
    assert problem.message == (
        "spec.nodes.n1.gpus[0].vgpus: 257 entries, more than the 256 allowed"
    )


# --- problems capped per file; the note capped -----------------------------------------------


def test_a_file_broken_throughout_is_reported_by_its_first_problems_and_a_count(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broken.yaml"
    nodes = "".join(f"    n{i}: 0\n" for i in range(100))
    path.write_text(HEAD + "spec:\n  nodes:\n" + nodes)
    problems = validate_files([path], catalog=default_catalog())
    assert len(problems) == MAX_PROBLEMS_PER_FILE + 1
    assert [(p.line, p.column) for p in problems[:-1]] == [(6 + i, 5) for i in range(20)]
    assert problems[-1] == Problem("… and 80 more problems", file=str(path))


def test_the_note_on_unknown_names_lists_the_first_ones_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "names.yaml"
    # Names of no shape the catalogue knows (so no model is inferred from them).
    profiles = ", ".join(f"Zprofile{i}: 1" for i in range(NOTE_NAMES + 5))
    gpus = "".join(
        f"      - {{address: '0000:{bus:02x}:00.0', sriov: enabled, model: X{bus}, "
        "vgpus: {0: Zprofile1}}\n"
        for bus in range(NOTE_PLACES + 2)
    )
    path.write_text(
        HEAD + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        f"      - {{address: '0000:80:00.0', sriov: enabled, profiles: {{{profiles}}}}}\n" + gpus
    )
    (note,) = load_desired([path], catalog=default_catalog()).notes
    lines = note.splitlines()
    # 25 profile names (Zprofile1 again in vgpus is the same name) and 7 models.
    assert lines[0].startswith("the catalogue does not know 32 names, accepted as written")
    assert len(lines) == 1 + NOTE_NAMES + 1
    assert lines[-1] == "  … and 12 more"
    # Zprofile1 is written once in profiles and seven times in vgpus: five places, a count.
    (z1,) = [line for line in lines if ": 'Zprofile1'" in line]
    assert z1.count(str(path)) == NOTE_PLACES and " and 3 more: " in z1


# --- across the files of a directory ---------------------------------------------------------


def test_a_directory_of_too_many_files_is_one_problem(tmp_path: Path) -> None:
    for i in range(MAX_FILES + 1):
        (tmp_path / f"f{i:04d}.yaml").write_text("")
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=default_catalog(), directories=True)
    assert info.value.problems == (
        Problem("1,001 desired-state files: more than 1,000", file=str(tmp_path)),
    )


def test_files_together_larger_than_a_configmap_are_refused_at_the_file_past_it(
    tmp_path: Path,
) -> None:
    half = HEAD + "spec: {nodes: {}}\n" + "#" * (600 * 1024) + "\n"
    for name in ("a.yaml", "b.yaml", "c.yaml"):
        (tmp_path / name).write_text(half)
    with pytest.raises(ValidationError) as info:
        load_desired([tmp_path], catalog=default_catalog(), directories=True)
    assert info.value.problems == (
        Problem(
            "with the files before it, the desired state is larger than 1 MiB (the most a "
            "ConfigMap holds)",
            file=str(tmp_path / "b.yaml"),
        ),
    )
