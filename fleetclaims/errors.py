"""Public re-export of every fleetclaims exception (they live in ``fleetclaims.core.errors``)."""

from .core.errors import (
    AuditCorrupt,
    ClaimConflict,
    ClaimSuperseded,
    DependencyCycle,
    DurabilityError,
    FleetclaimsError,
    LeaseExpired,
    NotHolder,
    RegistryBusy,
    RegistryCorrupt,
    StoreUnavailable,
    TaskCompleted,
    TaskNotReady,
    UnknownTask,
    UnsafeRegistry,
    ValidationError,
)

__all__ = [
    "AuditCorrupt",
    "ClaimConflict",
    "ClaimSuperseded",
    "DependencyCycle",
    "DurabilityError",
    "FleetclaimsError",
    "LeaseExpired",
    "NotHolder",
    "RegistryBusy",
    "RegistryCorrupt",
    "StoreUnavailable",
    "TaskCompleted",
    "TaskNotReady",
    "UnknownTask",
    "UnsafeRegistry",
    "ValidationError",
]
