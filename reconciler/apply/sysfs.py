"""Sysfs access for host drivers: the one confined writer, and a small confined reader.

:class:`ConfinedSysfsWriter` is the only code in the product that writes to a real sysfs tree.
A write names the device it is for (:class:`~reconciler.apply.ports.SysfsDevice`); the writer
resolves the path's device link inside the root, refuses it unless it leads to that very
device (the directory named by the vGPU's UUID under the VF named by its address, a VF whose
``physfn`` leads to the GPU the action names), refuses any link after the device directory,
and opens the file through no link at all. It never creates files (sysfs attributes exist or
the kernel does not offer them). :class:`SysfsReader` gives drivers the reads they need to
re-check preconditions and verify effects, confined and bounded as the observers' are.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import select
import subprocess
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from reconciler.apply.errors import PathEscapeError, WriteTimeoutError
from reconciler.apply.ports import SysfsDevice, SysfsKernel, SysfsWriter
from reconciler.model import ApplyError, ReconcilerError
from reconciler.model.errors import excerpt
from reconciler.observe.sysfs import SysfsTree

#: The buses whose ``devices/<name>`` links name a device a write may be for.
_DEVICE_BUSES = frozenset({"pci", "mdev"})


class ConfinedSysfsWriter:
    """Writes values to existing files of the named device under ``root``, and nowhere else.

    ``kernel``: what acts on a checked write instead of the file itself (the simulator's
    kernel emulation, so its hosts run these checks too); None writes the file.
    """

    def __init__(self, root: Path, *, kernel: SysfsKernel | None = None) -> None:
        self._root = os.path.realpath(root)
        self._kernel = kernel

    @property
    def root(self) -> Path:
        return Path(self._root)

    def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
        tree = SysfsTree(Path(self._root))
        target = self.device_file(tree, path, device)
        if self._kernel is not None:
            self._kernel.write(target, value)
            return
        # No O_CREAT: a missing attribute means the kernel does not offer it, and creating a
        # regular file in its place would make a later read lie. Through no link at all: the
        # path is already resolved, so a link appearing now is a swap we refuse.
        try:
            fd = tree.open_beneath(target, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise PathEscapeError(
                    f"refusing sysfs write to {path}: a link appeared on the way to "
                    f"{tree.describe(target)}"
                ) from None
            raise
        try:
            data = value.encode()
            # One write(2): sysfs hands each call to the driver's store() as a whole value,
            # so a retry of the remainder would be a second, different store.
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(
                    errno.EIO,
                    f"short write ({written} of {len(data)} bytes)",
                    tree.describe(target),
                )
        finally:
            os.close(fd)

    @staticmethod
    def device_file(tree: SysfsTree, path: str, device: SysfsDevice) -> str:
        """Where ``path`` leads, relative to the root and through no link, checked to be a file
        of ``device``; ``PathEscapeError`` when it is not, ``FileNotFoundError`` when the
        device or the file is not there (any more)."""
        if not path or os.path.isabs(path):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: not a path relative to the root"
            )
        parts = path.split("/")
        if ".." in parts:
            raise PathEscapeError(f"refusing sysfs write to {path!r}: '..' is not allowed")
        if (
            len(parts) < 5
            or parts[0] != "bus"
            or parts[1] not in _DEVICE_BUSES
            or parts[2] != "devices"
            or any(p in ("", ".") for p in parts[4:])
        ):
            raise PathEscapeError(
                f"refusing sysfs write to {path!r}: not a file of a device under "
                "bus/pci/devices or bus/mdev/devices"
            )
        bus, name, rest = parts[1], parts[3], parts[4:]
        if name != (device.vgpu if bus == "mdev" else str(device.vf)) or (
            bus == "pci" and device.vgpu is not None and rest[0] != device.vgpu
        ):
            raise PathEscapeError(f"refusing sysfs write to {path}: not a file of {device}")
        link = "/".join(parts[:4])
        try:
            real = tree.real(link)
            vf_dir = posixpath.dirname(real) if bus == "mdev" else real
            if (
                not real.startswith("devices/")
                or posixpath.basename(real) != name
                or posixpath.basename(vf_dir) != str(device.vf)
            ):
                raise PathEscapeError(
                    f"refusing sysfs write to {path}: {tree.describe(link)} leads to "
                    f"{tree.describe(real)}, not to {device}"
                )
            try:
                gpu = posixpath.basename(tree.real(f"{vf_dir}/physfn"))
            except FileNotFoundError:
                gpu = ""
            if gpu != str(device.gpu):
                whose = f"belongs to {gpu}" if gpu else "has no physfn link: it is not a VF"
                raise PathEscapeError(
                    f"refusing sysfs write to {path}: {tree.describe(vf_dir)} {whose}, "
                    f"not to GPU {device.gpu}"
                )
            here = real
            for part in rest:
                here = f"{here}/{part}"
                if tree.read_link(here) is not None:
                    raise PathEscapeError(
                        f"refusing sysfs write to {path}: {tree.describe(here)} is a link "
                        f"(a write goes only to a file of {device}, never through a link)"
                    )
        except PathEscapeError:
            raise
        except ReconcilerError as e:  # a link leaving the root, a loop
            raise PathEscapeError(f"refusing sysfs write to {path}: {e.message}") from None
        return here


class SysfsReader:
    """Reads under a sysfs root, confined and bounded as the observers' (``observe.sysfs``):
    links are followed inside the root only, attributes are read without blocking, at most a
    page. Unreadable → ``ApplyError`` naming the file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def _tree(self) -> SysfsTree:
        # One per call: the root may be replaced between two reads (sysfs unmounted).
        return SysfsTree(self.root)

    def exists(self, rel: str) -> bool:
        try:
            return self._tree().exists(rel)
        except ReconcilerError as e:
            raise ApplyError(e.message) from None
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False
            raise ApplyError(f"cannot read {self.root / rel}: {e.strerror or e}") from e

    def text(self, rel: str) -> str:
        """The attribute's value without the trailing newline the kernel prints."""
        try:
            return self._tree().read_text(rel).strip()
        except ReconcilerError as e:
            raise ApplyError(e.message) from None
        except OSError as e:
            raise ApplyError(f"cannot read {self.root / rel}: {e.strerror or e}") from e

    def integer(self, rel: str) -> int:
        raw = self.text(rel)
        try:
            return int(raw, 0)
        except ValueError:
            raise ApplyError(f"{self.root / rel} holds '{excerpt(raw)}', not a number") from None

    def check_root(self) -> None:
        """Raise ``ApplyError`` when the root itself is gone: then nothing under it is merely
        absent, and no absence may pass for an effect (a vGPU removed, VFs disabled)."""
        if not os.path.isdir(self.root):
            raise ApplyError(f"the sysfs root {self.root} does not exist (gone, or not mounted)")

    def entries(self, rel: str) -> list[str]:
        """Names in a directory, sorted; a missing directory has none (a missing root raises)."""
        try:
            return sorted(self._tree().list_dir(rel))
        except (FileNotFoundError, NotADirectoryError):
            self.check_root()
            return []
        except ReconcilerError as e:
            raise ApplyError(e.message) from None
        except OSError as e:
            raise ApplyError(f"cannot list {self.root / rel}: {e.strerror or e}") from e

    def link_name(self, rel: str) -> str:
        """The last component a symlink points to (``virtfn3`` → ``0000:08:00.7``)."""
        try:
            target = self._tree().read_link(rel)
        except ReconcilerError as e:
            raise ApplyError(e.message) from None
        except OSError as e:
            raise ApplyError(f"cannot read link {self.root / rel}: {e.strerror or e}") from e
        if target is None:
            raise ApplyError(f"cannot read link {self.root / rel}: not a link")
        return PurePosixPath(target).name

    def real(self, rel: str) -> str:
        """What ``rel`` names, relative to the root, links resolved inside it only."""
        try:
            return self._tree().real(rel)
        except ReconcilerError as e:
            raise ApplyError(e.message) from None
        except OSError as e:
            raise ApplyError(f"cannot resolve {self.root / rel}: {e.strerror or e}") from e


#: How long a new writer process may take to say it is ready (a Python start and a few imports).
WRITER_START_SECONDS = 60.0


class BoundedWriter:
    """Sends each write to a writer process and waits at most ``timeout`` seconds for it.

    A sysfs write is a kernel call, and some never return while a process holds what they
    change: removing a vGPU a VM has open blocks in ``vfio_unregister_group_dev`` until the VM
    lets go, uninterruptibly once a signal arrived (docs/domain.md §9). A thread stuck there would
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

    def write(self, path: str, value: str, *, device: SysfsDevice) -> None:
        writer = self._writer
        if writer is None or not writer.alive:
            writer = self._writer = _WriterProcess.start(self._command, timeout=self._start_timeout)
        request = {"path": path, "value": value, "device": device.to_json()}
        answer = writer.request(request, timeout=self._timeout)
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

    def request(self, body: Mapping[str, object], *, timeout: float) -> dict[str, Any] | None:
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
            device = SysfsDevice.from_json(request["device"])
        except (ValueError, KeyError, TypeError) as exc:
            answer: dict[str, Any] = {"error": f"malformed request: {exc}"}
        else:
            answer = _write_one(writer, path, value, device)
        try:
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
        except (BrokenPipeError, OSError):
            return  # the caller gave up on us (a timeout): nobody reads any more


def _write_one(writer: SysfsWriter, path: str, value: str, device: SysfsDevice) -> dict[str, Any]:
    try:
        writer.write(path, value, device=device)
    except PathEscapeError as exc:
        return {"refused": exc.message}
    except OSError as exc:
        return {"errno": exc.errno or errno.EIO, "strerror": exc.strerror or str(exc)}
    except ApplyError as exc:
        return {"error": exc.message}
    return {"ok": True}
