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

from dataclasses import dataclass
from typing import Any

from . import events as ev
from .ports import ClaimView
from .rules import Decision
from .state import State, prunable


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


def plan(claims: ClaimView, before: float) -> PruneReport:
    """What a prune at ``before`` would change."""
    found = sorted(prunable(claims, before))
    return PruneReport(before, tuple(t for t, s in found if s == "released"),
                       tuple(t for t, s in found if s == "completed"))


def decide_prune(state: State, before: float, actor: str, *,
                 dry_run: bool = False) -> Decision:
    """Prune the records of claims that ended before ``before``: one ``claims_pruned`` event
    (none when there is nothing to prune, or for a dry run); the result is the PruneReport.
    Applied by events.apply (state.prune_ended) from the recorded cutoff."""
    report = plan(state.claims, before)
    if dry_run or not report.count:
        return Decision(result=report)
    return Decision(({"type": ev.CLAIMS_PRUNED, "actor": actor, "before": before,
                      "released": len(report.released),
                      "completed": len(report.completed)},), result=report)
