"""Whether Harvester's pcidevices-controller is running: three reads through the
:class:`~reconciler.model.clusterapi.ClusterApi` port, each with a pure interpretation.

pcidevices-controller does on a Harvester node what vgpuctl does (docs/domain.md §6): it enables
SR-IOV, creates and removes vGPUs from the SRIOVGPUDevice/VGPUDevice objects and writes their
status. Two controllers on the same GPUs undo each other's work, so node-local ``apply`` and
``watch`` refuse to act while it runs (``reconciler.engine``), and ``plan`` says they would.

It counts as running when any one of these says so (docs/domain.md §6a names the sources):

- the Addon ``harvester-system/pcidevices-controller`` (``harvesterhci.io/v1beta1``) has
  ``spec.enabled: true`` — how Harvester installs it;
- its DaemonSet ``harvester-system/harvester-pcidevices-controller`` (``apps/v1``) has a ready
  pod (``status.numberReady`` > 0) — installed by the Addon's chart, or by hand;
- the ValidatingWebhookConfiguration ``pcidevices-validator`` exists — the controller registers
  it itself once its webhook server listens. Its chart does not hold it (harvester/charts
  ``charts/harvester-pcidevices-controller/templates``: a DaemonSet, a Service, a service
  account), so it can outlive a disabled Addon: when it is the only sign, the reason says so and
  names what to delete (still refusing: vgpuctl cannot tell a leftover from a controller).

Not signs of it: a disabled Addon, a DaemonSet with no ready pod, and Harvester's CRDs
(``PCIDevice``, ``SRIOVGPUDevice``, …), which stay installed after the controller is gone.

Where the answer is unknown the check fails closed: a read RBAC denies, or an object whose field
is not of the type the API server guarantees, makes the presence :attr:`unknown
<ControllerPresence.unknown>`, and the engine refuses as if it ran. A resource type the server
does not serve (no Addon CRD: not a Harvester cluster) and an object not found are absences.
Every other failure (the server unreachable, credentials rejected) propagates, as from every
cluster read: nothing acts on the strength of what could not be read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reconciler.model import ForbiddenError, ResourceMissingError
from reconciler.model.clusterapi import ClusterApi
from reconciler.model.errors import excerpt
from reconciler.model.record import record

#: Where Harvester runs its system components, the Addon and the DaemonSet included.
HARVESTER_NAMESPACE = "harvester-system"
#: The Addon (harvester/harvester ``pkg/util/constants.go``: ``PCIDevicesControllerName``).
ADDON_GROUP = "harvesterhci.io"
ADDON_VERSION = "v1beta1"
ADDON_PLURAL = "addons"
ADDON_NAME = "pcidevices-controller"
#: The DaemonSet: the chart's fullname, set by the Addon's ``fullnameOverride``.
DAEMONSET_GROUP = "apps"
DAEMONSET_VERSION = "v1"
DAEMONSET_PLURAL = "daemonsets"
DAEMONSET_NAME = "harvester-pcidevices-controller"
#: The webhook configuration the controller registers (harvester/pcidevices
#: ``pkg/webhook/server.go``: ``ValidatorName``).
WEBHOOK_GROUP = "admissionregistration.k8s.io"
WEBHOOK_VERSION = "v1"
WEBHOOK_PLURAL = "validatingwebhookconfigurations"
WEBHOOK_NAME = "pcidevices-validator"
#: Its mutating twin (``MutatorName``), applied with it; not read, named in the advice only.
MUTATING_WEBHOOK_NAME = "pcidevices-mutator"

CONTROLLER = "Harvester's pcidevices-controller"


@record(frozen=True, slots=True)
class ControllerPresence:
    """What the cluster says about Harvester's pcidevices-controller."""

    #: Why it counts as running, one line each (empty: nothing says it runs).
    signals: tuple[str, ...] = ()
    #: Reads that could not tell, one line each: RBAC denied them, or what they read was not
    #: what the API guarantees. Unknown counts as running: acting is refused.
    unknown: tuple[str, ...] = ()
    #: Those of ``signals`` a removed controller may leave behind (its webhook configuration:
    #: the controller applies it itself, the chart does not hold it). When they are all there
    #: is, the reason says how to clear them.
    left_behind: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return bool(self.signals)

    @property
    def refuses(self) -> bool:
        """Whether a node-local apply or watch must not act: it runs, or it may."""
        return bool(self.signals or self.unknown)

    @property
    def reason(self) -> str:
        """Why acting is refused, one line ("" when it is not)."""
        if self.signals:
            reason = (
                f"{CONTROLLER} is running ({'; '.join(self.signals)}): it manages the same "
                "GPUs and objects, and two controllers would undo each other's changes. "
                f"Disable the {ADDON_NAME} Addon to let vgpuctl manage this node's vGPUs, or "
                "keep it and let vgpuctl drive it: --delegate harvester"
            )
            if all(signal in self.left_behind for signal in self.signals):
                reason += (
                    ". If the Addon is disabled already, the controller left its webhook "
                    "configurations behind (it applies them itself, not its chart): delete "
                    f"ValidatingWebhookConfiguration {WEBHOOK_NAME} and "
                    f"MutatingWebhookConfiguration {MUTATING_WEBHOOK_NAME}"
                )
            return reason
        if self.unknown:
            return (
                f"cannot tell whether {CONTROLLER} is running ({'; '.join(self.unknown)}): "
                "vgpuctl acts only when it knows the controller is not running "
                "(deploy/rbac.yaml grants the reads it needs)"
            )
        return ""

    def __add__(self, other: ControllerPresence) -> ControllerPresence:
        return ControllerPresence(
            self.signals + other.signals,
            self.unknown + other.unknown,
            self.left_behind + other.left_behind,
        )


NOT_RUNNING = ControllerPresence()


# -- pure interpretations of what the reads return (None: not found, or not served) -----------


def interpret_addon(obj: Mapping[str, Any] | None) -> ControllerPresence:
    """The Addon: ``spec.enabled`` true is a signal; false, or no Addon, is not."""
    what = f"Addon {HARVESTER_NAMESPACE}/{ADDON_NAME}"
    if obj is None:
        return NOT_RUNNING
    spec = obj.get("spec")
    enabled = spec.get("enabled") if isinstance(spec, Mapping) else None
    if enabled is True:
        return ControllerPresence(signals=(f"{what} is enabled",))
    if enabled is False:
        return NOT_RUNNING
    # The CRD requires a boolean: anything else is not an Addon as Harvester defines it.
    return ControllerPresence(
        unknown=(f"{what} has spec.enabled {excerpt(repr(enabled))}, not true or false",)
    )


def interpret_daemonset(obj: Mapping[str, Any] | None) -> ControllerPresence:
    """The DaemonSet: a ready pod (``status.numberReady`` > 0) is a signal."""
    what = f"DaemonSet {HARVESTER_NAMESPACE}/{DAEMONSET_NAME}"
    if obj is None:
        return NOT_RUNNING
    status = obj.get("status")
    ready = status.get("numberReady", 0) if isinstance(status, Mapping) else 0
    if ready is None:
        ready = 0
    if not isinstance(ready, int) or isinstance(ready, bool):
        return ControllerPresence(
            unknown=(f"{what} has status.numberReady {excerpt(repr(ready))}, not a number",)
        )
    if ready > 0:
        return ControllerPresence(signals=(f"{what} has {ready} ready pod{'s' * (ready != 1)}",))
    return NOT_RUNNING


def interpret_webhook(obj: Mapping[str, Any] | None) -> ControllerPresence:
    """The webhook configuration: registered by the running controller, so its presence is a
    signal."""
    if obj is None:
        return NOT_RUNNING
    signal = f"ValidatingWebhookConfiguration {WEBHOOK_NAME} exists"
    return ControllerPresence(signals=(signal,), left_behind=(signal,))


# -- the reads ---------------------------------------------------------------------------------


@record(frozen=True, slots=True)
class _Read:
    group: str
    version: str
    plural: str
    name: str
    namespace: str | None
    interpret: Callable[[Mapping[str, Any] | None], ControllerPresence]


READS = (
    _Read(
        ADDON_GROUP,
        ADDON_VERSION,
        ADDON_PLURAL,
        ADDON_NAME,
        HARVESTER_NAMESPACE,
        interpret_addon,
    ),
    _Read(
        DAEMONSET_GROUP,
        DAEMONSET_VERSION,
        DAEMONSET_PLURAL,
        DAEMONSET_NAME,
        HARVESTER_NAMESPACE,
        interpret_daemonset,
    ),
    _Read(WEBHOOK_GROUP, WEBHOOK_VERSION, WEBHOOK_PLURAL, WEBHOOK_NAME, None, interpret_webhook),
)


def observe_pcidevices_controller(api: ClusterApi) -> ControllerPresence:
    """Read the Addon, the DaemonSet and the webhook configuration (one get each, by name) and
    say whether pcidevices-controller runs. Raises the port's errors other than a denial or a
    type not served (see the module docstring)."""
    return combined(_read(api, read) for read in READS)


def combined(parts: Iterable[ControllerPresence]) -> ControllerPresence:
    total = NOT_RUNNING
    for part in parts:
        total += part
    return total


def _read(api: ClusterApi, read: _Read) -> ControllerPresence:
    try:
        obj = api.get_object(
            group=read.group,
            version=read.version,
            plural=read.plural,
            name=read.name,
            namespace=read.namespace,
        )
    except ResourceMissingError:
        return NOT_RUNNING  # the type is not served: no Addon CRD means no Harvester
    except ForbiddenError as exc:
        return ControllerPresence(unknown=(exc.message,))
    return read.interpret(obj)
