"""``fleetclaims explain TASK``: the story of a task told from the audit log alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import events as ev
from .durations import format_duration, iso


@dataclass(frozen=True)
class Step:
    seq: int
    ts: float
    type: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts": self.ts, "type": self.type, "text": self.text}


@dataclass(frozen=True)
class Explanation:
    task: str
    holder: str | None
    fence: int | None
    state: str
    why: str
    steps: tuple[Step, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "holder": self.holder, "fence": self.fence,
                "state": self.state, "why": self.why, "steps": [s.to_dict() for s in self.steps]}


def _ttl(event: dict[str, Any]) -> str:
    ttl = event.get("ttl")
    if ttl is None:
        park = event.get("park")  # the liveness source of a park (older events have none)
        return f"parked; ends with {park}" if park else "parked, no expiry"
    return f"lease {format_duration(float(ttl))}"


def describe(e: dict[str, Any]) -> str:
    """One sentence for one event."""
    kind = e.get("type")
    owner, fence = e.get("owner"), e.get("fence")
    prefix = "[imported] " if e.get("imported") else ""
    text: str
    if kind == ev.CLAIM_CREATED:
        text = f"{owner} claimed it (fence {fence}, {_ttl(e)}, priority {e.get('priority')})"
        if e.get("reason"):
            text += f"; reason: {e['reason']}"
    elif kind == ev.CLAIM_REJECTED and str(e.get("reason")).startswith("paths overlap"):
        text = f"{owner} was refused: {e.get('reason')} (fence {fence})"  # core/reserve.py
    elif kind in (ev.PATHS_RESERVED, ev.PATHS_RELEASED):
        verb = "reserved" if kind == ev.PATHS_RESERVED else "released the reservation of"
        text = (f"{owner} {verb} {', '.join(map(str, e.get('changed') or []))} (fence "
                f"{fence}); now {_paths(e) or 'none'}")
    elif kind == ev.CLAIM_REJECTED and e.get("holder") is None:
        text = f"{owner} was refused: {e.get('reason')}"  # a queued task not ready yet
    elif kind == ev.CLAIM_REJECTED:
        text = (f"{owner} was refused: held by {e.get('holder')} (fence {fence}); "
                f"{e.get('reason')}")
    elif kind == ev.LEASE_RENEWED and owner is None:  # (compact, its grant not at hand)
        text = f"the holder renewed the lease ({_ttl(e)})"
    elif kind == ev.LEASE_RENEWED:
        text = f"{owner} renewed the lease (fence {fence}, {_ttl(e)})"
    elif kind == ev.CLAIM_RELEASED:
        text = f"{owner} released it (fence {fence})" + (
            " after its lease had expired" if e.get("expired") else "")
    elif kind == ev.CLAIM_RELEASED_FORCED:
        text = f"{e.get('actor')} force-released {owner}'s claim (fence {fence}): {e.get('reason')}"
    elif kind == ev.CLAIM_COMPLETED:
        text = f"{owner} completed it (fence {fence})"
    elif kind == ev.CLAIM_REOPENED:
        text = f"{e.get('actor')} reopened it: {e.get('reason')}"
    elif kind == ev.LEASE_EXPIRED:
        text = f"{owner}'s claim (fence {fence}) was marked stale: {e.get('reason')}"
    elif kind == ev.CLAIM_RECOVERED:
        text = (f"{owner} took it over from {e.get('prev_owner')} (fence {e.get('prev_fence')} "
                f"-> {fence}) via {e.get('via', 'recover')}: {e.get('reason')}")
    elif kind == ev.CLAIM_PREEMPTED:
        text = (f"{owner} preempted {e.get('prev_owner')} (fence {e.get('prev_fence')} -> "
                f"{fence}); rule: {e.get('rule')}")
    elif kind == ev.PHASE_CHANGED:
        text = f"{owner} moved it from {e.get('from_phase')} to {e.get('phase')} ({_ttl(e)})"
    elif kind == ev.CLAIM_HANDED_OFF:
        text = (f"{e.get('prev_owner')} handed it off to {owner} "
                f"(fence {e.get('prev_fence')} -> {fence})")
    elif kind == ev.CLAIM_SUPERSEDED:
        text = (f"merge: {e.get('loser')}'s claim (fence {e.get('loser_fence')}) was superseded "
                f"by {e.get('winner')}'s (fence {fence}); rule: {e.get('rule')}")
    elif kind == ev.REGISTRIES_MERGED:
        text = f"registry merged from {e.get('source')}"
    elif kind in (ev.TASK_ADDED, ev.TASK_UPDATED):
        deps = e.get("depends_on") or []
        text = (f"{e.get('actor')} {'added it to' if kind == ev.TASK_ADDED else 'updated it in'}"
                f" the queue (priority {e.get('priority')}"
                + (f", after {', '.join(map(str, deps))}" if deps else "")
                + (f", labels {', '.join(map(str, e.get('labels') or []))}"
                   if e.get("labels") else "")
                + (f"; changed {', '.join(map(str, e.get('changed') or []))}"
                   if kind == ev.TASK_UPDATED else "") + ")")
    elif kind == ev.TASK_BLOCKED:
        text = f"{e.get('actor')} blocked it: {e.get('reason')}"
    elif kind == ev.TASK_UNBLOCKED:
        text = f"{e.get('actor')} unblocked it" + (
            f": {e.get('reason')}" if e.get("reason") else "")
    elif kind == ev.BECAME_READY:
        after = e.get("after")
        text = "it became ready" + (" (unblocked)" if after == "unblock"
                                     else f" ({after} was completed)" if after else "")
    else:  # the schema's one-line narration (its type name for an unknown type)
        text = ev.narrate(e)
    if kind in ev.GRANTS and (e.get("paths") or e.get("shared_paths")):
        text += f"; reserving {_paths(e)}"
    return prefix + text


def _paths(e: dict[str, Any]) -> str:
    """An event's reservations: exclusive patterns, then shared ones marked so."""
    return ", ".join([*map(str, e.get("paths") or []),
                      *(f"{p} (shared)" for p in e.get("shared_paths") or [])])


def explain(task: str, events: list[dict[str, Any]], archived: int = 0) -> Explanation:
    """Who holds ``task`` and why, from the events (in seq order) that mention it; ``archived``:
    the events up to that seq were archived (`audit archive`), so are not among them."""
    steps: list[Step] = []
    holder: str | None = None
    fence: int | None = None
    state = "never claimed"
    why = "no event names this task"
    queued = False
    holders: dict[str, tuple[Any, Any]] = {}  # (compact renewals name no holder: ev.fill_renewal)
    for e in events:
        e = ev.fill_renewal(e, holders)
        mentions = e.get("task") == task or (
            e.get("type") == ev.REGISTRIES_MERGED
            and any(isinstance(c, dict) and c.get("task") == task for c in e.get("claims") or [])
        )
        if not mentions:
            continue
        kind = e.get("type")
        steps.append(Step(int(e["seq"]), float(e.get("ts", 0.0)), str(kind), describe(e)))
        if e.get("imported"):
            continue
        when = iso(e.get("ts"))
        if kind == ev.TASK_ADDED and not queued:
            queued = True
            if state == "never claimed":
                why = f"it is in the work queue ({describe(e)} at {when}) but nobody claimed it"
        if kind in ev.GRANTS:
            holder, fence, state = e.get("owner"), e.get("fence"), "held"
            why = f"{describe(e)} at {when} (seq {e['seq']})"
        elif kind in (ev.CLAIM_RELEASED, ev.CLAIM_RELEASED_FORCED, ev.CLAIM_REOPENED):
            holder, fence, state = None, None, "free"
            why = f"{describe(e)} at {when} (seq {e['seq']})"
        elif kind == ev.CLAIM_COMPLETED:
            state = "completed"
            why = f"{describe(e)} at {when} (seq {e['seq']})"
        elif kind == ev.LEASE_EXPIRED:
            state = "stale"
            why = f"{describe(e)} at {when} (seq {e['seq']})"
        elif kind == ev.REGISTRIES_MERGED:
            for c in e.get("claims") or []:
                if isinstance(c, dict) and c.get("task") == task:
                    holder, fence = c.get("owner"), c.get("fence")
                    state = {"active": "held", "expired": "stale"}.get(
                        str(c.get("state")), str(c.get("state")))
                    why = f"merge from {e.get('source')} at {when} settled it (seq {e['seq']})"
    if archived and not steps:
        state = "archived"  # (not "never claimed": what it was is in the archive)
        why = (f"no event after seq {archived} names this task: events 1..{archived} were "
               "archived (`fleetclaims audit verify --with DIR` reads them)")
    elif archived and events and events[0].get("seq", 0) > archived:
        why += f" (events 1..{archived} were archived: earlier ones are not shown)"
    return Explanation(task, holder, fence, state, why, tuple(steps))
