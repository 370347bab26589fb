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
    ArchiveMismatch,
    AuditCorrupt,
    ClaimConflict,
    ClaimSuperseded,
    DependencyCycle,
    DurabilityError,
    FleetclaimsError,
    GitFailed,
    HistoryLost,
    LeaseExpired,
    MissingDependency,
    NotHolder,
    PathConflict,
    RegistryBusy,
    RegistryCorrupt,
    RegistryNotFound,
    RemoteRewritten,
    RemoteUnavailable,
    SchemaMismatch,
    SegmentDamaged,
    StoreOverloaded,
    StoreReadOnly,
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
    "ArchiveMismatch",
    "AuditCorrupt",
    "Claim",
    "ClaimConflict",
    "ClaimSuperseded",
    "DependencyCycle",
    "DurabilityError",
    "Event",
    "EventPage",
    "FleetclaimsError",
    "GitFailed",
    "HistoryLost",
    "Identity",
    "Lease",
    "LeaseExpired",
    "MissingDependency",
    "NotHolder",
    "Now",
    "OwnerStats",
    "PathConflict",
    "Registry",
    "RegistryBusy",
    "RegistryCorrupt",
    "RegistryNotFound",
    "RemoteRewritten",
    "RemoteUnavailable",
    "SchemaMismatch",
    "SegmentDamaged",
    "Stats",
    "StoreOverloaded",
    "StoreReadOnly",
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
