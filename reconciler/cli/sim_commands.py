"""``vgpuctl sim …``: build and drive the built-in NVIDIA host simulator.

``sim init DIR`` makes ``DIR/sys``, ``DIR/bin/sriov-manage`` and ``DIR/bin/nvidia-smi``, and
prints the ``export VGPUCTL_SYSFS_ROOT=… VGPUCTL_SRIOV_MANAGE=… VGPUCTL_NVIDIA_SMI=…`` line
(``reconciler/cli/options.py``'s variables) after which every other command drives it without a
flag (``eval "$(vgpuctl sim init …)"``), through the same code that drives a real host.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.cli.options import GlobalOptions
from reconciler.model import UsageError

EXIT_OK = 0


def register(sub: Any) -> argparse.ArgumentParser:
    sim: argparse.ArgumentParser = sub.add_parser(
        "sim",
        help="build and drive a simulated NVIDIA vGPU host",
        description="A simulated host follows the NVIDIA driver's and the kernel's rules "
        "(equal-size profiles, per-size maxima, sriov-manage all-or-nothing, removals of held "
        "vGPUs that block) so plans and applies can be tried without a GPU.",
    )
    ssub = sim.add_subparsers(dest="sim_command", metavar="SIMCOMMAND")
    ssub.required = True

    p = ssub.add_parser(
        "init",
        help="build DIR/sys, DIR/bin/sriov-manage and DIR/bin/nvidia-smi",
        description="Build a simulated host. MODEL is a catalogue name (A2, A16, A10, A40, L4, "
        "L40, L40S, A100-40GB, A100-80GB, H100-80GB); @ADDRESS places its PF (an A16 board "
        "is four GPUs on consecutive buses); a :mdev or :vfio suffix picks that GPU's vGPU "
        "interface, so one host can have GPUs of both kinds (--gpu A2@0000:08:00.0 --gpu "
        "A2@0000:09:00.0:vfio); the mdev bus exists while a GPU uses mdev. SR-IOV starts "
        "disabled.",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument(
        "--gpu",
        dest="gpus",
        metavar="MODEL[@ADDRESS][:mdev|:vfio]",
        action="append",
        required=True,
        help="a GPU to install (repeat for more); :mdev or :vfio sets its interface, else "
        "--interface does (A2@0000:08:00.0:vfio, A2:vfio)",
    )
    p.add_argument(
        "--interface",
        choices=("mdev", "vfio"),
        default="mdev",
        help="the interface of every GPU given without a :mdev or :vfio suffix: mdev (vGPU 16 "
        "and older, kernels before 6.8), or NVIDIA's vendor-specific VFIO interface (vGPU 17+ "
        "on kernel 6.8+: a VF's profile is its nvidia/current_vgpu_type); default mdev",
    )
    p.add_argument(
        "--passthrough",
        metavar="ADDRESS",
        action="append",
        default=[],
        help="bind the GPU at ADDRESS (given as MODEL@ADDRESS) to vfio-pci: passed through "
        "whole to a VM; vgpuctl must leave it alone (repeat for more)",
    )
    p.add_argument(
        "--no-extra-devices",
        action="store_true",
        help="leave out the non-GPU devices (an Intel SR-IOV NIC, an audio function)",
    )
    p.set_defaults(handler=cmd_init)

    p = ssub.add_parser(
        "hold",
        help="a VM starts using a vGPU (a write removing it blocks until it is released)",
        description="A simulated VM opens the vGPU. vgpuctl's hold probe sees it, so plans "
        "block its removal; a removal that reaches the kernel anyway blocks until 'sim "
        "release', as on a real host. --hidden makes a VM the probe cannot see (one in a PID "
        "namespace vgpuctl cannot look into): its removal reaches the kernel and blocks.",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("uuid", metavar="UUID")
    p.add_argument("--hidden", action="store_true", help="a holder the hold probe cannot see")
    p.add_argument(
        "--device-fd",
        choices=("syspath", "no-syspath"),
        metavar="FDINFO",
        help="the holder is a process that kept only the vGPU's VFIO device fd "
        "(anon_inode:[vfio-device] in the simulated /proc); its fdinfo names the device "
        "('syspath', Linux 6.18+) or not ('no-syspath', older kernels)",
    )
    p.set_defaults(handler=cmd_hold)

    p = ssub.add_parser("release", help="the VM lets go of a vGPU")
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("uuid", metavar="UUID")
    p.set_defaults(handler=cmd_release)

    p = ssub.add_parser(
        "remove",
        help="remove a vGPU by hand (drift), as an administrator's echo 1 > remove would",
        description="Remove the vGPU on the VF at ADDRESS (or the vGPU UUID) behind vgpuctl's "
        "back, as a person at the host would (an mdev's remove, a vfio VF's "
        "current_vgpu_type set 0): drift that the next plan shows and a watch puts back. "
        "Refused while a simulated VM holds it (the kernel would block the write until the VM "
        "lets go: 'sim release' first). Injected faults are left for vgpuctl's own writes.",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("vgpu", metavar="ADDRESS|UUID", help="the VF's address, or the vGPU's UUID")
    p.set_defaults(handler=cmd_remove)

    p = ssub.add_parser(
        "fail",
        help="inject faults into the next writes or sriov-manage call",
        description="One-shot faults: --writes N fails the next N sysfs writes with EIO; "
        "--sriov MODE makes the next sriov-manage call fail (error), exit 0 doing "
        "nothing (silent, a real driver bug) or hang; --crash-after N kills the process "
        "that makes the Nth further change (to test crash recovery).",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("--writes", type=int, default=0, metavar="N")
    p.add_argument(
        "--sriov", dest="sriov_mode", choices=("error", "silent", "hang"), metavar="MODE"
    )
    p.add_argument("--crash-after", type=int, metavar="N")
    p.set_defaults(handler=cmd_fail)

    p = ssub.add_parser("reboot", help="power-cycle: every VF and vGPU is gone")
    p.add_argument("dir", metavar="DIR", type=Path)
    p.set_defaults(handler=cmd_reboot)

    p = ssub.add_parser(
        "virt-handler",
        help="play KubeVirt's virt-handler: sweep mdevs whose type is not allow-listed",
        description="KubeVirt's virt-handler, at each heartbeat, removes every mdev whose type "
        "(spaces → _) is neither a type mediatedDevicesConfiguration wants on the node nor the "
        "mdevNameSelector of a permittedHostDevices.mediatedDevices entry with "
        "externalResourceProvider: true, in use or not (removeUndesiredMDEVs, "
        "pkg/virt-handler/device-manager/mediated_devices_types.go). This reads the KubeVirt CR "
        "from the cluster (--kubeconfig) every --interval seconds and does the same to the "
        "simulated host in DIR (a held vGPU's removal blocks, as in the kernel), one line per "
        "removal. --once: one heartbeat, then exit (status 1 when it removed a vGPU).",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS")
    p.add_argument("--once", action="store_true", help="one heartbeat, then exit")
    p.set_defaults(handler=cmd_virt_handler)

    p = ssub.add_parser(
        "cluster",
        help="serve a local API server with Harvester's and KubeVirt's kinds and N simulated "
        "nodes, until Ctrl-C",
        description="Start a local Kubernetes API server (127.0.0.1, in this process) serving "
        "Harvester's SRIOVGPUDevice and VGPUDevice, vgpuctl's VGPUNodeState, KubeVirt's CR "
        "(harvester-system/kubevirt) and one Node per simulated host (node-1 … node-N, each "
        "built under DIR/nodes/<name> as 'sim init' builds one). Writes DIR/kubeconfig, prints "
        "how to point vgpuctl at it, and serves until SIGINT or SIGTERM (exit 0). The cluster "
        "lives in memory; the hosts stay in DIR.",
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument(
        "--nodes", type=int, default=3, metavar="N", help="how many nodes (1 to 1000; default 3)"
    )
    p.add_argument(
        "--labels",
        dest="node_labels",
        metavar="[NODE:]K=V[,K=V…]",
        action="append",
        default=[],
        help="labels of every Node, or with NODE: of that one (repeat: --labels zone=a "
        "--labels node-2:pool=big)",
    )
    p.add_argument(
        "--gpu",
        dest="gpus",
        metavar="MODEL[@ADDRESS][:mdev|:vfio]",
        action="append",
        help="each node's GPUs, as for 'sim init' (repeat for more; default A2@0000:08:00.0)",
    )
    p.set_defaults(handler=cmd_cluster)
    return sim


def _simulator_call(fn: Callable[..., object], *args: object, **kwargs: object) -> None:
    """Run a simulator function; its ValueError/OSError is the user's error, said in one line."""
    try:
        fn(*args, **kwargs)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from None


def cmd_init(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import init_host

    _simulator_call(
        init_host,
        ns.dir,
        ns.gpus,
        interface=ns.interface,
        extra_devices=not ns.no_extra_devices,
        passthrough=ns.passthrough,
    )
    # Absolute, so that the line still names this host after a cd; quoted for the shell.
    directory = ns.dir.absolute()
    variables = {
        "VGPUCTL_SYSFS_ROOT": directory / "sys",
        "VGPUCTL_SRIOV_MANAGE": directory / "bin" / "sriov-manage",
        "VGPUCTL_NVIDIA_SMI": directory / "bin" / "nvidia-smi",
    }
    if ns.node:  # given on this command line: the next commands are that node too
        variables["VGPUCTL_NODE"] = ns.node
    print(
        f"Simulated host ready in {ns.dir}. Paste the export line below (or run "
        f"'eval \"$(vgpuctl sim init …)\"') and the next commands drive it with no flag; "
        f"or give them --sysfs-root {shlex.quote(str(directory / 'sys'))}.",
        file=sys.stderr,
    )
    print("export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in variables.items()))
    return EXIT_OK


def cmd_hold(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import hold

    _simulator_call(hold, ns.dir, ns.uuid, hidden=ns.hidden, device_fd=ns.device_fd)
    who = "a simulated VM vgpuctl cannot see" if ns.hidden else "a simulated VM"
    if ns.device_fd is not None:
        who = f"a simulated process keeping only its VFIO device fd (fdinfo: {ns.device_fd})"
    print(f"vGPU {ns.uuid} is now held by {who}", file=sys.stderr)
    return EXIT_OK


def cmd_release(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import release

    _simulator_call(release, ns.dir, ns.uuid)
    print(f"vGPU {ns.uuid} is released", file=sys.stderr)
    return EXIT_OK


def cmd_remove(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import remove

    removed: list[tuple[str, str, str]] = []
    _simulator_call(lambda: removed.append(remove(ns.dir, ns.vgpu)))
    uuid, vf, type_name = removed[0]
    what = f"vGPU {uuid}" if uuid != vf else "vGPU"
    print(f"{what} ({type_name}) on VF {vf} removed by hand", file=sys.stderr)
    return EXIT_OK


def cmd_fail(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import fail

    if not (ns.writes or ns.sriov_mode or ns.crash_after):
        raise UsageError("sim fail: give --writes N, --sriov MODE or --crash-after N")
    _simulator_call(
        fail, ns.dir, writes=ns.writes, sriov_manage=ns.sriov_mode, crash_after=ns.crash_after
    )
    return EXIT_OK


def cmd_reboot(ns: argparse.Namespace, options: GlobalOptions) -> int:
    from reconciler.sim import reboot

    _simulator_call(reboot, ns.dir)
    print(f"{ns.dir}: rebooted (SR-IOV off, no vGPUs)", file=sys.stderr)
    return EXIT_OK


def cmd_virt_handler(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import time

    from reconciler.cli.host import Host
    from reconciler.sim.virt_handler import heartbeat

    if not (ns.dir / "sys").is_dir():
        raise UsageError(f"{ns.dir}: not a simulated host (no {ns.dir / 'sys'})")
    if ns.interval <= 0:
        raise UsageError("--interval must be positive")
    api = Host(options).cluster_api
    if api is None:
        raise UsageError("sim virt-handler reads the KubeVirt CR: pass --kubeconfig")
    while True:
        result = heartbeat(ns.dir, api, node=options.node, namespace=options.kubevirt_namespace)
        if result.skipped:
            print(f"virt-handler: nothing swept: {result.skipped}", file=sys.stderr, flush=True)
        for uuid, type_name in sorted(result.removed.items()):
            held = " (in use: its VM lost it)" if uuid in result.held else ""
            print(
                f"virt-handler: removed mdev {uuid} of type {type_name!r}: not allow-listed{held}",
                file=sys.stderr,
                flush=True,
            )
        if ns.once:
            return 1 if result.lost else EXIT_OK
        time.sleep(ns.interval)


def _cluster_labels(
    specs: list[str],
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``--labels``: those of every Node, and those of one (``NODE:K=V,…``; a label key has no
    colon, so the prefix is unambiguous)."""
    from reconciler.cli.explain import parse_labels

    common: dict[str, str] = {}
    per_node: dict[str, dict[str, str]] = {}
    for spec in specs:
        node, colon, rest = spec.partition(":")
        if colon:
            per_node.setdefault(node, {}).update(parse_labels(rest))
        else:
            common.update(parse_labels(spec))
    return common, per_node


def cmd_cluster(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import signal
    import threading

    from reconciler.sim.cluster.fleet import MAX_NODES, start_cluster

    if not 1 <= ns.nodes <= MAX_NODES:
        raise UsageError(f"sim cluster: --nodes must be between 1 and {MAX_NODES}, got {ns.nodes}")
    common, per_node = _cluster_labels(ns.node_labels)
    stop = threading.Event()

    def stopping(signum: int, frame: object) -> None:
        stop.set()

    # Before the server starts: a SIGTERM sent as soon as the kubeconfig appears stops cleanly.
    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    cluster: list[Any] = []
    _simulator_call(
        lambda: cluster.append(
            start_cluster(
                ns.dir,
                nodes=ns.nodes,
                gpus=ns.gpus or ("A2@0000:08:00.0",),
                labels=common,
                node_labels=per_node,
            )
        )
    )
    sim = cluster[0]
    try:
        kubeconfig = sim.kubeconfig.absolute()
        first, *_ = sim.hosts.items()
        print(
            f"Simulated cluster at {sim.url}: {len(sim.hosts)} nodes (node-1 … "
            f"node-{len(sim.hosts)}), hosts under {ns.dir / 'nodes'}, kubeconfig {kubeconfig}.\n"
            "Paste the export line below in another shell, then e.g.:\n"
            f"  vgpuctl apply FILE --node {first[0]} --sysfs-root "
            f"{shlex.quote(str(first[1].absolute() / 'sys'))}   # each node in turn\n"
            "  vgpuctl plan FILE --observed cluster\n"
            "  vgpuctl capacity\n"
            "Ctrl-C (or SIGTERM) stops it.",
            file=sys.stderr,
        )
        print(f"export VGPUCTL_KUBECONFIG={shlex.quote(str(kubeconfig))}", flush=True)
        while not stop.wait(3600):
            pass
    finally:
        sim.stop()
    print("Simulated cluster stopped.", file=sys.stderr)
    return EXIT_OK
