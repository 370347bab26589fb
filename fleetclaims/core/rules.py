"""The rules: given the state, a request, the time and the holder's liveness, decide.

Every decision is a ``Decision``: the events to append (possibly none) and the error to raise
after appending them (possibly none). Nothing here reads a clock, a file or a process; callers
pass ``now`` and ``verdict`` in, which makes every rule a table test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import events as ev
from . import queue
from .durations import format_duration, iso
from .errors import (
    ClaimConflict,
    ClaimSuperseded,
    FleetclaimsError,
    LeaseExpired,
    NotHolder,
    PathConflict,
    TaskCompleted,
    ValidationError,
)
from .model import ACTIVE, COMPLETED, DEFAULT_PHASE, EXPIRED, Claim, Identity, Now, Verdict
from .model import UNKNOWN_VERDICT as UNKNOWN
from .reserve import Reservation, checking
from .resolver import compare
from .state import State


@dataclass(frozen=True, slots=True)
class Decision:
    events: tuple[dict[str, Any], ...] = ()
    error: FleetclaimsError | None = None
    result: Any = None  # operation-specific answer (release's bool, sweep's report)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a would-be holder asks for."""

    owner: str
    token_hash: str
    ttl: float | None
    priority: int = 100
    note: str | None = None
    metadata: dict[str, Any] | None = None
    identity: Identity | None = None
    phase: str = DEFAULT_PHASE
    paths: Reservation | None = None  # path patterns to reserve (core/reserve.py decides)


def repriced(grant: Grant, priority: int) -> Grant:
    """``grant`` at ``priority``, field by field (``dataclasses.replace`` costs ~7 us of
    introspection on every claim_next; tests/test_queue.py checks every field against it)."""
    if grant.priority == priority:
        return grant
    return Grant(owner=grant.owner, token_hash=grant.token_hash, ttl=grant.ttl,
                 priority=priority, note=grant.note, metadata=grant.metadata,
                 identity=grant.identity, phase=grant.phase, paths=grant.paths)


VerdictOf = Callable[[Claim], Verdict]


def lease_expired(claim: Claim, now: Now) -> bool:
    """Whether the lease ran out. On the boot that set the deadline, the boot clock decides, so a
    wall-clock step neither expires a live lease early nor keeps a dead one alive."""
    if claim.expires_at is None:
        return False
    if (
        claim.boot_deadline is not None
        and now.boot is not None
        and claim.deadline_boot
        and claim.deadline_boot == now.boot_id
    ):
        return now.boot >= claim.boot_deadline
    return now.wall >= claim.expires_at


def lease_expired_data(data: dict[str, Any], now: Now) -> bool:
    """``lease_expired`` over a persisted claim dict (listing without building objects)."""
    expires = data.get("expires_at")
    if expires is None:
        return False
    deadline = data.get("boot_deadline")
    if deadline is not None and now.boot is not None and data.get("deadline_boot") == now.boot_id \
            and now.boot_id:
        return bool(now.boot >= deadline)
    return bool(now.wall >= expires)


def stale_reason(claim: Claim, now: Now, verdict: Verdict) -> str | None:
    """Why a live claim may be taken over, or None when it may not."""
    if claim.state == EXPIRED:
        return claim.stale_reason or "marked expired"
    if claim.state != ACTIVE:
        return None
    if lease_expired(claim, now):
        if claim.ttl is None and claim.expires_at is not None:
            return (f"parked in {claim.phase} past its maximum park time (which ended "
                    f"{iso(claim.expires_at)})")
        return "lease expired"
    if verdict.dead:
        return "owner dead: " + "; ".join(verdict.reasons)
    return None


def deadline_fields(ttl: float | None, now: Now) -> dict[str, Any]:
    if ttl is None:
        return {"ttl": None, "expires_at": None, "boot_deadline": None, "deadline_boot": ""}
    return {
        "ttl": ttl,
        "expires_at": round(now.wall + ttl, 6),
        "boot_deadline": None if now.boot is None else round(now.boot + ttl, 6),
        "deadline_boot": now.boot_id if now.boot is not None else "",
    }


DEFAULT_MAX_PARK = 86400.0  # a parked claim with no owner process to watch ends after a day


def park_fields(identity: Identity | None, max_park: float | None, now: Now) -> dict[str, Any]:
    """The deadline of a parked claim (no lease) and its liveness source (``park``): the
    owner process when one is recorded (its death makes the claim stale), and a maximum park
    time when asked for or when there is no process to watch, so nothing parks forever."""
    if max_park is None and identity is None:
        max_park = DEFAULT_MAX_PARK
    fields = deadline_fields(max_park, now)
    fields["ttl"] = None  # parked: renew does not extend it, transition ends it
    sources = []
    if identity is not None:
        sources.append(f"owner process {identity.pid} on {identity.host}")
    if max_park is not None:
        sources.append(f"at most {format_duration(max_park)}")
    fields["park"] = " and ".join(sources)
    return fields


def _grant_fields(task: str, grant: Grant, fence: int, now: Now) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "task": task,
        "actor": grant.owner,
        "owner": grant.owner,
        "fence": fence,
        "token_hash": grant.token_hash,
        "phase": grant.phase,
        "priority": grant.priority,
        "note": grant.note,
        "metadata": grant.metadata,
        "identity": None if grant.identity is None else grant.identity.to_dict(),
    }
    fields.update(deadline_fields(grant.ttl, now))
    return fields


def _conflict(task: str, holder: Claim, reason: str, stale: bool) -> ClaimConflict:
    return ClaimConflict(
        task,
        holder=holder.owner,
        fence=holder.fence,
        expires_at=holder.expires_at,
        reason=reason,
        stale=stale,
        phase=holder.phase,
    )


def _rejected(task: str, requester: str, holder: Claim, reason: str) -> dict[str, Any]:
    return {
        "type": ev.CLAIM_REJECTED,
        "task": task,
        "actor": requester,
        "owner": requester,
        "holder": holder.owner,
        "fence": holder.fence,
        "expires_at": holder.expires_at,
        "reason": reason,
    }


@checking(lease_expired)  # then the granted claim's paths against other claims' reservations
def decide_claim(state: State, task: str, grant: Grant, now: Now, verdict: Verdict, *,
                 take_stale: bool = False, preempt: bool = False) -> Decision:
    current = state.claims.get(task)
    fence = state.fence + 1
    if current is None or not (current.live or current.state == COMPLETED):
        refusal = _not_ready(state, task, grant)
        if refusal is not None:
            return refusal
        return Decision((dict(type=ev.CLAIM_CREATED, **_grant_fields(task, grant, fence, now)),))
    if current.state == COMPLETED:
        if current.token_hash == grant.token_hash:
            return Decision()  # a retried claim of one's own completed work: report it as is
        err = TaskCompleted(
            task, owner=current.owner, fence=current.fence, completed_at=current.ended_at
        )
        return Decision((_rejected(task, grant.owner, current, "task completed"),), err)
    if current.token_hash == grant.token_hash:
        if current.state == ACTIVE and lease_expired(current, now):
            # (as renew tells it: it said "claimed" with a negative time left)
            return Decision((), LeaseExpired(task, owner=current.owner, fence=current.fence,
                                             expired_at=current.expires_at,
                                             reason=current.stale_reason))
        return Decision()  # idempotent repeat with the same token
    stale = stale_reason(current, now, verdict)
    if (stale is not None and take_stale) or preempt:
        refusal = _not_ready(state, task, grant)
        if refusal is not None:
            return refusal
    if stale is not None and take_stale:
        fields = _grant_fields(task, grant, fence, now)
        fields.update(
            type=ev.CLAIM_RECOVERED,
            prev_owner=current.owner,
            prev_fence=current.fence,
            reason=stale,
            via="claim",
        )
        return Decision((fields,))
    if preempt:
        candidate = Claim(
            task=task,
            owner=grant.owner,
            fence=fence,
            token_hash=grant.token_hash,
            claimed_at=now.wall,
            priority=grant.priority,
        )
        order, rule = compare(candidate, False, current, stale is not None)
        if order < 0:
            fields = _grant_fields(task, grant, fence, now)
            fields.update(
                type=ev.CLAIM_PREEMPTED,
                prev_owner=current.owner,
                prev_fence=current.fence,
                rule=rule,
            )
            return Decision((fields,))
        reason = f"preemption refused: the holder wins by {rule}"
    elif stale is not None:
        reason = f"stale ({stale}) but take_stale was not requested"
    elif current.owner == grant.owner:
        reason = "held by the same owner name under another token"
    else:
        reason = "held by a live lease"
    return Decision(
        (_rejected(task, grant.owner, current, reason),),
        _conflict(task, current, stale or reason, stale is not None),
    )


def _not_ready(state: State, task: str, grant: Grant) -> Decision | None:
    """The refusal of a claim of a queued task that is blocked or waits for a dependency."""
    error = queue.not_ready(state.tasks.get(task), state.claims)
    if error is None:
        return None
    reason = (f"not ready: blocked ({error.reason})" if error.status == queue.BLOCKED
              else "not ready: waits for " + ", ".join(error.waits_for))
    event = {"type": ev.CLAIM_REJECTED, "task": task, "actor": grant.owner,
             "owner": grant.owner, "reason": reason}
    return Decision((event,), error)


def decide_recover(
    state: State, task: str, grant: Grant, reason: str, now: Now, verdict: Verdict
) -> Decision:
    current = state.claims.get(task)
    fence = state.fence + 1
    if current is None or not (current.live or current.state == COMPLETED):
        # Nothing to take over: a plain claim, so a queued task must be ready.
        refusal = _not_ready(state, task, grant)
        if refusal is not None:
            return refusal
        fields = _grant_fields(task, grant, fence, now)
        fields.update(type=ev.CLAIM_CREATED, reason=reason)
        return Decision((fields,))
    if current.state == COMPLETED:
        err = TaskCompleted(
            task, owner=current.owner, fence=current.fence, completed_at=current.ended_at
        )
        return Decision((), err)
    stale = stale_reason(current, now, verdict)
    if stale is None:
        why = "the owner is not proven dead and its lease is live; a live owner is never robbed"
        return Decision(
            (_rejected(task, grant.owner, current, "recover refused: " + why),),
            _conflict(task, current, why, False),
        )
    fields = _grant_fields(task, grant, fence, now)
    fields.update(
        type=ev.CLAIM_RECOVERED,
        prev_owner=current.owner,
        prev_fence=current.fence,
        reason=f"{reason} ({stale})" if reason else stale,
        via="recover",
    )
    return Decision((fields,))


def holder_check(
    state: State, task: str, token_hash: str, now: Now
) -> tuple[Claim | None, Decision]:
    """(the caller's live, unexpired claim, no decision) or (None, why it does not hold it)."""
    current = state.claims.get(task)
    if current is not None and current.token_hash == token_hash:
        if current.state == ACTIVE and not lease_expired(current, now):
            return current, Decision()
        if current.live:
            err: FleetclaimsError = LeaseExpired(
                task,
                owner=current.owner,
                fence=current.fence,
                expired_at=current.expires_at,
                reason=current.stale_reason,
            )
            return None, Decision((), err)
        if current.state == COMPLETED:
            return None, Decision((), TaskCompleted(
                task, owner=current.owner, fence=current.fence, completed_at=current.ended_at
            ))
        return None, Decision((), _retired_error(task, current, token_hash))
    return None, Decision((), _retired_error(task, current, token_hash))


def _retired_error(task: str, current: Claim | None, token_hash: str) -> FleetclaimsError:
    if current is None:
        return NotHolder(task, "nobody holds this task",
                         hint=f"Claim it: `fleetclaims claim {task}`.")
    for old in current.retired:
        if old.token_hash != token_hash:
            continue
        if old.cause == "recovered":  # (taken over when its owner died: it ended then)
            ended = old.expired_at if old.at is None or old.expired_at is None else min(
                old.expired_at, old.at)
            return LeaseExpired(task, owner=old.owner, fence=old.fence, expired_at=ended,
                                taken_by=old.by, reason=old.rule)
        if old.cause in ("preempted", "superseded"):
            return ClaimSuperseded(
                task, owner=old.owner, fence=old.fence, winner=old.by or "?",
                rule=old.rule or "resolver order",
            )
        if old.cause == "handed_off":
            return NotHolder(task, f"you handed it off to {old.by!r}", holder=current.owner,
                             fence=old.fence)
        if old.cause == "forced":
            return NotHolder(task, f"your claim was released by force by {old.by!r}: {old.rule}",
                             holder=current.owner, fence=old.fence)
        return NotHolder(task, f"your claim (fence {old.fence}) was {old.cause}",
                         holder=current.owner if current.live else None, fence=old.fence)
    return NotHolder(
        task,
        "the token does not match the holder's"
        + (f" (held by {current.owner!r}, fence {current.fence})" if current.live else ""),
        holder=current.owner if current.live else None,
        fence=current.fence if current.live else None,
    )


def _base(kind: str, claim: Claim, actor: str | None = None) -> dict[str, Any]:
    return {
        "type": kind,
        "task": claim.task,
        "actor": actor or claim.owner,
        "owner": claim.owner,
        "fence": claim.fence,
    }


Rebind = tuple[Identity, Identity | None]  # (owner process proven dead, its replacement)


def _rebound(claim: Claim, fields: dict[str, Any], rebind: Rebind | None) -> Identity | None:
    """The owner process after a renewal or transition: when the claim's is still the one
    proven dead (before the lock), the holder restarted and ``rebind[1]`` takes its place."""
    if rebind is None or claim.identity is None or claim.identity != rebind[0]:
        return claim.identity
    fields["identity"] = None if rebind[1] is None else rebind[1].to_dict()
    return rebind[1]


def decide_renew(state: State, task: str, token_hash: str, ttl: float | None, now: Now,
                 rebind: Rebind | None = None) -> Decision:
    claim, refusal = holder_check(state, task, token_hash, now)
    if claim is None:
        return refusal
    fields = _base(ev.LEASE_RENEWED, claim)
    _rebound(claim, fields, rebind)
    if ttl is None and claim.ttl is None:  # parked: the park's own bound stays as it was
        fields.update(ttl=None, expires_at=claim.expires_at, boot_deadline=claim.boot_deadline,
                      deadline_boot=claim.deadline_boot)
    else:
        fields.update(deadline_fields(ttl if ttl is not None else claim.ttl, now))
    return Decision((fields,))


def decide_complete(state: State, task: str, token_hash: str, result: Any, now: Now) -> Decision:
    current = state.claims.get(task)
    if current is not None and current.state == COMPLETED and current.token_hash == token_hash:
        if result is not None and result != current.result:  # (not a retry: it would be lost)
            return Decision(error=ValidationError(
                "result", f"{task} was completed already, with another result; that one "
                "stays (reopen the task to record a new one)"))
        return Decision()  # retried completion: already done
    claim, refusal = holder_check(state, task, token_hash, now)
    if claim is None:
        return refusal
    fields = _base(ev.CLAIM_COMPLETED, claim)
    fields["result"] = result
    ready = queue.became_ready_after(state.tasks, state.claims, task, claim.owner)
    return Decision((fields, *ready))


def decide_release(state: State, task: str, token_hash: str, now: Now) -> Decision:
    current = state.claims.get(task)
    if current is not None and current.token_hash == token_hash:
        if current.live:
            fields = _base(ev.CLAIM_RELEASED, current)
            live = current.state == ACTIVE and not lease_expired(current, now)
            if not live:
                fields["expired"] = True
            return Decision((fields,), result=live)
        return Decision(result=False)  # already released or completed: nothing to do
    error = _retired_error(task, current, token_hash)
    if type(error) is NotHolder and current is not None and any(
        old.token_hash == token_hash and old.cause in ("released", "completed")
        for old in current.retired
    ):
        return Decision(result=False)
    if current is None:
        return Decision(result=False)
    return Decision((), error)


def decide_force_release(state: State, task: str, actor: str, reason: str) -> Decision:
    current = state.claims.get(task)
    if current is None or not current.live:
        return Decision(result=False)
    fields = _base(ev.CLAIM_RELEASED_FORCED, current, actor)
    fields["reason"] = reason
    return Decision((fields,), result=True)


def decide_transition(
    state: State, task: str, token_hash: str, phase: str, ttl: float | None, now: Now,
    max_park: float | None = None, rebind: Rebind | None = None,
) -> Decision:
    """Change phase; ``ttl=None`` parks the claim (see ``park_fields``)."""
    claim, refusal = holder_check(state, task, token_hash, now)
    if claim is None:
        return refusal
    fields = _base(ev.PHASE_CHANGED, claim)
    fields.update(from_phase=claim.phase, phase=phase)
    identity = _rebound(claim, fields, rebind)
    if ttl is None:
        fields.update(park_fields(identity, max_park, now))
    else:
        fields.update(deadline_fields(ttl, now))
    return Decision((fields,))


def decide_handoff(
    state: State,
    task: str,
    token_hash: str,
    to: Grant,
    now: Now,
) -> Decision:
    claim, refusal = holder_check(state, task, token_hash, now)
    if claim is None:
        return refusal
    grant = Grant(
        owner=to.owner,
        token_hash=to.token_hash,
        ttl=to.ttl if to.ttl is not None else claim.ttl,
        priority=claim.priority,
        note=to.note if to.note is not None else claim.note,
        metadata=claim.metadata,
        identity=to.identity,
        phase=claim.phase,
    )
    fields = _grant_fields(task, grant, state.fence + 1, now)
    fields.update(type=ev.CLAIM_HANDED_OFF, actor=claim.owner, prev_owner=claim.owner,
                  prev_fence=claim.fence)
    if claim.ttl is None and to.ttl is None:  # a parked claim stays parked, with a source
        fields.update(park_fields(to.identity, None, now))
    return Decision((fields,))


def decide_reopen(state: State, task: str, actor: str, reason: str) -> Decision:
    current = state.claims.get(task)
    if current is None or current.state != COMPLETED:
        if current is not None and current.live:
            return Decision((), _conflict(task, current, "the task is held, not completed", False))
        return Decision(result=False)
    fields = _base(ev.CLAIM_REOPENED, current, actor)
    fields["reason"] = reason
    return Decision((fields,), result=True)


@dataclass(frozen=True, slots=True)
class SweepItem:
    task: str
    owner: str
    fence: int
    reason: str


@dataclass(frozen=True, slots=True)
class SweepReport:
    found: tuple[SweepItem, ...] = field(default=())


def decide_sweep(state: State, now: Now, verdict_of: VerdictOf, actor: str) -> Decision:
    """Mark every active claim whose lease expired or whose owner is dead; history is kept."""
    found: list[SweepItem] = []
    events: list[dict[str, Any]] = []
    for claim in state.claims.values():
        if claim.state != ACTIVE:
            continue
        reason = stale_reason(claim, now, verdict_of(claim))
        if reason is None:
            continue
        found.append(SweepItem(claim.task, claim.owner, claim.fence, reason))
        fields = _base(ev.LEASE_EXPIRED, claim, actor)
        fields.update(reason=reason, expires_at=claim.expires_at)
        events.append(fields)
    return Decision(tuple(events), result=SweepReport(tuple(found)))


# --- the work queue ------------------------------------------------------------------------


def decide_claim_next(
    state: State,
    grant: Grant,
    now: Now,
    verdict_of: VerdictOf,
    *,
    labels: frozenset[str] = frozenset(),
    take_stale: bool = False,
) -> Decision:
    """Claim the first ready task in hand-out order (priority number, then age, then id) that
    carries every label in ``labels``; with ``take_stale``, a stale claim of an otherwise ready
    task counts as ready. ``result`` is the task claimed, or None when nothing is ready (the
    first PathConflict when ready tasks were refused for the paths asked for)."""
    paths: FleetclaimsError | None = None
    for key, held in state.tasks.candidates(state.claims, take_stale, labels):
        record = state.tasks.get(key[2])
        if record is None or not labels <= set(record.labels):
            continue
        mine = repriced(grant, record.priority)  # the claim takes the task's priority
        if held:
            current = state.claims.get(record.task)
            if current is None:
                continue
            verdict = verdict_of(current)
            if stale_reason(current, now, verdict) is None:
                continue
            decision = decide_claim(state, record.task, mine, now, verdict, take_stale=True)
        else:
            decision = decide_claim(state, record.task, mine, now, UNKNOWN)
        if decision.error is None:
            return Decision(decision.events, result=record.task)
        if paths is None and isinstance(decision.error, PathConflict):
            paths = decision.error  # ("nothing ready (2 ready)" said nothing of the paths)
    return Decision((), paths, result=None)
