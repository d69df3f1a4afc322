"""PCI addresses (``domain:bus:slot.function``), validated once at the boundary.

Every address that reaches a sysfs path or a command line has been through
:meth:`PciAddress.parse`, so a hostile string such as ``../../x`` never becomes a path.
"""

from __future__ import annotations

import re
from functools import lru_cache, total_ordering

from reconciler.model.record import field, record

_PATTERN = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{4}):(?P<bus>[0-9a-fA-F]{2}):(?P<slot>[0-1][0-9a-fA-F])\.(?P<function>[0-7])$"
)


@total_ordering
@record(frozen=True, slots=True)
class PciAddress:
    """A PCI function address. Orders numerically; prints in the kernel's lower-case form."""

    domain: int
    bus: int
    slot: int
    function: int
    #: The printed form, made on first use: a fleet's plan prints each address thousands of
    #: times (names, keys, paths), and most addresses are shared (:meth:`parse`).
    _printed: str = field(default="", init=False, repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse ``0000:08:00.4``; raise ``ValueError`` naming the expected form otherwise."""
        if isinstance(text, str) and len(text) <= 32 and cls is PciAddress:
            # Addresses are immutable values, and a fleet's inventories repeat the same few
            # hundred: each text is parsed once (an error is not remembered, it raises anew;
            # a long text, padded, is not remembered at all).
            return _parsed(text)
        return _parse(cls, text)

    @classmethod
    def is_valid(cls, text: str) -> bool:
        try:
            cls.parse(text)
        except ValueError:
            return False
        return True

    @classmethod
    def from_routing_id(cls, domain: int, routing_id: int) -> PciAddress:
        """The address of ``bus << 8 | devfn``: how the kernel places VFs (offset and stride)."""
        bus, devfn = divmod(routing_id, 0x100)
        if bus > 0xFF:
            raise ValueError(f"routing id {routing_id:#x} is beyond bus 0xff")
        return cls(domain, bus, devfn >> 3, devfn & 0x7)

    @property
    def routing_id(self) -> int:
        return (self.bus << 8) | (self.slot << 3) | self.function

    def __str__(self) -> str:
        printed = self._printed
        if not printed:
            printed = _text(self.domain, self.bus, self.slot, self.function)
            object.__setattr__(self, "_printed", printed)
        return printed

    def __repr__(self) -> str:
        return f"PciAddress({str(self)!r})"

    def _key(self) -> tuple[int, int, int, int]:
        return (self.domain, self.bus, self.slot, self.function)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PciAddress):
            return NotImplemented
        return self._key() < other._key()


def _parse(cls: type[PciAddress], text: object) -> PciAddress:
    m = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if m is None or int(m["slot"], 16) > 0x1F:
        raise ValueError(
            f"invalid PCI address {text!r}: expected domain:bus:slot.function such as 0000:08:00.4"
        )
    return cls(int(m["domain"], 16), int(m["bus"], 16), int(m["slot"], 16), int(m["function"]))


@lru_cache(maxsize=1 << 12)
def _parsed(text: str) -> PciAddress:
    return _parse(PciAddress, text)


@lru_cache(maxsize=1 << 16)
def _text(domain: int, bus: int, slot: int, function: int) -> str:
    # Addresses are printed far more often than made (every path, key and message): a node
    # has a few hundred, a fleet's plans print each thousands of times.
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{function:x}"
