"""A minimal in-test kubelet: only the Registration service, recording what registers.

For unit tests of the plugin server and manager; the full fake kubelet (dial-back,
ListAndWatch, allocatable) is ``fake_kubelet.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from reconciler.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

#: How long a wait may take before the test fails: generous, for a loaded CI machine. A wait
#: returns as soon as its condition holds; how fast things happen is the bench's to measure
#: (tests/bench/deviceplugin.py), never a test's.
PATIENCE_S = 15.0


def wait_until(condition: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    """For states no event announces (a server thread's bookkeeping): bounded polling."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Registry(api_pb2_grpc.RegistrationServicer):
    """Records registrations; refuses the first ``refuse`` of them as a kubelet may."""

    def __init__(self, refuse: int = 0) -> None:
        self.requests: list[api_pb2.RegisterRequest] = []
        self.refused = 0
        self._refuse = refuse
        self._changed = threading.Condition()

    def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        with self._changed:
            if self.refused < self._refuse:
                self.refused += 1
                self._changed.notify_all()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version not supported")
            self.requests.append(request)
            self._changed.notify_all()
        return api_pb2.Empty()

    def wait_for_total(self, count: int, timeout: float = PATIENCE_S) -> bool:
        """Until ``count`` registrations were accepted in all."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.requests) >= count, timeout)

    def wait_for(self, resources: set[str], timeout: float = PATIENCE_S) -> bool:
        """Until every resource in ``resources`` has registered (since this kubelet started)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: resources <= {r.resource_name for r in self.requests}, timeout
            )

    def wait_for_count(self, resource: str, count: int, timeout: float = PATIENCE_S) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count(resource) >= count, timeout)

    def count(self, resource: str) -> int:
        with self._changed:
            return sum(r.resource_name == resource for r in self.requests)

    def resources(self) -> list[str]:
        with self._changed:
            return [r.resource_name for r in self.requests]


@contextmanager
def kubelet(socket: Path, *, refuse: int = 0) -> Iterator[Registry]:
    """Serve Registration on ``socket`` (a kubelet.sock) for the duration."""
    registry = Registry(refuse)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_RegistrationServicer_to_server(registry, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield registry
    finally:
        server.stop(0).wait()
