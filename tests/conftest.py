"""Shared fixtures: the repository root and a way to run ``vgpuctl`` as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
