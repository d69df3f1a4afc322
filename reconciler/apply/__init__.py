"""Apply: the only layer that changes a host.

Ports (:mod:`~reconciler.apply.ports`) for sysfs writes, commands and host drivers; the real
adapters (:class:`ConfinedSysfsWriter`, :class:`SubprocessRunner`, :class:`MdevDriver`,
:class:`VfioDriver`, and :class:`PerVfDriver` that hands each VF to the one it shows); the
idempotent :func:`execute`; and the per-node :class:`NodeLock` and :class:`Journal`.
:func:`execute_cluster` (``cluster.py``) carries out CR and KubeVirt writes through the
ClusterApi port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.model.lazy import lazy_exports

if TYPE_CHECKING:
    from reconciler.apply.cluster import (
        SKIPPED_NOT_CLUSTER,
        EventSink,
        allow_list_change,
        allow_list_patch,
        execute_cluster,
        record_host_events,
    )
    from reconciler.apply.drivers import (
        PerVfDriver,
    )
    from reconciler.apply.errors import (
        CommandFailedError,
        CommandNotExecutableError,
        CommandNotFoundError,
        CommandTimeoutError,
        DeviceBusyError,
        DriverRefusedError,
        HostChangedError,
        PathEscapeError,
        VerificationError,
        WriteTimeoutError,
    )
    from reconciler.apply.executor import (
        SKIPPED_NOT_HOST,
        ApplyCounts,
        ApplyResult,
        Outcome,
        OutcomeStatus,
        execute,
    )
    from reconciler.apply.journal import (
        Journal,
        JournalRead,
        JournalReader,
        JournalRecord,
        Phase,
        Removal,
    )
    from reconciler.apply.lock import (
        NodeLock,
    )
    from reconciler.apply.mdev import (
        MdevDriver,
        checked_uuid,
    )
    from reconciler.apply.ports import (
        CommandResult,
        CommandRunner,
        HostDriver,
        HostedVGPU,
        SysfsDevice,
        SysfsKernel,
        SysfsWriter,
    )
    from reconciler.apply.runner import (
        SubprocessRunner,
    )
    from reconciler.apply.sysfs import (
        BoundedWriter,
        ConfinedSysfsWriter,
    )
    from reconciler.apply.vfio import (
        VfioDriver,
    )

#: Where each public name lives. Imported on first use: the sysfs writer process (and every
#: node-local command) needs a few of these, not the whole layer (the cluster executor pulls
#: in the Kubernetes model, the executor the planner's vocabulary).
_EXPORTS = {
    "ApplyCounts": "reconciler.apply.executor",
    "ApplyResult": "reconciler.apply.executor",
    "BoundedWriter": "reconciler.apply.sysfs",
    "CommandFailedError": "reconciler.apply.errors",
    "CommandNotExecutableError": "reconciler.apply.errors",
    "CommandNotFoundError": "reconciler.apply.errors",
    "CommandResult": "reconciler.apply.ports",
    "CommandRunner": "reconciler.apply.ports",
    "CommandTimeoutError": "reconciler.apply.errors",
    "ConfinedSysfsWriter": "reconciler.apply.sysfs",
    "DeviceBusyError": "reconciler.apply.errors",
    "DriverRefusedError": "reconciler.apply.errors",
    "EventSink": "reconciler.apply.cluster",
    "HostChangedError": "reconciler.apply.errors",
    "HostDriver": "reconciler.apply.ports",
    "HostedVGPU": "reconciler.apply.ports",
    "Journal": "reconciler.apply.journal",
    "JournalRead": "reconciler.apply.journal",
    "JournalReader": "reconciler.apply.journal",
    "JournalRecord": "reconciler.apply.journal",
    "MdevDriver": "reconciler.apply.mdev",
    "NodeLock": "reconciler.apply.lock",
    "PerVfDriver": "reconciler.apply.drivers",
    "Outcome": "reconciler.apply.executor",
    "OutcomeStatus": "reconciler.apply.executor",
    "PathEscapeError": "reconciler.apply.errors",
    "Removal": "reconciler.apply.journal",
    "Phase": "reconciler.apply.journal",
    "SKIPPED_NOT_CLUSTER": "reconciler.apply.cluster",
    "SKIPPED_NOT_HOST": "reconciler.apply.executor",
    "SubprocessRunner": "reconciler.apply.runner",
    "SysfsDevice": "reconciler.apply.ports",
    "SysfsKernel": "reconciler.apply.ports",
    "SysfsWriter": "reconciler.apply.ports",
    "VerificationError": "reconciler.apply.errors",
    "VfioDriver": "reconciler.apply.vfio",
    "WriteTimeoutError": "reconciler.apply.errors",
    "allow_list_change": "reconciler.apply.cluster",
    "allow_list_patch": "reconciler.apply.cluster",
    "checked_uuid": "reconciler.apply.mdev",
    "execute": "reconciler.apply.executor",
    "execute_cluster": "reconciler.apply.cluster",
    "record_host_events": "reconciler.apply.cluster",
}


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "SKIPPED_NOT_CLUSTER",
    "SKIPPED_NOT_HOST",
    "ApplyCounts",
    "ApplyResult",
    "BoundedWriter",
    "CommandFailedError",
    "CommandNotExecutableError",
    "CommandNotFoundError",
    "CommandResult",
    "CommandRunner",
    "CommandTimeoutError",
    "ConfinedSysfsWriter",
    "DeviceBusyError",
    "DriverRefusedError",
    "EventSink",
    "HostChangedError",
    "HostDriver",
    "HostedVGPU",
    "Journal",
    "JournalRead",
    "JournalReader",
    "JournalRecord",
    "MdevDriver",
    "NodeLock",
    "Outcome",
    "OutcomeStatus",
    "PathEscapeError",
    "PerVfDriver",
    "Phase",
    "Removal",
    "SubprocessRunner",
    "SysfsDevice",
    "SysfsKernel",
    "SysfsWriter",
    "VerificationError",
    "VfioDriver",
    "WriteTimeoutError",
    "allow_list_change",
    "allow_list_patch",
    "checked_uuid",
    "execute",
    "execute_cluster",
    "record_host_events",
]
