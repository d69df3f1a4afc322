"""The KubeVirt CRD (``kubevirts.kubevirt.io``) for the API-server emulator: the allow-lists
vgpuctl writes declared as KubeVirt's own CRD declares them, the rest of the CR kept as written.

From kubevirt/kubevirt ``manifests/generated/kv-resource.yaml`` (commit d923fdb8), the schema of
``spec.configuration.permittedHostDevices`` (Go: ``PermittedHostDevices``,
``staging/src/kubevirt.io/api/core/v1/types.go``): ``mediatedDevices[]``
``{mdevNameSelector, resourceName, externalResourceProvider}``, ``pciHostDevices[]``
``{pciVendorSelector, resourceName, externalResourceProvider}``, ``usb[]``, each entry's selector
and resourceName required, every other field of an entry pruned. ``x-kubernetes-list-type:
atomic`` is left out: it governs server-side apply, which vgpuctl does not use (its writes are
JSON patches), and the emulator's schema model does not know it. Everything outside
``permittedHostDevices`` is kept (``x-kubernetes-preserve-unknown-fields``), so a test that
installs this CRD changes nothing else of the KubeVirt CR the emulator serves without it.
"""

from __future__ import annotations

import copy
from typing import Any

_ENTRY_FLAG: dict[str, Any] = {"type": "boolean"}
_TEXT: dict[str, Any] = {"type": "string"}

PERMITTED_HOST_DEVICES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "mediatedDevices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "externalResourceProvider": _ENTRY_FLAG,
                    "mdevNameSelector": _TEXT,
                    "resourceName": _TEXT,
                },
                "required": ["mdevNameSelector", "resourceName"],
            },
        },
        "pciHostDevices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "externalResourceProvider": _ENTRY_FLAG,
                    "pciVendorSelector": _TEXT,
                    "resourceName": _TEXT,
                },
                "required": ["pciVendorSelector", "resourceName"],
            },
        },
        "usb": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "externalResourceProvider": _ENTRY_FLAG,
                    "resourceName": _TEXT,
                    "selectors": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"product": _TEXT, "vendor": _TEXT},
                            "required": ["product", "vendor"],
                        },
                    },
                },
                "required": ["resourceName"],
            },
        },
    },
}


def kubevirt_crd() -> dict[str, Any]:
    """The CRD manifest: ``emu.register_crd(kubevirt_crd())`` serves ``kubevirts`` with it."""
    preserved = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                **preserved,
                "properties": {
                    "configuration": {
                        **preserved,
                        "properties": {
                            "permittedHostDevices": copy.deepcopy(PERMITTED_HOST_DEVICES)
                        },
                    }
                },
            },
            "status": preserved,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "kubevirts.kubevirt.io"},
        "spec": {
            "group": "kubevirt.io",
            "names": {"plural": "kubevirts", "kind": "KubeVirt"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
