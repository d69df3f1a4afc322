"""Find the cluster: a kubeconfig file, or the service account of the pod we run in.

Each connection gets a ``Configuration`` and ``ApiClient`` of its own; the ``kubernetes``
package's process-wide default configuration is never set (``load_kube_config`` and
``load_incluster_config`` without ``client_configuration`` would set it). Nothing is sent
until the first request, so connecting to an unreachable server succeeds and the first call
raises :class:`~reconciler.model.ClusterUnavailableError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.kube.api import KubernetesApi
from reconciler.model import ClusterError

#: Set by the kubelet in every pod; how in-cluster configuration is detected.
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"

#: Connection attempts after the first: a refused or reset connection never reached the
#: server, so trying again is safe even for a write. Reads are not retried (a slow server
#: would multiply the timeout), nor are error statuses (the engine handles those itself).
CONNECT_RETRIES = 2

USER_AGENT = "vgpuctl"


def connect(
    kubeconfig: Path | None,
    *,
    in_cluster: bool | None = None,
    timeout: float = 10,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> KubernetesApi:
    """An adapter for the cluster ``kubeconfig`` names, else (``in_cluster`` None) the one
    this pod runs in when ``KUBERNETES_SERVICE_HOST`` is set.

    ``in_cluster=True`` insists on the pod's service account, ``False`` forbids it. Raises
    :class:`~reconciler.model.ClusterError` with one line naming the file or the reason.
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    env = os.environ if environ is None else environ
    if in_cluster and kubeconfig is not None:
        raise ClusterError("choose either a kubeconfig or the in-cluster service account")
    if kubeconfig is not None:
        return KubernetesApi(_from_kubeconfig(kubeconfig, context), timeout=timeout)
    if in_cluster or (in_cluster is None and env.get(SERVICE_HOST_ENV)):
        return KubernetesApi(_in_cluster(), timeout=timeout)
    raise ClusterError(
        f"no cluster configured: pass --kubeconfig, or run in a pod ({SERVICE_HOST_ENV} is not set)"
    )


def _configuration() -> Any:
    import urllib3
    from kubernetes.client import Configuration

    cfg = Configuration()
    cfg.retries = urllib3.Retry(
        total=CONNECT_RETRIES,
        connect=CONNECT_RETRIES,
        read=0,
        status=0,
        redirect=0,
        backoff_factor=0.1,
        raise_on_status=False,
    )
    return cfg


def _from_kubeconfig(path: Path, context: str | None) -> Any:
    from kubernetes.config import ConfigException, new_client_from_config

    # The client's config loaders are not annotated; strict mypy would refuse the call.
    load: Any = new_client_from_config
    if not path.exists():
        raise ClusterError(f"kubeconfig {path}: no such file")
    if path.is_dir():
        raise ClusterError(f"kubeconfig {path}: is a directory, not a file")
    try:
        client = load(
            config_file=str(path),
            context=context,
            # Token refreshes must not rewrite the operator's file behind their back.
            persist_config=False,
            client_configuration=_configuration(),
        )
    except ConfigException as e:
        raise ClusterError(f"kubeconfig {path}: {_one_line(e)}") from None
    except OSError as e:
        raise ClusterError(f"kubeconfig {path}: cannot read it: {e.strerror or e}") from None
    except Exception as e:
        # The loader lets YAML errors and malformed structures through as assorted
        # exception types (yaml.YAMLError, TypeError, AttributeError, KeyError).
        raise ClusterError(
            f"kubeconfig {path}: not a usable kubeconfig: {type(e).__name__}: {_one_line(e)}"
        ) from None
    client.user_agent = USER_AGENT
    return client


def _in_cluster() -> Any:
    from kubernetes.client import ApiClient
    from kubernetes.config import ConfigException, load_incluster_config

    cfg = _configuration()
    load: Any = load_incluster_config
    try:
        load(client_configuration=cfg)
    except ConfigException as e:
        raise ClusterError(f"cannot use the pod's service account: {_one_line(e)}") from None
    except OSError as e:
        raise ClusterError(
            f"cannot use the pod's service account: {e.filename}: {e.strerror}"
        ) from None
    client = ApiClient(cfg)
    client.user_agent = USER_AGENT
    return client


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
