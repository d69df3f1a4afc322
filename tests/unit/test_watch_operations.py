"""The operations side of watch: the HTTP endpoint, --listen parsing, and the log formats."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from reconciler.watch.endpoint import OperationsEndpoint, Verdict, parse_listen
from reconciler.watch.logs import JsonFormatter, TextFormatter, fields_of

# -- --listen ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9477", ("127.0.0.1", 9477)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),  # noqa: S104 - parsed, not bound
        (":9477", ("", 9477)),
        ("[::1]:8080", ("::1", 8080)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9477", "is not HOST:PORT"),
        ("127.0.0.1:http", "must be a number"),
        ("127.0.0.1:65536", "must be a number from 0 to 65535"),
        ("::1:9477", "in brackets"),
    ],
)
def test_bad_listen_addresses_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen(text)


# -- the endpoint ------------------------------------------------------------------------------


class Probes:
    def __init__(self) -> None:
        self.health = Verdict(True, "alive: last sign of life 0.1 s ago")
        self.ready = Verdict(False, "waiting for the first reconcile")


@pytest.fixture
def probes() -> Probes:
    return Probes()


@pytest.fixture
def endpoint(probes: Probes) -> Iterator[OperationsEndpoint]:
    server = OperationsEndpoint(
        host="127.0.0.1",
        port=0,
        health=lambda: probes.health,
        readiness=lambda: probes.ready,
        metrics=lambda: b"vgpuctl_converged 1.0\n",
        metrics_content_type="text/plain; version=0.0.4; charset=utf-8",
    )
    yield server
    server.close()


def get(endpoint: OperationsEndpoint, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(endpoint.url + path, timeout=5) as answer:  # noqa: S310
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_port_zero_binds_a_free_port(endpoint: OperationsEndpoint) -> None:
    host, port = endpoint.address
    assert host == "127.0.0.1"
    assert port > 0
    assert endpoint.url == f"http://127.0.0.1:{port}"


def descriptors() -> dict[int, str]:
    """This process's open descriptors and what each refers to (``socket:[123]``, ``pipe:[4]``)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def test_close_stops_serving_and_frees_the_port_and_its_descriptors(probes: Probes) -> None:
    before = descriptors()
    server = OperationsEndpoint(
        host="127.0.0.1",
        port=0,
        health=lambda: probes.health,
        readiness=lambda: probes.ready,
        metrics=lambda: b"",
        metrics_content_type="text/plain",
    )
    assert get(server, "/healthz")[0] == 200
    # What the endpoint opened: compared by identity, not by count, because other threads of
    # this test process (a gRPC core left by an earlier test) may open and close their own.
    opened = {fd: what for fd, what in descriptors().items() if before.get(fd) != what}
    assert sum(what.startswith("socket:") for what in opened.values()) >= 1
    assert sum(what.startswith("pipe:") for what in opened.values()) >= 2  # the wake-up pipe
    host, port = server.address
    server.close()
    assert not server._thread.is_alive()
    still = {fd: what for fd, what in descriptors().items() if opened.get(fd) == what}
    assert still == {}
    with socket.create_server((host, port)):  # the port is free again at once
        pass


def test_probes_answer_200_or_503_with_the_reason(
    endpoint: OperationsEndpoint, probes: Probes
) -> None:
    assert get(endpoint, "/healthz")[0::2] == (200, "alive: last sign of life 0.1 s ago\n")
    assert get(endpoint, "/readyz")[0::2] == (503, "waiting for the first reconcile\n")
    probes.ready = Verdict(True, "ready: converged")
    assert get(endpoint, "/readyz")[0::2] == (200, "ready: converged\n")
    assert get(endpoint, "/readyz?verbose")[0] == 200


def test_metrics_are_served_in_the_prometheus_text_format(endpoint: OperationsEndpoint) -> None:
    status, content_type, body = get(endpoint, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert body == "vgpuctl_converged 1.0\n"


def test_anything_else_is_404(endpoint: OperationsEndpoint) -> None:
    assert get(endpoint, "/")[0] == 404
    assert get(endpoint, "/healthz/x")[0] == 404


def test_a_probe_that_raises_answers_500_and_the_server_keeps_serving(
    probes: Probes,
) -> None:
    def broken() -> Verdict:
        raise RuntimeError("bug")

    server = OperationsEndpoint(
        host="127.0.0.1",
        port=0,
        health=broken,
        readiness=lambda: probes.ready,
        metrics=lambda: b"",
        metrics_content_type="text/plain",
    )
    try:
        assert get(server, "/healthz")[0] == 500
        assert get(server, "/readyz")[0] == 503
    finally:
        server.close()


def test_a_port_in_use_is_an_os_error(endpoint: OperationsEndpoint) -> None:
    with pytest.raises(OSError, match="in use"):
        OperationsEndpoint(
            host="127.0.0.1",
            port=endpoint.address[1],
            health=lambda: Verdict(True, ""),
            readiness=lambda: Verdict(True, ""),
            metrics=lambda: b"",
            metrics_content_type="text/plain",
        )


def raw_exchange(endpoint: OperationsEndpoint, *pieces: bytes, pause: float = 0.0) -> bytes:
    """Send ``pieces`` (``pause`` seconds apart) and read until the server closes."""
    with socket.create_connection(endpoint.address, timeout=5) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(pause)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_request_arriving_in_pieces_is_answered_once_its_head_is_complete(
    endpoint: OperationsEndpoint,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.31\r\n\r\n"
    answer = raw_exchange(endpoint, *(request[i : i + 3] for i in range(0, len(request), 3)))
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n")
    assert answer.endswith(b"\r\n\r\nalive: last sign of life 0.1 s ago\n")


def test_bare_newlines_end_a_request_head_too(endpoint: OperationsEndpoint) -> None:
    assert raw_exchange(endpoint, b"GET /readyz HTTP/1.0\n\n").startswith(b"HTTP/1.0 503 ")


def test_a_request_head_over_8_kib_is_431_and_closed(endpoint: OperationsEndpoint) -> None:
    endless = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 9000
    answer = raw_exchange(endpoint, endless)
    assert answer.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n")
    # Just under the bound is still served.
    fits = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 8000 + b"\r\n\r\n"
    assert len(fits) <= 8192
    assert raw_exchange(endpoint, fits).startswith(b"HTTP/1.0 200 ")


def test_what_is_not_a_get_is_answered_by_the_standard_library_rules(
    endpoint: OperationsEndpoint,
) -> None:
    assert raw_exchange(endpoint, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 501 ")
    assert b"400 - Bad request syntax" in raw_exchange(endpoint, b"GET\r\n\r\n")
    assert b"505 - Cannot fulfill" in raw_exchange(endpoint, b"GET / HTTP/2.0\r\n\r\n")


def test_the_server_header_names_no_python_version(endpoint: OperationsEndpoint) -> None:
    head = raw_exchange(endpoint, b"GET /healthz HTTP/1.1\r\n\r\n").split(b"\r\n\r\n")[0]
    assert b"\r\nServer: vgpuctl\r\n" in head


def test_at_the_connection_cap_the_oldest_connection_makes_room(probes: Probes) -> None:
    server = OperationsEndpoint(
        host="127.0.0.1",
        port=0,
        health=lambda: probes.health,
        readiness=lambda: probes.ready,
        metrics=lambda: b"",
        metrics_content_type="text/plain",
        max_connections=3,
    )
    try:
        idle = [socket.create_connection(server.address, timeout=5) for _ in range(3)]
        try:
            assert get(server, "/healthz")[0] == 200  # the 4th: the oldest idle one went
            assert idle[0].recv(1) == b""
            for sock in idle[1:]:  # the others are still open
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in idle:
                sock.close()
    finally:
        server.close()


def test_a_large_answer_reaches_a_slow_reader_whole_and_probes_go_on_meanwhile(
    probes: Probes,
) -> None:
    body = bytes(range(256)) * 65536  # 16 MiB: more than the socket buffers take at once
    server = OperationsEndpoint(
        host="127.0.0.1",
        port=0,
        health=lambda: probes.health,
        readiness=lambda: probes.ready,
        metrics=lambda: body,
        metrics_content_type="text/plain",
    )
    try:
        with socket.create_connection(server.address, timeout=5) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            first = slow.recv(1024)
            assert get(server, "/healthz")[0] == 200  # not stuck writing to the slow one
            chunks = [first]
            while chunk := slow.recv(65536):
                chunks.append(chunk)
        assert b"".join(chunks).split(b"\r\n\r\n", 1)[1] == body
    finally:
        server.close()


@pytest.mark.parametrize(
    ("option", "message"),
    [({"idle_timeout": 0.0}, "idle timeout"), ({"max_connections": 0}, "one connection")],
)
def test_limits_must_be_positive(option: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OperationsEndpoint(
            host="127.0.0.1",
            port=0,
            health=lambda: Verdict(True, ""),
            readiness=lambda: Verdict(True, ""),
            metrics=lambda: b"",
            metrics_content_type="text/plain",
            **option,  # type: ignore[arg-type]
        )


# -- logs ----------------------------------------------------------------------------------------


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("vgpuctl.watch")
    rec = logger.makeRecord(
        "vgpuctl.watch", logging.WARNING, __file__, 1, msg, args, None, extra=extra
    )
    rec.created = 1767225600.25  # 2026-01-01T00:00:00.250Z
    rec.msecs = 250.0
    return rec


def test_json_lines_carry_ts_level_logger_msg_and_the_fields() -> None:
    line = JsonFormatter().format(
        record("reconcile failed: %s", "boom", error="lock", retry_in=1.5, file=None)
    )
    assert json.loads(line) == {
        "ts": "2026-01-01T00:00:00.250Z",
        "level": "warning",
        "logger": "vgpuctl.watch",
        "msg": "reconcile failed: boom",
        "error": "lock",
        "retry_in": 1.5,
        "file": None,
    }
    assert "\n" not in line


def test_json_lines_hold_a_traceback_in_one_field() -> None:
    try:
        raise RuntimeError("bug")
    except RuntimeError:
        rec = record("internal error")
        rec.exc_info = sys.exc_info()
    doc = json.loads(JsonFormatter().format(rec))
    assert "RuntimeError: bug" in doc["exc"]


def test_text_lines_append_fields_as_key_value() -> None:
    line = TextFormatter().format(
        record("converged", reason="host", seconds=0.031, summary={"create": 1}, note="two words")
    )
    assert line == (
        "2026-01-01T00:00:00.250Z WARNING vgpuctl.watch: converged reason=host seconds=0.031 "
        'summary={"create":1} note="two words"'
    )


def test_fields_are_only_what_came_through_extra() -> None:
    assert fields_of(record("plain")) == {}


def test_configured_logging_keeps_urllib3_retry_warnings_out() -> None:
    """An API server that is down: urllib3 would warn of every retry of every request."""
    from reconciler.watch.logs import configure

    urllib3_logger = logging.getLogger("urllib3")
    root = logging.getLogger()
    saved = (urllib3_logger.level, root.level)
    handler = configure(log_format="json")
    try:
        assert not logging.getLogger("urllib3.connectionpool").isEnabledFor(logging.WARNING)
        assert logging.getLogger("urllib3.connectionpool").isEnabledFor(logging.ERROR)
        assert logging.getLogger("vgpuctl.watch").isEnabledFor(logging.INFO)
    finally:
        root.removeHandler(handler)
        urllib3_logger.setLevel(saved[0])
        root.setLevel(saved[1])
