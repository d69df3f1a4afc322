"""``vgpuctl watch FILE|DIR``: the node agent's main process (the DaemonSet runs it).

Composition only: the node's ports come from :class:`~reconciler.cli.host.Host` as for
``apply``; the device plugins (``reconciler.deviceplugin``, which loads grpc: only this command
does) and the cluster's fingerprint are built here and handed to the loop
(``reconciler.watch``), which knows neither the kube adapter nor grpc.

Signals: SIGTERM and SIGINT ask the loop to stop; a reconcile under way runs to its end (never
interrupted between two sysfs writes), then the device plugins stop and the process exits 0.
The handler only wakes the main thread through a pipe (``signal.set_wakeup_fd``): it takes no
lock, so it cannot deadlock with the code it interrupts.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from reconciler.cli.budget import add_budget_options, node_budget
from reconciler.cli.commands import add_adopt_option, add_apply_options, add_partial_option
from reconciler.cli.delegation import (
    add_delegate_option,
    add_rollout_options,
    delegating,
    rollout_flags,
)
from reconciler.cli.host import Host
from reconciler.cli.options import GlobalOptions
from reconciler.model import UsageError
from reconciler.model.record import record

if TYPE_CHECKING:
    import logging

    from reconciler.deviceplugin import PluginManager
    from reconciler.watch.endpoint import OperationsEndpoint, Verdict
    from reconciler.watch.metrics import WatchMetrics

EXIT_OK, EXIT_ERROR = 0, 1
DEFAULT_LISTEN = "127.0.0.1:9477"
DEFAULT_LEASE = "vgpuctl-delegate"
DEFAULT_LEASE_NAMESPACE = "vgpuctl-delegate"
#: Where a pod's service account says its namespace.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: A namespace (DNS-1123 label) and a Lease name (DNS-1123 subdomain).
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch",
        help="keep this node converged on a desired state, continuously (the node agent)",
        description="Reconcile at start, then whenever the desired-state file or directory "
        "changes (editors' rename-over, a ConfigMap update, a git-sync checkout), the host "
        "drifts (a cheap rescan every --rescan-interval seconds: a vGPU removed by hand, a "
        "reboot) or our cluster objects are edited. One reconcile at a time; transient "
        "failures are retried with backoff, permanent ones when an input changes (or after "
        "300 s); an invalid desired state is reported and the last valid one "
        "stays in force. Serves /healthz, /readyz and /metrics on --listen, and the kubelet "
        "device plugins for the vGPUs. SIGTERM/SIGINT finish the reconcile under way and "
        "exit 0. With --delegate harvester (or found on its own where Harvester's "
        "pcidevices-controller runs), it keeps every node of the desired state converged "
        "through Harvester's objects instead, acting only while it holds a Lease (run it as "
        "deploy/harvester/'s Deployment).",
    )
    p.add_argument(
        "path",
        metavar="FILE|DIR",
        help="a desired-state file, or a directory of them (its *.yaml and *.yml files; "
        "names starting with a dot are skipped)",
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address of /healthz, /readyz and /metrics (default {DEFAULT_LISTEN}; port 0 "
        "picks a free port, logged at start; 0.0.0.0:9477 for probes and scrapes from "
        "outside the pod)",
    )
    p.add_argument(
        "--rescan-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the host (and the cluster) are checked for drift (default 10)",
    )
    p.add_argument(
        "--debounce",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="quiet time after a desired-state file event before it is read (default 0.2)",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines on stderr: text (default), or JSON lines with ts, level, logger, msg "
        "and the line's fields",
    )
    p.add_argument(
        "--plugin-dir",
        metavar="DIR",
        help="the kubelet's device-plugin directory (default: --kubelet-dir/device-plugins)",
    )
    p.add_argument(
        "--no-device-plugin",
        action="store_true",
        help="do not serve the kubelet device plugins",
    )
    add_adopt_option(p)
    add_partial_option(p)
    add_apply_options(p)
    add_delegate_option(p)
    add_rollout_options(p)
    add_budget_options(p, waits=False)
    lease = p.add_argument_group(
        "delegate mode (--delegate harvester)",
        "One replica acts at a time, elected through a coordination.k8s.io Lease; the others "
        "stand by and take over when it stops renewing (docs/delegate.md).",
    )
    lease.add_argument(
        "--lease-name",
        default=DEFAULT_LEASE,
        metavar="NAME",
        help=f"the Lease's name (default {DEFAULT_LEASE})",
    )
    lease.add_argument(
        "--lease-namespace",
        metavar="NAMESPACE",
        help="the Lease's namespace (default: env POD_NAMESPACE, else the pod's service "
        f"account namespace, else {DEFAULT_LEASE_NAMESPACE})",
    )
    lease.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long a standby waits, having seen the Lease unrenewed, before it takes over "
        "(default 15, client-go's; the leader renews every duration/7.5 s and stops acting "
        "when it could not renew for 2/3 of it)",
    )
    lease.add_argument(
        "--identity",
        metavar="ID",
        help="this replica's name in the Lease (default: env POD_NAME, else the host name "
        "with a random suffix)",
    )
    p.set_defaults(handler=cmd_watch)
    return p


def _log() -> logging.Logger:
    import logging  # here: importing it costs every other command's start

    return logging.getLogger("vgpuctl.watch")


def cmd_watch(ns: argparse.Namespace, options: GlobalOptions) -> int:
    import logging

    from reconciler.watch.endpoint import parse_listen
    from reconciler.watch.logs import configure

    if not ns.rescan_interval > 0:
        raise UsageError("--rescan-interval must be a positive number of seconds")
    if ns.debounce < 0:
        raise UsageError("--debounce must not be negative")
    try:
        listen = parse_listen(ns.listen)
    except ValueError as exc:
        raise UsageError(f"--listen {exc}") from None
    # A bad lease option is an error at once, not once delegate mode is found.
    election = None if ns.delegate == "none" else Election.from_args(ns)
    handler = configure(log_format=ns.log_format)
    try:
        return _watch(ns, options, listen, election)
    finally:
        logging.getLogger().removeHandler(handler)


def _watch(
    ns: argparse.Namespace,
    options: GlobalOptions,
    listen: tuple[str, int],
    election: Election | None,
) -> int:
    from prometheus_client import disable_created_metrics

    from reconciler.observe.checkpoint import checkpoint_file
    from reconciler.observe.nodes import node_labels
    from reconciler.watch.clusterwatch import ClusterWatch
    from reconciler.watch.follow import DesiredStateWatch
    from reconciler.watch.loop import WatchLoop, WatchSettings
    from reconciler.watch.metrics import WatchMetrics
    from reconciler.watch.signature import HostSignature
    from reconciler.watch.source import DesiredSource

    host = Host(options)
    if election is not None and delegating(ns, host, announce=_log().info):
        return _watch_delegate(ns, host, listen, election)
    source = DesiredSource.at(Path(ns.path))
    follower: ClusterWatch | None = None
    api = host.cluster_api  # connects (a bad kubeconfig is an error at start, not a retry)
    if api is not None:
        # List once, then watch: rescans compare what the watches keep, with no request.
        follower = ClusterWatch(
            api, node=options.node, kubevirt_namespace=options.kubevirt_namespace
        )
        follower.start(wait=api_timeout(api))
    # Who holds a vGPU matters to a converged node only through the CR status that mirrors
    # it; without a cluster the /proc scan is left to the full observation.
    probe = host.hold_probe() if host.has_cluster else None
    signature = HostSignature(
        options.sysfs_root,
        hold_probe=probe,
        extra_files=(checkpoint_file(host.kubelet_dir),),
    )
    # The *_created series double every counter for a start time nobody graphs; the
    # switch is process-wide, and this process is the agent.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    metrics = WatchMetrics()
    settings = WatchSettings(
        rescan_interval=ns.rescan_interval,
        debounce=ns.debounce,
        adopt=ns.adopt,
        partial=ns.partial,
        verify_timeout=ns.verify_timeout,
        action_budget=max(ns.timeout, ns.write_timeout) + ns.verify_timeout + 60.0,
    )
    plugins = _device_plugins(ns, options, host=host)
    loop: WatchLoop | None = None

    def changed() -> None:
        if loop is not None:
            loop.desired_changed()

    files = DesiredStateWatch(source, on_change=changed)
    endpoint: OperationsEndpoint | None = None
    try:
        loop = WatchLoop(
            source=source,
            node=options.node,
            catalog=host.catalog,
            ports=partial(host.ports, command_timeout=ns.timeout, write_timeout=ns.write_timeout),
            host_signature=signature.compute,
            cluster_signature=None if follower is None else follower.signature,
            plugins=plugins,
            metrics=metrics,
            settings=settings,
            refresh_watches=files.refresh,
            node_labels=None if api is None else partial(node_labels, api, options.node),
            budget=node_budget(ns, host, wait=None),
        )
        endpoint = _endpoint(ns, listen, loop, metrics)
        if plugins is not None:
            _log().info("device plugins: sockets in %s", plugins.plugin_dir)
        return _run_until_signalled(loop)
    finally:
        files.close()
        if follower is not None:
            follower.stop()
        if endpoint is not None:
            endpoint.close()
        if plugins is not None:
            plugins.close()
        _log().info("stopped")


@record(frozen=True, slots=True)
class Election:
    """Delegate mode's leader election, from the command line (checked before anything)."""

    namespace: str
    name: str
    identity: str
    duration: float

    @staticmethod
    def from_args(ns: argparse.Namespace) -> Election:
        if not ns.lease_duration >= 3:
            raise UsageError("--lease-duration must be at least 3 seconds")
        namespace = ns.lease_namespace or _pod_namespace()
        if not _LABEL.fullmatch(namespace):
            raise UsageError(f"--lease-namespace {namespace!r} is not a namespace name")
        if not _SUBDOMAIN.fullmatch(ns.lease_name):
            raise UsageError(f"--lease-name {ns.lease_name!r} is not an object name")
        identity = ns.identity or os.environ.get("POD_NAME") or _host_identity()
        if not 0 < len(identity) <= 253 or not identity.isprintable():
            raise UsageError("--identity must be 1 to 253 printable characters")
        return Election(namespace, ns.lease_name, identity, ns.lease_duration)


def _watch_delegate(
    ns: argparse.Namespace, host: Host, listen: tuple[str, int], election: Election
) -> int:
    """``watch --delegate harvester``: every node of the desired state through Harvester's
    objects, while this replica holds the Lease (reconciler/watch/delegate.py)."""
    from prometheus_client import disable_created_metrics

    from reconciler.apply.lease import LeaderLease
    from reconciler.apply.throttle import TokenBucket
    from reconciler.kube.events import EventRecorder
    from reconciler.watch.clusterwatch import ClusterWatch, delegate_collections
    from reconciler.watch.delegate import DelegateWatchLoop
    from reconciler.watch.follow import DesiredStateWatch
    from reconciler.watch.leader import Leadership
    from reconciler.watch.metrics import WatchMetrics
    from reconciler.watch.scheduler import Scheduler, Trigger
    from reconciler.watch.source import DesiredSource
    from reconciler.watch.worker import WatchSettings

    api = host.cluster_api
    if api is None:  # delegating() checked
        raise UsageError("delegate mode needs a cluster: pass --kubeconfig")
    source = DesiredSource.at(Path(ns.path))
    follower = ClusterWatch(api, specs=delegate_collections())
    follower.start(wait=api_timeout(api))
    disable_created_metrics()  # type: ignore[no-untyped-call]
    metrics = WatchMetrics(delegate=True)
    lease = LeaderLease(
        api, election.namespace, election.name, election.identity, duration=election.duration
    )

    def leadership(scheduler: Scheduler) -> Leadership:
        def changed(leading: bool) -> None:
            if metrics.leader is not None:
                metrics.leader.set(1 if leading else 0)
            if leading:
                scheduler.want_soon(Trigger.LEADER)

        return Leadership(
            lease,
            retry_period=election.duration / 7.5,
            renew_deadline=election.duration * 2 / 3,
            on_change=changed,
            on_error=lambda: metrics.errors.labels(kind="lease").inc(),
        )

    loop: DelegateWatchLoop | None = None

    def desired_changed() -> None:
        if loop is not None:
            loop.desired_changed()

    files = DesiredStateWatch(source, on_change=desired_changed)
    endpoint: OperationsEndpoint | None = None
    try:
        loop = DelegateWatchLoop(
            source=source,
            catalog=host.catalog,
            api=api,
            leadership=leadership,
            cluster_signature=follower.signature,
            metrics=metrics,
            settings=WatchSettings(
                rescan_interval=ns.rescan_interval,
                debounce=ns.debounce,
                # One step's waits, and a margin: /healthz tolerates that long inside a step.
                action_budget=ns.timeout + 60.0,
            ),
            step_timeout=ns.timeout,
            events=EventRecorder(api, component="vgpuctl-delegate", node=election.identity),
            refresh_watches=files.refresh,
            rollout=rollout_flags(ns),
            bucket=TokenBucket(ns.qps, ns.burst),
        )
        endpoint = _endpoint(ns, listen, loop, metrics)
        _log().info(
            "delegate mode: candidate %s for the Lease %s/%s",
            election.identity,
            election.namespace,
            election.name,
            extra={"identity": election.identity},
        )
        loop.leadership.start()
        return _run_until_signalled(loop)
    finally:
        if loop is not None:
            loop.leadership.stop(release=True)
        files.close()
        follower.stop()
        if endpoint is not None:
            endpoint.close()
        _log().info("stopped")


def _host_identity() -> str:
    """The host name with a random suffix: two replicas on one host are two candidates."""
    import socket  # here: importing them costs every other command's start
    import uuid

    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _pod_namespace() -> str:
    from_env = os.environ.get("POD_NAMESPACE")
    if from_env:
        return from_env
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="ascii").strip()[:63] or (
            DEFAULT_LEASE_NAMESPACE
        )
    except (OSError, UnicodeDecodeError):
        return DEFAULT_LEASE_NAMESPACE


def _endpoint(
    ns: argparse.Namespace, listen: tuple[str, int], loop: _Probed, metrics: WatchMetrics
) -> OperationsEndpoint:
    from reconciler.watch.endpoint import OperationsEndpoint
    from reconciler.watch.metrics import CONTENT_TYPE

    try:
        endpoint = OperationsEndpoint(
            host=listen[0],
            port=listen[1],
            health=loop.health,
            readiness=loop.readiness,
            metrics=metrics.exposition,
            metrics_content_type=CONTENT_TYPE,
        )
    except OSError as exc:
        raise UsageError(f"--listen {ns.listen}: {exc.strerror or exc}") from None
    _log().info(
        "serving /healthz, /readyz and /metrics on %s", endpoint.url, extra={"listen": endpoint.url}
    )
    return endpoint


def api_timeout(api: object) -> float:
    """How long a request to the cluster may take (the adapter's timeout; 10 s otherwise)."""
    timeout = getattr(api, "timeout", None)
    return float(timeout) if isinstance(timeout, int | float) else 10.0


def _device_plugins(
    ns: argparse.Namespace, options: GlobalOptions, *, host: Host
) -> PluginManager | None:
    """The device plugins, unless ``--no-device-plugin``. A simulated host has no kubelet of
    its own unless one was given it: with neither ``--plugin-dir`` nor ``--kubelet-dir`` and
    no ``DIR/kubelet/device-plugins``, none are served and a line says so (``sim init`` makes
    a plain KVM host, as ``doctor`` reads it). On a real host a missing directory stays an
    error: an agent whose kubelet mount is wrong must not run on without its plugins, or the
    vGPUs it makes are never allocatable and nothing says why."""
    if ns.no_device_plugin:
        return None
    from reconciler.deviceplugin import PluginDirError, PluginManager

    plugin_dir = Path(ns.plugin_dir) if ns.plugin_dir else host.kubelet_dir / "device-plugins"
    given = ns.plugin_dir or options.kubelet_dir is not None
    if not given and host.simulated and not plugin_dir.exists():
        _log().info(
            "device plugins: not served: this simulated host has no kubelet (%s does not "
            "exist; create it, or pass --plugin-dir, to serve them)",
            plugin_dir,
        )
        return None
    try:
        return PluginManager(plugin_dir=plugin_dir, node=options.node)
    except PluginDirError as exc:
        raise UsageError(
            f"device plugins: {exc.message}; or run without them: --no-device-plugin"
        ) from None


class _Probed(Protocol):
    """What the endpoint asks a loop."""

    def health(self) -> Verdict: ...

    def readiness(self) -> Verdict: ...


class _Runnable(Protocol):
    """A loop the main thread runs until signalled (the node agent's or delegate mode's)."""

    def run(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def stopping(self) -> bool: ...


def _run_until_signalled(loop: _Runnable) -> int:
    """Run the loop on a worker thread; the main thread waits for SIGTERM/SIGINT."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            loop.run()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
        finally:
            os.write(wake_write, b"\0")  # 0 is no signal: "the worker is done"

    previous_fd = signal.set_wakeup_fd(wake_write)
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    worker = threading.Thread(target=work, name="reconcile-worker")
    worker.start()
    try:
        done = False
        while not done:
            for number in os.read(wake_read, 64):
                if number == 0:
                    done = True
                elif number in (signal.SIGTERM, signal.SIGINT):
                    name = signal.Signals(number).name
                    if loop.stopping:
                        _log().info("%s: still finishing the reconcile under way", name)
                    else:
                        _log().info("%s: stopping once the reconcile under way is done", name)
                        loop.stop()
        worker.join()
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wake_read)
        os.close(wake_write)
    if failure:
        exc = failure[0]
        _log().error("the watch loop failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return EXIT_ERROR
    return EXIT_OK


def _ignore(signum: int, frame: object) -> None:
    """The Python-level handler: the wake-up byte the C handler wrote does the work."""
