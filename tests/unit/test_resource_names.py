"""A vGPU type's Kubernetes resource name is the one Harvester gives it (issue 30, item 5).

harvester/pcidevices ``pkg/util/common/common.go`` ``GeneratevGPUDeviceName`` (bdd8025) trims
the name (``strings.TrimSpace``), makes each ``/`` and then each ``.`` a ``_``, then each *run*
of whitespace (Go's ``\\s+``: ``[\\t\\n\\f\\r ]``) one ``_``; its last regexp, written
``^a-zA-Z0-9_-.]+``, lacks the ``[`` of a class and removes only that literal text. VMs on
Harvester ask for that name, so vgpuctl's device plugin, allow-list entries and readers of
Harvester's objects must use it. The expected values below are worked out by hand from that Go
code; a name with two spaces is where vgpuctl used to differ (``NVIDIA__A2-4Q``).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.model.cluster import (
    KubeVirtConfig,
    is_resource_name,
    is_type_name,
    lists_external,
    resource_name,
)


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        # Two spaces are one run: one '_' (vgpuctl made '__').
        ("NVIDIA  A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),
        # A run mixing a tab and spaces: one '_'.
        ("NVIDIA \t A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),
        (
            "NVIDIA RTX Pro  6000   Blackwell DC-3Q",
            "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-3Q",
        ),
        # '/' is made '_' before the runs are: the spaces either side are two runs.
        ("a  /  b", "nvidia.com/a___b"),
        # '.' likewise, trailing whitespace trimmed first.
        ("GRID A100.x  4C \n", "nvidia.com/GRID_A100_x_4C"),
        # The malformed last regexp matches its own literal text at the start, and removes it.
        ("a-zA-Z0-9_-x]]NVIDIA  A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),
    ],
)
def test_a_resource_name_is_harvesters(type_name: str, expected: str) -> None:
    assert resource_name(type_name) == expected


def test_whitespace_harvesters_rule_keeps_is_still_made_underscore() -> None:
    """Go's ``\\s`` is ASCII: a ``\\v`` or a no-break space is no run to it and stays in
    Harvester's name, which then is no valid resource name. vgpuctl makes each such character
    ``_`` (its safety, kept); and it trims only what Go's ``TrimSpace`` trims (not U+001C,
    which Python's ``strip`` would)."""
    # Harvester: "A\v_\vB" (the two spaces between are a run); vgpuctl makes each \v '_'.
    assert resource_name("A\v  \vB") == "nvidia.com/A___B"
    # Harvester: "A\xa0\xa0B" (no run): two characters, two '_'.
    assert resource_name("A\xa0\xa0B") == "nvidia.com/A__B"
    # U+001C is not trimmed by Go, so it is inside the name: '_'.
    assert resource_name("\x1cA2-4Q") == "nvidia.com/_A2-4Q"
    # U+3000 (ideographic space) is trimmed by Go.
    assert resource_name("\u3000A2-4Q\u3000") == "nvidia.com/A2-4Q"


def _harvester_for_type_names(name: str) -> str:
    """Harvester's rule restricted to what vgpuctl's name check lets through (letters, digits,
    ``-``, ``_``, ``.``, ``/`` and spaces, none at either end): an independent statement of it."""
    return "nvidia.com/" + re.sub(" +", "_", name.replace("/", "_").replace(".", "_"))


_ENDS = st.sampled_from("Aa9")
#: Names vgpuctl's name check passes, runs of spaces, '/' and '.' among them.
_TYPE_NAMES = st.builds(
    lambda first, middle, last: first + middle + last,
    _ENDS,
    st.text(alphabet="Aa9 ./-", max_size=61),
    _ENDS,
)


@given(_TYPE_NAMES)
def test_every_name_vgpuctl_publishes_gets_harvesters_resource_name(name: str) -> None:
    assert is_type_name(name)
    got = resource_name(name)
    assert got == _harvester_for_type_names(name)
    # And it is a resource name vgpuctl's own check (and the admission policy) accepts.
    assert is_resource_name(got)


def test_an_allow_list_entry_with_harvesters_resource_name_lists_the_type() -> None:
    """The KubeVirt allow-list entry vgpuctl compares with is the one its device plugin
    advertises: Harvester's name. An entry with the name vgpuctl used to make is not it."""
    profile = "NVIDIA  A2-4Q"
    harvesters = {
        "mdevNameSelector": profile,
        "resourceName": "nvidia.com/NVIDIA_A2-4Q",
        "externalResourceProvider": True,
    }
    old = {**harvesters, "resourceName": "nvidia.com/NVIDIA__A2-4Q"}
    assert lists_external([harvesters], profile)
    assert not lists_external([old], profile)
    config = KubeVirtConfig("kubevirt", "kubevirt", "5", (harvesters,), frozenset())
    assert config.lists_external(profile)
