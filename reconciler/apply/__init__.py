"""Apply: the only layer that changes a host.

Ports (:mod:`~reconciler.apply.ports`) for sysfs writes, commands and host drivers; the real
adapters (:class:`ConfinedSysfsWriter`, :class:`SubprocessRunner`, :class:`MdevDriver`); the
idempotent :func:`execute`; and the per-node :class:`NodeLock` and :class:`Journal`.
:func:`execute_cluster` (``cluster.py``) carries out CR and KubeVirt writes through the
ClusterApi port.
"""

from reconciler.apply.cluster import (
    SKIPPED_NOT_CLUSTER,
    EventSink,
    allow_list_change,
    execute_cluster,
    record_host_events,
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
from reconciler.apply.journal import Journal, JournalRecord, Phase
from reconciler.apply.lock import NodeLock
from reconciler.apply.mdev import MdevDriver, checked_uuid
from reconciler.apply.ports import (
    CommandResult,
    CommandRunner,
    HostDriver,
    HostedVGPU,
    SysfsWriter,
)
from reconciler.apply.runner import SubprocessRunner
from reconciler.apply.sysfs import BoundedWriter, ConfinedSysfsWriter

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
    "JournalRecord",
    "MdevDriver",
    "NodeLock",
    "Outcome",
    "OutcomeStatus",
    "PathEscapeError",
    "Phase",
    "SubprocessRunner",
    "SysfsWriter",
    "VerificationError",
    "WriteTimeoutError",
    "allow_list_change",
    "checked_uuid",
    "execute",
    "execute_cluster",
    "record_host_events",
]
