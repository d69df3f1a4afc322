"""Global options shared by every subcommand, each also read from ``VGPUCTL_<NAME>``.

As with kubectl, a global option works before or after the subcommand: the top-level parser holds
the defaults and each subparser re-declares the options with ``argparse.SUPPRESS`` so a value
given after the subcommand overrides without clobbering one given before it.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from reconciler.model.errors import UsageError
from reconciler.model.record import record
from reconciler.model.retiring import DEFAULT_ALLOW_LIST_GRACE

DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
DEFAULT_STATE_DIR = "/var/lib/vgpuctl"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"


def _env(name: str) -> str | None:
    value = os.environ.get(f"VGPUCTL_{name}")
    return value if value else None


def default_node() -> str:
    # os.uname()'s node name is what socket.gethostname() returns (both are uname(2)'s), without
    # importing socket into every command's start.
    return _env("NODE") or os.environ.get("NODE_NAME") or os.uname().nodename


def add_global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Declare the global options; ``suppress`` for the copies on subparsers."""

    def dflt(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--sysfs-root",
        metavar="PATH",
        default=dflt(None),
        help="sysfs tree to observe and change "
        f"(env VGPUCTL_SYSFS_ROOT; default {DEFAULT_SYSFS_ROOT})",
    )
    group.add_argument(
        "--sriov-manage",
        metavar="CMD",
        default=dflt(None),
        help="NVIDIA sriov-manage command: a path, or a wrapper such as "
        "'chroot /host /usr/lib/nvidia/sriov-manage' (split into argv, never run by a shell; "
        f"env VGPUCTL_SRIOV_MANAGE; default {DEFAULT_SRIOV_MANAGE}, or the simulator's own)",
    )
    group.add_argument(
        "--nvidia-smi",
        metavar="CMD",
        default=dflt(None),
        help="NVIDIA nvidia-smi command, for a GPU's vGPU mode (mode: mixed-size): a path or a "
        "wrapper, as --sriov-manage (env VGPUCTL_NVIDIA_SMI; default /usr/bin/nvidia-smi, or "
        "the simulator's own)",
    )
    group.add_argument(
        "--node",
        metavar="NAME",
        default=dflt(None),
        help="this node's name in the desired state (env VGPUCTL_NODE, else NODE_NAME, "
        "else the host name)",
    )
    group.add_argument(
        "--state-dir",
        metavar="PATH",
        default=dflt(None),
        help="where the per-node lock and journal live (env VGPUCTL_STATE_DIR; default "
        f"{DEFAULT_STATE_DIR}, or DIR/state for a simulated host)",
    )
    group.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=dflt(None),
        help="talk to the cluster this kubeconfig names (env VGPUCTL_KUBECONFIG); without it, "
        "the in-cluster service account when running in a pod, else no cluster: node-local only. "
        "KUBECONFIG is deliberately not read",
    )
    group.add_argument(
        "--kubevirt-namespace",
        metavar="NS",
        default=dflt(None),
        help="namespace of the KubeVirt CR (env VGPUCTL_KUBEVIRT_NAMESPACE; default: found in "
        "any namespace, e.g. harvester-system or kubevirt)",
    )
    group.add_argument(
        "--allow-list-grace",
        metavar="DURATION",
        default=dflt(None),
        help="with a cluster, how long a KubeVirt allow-list entry vgpuctl added and no node "
        "has or wants vGPUs of any more stays marked retiring before a run removes it: "
        "900s, 15m, 1h, 1h30m (env VGPUCTL_ALLOW_LIST_GRACE; default 15m). Any length above 0 "
        "is safe (a node publishes the types it is about to create before its allow-list "
        "check); a longer one avoids removing an entry another node takes up again soon. 0 "
        "removes on the first run that finds no node using the type: UNSAFE with more than "
        "one node (another node's first vGPU of the type may be swept by virt-handler)",
    )
    group.add_argument(
        "--kubelet-dir",
        metavar="PATH",
        default=dflt(None),
        help="the kubelet's directory, for its device-plugin checkpoint (env "
        f"VGPUCTL_KUBELET_DIR; default {DEFAULT_KUBELET_DIR}, or DIR/kubelet on a simulated "
        "host)",
    )
    group.add_argument(
        "--unsafe-assume-no-hidden-holders",
        action="store_true",
        default=dflt(False),
        help="UNSAFE: when vgpuctl cannot see every process of the host (it runs outside the "
        "host's PID namespace, e.g. a pod without hostPID), or a process keeps a VFIO device fd "
        "the kernel does not name (before Linux 6.18), assume no such process holds a vGPU. "
        "Without it every vGPU then counts as in use and its removal is blocked: a VM vgpuctl "
        "missed would lose its GPU",
    )
    group.add_argument(
        "--unsafe-kubevirt-allow-listed",
        action="store_true",
        default=dflt(False),
        help="UNSAFE: on a host where KubeVirt runs (its device-plugin sockets, or a "
        "virt-handler process) and no cluster is connected, create mdev vGPUs anyway: the "
        "operator asserts that every type vgpuctl creates here is allow-listed by hand in the "
        "KubeVirt CR (permittedHostDevices.mediatedDevices with externalResourceProvider: "
        "true). Otherwise virt-handler removes those vGPUs within a minute or two, in use by a "
        "VM or not. Without it such creates are blocked; the plan notes its use",
    )
    group.add_argument(
        "--no-color",
        action="store_true",
        default=dflt(False),
        help="never colour output (also NO_COLOR or VGPUCTL_NO_COLOR)",
    )


@record(frozen=True, slots=True)
class GlobalOptions:
    sysfs_root: Path
    sriov_manage: str | None  # None: the default (or the simulator's)
    node: str
    state_dir: Path | None  # None: the default (or the simulator's)
    no_color: bool
    kubeconfig: Path | None = None
    kubevirt_namespace: str | None = None
    kubelet_dir: Path | None = None  # None: the default (or the simulator's)
    #: ``--unsafe-assume-no-hidden-holders`` (a flag only: no environment variable sets it).
    assume_no_hidden_holders: bool = False
    nvidia_smi: str | None = None  # None: the default (or the simulator's)
    #: ``--unsafe-kubevirt-allow-listed`` (a flag only: no environment variable sets it).
    kubevirt_allow_listed: bool = False
    #: ``--allow-list-grace``, in seconds (``model.retiring``).
    allow_list_grace: float = DEFAULT_ALLOW_LIST_GRACE

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> GlobalOptions:
        no_color = bool(ns.no_color or os.environ.get("NO_COLOR") or _env("NO_COLOR"))
        state_dir = ns.state_dir or _env("STATE_DIR")
        kubeconfig = ns.kubeconfig or _env("KUBECONFIG")
        kubelet_dir = ns.kubelet_dir or _env("KUBELET_DIR")
        return cls(
            sysfs_root=Path(ns.sysfs_root or _env("SYSFS_ROOT") or DEFAULT_SYSFS_ROOT),
            sriov_manage=ns.sriov_manage or _env("SRIOV_MANAGE"),
            node=ns.node or default_node(),
            state_dir=Path(state_dir) if state_dir else None,
            no_color=no_color,
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            kubevirt_namespace=ns.kubevirt_namespace or _env("KUBEVIRT_NAMESPACE"),
            kubelet_dir=Path(kubelet_dir) if kubelet_dir else None,
            assume_no_hidden_holders=bool(ns.unsafe_assume_no_hidden_holders),
            nvidia_smi=ns.nvidia_smi or _env("NVIDIA_SMI"),
            kubevirt_allow_listed=bool(ns.unsafe_kubevirt_allow_listed),
            allow_list_grace=_grace(ns.allow_list_grace or _env("ALLOW_LIST_GRACE")),
        )


#: A duration as ``--allow-list-grace`` takes it: seconds alone, or hours, minutes and
#: seconds each with its unit, in that order (``900``, ``15m``, ``1h30m``, ``90s``).
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> float:
    """Seconds of a duration (``15m`` → 900.0); ValueError naming the text otherwise."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration (900, 900s, 15m, 1h30m)")
    hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
    return float(hours * 3600 + minutes * 60 + secs)


def _grace(text: str | None) -> float:
    if text is None:
        return DEFAULT_ALLOW_LIST_GRACE
    try:
        return parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--allow-list-grace: {e}") from None
