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
from .errors import *  # noqa: F403  (every exception: errors.__all__)
from .errors import __all__ as _errors
from .store.base import Event, EventPage, VerifyReport

__all__ = [
    "Claim",
    "Event",
    "EventPage",
    "Identity",
    "Lease",
    "Now",
    "OwnerStats",
    "Registry",
    "Stats",
    "SweepItem",
    "SweepReport",
    "Task",
    "TaskStatus",
    "Verdict",
    "VerifyReport",
    "__version__",
    *_errors,
]
