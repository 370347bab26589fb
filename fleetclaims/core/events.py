"""The event schema, declared once, and ``apply``: the only way state changes, live or when
replaying the log.

Every event type is declared here with the fields it carries and a one-line narration (what
``explain`` and the review report say when they have nothing more specific). Every other
module takes event type names from here. An event on the wire is the dict the journal holds:
the envelope (``seq``, ``ts``, ``type``, ``prev``, ``hash``; ``ohash`` and ``imported`` after a
merge) plus the fields of its type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from ._fastbuild import completed as _completed
from ._fastbuild import ended as _ended
from ._fastbuild import expired as _expired
from ._fastbuild import new_claim as _new_claim
from ._fastbuild import new_retired as _new_retired
from ._fastbuild import phase_changed as _phase_changed
from ._fastbuild import renewed as _renewed
from ._fastbuild import superseded as _superseded
from ._fastbuild import with_token as _with_token
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
    Task,
    _float,
    _int,
    _mapping,
    _names,
    _opt_str,
    _str,
)
from .paths import PathIndex
from .ports import ClaimView, TaskView
from .state import State, prune_ended

ENVELOPE: Final = ("seq", "ts", "type", "prev", "hash")
# What an event copied from another registry by a merge carries besides its own fields: its
# first seal (its identity), its original time, and the mark that it changes nothing here.
IMPORTED: Final = ("imported", "ohash", "ots")
# What every grant carries (claim_created, claim_recovered, claim_preempted, claim_handed_off).
_DEADLINE = ("ttl", "expires_at", "boot_deadline", "deadline_boot")
_GRANT = ("task", "actor", "owner", "fence", "token_hash", "phase", "priority", "note",
          "metadata", "identity", *_DEADLINE)
_HOLDER = ("task", "actor", "owner", "fence")  # an event about the current holder's claim
_QUEUE_SPEC = ("task", "actor", "priority", "depends_on", "labels", "note")
_QUEUE_TEXT = ("title", "description")  # only when set (events before #17 have neither)


class _Blank(dict[str, Any]):
    """A missing field narrates as "?"."""

    def __missing__(self, key: str) -> str:
        return "?"


@dataclass(frozen=True, slots=True)
class EventType:
    """One event type: its name, the fields every instance carries (beyond the envelope),
    the fields some instances carry, and a one-line narration (a ``str.format`` template over
    the event's fields)."""

    name: str
    fields: tuple[str, ...]
    optional: tuple[str, ...]
    narration: str

    def narrate(self, event: Mapping[str, Any]) -> str:
        """The narration with the event's fields filled in ("?" for a missing one)."""
        return self.narration.format_map(_Blank(event))


_SCHEMA: dict[str, EventType] = {}


def _declare(name: str, fields: tuple[str, ...], narration: str,
             optional: tuple[str, ...] = ()) -> str:
    _SCHEMA[name] = EventType(name, fields, optional, narration)
    return name


# fence_floor/previous_origin: `init --new-history` after a lost history starts above the
# old history's fences (kept in the anchor, see store/file/anchor.py).
REGISTRY_CREATED: Final = _declare(
    "registry_created", ("origin", "actor"), "registry {origin} was created",
    ("fence_floor", "previous_origin", "reason"))
# A break in the chain kept by doctor --fix: the lines in [from_seq, to_seq] (bytes
# [offset, end)) were damaged; the chain goes on from here with the lines that verified.
JOURNAL_BREAK: Final = _declare(
    "journal_break", ("actor", "reason"),
    "the journal was repaired: {reason}",
    ("from_seq", "to_seq", "offset", "end", "quarantined", "lost", "fence_floor",
     "resealed", "kept"))
CLAIM_CREATED: Final = _declare(
    "claim_created", _GRANT, "{owner} claimed {task} (fence {fence})", ("reason", "fence_floor"))
CLAIM_REJECTED: Final = _declare(
    "claim_rejected", ("task", "actor", "owner", "reason"),
    "{owner} was refused {task}: {reason}",  # (a line with count: that many more times)
    # count/first/last: repeats of one refusal (same requester, task, holder) in one line.
    ("holder", "fence", "expires_at", "count", "first", "last"))
# A renewal that only extends the holder's lease (the holder renewing itself, the deadline
# ``ts`` + ``ttl``, the same boot) is recorded compactly: task, ttl and boot_deadline only
# (``compact_renewal``); the rest is the holder's claim's (``fill_renewal`` for readers).
LEASE_RENEWED: Final = _declare(
    "lease_renewed", ("task", "ttl", "boot_deadline"),
    "{owner} renewed the lease on {task} (fence {fence})",
    ("actor", "owner", "fence", "expires_at", "deadline_boot", "identity"))
CLAIM_RELEASED: Final = _declare(
    "claim_released", _HOLDER, "{owner} released {task} (fence {fence})", ("expired",))
CLAIM_RELEASED_FORCED: Final = _declare(
    "claim_released_forced", (*_HOLDER, "reason"),
    "{actor} force-released {owner}'s claim on {task} (fence {fence}): {reason}")
CLAIM_COMPLETED: Final = _declare(
    "claim_completed", (*_HOLDER, "result"), "{owner} completed {task} (fence {fence})")
CLAIM_REOPENED: Final = _declare(
    "claim_reopened", (*_HOLDER, "reason"), "{actor} reopened {task}: {reason}")
LEASE_EXPIRED: Final = _declare(
    "lease_expired", (*_HOLDER, "reason", "expires_at"),
    "{owner}'s claim on {task} (fence {fence}) was marked stale: {reason}")
CLAIM_RECOVERED: Final = _declare(
    "claim_recovered", (*_GRANT, "prev_owner", "prev_fence", "reason", "via"),
    "{owner} took {task} over from {prev_owner} (fence {prev_fence} -> {fence}): {reason}",
    ("fence_floor",))
CLAIM_PREEMPTED: Final = _declare(
    "claim_preempted", (*_GRANT, "prev_owner", "prev_fence", "rule"),
    "{owner} preempted {prev_owner} on {task} (fence {prev_fence} -> {fence}); rule: {rule}",
    ("fence_floor",))
PHASE_CHANGED: Final = _declare(
    "phase_changed", (*_HOLDER, "from_phase", "phase", *_DEADLINE),
    "{owner} moved {task} from {from_phase} to {phase}", ("park", "identity"))
CLAIM_HANDED_OFF: Final = _declare(
    "claim_handed_off", (*_GRANT, "prev_owner", "prev_fence"),
    "{prev_owner} handed {task} off to {owner} (fence {prev_fence} -> {fence})",
    ("park", "fence_floor"))
CLAIM_SUPERSEDED: Final = _declare(
    "claim_superseded",
    (*_HOLDER, "winner", "loser", "loser_fence", "loser_token_hash", "rule"),
    "merge: {loser}'s claim on {task} (fence {loser_fence}) was superseded by {winner}'s "
    "(fence {fence}); rule: {rule}")
REGISTRY_REBUILT: Final = _declare(
    "registry_rebuilt", ("actor", "reason"), "the registry was rebuilt: {reason}",
    ("claims", "tasks", "quarantined", "journal_quarantined", "origin", "fence_floor",
     "lost_claims"))
JOURNAL_TAIL_REPAIRED: Final = _declare(
    "journal_tail_repaired", ("actor", "offset", "bytes", "quarantined"),
    "an incomplete journal tail ({bytes} bytes at offset {offset}) was quarantined")
REGISTRIES_MERGED: Final = _declare(
    "registries_merged",
    ("actor", "source", "source_origin", "imported_events", "claims", "fence_floor",
     "conflicts"),
    "registry merged from {source}",
    ("tasks", "task_conflicts", "queue_cycles", "origin", "path_conflicts"))
TASK_ADDED: Final = _declare(
    "task_added", _QUEUE_SPEC, "{actor} added {task} to the queue (priority {priority})",
    _QUEUE_TEXT)
TASK_UPDATED: Final = _declare(
    "task_updated", (*_QUEUE_SPEC, "changed"),
    "{actor} updated {task} in the queue (priority {priority})", _QUEUE_TEXT)
TASK_BLOCKED: Final = _declare(
    "task_blocked", ("task", "actor", "reason"), "{actor} blocked {task}: {reason}")
TASK_UNBLOCKED: Final = _declare(
    "task_unblocked", ("task", "actor", "reason"), "{actor} unblocked {task}")
BECAME_READY: Final = _declare(
    "became_ready", ("task", "actor", "after"), "{task} became ready")
# A step of a lease kept on a git remote (fleetclaims.sync.remote_lease): recorded here so
# the audit stays in one place; the claim itself changes through the ordinary events.
REMOTE_LEASE: Final = _declare(
    "remote_lease", ("task", "actor", "owner", "fence", "remote", "action", "commit"),
    "{owner}'s lease on {task} (fence {fence}) on git remote {remote}: {action}",
    ("expires_at", "reason"))
# Path reservations (core/paths.py): a grant carries ``paths``/``shared_paths`` only when it
# has some (none before #23); a recovery or handoff without them carries the previous claim's.
# paths_reserved/paths_released change a held claim's (Registry.reserve / unreserve):
# ``paths`` and ``shared_paths`` are its whole reservations afterwards, ``changed`` the change.
_PATHS = ("paths", "shared_paths")
for _grant in (CLAIM_CREATED, CLAIM_RECOVERED, CLAIM_PREEMPTED, CLAIM_HANDED_OFF):
    _SCHEMA[_grant] = replace(_SCHEMA[_grant], optional=(*_SCHEMA[_grant].optional, *_PATHS))
PATHS_RESERVED: Final = _declare(
    "paths_reserved", (*_HOLDER, *_PATHS, "changed"),
    "{owner} reserved {changed} for {task} (fence {fence})")
PATHS_RELEASED: Final = _declare(
    "paths_released", (*_HOLDER, *_PATHS, "changed"),
    "{owner} released the reservation of {changed} for {task} (fence {fence})")

# An explicit retention command (core/prune.py; applied by state.prune_ended): the records
# of claims that ended before ``before`` leave the live state (released ones removed,
# completed ones kept compact); ``released``/``completed`` count them. The journal keeps
# their events.
CLAIMS_PRUNED: Final = _declare(
    "claims_pruned", ("actor", "before", "released", "completed"),
    "{actor} pruned the records of {released} released and {completed} completed claims "
    "that ended before {before}")

SCHEMA: Final[Mapping[str, EventType]] = MappingProxyType(_SCHEMA)
ALL_TYPES: Final = frozenset(SCHEMA)
GRANTS: Final = frozenset({CLAIM_CREATED, CLAIM_RECOVERED, CLAIM_PREEMPTED, CLAIM_HANDED_OFF})
# A claim's end: the holder let go, finished, or was made to let go.
ENDS: Final = frozenset({CLAIM_RELEASED, CLAIM_RELEASED_FORCED, CLAIM_COMPLETED})
# How a holder loses a claim it did not give up.
LOSSES: Final = frozenset({LEASE_EXPIRED, CLAIM_RECOVERED, CLAIM_PREEMPTED, CLAIM_SUPERSEDED,
                           CLAIM_RELEASED_FORCED})
# Events about the registry itself rather than one task.
REGISTRY_EVENTS: Final = frozenset({REGISTRY_REBUILT, JOURNAL_TAIL_REPAIRED, REGISTRIES_MERGED,
                                    JOURNAL_BREAK, CLAIMS_PRUNED})
TASK_EVENTS: Final = frozenset({TASK_ADDED, TASK_UPDATED, TASK_BLOCKED, TASK_UNBLOCKED,
                                BECAME_READY})
# Journal bookkeeping that changes no claim.
_NO_CLAIM_CHANGE = frozenset({CLAIM_REJECTED, JOURNAL_TAIL_REPAIRED, REGISTRY_CREATED,
                              REMOTE_LEASE, JOURNAL_BREAK})
# Events that change one claim (handled by _apply_claim_event).
_CLAIM_CHANGES = ALL_TYPES - _NO_CLAIM_CHANGE - TASK_EVENTS - {
    REGISTRIES_MERGED, REGISTRY_REBUILT, CLAIMS_PRUNED}
IDENTITY_MEMO_MAX = 1024  # owner processes remembered per state (State.identities)
_RETIRE_CAUSE = {
    CLAIM_RECOVERED: "recovered",
    CLAIM_PREEMPTED: "preempted",
    CLAIM_HANDED_OFF: "handed_off",
}


def refusals(event: Mapping[str, Any]) -> int:
    """How many refusals a ``claim_rejected`` line stands for: repeats of one refusal are
    recorded as one line with ``count`` (the first of a run is a line of its own)."""
    count = event.get("count")
    return count if type(count) is int and count > 0 else 1


_COMPACT_RENEWAL = frozenset({"type", "task", "actor", "owner", "fence", *_DEADLINE})


def compact_renewal(fields: dict[str, Any], ts: float, current: Claim | None) -> dict[str, Any]:
    """The fields of a ``lease_renewed`` to record at ``ts`` given the claim it renews: the
    compact form when it only extends the holder's lease (the holder itself renewing, the
    deadline ``round(ts + ttl, 6)``, the claim's boot), else ``fields`` unchanged. ``apply``
    gives both forms the same effect; ~100 bytes less a heartbeat."""
    if (current is None or fields.get("type") != LEASE_RENEWED
            or _COMPACT_RENEWAL.symmetric_difference(fields)):
        return fields
    ttl = fields["ttl"]
    if (type(ttl) is not float and type(ttl) is not int) or ttl != ttl:
        return fields
    owner = fields["owner"]
    if (owner != current.owner or fields["actor"] != owner or fields["fence"] != current.fence
            or fields["deadline_boot"] != current.deadline_boot
            or fields["expires_at"] != round(ts + ttl, 6)):
        return fields
    return {"type": LEASE_RENEWED, "task": fields["task"], "ttl": ttl,
            "boot_deadline": fields["boot_deadline"]}


def fill_renewal(event: dict[str, Any], holders: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """For readers of a stream of events: ``event`` with a compact renewal's holder fields
    filled in (a copy; owner and fence from ``holders``, task -> (owner, fence), which this
    keeps up to date from the events passed; the deadline from ts + ttl). Never use the copy
    where the recorded bytes matter (its seal is the compact line's)."""
    task = event.get("task")
    if event.get("type") == LEASE_RENEWED and "owner" not in event:
        owner, fence = holders.get(task, (None, None)) if isinstance(task, str) else (None, None)
        full = dict(event)
        full.update(actor=owner, owner=owner, fence=fence)
        ttl = event.get("ttl")
        ts = event.get("ts")
        if isinstance(ttl, (int, float)) and isinstance(ts, (int, float)):
            full["expires_at"] = round(ts + ttl, 6)
        return full
    if isinstance(task, str) and "owner" in event and "fence" in event and (
            event.get("type") != CLAIM_REJECTED):
        holders[task] = (event["owner"], event["fence"])
    return event


def narrate(event: Mapping[str, Any]) -> str:
    """The schema's one-line narration of ``event`` (its type name when the type is unknown)."""
    kind = event.get("type")
    found = SCHEMA.get(kind) if isinstance(kind, str) else None
    if kind == LEASE_RENEWED and "owner" not in event:  # compact: no holder named
        return f"the holder renewed the lease on {event.get('task')} (ttl {event.get('ttl')}s)"
    return str(kind) if found is None else found.narrate(event)


def event_id(event: dict[str, Any]) -> str:
    """The identity of an event across registries: the hash it was first sealed with (two
    copies of one registry agree on their shared history, differ on what came after)."""
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
        if state.reservations is not None:  # built once a claim reserved paths
            _reindex(state.reservations, event["task"], state.claims)
        tasks = state.tasks
        if tasks.indexed:
            tasks.changed(event["task"], state.claims)
    elif event.get("imported"):
        pass  # history copied from another registry: its effect arrives in registries_merged
    elif kind == REGISTRY_CREATED:
        state.origin = _str(event["origin"])
        state.fence = max(state.fence, _int(event.get("fence_floor", 0)))
    elif kind == JOURNAL_BREAK:
        state.fence = max(state.fence, _int(event.get("fence_floor", 0)))
    elif kind in (REGISTRIES_MERGED, REGISTRY_REBUILT):
        # Both may carry whole claim records: a merge's outcome, or claims that doctor --fix
        # salvaged from a snapshot that was ahead of a damaged journal.
        if not state.origin and isinstance(event.get("origin"), str):
            state.origin = event["origin"]
        _apply_merge(state, event, seq)
        state.tasks.drop_index()  # claims changed wholesale: rebuilt on next use
    elif kind == CLAIMS_PRUNED:
        prune_ended(state.claims, _float(event["before"]), seq,
                    _str(event.get("ohash") or head))
    elif kind in TASK_EVENTS:
        _apply_task_event(state.tasks, state.claims, kind, event, seq,
                               _float(event["ts"]))
    elif kind not in _NO_CLAIM_CHANGE:
        raise ValueError(f"unknown event type {kind!r}")
    state.seq = seq
    state.head = head
    return state


def _floored(high: int, fence: Any, event: dict[str, Any]) -> bool:
    """A grant above the high-water that records why: ``fence_floor`` (e.g. the fence a git
    remote's lease carried), at or above the high-water, with the fence one above it."""
    floor = event.get("fence_floor")
    return (type(floor) is int and type(fence) is int and floor >= high
            and fence == floor + 1)


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
        fence = event["fence"]
        if fence != state.fence + 1 and not _floored(state.fence, fence, event):
            # Fences never go back: a grant is the high-water + 1 (or a recorded floor + 1).
            # Anything else (a reused fence, a forged line) is damage, not history.
            raise ValueError(f"grant of fence {fence!r} after high-water {state.fence}")
        claims[task] = granted = _granted(kind, event, task, current, ts, seq, eid,
                                          state.identities)
        state.fence = granted.fence
        return
    if current is None:
        raise ValueError(f"{kind} for task {task!r} that has no claim")
    if kind == LEASE_RENEWED:
        if "owner" in event:
            new = _rebound(_renewed(current, ts, *_deadline(event.get), seq, eid), event, state)
        else:  # compact: the holder's own lease extended to ts + ttl (see compact_renewal)
            ttl = _float(event["ttl"])
            new = _renewed(current, ts, ttl, round(ts + ttl, 6),
                           _opt_float_fast(event.get("boot_deadline")), current.deadline_boot,
                           seq, eid)
    elif kind == PHASE_CHANGED:
        new = _rebound(_phase_changed(current, _str(event["phase"]), ts, *_deadline(event.get),
                                      seq, eid), event, state)
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
    elif kind in (PATHS_RESERVED, PATHS_RELEASED):
        new = replace(current, paths=_names(event["paths"]),
                      shared_paths=_names(event["shared_paths"]), seq=seq, eid=eid)
    else:  # pragma: no cover - every type is handled above
        raise ValueError(f"unhandled event type {kind!r}")
    claims[task] = new


def _reindex(index: PathIndex, task: str, claims: ClaimView) -> None:
    """Keep a built reservation index in step (a claim that reserves nothing costs a lookup)."""
    claim = claims.get(task)
    if claim is not None and (claim.paths or claim.shared_paths or index.holds(task)):
        if claim.live:
            index.put(task, claim.paths, claim.shared_paths)
        else:
            index.drop(task)  # reservations lapse with the claim


# Straight-line construction: these run for every line a process applies, its own and those
# other writers appended (bench/profile_claims.py --procs 4), so they use the fast
# constructors of _fastbuild (positional, no frozen dataclass __init__). Each value is
# checked as Claim.from_dict would; the ``type(v) is ...`` tests only skip the checking call
# for the common exact types.


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
    eid: str, memo: dict[tuple[Any, ...], Identity],
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
    paths = get("paths")
    if paths is not None:
        paths, shared = _names(paths), _names(get("shared_paths") or ())
    elif current is not None and kind in (CLAIM_RECOVERED, CLAIM_HANDED_OFF):
        paths, shared = current.paths, current.shared_paths  # carried to the new holder
    else:
        paths = shared = ()
    return _new_claim(
        task, owner, fence, ACTIVE, phase, token_hash, ts, ts, expires_at, ttl, boot_deadline,
        deadline_boot, priority, note, metadata, None,
        None if ident is None else _identity(ident, memo), None, None, seq, eid, retired,
        paths, shared, None,
    )


def _rebound(claim: Claim, event: dict[str, Any], state: State) -> Claim:
    """``claim`` with the owner process a renewal or transition of a restarted holder names."""
    if "identity" not in event:
        return claim
    ident = event["identity"]
    return replace(claim, identity=None if ident is None else _identity(ident, state.identities))


def _identity(data: Any, memo: dict[tuple[Any, ...], Identity]) -> Identity:
    """``Identity.from_dict``, shared between the grants of one owner process: the same
    process appears on line after line, and building and checking it costs more than a lookup
    in the state's memo. Only exact str/int members are remembered (a str equals only a str,
    and an exact int only an int or a float, ruled out by the type test), so a malformed value
    is still checked."""
    if type(data) is dict:
        get = data.get
        key = (get("host"), get("machine"), get("boot"), get("pidns"), get("pid"), get("start"))
        if type(key[4]) is int and type(key[5]) is int:
            try:
                found = memo.get(key)
            except TypeError:  # an unhashable member: checked by from_dict below
                found = None
            if found is not None:
                return found
            if all(type(v) is str for v in key[:4]):
                found = Identity.from_dict(data)
                if len(memo) >= IDENTITY_MEMO_MAX:
                    memo.clear()
                memo[key] = found
                return found
    return Identity.from_dict(_mapping(data))


def _retire(
    claim: Claim, cause: str, ts: float, *, by: str | None = None, rule: str | None = None
) -> Retired:
    return _new_retired(claim.token_hash, claim.fence, claim.owner, cause, by, rule, ts,
                        claim.expires_at)


def with_token(claim: Claim, token: str | None) -> Claim:
    """``claim.with_token(token)`` by the generated copy: every write hands its claim back to
    the caller with its token, and ``dataclasses.replace`` costs ~8 us of introspection."""
    return _with_token(claim, token)


def _keep(claim: Claim, old: Retired) -> tuple[Retired, ...]:
    return (*claim.retired, old)[-RETIRED_KEPT:]


def _apply_merge(state: State, event: dict[str, Any], seq: int) -> None:
    """registries_merged carries the merged records of every task the merge changed: claims,
    and work-queue records (which keep the identity of the change they came from)."""
    for data in event.get("claims") or []:
        claim = Claim.from_dict(_mapping(data))
        state.claims[claim.task] = claim.evolve(seq=seq)
    state.reservations = None  # claims changed wholesale: rebuilt on next use
    for data in event.get("tasks") or []:
        record = Task.from_dict(_mapping(data))
        state.tasks.put(replace(record, seq=seq), state.claims)
    state.fence = max(state.fence, _int(event.get("fence_floor", 0)))


def _apply_task_event(tasks: TaskView, claims: ClaimView, kind: str, event: dict[str, Any],
                     seq: int, ts: float) -> None:
    """Apply one work-queue event."""
    name = _str(event["task"])
    if kind == BECAME_READY:
        return  # a record for reviewers; readiness itself is derived
    current = tasks.get(name)
    eid = _str(event.get("ohash") or event["hash"])
    if kind in (TASK_ADDED, TASK_UPDATED):
        record = Task(
            task=name,
            priority=_int(event.get("priority", 100)),
            depends_on=_names(event.get("depends_on") or ()),
            labels=_names(event.get("labels") or ()),
            note=_opt_str(event.get("note")),
            title=_opt_str(event.get("title")),
            description=_opt_str(event.get("description")),
            added_at=ts if current is None else current.added_at,
            added_by=_str(event.get("actor") or "") if current is None else current.added_by,
            blocked=None if current is None else current.blocked,
            blocked_by=None if current is None else current.blocked_by,
            seq=seq,
            eid=eid,
            changed_at=ts,
        )
    elif current is None:
        raise ValueError(f"{kind} for task {name!r} that is not in the queue")
    elif kind == TASK_BLOCKED:
        record = replace(current, blocked=_str(event.get("reason") or "blocked"),
                         blocked_by=_opt_str(event.get("actor")), seq=seq, eid=eid,
                         changed_at=ts)
    elif kind == TASK_UNBLOCKED:
        record = replace(current, blocked=None, blocked_by=None, seq=seq, eid=eid,
                         changed_at=ts)
    else:  # pragma: no cover - TASK_EVENTS is handled above
        raise ValueError(f"unhandled event type {kind!r}")
    tasks.put(record, claims)
