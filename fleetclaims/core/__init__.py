"""The pure core: model, rules, event application, hash chain, liveness verdict and resolver.

Nothing in this package performs I/O, reads a clock or probes a process; it imports only the
standard library (a test checks this). Time and probe results come in as arguments.
"""

from .events import apply, event_id
from .model import Claim, Identity, Now, Retired, Verdict
from .rules import Decision, Grant
from .state import ClaimTable, State

__all__ = [
    "Claim",
    "ClaimTable",
    "Decision",
    "Grant",
    "Identity",
    "Now",
    "Retired",
    "State",
    "Verdict",
    "apply",
    "event_id",
]
