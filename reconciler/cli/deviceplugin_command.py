"""``vgpuctl device-plugin``: run the kubelet device plugins alone, one per vGPU profile.

It rescans the host every ``--rescan-interval`` seconds and learns from the apply journal which
vGPUs vgpuctl removed on purpose (those are dropped; any other vanished vGPU is advertised
Unhealthy), so a separate ``vgpuctl apply`` is picked up by itself. The watch mode embeds the
same plugins. SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "device-plugin",
        help="advertise the node's vGPU profiles to the kubelet (runs until stopped)",
        description="Serve one kubelet device plugin (gRPC v1beta1) per vGPU profile on the "
        "node, register each with the kubelet, and keep the device lists current by "
        "rescanning the host. Node allocatable then shows nvidia.com/<profile>: <count>.",
    )
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=Path(DEFAULT_PLUGIN_DIR),
        metavar="DIR",
        help=f"the kubelet's device-plugin directory (default {DEFAULT_PLUGIN_DIR})",
    )
    p.add_argument(
        "--rescan-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often to rescan the host for vGPU changes (default 2)",
    )
    p.set_defaults(handler=cmd_device_plugin)
    return p


def cmd_device_plugin(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import logging  # here: importing it costs every other command's start

    from reconciler.deviceplugin import run_standalone

    if ns.rescan_interval <= 0:
        from reconciler.model import UsageError

        raise UsageError("--rescan-interval must be positive")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    host = Host(options)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("vgpuctl").info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run_standalone(
        sysfs_root=options.sysfs_root,
        plugin_dir=ns.plugin_dir,
        node=options.node,
        state_dir=host.state_dir,
        catalog=host.catalog,
        hold_probe=None,  # the plugins need no holders: no /proc scan per rescan
        rescan_interval=ns.rescan_interval,
        stop_event=stop,
        known_types=host.vfio_known_types,
        name_unknown=host.learn_vfio_types,
    )
    return 0
