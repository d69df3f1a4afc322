"""Whether Harvester's pcidevices-controller runs: the reads, and what is made of them.

Each signal alone counts; a disabled Addon, a DaemonSet without a ready pod, Harvester's CRDs and
a cluster that is not Harvester do not; a read RBAC denies, or a field not of the type the API
guarantees, is unknown (vgpuctl refuses as if it ran); an unreachable server is an error, as for
every cluster read. Expected lines are written out from docs/domain.md §6a.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.model import ClusterUnavailableError, ForbiddenError, ResourceMissingError
from reconciler.observe.harvester import (
    ControllerPresence,
    interpret_addon,
    interpret_daemonset,
    interpret_webhook,
    observe_pcidevices_controller,
)
from tests.doubles.cluster import FakeCluster
from tests.pcidevices_controller import addon, daemonset, pcidevice, webhook

ADDON_ON = "Addon harvester-system/pcidevices-controller is enabled"
DS_READY = "DaemonSet harvester-system/harvester-pcidevices-controller has 3 ready pods"
WEBHOOK_ON = "ValidatingWebhookConfiguration pcidevices-validator exists"


def cluster(*objects: tuple[str, dict[str, Any]]) -> FakeCluster:
    api = FakeCluster(read_only=True)
    for plural, obj in objects:
        api.seed(plural, [obj])
    return api


# -- the reads ----------------------------------------------------------------------------------


def test_three_gets_by_name_and_nothing_else() -> None:
    api = cluster()
    assert observe_pcidevices_controller(api) == ControllerPresence()
    assert api.calls == [
        ("get", "addons", None),
        ("get", "daemonsets", None),
        ("get", "validatingwebhookconfigurations", None),
    ]
    assert not api.lists


def test_nothing_of_it_is_not_running_and_refuses_nothing() -> None:
    presence = observe_pcidevices_controller(cluster())
    assert not presence.running
    assert not presence.refuses
    assert presence.reason == ""


def test_a_cluster_that_is_not_harvester_is_not_running() -> None:
    api = cluster()
    api.unserved.add("addons")  # no Addon CRD
    assert observe_pcidevices_controller(api) == ControllerPresence()


@pytest.mark.parametrize(
    ("plural", "obj", "signal"),
    [
        ("addons", addon(enabled=True), ADDON_ON),
        ("daemonsets", daemonset(ready=3), DS_READY),
        ("validatingwebhookconfigurations", webhook(), WEBHOOK_ON),
    ],
    ids=["addon", "daemonset", "webhook"],
)
def test_each_signal_alone_means_running(plural: str, obj: dict[str, Any], signal: str) -> None:
    presence = observe_pcidevices_controller(cluster((plural, obj)))
    assert presence.signals == (signal,) and not presence.unknown
    assert presence.running and presence.refuses
    assert presence.reason.startswith(
        f"Harvester's pcidevices-controller is running ({signal}): it manages the same GPUs"
    )
    assert "Disable the pcidevices-controller Addon" in presence.reason
    assert "\n" not in presence.reason


def test_all_three_are_named_in_the_order_read() -> None:
    presence = observe_pcidevices_controller(
        cluster(
            ("validatingwebhookconfigurations", webhook()),
            ("daemonsets", daemonset(ready=3)),
            ("addons", addon(enabled=True)),
        )
    )
    assert presence.signals == (ADDON_ON, DS_READY, WEBHOOK_ON)


@pytest.mark.parametrize(
    ("plural", "obj"),
    [
        ("addons", addon(enabled=False)),
        ("daemonsets", daemonset(ready=0)),
        ("pcidevices", pcidevice("harvester-kgd9c")),
    ],
    ids=["addon-disabled", "daemonset-no-ready-pod", "leftover-pcidevice"],
)
def test_what_does_not_mean_running(plural: str, obj: dict[str, Any]) -> None:
    assert observe_pcidevices_controller(cluster((plural, obj))) == ControllerPresence()


def test_the_objects_are_read_where_harvester_has_them() -> None:
    # The same objects in another namespace are not Harvester's.
    elsewhere = addon(enabled=True)
    elsewhere["metadata"]["namespace"] = "default"
    ds = daemonset(ready=3)
    ds["metadata"]["namespace"] = "kube-system"
    assert (
        observe_pcidevices_controller(cluster(("addons", elsewhere), ("daemonsets", ds)))
        == ControllerPresence()
    )


# -- fail closed --------------------------------------------------------------------------------


def test_a_denied_read_is_unknown_and_refuses_naming_the_permission() -> None:
    api = cluster()
    denied = (
        "RBAC denies get on addons.harvesterhci.io in namespace harvester-system (addons."
        'harvesterhci.io "pcidevices-controller" is forbidden)'
    )
    api.fail["addons"] = ForbiddenError(denied)
    presence = observe_pcidevices_controller(api)
    assert presence == ControllerPresence(unknown=(denied,))
    assert not presence.running
    assert presence.refuses
    assert presence.reason == (
        f"cannot tell whether Harvester's pcidevices-controller is running ({denied}): vgpuctl "
        "acts only when it knows the controller is not running (deploy/rbac.yaml grants the "
        "reads it needs)"
    )


def test_a_signal_outweighs_a_denied_read() -> None:
    api = cluster(("validatingwebhookconfigurations", webhook()))
    api.fail["addons"] = ForbiddenError("RBAC denies get on addons.harvesterhci.io (…)")
    presence = observe_pcidevices_controller(api)
    assert presence.running
    assert presence.reason.startswith(
        f"Harvester's pcidevices-controller is running ({WEBHOOK_ON})"
    )


def test_an_unreachable_server_is_an_error_as_for_every_cluster_read() -> None:
    api = cluster()
    api.down = True
    with pytest.raises(ClusterUnavailableError):
        observe_pcidevices_controller(api)


def test_a_type_not_served_for_the_built_in_kinds_is_an_absence_too() -> None:
    api = cluster()
    api.unserved |= {"addons", "daemonsets", "validatingwebhookconfigurations"}
    assert observe_pcidevices_controller(api) == ControllerPresence()
    api.fail["daemonsets"] = ResourceMissingError("the API server does not serve daemonsets")
    assert observe_pcidevices_controller(api) == ControllerPresence()


# -- the pure interpretations -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (None, ControllerPresence()),
        ({"spec": {"enabled": True}}, ControllerPresence(signals=(ADDON_ON,))),
        ({"spec": {"enabled": False}}, ControllerPresence()),
        (
            {"spec": {"enabled": "true"}},
            ControllerPresence(
                unknown=(
                    "Addon harvester-system/pcidevices-controller has spec.enabled 'true', "
                    "not true or false",
                )
            ),
        ),
        (
            {"spec": "on"},
            ControllerPresence(
                unknown=(
                    "Addon harvester-system/pcidevices-controller has spec.enabled None, "
                    "not true or false",
                )
            ),
        ),
    ],
)
def test_interpret_addon(obj: dict[str, Any] | None, expected: ControllerPresence) -> None:
    assert interpret_addon(obj) == expected


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (None, ControllerPresence()),
        ({}, ControllerPresence()),  # just created: no status yet
        ({"status": {"numberReady": 0}}, ControllerPresence()),
        ({"status": {"numberReady": None}}, ControllerPresence()),
        (
            {"status": {"numberReady": 1}},
            ControllerPresence(
                signals=(
                    "DaemonSet harvester-system/harvester-pcidevices-controller has 1 ready pod",
                )
            ),
        ),
        (
            {"status": {"numberReady": True}},
            ControllerPresence(
                unknown=(
                    "DaemonSet harvester-system/harvester-pcidevices-controller has "
                    "status.numberReady True, not a number",
                )
            ),
        ),
        (
            {"status": {"numberReady": "2\x1b[31m"}},
            ControllerPresence(
                unknown=(
                    "DaemonSet harvester-system/harvester-pcidevices-controller has "
                    "status.numberReady '2\\x1b[31m', not a number",
                )
            ),
        ),
    ],
)
def test_interpret_daemonset(obj: dict[str, Any] | None, expected: ControllerPresence) -> None:
    assert interpret_daemonset(obj) == expected


def test_interpret_webhook() -> None:
    assert interpret_webhook(None) == ControllerPresence()
    assert interpret_webhook({"metadata": {"name": "pcidevices-validator"}}) == ControllerPresence(
        signals=(WEBHOOK_ON,), left_behind=(WEBHOOK_ON,)
    )


LEFTOVER_ADVICE = (
    ". If the Addon is disabled already, the controller left its webhook configurations behind "
    "(it applies them itself, not its chart): delete "
    "ValidatingWebhookConfiguration pcidevices-validator and MutatingWebhookConfiguration "
    "pcidevices-mutator"
)


def test_a_webhook_configuration_alone_refuses_and_says_it_may_be_left_behind() -> None:
    presence = observe_pcidevices_controller(
        cluster(("validatingwebhookconfigurations", webhook()))
    )
    assert presence.refuses
    assert presence.reason.endswith(LEFTOVER_ADVICE)
    assert "\n" not in presence.reason


@pytest.mark.parametrize(
    ("plural", "obj"),
    [("addons", addon(enabled=True)), ("daemonsets", daemonset(ready=3))],
    ids=["addon", "daemonset"],
)
def test_with_another_signal_the_webhook_configuration_is_no_leftover(
    plural: str, obj: dict[str, Any]
) -> None:
    presence = observe_pcidevices_controller(
        cluster(("validatingwebhookconfigurations", webhook()), (plural, obj))
    )
    assert presence.refuses
    assert "left its webhook configurations behind" not in presence.reason
