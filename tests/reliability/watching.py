"""``vgpuctl watch`` run as the DaemonSet runs it, for the reliability scenarios.

:class:`WatchProcess` starts the agent in the background, in its own process group, with JSON
logs going to a file and an ephemeral operations port (``--listen 127.0.0.1:0``; the bound
address is read from its first log line). The scenarios read it the way an operator's tools
do: ``/readyz``, ``/metrics``, the log lines. Every wait is bounded; a process that outlives
its stop is SIGKILLed with its group and reported as hung, never waited for. A waiting loop
calls the ``tick`` it was given at each poll (the crash scenario's virt-handler heartbeats).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.reliability.hosts import BUG_MARKERS, Run, SimNode, Started

#: Fast enough for a suite, as in the watch integration tests.
RESCAN_INTERVAL = 0.5
DEBOUNCE = 0.05
#: What a reconcile may take per action before watch gives up on it; short, as in crash.py.
ACTION_FLAGS = ("--timeout", "30", "--verify-timeout", "3")


@dataclass(frozen=True, slots=True)
class Done:
    """One action a watch process reports carried out (a ``status: done`` log line)."""

    kind: str
    target: str
    message: str


class WatchProcess:
    """A running ``vgpuctl watch TARGET`` on a simulated node, and what it logged."""

    def __init__(
        self,
        node: SimNode,
        target: Path,
        *,
        out_dir: Path,
        label: str,
        extra: tuple[str, ...] = (),
        rescan_interval: float = RESCAN_INTERVAL,
        debounce: float = DEBOUNCE,
        tick: Callable[[], None] | None = None,
    ) -> None:
        args: list[object] = [
            "watch", target, "--listen", "127.0.0.1:0",
            "--rescan-interval", rescan_interval, "--debounce", debounce,
            "--log-format", "json", *ACTION_FLAGS, *extra,
        ]  # fmt: skip
        if "--kubelet-dir" not in node.flags and "--kubelet-dir" not in extra:
            # Not the host's /var/lib/kubelet: its checkpoint is no business of a test.
            args += ["--kubelet-dir", node.dir / "kubelet"]
        if "--plugin-dir" not in extra:
            args.append("--no-device-plugin")
        self.label = label
        self._started = Started([*args, *node.flags], out_dir=out_dir, label=label)
        self._err = out_dir / f"{label}.stderr"
        self.url: str | None = None
        #: Called at each poll of a waiting loop (something to do beside the process while
        #: it runs: ``watch_crash``'s virt-handler heartbeats).
        self.tick = tick or (lambda: None)

    @property
    def pid(self) -> int:
        return self._started.pid

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self._started.proc

    def alive(self) -> bool:
        return self.proc.poll() is None

    # -- what it said ----------------------------------------------------------------------

    def logs(self) -> list[dict[str, Any]]:
        """Every line so far: a JSON log object, or ``{"raw": line}`` for anything else."""
        found: list[dict[str, Any]] = []
        with contextlib.suppress(FileNotFoundError):
            for line in self._err.read_text(errors="replace").splitlines():
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    doc = None
                found.append(doc if isinstance(doc, dict) else {"raw": line})
        return found

    def done(self) -> list[Done]:
        return [
            Done(str(d.get("kind")), str(d.get("target")), str(d.get("msg")))
            for d in self.logs()
            if d.get("status") == "done"
        ]

    def bugs(self) -> list[str]:
        """Tracebacks and internal errors it logged (a line, or a JSON ``exc`` field)."""
        found = []
        for doc in self.logs():
            text = doc.get("raw") or doc.get("msg") or ""
            if doc.get("exc") or any(marker in str(text) for marker in BUG_MARKERS):
                found.append(str(text)[:300] or str(doc.get("exc"))[:300])
        return found

    def errors(self) -> list[str]:
        return [str(d.get("msg")) for d in self.logs() if d.get("level") in ("error", "critical")]

    def wait_log(self, match: Callable[[dict[str, Any]], bool], *, timeout: float) -> bool:
        """Wait (bounded) for a log line ``match`` accepts; False if it exited or time ran out."""
        deadline = time.monotonic() + timeout
        while True:  # looks at least once, whatever the timeout
            if any(match(d) for d in self.logs()):
                return True
            if not self.alive():
                return any(match(d) for d in self.logs())
            if time.monotonic() >= deadline:
                return False
            self.tick()
            time.sleep(0.01)

    def wait_listening(self, *, timeout: float = 30.0) -> bool:
        if self.url is None and self.wait_log(lambda d: "listen" in d, timeout=timeout):
            line = next(d for d in self.logs() if "listen" in d)
            self.url = str(line["listen"])
        return self.url is not None

    # -- its operations endpoint -----------------------------------------------------------

    def get(self, path: str) -> tuple[int, str] | None:
        """(status, body) of ``GET path``; None when it does not answer."""
        if self.url is None and not self.wait_listening(timeout=0.0):
            return None
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:  # noqa: S310
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except (OSError, ValueError):
            return None

    def ready(self) -> bool:
        answer = self.get("/readyz")
        return answer is not None and answer[0] == 200

    def wait_ready(self, *, timeout: float) -> bool:
        """Wait (bounded) for ``/readyz`` to say ready; False if it exited or time ran out."""
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout=timeout)
        while time.monotonic() < deadline:
            if self.ready():
                return True
            if not self.alive():
                return False
            self.tick()
            time.sleep(0.05)
        return False

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of ``/metrics`` (empty when it does not answer)."""
        from prometheus_client.parser import text_string_to_metric_families

        answer = self.get("/metrics")
        if answer is None or answer[0] != 200:
            return {}
        return {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(answer[1])
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, tuple(sorted(labels.items()))))

    # -- ending it -------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the process group (callers hold ``kernel_quiet`` when it matters)."""
        self._started.kill()

    def terminate(self, *, timeout: float = 30.0) -> Run:
        """SIGTERM, as the kubelet stops a pod; wait (bounded). Hung: killed, returncode None."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        return self._started.finish(timeout=timeout)

    def finish(self, *, timeout: float = 30.0) -> Run:
        """Wait (bounded) for it to end, however it ends."""
        return self._started.finish(timeout=timeout)
