"""Pruning ended claim records (#15): an explicit, recorded command removes the records of
claims that ended (released or completed) before a cutoff from the live state.

- A released claim's record is removed: the task is free, as it already was.
- A completed claim's record shrinks to what refusing a new claim needs (task, owner, fence,
  completion time): the task stays refused to ``claim`` until ``reopen``, as before.
- The journal keeps every event: ``explain`` and ``audit`` still tell the whole story.

The decision and its application are pure functions of the recorded state and the cutoff the
``claims_pruned`` event carries, so every process, and every store, applies it identically.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .model import COMPLETED, RELEASED, Claim
from .ports import ClaimView

_ENDED = (RELEASED, COMPLETED)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune removed (or, with ``dry_run``, would remove)."""

    before: float  # claims that ended before this instant
    released: tuple[str, ...] = ()  # records removed
    completed: tuple[str, ...] = ()  # records kept in compact form (still refused to claim)

    @property
    def count(self) -> int:
        return len(self.released) + len(self.completed)

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before, "released": list(self.released),
                "completed": list(self.completed)}


def compacted(claim: Claim) -> bool:
    """Whether ``claim`` is a pruned completion's compact record (no grant ever has an empty
    token hash)."""
    return claim.state == COMPLETED and not claim.token_hash


def compact(claim: Claim, seq: int, eid: str) -> Claim:
    """The record a completed claim keeps after a prune: enough to refuse a new claim of the
    task (owner, fence, completion time) and to reopen it."""
    return Claim(task=claim.task, owner=claim.owner, fence=claim.fence, state=COMPLETED,
                 ended_at=claim.ended_at, seq=seq, eid=eid)


def _prunable(claims: ClaimView, before: float) -> Iterator[tuple[str, str]]:
    """(task, state) of every record a prune at ``before`` changes, read from the persisted
    dicts (no Claim object is built for the records it leaves alone)."""
    for task, data in claims.data_items():
        state = data.get("state")
        ended = data.get("ended_at")
        if (state in _ENDED and isinstance(ended, (int, float)) and ended < before
                and not (state == COMPLETED and not data.get("token_hash"))):
            yield task, str(state)


def plan(claims: ClaimView, before: float) -> PruneReport:
    """What a prune at ``before`` would change."""
    found = sorted(_prunable(claims, before))
    return PruneReport(before, tuple(t for t, s in found if s == RELEASED),
                       tuple(t for t, s in found if s == COMPLETED))


def apply_prune(claims: ClaimView, before: float, seq: int, eid: str) -> None:
    """Apply a recorded prune (``events.CLAIMS_PRUNED``) to ``claims``."""
    for task, state in list(_prunable(claims, before)):
        if state == RELEASED:
            claims.discard(task)
        else:
            claim = claims.get(task)
            if claim is not None:
                claims[task] = compact(claim, seq, eid)
