"""Runs host programs (``sriov-manage``) for the drivers: argv lists only, bounded in time.

The process runs in its own session so a timeout can kill everything it started (the script
forks helpers that would otherwise keep our output pipes open and the apply hanging).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Sequence

from reconciler.apply.errors import (
    CommandNotExecutableError,
    CommandNotFoundError,
    CommandTimeoutError,
)
from reconciler.apply.ports import CommandResult
from reconciler.model import ApplyError

#: How long to wait for pipes to close after killing a timed-out process group.
_REAP_SECONDS = 5.0


def describe_command(argv: Sequence[str]) -> str:
    """``sriov-manage -e 0000:08:00.0``: the program's base name and its arguments."""
    return shlex.join([os.path.basename(argv[0]), *argv[1:]])


class SubprocessRunner:
    """The real :class:`~reconciler.apply.ports.CommandRunner`."""

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        args = [str(a) for a in argv]
        if not args:
            raise ValueError("empty argv")
        program = args[0]
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
        except FileNotFoundError:
            where = f"at {program}" if os.sep in program else "on PATH"
            raise CommandNotFoundError(f"{os.path.basename(program)} not found {where}") from None
        except PermissionError:
            raise CommandNotExecutableError(f"{program} is not executable") from None
        except OSError as e:
            raise ApplyError(f"cannot run {program}: {e.strerror or e}") from e
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CommandTimeoutError(
                f"{describe_command(args)} did not finish within {timeout:g} s"
            ) from None
        except BaseException:
            # KeyboardInterrupt etc.: do not leave the command running behind us.
            _kill_group(proc)
            raise
        return CommandResult(proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=_REAP_SECONDS)
    except subprocess.TimeoutExpired:
        # A descendant left the group and still holds our pipes, or the command is stuck in an
        # uninterruptible kernel call (a sysfs write waiting for a VM: SIGKILL waits too).
        # Stop reading and give up on it after a bounded wait: it is never worth a hang.
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_SECONDS)
