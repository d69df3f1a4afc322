"""The test suite's own rule: no test module imports another test module, a conftest, or a
private name of another module under tests/. Shared helpers live in modules of their own
(``tests/simnode.py``, ``tests/watch_agent.py``, ``tests/doubles/`` …) and shared fixtures in
``tests/conftest.py``, so a test file can be read, moved or deleted on its own."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imports_of(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every import of a module under ``tests``."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
            found += [(node.lineno, node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "") for a in node.names if a.name.startswith("tests.")]
    return found


def _offence(module: str, name: str) -> str | None:
    last = module.rsplit(".", 1)[-1]
    if last.startswith("test_") or last == "conftest":
        return f"imports the test module {module}"
    if name.startswith("test_") or name == "conftest":
        return f"imports the test module {module}.{name}"
    if name.startswith("_"):
        return f"imports the private name {name} of {module}"
    return None


def test_no_test_imports_another_tests_module_or_private_helpers() -> None:
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line}: {offence}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module, name in _imports_of(path)
        if (offence := _offence(module, name)) is not None
    ]
    assert offences == []


def test_the_rule_sees_each_kind_of_offence() -> None:
    assert _offence("tests.integration.test_watch", "Watch") is not None
    assert _offence("tests.integration.conftest", "SimNode") is not None
    assert _offence("tests.unit", "test_plan") is not None
    assert _offence("tests.reliability.bad_input", "_paths") is not None
    assert _offence("tests.watch_agent", "Watch") is None
