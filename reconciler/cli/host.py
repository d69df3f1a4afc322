"""Composition: turn global options into the engine's parts for one host.

A simulated host (``vgpuctl sim init``) is recognised from the sysfs tree itself; its kernel
emulation then stands behind the same sysfs-writer port the real adapter code writes through.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.catalog import Catalog, default_catalog
from reconciler.cli.options import DEFAULT_SRIOV_MANAGE, DEFAULT_STATE_DIR, GlobalOptions
from reconciler.model import Inventory, UsageError

if TYPE_CHECKING:
    from reconciler.apply import MdevDriver
    from reconciler.sim import SimHost


@dataclass
class Host:
    options: GlobalOptions

    @cached_property
    def catalog(self) -> Catalog:
        return default_catalog()

    @cached_property
    def sim(self) -> SimHost | None:
        from reconciler.sim import SimHost

        return SimHost.open(self.options.sysfs_root)

    @property
    def sim_dir(self) -> Path | None:
        return self.options.sysfs_root.resolve().parent if self.sim else None

    @property
    def state_dir(self) -> Path:
        if self.options.state_dir is not None:
            return self.options.state_dir
        sim_dir = self.sim_dir
        return sim_dir / "state" if sim_dir else Path(DEFAULT_STATE_DIR)

    @property
    def sriov_manage_argv(self) -> list[str]:
        cmd = self.options.sriov_manage
        if cmd is None:
            sim_dir = self.sim_dir
            cmd = str(sim_dir / "bin" / "sriov-manage") if sim_dir else DEFAULT_SRIOV_MANAGE
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:
            raise UsageError(f"--sriov-manage {cmd!r}: {exc}") from None
        if not argv:
            raise UsageError("--sriov-manage is empty")
        return argv

    def observe(self) -> Inventory:
        from reconciler.observe import observe_host
        from reconciler.observe.holds import ProcfsHoldProbe

        sim = self.sim
        probe = sim.hold_probe() if sim else ProcfsHoldProbe()
        return observe_host(
            self.options.sysfs_root, node=self.options.node, catalog=self.catalog, hold_probe=probe
        )

    def driver(self, *, command_timeout: float = 300.0) -> MdevDriver:
        from reconciler.apply import ConfinedSysfsWriter, MdevDriver, SubprocessRunner

        sim = self.sim
        writer = sim.writer() if sim else ConfinedSysfsWriter(self.options.sysfs_root)
        return MdevDriver(
            sysfs_root=self.options.sysfs_root,
            writer=writer,
            runner=SubprocessRunner(),
            sriov_manage=self.sriov_manage_argv,
            command_timeout=command_timeout,
        )
