"""Device-plugin benchmarks: refresh → ListAndWatch latency, Allocate latency, kubelet restarts.

Everything runs in process over real gRPC on Unix sockets: the seed's simulated node, the real
:class:`~reconciler.deviceplugin.manager.PluginManager`, and the fake kubelet of the tests.

- ``refresh_to_list_and_watch``: from calling ``manager.update(inventory)`` with a changed
  device set to the updated list arriving at the kubelet (its receive timestamp). The issue's
  target is ≤ 100 ms. The inventories are observed once beforehand, so no sysfs scan is
  included.
- ``allocate``: one ``Allocate`` call (one container, one vGPU) as the kubelet makes it.
- ``kubelet_restart_to_allocatable``: from the start of a kubelet restart (every socket
  deleted) until both resources list all their devices again, restarts spaced out so the
  plugins have settled before each. The issue's target is ≤ 1 s; ``timeouts_5s`` counts
  restarts not recovered from within 5 s.

``python tests/bench/deviceplugin.py`` prints the results as JSON; ``bench(tmp)`` returns them
for ``tests/bench/run.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NODE = "bench-node"
A2_4A = "nvidia.com/NVIDIA_A2-4A"
A2_4Q = "nvidia.com/NVIDIA_A2-4Q"
SEED_SPEC = {
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


def _percentiles(samples_s: Sequence[float], points: Sequence[int]) -> dict[str, Any]:
    """``{"p50_ms": …, "p95_ms": …, "max_ms": …, "n": …}`` for the given percentiles."""
    cuts = statistics.quantiles(samples_s, n=100, method="inclusive")
    out: dict[str, Any] = {}
    for p in points:
        value = statistics.median(samples_s) if p == 50 else cuts[p - 1]
        out[f"p{p}_ms"] = round(value * 1000, 3)
    out["max_ms"] = round(max(samples_s) * 1000, 3)
    out["n"] = len(samples_s)
    return out


def bench(
    tmp: Path,
    *,
    refreshes: int = 100,
    allocations: int = 1000,
    restarts: int = 10,
) -> dict[str, Any]:
    """Run the three measurements on a seed node built under ``tmp``; results as a dict."""
    from reconciler.catalog import default_catalog
    from reconciler.deviceplugin.manager import PluginManager
    from reconciler.observe import observe_host
    from reconciler.sim import build_host
    from tests.doubles.fake_kubelet import FakeKubelet, make_plugin_dir, remove_plugin_dir

    host = build_host(tmp / "dp-host", SEED_SPEC)
    catalog = default_catalog()
    full = observe_host(host.sysfs_root, node=NODE, catalog=catalog)
    u7 = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "sim/0000:08:00.7"))
    host.writer().write(f"bus/mdev/devices/{u7}/remove", "1")
    fewer = observe_host(host.sysfs_root, node=NODE, catalog=catalog)
    u5 = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "sim/0000:08:00.5"))

    plugin_dir = make_plugin_dir("dpbench")
    try:
        with (
            FakeKubelet(plugin_dir) as kubelet,
            PluginManager(plugin_dir=plugin_dir, node=NODE) as manager,
        ):
            manager.update(full)
            kubelet.wait_for(
                lambda: kubelet.allocatable(A2_4A) == 2 and kubelet.allocatable(A2_4Q) == 2,
                timeout=10,
                what="the seed's resources",
            )

            # Refresh → ListAndWatch: alternate 2 and 1 A2-4Q devices (U7 removed on purpose
            # and back), so every update changes the list.
            latencies = []
            for i in range(refreshes):
                inventory, expected = (fewer, 1) if i % 2 == 0 else (full, 2)
                before = kubelet.update_count(A2_4Q)
                t0 = time.perf_counter()
                manager.update(inventory, removed_on_purpose=[u7] if expected == 1 else [])
                kubelet.wait_for(
                    lambda before=before: kubelet.update_count(A2_4Q) > before,  # type: ignore[misc]
                    timeout=5,
                    what="the refreshed list",
                )
                update = kubelet.updates(A2_4Q)[-1]
                assert len(update.devices) == expected, update
                latencies.append(update.at - t0)

            allocate = []
            for _ in range(allocations):
                t0 = time.perf_counter()
                kubelet.allocate(A2_4Q, [u5])
                allocate.append(time.perf_counter() - t0)

            # Isolated restarts: the manager settles (nothing left to serve or register)
            # before each one. A restart not recovered from within 5 s counts as a timeout.
            restart, timeouts = [], 0
            expected_devices = {r: kubelet.devices(r) for r in (A2_4A, A2_4Q)}

            def recovered() -> bool:
                return all(kubelet.devices(r) == d for r, d in expected_devices.items())

            for _ in range(restarts):
                kubelet.wait_for(
                    lambda: recovered() and manager.registered(A2_4A) and manager.registered(A2_4Q),
                    timeout=30,
                    what="the plugins to settle",
                )
                t0 = time.perf_counter()
                kubelet.restart()
                try:
                    kubelet.wait_for(recovered, timeout=5, what="re-registration")
                except AssertionError:
                    timeouts += 1
                else:
                    restart.append(time.perf_counter() - t0)
    finally:
        remove_plugin_dir(plugin_dir)

    return {
        "refresh_to_list_and_watch": {**_percentiles(latencies, (50, 95)), "target_ms": 100},
        "allocate": _percentiles(allocate, (50, 99)),
        "kubelet_restart_to_allocatable": {
            **(_percentiles(restart, (50, 95)) if len(restart) > 1 else {"n": len(restart)}),
            "timeouts_5s": timeouts,
            "target_ms": 1000,
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--refreshes", type=int, default=100)
    parser.add_argument("--allocations", type=int, default=1000)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vgpuctl-bench-dp-") as tmp:
        results = bench(
            Path(tmp),
            refreshes=args.refreshes,
            allocations=args.allocations,
            restarts=args.restarts,
        )
    text = json.dumps({"deviceplugin": results}, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
