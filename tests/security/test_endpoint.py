"""The watch agent's operations endpoint against a connection flood.

Anyone who can reach the agent's port (any pod of the cluster, without the NetworkPolicy) can
open connections and never send a request, or trickle one byte a second (slowloris). A
liveness probe that cannot get through restarts the agent; a thread per connection or a
descriptor per connection without limit ends the same way. The agent is run as the DaemonSet
runs it (``vgpuctl watch`` on a simulated host), with the soft descriptor limit many container
runtimes give a process (1024); the idle timeout is tried on the endpoint itself, shortened.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.watch.endpoint import OperationsEndpoint, Verdict
from tests.simnode import SimNode, make_sim
from tests.watch_agent import Watch, seed_text, wait_for

#: "Promptly", generously: the kubelet's own probe timeout is 1 s.
ANSWER_WITHIN_S = 10.0
#: The agent's soft limit on open files in the test (a common container default).
AGENT_NOFILE = 1024
TRICKLERS = 20
CONNECT_TIMEOUT_S = 2.0


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Watch]:
    node: SimNode = make_sim(tmp_path / "host", ["A2@0000:08:00.0"])
    desired = tmp_path / "desired-state"
    desired.mkdir()
    (desired / "harvester-kgd9c.yaml").write_text(seed_text())
    agent = Watch(node, desired)
    try:
        _, hard = resource.prlimit(agent.proc.pid, resource.RLIMIT_NOFILE)
        limit = AGENT_NOFILE if hard == resource.RLIM_INFINITY else min(AGENT_NOFILE, hard)
        resource.prlimit(agent.proc.pid, resource.RLIMIT_NOFILE, (limit, hard))
        wait_for(agent.ready, "the first convergence")
        yield agent
    finally:
        agent.kill()


@pytest.fixture(autouse=True)
def enough_descriptors_for_the_clients() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"the test opens {wanted // 3} sockets; RLIMIT_NOFILE hard is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def address_of(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=ANSWER_WITHIN_S) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def open_descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


@contextlib.contextmanager
def idle_connections(address: tuple[str, int], count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections made one after the other, as a client would, that never send a
    byte. Stops early when a connect times out (a server that no longer accepts: its queue
    is full and the kernel drops new handshakes)."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                opened.append(socket.create_connection(address, timeout=CONNECT_TIMEOUT_S))
            except OSError:
                break
        yield opened
    finally:
        for sock in opened:
            sock.close()


@contextlib.contextmanager
def trickling_connections(
    address: tuple[str, int], count: int, every: float = 1.0
) -> Iterator[list[socket.socket]]:
    """Slowloris: each connection starts a request and sends one more header byte every
    ``every`` seconds, never finishing it."""
    stop = threading.Event()
    with idle_connections(address, count) as socks:

        def trickle() -> None:
            started: set[socket.socket] = set()
            while not stop.wait(every):
                for sock in socks:
                    with contextlib.suppress(OSError):
                        if sock in started:
                            sock.send(b"a")
                        else:
                            sock.send(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
                            started.add(sock)

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            stop.wait(2 * every)  # every one has started its request
            yield socks
        finally:
            stop.set()
            thread.join(timeout=5)


def test_healthz_answers_and_threads_stay_bounded_with_300_idle_and_20_slow_connections(
    watch: Watch,
) -> None:
    pid = watch.proc.pid
    threads_before = proc_status(pid, "Threads")
    address = address_of(watch.url)
    with (
        idle_connections(address, 300),
        trickling_connections(address, TRICKLERS),
    ):
        assert healthz(watch.url) == 200
        # Give a thread-per-connection server every chance to have started its threads.
        time.sleep(1.0)
        assert healthz(watch.url) == 200
        threads_during = proc_status(pid, "Threads")
    # One serving thread whatever the number of clients (+2: the agent's own come and go).
    assert threads_during <= threads_before + 2, (threads_before, threads_during)
    assert healthz(watch.url) == 200


def test_healthz_answers_with_more_idle_connections_than_the_agent_has_descriptors(
    watch: Watch,
) -> None:
    pid = watch.proc.pid
    fds_before = open_descriptors(pid)
    address = address_of(watch.url)
    with idle_connections(address, AGENT_NOFILE + 100):
        assert healthz(watch.url) == 200
        fds_during = open_descriptors(pid)
    # At most 512 client connections, however many come.
    assert fds_during <= fds_before + 512 + 8, (fds_before, fds_during)
    assert healthz(watch.url) == 200


# -- the idle timeout, on the endpoint itself --------------------------------------------------


@pytest.fixture
def make_endpoint() -> Iterator[Callable[..., OperationsEndpoint]]:
    made: list[OperationsEndpoint] = []

    def make(**options: float) -> OperationsEndpoint:
        endpoint = OperationsEndpoint(
            host="127.0.0.1",
            port=0,
            health=lambda: Verdict(True, "alive"),
            readiness=lambda: Verdict(True, "ready"),
            metrics=lambda: b"",
            metrics_content_type="text/plain",
            **options,
        )
        made.append(endpoint)
        return endpoint

    yield make
    for endpoint in made:
        endpoint.close()


def closed_by_server(sock: socket.socket, within: float, *, trickle: bool = False) -> bool:
    """True once the server closed ``sock`` (EOF or reset), within ``within`` seconds; a
    trickling client sends a header byte every 0.2 s meanwhile."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if trickle:
            try:
                sock.send(b"a")
            except OSError:
                return True
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            try:
                return sock.recv(1024) == b""
            except OSError:
                return True
    return False


def test_an_idle_connection_is_closed_after_the_idle_timeout(
    make_endpoint: Callable[..., OperationsEndpoint],
) -> None:
    endpoint = make_endpoint(idle_timeout=1.0)
    with socket.create_connection(endpoint.address, timeout=5) as sock:
        assert closed_by_server(sock, within=10.0)
    assert healthz(endpoint.url) == 200


def test_a_trickling_connection_is_closed_after_the_idle_timeout(
    make_endpoint: Callable[..., OperationsEndpoint],
) -> None:
    endpoint = make_endpoint(idle_timeout=1.0)
    with socket.create_connection(endpoint.address, timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        assert closed_by_server(sock, within=10.0, trickle=True)
    assert healthz(endpoint.url) == 200


def test_the_idle_timeout_is_30_seconds_by_default(
    make_endpoint: Callable[..., OperationsEndpoint],
) -> None:
    assert make_endpoint().idle_timeout == 30.0
