"""Colour only on a terminal, and never with NO_COLOR or --no-color."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from tests.simnode import REPO, SEED, SimNode


def _run_on_tty(node: SimNode, *extra: str, env: dict[str, str] | None = None) -> str:
    master, slave = pty.openpty()
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR",)}
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "plan", str(SEED), *node.flags, *extra],
        stdout=slave, stderr=slave, stdin=slave, cwd=REPO, env=full_env,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks).decode()


def test_colour_on_a_terminal(a2_node: SimNode) -> None:
    assert "\033[" in _run_on_tty(a2_node)


@pytest.mark.parametrize(
    ("extra", "env"),
    [(("--no-color",), None), ((), {"NO_COLOR": "1"}), ((), {"VGPUCTL_NO_COLOR": "1"})],
)
def test_no_colour_when_asked(
    a2_node: SimNode, extra: tuple[str, ...], env: dict[str, str]
) -> None:
    out = _run_on_tty(a2_node, *extra, env=env)
    assert "Plan: 5 to create" in out
    assert "\033[" not in out


def test_no_colour_in_a_pipe(a2_node: SimNode) -> None:
    res = a2_node.run("plan", SEED)
    assert "\033[" not in res.stdout + res.stderr
