"""Path reservations as decisions: a claim's paths against every other live claim's.

A reservation counts while its claim is active and its lease has not run out; a stale claim's
(marked expired, or past its deadline) lapse with it, so a dead agent never fences files off.
Owner death is only proven by a probe, which decisions over other tasks do not make: a claim
whose owner died keeps its reservations until its lease ends or ``sweep`` marks it stale.
The overlap rules themselves are in ``paths.py``; this module reads the state's index of
reservations (built on first use, kept in step by ``events.apply``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from . import events as ev
from .errors import PathConflict
from .model import ACTIVE, Claim, Now
from .paths import PathIndex
from .state import State

Expired = Callable[[Claim, Now], bool]
_F = TypeVar("_F", bound=Callable[..., Any])


def index(state: State) -> PathIndex:
    """The state's reservation index, built now from the claim table when it is not yet."""
    if state.reservations is None:
        built = PathIndex()
        reserving = [task for task, data in state.claims.raw_items()
                     if isinstance(data, dict) and (data.get("paths") or data.get("shared_paths"))]
        for task in reserving:  # (get() converts raw entries: not while iterating them)
            claim = state.claims.get(task)
            if claim is not None and claim.live:
                built.put(task, claim.paths, claim.shared_paths)
        state.reservations = built
    return state.reservations


@dataclass(frozen=True, slots=True)
class Overlap:
    """One conflict: my pattern, the other claim, its pattern and whether it is exclusive."""

    mine: str
    holder: Claim
    theirs: str
    exclusive: bool


def overlaps(state: State, task: str, paths: Sequence[str], shared: Sequence[str], now: Now,
             expired: Expired) -> list[Overlap]:
    """The live reservations of other tasks that ``paths`` (exclusive) and ``shared`` conflict
    with, in a deterministic order."""
    if not paths and not shared:
        return []
    found: list[Overlap] = []
    for mine, reserved in index(state).conflicts(task, paths, shared):
        holder = state.claims.get(reserved.task)
        if holder is None or holder.state != ACTIVE or expired(holder, now):
            continue  # lapsed with a stale or ended claim
        found.append(Overlap(mine, holder, reserved.pattern, reserved.exclusive))
    return found


def refusal(task: str, owner: str, found: Overlap) -> tuple[dict[str, Any], PathConflict]:
    """The claim_rejected event and the error for a path conflict."""
    holder = found.holder
    kind = "exclusively" if found.exclusive else "shared"
    reason = (f"paths overlap: {found.mine!r} and {found.theirs!r}, reserved {kind} by "
              f"{holder.owner} for {holder.task!r}")
    event = {"type": ev.CLAIM_REJECTED, "task": task, "actor": owner, "owner": owner,
             "holder": holder.owner, "fence": holder.fence, "expires_at": holder.expires_at,
             "reason": reason}
    error = PathConflict(task, holder=holder.owner, fence=holder.fence,
                         expires_at=holder.expires_at, reason=reason, phase=holder.phase,
                         holder_task=holder.task, mine=found.mine, theirs=found.theirs)
    return event, error


def checking(expired: Expired) -> Callable[[_F], _F]:
    """Wrap ``rules.decide_claim``: a grant it decides is checked against the reservations of
    other live claims, and carries its paths (a recovery without new paths keeps the previous
    claim's, which are checked too: they lapsed and someone may have reserved them since)."""

    def wrap(decide: _F) -> _F:
        def decided(state: State, task: str, grant: Any, now: Now, *args: Any,
                    **kwargs: Any) -> Any:
            decision = decide(state, task, grant, now, *args, **kwargs)
            return with_paths(state, decision, grant.paths, now, expired)

        return cast(_F, decided)

    return wrap


_CARRYING = frozenset({ev.CLAIM_RECOVERED, ev.CLAIM_HANDED_OFF})  # keep the old claim's paths


def with_paths(state: State, decision: Any, reservation: Reservation | None, now: Now,
               expired: Expired) -> Any:
    """``decision`` with its grant events carrying ``reservation`` (if any), or a refusal when
    the granted claim's paths conflict with another live claim's."""
    if decision.error is not None:
        return decision
    if reservation is None and not any(e["type"] in _CARRYING for e in decision.events):
        return decision  # the common case: a claim reserving nothing
    events = list(decision.events)
    for n, event in enumerate(events):
        if event["type"] not in ev.GRANTS:
            continue
        task = event["task"]
        if reservation is not None and (reservation.paths or reservation.shared):
            paths, shared = reservation.paths, reservation.shared
            events[n] = {**event, "paths": list(paths), "shared_paths": list(shared)}
        else:
            current = state.claims.get(task)
            carried = current is not None and event["type"] in (ev.CLAIM_RECOVERED,
                                                                ev.CLAIM_HANDED_OFF)
            paths = current.paths if carried and current else ()
            shared = current.shared_paths if carried and current else ()
        found = overlaps(state, task, paths, shared, now, expired)
        if found:
            rejected, error = refusal(task, event["owner"], found[0])
            return replace(decision, events=(rejected,), error=error, result=None)
    return replace(decision, events=tuple(events))


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a grant asks to reserve: normalised exclusive and shared patterns."""

    paths: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    @classmethod
    def of(cls, paths: Sequence[str], shared: Sequence[str]) -> Reservation | None:
        """None when nothing is reserved; an exclusive pattern is not also shared."""
        if not paths and not shared:
            return None
        return cls(tuple(paths), tuple(p for p in shared if p not in paths))
