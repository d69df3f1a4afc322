"""Cheap fingerprints of what a reconcile depends on, so an unchanged node costs a few reads.

The watch loop rescans every ``--rescan-interval`` seconds. A full observation reads every VF's
type directories (hundreds of files on a large node); :class:`HostSignature` reads only what
changes when anything the planner cares about changes:

- the listing of ``bus/pci/devices`` (VFs appear and vanish there; a GPU is hot-added);
- per NVIDIA vGPU PF: ``sriov_numvfs`` and its driver link (the PFs themselves are found
  again only when that listing changed);
- per mdev under ``bus/mdev/devices``: the device it hangs off, its type link and its IOMMU
  group link (a vGPU removed and re-created with another type keeps its UUID);
- optionally who holds each vGPU (the hold probe: a ``/proc`` scan on a real host, so it is
  asked only when a cluster mirrors holders into CR status);
- the status (inode, size, mtime) of extra files, such as the kubelet's checkpoint.

The cluster's counterpart is :class:`~reconciler.watch.clusterwatch.ClusterWatch`: what its
watches keep in memory, with no request per rescan.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from reconciler.model import ReconcilerError
from reconciler.observe import HoldProbe, SysfsTree
from reconciler.observe.holds import DeviceNodes
from reconciler.observe.interfaces import device_nodes
from reconciler.observe.pci import PCI_DEVICES, find_vgpu_pfs

MDEV_DEVICES = "bus/mdev/devices"


class _Digest:
    """Feeds records into a hash; fields are separated so ``("ab", "c")`` ≠ ``("a", "bc")``."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, *fields: object) -> None:
        for field in fields:
            self._hash.update(str(field).encode("utf-8", "surrogateescape") + b"\x1f")
        self._hash.update(b"\x1e")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class HostSignature:
    """The host's fingerprint (see the module docstring). Not thread-safe: one caller."""

    def __init__(
        self,
        sysfs_root: Path,
        *,
        hold_probe: HoldProbe | None = None,
        extra_files: Sequence[Path] = (),
    ) -> None:
        self._root = sysfs_root
        self._hold_probe = hold_probe
        self._extra_files = tuple(extra_files)
        #: The PCI listing the PFs were found in, and those PFs (address, resolved path).
        self._pfs_of: tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None = None

    def compute(self) -> str:
        """The fingerprint now. A tree that cannot be read gives a fingerprint of the error
        (the full observation that follows reports it properly)."""
        digest = _Digest()
        try:
            self._host(digest)
        except (OSError, ReconcilerError) as exc:
            # ObserveError: a link leaving the root, a file the parser refuses…
            digest.add("error", type(exc).__name__, exc)
        for path in self._extra_files:
            try:
                st = os.stat(path)
            except OSError as exc:
                digest.add("file", path, "absent", exc.errno)
            else:
                digest.add("file", path, st.st_ino, st.st_size, st.st_mtime_ns)
        return digest.hexdigest()

    def _host(self, digest: _Digest) -> None:
        # A tree per look: it holds the root open, and the root may be replaced meanwhile.
        tree = SysfsTree(self._root)
        pci = tuple(sorted(tree.list_dir(PCI_DEVICES)))
        digest.add("pci", *pci)
        for address, path in self._pfs(tree, pci):
            digest.add(
                "pf",
                address,
                tree.read_text(f"{path}/sriov_numvfs").strip(),
                tree.read_link(f"{path}/driver") if tree.exists(f"{path}/driver") else "",
            )
        try:
            mdevs = sorted(tree.list_dir(MDEV_DEVICES))
        except FileNotFoundError:
            mdevs = []  # no mdev bus: the mdev module is not loaded, so there are no vGPUs
        nodes: dict[str, DeviceNodes] = {}
        for uuid in mdevs:
            device = tree.resolve(f"{MDEV_DEVICES}/{uuid}")
            nodes[uuid] = device_nodes(tree, device)
            digest.add(
                "mdev",
                uuid,
                device,
                tree.read_link(f"{device}/mdev_type"),
                nodes[uuid].group,
                nodes[uuid].cdev,
            )
        openable = {uuid: n for uuid, n in nodes.items() if n.openable}
        if self._hold_probe is not None and openable:
            scan = self._hold_probe.scan(openable)
            digest.add("held", *sorted(f"{uuid}={holder}" for uuid, holder in scan.held.items()))
            digest.add("blind", scan.blind)

    def _pfs(self, tree: SysfsTree, pci: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        if self._pfs_of is None or self._pfs_of[0] != pci:
            # The listing changed (VFs came or went): find the PFs again, a full PCI read.
            found = tuple((str(pf.address), pf.path) for pf in find_vgpu_pfs(tree))
            self._pfs_of = (pci, found)
        return self._pfs_of[1]
