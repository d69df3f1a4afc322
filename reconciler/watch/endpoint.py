"""The operations endpoint: ``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP.

One daemon thread serves every connection from a selector: it accepts, reads a request until
its head (request line and headers) is complete, answers it from memory and closes the
connection. The answers are cheap (attributes the watch loop publishes, a metrics snapshot),
so no connection needs a thread of its own, and no client can hold one:

- a connection has ``idle_timeout`` seconds (30) from its accept to send its request head and
  take its answer; bytes trickling in (slowloris) do not extend it;
- a request head longer than :data:`MAX_HEAD` (8 KiB) is answered 431 and closed;
- at most ``max_connections`` (512) are open at once: the oldest is closed to make room, so a
  flood of idle connections costs bounded descriptors and memory and cannot lock out the
  kubelet's probe, whose connection is always the newest.

The HTTP itself (parsing, 400/414/501/505 answers) is the standard library's request handler,
fed the head from memory. A probe never waits for a reconcile and a reconcile never waits for
a client. It listens on loopback unless told otherwise (``--listen``): the answers are
harmless, but nothing is exposed that was not asked for.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from reconciler.model.errors import printable
from reconciler.model.record import field, record

log = logging.getLogger("vgpuctl.watch.http")

DEFAULT_LISTEN = "127.0.0.1:9477"
#: Seconds a connection has from its accept to send its request and take the answer.
DEFAULT_IDLE_TIMEOUT = 30.0
#: Connections open at once; the oldest is closed to make room for a new one.
DEFAULT_MAX_CONNECTIONS = 512
#: The longest request head (request line and headers) answered; a probe sends ~150 bytes.
MAX_HEAD = 8 * 1024
#: Connections the kernel queues before the loop accepts them: a burst of new connections
#: must not make the kubelet's probe wait for a SYN retransmission (1 s, its whole timeout).
_BACKLOG = 128
_CHUNK = 4096
#: The end of a request head: an empty line, after CRLF or a bare LF (as the stdlib reads it).
_HEAD_END = re.compile(rb"\n\r?\n")
_TOO_LARGE = (
    b"HTTP/1.0 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 23\r\n\r\n"
    b"request head too large\n"
)
_INTERNAL_ERROR = (
    b"HTTP/1.0 500 Internal Server Error\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 15\r\n\r\ninternal error\n"
)


@record(frozen=True, slots=True)
class Verdict:
    """A probe's answer: ``ok`` gives 200, else 503; ``reason`` is the body."""

    ok: bool
    reason: str


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port). ``[::1]:9477`` for IPv6; ``:9477`` for every address;
    port 0 picks a free port. Raises ``ValueError`` naming what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:9477)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, as [::1]:9477")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


@record(eq=False, slots=True)
class _Connection:
    """One client: reading its request head, then writing its answer."""

    sock: socket.socket
    peer: tuple[str, int]
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None  # None while the request is being read


_LISTENER = "listener"
_WAKE = "wake"


class OperationsEndpoint:
    """Serves the three paths until :meth:`close`. Raises ``OSError`` when it cannot bind."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        health: Callable[[], Verdict],
        readiness: Callable[[], Verdict],
        metrics: Callable[[], bytes],
        metrics_content_type: str,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if not idle_timeout > 0:
            raise ValueError(f"the idle timeout must be positive: {idle_timeout}")
        if max_connections < 1:
            raise ValueError(f"at least one connection must be allowed: {max_connections}")
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/healthz": lambda: _probe(health()),
            "/readyz": lambda: _probe(readiness()),
            "/metrics": lambda: (200, metrics_content_type, metrics()),
        }
        self._routes = routes
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self._listener = _listen(host, port)
        self._address = self._listener.getsockname()[:2]
        # The serving thread sleeps on the listener, its clients and this pipe, never polls:
        # close() wakes it at once (a fast exit on SIGTERM, no idle CPU).
        self._wake_read, self._wake_write = os.pipe()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_read, selectors.EVENT_READ, _WAKE)
        self._stopping = False
        self._accept_failing = False
        # Accept order is deadline order: the first is the next to expire and the oldest.
        self._connections: dict[_Connection, None] = {}
        self._thread = threading.Thread(target=self._serve, name="operations-endpoint", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The address bound (the real port when 0 was asked for)."""
        host, port = self._address
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"\0")
        self._thread.join(timeout=5)
        self._selector.close()
        self._listener.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the serving thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._until_next_deadline()):
                    if key.data is _LISTENER:
                        self._accept()
                    elif isinstance(key.data, _Connection) and key.data in self._connections:
                        self._step(key.data)
                self._expire()
        finally:
            for conn in list(self._connections):
                self._drop(conn)

    def _until_next_deadline(self) -> float | None:
        first = next(iter(self._connections), None)
        return None if first is None else max(0.0, first.deadline - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        while self._connections:
            first = next(iter(self._connections))
            if first.deadline > now:
                return
            log.debug("closing %s: no complete request in %.0f s", first.peer[0], self.idle_timeout)
            self._drop(first)

    def _accept(self) -> None:
        for _ in range(_BACKLOG):  # what is queued now; the selector says when there is more
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors: free one, and never spin on it
                if not self._accept_failing:  # once, not on every retry
                    log.warning("operations endpoint cannot accept: %s", exc.strerror or exc)
                self._accept_failing = True
                if self._connections:
                    self._drop(next(iter(self._connections)))
                else:
                    time.sleep(0.1)
                return
            self._accept_failing = False
            if len(self._connections) >= self.max_connections:
                self._drop(next(iter(self._connections)))
            sock.setblocking(False)
            deadline = time.monotonic() + self.idle_timeout
            conn = _Connection(sock, (str(peer[0]), int(peer[1])), deadline)
            self._connections[conn] = None
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _step(self, conn: _Connection) -> None:
        try:
            if conn.answer is None:
                self._read(conn)
            else:
                self._write(conn, conn.answer)
        except OSError:  # reset by the client, and the like: nothing to answer
            self._drop(conn)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._drop(conn)
            return
        searched = max(0, len(conn.head) - 2)
        conn.head += data
        end = _HEAD_END.search(conn.head, searched)
        if end is not None and end.end() <= MAX_HEAD:
            self._answer(conn, self._respond(bytes(conn.head[: end.end()]), conn.peer))
        elif len(conn.head) > MAX_HEAD:
            self._answer(conn, _TOO_LARGE)

    def _respond(self, head: bytes, peer: tuple[str, int]) -> bytes:
        try:
            return _Exchange(head, peer, self._routes).answer()
        except Exception:  # a bug must not stop the endpoint
            log.exception("answering %s failed", peer[0])
            return _INTERNAL_ERROR

    def _answer(self, conn: _Connection, response: bytes) -> None:
        conn.head = bytearray()
        conn.answer = memoryview(response)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn, conn.answer)  # almost always all of it at once

    def _write(self, conn: _Connection, answer: memoryview) -> None:
        try:
            sent = conn.sock.send(answer)
        except BlockingIOError:
            return
        conn.answer = answer[sent:]
        if not conn.answer:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._connections.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # A restarted agent binds its port at once, whatever the old one left in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _probe(verdict: Verdict) -> tuple[int, str, bytes]:
    return (
        (200 if verdict.ok else 503),
        "text/plain; charset=utf-8",
        (verdict.reason + "\n").encode(),
    )


class _Exchange(BaseHTTPRequestHandler):
    """One request, its head already read whole, answered into memory: the standard library's
    request parsing and error answers, none of its socket I/O."""

    server_version = "vgpuctl"

    def __init__(
        self,
        head: bytes,
        client_address: tuple[str, int],
        routes: dict[str, Callable[[], tuple[int, str, bytes]]],
    ) -> None:
        # Not the socketserver constructor: there is no socket to read or write here.
        self.routes = routes
        self.client_address = client_address
        self.rfile = io.BytesIO(head)
        self._out = io.BytesIO()
        self.wfile = self._out
        self.handle_one_request()

    def version_string(self) -> str:
        return self.server_version  # the Server header does not advertise the Python version

    def answer(self) -> bytes:
        return self._out.getvalue()

    def do_GET(self) -> None:
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, content_type, body = 404, "text/plain; charset=utf-8", b"not found\n"
        else:
            try:
                status, content_type, body = route()
            except Exception:  # a probe must answer, even about a bug
                log.exception("GET %s failed", printable(self.path))
                status, content_type, body = 500, "text/plain", b"internal error\n"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes come every few seconds: one log line each would drown the useful ones.
        log.debug("%s %s", self.address_string(), printable(format % args))
