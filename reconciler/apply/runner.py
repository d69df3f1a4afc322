"""Runs host programs (``sriov-manage``, ``nvidia-smi``) for the drivers: argv lists only,
bounded in time, and never from the directory vgpuctl was started in.

The process runs in its own session so a timeout can kill everything it started (the script
forks helpers that would otherwise keep our output pipes open and the apply hanging).

vgpuctl runs as root from wherever the operator stands, often the root of a GitOps checkout
that others write. Nothing there may become code or a program: a bare program name is looked
up only in the absolute directories of ``PATH`` (an empty or relative entry would mean the
current directory), a relative path is made absolute before the child starts, and every child
starts in ``/``. vgpuctl's own helper processes (the sysfs writer) run through
:func:`own_module_argv`: an isolated interpreter that imports vgpuctl from where this process
did, never from the current directory.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from reconciler.apply.errors import (
    CommandNotExecutableError,
    CommandNotFoundError,
    CommandTimeoutError,
)
from reconciler.apply.ports import CommandResult
from reconciler.model import ApplyError

#: How long to wait for pipes to close after killing a timed-out process group.
_REAP_SECONDS = 5.0

#: The directory every child process starts in: nothing relative to the operator's current
#: directory (a checkout others write) is read or written by a program vgpuctl runs as root.
CHILD_CWD = "/"

#: The directory the ``reconciler`` package this process runs was imported from.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

#: An isolated interpreter's first lines: vgpuctl's own package directory first on ``sys.path``
#: (``-I`` left out the current directory, ``PYTHONPATH`` and the user's site directory), then
#: the module runs as ``__main__`` with the remaining arguments.
_BOOT = (
    "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def own_module_argv(module: str, *args: str) -> list[str]:
    """The argv that runs vgpuctl's module ``module`` (``reconciler.cli.sysfs_writer``) as a
    program: this interpreter in isolated mode (``-I``), importing vgpuctl from the directory
    this process imported it from.

    Not ``python -m module``: ``-m`` puts the current directory first on ``sys.path``, so a
    ``reconciler/__init__.py`` in the directory ``apply`` runs from (a GitOps checkout) would
    run as root in the writer process. Nor ``-I -m`` alone: that would import whatever
    ``reconciler`` the interpreter's site-packages hold, which need not be the code running
    now (a checkout on ``PYTHONPATH``, a wheel unpacked elsewhere)."""
    return [sys.executable, "-I", "-c", _BOOT, _PACKAGE_PARENT, module, *args]


def resolve_program(program: str) -> str | None:
    """``program`` as an absolute path: a bare name looked up in ``PATH``'s absolute directories
    only (None when none has it), a relative path joined to the current directory (the
    operator named it), an absolute one as it is."""
    if os.sep in program:
        return os.path.abspath(program)
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isabs(directory):
            continue  # "" and "." mean the current directory: never searched
        candidate = os.path.join(directory, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


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
        resolved = resolve_program(program)
        if resolved is None:
            raise CommandNotFoundError(f"{program} not found on PATH")
        args[0] = resolved
        try:
            proc = subprocess.Popen(
                args,
                cwd=CHILD_CWD,
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
