"""resolve_beneath: links resolved lexically inside a root, against a table of links written
by hand (the expected paths worked out from the layouts, not from the code)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reconciler.model.links import LeavesRootError, TooManyLinksError, resolve_beneath

#: sysfs's layout: ``bus/pci/devices/<addr>`` and ``<VF>/physfn`` are relative links.
SYSFS = {
    "bus/pci/devices/0000:08:00.4": "../../../devices/pci0000:00/0000:00:02.0/0000:08:00.4",
    "devices/pci0000:00/0000:00:02.0/0000:08:00.4/physfn": "../0000:08:00.0",
    "out": "../../etc",
    "abs": "/etc/shadow",
    "loop": "loop",
}


def read(table: dict[str, str]) -> Callable[[str], str | None]:
    return table.get


def test_a_chain_of_relative_links_resolves_to_the_path_through_none() -> None:
    got = resolve_beneath("bus/pci/devices/0000:08:00.4/physfn/vendor", read(SYSFS), max_links=8)
    assert got == "devices/pci0000:00/0000:00:02.0/0000:08:00.0/vendor"
    assert resolve_beneath("devices/./a/../b", read(SYSFS), max_links=8) == "devices/b"
    assert resolve_beneath("", read(SYSFS), max_links=8) == ""


@pytest.mark.parametrize(
    ("rel", "link", "target"),
    [
        ("out/shadow", "out", "../../etc"),
        ("abs", "abs", "/etc/shadow"),
        ("../etc/shadow", "../etc/shadow", ""),  # no link: the path itself climbs out
    ],
)
def test_a_way_out_of_the_root_is_refused_naming_the_link(rel: str, link: str, target: str) -> None:
    with pytest.raises(LeavesRootError) as caught:
        resolve_beneath(rel, read(SYSFS), max_links=8)
    assert (caught.value.link, caught.value.target) == (link, target)


def test_an_absolute_target_counts_only_where_the_caller_places_it_inside() -> None:
    # A ConfigMap volume as seen from inside the pod: '..data' absolute, below the directory.
    table = {"a.yaml": "..data/a.yaml", "..data": "/etc/ds/..2026", "b.yaml": "/etc/other/b"}

    def inside(target: str) -> str | None:
        return target.removeprefix("/etc/ds/") if target.startswith("/etc/ds/") else None

    assert resolve_beneath("a.yaml", read(table), max_links=8, absolute=inside) == "..2026/a.yaml"
    with pytest.raises(LeavesRootError):
        resolve_beneath("b.yaml", read(table), max_links=8, absolute=inside)


def test_a_loop_stops_at_the_bound() -> None:
    with pytest.raises(TooManyLinksError):
        resolve_beneath("loop/x", read(SYSFS), max_links=8)
    chain = {f"l{i}": f"l{i + 1}" for i in range(8)}
    assert resolve_beneath("l0", read(chain), max_links=8) == "l8"
    with pytest.raises(TooManyLinksError):
        resolve_beneath("l0", read(chain), max_links=7)
