"""Every explicit YAML tag in every position of a desired state: a located problem or a clean
acceptance, never an internal error.

The positions come from the shipped examples (``desired-state/``): every value and every key
of their node graphs, one per place in the schema (``spec.nodes.*.gpus[].vgpus.*`` once, not
per VF), checked to cover every field ``schemas/desired-state.schema.json`` defines. At each
one the written text is replaced by ``TAG VALUE`` for every tag YAML 1.1 and 1.2 define, a
local tag and a verbatim one, and odd values; ``vgpuctl validate`` (its ``main``, in process)
must exit 0, or exit 1 with every line located in the file. The reliability suite found three
such documents by chance (``nodes: {n1: !!bool maybe}`` among them); this finds them all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from reconciler.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "desired-state").rglob("*.yaml"))
SCHEMA = json.loads((REPO / "schemas" / "desired-state.schema.json").read_text(encoding="utf-8"))

TAGS = (
    "!!bool", "!!int", "!!float", "!!null", "!!str", "!!binary", "!!timestamp", "!!set",
    "!!omap", "!!pairs", "!!seq", "!!map", "!!merge", "!foo", "!<tag:example.com,2000:x>",
)  # fmt: skip
ODD_VALUES = ("maybe", "''", "[]", "{}")
#: Tags this reader never builds a value from: wherever they are written, that place is named.
REFUSED = ("!!binary", "!!timestamp", "!!set", "!!omap", "!!pairs", "!foo", "!<tag:")
LOCATED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): \S")


@dataclass(frozen=True, slots=True)
class Position:
    """One place in an example: a key or a value, as the span of text it was written in."""

    example: Path
    key: bool
    #: Where it is in the schema: mapping keys of maps (node names, VFs, profiles) and list
    #: indexes generalised to ``*`` and ``[]``.
    place: str
    start: int
    end: int
    line: int
    column: int


def _general(path: tuple[str, ...], part: str, *, in_map: bool) -> tuple[str, ...]:
    return (*path, "*" if in_map else part)


def _positions(example: Path) -> Iterator[Position]:
    text = example.read_text(encoding="utf-8")
    root = yaml.compose(text, Loader=yaml.SafeLoader)

    def walk(node: yaml.Node, path: tuple[str, ...]) -> Iterator[Position]:
        yield _position(example, node, path, key=False)
        if isinstance(node, yaml.MappingNode):
            # Fixed-field records are named by field, maps (nodes, vgpus, profiles, labels) by
            # "*".
            in_map = bool(path) and path[-1] in ("nodes", "vgpus", "profiles", "labels")
            for key, value in node.value:
                child = _general(path, str(key.value), in_map=in_map)
                yield _position(example, key, child, key=True)
                yield from walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                yield from walk(item, (*path, "[]"))

    yield from walk(root, ())


def _position(example: Path, node: yaml.Node, path: tuple[str, ...], *, key: bool) -> Position:
    place = ".".join(path) or "(document)"
    return Position(
        example,
        key,
        place,
        node.start_mark.index,
        node.end_mark.index,
        node.start_mark.line + 1,
        node.start_mark.column + 1,
    )


def _unique_positions() -> list[Position]:
    seen: dict[tuple[bool, str], Position] = {}
    for example in EXAMPLES:
        for position in _positions(example):
            seen.setdefault((position.key, position.place), position)
    return list(seen.values())


POSITIONS = _unique_positions()


def _schema_places(schema: dict[str, object], path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every place the schema defines, spelt as :class:`Position` spells places."""
    defs = SCHEMA["$defs"]
    assert isinstance(defs, dict)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        yield from _schema_places({**defs[ref.rsplit("/", 1)[-1]], **schema, "$ref": None}, path)
        return
    yield ".".join(path) or "(document)"
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for name, sub in properties.items():
            yield from _schema_places(sub, (*path, name))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _schema_places(extra, (*path, "*"))
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _schema_places(items, (*path, "[]"))


def test_the_examples_cover_every_place_of_the_schema() -> None:
    covered = {p.place for p in POSITIONS}
    missing = set(_schema_places(SCHEMA)) - covered
    assert not missing, f"no shipped example writes {sorted(missing)}: add one"
    # Keys too: every field name, node name, VF key (address and index) and profile name.
    assert {p.place for p in POSITIONS if p.key} >= {
        "apiVersion", "kind", "metadata", "metadata.name", "spec", "spec.nodes",
        "spec.nodes.*", "spec.nodes.*.gpus", "spec.nodes.*.gpus.[].address",
        "spec.nodes.*.gpus.[].model", "spec.nodes.*.gpus.[].sriov",
        "spec.nodes.*.gpus.[].vgpus", "spec.nodes.*.gpus.[].vgpus.*",
        "spec.nodes.*.gpus.[].profiles", "spec.nodes.*.gpus.[].profiles.*",
    }  # fmt: skip


def _cases() -> Iterator[tuple[Position, str, str]]:
    for position in POSITIONS:
        for tag in TAGS:
            for value in ODD_VALUES:
                yield position, tag, value


@pytest.mark.parametrize(
    ("position", "tag", "value"),
    list(_cases()),
    ids=lambda v: v.place + (":key" if v.key else "") if isinstance(v, Position) else str(v),
)
def test_a_tag_anywhere_is_a_located_problem_or_accepted(
    position: Position,
    tag: str,
    value: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = position.example.read_text(encoding="utf-8")
    written = text[position.start : position.end]
    # Keep what followed the node (a block node's span runs to the next line's indentation).
    tail = written[len(written.rstrip()) :]
    changed = text[: position.start] + f"{tag} {value}" + tail + text[position.end :]
    path = tmp_path / "tagged.yaml"
    path.write_text(changed, encoding="utf-8")

    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    shown = f"{tag} {value} at {position.place} ({position.example.name}):\n{err}"
    assert "internal error" not in err and "Traceback" not in err, shown
    if code == 0:
        assert out.startswith(f"{path}: valid"), shown
        assert tag in ("!!str", "!!merge") or not tag.startswith(REFUSED), shown
        return
    assert code == 1, shown
    lines = err.splitlines()
    assert lines, shown
    lines_in_file = changed.count("\n") + 1
    for line in lines:
        if line.startswith(f"{path}: … and "):
            continue  # how many more there are
        m = LOCATED.match(line)
        assert m is not None and m["file"] == str(path), shown
        assert 1 <= int(m["line"]) <= lines_in_file, shown
    if tag.startswith(REFUSED):
        # The place the tag was written is named (as an unsupported tag, or as a key that is
        # not text when the tagged value is a list or mapping).
        at = f"{path}:{position.line}:{position.column}: "
        assert any(ln.startswith(at) for ln in lines), shown
