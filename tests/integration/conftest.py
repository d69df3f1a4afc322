"""Fixtures of the integration tests (their helpers: ``tests/simnode.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simnode import SimNode, make_sim


@pytest.fixture
def a2_node(tmp_path: Path) -> SimNode:
    """The seed's host: one A2 at 0000:08:00.0, SR-IOV off."""
    return make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
