"""Why an apply step failed, sorted by how the caller handles it.

All are ``ApplyError`` (the apply phase); ``transient`` ones may succeed if run again later
without a change of input (a VM lets go of a vGPU, a slow command finishes next time).
"""

from __future__ import annotations

from reconciler.model import ApplyError


class PathEscapeError(ApplyError):
    """A sysfs write was refused: its path is absolute, has ``..``, or resolves outside the root."""


class CommandNotFoundError(ApplyError):
    """The program to run does not exist."""


class CommandNotExecutableError(ApplyError):
    """The program exists but cannot be executed."""


class CommandTimeoutError(ApplyError):
    """The program did not finish in time; it was killed with its whole process group."""

    transient = True


class CommandFailedError(ApplyError):
    """The program ran and exited non-zero (``sriov-manage`` fails while the GPU is in use or
    the driver is busy: running it again later may succeed)."""

    transient = True


class DeviceBusyError(ApplyError):
    """The device is in use (a VM holds the vGPU): nothing was changed."""

    transient = True


class DriverRefusedError(ApplyError):
    """The kernel driver rejected a write (errno explained in the message). Transient when the
    errno says the driver failed rather than refused (an I/O error, no memory for now)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class HostChangedError(ApplyError):
    """The host is not what the plan was made from: re-plan rather than guess (running again
    plans from the host as it is then)."""

    transient = True


class WriteTimeoutError(ApplyError):
    """A sysfs write did not return in time. The writer process (``pid``) is left to finish on
    its own (a kernel call may wait for ever, uninterruptibly); the next run observes what
    happened."""

    transient = True

    def __init__(self, message: str, *, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class VerificationError(ApplyError):
    """The action ran but its effect never became visible within the bounded wait (it may
    show later: the next run finds it done, or acts again)."""

    transient = True


class MandateError(ApplyError):
    """An action outside what the run may touch: a GPU the desired state does not manage, a
    device that is not an NVIDIA vGPU GPU, a vGPU in use at the moment of acting, a cluster
    object that is not vgpuctl's own on this node, a KubeVirt entry vgpuctl did not add.

    The planner never plans such an action, so one reaching an executor is a bug or a tampered
    plan: the run stops there, and nothing after it runs. Never retried as it is."""
