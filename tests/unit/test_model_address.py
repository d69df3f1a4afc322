"""PCI addresses: printed in the kernel's lower-case form, compared and hashed by value. The
printed form is kept once made: that must never show in equality, hashing, copies or pickles."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from reconciler.model import PciAddress


def test_an_address_prints_as_the_kernel_names_it() -> None:
    address = PciAddress(0, 0x3D, 0x1F, 7)
    assert str(address) == "0000:3d:1f.7"
    assert str(address) == "0000:3d:1f.7"  # printed again from what was kept
    assert repr(address) == "PciAddress('0000:3d:1f.7')"


def test_a_printed_and_an_unprinted_address_are_equal_and_hash_alike() -> None:
    printed, fresh = PciAddress(0, 8, 0, 4), PciAddress(0, 8, 0, 4)
    str(printed)
    assert printed == fresh
    assert hash(printed) == hash(fresh)
    assert len({printed, fresh}) == 1
    assert PciAddress(0, 8, 0, 3) < printed < PciAddress(0, 8, 0, 5)


def test_an_address_made_from_another_prints_its_own_text() -> None:
    address = PciAddress.parse("0000:08:00.4")
    assert str(address) == "0000:08:00.4"
    assert str(replace(address, function=5)) == "0000:08:00.5"
    assert str(PciAddress.from_routing_id(0, address.routing_id + 1)) == "0000:08:00.5"


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy])
def test_copies_of_an_address_are_equal_and_print_alike(clone: object) -> None:
    address = PciAddress.parse("0000:41:00.1")
    str(address)
    twin = clone(address)  # type: ignore[operator]
    assert twin == address
    assert str(twin) == "0000:41:00.1"
