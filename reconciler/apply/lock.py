"""One apply per node at a time: an exclusive ``flock`` on ``<state_dir>/<node>.lock``.

``flock`` belongs to the open file, so the kernel drops it when the holder exits, however it
exits: a lock file left behind by a crashed run never blocks the next one. The file is never
deleted (deleting a lock file races with a process that has just opened it); it only carries
the holder's identity so a refused run can say who holds it. It is opened as ``state.py`` says:
in a directory only vgpuctl's user can write, never through a link.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from reconciler.apply.state import node_file, open_node_file, open_state_dir
from reconciler.model import ApplyError, LockHeldError

_COMMAND_CHARS = 200


def _this_command() -> str:
    argv = list(sys.argv) or ["?"]
    text = shlex.join([os.path.basename(argv[0]) or argv[0], *argv[1:]])
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"


class NodeLock:
    """Context manager holding the node's apply lock; raises ``LockHeldError`` when taken."""

    def __init__(self, state_dir: Path, node: str, *, command: str | None = None) -> None:
        self.node = node
        self.state_dir = Path(state_dir)
        self.path = node_file(state_dir, node, ".lock")
        self._command = command
        self._fd: int | None = None

    def __enter__(self) -> NodeLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"the lock for node {self.node} is already held by this object")
        dir_fd = open_state_dir(self.state_dir)
        try:
            # No O_TRUNC: the file may be held by someone whose identity we must still read.
            fd, _ = open_node_file(dir_fd, self.path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            raise ApplyError(f"cannot open the lock file {self.path}: {e.strerror or e}") from e
        finally:
            os.close(dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            # The holder writes who it is right after taking the lock: give it that moment
            # (bounded), so the message can name it.
            for _ in range(_HOLDER_RETRIES):
                if holder and "pid" in holder:
                    break
                time.sleep(_HOLDER_RETRY_SECONDS)
                holder = _read_holder(fd)
            os.close(fd)
            raise LockHeldError(self._held_message(holder)) from None
        except OSError as e:
            os.close(fd)
            raise ApplyError(f"cannot lock {self.path}: {e.strerror or e}") from e
        holder = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "command": self._command if self._command is not None else _this_command(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        data = (json.dumps(holder, ensure_ascii=False) + "\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except OSError:
            # Identity is a courtesy for whoever is refused; the lock itself is held.
            pass
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)  # drops the flock

    def _held_message(self, holder: dict[str, object] | None) -> str:
        base = f"another apply holds the lock for node {self.node}"
        if not holder or "pid" not in holder:
            return f"{base} (it has not recorded who it is yet; lock file {self.path})"
        text = f"{base}: pid {holder['pid']}"
        if holder.get("command"):
            text += f" ({holder['command']})"
        host = holder.get("hostname")
        if host and host != socket.gethostname():
            text += f" on host {host}"
        if holder.get("started"):
            text += f" since {holder['started']}"
        return text


#: How long a second apply waits for the holder to record itself: 20 × 10 ms.
_HOLDER_RETRIES = 20
_HOLDER_RETRY_SECONDS = 0.01


def _read_holder(fd: int) -> dict[str, object] | None:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw.decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
