"""Path reservations two registries granted apart, settled by a merge.

Each registry refuses a reservation that overlaps another live claim's, but two laptops apart
can each grant one: after they meet, both claims would hold overlapping exclusive reservations
and each guard would refuse the other's holder. A merge settles every such pair the way it
settles duplicate claims of one task: the claim that was stale when the other was granted
loses, else the resolver order decides (priority, claim time, owner, token hash); the loser
keeps its claim but not its patterns that overlap the winner's, and the merge event says so
(``path_conflicts``).

Every pair of live reservations in the merged claims is looked at, so every side of a merge
that sees the same claims decides the same pairs alike (a pair one registry made itself never
conflicts by these rules: it refused the second grant, or the first had lapsed by then).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .model import ACTIVE, EXPIRED, Claim
from .paths import overlap
from .resolver import compare


@dataclass(frozen=True)
class PathConflict:
    """``loser_task``'s ``dropped`` patterns overlapped ``winner_task``'s reservations."""

    winner_task: str
    winner: str
    loser_task: str
    loser: str
    dropped: tuple[str, ...]
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return {"winner_task": self.winner_task, "winner": self.winner,
                "loser_task": self.loser_task, "loser": self.loser,
                "dropped": list(self.dropped), "rule": self.rule}


def stale_against(claim: Claim, other: Claim) -> bool:
    """Whether ``claim`` was stale when ``other`` was granted: recorded as expired, or its
    lease had ended by the other's claim time. Recorded fields only, never the clock: a merge
    settles a pair alike on every side and at any time (with the clock, a pair merged one way
    while the earlier lease ran and the other way after it ended kept two winners)."""
    return claim.state == EXPIRED or (
        claim.expires_at is not None and claim.expires_at <= other.claimed_at)


def _reserving(claim: Claim | None) -> bool:
    return claim is not None and claim.state == ACTIVE and bool(
        claim.paths or claim.shared_paths)


def _clashing(loser: Claim, winner: Claim) -> tuple[str, ...]:
    """The loser's patterns that conflict with the winner's reservations (an exclusive one
    against any; a shared one against an exclusive one)."""
    out = [p for p in loser.paths
           if any(overlap(p, q) for q in (*winner.paths, *winner.shared_paths))]
    out += [p for p in loser.shared_paths if any(overlap(p, q) for q in winner.paths)]
    return tuple(out)


def settle(claims: dict[str, Claim]) -> list[PathConflict]:
    """Settle, in ``claims`` (task -> record after the merge, those holding reservations at
    least; changed in place), every pair of live reservations that conflict, in task order.
    Neither may have been stale when the other was granted (then the stale one's reservations
    had lapsed: nothing to settle)."""
    found: list[PathConflict] = []
    tasks = sorted(t for t, c in claims.items() if _reserving(c))
    for i, x in enumerate(tasks):
        for y in tasks[i + 1:]:
            a, b = claims[x], claims[y]
            if not (_reserving(a) and _reserving(b)) or a.token_hash == b.token_hash:
                continue  # (one lost all its patterns to an earlier pair)
            if stale_against(a, b) or stale_against(b, a):
                continue
            order, rule = compare(a, False, b, False)
            win, lose = (a, b) if order <= 0 else (b, a)
            dropped = _clashing(lose, win)
            if not dropped:
                continue
            claims[lose.task] = replace(
                lose, paths=tuple(p for p in lose.paths if p not in dropped),
                shared_paths=tuple(p for p in lose.shared_paths if p not in dropped))
            found.append(PathConflict(win.task, win.owner, lose.task, lose.owner, dropped,
                                      rule))
    return found
