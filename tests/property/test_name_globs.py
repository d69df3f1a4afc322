"""A node selector's compiled globs admit exactly the names ``fnmatchcase`` admits for any one
of them (issue 28, item 3: the globs are compiled once per desired state, not per match).

The oracle is the standard library's ``fnmatchcase``, one glob at a time; the globs and names
are drawn from the alphabet the desired-state schema allows for selector names (lower-case
letters, digits, ``-``, ``.``, and the wildcards ``*``, ``?``, ``[``, ``]``, ``!``).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model import NodeSelector

GLOB_ALPHABET = "ab1-.*?[]!"
NAME_ALPHABET = "ab1-.]["

globs = st.lists(st.text(GLOB_ALPHABET, min_size=1, max_size=8), min_size=1, max_size=6)
names = st.text(NAME_ALPHABET, max_size=10)


@settings(max_examples=400, deadline=None)
@given(globs=globs, name=names)
def test_a_selector_admits_what_fnmatchcase_admits(globs: list[str], name: str) -> None:
    selector = NodeSelector(names=tuple(globs))
    assert selector.admits_name(name) == any(fnmatchcase(name, g) for g in globs)
    # Asked again (the compiled globs are kept): the same answer.
    assert selector.admits_name(name) == any(fnmatchcase(name, g) for g in globs)


def test_hand_written_cases() -> None:
    """Literal, wildcard and set globs side by side; equal selectors compare equal whether or
    not one of them has compiled its globs."""
    selector = NodeSelector(names=("gpu-1", "vdi-*", "desk-[0-9]", "lab-?", "x[!a]"))
    admitted = ["gpu-1", "vdi-", "vdi-07", "desk-4", "lab-z", "xb"]
    refused = ["gpu-10", "gpu-", "vd-1", "desk-a", "desk-10", "lab-", "lab-zz", "xa", "GPU-1"]
    assert [n for n in admitted + refused if selector.admits_name(n)] == admitted
    fresh = NodeSelector(names=selector.names)
    assert fresh == selector and fresh.key == selector.key
    assert "_globs" not in repr(selector)
    assert NodeSelector().admits_name("anything")
