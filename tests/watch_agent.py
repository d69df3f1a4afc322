"""A ``vgpuctl watch`` agent run as a subprocess, and what tests of it wait for.

Shared by the watch, device-plugin, cluster and security tests (fixtures: ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from reconciler.catalog import default_catalog
from reconciler.observe import observe_host
from reconciler.sim import SimHost
from tests.simnode import NODE, SEED, SimNode

#: The seed's vGPUs: uuid5 of "<node>/<VF>", as the README shows them.
U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"
U5 = "5ed3b3e8-ffe3-55db-be73-567bd703a205"
U6 = "ec1a8b91-526b-5a21-87ce-cae919e6adf0"
U7 = "f3bfb674-5828-5d43-bd4f-47222aae9d34"
SEED_VGPUS = {U4: "NVIDIA A2-4A", U5: "NVIDIA A2-4Q", U6: "NVIDIA A2-4A", U7: "NVIDIA A2-4Q"}
WAIT = 20.0


def seed_text(vf4: str = "NVIDIA A2-4A") -> str:
    return SEED.read_text().replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": {vf4}')


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def vgpus(node: SimNode) -> dict[str, str]:
    """uuid → profile, as the host has them now."""
    root = node.dir / "sys"
    sim = SimHost.open(root)
    assert sim is not None
    inventory = observe_host(
        root, node=NODE, catalog=default_catalog(), hold_probe=sim.hold_probe()
    )
    return {vf.vgpu.uuid: vf.vgpu.type_name for gpu in inventory.gpus for vf in gpu.vfs if vf.vgpu}


class Agent(Protocol):
    """Where a watch runs: its global flags, and a directory of its own."""

    @property
    def flags(self) -> list[str]: ...

    @property
    def dir(self) -> Path: ...


class Watch:
    """A running ``vgpuctl watch`` and what it logged."""

    def __init__(self, node: Agent, target: Path, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
        env.pop("NODE_NAME", None)
        argv = [
            sys.executable,
            "-m",
            "reconciler",
            "watch",
            str(target),
            *node.flags,
            "--listen",
            "127.0.0.1:0",
            "--rescan-interval",
            "0.3",
            "--debounce",
            "0.05",
            "--log-format",
            "json",
            *extra,
        ]
        if "--kubelet-dir" not in node.flags:
            # Not the host's /var/lib/kubelet: its checkpoint is no business of a test.
            argv += ["--kubelet-dir", str(node.dir / "kubelet")]
        if "--plugin-dir" not in extra:
            argv.append("--no-device-plugin")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        listening = self.wait_log(lambda d: "listen" in d, "the listen address")
        self.url = str(listening["listen"])

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"raw": line.rstrip("\n")}
            with self._lock:
                self.lines.append(doc if isinstance(doc, dict) else {"raw": line})

    def logs(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.lines)

    def wait_log(
        self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = WAIT
    ) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"watch exited ({self.proc.returncode}): {self.logs()}")
            found.extend(d for d in self.logs() if match(d))
            return bool(found)

        try:
            wait_for(seen, what, timeout)
        except AssertionError:
            raise AssertionError(f"{what} never logged; logs: {self.logs()}") from None
        return found[0]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:  # noqa: S310
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        _, text = self.get("/metrics")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        raise AssertionError(f"no sample {name}{labels} in /metrics")

    def reconciles(self, result: str = "converged") -> float:
        return self.metric("vgpuctl_reconciles_total", result=result)

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
