"""A real control plane for tests: etcd and kube-apiserver, built by ``tests/realapi/build``.

The real-API tier (``just test-real``) runs cluster-side behaviours against the genuine
kube-apiserver of the Kubernetes release ``tests/realapi/go.mod`` pins, with the etcd that release
requires, as controller-runtime's envtest does: no kubelet, no controller manager, no scheduler.
:func:`real_apiserver` starts both on loopback ports in a temporary directory and stops them:

- etcd: its data directory in the temporary one, client and peer URLs on loopback ports
  (``--unsafe-no-fsync``: a test's data is thrown away).
- kube-apiserver: its serving certificate self-signed (no ``--tls-cert-file``: the API server
  writes ``apiserver.crt`` in ``--cert-dir``, which the kubeconfigs name as their authority),
  ``--authorization-mode=RBAC``, the ValidatingAdmissionPolicy admission plugin enabled, a
  static token file (:data:`IDENTITIES`: an admin in ``system:masters`` and one identity per
  shipped role, by the service-account name its binding names), and the service-account key
  flags it requires (a key made for the run with ``openssl``).

Each server's ``kubeconfig(path, identity)`` is a file the unmodified ``kubernetes`` client and
``vgpuctl --kubeconfig`` read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REALAPI = REPO / "tests" / "realapi"
BUILD = REALAPI / "build"
#: How long the first build took on a 2-core machine (README.md says the same).
FIRST_BUILD = "about 10 minutes"
#: The skip reason of every real-API test on a machine without the binaries.
NOT_BUILT = (
    f"the real API server is not built: run tests/realapi/build ({FIRST_BUILD} the first time)"
)
#: Set (``just test-real``, ``.ci/run`` once it built them), a missing build fails instead.
REQUIRE = "VGPUCTL_REQUIRE_REALAPI"

#: The identities of the static token file: user name and groups. The admin is the cluster's
#: ``system:masters``; the others are the service accounts the shipped bindings name
#: (deploy/rbac.yaml, deploy/harvester/rbac.yaml, examples/gitops/ci-rbac.yaml), with the groups
#: the API server gives a service account's token.
IDENTITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("vgpuctl-test-admin", ("system:masters",)),
    "agent": (
        "system:serviceaccount:vgpuctl-system:vgpuctl",
        ("system:serviceaccounts", "system:serviceaccounts:vgpuctl-system"),
    ),
    "delegate": (
        "system:serviceaccount:vgpuctl-delegate:vgpuctl-delegate",
        ("system:serviceaccounts", "system:serviceaccounts:vgpuctl-delegate"),
    ),
    "ci": (
        "system:serviceaccount:vgpuctl-system:vgpuctl-ci",
        ("system:serviceaccounts", "system:serviceaccounts:vgpuctl-system"),
    ),
}
#: The resource served without a watch cache (``--watch-cache-sizes``): its watches read etcd,
#: so a compaction (:meth:`RealApiServer.compact`) makes an older resourceVersion 410 at once,
#: as the emulator's ``compact`` does (the tests' own CRD, ``api_servers.WATCH_PROBES``).
UNCACHED = "watchprobes.realapi.vgpuctl.invalid"
#: How long etcd and the API server may take to become ready on a loaded machine.
STARTUP_S = 120.0


def _go_mod_version(module: str) -> str:
    """The version ``tests/realapi/go.mod`` requires of ``module`` (as ``build`` reads it)."""
    text = (REALAPI / "go.mod").read_text()
    found = re.search(rf"^(?:require\s+|\s+){re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"tests/realapi/go.mod requires no version of {module}")
    return found.group(1)


KUBERNETES_VERSION = _go_mod_version("k8s.io/kubernetes")
ETCD_VERSION = _go_mod_version("go.etcd.io/etcd/server/v3")


def binaries_dir() -> Path:
    """Where ``tests/realapi/build`` puts the binaries of the pinned versions."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = f"kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"
    return Path(cache) / "vgpuctl-realapi" / name


def built() -> bool:
    """Whether both binaries are there."""
    directory = binaries_dir()
    return all(os.access(directory / b, os.X_OK) for b in ("etcd", "kube-apiserver"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class RealApiServer:
    """A running kube-apiserver: its URL, the authority of its certificate, its tokens."""

    url: str
    ca_file: Path
    tokens: dict[str, str]
    logs: dict[str, Path]
    audit_log: Path
    etcd_url: str = ""
    version: dict[str, Any] = field(default_factory=dict)

    def audit_mark(self) -> int:
        """Where the audit log ends now: :meth:`requests` ``since`` it."""
        return len(self.audit_log.read_text().splitlines())

    def requests(
        self, identity: str, since: int = 0
    ) -> list[tuple[str, str, str, str | None, str | None, str | None]]:
        """Every request ``identity`` (a key of :data:`IDENTITIES`) made, as the API server's
        audit log records it (level Metadata for every identity but the admin): ``(verb,
        group, resource, subresource, namespace, name)``, the emulator's ``Request`` fields, in
        the order they were answered."""
        user = IDENTITIES[identity][0]
        out = []
        seen: set[str] = set()
        for line in self.audit_log.read_text().splitlines()[since:]:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user or event["auditID"] in seen:
                continue
            seen.add(event["auditID"])  # a watch has two stages, ResponseStarted and Complete
            ref = event.get("objectRef") or {}
            out.append((
                event["verb"], ref.get("apiGroup", ""), ref.get("resource", ""),
                ref.get("subresource"), ref.get("namespace"), ref.get("name"),
            ))  # fmt: skip
        return out

    def compact(self, revision: int) -> None:
        """Compact etcd's history up to ``revision`` (a resourceVersion: etcd's revision), as
        the API server's compactor does every five minutes. Watches of :data:`UNCACHED` from an
        older resourceVersion then get 410; other resources are watched through the watch
        cache, which keeps its own window of events regardless."""
        request = urllib.request.Request(  # noqa: S310 (etcd on loopback)
            self.etcd_url + "/v3/kv/compaction",
            data=json.dumps({"revision": revision, "physical": True}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            answer.read()

    def kubeconfig(self, path: Path, identity: str = "admin", *, token: str = "") -> Path:
        """Write a kubeconfig for ``identity`` (a key of :data:`IDENTITIES`), or with ``token``
        (a service account's, from a TokenRequest); returns its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": identity, "user": {"token": token or self.tokens[identity]}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": identity}}],
            "current-context": "real",
        }
        path = path / "kubeconfig" if path.is_dir() else path
        path.write_text(json.dumps(config, indent=2))
        return path

    def get(self, path: str, identity: str = "admin") -> tuple[int, Any]:
        """A GET as ``identity``: the status and the decoded JSON body."""
        request = urllib.request.Request(  # noqa: S310 (the URL is this server's https one)
            self.url + path, headers={"Authorization": f"Bearer {self.tokens[identity]}"}
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as answer:  # noqa: S310
                return answer.status, _decoded(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, _decoded(error.read())


def _decoded(body: bytes) -> Any:
    """A JSON body decoded, any other (``/readyz`` answers ``ok``) as text."""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` in a session of its own, its output to ``log``; at exit SIGTERM, then
    SIGKILL after 15 s."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait(what: str, ready: Any, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {STARTUP_S:.0f} s:\n{_tail(log)}")
        time.sleep(0.1)


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as answer:  # noqa: S310
            return bool(json.loads(answer.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


@contextmanager
def real_apiserver(workdir: Path) -> Iterator[RealApiServer]:
    """Start etcd and kube-apiserver under ``workdir``; stop both (and nothing else) at exit."""
    binaries = binaries_dir()
    if not built():
        raise RuntimeError(NOT_BUILT)
    if shutil.which("openssl") is None:
        raise RuntimeError("the real API server needs openssl for its service-account key")
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    certs.mkdir()
    sa_key = workdir / "service-account.key"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
    )
    tokens = {name: os.urandom(16).hex() for name in IDENTITIES}
    with (workdir / "tokens.csv").open("w") as out:
        for name, (user, groups) in IDENTITIES.items():
            out.write(f'{tokens[name]},{user},uid-{name},"{",".join(groups)}"\n')
    # The requests of every identity but the admin's (the tests' own), as RBAC sees them.
    (workdir / "audit-policy.json").write_text(
        json.dumps({
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "None", "users": [IDENTITIES["admin"][0]]},
                {"level": "Metadata", "users": [u for u, _ in IDENTITIES.values()]},
                {"level": "None"},
            ],
        })
    )  # fmt: skip
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    logs = {"etcd": workdir / "etcd.log", "kube-apiserver": workdir / "kube-apiserver.log"}
    with ExitStack() as stack:
        etcd = stack.enter_context(
            _process(
                [
                    str(binaries / "etcd"),
                    "--name=default",
                    f"--data-dir={workdir / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=default={peer_url}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
                logs["etcd"],
            )
        )
        _wait("etcd", lambda: _etcd_healthy(etcd_url), etcd, logs["etcd"])
        apiserver = stack.enter_context(
            _process(
                [
                    str(binaries / "kube-apiserver"),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    # no kubernetes Service endpoints: a loopback address may not be one
                    "--endpoint-reconciler-type=none",
                    f"--secure-port={api_port}",
                    f"--cert-dir={certs}",
                    f"--token-auth-file={workdir / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    "--enable-admission-plugins=ValidatingAdmissionPolicy",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={sa_key}",
                    f"--service-account-signing-key-file={sa_key}",
                    "--allow-privileged=true",
                    f"--watch-cache-sizes={UNCACHED}#0",
                    f"--audit-policy-file={workdir / 'audit-policy.json'}",
                    f"--audit-log-path={workdir / 'audit.log'}",
                    "--audit-log-mode=blocking",
                    "--v=0",
                ],
                logs["kube-apiserver"],
            )
        )
        server = RealApiServer(
            url=f"https://127.0.0.1:{api_port}",
            ca_file=certs / "apiserver.crt",
            tokens=tokens,
            logs=logs,
            audit_log=workdir / "audit.log",
            etcd_url=etcd_url,
        )

        def ready() -> bool:
            if not server.ca_file.exists():
                return False
            try:
                return server.get("/readyz")[0] == 200
            except OSError:
                return False

        _wait("kube-apiserver", ready, apiserver, logs["kube-apiserver"])
        server.version = server.get("/version")[1]
        yield server
