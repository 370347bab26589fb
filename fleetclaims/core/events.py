"""Event type names and ``apply``: the only way state changes, live or when replaying the log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from . import queue
from .model import (
    ACTIVE,
    COMPLETED,
    DEFAULT_PHASE,
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
    _new_claim,
    _new_retired,
    _opt_str,
    _str,
    claim_replacer,
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
# Events that change one claim (handled by _apply_claim_event).
_CLAIM_CHANGES = ALL_TYPES - _NO_CLAIM_CHANGE - queue.TASK_EVENTS - {
    REGISTRIES_MERGED, REGISTRY_REBUILT}
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
    kind = event["type"]
    if type(kind) is not str:
        kind = _str(kind)
    seq = event["seq"]
    if type(seq) is not int:
        seq = _int(seq)
    head = event["hash"]
    if type(head) is not str:
        head = _str(head)
    if kind in _CLAIM_CHANGES and not event.get("imported"):  # the common case, first
        _apply_claim_event(state, kind, event, seq)
        tasks = state.tasks
        if tasks.indexed:
            tasks.changed(event["task"], state.claims)
    elif event.get("imported"):
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
        raise ValueError(f"unknown event type {kind!r}")
    state.seq = seq
    state.head = head
    return state


def _apply_claim_event(state: State, kind: str, event: dict[str, Any], seq: int) -> None:
    task = event["task"]
    if type(task) is not str:
        task = _str(task)
    ts = event["ts"]
    if type(ts) is not float or ts - ts != 0.0:  # the common case: a finite float
        ts = _float(ts)
    eid = event.get("ohash") or event["hash"]
    if type(eid) is not str:
        eid = str(eid)
    claims = state.claims
    current = claims.get(task)
    if kind in GRANTS:
        claims[task] = _granted(kind, event, task, current, ts, seq, eid)
        fence = event["fence"]
        if fence > state.fence:  # (an int: _granted checked it)
            state.fence = fence
        return
    if current is None:
        raise ValueError(f"{kind} for task {task!r} that has no claim")
    if kind == LEASE_RENEWED:
        new = _renewed(current, ts, *_deadline(event.get), seq, eid)
    elif kind == PHASE_CHANGED:
        new = _phase_changed(current, _str(event["phase"]), ts, *_deadline(event.get), seq, eid)
    elif kind in (CLAIM_RELEASED, CLAIM_RELEASED_FORCED):
        forced = kind == CLAIM_RELEASED_FORCED
        old = _retire(current, "forced" if forced else "released", ts,
                      by=_opt_str(event.get("actor")) if forced else None,
                      rule=_opt_str(event.get("reason")) if forced else None)
        new = _ended(current, RELEASED, ts, _keep(current, old), seq, eid)
    elif kind == CLAIM_COMPLETED:
        new = _completed(current, COMPLETED, ts, event.get("result"), seq, eid)
    elif kind == CLAIM_REOPENED:
        old = _retire(current, "completed", ts)
        new = _ended(current, RELEASED, ts, _keep(current, old), seq, eid)
    elif kind == LEASE_EXPIRED:
        new = _expired(current, EXPIRED, _opt_str(event.get("reason")), ts, seq, eid)
    elif kind == CLAIM_SUPERSEDED:
        loser = _new_retired(
            _str(event["loser_token_hash"]), _int(event["loser_fence"]), _str(event["loser"]),
            "superseded", _str(event["winner"]), _str(event["rule"]), ts, None,
        )
        retired = current.retired
        if not any(r.token_hash == loser.token_hash for r in retired):
            retired = (*retired, loser)[-RETIRED_KEPT:]
        new = _superseded(current, retired, seq, eid)
    else:  # pragma: no cover - every type is handled above
        raise ValueError(f"unhandled event type {kind!r}")
    claims[task] = new


# Straight-line construction: these run for every line a process applies, its own and those
# other writers appended (bench/profile_claims.py --procs 4), so they avoid keyword dicts and
# the frozen dataclass __init__. Each value is checked as Claim.from_dict would; the
# ``type(v) is ...`` tests only skip the checking call for the common exact types.
_DEADLINE = ("ttl", "expires_at", "boot_deadline", "deadline_boot")
_renewed = claim_replacer("renewed_at", *_DEADLINE, "seq", "eid")
_phase_changed = claim_replacer("phase", "renewed_at", *_DEADLINE, "seq", "eid")
_ended = claim_replacer("state", "ended_at", "retired", "seq", "eid")
_completed = claim_replacer("state", "ended_at", "result", "seq", "eid")
_expired = claim_replacer("state", "stale_reason", "ended_at", "seq", "eid")
_superseded = claim_replacer("retired", "seq", "eid")


def _opt_float_fast(value: Any) -> float | None:
    if value is None or (type(value) is float and value - value == 0.0):
        return value
    return _float(value)


def _deadline(get: Callable[[str], Any]) -> tuple[float | None, float | None, float | None, str]:
    """(ttl, expires_at, boot_deadline, deadline_boot) of an event, checked."""
    boot = get("deadline_boot")
    return (_opt_float_fast(get("ttl")), _opt_float_fast(get("expires_at")),
            _opt_float_fast(get("boot_deadline")),
            boot if type(boot) is str else (_opt_str(boot) or ""))


def _granted(
    kind: str, event: dict[str, Any], task: str, current: Claim | None, ts: float, seq: int,
    eid: str,
) -> Claim:
    retired: tuple[Retired, ...] = () if current is None else current.retired
    owner = event["owner"]
    if type(owner) is not str:
        owner = _str(owner)
    if current is not None and kind in _RETIRE_CAUSE and current.live:
        old = _retire(current, _RETIRE_CAUSE[kind], ts, by=owner,
                      rule=_opt_str(event.get("rule") or event.get("reason")))
        retired = _keep(current, old)
    get = event.get
    fence = event["fence"]
    if type(fence) is not int:
        fence = _int(fence)
    phase = get("phase", DEFAULT_PHASE)
    if type(phase) is not str:
        phase = _str(phase)
    token_hash = event["token_hash"]
    if type(token_hash) is not str:
        token_hash = _str(token_hash)
    priority = get("priority", 100)
    if type(priority) is not int:
        priority = _int(priority)
    note = get("note")
    if note is not None and type(note) is not str:
        note = _str(note)
    metadata = get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError("metadata must be an object")
    ident = get("identity")
    ttl, expires_at, boot_deadline, deadline_boot = _deadline(get)
    return _new_claim(
        task, owner, fence, ACTIVE, phase, token_hash, ts, ts, expires_at, ttl, boot_deadline,
        deadline_boot, priority, note, metadata, None,
        None if ident is None else _identity(ident), None, None, seq, eid, retired, None,
    )


_IDENTITIES: dict[tuple[Any, ...], Identity] = {}
_IDENTITIES_MAX = 1024


def _identity(data: Any) -> Identity:
    """``Identity.from_dict``, shared between the many grants one process makes: the same owner
    process appears on line after line, and building and checking it costs more than a lookup.
    Only exact str/int members are cached (a str equals only a str, and an exact int only an
    int or a float, ruled out by the type test), so a malformed value is still checked."""
    if type(data) is dict:
        get = data.get
        key = (get("host"), get("machine"), get("boot"), get("pidns"), get("pid"), get("start"))
        if type(key[4]) is int and type(key[5]) is int:
            try:
                found = _IDENTITIES.get(key)
            except TypeError:  # an unhashable member: checked by from_dict below
                found = None
            if found is not None:
                return found
            if all(type(v) is str for v in key[:4]):
                found = Identity.from_dict(data)
                if len(_IDENTITIES) >= _IDENTITIES_MAX:
                    _IDENTITIES.clear()
                _IDENTITIES[key] = found
                return found
    return Identity.from_dict(_mapping(data))


def _retire(
    claim: Claim, cause: str, ts: float, *, by: str | None = None, rule: str | None = None
) -> Retired:
    return _new_retired(claim.token_hash, claim.fence, claim.owner, cause, by, rule, ts,
                        claim.expires_at)


def _keep(claim: Claim, old: Retired) -> tuple[Retired, ...]:
    return (*claim.retired, old)[-RETIRED_KEPT:]


def _apply_merge(state: State, event: dict[str, Any], seq: int) -> None:
    """registries_merged carries the merged records of every task the merge changed: claims,
    and work-queue records (which keep the identity of the change they came from)."""
    for data in event.get("claims") or []:
        claim = Claim.from_dict(_mapping(data))
        state.claims[claim.task] = claim.evolve(seq=seq)
    for data in event.get("tasks") or []:
        record = queue.Task.from_dict(_mapping(data))
        state.tasks.put(replace(record, seq=seq), state.claims)
    state.fence = max(state.fence, _int(event.get("fence_floor", 0)))
