"""Public re-export of every fleetclaims exception (they live in ``fleetclaims.core.errors``)."""

from .core.errors import (
    AuditCorrupt,
    ClaimConflict,
    ClaimSuperseded,
    DurabilityError,
    FleetclaimsError,
    LeaseExpired,
    NotHolder,
    RegistryBusy,
    RegistryCorrupt,
    StoreUnavailable,
    TaskCompleted,
    UnsafeRegistry,
    ValidationError,
)

__all__ = [
    "AuditCorrupt",
    "ClaimConflict",
    "ClaimSuperseded",
    "DurabilityError",
    "FleetclaimsError",
    "LeaseExpired",
    "NotHolder",
    "RegistryBusy",
    "RegistryCorrupt",
    "StoreUnavailable",
    "TaskCompleted",
    "UnsafeRegistry",
    "ValidationError",
]
