"""fleetclaims: a claims registry for processes that share one machine and no server.

    from fleetclaims import Registry
    reg = Registry()
    c = reg.claim("issue-42", owner="agent-a", ttl=600)
    reg.complete("issue-42", token=c.token)
"""

from ._version import __version__
from .api import Lease, OwnerStats, Registry, Stats
from .core.model import Claim, Identity, Now, Verdict
from .core.queue import Task, TaskStatus
from .core.rules import SweepItem, SweepReport
from .errors import (
    AccessDenied,
    AuditCorrupt,
    ClaimConflict,
    ClaimSuperseded,
    DependencyCycle,
    DurabilityError,
    FleetclaimsError,
    HistoryLost,
    LeaseExpired,
    MissingDependency,
    NotHolder,
    RegistryBusy,
    RegistryCorrupt,
    RegistryNotFound,
    StoreUnavailable,
    TaskCompleted,
    TaskNotReady,
    UnknownTask,
    UnsafeRegistry,
    ValidationError,
)
from .store.base import Event, EventPage, VerifyReport

__all__ = [
    "AccessDenied",
    "AuditCorrupt",
    "Claim",
    "ClaimConflict",
    "ClaimSuperseded",
    "DependencyCycle",
    "DurabilityError",
    "Event",
    "EventPage",
    "FleetclaimsError",
    "HistoryLost",
    "Identity",
    "Lease",
    "LeaseExpired",
    "MissingDependency",
    "NotHolder",
    "Now",
    "OwnerStats",
    "Registry",
    "RegistryBusy",
    "RegistryCorrupt",
    "RegistryNotFound",
    "Stats",
    "StoreUnavailable",
    "SweepItem",
    "SweepReport",
    "Task",
    "TaskCompleted",
    "TaskNotReady",
    "TaskStatus",
    "UnknownTask",
    "UnsafeRegistry",
    "ValidationError",
    "Verdict",
    "VerifyReport",
    "__version__",
]
