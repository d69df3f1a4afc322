"""Watch-mode benchmark: edit-to-converged latency and idle CPU of ``vgpuctl watch``.

On a simulated node (the seed's A2), a ``vgpuctl watch`` process with its shipped defaults
(debounce 0.2 s, rescan every 10 s unless told otherwise) is edited ``--edits`` times, each
edit flipping one VF's profile (``NVIDIA A2-4A`` ↔ ``NVIDIA A2-4C``) the way editors and
ConfigMaps write: a complete new file renamed over the old one. Latency runs from the rename
to the moment the host shows the new type, polled from this process by one ``readlink`` of the
vGPU's ``mdev_type`` every 2 ms (far cheaper than the watch's own work, so the poll does not
slow what it measures). Then the process is left idle for ``--idle-seconds`` and its CPU time
read from ``/proc/<pid>/stat`` (utime + stime).

Also in process: what one idle rescan costs (the host fingerprint) beside a full observation,
on the A2 node and on an 8×L40S node (256 VFs, 48 vGPUs), and what the ``/proc`` hold probe
costs on this machine (it is only part of a rescan when a cluster is configured).

Targets (reported, not asserted): p50 ≤ 1 s, idle ≤ 1 % of a core.
``python tests/bench/watch.py [--edits 50] [--idle-seconds 60] [--device-plugins] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

NODE = "harvester-kgd9c"
SEED = REPO / "desired-state" / "harvester-kgd9c.yaml"
#: The seed's vGPU on VF 0000:08:00.4 (uuid5 of the node and VF: the same on every run).
U4 = "5adb8e42-c29a-5705-8ae0-584ba08668af"
#: The simulator's A2 type ids (its catalogue): what ``mdev_type`` links to.
TYPE_IDS = {"NVIDIA A2-4A": "nvidia-751", "NVIDIA A2-4C": "nvidia-754"}
CONVERGED = 'vgpuctl_reconciles_total{result="converged"}'


def _seed_text(profile: str) -> str:
    return SEED.read_text().replace('"0000:08:00.4": NVIDIA A2-4A', f'"0000:08:00.4": {profile}')


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _summary(samples: list[float]) -> dict[str, float | int]:
    return {
        "p50_s": round(_percentile(samples, 0.50), 4),
        "p95_s": round(_percentile(samples, 0.95), 4),
        "min_s": round(min(samples), 4),
        "max_s": round(max(samples), 4),
        "mean_s": round(statistics.fmean(samples), 4),
        "n": len(samples),
    }


def _median_time(fn: Callable[[], object], *, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class WatchProcess:
    def __init__(self, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUCTL_")}
        env.pop("NODE_NAME", None)
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        self.url = self._listen_address()

    def _listen_address(self, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.log.seek(0)
            for line in self.log:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if "listen" in doc:
                    return str(doc["listen"])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        raise RuntimeError(f"vgpuctl watch did not start:\n{self.log.read()}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as answer:  # noqa: S310
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def sample(self, name: str) -> float:
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
        return (utime + stime) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return 0.0

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def measure_watch(
    work: Path,
    *,
    edits: int,
    idle_seconds: float,
    rescan_interval: float,
    device_plugins: bool = False,
) -> dict[str, Any]:
    """Edits then idle; with ``device_plugins``, the plugins are served and registered with
    a fake kubelet in this process (real gRPC), as in the DaemonSet."""
    if not device_plugins:
        return _measure_watch(
            work, edits=edits, idle_seconds=idle_seconds, rescan_interval=rescan_interval
        )
    from tests.doubles.fake_kubelet import FakeKubelet, make_plugin_dir, remove_plugin_dir

    plugin_dir = make_plugin_dir("bench")
    try:
        with FakeKubelet(plugin_dir):
            return _measure_watch(
                work,
                edits=edits,
                idle_seconds=idle_seconds,
                rescan_interval=rescan_interval,
                plugin_dir=plugin_dir,
            )
    finally:
        remove_plugin_dir(plugin_dir)


def _measure_watch(
    work: Path,
    *,
    edits: int,
    idle_seconds: float,
    rescan_interval: float,
    plugin_dir: Path | None = None,
) -> dict[str, Any]:
    from reconciler.sim import init_host

    host = init_host(work / "host", ["A2@0000:08:00.0"])
    desired = work / "desired-state" / "harvester-kgd9c.yaml"
    desired.parent.mkdir()
    desired.write_text(_seed_text("NVIDIA A2-4A"))
    argv = [
        sys.executable, "-m", "reconciler", "watch", str(desired.parent),
        "--sysfs-root", str(host.sysfs_root), "--node", NODE,
        "--listen", "127.0.0.1:0", "--log-format", "json",
        "--rescan-interval", str(rescan_interval),
    ]  # fmt: skip
    argv += ["--plugin-dir", str(plugin_dir)] if plugin_dir else ["--no-device-plugin"]
    watch = WatchProcess(argv)
    type_link = str(host.sysfs_root / "bus" / "mdev" / "devices" / U4 / "mdev_type")

    def shows(type_id: str) -> bool:
        try:
            return os.readlink(type_link).endswith("/" + type_id)
        except OSError:
            return False  # removed, not yet re-created

    try:
        started = time.perf_counter()
        _wait(lambda: watch.get("/readyz")[0] == 200, "the first convergence")
        first = time.perf_counter() - started  # includes the interpreter's start
        latencies = []
        profile = "NVIDIA A2-4A"
        for i in range(edits):
            profile = "NVIDIA A2-4C" if profile == "NVIDIA A2-4A" else "NVIDIA A2-4A"
            reconciles = watch.sample(CONVERGED)
            t0 = time.perf_counter()
            _write_atomically(desired, _seed_text(profile))
            deadline = t0 + 30
            while not shows(TYPE_IDS[profile]):
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"edit {i}: {profile} never appeared")
                time.sleep(0.002)
            latencies.append(time.perf_counter() - t0)
            # Let the reconcile finish (its final observation) before the next edit, so each
            # edit is measured on its own.
            _wait(
                lambda before=reconciles: watch.sample(CONVERGED) > before,  # type: ignore[misc]
                f"edit {i} reconciled",
            )
        time.sleep(min(1.0, rescan_interval))  # let the last edit's work settle
        rescans_before = watch.sample("vgpuctl_rescan_duration_seconds_count")
        rescan_time_before = watch.sample("vgpuctl_rescan_duration_seconds_sum")
        reconciles_before = watch.sample("vgpuctl_reconcile_duration_seconds_count")
        cpu0, t0 = watch.cpu_seconds(), time.monotonic()
        time.sleep(idle_seconds)
        cpu1, t1 = watch.cpu_seconds(), time.monotonic()
        rescans = watch.sample("vgpuctl_rescan_duration_seconds_count") - rescans_before
        rescan_time = watch.sample("vgpuctl_rescan_duration_seconds_sum") - rescan_time_before
        idle_reconciles = watch.sample("vgpuctl_reconcile_duration_seconds_count")
        idle_reconciles -= reconciles_before
        rss = watch.rss_mib()
    finally:
        stopping = time.monotonic()
        code = watch.stop()
        stop_seconds = time.monotonic() - stopping
    cpu = cpu1 - cpu0
    return {
        "host": "1 x NVIDIA A2 (the seed's node), simulated",
        "settings": {
            "debounce_s": 0.2,
            "rescan_interval_s": rescan_interval,
            "device_plugins": plugin_dir is not None,
        },
        "first_convergence_s": round(first, 3),
        "edit_to_converged": _summary(latencies),
        "idle": {
            "seconds": round(t1 - t0, 2),
            "cpu_seconds": round(cpu, 4),
            "cpu_percent_of_a_core": round(100 * cpu / (t1 - t0), 3),
            "rescans": int(rescans),
            "mean_rescan_s": round(rescan_time / rescans, 5) if rescans else None,
            "reconciles": int(idle_reconciles),
            "rss_mib": rss,
        },
        "exit_code_after_sigterm": code,
        "sigterm_to_exit_s": round(stop_seconds, 3),
        "targets": {"edit_p50_s": 1.0, "idle_cpu_percent": 1.0},
    }


def measure_rescan(work: Path) -> dict[str, Any]:
    """One idle rescan (the host fingerprint) beside a full observation, in process."""
    from reconciler.catalog import default_catalog
    from reconciler.observe import ProcfsHoldProbe, observe_host
    from reconciler.observe.holds import DeviceNodes
    from reconciler.sim import build_host
    from reconciler.watch.signature import HostSignature
    from tests.bench.run import l40s_spec

    catalog = default_catalog()
    seed = {
        "gpus": [
            {
                "model": "A2",
                "address": "0000:08:00.0",
                "vgpus": {
                    "0000:08:00.4": "NVIDIA A2-4A",
                    "0000:08:00.5": "NVIDIA A2-4Q",
                    "0000:08:00.6": "NVIDIA A2-4A",
                    "0000:08:00.7": "NVIDIA A2-4Q",
                },
            }
        ]
    }
    out: dict[str, Any] = {}
    for name, spec, repeat in (("A2_4_vgpus", seed, 300), ("8xL40S_48_vgpus", l40s_spec(), 50)):
        host = build_host(work / name, spec)
        signature = HostSignature(host.sysfs_root)
        signature.compute()  # the first one finds the PFs
        probe = host.hold_probe()
        out[name] = {
            "fingerprint_s": round(_median_time(signature.compute, repeat=repeat), 6),
            "full_observation_s": round(
                _median_time(
                    lambda h=host, p=probe: observe_host(  # type: ignore[misc]
                        h.sysfs_root, node=NODE, catalog=catalog, hold_probe=p
                    ),
                    repeat=max(5, repeat // 10),
                ),
                6,
            ),
        }
    # The /proc scan for holders, as on a real host (not found: every process is read).
    probe = ProcfsHoldProbe()
    nodes = {
        f"00000000-0000-0000-0000-{i:012d}": DeviceNodes(group=str(90000 + i), cdev=f"vfio{i}")
        for i in range(48)
    }
    processes = sum(1 for e in os.listdir("/proc") if e.isdigit())
    out["proc_hold_probe"] = {
        "processes": processes,
        "scan_s": round(_median_time(lambda: probe.scan(nodes), repeat=20), 6),
        "note": "part of a rescan only when a cluster is configured (CR status shows holders)",
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=50, help="edits to time (default 50)")
    parser.add_argument(
        "--idle-seconds", type=float, default=60.0, help="idle CPU window (default 60)"
    )
    parser.add_argument(
        "--rescan-interval", type=float, default=10.0, help="watch's --rescan-interval"
    )
    parser.add_argument(
        "--device-plugins",
        action="store_true",
        help="also measure with the device plugins served to a fake kubelet",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vgpuctl-bench-watch-") as tmp:
        work = Path(tmp)
        (work / "watch").mkdir()
        (work / "rescan").mkdir()
        results = {
            "machine": {
                "tmpdir": tempfile.gettempdir(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "watch": measure_watch(
                work / "watch",
                edits=args.edits,
                idle_seconds=args.idle_seconds,
                rescan_interval=args.rescan_interval,
            ),
            "rescan_in_process": measure_rescan(work / "rescan"),
        }
        if args.device_plugins:
            (work / "watch-plugins").mkdir()
            results["watch_with_device_plugins"] = measure_watch(
                work / "watch-plugins",
                edits=args.edits,
                idle_seconds=args.idle_seconds,
                rescan_interval=args.rescan_interval,
                device_plugins=True,
            )
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
