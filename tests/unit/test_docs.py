"""The design the code cites lives in the repository, and says what the code does.

Docstrings and comments cite ``docs/domain.md §N`` (the domain facts) and
``docs/architecture.md``: every cited section exists, no citation points at a document outside
the repository, and the layer picture of docs/architecture.md is the one import-linter enforces
(pyproject.toml), each layer's packages in the same order.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOMAIN = REPO / "docs" / "domain.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
CITING = ("reconciler", "tests", "schemas", "deploy", "docs", "README.md", "CONTRIBUTING.md")


def _tracked_text() -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-files", "--", *CITING], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    out = {}
    for name in names:
        try:
            out[name] = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary fixtures; a file deleted in the work tree
    return out


def _sections() -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+[a-z]?)\. ", DOMAIN.read_text(), re.MULTILINE))


def test_domain_has_its_sections_and_their_sources() -> None:
    text = DOMAIN.read_text()
    assert _sections() >= {"1", "2", "3", "3a", "3b", "4", "5", "6", "6a", "7", "8", "9", "10"}
    assert text.count("\nSources: ") == 11  # one per numbered section


def test_every_cited_section_exists() -> None:
    sections = _sections()
    cite = re.compile(r"docs/domain\.md (?:§|section )(\d+[a-z]?)((?:(?:, | and |/)§?\d+[a-z]?)*)")
    missing = []
    for name, text in _tracked_text().items():
        for match in cite.finditer(text):
            for number in [match[1], *re.findall(r"\d+[a-z]?", match[2])]:
                if number not in sections:
                    missing.append(f"{name}: §{number}")
    assert missing == []


def test_no_citation_of_a_document_outside_the_repository() -> None:
    outside = re.compile(r"(?<![\w/.])(DOMAIN|ARCHITECTURE|STYLE)\.md")
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for name, text in _tracked_text().items()
        for m in outside.finditer(text)
    ]
    assert found == []


def test_the_layer_picture_is_import_linters() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (layers,) = (
        c["layers"] for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"
    )
    picture = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("```")[1]
    drawn = [
        re.findall(r"reconciler\.\w+", line)
        for line in picture.splitlines()
        if "reconciler." in line
    ]
    enforced = [re.findall(r"reconciler\.\w+", layer) for layer in layers]
    # Every enforced layer is drawn, in order (the picture may show a layer a branch adds).
    position = 0
    for layer in enforced:
        assert layer in drawn[position:], f"{layer} not drawn below {drawn[:position]}"
        position = drawn.index(layer, position) + 1
    packages = {p.name for p in (REPO / "reconciler").iterdir() if (p / "__init__.py").exists()}
    assert packages - {p.split(".")[1] for layer in drawn for p in layer} == set()
