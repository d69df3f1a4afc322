"""Harvester's pcidevices-controller as a cluster shows it: its Addon, its DaemonSet and the
webhook configuration it registers, written as Harvester writes them, for the tests of vgpuctl's
refusal to act beside it (``reconciler/observe/harvester.py``).

The names are written out here, not imported from the code under test: they are the facts
(docs/domain.md §6a) the code must match. Sources: the Addon, harvester/addons
``pkg/templates/rancherd-22-addons.yaml``; the DaemonSet, harvester/charts
``charts/harvester-pcidevices-controller/templates/daemonset.yaml`` named by the Addon's
``fullnameOverride``; the webhook configuration, harvester/pcidevices ``pkg/webhook/server.go``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.doubles.emulator import ApiServerEmulator

NAMESPACE = "harvester-system"
ADDON = "pcidevices-controller"
DAEMONSET = "harvester-pcidevices-controller"
WEBHOOK = "pcidevices-validator"

ADDONS = ("harvesterhci.io", "v1beta1", "addons")
DAEMONSETS = ("apps", "v1", "daemonsets")
WEBHOOKS = ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
PCIDEVICES = ("devices.harvesterhci.io", "v1beta1", "pcidevices")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "harvester-addon"


def addon(*, enabled: bool) -> dict[str, Any]:
    """The Addon as Harvester's installer creates it (version and image left as placeholders)."""
    return {
        "apiVersion": "harvesterhci.io/v1beta1",
        "kind": "Addon",
        "metadata": {"name": ADDON, "namespace": NAMESPACE},
        "spec": {
            "repo": "http://harvester-cluster-repo.cattle-system.svc/charts",
            "version": "1.8.0",
            "chart": "harvester-pcidevices-controller",
            "enabled": enabled,
            "valuesContent": (
                "image:\n  tag: v1.8.0\nfullnameOverride: harvester-pcidevices-controller\n"
            ),
        },
        "status": {"status": "AddonDeploySuccessful" if enabled else ""},
    }


def daemonset(*, ready: int, scheduled: int = 3) -> dict[str, Any]:
    """The chart's DaemonSet with ``ready`` of its ``scheduled`` pods ready."""
    labels = {
        "app.kubernetes.io/name": "harvester-pcidevices-controller",
        "app.kubernetes.io/instance": ADDON,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DAEMONSET, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": DAEMONSET,
                    "containers": [
                        {
                            "name": "agent",
                            "image": "rancher/harvester-pcidevices:v1.8.0",
                            "args": ["agent"],
                        }
                    ],
                },
            },
        },
        "status": {
            "currentNumberScheduled": scheduled,
            "desiredNumberScheduled": scheduled,
            "numberMisscheduled": 0,
            "numberReady": ready,
            **({"numberAvailable": ready} if ready else {"numberUnavailable": scheduled}),
        },
    }


def webhook() -> dict[str, Any]:
    """The ValidatingWebhookConfiguration the controller applies once its webhook listens."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK},
        "webhooks": [
            {
                "name": "pcidevices.harvesterhci.io",
                "clientConfig": {
                    "service": {
                        "namespace": NAMESPACE,
                        "name": "pcidevices-webhook",
                        "path": "/v1/webhook/validation",
                        "port": 8443,
                    },
                    "caBundle": "",
                },
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1", "v1beta1"],
                "rules": [],
            }
        ],
    }


def pcidevice(node: str) -> dict[str, Any]:
    """A PCIDevice object the controller left behind."""
    return {
        "apiVersion": "devices.harvesterhci.io/v1beta1",
        "kind": "PCIDevice",
        "metadata": {"name": f"{node}-000008000", "labels": {"nodename": node}},
        "spec": {},
        "status": {"address": "0000:08:00.0", "vendorId": "10de", "deviceId": "25b6",
                   "nodeName": node, "kernelDriverInUse": "nvidia"},
    }  # fmt: skip


def install_harvester_crds(emu: ApiServerEmulator) -> None:
    """The Addon CRD and the PCIDevice CRD, as a Harvester cluster serves them."""
    for path in sorted(FIXTURES.glob("*.yaml")):
        emu.register_crd(yaml.safe_load(path.read_text()))
