"""Pure value types shared by every layer: addresses, host inventory, desired state, plans, errors.

No I/O and no third-party imports (an import-linter contract holds this).
"""

from reconciler.model.address import PciAddress
from reconciler.model.desired import Desired, DesiredGpu, DesiredNode, SourceLocation, VfKey
from reconciler.model.errors import (
    ApplyError,
    ConflictError,
    LockHeldError,
    ObserveError,
    PlanError,
    Problem,
    ReconcilerError,
    TransientError,
    UsageError,
    ValidationError,
)
from reconciler.model.inventory import VGPU, Gpu, Interface, Inventory, Vf, VGPUType
from reconciler.model.plan import Action, ActionKind, Blocked, Noop, Plan, Summary

__all__ = [
    "VGPU",
    "Action",
    "ActionKind",
    "ApplyError",
    "Blocked",
    "ConflictError",
    "Desired",
    "DesiredGpu",
    "DesiredNode",
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
    "SourceLocation",
    "Summary",
    "TransientError",
    "UsageError",
    "VGPUType",
    "ValidationError",
    "Vf",
    "VfKey",
]
