"""The reliability scenarios' ci-size tests share their context."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.sizes import Context, ci_context


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return ci_context(tmp_path)
