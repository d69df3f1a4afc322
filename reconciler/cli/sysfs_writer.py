"""The sysfs writer process: ``python -m reconciler.cli.sysfs_writer --root ROOT``.

``apply`` and ``watch`` do every sysfs write through one of these
(:class:`~reconciler.apply.sysfs.BoundedWriter`), so a kernel call that never returns (removing
a vGPU a VM still holds) strands this process, never the agent. It reads one JSON request per
line (``{"path", "value", "device"}``: the path relative to ``ROOT``, the device the action
names) and answers one JSON line each, until its input ends. Every write goes through the
confined writer's checks; ``--simulated`` hands the checked write to the simulator's kernel
instead of the file; ``--owner PID`` is the process a simulated crash fault kills.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vgpuctl-sysfs-writer", description=__doc__)
    parser.add_argument("--root", required=True, type=Path, help="the sysfs root")
    parser.add_argument("--simulated", action="store_true", help="a simulated host's root")
    parser.add_argument("--owner", type=int, default=None, help="pid a crash fault kills")
    ns = parser.parse_args(argv)
    from reconciler.apply.ports import SysfsWriter
    from reconciler.apply.sysfs import ConfinedSysfsWriter, serve_writes

    writer: SysfsWriter
    if ns.simulated:
        from reconciler.sim.kernel import SimSysfsWriter

        # The same checks as on a real host, the simulator's kernel behind them.
        writer = ConfinedSysfsWriter(ns.root, kernel=SimSysfsWriter(ns.root, owner=ns.owner))
    else:
        writer = ConfinedSysfsWriter(ns.root)
    serve_writes(writer, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
