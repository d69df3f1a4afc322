"""Deterministic vGPU UUIDs: the same node and VF always get the same UUID.

mdevs do not survive a reboot. Re-creating one under the UUID it had before keeps every VM
definition that names it valid, and re-applying a plan never invents a second identity for the
same vGPU. The namespace below is therefore a contract: changing it changes every UUID the
project creates.
"""

from __future__ import annotations

import hashlib

from reconciler.model import PciAddress

#: ``uuid5(NAMESPACE_DNS, "vgpu.reconciler.dev")``, written out so that it can never drift (a
#: unit test derives it). A string: the stdlib's ``uuid`` module is not imported by planning,
#: whose cold start it would slow (it imports ``platform``, which compiles regexes at import).
VGPU_UUID_NAMESPACE = "77c317bb-d8cf-5df3-9d07-9b5f6884ffb3"
_NAMESPACE_BYTES = bytes.fromhex(VGPU_UUID_NAMESPACE.replace("-", ""))


def vgpu_uuid(node: str, vf: PciAddress | str) -> str:
    """``str(uuid.uuid5(VGPU_UUID_NAMESPACE, f"{node}/{vf}"))``: the UUID of our vGPU on ``vf``.

    Computed here as RFC 4122 §4.3 spells it out because ``uuid.uuid5`` goes through integer
    arithmetic and costs three times as much, which shows when planning a 256-VF node; a unit
    test holds the two equal.
    """
    name = _NAMESPACE_BYTES + f"{node}/{vf}".encode()
    raw = bytearray(hashlib.sha1(name, usedforsecurity=False).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
