"""Sysfs access for host drivers: the one confined writer, and a small reader.

:class:`ConfinedSysfsWriter` is the only code in the product that writes to a real sysfs tree.
It refuses any path that could leave the configured root and never creates files (sysfs
attributes exist or the kernel does not offer them). :class:`SysfsReader` gives drivers the
plain reads they need to re-check preconditions and verify effects.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from reconciler.apply.errors import PathEscapeError, WriteTimeoutError
from reconciler.apply.ports import SysfsWriter
from reconciler.model import ApplyError


class ConfinedSysfsWriter:
    """Writes values to existing files under ``root``, and nowhere else."""

    def __init__(self, root: Path) -> None:
        self._root = os.path.realpath(root)

    @property
    def root(self) -> Path:
        return Path(self._root)

    def write(self, path: str, value: str) -> None:
        target = self._confine(path)
        # No O_CREAT: a missing attribute means the kernel does not offer it, and creating a
        # regular file in its place would make a later read lie. O_NOFOLLOW: the path is
        # already resolved, so a link appearing now is a swap we refuse.
        fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = value.encode()
            # One write(2): sysfs hands each call to the driver's store() as a whole value,
            # so a retry of the remainder would be a second, different store.
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", target)
        finally:
            os.close(fd)

    def _confine(self, path: str) -> str:
        if not path or os.path.isabs(path):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: not a path relative to the root"
            )
        if ".." in PurePosixPath(path).parts:
            raise PathEscapeError(f"refusing sysfs write to {path!r}: '..' is not allowed")
        resolved = os.path.realpath(os.path.join(self._root, path))
        if not resolved.startswith(self._root.rstrip(os.sep) + os.sep):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: it resolves to {resolved}, "
                f"outside the sysfs root {self._root}"
            )
        return resolved


class SysfsReader:
    """Plain reads under a sysfs root; unreadable → ``ApplyError`` naming the file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.root / rel)

    def text(self, rel: str) -> str:
        """The attribute's value without the trailing newline the kernel prints."""
        try:
            return (self.root / rel).read_text(encoding="utf-8", errors="replace").strip()
        except OSError as e:
            raise ApplyError(f"cannot read {self.root / rel}: {e.strerror or e}") from e

    def integer(self, rel: str) -> int:
        raw = self.text(rel)
        try:
            return int(raw, 0)
        except ValueError:
            raise ApplyError(f"{self.root / rel} holds {raw!r}, not a number") from None

    def check_root(self) -> None:
        """Raise ``ApplyError`` when the root itself is gone: then nothing under it is merely
        absent, and no absence may pass for an effect (a vGPU removed, VFs disabled)."""
        if not os.path.isdir(self.root):
            raise ApplyError(f"the sysfs root {self.root} does not exist (gone, or not mounted)")

    def entries(self, rel: str) -> list[str]:
        """Names in a directory, sorted; a missing directory has none (a missing root raises)."""
        try:
            return sorted(os.listdir(self.root / rel))
        except FileNotFoundError:
            self.check_root()
            return []
        except OSError as e:
            raise ApplyError(f"cannot list {self.root / rel}: {e.strerror or e}") from e

    def link_name(self, rel: str) -> str:
        """The last component a symlink points to (``virtfn3`` → ``0000:08:00.7``)."""
        try:
            return PurePosixPath(os.readlink(self.root / rel)).name
        except OSError as e:
            raise ApplyError(f"cannot read link {self.root / rel}: {e.strerror or e}") from e

    def resolved(self, rel: str) -> Path:
        return Path(os.path.realpath(self.root / rel))


#: How long a new writer process may take to say it is ready (a Python start and a few imports).
WRITER_START_SECONDS = 60.0


class BoundedWriter:
    """Sends each write to a writer process and waits at most ``timeout`` seconds for it.

    A sysfs write is a kernel call, and some never return while a process holds what they
    change: removing a vGPU a VM has open blocks in ``vfio_unregister_group_dev`` until the VM
    lets go, uninterruptibly once a signal arrived (DOMAIN.md §9). A thread stuck there would
    hold the whole process (a process exits only when all its threads have), and a forked child
    of a process with threads (gRPC's, in ``watch``) is not safe to run Python in. So the writes
    go to a separate process, started from ``command`` (``vgpuctl``'s own writer, see
    ``reconciler.cli.sysfs_writer``) on the first write and reused: a line of JSON per write,
    a line per answer. When one overruns, the caller gets a
    :class:`~reconciler.apply.errors.WriteTimeoutError` naming the file; the writer process is
    abandoned to finish whenever the kernel lets it (it then exits: nobody reads it), and the
    next write starts a new one. It inherits no descriptor of ours (not the node lock, not the
    pipes of whoever reads our output) and runs in its own session (a Ctrl-C meant for us does
    not interrupt a half-done kernel call).

    Errors the write raises there (``OSError`` with the kernel's errno, a refused path) are
    raised here as the same types.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        timeout: float,
        root: Path,
        start_timeout: float = WRITER_START_SECONDS,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"the write timeout must be positive, not {timeout!r}")
        if isinstance(command, str) or not command:
            raise ValueError("command must be a non-empty argv list")
        self._command = [str(a) for a in command]
        self._timeout = timeout
        self._start_timeout = start_timeout
        self._root = Path(root)
        self._writer: _WriterProcess | None = None

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def writer_pid(self) -> int | None:
        """The writer process now in use (None before the first write, or after a timeout)."""
        return self._writer.pid if self._writer is not None else None

    def write(self, path: str, value: str) -> None:
        writer = self._writer
        if writer is None or not writer.alive:
            writer = self._writer = _WriterProcess.start(self._command, timeout=self._start_timeout)
        answer = writer.request({"path": path, "value": value}, timeout=self._timeout)
        if answer is None:
            self._writer = None
            writer.abandon()
            raise WriteTimeoutError(
                f"writing {value.strip()!r} to {self._root / path} did not return within "
                f"{self._timeout:g} s",
                pid=writer.pid,
            )
        _raise_answer(answer, where=self._root / path)

    def close(self) -> None:
        """Let the writer process go (it exits once it has read everything)."""
        if self._writer is not None:
            self._writer.abandon()
            self._writer = None


#: Upper bound of one answer line from the writer process.
_ANSWER_MAX = 1 << 16


class _WriterProcess:
    """One writer process and its two pipes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._buffer = b""
        if proc.stdin is None or proc.stdout is None:  # pragma: no cover - Popen with PIPE
            raise ValueError("the writer process needs both pipes")
        self._stdin: IO[bytes] = proc.stdin
        self._stdout: IO[bytes] = proc.stdout
        # Closing our end of its stdin is what tells it to exit: do it when we are collected,
        # or at interpreter exit, whatever comes first.
        self._finalizer = weakref.finalize(self, _close_quietly, self._stdin, self._stdout)

    @classmethod
    def start(cls, command: Sequence[str], *, timeout: float) -> _WriterProcess:
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            raise ApplyError(
                f"cannot start the sysfs writer ({command[0]}): {exc.strerror or exc}"
            ) from None
        writer = cls(proc)
        # It says when it is ready: a slow start (a cold disk, a loaded node) must not eat into
        # the first write's time limit, nor be taken for a kernel call that does not return.
        ready = writer._answer(time.monotonic() + timeout)
        if ready is None or ready.get("ready") is not True:
            writer.abandon()
            with contextlib.suppress(OSError):
                proc.kill()
            raise ApplyError(
                f"the sysfs writer ({' '.join(command[:3])}) did not start within {timeout:g} s"
            )
        return writer

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None and self._finalizer.alive

    def request(self, body: Mapping[str, str], *, timeout: float) -> dict[str, Any] | None:
        """Send one request; its answer, or None when none came within ``timeout`` seconds."""
        line = (json.dumps(body) + "\n").encode()
        try:
            self._stdin.write(line)
            self._stdin.flush()
        except (BrokenPipeError, ValueError):
            return {"died": True}
        return self._answer(time.monotonic() + timeout)

    def _answer(self, deadline: float) -> dict[str, Any] | None:
        fd = self._stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                return None
            chunk = os.read(fd, _ANSWER_MAX)
            if not chunk:
                return {"died": True}
            self._buffer += chunk
            if len(self._buffer) > _ANSWER_MAX:
                return {"garbled": True}
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            return {"garbled": True}
        return answer if isinstance(answer, dict) else {"garbled": True}

    def abandon(self) -> None:
        """Close our ends: an idle writer exits at once, a stuck one once the kernel lets it."""
        self._finalizer()


def _close_quietly(*pipes: IO[bytes]) -> None:
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.close()


def _raise_answer(answer: Mapping[str, Any], *, where: Path) -> None:
    if answer.get("ok") is True:
        return
    if "errno" in answer:
        code = int(answer["errno"])
        raise OSError(code, str(answer.get("strerror") or os.strerror(code)), str(where))
    if "refused" in answer:
        raise PathEscapeError(str(answer["refused"]))
    if "error" in answer:
        raise ApplyError(f"writing {where}: {answer['error']}")
    if answer.get("died"):
        raise ApplyError(f"the sysfs writer process exited while writing {where}")
    raise ApplyError(f"the sysfs writer process gave an unreadable answer writing {where}")


def serve_writes(writer: SysfsWriter, requests: IO[str], answers: IO[str]) -> None:
    """The writer process's loop: ``{"ready": true}`` first, then one JSON request per line in,
    one JSON answer per line out, until the requests end (``reconciler.cli.sysfs_writer``)."""
    try:
        answers.write(json.dumps({"ready": True}) + "\n")
        answers.flush()
    except OSError:
        return
    for line in requests:
        try:
            request = json.loads(line)
            path, value = request["path"], request["value"]
            if not isinstance(path, str) or not isinstance(value, str):
                raise TypeError("path and value must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            answer: dict[str, Any] = {"error": f"malformed request: {exc}"}
        else:
            answer = _write_one(writer, path, value)
        try:
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
        except (BrokenPipeError, OSError):
            return  # the caller gave up on us (a timeout): nobody reads any more


def _write_one(writer: SysfsWriter, path: str, value: str) -> dict[str, Any]:
    try:
        writer.write(path, value)
    except PathEscapeError as exc:
        return {"refused": exc.message}
    except OSError as exc:
        return {"errno": exc.errno or errno.EIO, "strerror": exc.strerror or str(exc)}
    except ApplyError as exc:
        return {"error": exc.message}
    return {"ok": True}
