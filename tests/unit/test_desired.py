"""The desired-state loader: YAML files in, a normalised ``Desired`` or every located problem out.

Invalid cases are files: ``tests/fixtures/desired/invalid/<case>.yaml`` ends with one
``# expect: LINE:COL: message fragment`` comment per problem, in order, and the loader must
report exactly those (a new error kind = a new file). Valid files and the shipped
``desired-state/`` examples must load to the values spelled out here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from reconciler.catalog import Catalog, default_catalog
from reconciler.desired import load_desired, load_document, schema_path, schemas, validate_files
from reconciler.desired.compose import MAX_DEPTH, MAX_NODES
from reconciler.desired.shape import _validator
from reconciler.model import (
    DesiredGpu,
    PciAddress,
    Problem,
    ReconcilerError,
    SourceLocation,
    ValidationError,
    VgpuMode,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "desired"
INVALID = sorted((FIXTURES / "invalid").glob("*.yaml"))
SHIPPED = sorted((REPO / "desired-state").rglob("*.yaml"))
_EXPECT = re.compile(r"^# expect: (\d+):(\d+): (.*)$")

HEADER = "apiVersion: vgpu.reconciler.dev/v1alpha1\nkind: VGPUDesiredState\nmetadata: {name: t}\n"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def _problems(paths: list[Path], catalog: Catalog) -> tuple[Problem, ...]:
    with pytest.raises(ValidationError) as info:
        load_desired(paths, catalog=catalog)
    return info.value.problems


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _loc(path: Path, line: int, column: int) -> SourceLocation:
    return SourceLocation(str(path), line, column)


# --- invalid files: every error kind at its exact position -------------------------------


def test_every_invalid_fixture_is_collected() -> None:
    assert len(INVALID) >= 20


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.stem)
def test_invalid_fixture_reports_exactly_the_expected_problems(
    case: Path, catalog: Catalog
) -> None:
    expected = [
        (int(m[1]), int(m[2]), m[3].replace("{dir}", str(case.parent)))
        for m in map(_EXPECT.match, case.read_text(encoding="utf-8").splitlines())
        if m
    ]
    assert expected, f"{case.name} has no '# expect:' lines"
    problems = _problems([case], catalog)
    got = [(p.line, p.column, p.message) for p in problems]
    shown = "\n".join(f"{line}:{col}: {msg}" for line, col, msg in got)
    assert len(got) == len(expected), f"got:\n{shown}"
    for (line, col, message), (e_line, e_col, fragment) in zip(got, expected, strict=True):
        assert (line, col) == (e_line, e_col), f"got:\n{shown}"
        assert fragment in message, f"got:\n{shown}"
    assert {p.file for p in problems} == {str(case)}
    # validate_files reports the same list without raising.
    assert validate_files([case], catalog=catalog) == list(problems)


def test_problem_prints_as_file_line_column_message(catalog: Catalog) -> None:
    case = FIXTURES / "invalid" / "schema-enum-and-const.yaml"
    lines = _problems([case], catalog)
    assert str(lines[2]) == (
        f"{case}:11:11: spec.nodes.harvester-kgd9c.gpus[0].sriov: "
        "'on' is not one of ['enabled', 'disabled']"
    )


def test_validation_error_counts_its_problems(catalog: Catalog) -> None:
    with pytest.raises(ValidationError) as info:
        load_desired([FIXTURES / "invalid" / "max-instances.yaml"], catalog=catalog)
    assert info.value.message == "desired state is invalid: 2 problems"
    assert len(info.value.lines()) == 2


def test_relative_paths_are_reported_as_given(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(FIXTURES / "invalid")
    problems = _problems([Path("vgpus-and-profiles.yaml")], catalog)
    assert str(problems[0]).startswith("vgpus-and-profiles.yaml:13:11: 'vgpus' and 'profiles'")


# --- files that are not YAML documents ----------------------------------------------------


def test_a_directory_instead_of_a_file(catalog: Catalog, tmp_path: Path) -> None:
    (problem,) = _problems([tmp_path], catalog)
    assert problem == Problem("is a directory, not a desired-state file", file=str(tmp_path))


def test_a_missing_file(catalog: Catalog, tmp_path: Path) -> None:
    (problem,) = _problems([tmp_path / "nope.yaml"], catalog)
    assert problem.file == str(tmp_path / "nope.yaml")
    assert problem.message == "cannot read: No such file or directory"


def test_a_path_through_a_file(catalog: Catalog, tmp_path: Path) -> None:
    parent = _write(tmp_path, "plain.yaml", HEADER)
    (problem,) = _problems([parent / "x.yaml"], catalog)
    assert problem == Problem("cannot read: Not a directory", file=str(parent / "x.yaml"))


def test_a_huge_file_is_not_read_whole(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as stream:
        stream.truncate(64 * 1024 * 1024)  # sparse: costs no disk
    (problem,) = _problems([path], catalog)
    assert problem == Problem("larger than 1 MiB", file=str(path))


def test_an_unreadable_file(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path, "secret.yaml", HEADER)
    path.chmod(0)
    if os.geteuid() == 0:
        # root reads a mode-000 file anyway: make the open fail as it does for anyone else.
        real_open = os.open

        def denied(file: object, *args: object, **kwargs: object) -> int:
            if file == path:
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", denied)
    (problem,) = _problems([path], catalog)
    assert problem.message == "cannot read: Permission denied"


def test_an_empty_file(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "empty.yaml", b"")
    (problem,) = _problems([path], catalog)
    assert (problem.line, problem.column) == (1, 1)
    assert problem.message.startswith("empty document")


def test_binary_junk(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "junk.yaml", b"\x00\x01\x02ELF\x00\x00")
    (problem,) = _problems([path], catalog)
    assert (problem.line, problem.column) == (1, 1)
    assert problem.message.startswith("not a text file: character U+0000 is not allowed")


def test_non_utf8_bytes_are_located(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "latin1.yaml", "apiVersion: x\nkind: café\n".encode("latin-1"))
    (problem,) = _problems([path], catalog)
    assert (problem.line, problem.column) == (2, 10)
    assert problem.message == "not UTF-8 text: byte 0xe9 cannot be decoded (is this a binary file?)"


def test_a_utf8_byte_order_mark_is_accepted(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "bom.yaml", b"\xef\xbb\xbf" + (HEADER + "spec: {nodes: {}}\n").encode())
    assert load_desired([path], catalog=catalog).nodes == {}


def test_two_documents_in_one_file(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "two.yaml", HEADER + "spec: {nodes: {}}\n---\n" + HEADER)
    (problem,) = _problems([path], catalog)
    assert (problem.line, problem.column) == (5, 1)
    assert "expected a single document in the stream" in problem.message


def test_an_unknown_yaml_tag(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "tag.yaml", HEADER + "spec: {nodes: !!python/object:os.system x}\n")
    problems = _problems([path], catalog)
    tag = [p for p in problems if "!!python/object:os.system" in p.message]
    assert [(p.line, p.column) for p in tag] == [(4, 15)]
    assert tag[0].message.startswith(
        "unsupported YAML: tag !!python/object:os.system is not supported on text"
    )


def test_deep_nesting_is_an_error_not_a_crash(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(tmp_path, "deep.yaml", "a: " + "[" * 999 + "]" * 999 + "\n")
    (problem,) = _problems([path], catalog)
    # The mapping is level 1; the 20th '[' (column 3 + 20) opens level 21.
    assert MAX_DEPTH == 20
    assert (problem.line, problem.column) == (1, 23)
    assert problem.message == "nested deeper than 20 levels"


def test_nesting_past_libyamls_own_limit_is_the_same_error(
    catalog: Catalog, tmp_path: Path
) -> None:
    """libyaml 0.2.5 (in PyYAML 6.0.4's wheels) refuses 1,000 levels itself while scanning
    ahead, before the composer sees level 21: said in the same words, where libyaml stopped
    (column 1,003) or, with an older libyaml, at the 21st level (column 23)."""
    path = _write(tmp_path, "deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    (problem,) = _problems([path], catalog)
    assert problem.message == "nested deeper than 20 levels"
    assert (problem.line, problem.column) in ((1, 23), (1, 1003))


def test_an_alias_bomb_is_refused(catalog: Catalog, tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = _write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    (problem,) = _problems([path], catalog)
    # a4 stands for 1 + 10 × 11,111 = 111,111 nodes; a5's first *a4 takes the document past
    # 150,000 (123,463 nodes before it, keys included).
    assert MAX_NODES == 150_000
    assert (problem.line, problem.column) == (6, 10)
    assert problem.message == (
        "document too large: more than 150,000 YAML nodes by this alias *a4 (it repeats "
        "111,111 nodes); aliases count as every node they repeat"
    )


def test_no_files_at_all(catalog: Catalog) -> None:
    assert _problems([], catalog) == (Problem("no desired-state files given"),)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=200),
        st.lists(
            st.sampled_from(
                [
                    "apiVersion: vgpu.reconciler.dev/v1alpha1\n",
                    "kind: VGPUDesiredState\n",
                    "metadata: {name: x}\n",
                    "spec:\n",
                    "  nodes:\n",
                    "    n1:\n",
                    "      gpus:\n",
                    "        - address: '0000:08:00.0'\n",
                    "          sriov: enabled\n",
                    "          model: A2\n",
                    "          vgpus: {0: A2-4Q, 99: x}\n",
                    "          profiles: {A2-4Q: 9}\n",
                    "          vgpus:\n",
                    "            0: A2-2Q\n",
                    "  - [\n",
                    "&a *a <<: \n",
                    ": : :\n",
                    "\t\x00\n",
                ]
            ),
            max_size=14,
        ).map("".join),
    )
)
def test_any_input_gives_problems_never_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, content: bytes | str
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    problems = validate_files([path], catalog=default_catalog())
    assert all(p.file == str(path) for p in problems)


# --- valid files load to the expected values ---------------------------------------------


def test_the_seed_node_file(catalog: Catalog) -> None:
    path = REPO / "desired-state" / "harvester-kgd9c.yaml"
    desired = load_desired([path], catalog=catalog)
    assert desired.name == "harvester-kgd9c"
    assert desired.files == (str(path),)
    assert list(desired.nodes) == ["harvester-kgd9c"]
    node = desired.nodes["harvester-kgd9c"]
    (gpu,) = node.gpus
    a = PciAddress.parse
    assert gpu == DesiredGpu(
        address=a("0000:08:00.0"),
        sriov=True,
        model="NVIDIA A2",
        vgpus={
            a("0000:08:00.4"): "NVIDIA A2-4A",
            a("0000:08:00.5"): "NVIDIA A2-4Q",
            a("0000:08:00.6"): "NVIDIA A2-4A",
            a("0000:08:00.7"): "NVIDIA A2-4Q",
        },
        profiles=None,
        location=_loc(path, 19, 11),
        entry_locations={
            a("0000:08:00.4"): _loc(path, 23, 13),
            a("0000:08:00.5"): _loc(path, 24, 13),
            a("0000:08:00.6"): _loc(path, 25, 13),
            a("0000:08:00.7"): _loc(path, 26, 13),
        },
    )
    assert node.gpu(a("0000:08:00.0")) is gpu


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_desired_state_file_validates(catalog: Catalog, path: Path) -> None:
    assert validate_files([path], catalog=catalog) == []


def test_the_shipped_files_validate_together(catalog: Catalog) -> None:
    assert len(SHIPPED) >= 4
    desired = load_desired(SHIPPED, catalog=catalog)
    assert "harvester-kgd9c" in desired.nodes


def test_the_l40s_example_in_count_form(catalog: Catalog) -> None:
    path = REPO / "desired-state" / "examples" / "l40s-count-form.yaml"
    node = load_desired([path], catalog=catalog).nodes["gpu-worker-01"]
    assert [(str(g.address), g.model, g.vgpus, g.profiles) for g in node.gpus] == [
        ("0000:41:00.0", "NVIDIA L40S", None, {"NVIDIA L40S-8Q": 4, "NVIDIA L40S-8C": 2}),
        ("0000:c1:00.0", "NVIDIA L40S", None, {"NVIDIA L40S-24C": 2}),
    ]


def test_the_l40s_mixed_size_example(catalog: Catalog) -> None:
    path = REPO / "desired-state" / "examples" / "l40s-mixed-size.yaml"
    [gpu] = load_desired([path], catalog=catalog).nodes["gpu-worker-02"].gpus
    assert (str(gpu.address), gpu.mode, gpu.profiles) == (
        "0000:41:00.0",
        VgpuMode.MIXED_SIZE,
        {"NVIDIA L40S-8Q": 1, "NVIDIA L40S-16Q": 1},
    )
    # Without ``mode:``, equal-size (the driver's default).
    other = load_desired(
        [REPO / "desired-state" / "examples" / "l40s-count-form.yaml"], catalog=catalog
    )
    assert {g.mode for g in other.nodes["gpu-worker-01"].gpus} == {VgpuMode.EQUAL_SIZE}


def test_the_a16_example_with_short_names_and_index_keys(catalog: Catalog) -> None:
    path = REPO / "desired-state" / "examples" / "a16-board.yaml"
    node = load_desired([path], catalog=catalog).nodes["vdi-node-a"]
    assert [str(g.address) for g in node.gpus] == [
        "0000:89:00.0",
        "0000:8a:00.0",
        "0000:8b:00.0",
        "0000:8c:00.0",
    ]
    assert {g.model for g in node.gpus} == {"NVIDIA A16"}
    assert node.gpus[0].vgpus == dict.fromkeys(range(6), "NVIDIA A16-2B")
    assert node.gpus[1].vgpus == dict.fromkeys(range(4), "NVIDIA A16-4Q")
    assert node.gpus[2].vgpus == {0: "NVIDIA A16-16Q"}
    assert (node.gpus[3].sriov, node.gpus[3].vgpus, node.gpus[3].profiles) == (False, None, None)


def test_short_forms_are_normalised(catalog: Catalog) -> None:
    path = FIXTURES / "valid" / "short-forms.yaml"
    desired = load_desired([path], catalog=catalog)
    gpus = desired.nodes["node-1"].gpus
    a = PciAddress.parse
    # Upper case and unquoted addresses, short model and profile names, index keys as ints.
    assert gpus[0].address == a("0000:0a:00.0")
    assert str(gpus[0].address) == "0000:0a:00.0"
    assert gpus[0].model == "NVIDIA A2"
    assert gpus[0].vgpus == {
        0: "NVIDIA A2-2B",
        1: "NVIDIA A2-2Q",
        a("0000:0a:00.6"): "NVIDIA A2-2Q",
    }
    assert all(type(k) is int for k in list(gpus[0].vgpus)[:2])
    assert gpus[0].entry_locations == {
        0: _loc(path, 17, 13),
        1: _loc(path, 18, 13),
        a("0000:0a:00.6"): _loc(path, 19, 13),
    }
    assert gpus[0].location_of(1) == _loc(path, 18, 13)
    assert gpus[0].location_of(7) == _loc(path, 13, 11)  # not written: the GPU's place
    assert isinstance(gpus[0].vgpus, MappingProxyType)
    # Count form: long names, no vgpus.
    assert (gpus[1].vgpus, gpus[1].profiles) == (
        None,
        {"NVIDIA L40S-8Q": 4, "NVIDIA L40S-8C": 2},
    )
    assert gpus[1].model is None
    # SR-IOV on with nothing named: VFs without vGPUs.
    assert (gpus[2].sriov, gpus[2].vgpus, gpus[2].profiles) == (True, {}, None)
    # SR-IOV off.
    assert (gpus[3].sriov, gpus[3].vgpus, gpus[3].profiles) == (False, None, None)
    # A GPU the catalogue does not know passes with what needs no catalogue.
    assert gpus[4].vgpus == {0: "NVIDIA RTXA6000-4Q", 40: "NVIDIA RTXA6000-4Q"}


def test_names_the_catalogue_does_not_know_are_accepted_and_said_once(catalog: Catalog) -> None:
    """No name a driver could offer is refused for its shape (docs/domain.md §4): a GPU or profile
    the catalogue lacks passes validation, and one note names every one of them."""
    path = FIXTURES / "valid" / "unknown-names.yaml"
    desired = load_desired([path], catalog=catalog)
    gpus = desired.nodes["n1"].gpus
    assert gpus[0].model == "NVIDIA RTX 5880 Ada"
    assert gpus[0].vgpus == {0: "NVIDIA RTX 5880 Ada-48C"}
    assert gpus[1].vgpus == {
        0: "NVIDIA RTX Pro 6000 Blackwell DC-4-96Q",
        1: "NVIDIA RTX Pro 6000 Blackwell DC-1-24CGFX",
    }
    assert gpus[2].vgpus == {0: "NVIDIA A2-3Q", 1: "NVIDIA A2 4Q"}
    # A catalogue profile written short takes the catalogue's spelling (the A100's is GRID).
    assert gpus[4].profiles == {"GRID A100-1-5CME": 1}
    assert desired.notes == (
        "the catalogue does not know 7 names, accepted as written: plan checks them against "
        "what the host offers\n"
        f"  {path}:12:11: model 'NVIDIA RTX 5880 Ada'\n"
        f"  {path}:15:13: 'NVIDIA RTX 5880 Ada-48C'\n"
        f"  {path}:19:13: 'NVIDIA RTX Pro 6000 Blackwell DC-4-96Q'\n"
        f"  {path}:20:13: 'NVIDIA RTX Pro 6000 Blackwell DC-1-24CGFX'\n"
        f"  {path}:25:13: 'NVIDIA A2-3Q' (NVIDIA A2 is listed with A2-1A 2A 4A 8A 16A 1B 2B 4C "
        "8C 16C 1Q 2Q 4Q 8Q 16Q)\n"
        f"  {path}:26:13: 'A2 4Q' (did you mean 'NVIDIA A2-4Q'?)\n"
        f"  {path}:28:11: model 'NVIDIA A3' (did you mean 'NVIDIA A2'?)",
    )


def test_a_file_the_catalogue_knows_throughout_has_no_note(catalog: Catalog) -> None:
    assert load_desired([FIXTURES / "valid" / "anchors.yaml"], catalog=catalog).notes == ()


def test_anchors_and_merge_keys(catalog: Catalog) -> None:
    path = FIXTURES / "valid" / "anchors.yaml"
    desired = load_desired([path], catalog=catalog)
    first = desired.nodes["node-1"].gpus[0]
    alias, merged = desired.nodes["node-2"].gpus
    assert alias == first
    assert merged.address == PciAddress.parse("0000:09:00.0")
    assert (merged.model, merged.vgpus) == ("NVIDIA A2", {0: "NVIDIA A2-4Q"})
    assert merged.location == _loc(path, 18, 11)


def test_a_problem_in_an_anchored_node_is_reported_once(catalog: Catalog, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "alias.yaml",
        HEADER
        + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        + "        - &g\n          address: '0000:08:00.0'\n"
        + "          sriov: enabled\n          sriov: enabled\n"
        + "    n2:\n      gpus: [*g, {<<: *g, address: '0000:09:00.0'}]\n",
    )
    (problem,) = _problems([path], catalog)
    assert str(problem) == (
        f"{path}:11:11: duplicate key 'sriov' in spec.nodes.n1.gpus[0] (first given at line 10)"
    )


def test_yaml_1_1_surprises_are_read_as_written(catalog: Catalog, tmp_path: Path) -> None:
    # YAML 1.1 makes `on` a boolean and 0000:08:00.0 a sexagesimal number; we read YAML 1.2.
    path = _write(
        tmp_path,
        "plain.yaml",
        HEADER
        + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        + "        - address: 0000:08:00.0\n          sriov: enabled\n"
        + "          profiles: {A2-4Q: 0x2}\n"
        + "        - address: 0000:09:00.0\n          sriov: on\n",
    )
    (problem,) = _problems([path], catalog)
    assert problem.message.endswith("sriov: 'on' is not one of ['enabled', 'disabled']")
    path.write_text(path.read_text().replace("sriov: on", "sriov: disabled"), encoding="utf-8")
    gpus = load_desired([path], catalog=catalog).nodes["n1"].gpus
    assert [str(g.address) for g in gpus] == ["0000:08:00.0", "0000:09:00.0"]
    assert gpus[0].profiles == {"NVIDIA A2-4Q": 2}


# --- several files ------------------------------------------------------------------------


def test_nodes_merge_across_files(catalog: Catalog) -> None:
    first = FIXTURES / "multi" / "node-a-first-gpu.yaml"
    second = FIXTURES / "multi" / "node-a-second-gpu.yaml"
    desired = load_desired([first, second], catalog=catalog)
    assert desired.name == "lab"  # the first file's name
    assert desired.files == (str(first), str(second))
    assert list(desired.nodes) == ["node-a", "node-b"]
    node_a = desired.nodes["node-a"]
    assert [str(g.address) for g in node_a.gpus] == ["0000:08:00.0", "0000:09:00.0"]
    assert node_a.location == _loc(first, 7, 5)
    assert node_a.gpus[1].location == _loc(second, 9, 11)
    assert desired.nodes["node-b"].gpus[0].profiles == {"NVIDIA A2-8Q": 2}


def test_the_same_gpu_in_two_files_names_both_places(catalog: Catalog) -> None:
    first = FIXTURES / "multi" / "node-a-first-gpu.yaml"
    again = FIXTURES / "multi" / "node-a-first-gpu-again.yaml"
    (problem,) = _problems([first, again], catalog)
    assert str(problem) == (
        f"{again}:9:11: GPU 0000:08:00.0 on node node-a is already defined at {first}:9:11"
    )


def test_problems_of_several_files_come_in_file_order(catalog: Catalog, tmp_path: Path) -> None:
    later = FIXTURES / "invalid" / "vgpus-and-profiles.yaml"
    earlier = FIXTURES / "invalid" / "schema-enum-and-const.yaml"
    problems = _problems([later, tmp_path, earlier], catalog)
    assert [(p.file, p.line) for p in problems] == [
        (str(later), 13),
        (str(tmp_path), None),
        (str(earlier), 3),
        (str(earlier), 4),
        (str(earlier), 11),
        (str(earlier), 13),
    ]


# --- a desired state given as data (the copy a saved plan carries) -----------------------


def test_load_document_checks_data_like_a_file_without_positions(catalog: Catalog) -> None:
    document = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "n1"},
        "spec": {
            "nodes": {
                "n1": {
                    "gpus": [
                        {
                            "address": "0000:08:00.0",
                            "model": "NVIDIA A2",
                            "sriov": "enabled",
                            "vgpus": {0: "A2-4Q", "0000:08:00.5": "NVIDIA A2-4A"},
                        }
                    ]
                }
            }
        },
    }
    desired = load_document(document, source="plan.json#desiredState", catalog=catalog)
    assert desired.files == ("plan.json#desiredState",)
    (gpu,) = desired.nodes["n1"].gpus
    assert gpu == DesiredGpu(
        address=PciAddress.parse("0000:08:00.0"),
        sriov=True,
        model="NVIDIA A2",
        vgpus={0: "NVIDIA A2-4Q", PciAddress.parse("0000:08:00.5"): "NVIDIA A2-4A"},
    )
    assert desired.nodes["n1"].location is None


def test_load_document_problems_name_the_source_without_a_line(catalog: Catalog) -> None:
    document = {
        "apiVersion": "vgpu.reconciler.dev/v1alpha1",
        "kind": "VGPUDesiredState",
        "metadata": {"name": "n1", "extra": 1},
        "spec": {
            "nodes": {
                "n1": {
                    "gpus": [
                        {"address": "0000:08:00.0", "sriov": "enabled", "vgpus": {0: "A2-4Q"}},
                        {
                            "address": "0000:09:00.0",
                            "sriov": "enabled",
                            "vgpus": {0: "A2-4Q", 1: "A2-2Q"},
                        },
                        {"address": "0000:08:00.0", "sriov": "disabled"},
                    ]
                }
            }
        },
    }
    with pytest.raises(ValidationError) as info:
        load_document(document, source="saved.json", catalog=catalog)
    assert [str(p) for p in info.value.problems] == [
        "saved.json: unknown field 'extra' at metadata (allowed: name)",
        "saved.json: mixed framebuffer sizes on GPU 0000:09:00.0: 'NVIDIA A2-2Q' (2 GB) and "
        "'NVIDIA A2-4Q' (4 GB, line ?); time-sliced vGPUs on one GPU share one size "
        "(equal-size mode)",
        "saved.json: GPU 0000:08:00.0 on node n1 is already defined at saved.json",
    ]


# --- the VF count check on its own (no catalogue model has maxInstances above its VFs) ----


def test_more_vgpus_than_vfs_with_a_maximum_above_the_vf_count(tmp_path: Path) -> None:
    catalog = Catalog.from_json(
        {
            "models": [
                {
                    "name": "NVIDIA X1",
                    "short": "X1",
                    "pciIds": [{"vendor": "10de", "device": "ffff"}],
                    "framebufferMiB": 8192,
                    "vfs": 4,
                    "vfOffset": 2,
                    "vfStride": 1,
                    "profiles": [
                        {
                            "name": "NVIDIA X1-1Q",
                            "series": "Q",
                            "framebufferMiB": 1024,
                            "maxInstances": 8,
                        }
                    ],
                }
            ]
        }
    )
    path = _write(
        tmp_path,
        "x1.yaml",
        HEADER
        + "spec:\n  nodes:\n    n1:\n      gpus:\n"
        + "        - address: '0000:08:00.0'\n          sriov: enabled\n"
        + "          profiles: {X1-1Q: 6}\n",
    )
    (problem,) = _problems([path], catalog)
    assert (problem.line, problem.column) == (10, 22)
    assert problem.message == (
        "6 vGPUs requested on GPU 0000:08:00.0, but NVIDIA X1 has 4 VFs (one vGPU per VF)"
    )


# --- the schema ---------------------------------------------------------------------------


def _schema() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(
        schema_path("desired-state.schema.json").read_text(encoding="utf-8")
    )
    return loaded


def test_the_schema_is_valid_draft_2020_12() -> None:
    schema = _schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def _object_schemas(node: object, where: str = "#") -> list[tuple[str, dict[str, object]]]:
    found: list[tuple[str, dict[str, object]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((where, node))
        for key, value in node.items():
            found += _object_schemas(value, f"{where}/{key}")
    return found


def test_every_property_has_a_description_and_unknown_fields_are_refused() -> None:
    objects = _object_schemas(_schema())
    assert len(objects) >= 7
    for where, schema in objects:
        properties = schema.get("properties")
        if isinstance(properties, dict):
            # A record: fixed fields only.
            assert schema.get("additionalProperties") is False, where
            for name, prop in properties.items():
                assert isinstance(prop, dict), f"{where}/{name}"
                assert prop.get("description") or "$ref" in prop, f"{where}/{name}"
        else:
            # A map: its keys and values are documented.
            for part in ("propertyNames", "additionalProperties"):
                sub = schema.get(part)
                assert isinstance(sub, dict), f"{where}/{part}"
                assert sub.get("description") or "$ref" in sub, f"{where}/{part}"


def test_the_validator_is_compiled_once() -> None:
    assert _validator() is _validator()


def test_schema_path_in_a_source_checkout() -> None:
    assert (
        schema_path("desired-state.schema.json") == REPO / "schemas" / "desired-state.schema.json"
    )


def test_schema_path_prefers_the_installed_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "reconciler" / "_schemas").mkdir(parents=True)
    installed = _write(tmp_path / "reconciler" / "_schemas", "plan.schema.json", "{}")
    monkeypatch.setattr(schemas, "__file__", str(tmp_path / "reconciler" / "desired" / "s.py"))
    assert schema_path("plan.schema.json") == installed


def test_schema_path_names_both_places_when_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(schemas, "__file__", str(tmp_path / "a" / "b" / "schemas.py"))
    with pytest.raises(ReconcilerError) as info:
        schema_path("desired-state.schema.json")
    message = info.value.message
    assert str(tmp_path / "a" / "_schemas" / "desired-state.schema.json") in message
    assert str(tmp_path / "schemas" / "desired-state.schema.json") in message


@pytest.mark.parametrize("name", ["", "../pyproject.toml", "crds/x.json"])
def test_schema_path_takes_bare_names_only(name: str) -> None:
    with pytest.raises(ValueError, match="bare file name"):
        schema_path(name)


# --- start-up cost ------------------------------------------------------------------------


def test_importing_the_package_loads_neither_yaml_nor_jsonschema() -> None:
    code = (
        "import sys, reconciler.desired\n"
        "heavy = {'yaml', 'jsonschema', 'difflib'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_an_integer_python_cannot_convert_is_a_located_problem(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = _write(
        tmp_path, "big.yaml", HEADER + "spec:\n  nodes:\n    n1:\n      gpus: !!int 0o9\n"
    )
    problems = _problems([path], catalog)
    assert any(p.line is not None and "is not an integer" in p.message for p in problems)


def test_control_characters_in_the_input_are_escaped_in_messages(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = _write(
        tmp_path, "ctl.yaml", HEADER + 'spec:\n  nodes:\n    n1:\n      "gp\\nus\\x1b[31m": []\n'
    )
    problems = _problems([path], catalog)
    assert problems
    for problem in problems:
        assert "\n" not in str(problem) and "\x1b" not in str(problem)


# --- quoting: no problem carries more than an excerpt of the file -----------------------------

#: 300 characters no message may carry whole: a secret read through some mistake, say.
LONG = "Q1w2E3r4T5" * 30


@pytest.mark.parametrize(
    "text",
    [
        f"{LONG}: 1\n",  # an unknown top-level field
        f"{HEADER}spec: {{nodes: {{n1: {{gpus: [{{address: '0000:08:00.0', "
        f"sriov: {LONG}}}]}}}}}}\n",
        f"{HEADER}spec: {{nodes: {{'{LONG}': {{gpus: []}}}}}}\n",  # a bad node name, in paths
        f"{HEADER}spec:\n  nodes:\n    n1:\n      gpus:\n        - address: '0000:08:00.0'\n"
        f"          sriov: enabled\n          profiles: {{'{LONG}': 1, 'NVIDIA {LONG}': 1}}\n",
        f"{HEADER}kind: *{LONG}\n",  # an undefined alias: PyYAML's words quote it
        f"{HEADER}spec: !{LONG} x\n",  # an unknown tag
        f"a: 1\na: {LONG}\n{LONG}: 2\n{LONG}: 3\n",  # a duplicate key
    ],
    ids=["field", "enum", "node-name", "profiles", "alias", "tag", "duplicate"],
)
def test_no_problem_quotes_more_than_an_excerpt_of_the_file(
    catalog: Catalog, tmp_path: Path, text: str
) -> None:
    path = _write(tmp_path, "x.yaml", text)
    problems = validate_files([path], catalog=catalog)
    assert problems
    for problem in problems:
        for start in range(len(LONG) - 81):
            assert LONG[start : start + 81] not in problem.message, problem.message


def test_a_gpu_repeated_across_nodes_is_judged_at_each_place(
    catalog: Catalog, tmp_path: Path
) -> None:
    """A fleet repeats its GPUs node after node: each copy of a broken GPU is reported where it
    is written (a clean layout may be judged once; a broken one never stands for another)."""
    gpu = '      gpus: [{address: "0000:08:00.0", sriov: enabled, profiles: {A2-4Q: 5}}]\n'
    text = HEADER + "spec:\n  nodes:\n" + "".join(f"    n{i}:\n{gpu}" for i in range(3))
    problems = _problems([_write(tmp_path, "fleet.yaml", text)], catalog)
    assert [(p.line, p.message.split(",")[0]) for p in problems] == [
        (line, "5 vGPUs of 4 GB on GPU 0000:08:00.0") for line in (7, 9, 11)
    ]
    fine = text.replace("A2-4Q: 5", "A2-4Q: 4")
    assert validate_files([_write(tmp_path, "fine.yaml", fine)], catalog=catalog) == []
