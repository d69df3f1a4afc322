"""The operations endpoint: ``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP.

The standard library's threading HTTP server, on its own daemon thread: a scrape or a probe
never waits for a reconcile, and a reconcile never waits for a slow client. It listens on
loopback unless told otherwise (``--listen``): the answers are harmless, but nothing is
exposed that was not asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("vgpuctl.watch.http")

DEFAULT_LISTEN = "127.0.0.1:9477"


@dataclass(frozen=True, slots=True)
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
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/healthz": lambda: _probe(health()),
            "/readyz": lambda: _probe(readiness()),
            "/metrics": lambda: (200, metrics_content_type, metrics()),
        }
        server_class = _DualStackServer if ":" in host else _Server
        self._server = server_class((host, port), _handler(routes))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_until_closed, name="operations-endpoint", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The address bound (the real port when 0 was asked for)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        self._server.stop()
        self._thread.join(timeout=5)
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    """Serves until :meth:`stop`, which it notices at once: it sleeps on its socket and a wake-up
    pipe, never polls (``serve_forever`` wakes every poll interval, or makes ``shutdown`` wait
    up to one: either idle CPU or a slow exit on SIGTERM)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        # Before binding: a bind that fails calls server_close(), which closes these too.
        self._wake_read, self._wake_write = os.pipe()
        self._stopping = False
        super().__init__(address, handler)

    def serve_until_closed(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._stopping:
                        self.handle_request()  # ready: it does not block

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_write, b"\0")

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)


class _DualStackServer(_Server):
    address_family = socket.AF_INET6


def _probe(verdict: Verdict) -> tuple[int, str, bytes]:
    return (
        (200 if verdict.ok else 503),
        "text/plain; charset=utf-8",
        (verdict.reason + "\n").encode(),
    )


def _handler(
    routes: dict[str, Callable[[], tuple[int, str, bytes]]],
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vgpuctl"

        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                status, content_type, body = 404, "text/plain; charset=utf-8", b"not found\n"
            else:
                try:
                    status, content_type, body = route()
                except Exception:  # a probe must answer, even about a bug
                    log.exception("GET %s failed", self.path)
                    status, content_type, body = 500, "text/plain", b"internal error\n"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes come every few seconds: one log line each would drown the useful ones.
            log.debug("%s %s", self.address_string(), format % args)

    return Handler
