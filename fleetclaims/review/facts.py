"""What a reviewer asks of a journal, computed in one pass: holdings (who held what, when),
markers, where agents waited, what was lost, and who worked on what.

Pure functions over event dicts (``audit.jsonl`` lines, journal order): no I/O, no clock, stdlib
only. Event type names come from ``core.events``, the one place they are declared. Written for
a million events: one pass, mutable working records frozen at the end, no per-renewal copies."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..core import events as ev

Event = Mapping[str, Any]

GRANT_TYPES = ev.GRANTS
# What ends a holding on the timeline: the claim's end, or its lease marked stale.
END_TYPES = ev.ENDS | {ev.LEASE_EXPIRED}
# A grant that ended by one of these was lost by its holder (not given up).
LOST_TYPES = ev.LOSSES
MARKER_KINDS: dict[str, str] = {
    ev.CLAIM_REJECTED: "rejected", ev.LEASE_EXPIRED: "expired", ev.CLAIM_RECOVERED: "recovered",
    ev.CLAIM_PREEMPTED: "preempted", ev.CLAIM_HANDED_OFF: "handed_off",
    ev.CLAIM_COMPLETED: "completed", ev.CLAIM_RELEASED_FORCED: "forced_release",
    ev.CLAIM_SUPERSEDED: "superseded", ev.CLAIM_REOPENED: "reopened",
    ev.PATHS_RESERVED: "paths_reserved", ev.PATHS_RELEASED: "paths_released",  # a claim's files
}
REGISTRY_TYPES = ev.REGISTRY_EVENTS
_RENEWS = frozenset({ev.LEASE_RENEWED, ev.PHASE_CHANGED})


def _compact_expiry(e: Mapping[str, Any]) -> Any:
    """A compact renewal's deadline (ts + ttl, see events.compact_renewal)."""
    ts, ttl = _num(e.get("ts")), _num(e.get("ttl"))
    return None if ts is None or ttl is None else round(ts + ttl, 6)


@dataclass(frozen=True, slots=True)
class Holding:
    """A bar: ``task`` granted to ``owner`` by event ``start_seq`` until event ``end_seq``. Open
    at ``generated_at``: ``end_seq`` None, ``end_type`` "held" or "lapsed" (deadline passed with
    nothing recorded). ``expires_at``: last recorded lease deadline (None: parked)."""

    task: str
    owner: str
    fence: int | None
    start_seq: int
    start_ts: float
    start_type: str
    end_seq: int | None
    end_ts: float
    end_type: str
    end_actor: str | None = None
    end_reason: str | None = None
    expires_at: float | None = None

    @property
    def open(self) -> bool:
        return self.end_seq is None

    @property
    def held_until(self) -> float:  # end of the valid lease: bar end or deadline if earlier
        end = self.end_ts if self.expires_at is None else min(self.end_ts, self.expires_at)
        return max(self.start_ts, end)


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # a value of MARKER_KINDS
    seq: int
    ts: float
    task: str
    detail: str  # plain text for the tooltip
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class OwnerSummary:
    owner: str
    claims: int = 0  # grants received: claims, recoveries, hand-offs to them, preemptions
    completions: int = 0
    recoveries: int = 0  # stale claims this owner took over
    lost: int = 0  # grants ended by expiry, recovery, preemption, supersession or force
    rejected: int = 0
    held_seconds: float = 0.0  # time under a valid lease, clipped to the report window
    tasks: int = 0  # distinct tasks granted to this owner in the window


@dataclass(frozen=True, slots=True)
class Wait:
    """Where agents waited on one task. An owner waits from its first refusal until it is
    granted the task (a wait, counted in ``total`` and ``longest``), or until it is granted
    other work first: then it gave up (``gave_up``), and that time is not counted as waiting.
    A wait still open at the end of the journal counts as given up too."""

    task: str
    refusals: int
    waiters: tuple[str, ...]  # refused owners, sorted
    waits: int  # waits that ended in a grant to the waiter
    total: float
    longest: float
    longest_owner: str
    gave_up: int
    last_refused: float


@dataclass(frozen=True, slots=True)
class Loss:
    """A holder losing its grant: lease expired, taken over, preempted, superseded or
    force-released; ``by`` is who took it or who forced it (None for a plain expiry)."""

    seq: int
    ts: float
    task: str
    kind: str  # the event type
    lost_by: str
    by: str | None
    reason: str | None


@dataclass(slots=True)
class _Open:  # a grant being followed through the journal (mutable: renewals are frequent)
    owner: str
    fence: int | None
    seq: int
    ts: float
    kind: str
    expires: float | None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def iso(ts: float) -> str:
    """UTC ISO-8601 with milliseconds, e.g. 2023-11-14T22:13:20.000Z."""
    text = datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def short_time(ts: float, span: float) -> str:
    """A UTC time as precise as a period of ``span`` seconds needs."""
    fmt = "%H:%M:%S" if span < 3600 else "%m-%d %H:%M" if span >= 86400 else "%H:%M"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime(fmt)


def duration(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m" if h < 48 else f"{h // 24}d {h % 24:02d}h"


def describe(e: Event) -> str:
    """A multi-line plain-text description of an event, for tooltips."""
    ts = _num(e.get("ts"))
    lines = [f"#{e.get('seq')} {e.get('type')}", iso(ts) if ts is not None else "?"]
    if isinstance(e.get("type"), str) and e["type"] in ev.ALL_TYPES:
        lines.append(ev.narrate(e))
    for key in ("task", "owner", "actor", "fence", "prev_owner", "prev_fence", "holder",
                "loser", "winner", "from_phase", "phase", "reason", "rule", "note", "paths",
                "shared_paths", "changed"):
        if (value := e.get(key)) is not None and value not in ("", []):
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _last_ts(evs: list[Event]) -> float:
    return max((t for e in evs if (t := _num(e.get("ts"))) is not None), default=0.0)


def holdings(events: Iterable[Event], *, generated_at: float | None = None) -> list[Holding]:
    """The grants in ``events``, each closed by the event that ended it, by ``start_seq``.
    ``generated_at`` (default: the last event's time) ends the bars still open."""
    evs = events if isinstance(events, list) else list(events)
    now = _last_ts(evs) if generated_at is None else generated_at
    live: dict[str, list[_Open]] = {}
    done: list[Holding] = []

    def close(task: str, fence: int | None, e: Event, kind: str, ts: float) -> None:
        keep = []
        for h in live.get(task, ()):
            if fence is None or h.fence == fence:
                done.append(Holding(
                    task, h.owner, h.fence, h.seq, h.ts, h.kind, _int(e.get("seq")),
                    max(h.ts, ts), kind, _str(e.get("actor")),
                    _str(e.get("reason")) or _str(e.get("rule")), h.expires))
            else:
                keep.append(h)
        live[task] = keep

    for e in evs:
        kind, task = e.get("type"), e.get("task")
        if type(task) is not str or type(kind) is not str:
            continue
        if kind in _RENEWS:  # the common case (heartbeats): update the deadline in place
            f = _int(e.get("fence"))
            expires = _num(e.get("expires_at", _compact_expiry(e)))
            for h in live.get(task, ()):
                if f is None or h.fence == f:
                    h.expires = expires
            continue
        seq, ts = _int(e.get("seq")), _num(e.get("ts"))
        if seq is None or ts is None:
            continue
        if kind in GRANT_TYPES:  # ends the grant it replaces; a new claim replaces none
            if kind != ev.CLAIM_CREATED:  # (a duplicate from a merge runs alongside)
                close(task, _int(e.get("prev_fence")), e, kind, ts)
            live.setdefault(task, []).append(_Open(
                _str(e.get("owner")) or "?", _int(e.get("fence")), seq, ts, kind,
                _num(e.get("expires_at"))))
        elif kind in END_TYPES:
            close(task, _int(e.get("fence")), e, kind, ts)
        elif kind == ev.CLAIM_SUPERSEDED:
            close(task, _int(e.get("loser_fence")), e, kind, ts)
    for task, hs in live.items():
        for h in hs:
            end = max(h.ts, now)
            lapsed = h.expires is not None and h.expires < end
            done.append(Holding(task, h.owner, h.fence, h.seq, h.ts, h.kind, None, end,
                                "lapsed" if lapsed else "held", expires_at=h.expires))
    done.sort(key=lambda h: h.start_seq)
    return done


def markers(events: Iterable[Event], sel: Selection | None = None) -> list[Marker]:
    """A marker per rejection, expiry, recovery, preemption, hand-off, completion, forced
    release, supersession and reopening (in ``sel``, when given)."""
    out: list[Marker] = []
    for e in events:
        kind = e.get("type")
        kind = MARKER_KINDS.get(kind) if type(kind) is str else None  # the common case: None
        if kind is None or (sel is not None and not sel.event(e)):
            continue
        task, seq, ts = _str(e.get("task")), _int(e.get("seq")), _num(e.get("ts"))
        if kind and task is not None and seq is not None and ts is not None:
            owner = _str(e.get("loser")) if kind == "superseded" else _str(e.get("owner"))
            out.append(Marker(kind, seq, ts, task, describe(e), owner))
    return out


def _in(ts: float, since: float | None, until: float | None) -> bool:
    return (since is None or ts >= since) and (until is None or ts <= until)


# The fields of an event that name someone it concerns (for an owner filter).
_PEOPLE = ("owner", "actor", "prev_owner", "holder", "loser", "winner")


@dataclass(frozen=True)
class Selection:
    """Which part of the journal a report shows: tasks, owners and a time window (all
    optional). A holding is in when its task and owner are and it overlaps the window; an
    event when its task is, it names a selected owner, and its time is in the window."""

    tasks: Collection[str] | None = None
    owners: Collection[str] | None = None
    since: float | None = None
    until: float | None = None

    @property
    def whole(self) -> bool:
        return (self.tasks is None and self.owners is None and self.since is None
                and self.until is None)

    def event(self, e: Event) -> bool:
        if self.tasks is not None and e.get("task") not in self.tasks:
            return False
        if self.owners is not None and not any(e.get(k) in self.owners for k in _PEOPLE):
            return False
        ts = _num(e.get("ts"))
        return ts is not None and _in(ts, self.since, self.until)

    def holding(self, h: Holding) -> bool:
        return ((self.tasks is None or h.task in self.tasks)
                and (self.owners is None or h.owner in self.owners)
                and (self.since is None or h.end_ts >= self.since)
                and (self.until is None or h.start_ts <= self.until))

    def describe(self) -> str:
        parts = [f"tasks: {', '.join(sorted(self.tasks))}" if self.tasks is not None else "",
                 f"owners: {', '.join(sorted(self.owners))}" if self.owners is not None else "",
                 f"since {iso(self.since)}" if self.since is not None else "",
                 f"until {iso(self.until)}" if self.until is not None else ""]
        return ", ".join(p for p in parts if p) or "whole journal"


def owner_summary(
    events: Iterable[Event],
    *,
    generated_at: float | None = None,
    tasks: Collection[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    hs: list[Holding] | None = None,
) -> list[OwnerSummary]:
    """Per owner (sorted by name): grants, completions, recoveries, lost grants, rejections and
    time held under a valid lease, counting what falls inside the optional task/time window.
    ``hs``: the journal's holdings, when the caller already has them."""
    evs = events if isinstance(events, list) else list(events)
    acc: dict[str, dict[str, float]] = {}
    touched: dict[str, set[str]] = {}

    def bump(owner: str, key: str, amount: float = 1) -> None:
        row = acc.setdefault(owner, {})
        row[key] = row.get(key, 0) + amount

    for h in holdings(evs, generated_at=generated_at) if hs is None else hs:
        if tasks is not None and h.task not in tasks:
            continue
        if _in(h.start_ts, since, until):
            bump(h.owner, "claims")
            touched.setdefault(h.owner, set()).add(h.task)
        if h.end_seq is not None and h.end_type in LOST_TYPES and _in(h.end_ts, since, until):
            bump(h.owner, "lost")
        lo = h.start_ts if since is None else max(h.start_ts, since)
        hi = h.held_until if until is None else min(h.held_until, until)
        if hi > lo:
            bump(h.owner, "held_seconds", hi - lo)
    keys = {ev.CLAIM_COMPLETED: "completions", ev.CLAIM_RECOVERED: "recoveries",
            ev.CLAIM_REJECTED: "rejected"}
    for e in evs:
        key = keys.get(e.get("type"))  # type: ignore[arg-type]
        if key is None:
            continue
        owner, ts = _str(e.get("owner")), _num(e.get("ts"))
        if owner is not None and ts is not None and _in(ts, since, until) and (
                tasks is None or e.get("task") in tasks):
            bump(owner, key, ev.refusals(e) if key == "rejected" else 1)
    return [OwnerSummary(o, int(r.get("claims", 0)), int(r.get("completions", 0)),
                         int(r.get("recoveries", 0)), int(r.get("lost", 0)),
                         int(r.get("rejected", 0)), r.get("held_seconds", 0.0),
                         len(touched.get(o, ())))
            for o, r in sorted(acc.items())]


def waits(events: Iterable[Event], sel: Selection | None = None) -> list[Wait]:
    """Per task with refusals in the selection: how long refused owners waited for it (see
    ``Wait``). Longest total wait first, then most refusals, then by name."""
    sel = sel or Selection()
    rows: dict[str, dict[str, Any]] = {}
    waiting: dict[str, dict[str, float]] = {}  # owner -> task -> first refusal
    for e in events:
        kind = e.get("type")
        if kind != ev.CLAIM_REJECTED and kind not in GRANT_TYPES:
            continue
        task, ts, owner = e.get("task"), _num(e.get("ts")), _str(e.get("owner")) or "?"
        if type(task) is not str or ts is None or not sel.event(e):
            continue
        if kind == ev.CLAIM_REJECTED:
            row = rows.get(task)
            if row is None:
                row = rows[task] = {"n": 0, "who": set(), "waits": 0, "total": 0.0,
                                    "long": -1.0, "long_owner": "", "gave_up": 0, "last": ts}
            row["n"] += ev.refusals(e)
            row["who"].add(owner)
            row["last"] = ts
            waiting.setdefault(owner, {}).setdefault(task, ts)
            continue
        mine = waiting.pop(owner, {})
        for other, since in mine.items():  # granted: this wait ends, any other is given up
            row = rows[other]
            if other != task:
                row["gave_up"] += 1
                continue
            row["waits"] += 1
            row["total"] += ts - since
            if ts - since > row["long"]:
                row["long"], row["long_owner"] = ts - since, owner
    for mine in waiting.values():
        for task in mine:
            rows[task]["gave_up"] += 1
    out = [Wait(t, r["n"], tuple(sorted(r["who"])), r["waits"], r["total"],
                max(0.0, r["long"]), r["long_owner"], r["gave_up"], r["last"])
           for t, r in rows.items()]
    out.sort(key=lambda w: (-w.total, -w.refusals, w.task))
    return out


def losses(events: Iterable[Event], sel: Selection | None = None) -> list[Loss]:
    """Every lost lease, takeover, preemption, supersession and forced release in the
    selection, in journal order."""
    sel = sel or Selection()
    out: list[Loss] = []
    for e in events:
        kind = e.get("type")
        if kind not in LOST_TYPES or not sel.event(e):
            continue
        seq, ts, task = _int(e.get("seq")), _num(e.get("ts")), _str(e.get("task"))
        if seq is None or ts is None or task is None:
            continue
        if kind in (ev.CLAIM_RECOVERED, ev.CLAIM_PREEMPTED):
            lost_by, by = _str(e.get("prev_owner")), _str(e.get("owner"))
        elif kind == ev.CLAIM_SUPERSEDED:
            lost_by, by = _str(e.get("loser")), _str(e.get("winner"))
        elif kind == ev.CLAIM_RELEASED_FORCED:
            lost_by, by = _str(e.get("owner")), _str(e.get("actor"))
        else:
            lost_by, by = _str(e.get("owner")), None
        out.append(Loss(seq, ts, task, str(kind), lost_by or "?", by,
                        _str(e.get("reason")) or _str(e.get("rule"))))
    return out
