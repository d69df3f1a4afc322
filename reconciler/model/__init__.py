"""Pure value types shared by every layer: addresses, host inventory, desired state, plans, errors.

No I/O and no third-party imports (an import-linter contract holds this).
"""

from reconciler.model.address import PciAddress
from reconciler.model.desired import Desired, DesiredGpu, DesiredNode, SourceLocation, VfKey
from reconciler.model.errors import (
    ApplyError,
    ClusterError,
    ClusterUnavailableError,
    ConflictError,
    ForbiddenError,
    LockHeldError,
    ObserveError,
    PlanError,
    Problem,
    ReconcilerError,
    ResourceMissingError,
    TransientError,
    UsageError,
    ValidationError,
)
from reconciler.model.inventory import (
    UNKNOWN_HOLDER,
    UNKNOWN_TYPE,
    VGPU,
    Gpu,
    Interface,
    Inventory,
    Vf,
    VGPUType,
)
from reconciler.model.plan import Action, ActionKind, Blocked, Noop, Plan, Summary

__all__ = [
    "UNKNOWN_HOLDER",
    "UNKNOWN_TYPE",
    "VGPU",
    "Action",
    "ActionKind",
    "ApplyError",
    "Blocked",
    "ClusterError",
    "ClusterUnavailableError",
    "ConflictError",
    "Desired",
    "DesiredGpu",
    "DesiredNode",
    "ForbiddenError",
    "Gpu",
    "Interface",
    "Inventory",
    "LockHeldError",
    "Noop",
    "ObserveError",
    "PciAddress",
    "Plan",
    "PlanError",
    "Problem",
    "ReconcilerError",
    "ResourceMissingError",
    "SourceLocation",
    "Summary",
    "TransientError",
    "UsageError",
    "VGPUType",
    "ValidationError",
    "Vf",
    "VfKey",
]
