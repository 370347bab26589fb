"""The read side of the Registry facade: which claims a listing shows, the counts of
``stats()``, and a filtered page of events. Plain functions of a state (or an event stream)
and a time, so ``api.Registry`` only validates arguments and reads the store."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .core import queue, rules
from .core.errors import AuditCorrupt
from .core.model import ACTIVE, COMPLETED, EXPIRED, Claim, Now
from .store.base import Event, EventPage, Store

if TYPE_CHECKING:
    from .core.state import State


@dataclass(frozen=True)
class OwnerStats:
    active: int = 0
    expired: int = 0
    completed: int = 0


@dataclass(frozen=True)
class Stats:
    active: int
    expired: int
    completed: int
    released: int
    seq: int
    fence: int
    per_owner: dict[str, OwnerStats] = field(default_factory=dict)
    #: tasks of the work queue by readiness (ready, held, pending, blocked, completed)
    queue: dict[str, int] = field(default_factory=dict)


def _first(item: tuple[str, Any]) -> str:
    return item[0]


def _listed(state: str, unexpired: bool, expired: bool, completed: bool, released: bool) -> bool:
    """Whether claims()/claims_data() list a claim in ``state``: live ones always, the rest
    when asked for."""
    return (
        unexpired
        or (state in (ACTIVE, EXPIRED) and expired)
        or (state == COMPLETED and completed)
        or (state == "released" and released)
    )


def listed_claims(state: State, now: Now, owner: str | None, include_expired: bool,
                  include_completed: bool, include_released: bool) -> list[Claim]:
    """Registry.claims(): claims sorted by task, live ones plus the kinds asked for."""
    found = []
    for claim in state.claims.values():
        if owner is not None and claim.owner != owner:
            continue
        unexpired = claim.state == ACTIVE and not rules.lease_expired(claim, now)
        if _listed(claim.state, unexpired, include_expired, include_completed,
                   include_released):
            found.append(claim)
    return found


def listed_data(state: State, now: Now, owner: str | None, include_expired: bool,
                include_completed: bool, include_released: bool) -> list[dict[str, Any]]:
    """Registry.claims_data(): listed_claims() as persisted dicts, building no Claim."""
    found = []
    expired = rules.lease_expired_data
    for _task, data in sorted(state.claims.data_items(), key=_first):
        if owner is not None and data.get("owner") != owner:
            continue
        kind = data.get("state", ACTIVE)
        if kind == ACTIVE and not expired(data, now):
            found.append(data)  # live: always listed
        elif _listed(kind, False, include_expired, include_completed, include_released):
            found.append(data)
    return found


def count(state: State, now: Now) -> Stats:
    """Registry.stats(): claims by kind and per owner, queued tasks by readiness."""
    counts = {"active": 0, "expired": 0, "completed": 0, "released": 0}
    owners: dict[str, dict[str, int]] = {}
    for claim in state.claims.values():
        if claim.state == ACTIVE and not rules.lease_expired(claim, now):
            kind = "active"
        elif claim.state in (ACTIVE, EXPIRED):
            kind = "expired"
        else:
            kind = claim.state
        counts[kind] += 1
        if kind != "released":
            per = owners.setdefault(claim.owner, {"active": 0, "expired": 0, "completed": 0})
            per[kind] += 1
    by_readiness = dict.fromkeys(queue.READINESS_ORDER, 0) if len(state.tasks) else {}
    for record in state.tasks.values():
        by_readiness[queue.status(record, state.claims).status] += 1
    return Stats(
        active=counts["active"], expired=counts["expired"], completed=counts["completed"],
        released=counts["released"], seq=state.seq, fence=state.fence,
        per_owner={o: OwnerStats(**c) for o, c in sorted(owners.items())},
        queue=by_readiness,
    )


def verified_part(store: Store,
                  events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``events`` up to the first damaged line, which the store then names (its ``damage``,
    logged): a reviewer sees what verifies (guarantee 6). A store that cannot name it, and a
    damaged or missing sealed segment (restore it), still raise."""
    try:
        yield from events
    except AuditCorrupt as exc:
        note = getattr(store, "note_damage", None)
        if type(exc) is not AuditCorrupt or note is None:
            raise
        note(exc)


def events(store: Store, after: int, limit: int, wanted: frozenset[str] | set[str] | None,
           task: str | None, owner: str | None, since: float | None,
           until: float | None) -> EventPage:
    """Registry.events() over ``store``: with a task, a store that can read one task's lines
    alone (the file store's ``task_events``: segment indexes, a bytes search) does so."""
    quick = None if task is None else getattr(store, "task_events", None)
    if quick is not None:
        head = store.read().seq  # (before the read: no later line is skipped)
        page = event_page((e for e in verified_part(store, quick(task)) if e["seq"] > after),
                          after, limit, wanted, task, owner, since, until)
        if page.more:
            return page
        return EventPage(page.events, max(page.next_cursor, head), False)
    return event_page(verified_part(store, store.iter_events(after)), after, limit, wanted,
                      task, owner, since, until)


def event_page(events: Iterable[dict[str, Any]], after: int, limit: int,
               wanted: frozenset[str] | set[str] | None, task: str | None, owner: str | None,
               since: float | None, until: float | None) -> EventPage:
    """Registry.events(): up to ``limit`` of ``events`` (those with seq > ``after``, oldest
    first) that match the filters, and the cursor to continue from."""
    out: list[Event] = []
    cursor = after
    more = False
    for data in events:
        if len(out) >= limit:
            more = True
            break
        cursor = int(data["seq"])
        if wanted is not None and data.get("type") not in wanted:
            continue
        if task is not None and data.get("task") != task:
            continue
        if owner is not None and owner not in (data.get("owner"), data.get("actor"),
                                               data.get("prev_owner"), data.get("holder")):
            continue
        ts = data.get("ts", 0.0)
        if (since is not None and ts < since) or (until is not None and ts > until):
            continue
        out.append(Event.from_dict(data))
    return EventPage(out, cursor, more)


def lease_left(expires_at: float | None, boot_deadline: float | None, deadline_boot: str,
               now: Now | float) -> float | None:
    """Seconds until the lease ends (negative once it has), None when parked. Told by the
    clock that decides expiry (rules.lease_expired): on the boot that set the deadline, the boot
    clock, so a wall-clock step does not show a live lease as over; else the wall clock."""
    if expires_at is None:
        return None
    if not isinstance(now, Now):
        return expires_at - now
    if boot_deadline is not None and now.boot is not None and deadline_boot \
            and deadline_boot == now.boot_id:
        return boot_deadline - now.boot
    return expires_at - now.wall

