"""A command run in a pseudo-terminal, and the screen its output leaves.

:func:`run_in_pty` runs ``python -m reconciler`` with a pty as its stdin, stdout and stderr
(python's :mod:`pty`: ``isatty()`` is true, as on a person's terminal) and returns all it
wrote. :class:`Screen` plays that back the way a VT100-style terminal would, for the few
controls a progress display uses (ECMA-48): printable characters, CR, LF, ``CSI n F`` (cursor
to the start of the line ``n`` up), ``CSI n A`` (cursor up), ``CSI J`` / ``CSI 0 J`` (erase
to the end of the screen), ``CSI K`` (erase to the end of the line), and SGR (``CSI … m``,
colours: ignored). Any other escape sequence is an error: a test must see every control a
command sends, and a raw ESC from a node's name would show up here as one.
"""

from __future__ import annotations

import errno
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.simnode import REPO

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


@dataclass
class Screen:
    """A terminal ``width`` columns wide; ``lines`` grows as output scrolls (a scrollback)."""

    width: int = 200
    lines: list[str] = field(default_factory=lambda: [""])
    row: int = 0
    col: int = 0

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                m = _CSI.match(text, i)
                if m is None:
                    raise AssertionError(
                        f"an escape sequence this screen does not know: {text[i : i + 12]!r}"
                    )
                self._csi(m.group(1), m.group(2))
                i = m.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row += 1
                self.col = 0
                while len(self.lines) <= self.row:
                    self.lines.append("")
            elif ch.isprintable():
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + ch + line[self.col + 1 :]
                self.col += 1
            else:
                raise AssertionError(f"a control character reached the terminal: {ch!r}")
            i += 1

    def _csi(self, params: str, final: str) -> None:
        n = int(params) if params.isdigit() else 1
        if final == "m":
            return
        if final == "F":
            self.row, self.col = max(0, self.row - n), 0
        elif final == "A":
            self.row = max(0, self.row - n)
        elif final == "J" and params in ("", "0"):
            self.lines[self.row] = self.lines[self.row][: self.col]
            del self.lines[self.row + 1 :]
        elif final == "K" and params in ("", "0"):
            self.lines[self.row] = self.lines[self.row][: self.col]
        else:
            raise AssertionError(
                f"an escape sequence this screen does not know: CSI {params}{final}"
            )

    def text(self) -> list[str]:
        """The screen's lines, trailing blanks dropped."""
        out = [line.rstrip() for line in self.lines]
        while out and not out[-1]:
            out.pop()
        return out


@dataclass
class PtyRun:
    returncode: int
    output: str

    def screen(self, width: int = 200) -> list[str]:
        s = Screen(width)
        s.feed(self.output)
        return s.text()


def run_in_pty(
    args: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    size: tuple[int, int] = (50, 200),
    timeout: float = 300,
    python: bool = False,
) -> PtyRun:
    """``python -m reconciler ARGS`` (``python ARGS`` with ``python``) on a pty of ``size``
    (rows, columns); all it wrote."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
    # COLUMNS and LINES would win over the pty's own size (shutil.get_terminal_size reads
    # them first), and pytest-xdist's workers have them set (80 × 24).
    for name in ("CI", "NO_COLOR", "NODE_NAME", "COLUMNS", "LINES"):
        full_env.pop(name, None)
    full_env["TERM"] = "xterm-256color"
    full_env.update(env or {})
    master, slave = pty.openpty()
    rows, cols = size
    import fcntl

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, *([] if python else ["-m", "reconciler"]), *map(str, args)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=full_env,
        cwd=REPO,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"timed out; output so far: {b''.join(chunks)!r}")
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    # The child is gone; what it wrote is still readable until EIO.
                    ready = [master]
                else:
                    continue
            try:
                data = os.read(master, 65536)
            except OSError as e:
                if e.errno == errno.EIO:  # the slave side closed: all read
                    break
                raise
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    code = proc.wait(timeout=30)
    return PtyRun(code, b"".join(chunks).decode("utf-8", errors="replace").replace("\r\n", "\n"))
