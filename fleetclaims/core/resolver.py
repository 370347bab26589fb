"""The one total order over claims that settles every duplicate the same way everywhere.

Rules, in order: not stale before stale, lower priority number, earlier claim time, owner name,
token hash. Strings compare as UTF-8 bytes (no locale); floats compare numerically; nothing
depends on dict order or on the clock (a merge decides staleness from the two records: a claim
recorded as expired, or whose lease had ended by the other's claim time; merge._stale_against).
"""

from __future__ import annotations

from .model import Claim

RULES = (
    "not stale before stale",
    "lower priority number",
    "earlier claim time",
    "owner name",
    "token hash",
)

OrderKey = tuple[int, int, float, bytes, bytes, int]


def order_key(claim: Claim, stale: bool) -> OrderKey:
    """Smaller wins. The fence is the last tie-breaker so that the order is total."""
    return (
        1 if stale else 0,
        claim.priority,
        claim.claimed_at,
        claim.owner.encode("utf-8"),
        claim.token_hash.encode("ascii", "replace"),
        claim.fence,
    )


def compare(a: Claim, a_stale: bool, b: Claim, b_stale: bool) -> tuple[int, str]:
    """(-1 if a wins, 1 if b wins, 0 if identical) and the name of the deciding rule."""
    ka, kb = order_key(a, a_stale), order_key(b, b_stale)
    if ka == kb:
        return 0, "identical"
    index = next(i for i in range(len(ka)) if ka[i] != kb[i])
    rule = RULES[index] if index < len(RULES) else "fence"
    return (-1 if ka < kb else 1), rule


def winner(candidates: list[tuple[Claim, bool]]) -> tuple[Claim, list[tuple[Claim, str]]]:
    """The winning claim and each loser with the rule that decided against it."""
    if not candidates:
        raise ValueError("no candidates")
    ordered = sorted(candidates, key=lambda c: order_key(c[0], c[1]))
    best, best_stale = ordered[0]
    losers = []
    for claim, stale in ordered[1:]:
        _, rule = compare(best, best_stale, claim, stale)
        losers.append((claim, rule))
    return best, losers
