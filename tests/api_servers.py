"""One test, two API servers: the emulator (``tests/doubles/emulator.py``) and the real
kube-apiserver (``tests/real_apiserver.py``), behind the same small interface, so a test asserts
the same thing of both and any disagreement between the model and the real thing shows.

The ``api_server`` fixture (``tests/conftest.py``) runs a test once per server; the real one is
marked ``realapi`` (``just test-real`` selects those) and skipped, with the reason printed, where
its binaries are not built. The emulator is a fresh one per test; the real server is one per
test process, so a test's objects are deleted after it (:meth:`Served.clean`) and the CRDs
stay installed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests.doubles.emulator import ApiServerEmulator
from tests.real_apiserver import RealApiServer

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
#: Harvester's real CRDs, as its charts install them (the READMEs beside them say from where).
HARVESTER_CRDS = (
    *sorted((FIXTURES / "harvester-crds").glob("*.yaml")),
    *sorted((FIXTURES / "harvester-addon").glob("*.yaml")),
    *sorted((FIXTURES / "harvester-pcidevices").glob("*.yaml")),
)
#: How long a CRD may take to be served by the real server.
ESTABLISHED_S = 60.0
# The client is only partly typed: its untyped entry points are used as Any
new_client_from_config: Any = config.new_client_from_config


def crd_manifests() -> list[dict[str, Any]]:
    """Harvester's CRDs, parsed."""
    return [yaml.safe_load(path.read_text()) for path in HARVESTER_CRDS]


@dataclass
class Served:
    """An API server a test talks to through the unmodified ``kubernetes`` client as an admin."""

    name: str  # "emulator" or "real"
    api: Any  # kubernetes.client.ApiClient
    kubeconfig_path: Path
    emulator: ApiServerEmulator | None = None
    real: RealApiServer | None = None
    _crds: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Install a CRD and wait until its resource is served."""
        self._crds.append(crd)
        if self.emulator is not None:
            self.emulator.register_crd(crd)
            return
        extensions = client.ApiextensionsV1Api(self.api)
        try:
            extensions.create_custom_resource_definition(dict(crd))
        except client.ApiException as error:
            if error.status != 409:  # installed by an earlier test of this process
                raise
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        deadline = time.monotonic() + ESTABLISHED_S
        while True:
            try:
                self.custom.list_cluster_custom_object(
                    spec["group"], version, spec["names"]["plural"], limit=1
                )
                return
            except client.ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def clean(self) -> None:
        """Delete every object of the CRDs this test installed (the real server is shared by
        the tests of a process; the CRDs themselves stay)."""
        for crd in self._crds:
            spec = crd["spec"]
            plural = spec["names"]["plural"]
            for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
                listed = self.custom.list_cluster_custom_object(spec["group"], version, plural)
                for item in listed["items"]:
                    meta = item["metadata"]
                    try:
                        if "namespace" in meta:
                            self.custom.delete_namespaced_custom_object(
                                spec["group"], version, meta["namespace"], plural, meta["name"]
                            )
                        else:
                            self.custom.delete_cluster_custom_object(
                                spec["group"], version, plural, meta["name"]
                            )
                    except client.ApiException as error:
                        if error.status != 404:
                            raise


def served_emulator(directory: Path) -> tuple[ApiServerEmulator, Served]:
    """A fresh emulator (started: the caller stops it) and its :class:`Served`."""
    emulator = ApiServerEmulator()
    emulator.start()
    path = emulator.kubeconfig(directory / "kubeconfig-emulator")
    api = new_client_from_config(config_file=str(path))
    return emulator, Served("emulator", api, path, emulator=emulator)


def served_real(server: RealApiServer, directory: Path) -> Served:
    """The process's real API server, as its admin."""
    path = server.kubeconfig(directory / "kubeconfig-real")
    api = new_client_from_config(config_file=str(path))
    return Served("real", api, path, real=server)


def preserving_crd(group: str, version: str, plural: str, kind: str) -> dict[str, Any]:
    """A namespaced CRD that keeps whatever is written (``x-kubernetes-preserve-unknown-fields``),
    with a status subresource: what the emulator's ``register`` serves without a schema."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "kind": kind},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
