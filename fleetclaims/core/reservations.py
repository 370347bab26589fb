"""Reserve and unreserve: the decisions that change a held claim's path reservations.

Apart from ``reserve.py`` (which ``rules`` imports to check grants) because these build on
``rules.holder_check``: the same holder test renew and complete apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import events as ev
from .errors import ValidationError
from .model import Claim, Now
from .paths import MAX_PATTERNS
from .reserve import overlaps, refusal
from .rules import Decision, holder_check, lease_expired
from .state import State


def decide_reserve(state: State, task: str, token_hash: str, paths: Sequence[str],
                   shared: Sequence[str], now: Now, actor: str | None = None) -> Decision:
    """Add ``paths``/``shared`` to the held claim of ``task`` (a shared pattern made exclusive
    moves). Refused like a claim when they conflict; nothing new: no event."""
    current, refused = holder_check(state, task, token_hash, now)
    if current is None:
        return refused
    new_paths = tuple(dict.fromkeys((*current.paths, *paths)))
    new_shared = tuple(p for p in dict.fromkeys((*current.shared_paths, *shared))
                       if p not in new_paths)
    if (new_paths, new_shared) == (current.paths, current.shared_paths):
        return Decision(result=current)
    if len(new_paths) + len(new_shared) > MAX_PATTERNS:
        return Decision(error=ValidationError(
            "paths", f"a claim reserves at most {MAX_PATTERNS} patterns, exclusive and shared "
            f"together ({task} would hold {len(new_paths) + len(new_shared)}): unreserve some "
            "first, or reserve a directory that covers them", value=len(paths) + len(shared)))
    found = overlaps(state, task, new_paths, new_shared, now, lease_expired)
    if found:
        rejected, error = refusal(task, current.owner, found[0])
        return Decision((rejected,), error)
    changed = [*(p for p in new_paths if p not in current.paths),
               *(p for p in new_shared if p not in current.shared_paths)]
    return Decision(({**_holder(current, actor), "type": ev.PATHS_RESERVED,
                            "paths": list(new_paths), "shared_paths": list(new_shared),
                            "changed": changed},), result=current)


def decide_unreserve(state: State, task: str, token_hash: str, patterns: Sequence[str] | None,
                     now: Now, actor: str | None = None) -> Decision:
    """Remove ``patterns`` (every reservation when None) from the held claim of ``task``."""
    current, refused = holder_check(state, task, token_hash, now)
    if current is None:
        return refused
    held = (*current.paths, *current.shared_paths)
    drop = set(held) if patterns is None else set(patterns)
    missing = sorted(drop - set(held))
    if missing:  # (a typo must not read as done while the reservation stays)
        return Decision(error=ValidationError(
            "paths", f"{task} does not reserve {', '.join(missing)} (it reserves "
            f"{', '.join(held) or 'nothing'}): nothing was unreserved; give the patterns as "
            "the claim shows them", value=missing[0]))
    changed = [p for p in held if p in drop]
    if not changed:
        return Decision(result=current)
    return Decision(({**_holder(current, actor), "type": ev.PATHS_RELEASED,
                            "paths": [p for p in current.paths if p not in drop],
                            "shared_paths": [p for p in current.shared_paths if p not in drop],
                            "changed": changed},), result=current)


def _holder(claim: Claim, actor: str | None) -> dict[str, Any]:
    return {"task": claim.task, "actor": actor or claim.owner, "owner": claim.owner,
            "fence": claim.fence}
