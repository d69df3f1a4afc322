"""Where a simulated host's state file is, and the part of it the hold probe reads.

Apart from :mod:`reconciler.sim.state` (the whole state, with the simulated models): ``vgpuctl
plan`` on a simulated host needs only to know that the host is one and who holds which vGPU,
and loading the whole simulator to learn that cost a cold plan a noticeable share of its start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.model.record import record
from reconciler.observe.holds import INIT_PID_NAMESPACE

STATE_DIR = ".vgpuctl-sim"
STATE_FILE = "state.json"
#: Version 1 grew compatibly: each GPU's ``interface`` (mdev | vfio) was once one host-level
#: ``interface``; a file that has only that one still loads, every GPU taking it. Each GPU's
#: ``vgpuMode`` (equal-size | mixed-size), each model's ``framebufferMiB`` and a type's
#: ``mixedSizeMaxInstance`` came later: a file without them loads equal-size, the model's
#: framebuffer its largest type's, and no mixed-size maximum. ``byProcess`` (holders in the
#: simulated ``/proc``) came later still: a file without it has none.
FORMAT_VERSION = 1


def state_path(sysfs_root: Path) -> Path:
    return sysfs_root / STATE_DIR / STATE_FILE


def read_state_document(sysfs_root: Path) -> dict[str, Any]:
    """The state file's JSON, of the format this simulator writes (else ValueError). Read
    without the lock: the file is replaced atomically."""
    with state_path(sysfs_root).open(encoding="utf-8") as f:
        raw: dict[str, Any] = json.load(f)
    if raw.get("formatVersion") != FORMAT_VERSION:
        raise ValueError(
            f"simulator state format {raw.get('formatVersion')!r} is not {FORMAT_VERSION}"
        )
    return raw


@record(frozen=True)
class Holds:
    """Who holds the simulated host's vGPUs."""

    #: vGPU id (the mdev UUID; on vfio the VF address) → who holds it (a simulated VM).
    held: dict[str, str]
    #: Held vGPUs whose holder no probe can see (``sim hold --hidden``).
    hidden: frozenset[str]
    #: Held vGPUs whose holder is a process of the simulated ``/proc`` (``procfs.py``): the
    #: probe finds those by scanning it. vGPU id → pid.
    by_process: dict[str, int]
    #: The inode of the PID namespace the host was built in.
    pid_namespace: int

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Holds:
        return cls(
            held={str(k): str(v) for k, v in raw["held"].items()},
            hidden=frozenset(str(v) for v in raw.get("hidden", [])),
            by_process={str(k): int(v) for k, v in raw.get("byProcess", {}).items()},
            pid_namespace=int(raw.get("pidNamespace", INIT_PID_NAMESPACE)),
        )


def read_holds(sysfs_root: Path) -> Holds:
    return Holds.from_json(read_state_document(sysfs_root))
