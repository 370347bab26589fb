"""Event type names and ``apply``: the only way state changes, live or when replaying the log."""

from __future__ import annotations

from typing import Any

from . import queue
from .model import (
    ACTIVE,
    COMPLETED,
    EXPIRED,
    RELEASED,
    RETIRED_KEPT,
    Claim,
    Identity,
    Retired,
    State,
    _float,
    _int,
    _mapping,
    _opt_float,
    _opt_str,
    _str,
    build_claim,
)

REGISTRY_CREATED = "registry_created"
CLAIM_CREATED = "claim_created"
CLAIM_REJECTED = "claim_rejected"
LEASE_RENEWED = "lease_renewed"
CLAIM_RELEASED = "claim_released"
CLAIM_RELEASED_FORCED = "claim_released_forced"
CLAIM_COMPLETED = "claim_completed"
CLAIM_REOPENED = "claim_reopened"
LEASE_EXPIRED = "lease_expired"
CLAIM_RECOVERED = "claim_recovered"
CLAIM_PREEMPTED = "claim_preempted"
PHASE_CHANGED = "phase_changed"
CLAIM_HANDED_OFF = "claim_handed_off"
CLAIM_SUPERSEDED = "claim_superseded"
REGISTRY_REBUILT = "registry_rebuilt"
JOURNAL_TAIL_REPAIRED = "journal_tail_repaired"
REGISTRIES_MERGED = "registries_merged"

GRANTS = frozenset({CLAIM_CREATED, CLAIM_RECOVERED, CLAIM_PREEMPTED, CLAIM_HANDED_OFF})
ALL_TYPES = frozenset(
    {
        REGISTRY_CREATED,
        CLAIM_CREATED,
        CLAIM_REJECTED,
        LEASE_RENEWED,
        CLAIM_RELEASED,
        CLAIM_RELEASED_FORCED,
        CLAIM_COMPLETED,
        CLAIM_REOPENED,
        LEASE_EXPIRED,
        CLAIM_RECOVERED,
        CLAIM_PREEMPTED,
        PHASE_CHANGED,
        CLAIM_HANDED_OFF,
        CLAIM_SUPERSEDED,
        REGISTRY_REBUILT,
        JOURNAL_TAIL_REPAIRED,
        REGISTRIES_MERGED,
        *queue.TASK_EVENTS,
    }
)
# Journal bookkeeping that changes no claim.
_NO_CLAIM_CHANGE = frozenset({CLAIM_REJECTED, JOURNAL_TAIL_REPAIRED, REGISTRY_CREATED})
_RETIRE_CAUSE = {
    CLAIM_RECOVERED: "recovered",
    CLAIM_PREEMPTED: "preempted",
    CLAIM_HANDED_OFF: "handed_off",
}


def event_id(event: dict[str, Any]) -> str:
    """The identity of an event across registries: the hash it was first sealed with.

    Content-addressed, so two copies of one registry (a laptop's copy, a USB stick) agree on
    the identity of their shared history and differ on everything written since they parted.
    """
    return str(event.get("ohash") or event["hash"])


def apply(state: State, event: dict[str, Any]) -> State:
    """Apply one committed event to ``state`` (in place, for O(1) cost) and return it.

    Raises KeyError/TypeError/ValueError on an event that does not make sense; the caller
    treats that as journal damage.
    """
    kind = _str(event["type"])
    seq = _int(event["seq"])
    if event.get("imported"):
        pass  # history copied from another registry: its effect arrives in registries_merged
    elif kind == REGISTRY_CREATED:
        state.origin = _str(event["origin"])
    elif kind in (REGISTRIES_MERGED, REGISTRY_REBUILT):
        # Both may carry whole claim records: a merge's outcome, or claims that doctor --fix
        # salvaged from a snapshot that was ahead of a damaged journal.
        if not state.origin and isinstance(event.get("origin"), str):
            state.origin = event["origin"]
        _apply_merge(state, event, seq)
        state.tasks.drop_index()  # claims changed wholesale: rebuilt on next use
    elif kind in queue.TASK_EVENTS:
        queue.apply_task_event(state.tasks, state.claims, kind, event, seq,
                               _float(event["ts"]))
    elif kind not in _NO_CLAIM_CHANGE:
        _apply_claim_event(state, kind, event, seq)
        if state.tasks.indexed:
            state.tasks.changed(_str(event["task"]), state.claims)
    state.seq = seq
    state.head = _str(event["hash"])
    return state


def _apply_claim_event(state: State, kind: str, event: dict[str, Any], seq: int) -> None:
    task = _str(event["task"])
    ts = _float(event["ts"])
    eid = event_id(event)
    current = state.claims.get(task)
    if kind in GRANTS:
        state.claims[task] = _granted(kind, event, current, ts, seq, eid)
        state.fence = max(state.fence, _int(event["fence"]))
        return
    if kind not in ALL_TYPES:
        raise ValueError(f"unknown event type {kind!r}")
    if current is None:
        raise ValueError(f"{kind} for task {task!r} that has no claim")
    common: dict[str, Any] = {"seq": seq, "eid": eid}
    if kind == LEASE_RENEWED:
        new = current.evolve(renewed_at=ts, **_deadline(event), **common)
    elif kind == PHASE_CHANGED:
        new = current.evolve(phase=_str(event["phase"]), renewed_at=ts, **_deadline(event),
                      **common)
    elif kind in (CLAIM_RELEASED, CLAIM_RELEASED_FORCED):
        forced = kind == CLAIM_RELEASED_FORCED
        old = _retire(current, "forced" if forced else "released", ts,
                      by=_opt_str(event.get("actor")) if forced else None,
                      rule=_opt_str(event.get("reason")) if forced else None)
        new = current.evolve(state=RELEASED, ended_at=ts, retired=_keep(current, old), **common)
    elif kind == CLAIM_COMPLETED:
        new = current.evolve(state=COMPLETED, ended_at=ts, result=event.get("result"), **common)
    elif kind == CLAIM_REOPENED:
        old = _retire(current, "completed", ts)
        new = current.evolve(state=RELEASED, ended_at=ts, retired=_keep(current, old), **common)
    elif kind == LEASE_EXPIRED:
        new = current.evolve(state=EXPIRED, stale_reason=_opt_str(event.get("reason")),
                      ended_at=ts, **common)
    elif kind == CLAIM_SUPERSEDED:
        loser = Retired(
            token_hash=_str(event["loser_token_hash"]),
            fence=_int(event["loser_fence"]),
            owner=_str(event["loser"]),
            cause="superseded",
            by=_str(event["winner"]),
            rule=_str(event["rule"]),
            at=ts,
        )
        if any(r.token_hash == loser.token_hash for r in current.retired):
            new = current.evolve(**common)
        else:
            new = current.evolve(retired=(*current.retired, loser)[-RETIRED_KEPT:], **common)
    else:  # pragma: no cover - every type is handled above
        raise ValueError(f"unhandled event type {kind!r}")
    state.claims[task] = new


def _granted(
    kind: str, event: dict[str, Any], current: Claim | None, ts: float, seq: int, eid: str
) -> Claim:
    retired: tuple[Retired, ...] = () if current is None else current.retired
    if current is not None and kind in _RETIRE_CAUSE and current.live:
        old = _retire(current, _RETIRE_CAUSE[kind], ts, by=_str(event["owner"]),
                      rule=_opt_str(event.get("rule") or event.get("reason")))
        retired = _keep(current, old)
    ident = event.get("identity")
    metadata = event.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError("metadata must be an object")
    return build_claim(
        task=_str(event["task"]),
        owner=_str(event["owner"]),
        fence=_int(event["fence"]),
        state=ACTIVE,
        phase=_str(event.get("phase", "working")),
        token_hash=_str(event["token_hash"]),
        claimed_at=ts,
        renewed_at=ts,
        priority=_int(event.get("priority", 100)),
        note=_opt_str(event.get("note")),
        metadata=metadata,
        identity=None if ident is None else _identity(ident),
        seq=seq,
        eid=eid,
        retired=retired,
        **_deadline(event),
    )


_IDENTITIES: dict[tuple[Any, ...], Identity] = {}
_IDENTITIES_MAX = 1024


def _identity(data: Any) -> Identity:
    """``Identity.from_dict``, shared between the many grants one process makes: the same owner
    process appears on line after line, and building and checking it costs more than a lookup.
    Only exact str/int members are looked up, so a malformed value is still checked."""
    found = None
    if type(data) is dict:
        key = (data.get("host"), data.get("machine"), data.get("boot"), data.get("pidns"),
               data.get("pid"), data.get("start"))
        if all(type(v) is str for v in key[:4]) and type(key[4]) is int \
                and type(key[5]) is int:
            found = _IDENTITIES.get(key)
            if found is None:
                found = Identity.from_dict(data)
                if len(_IDENTITIES) >= _IDENTITIES_MAX:
                    _IDENTITIES.clear()
                _IDENTITIES[key] = found
    return found if found is not None else Identity.from_dict(_mapping(data))


def _deadline(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "ttl": _opt_float(event.get("ttl")),
        "expires_at": _opt_float(event.get("expires_at")),
        "boot_deadline": _opt_float(event.get("boot_deadline")),
        "deadline_boot": _opt_str(event.get("deadline_boot")) or "",
    }


def _retire(
    claim: Claim, cause: str, ts: float, *, by: str | None = None, rule: str | None = None
) -> Retired:
    return Retired(
        token_hash=claim.token_hash,
        fence=claim.fence,
        owner=claim.owner,
        cause=cause,
        by=by,
        rule=rule,
        at=ts,
        expired_at=claim.expires_at,
    )


def _keep(claim: Claim, old: Retired) -> tuple[Retired, ...]:
    return (*claim.retired, old)[-RETIRED_KEPT:]


def _apply_merge(state: State, event: dict[str, Any], seq: int) -> None:
    """registries_merged carries the merged records of every task the merge changed."""
    for data in event.get("claims") or []:
        claim = Claim.from_dict(_mapping(data))
        state.claims[claim.task] = claim.evolve(seq=seq)
    state.fence = max(state.fence, _int(event.get("fence_floor", 0)))
