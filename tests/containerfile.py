"""The Containerfile's instructions as (INSTRUCTION, rest) pairs, continuation lines joined and
comments left out: read by the tests of its install steps and of its supply chain."""

from __future__ import annotations

from tests.simnode import REPO

CONTAINERFILE = REPO / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out
