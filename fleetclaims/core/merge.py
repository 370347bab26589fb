"""Merging another registry's history into this one (offline laptops, shared folders, git).

Journals are joined by event identity (the hash an event was first sealed with): events
of the other registry we have not seen are appended as imported history. Claims are joined per
task: when one side has already seen the other's latest event for a task, it is newer and wins;
otherwise the two grants are concurrent and the resolver settles them, the same way whichever
side merges into which. Losers that still believe they hold the task are marked superseded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import events as ev
from .merge_paths import PathConflict, settle, stale_against
from .model import COMPLETED, RELEASED, RETIRED_KEPT, Claim, Now, Retired, Task
from .queue import find_cycle
from .resolver import compare
from .state import State

_SKIP_ON_IMPORT = ("seq", "prev", "hash", "ohash")


@dataclass(frozen=True)
class Conflict:
    task: str
    winner: str
    winner_fence: int
    loser: str
    loser_fence: int
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "winner": self.winner, "winner_fence": self.winner_fence,
                "loser": self.loser, "loser_fence": self.loser_fence, "rule": self.rule}


@dataclass(frozen=True)
class MergePlan:
    events: tuple[dict[str, Any], ...]
    imported: int
    changed: tuple[str, ...]
    conflicts: tuple[Conflict, ...]
    # The work queue: records taken from the other registry, tasks both sides changed since
    # they parted (the later change was kept), and dependency loops the merge closed.
    tasks_changed: tuple[str, ...] = ()
    task_conflicts: tuple[str, ...] = ()
    cycles: tuple[tuple[str, ...], ...] = ()
    # Overlapping path reservations granted apart: the loser's overlapping patterns dropped.
    path_conflicts: tuple[PathConflict, ...] = ()


def ids_of(events: list[dict[str, Any]]) -> set[str]:
    """The identities of ``events``, and of the claim records a merge among them re-granted
    (their eid names no event: see _regranted), so a later merge knows it has seen them."""
    ids = {ev.event_id(e) for e in events}
    for e in events:
        if e.get("type") == ev.REGISTRIES_MERGED:
            for record in e.get("claims") or ():
                eid = record.get("eid") if isinstance(record, dict) else None
                if isinstance(eid, str) and _REGRANT in eid:
                    ids.add(eid)
    return ids


_REGRANT = "/regranted-at-fence-"


def _regranted(win: Claim, lose: Claim, floor: int) -> int | None:
    """The fence a live concurrent winner is re-granted at (one above ``floor``), or None:
    fences never go back, so a winner whose fence is not above every fence the other side
    handed out for the task (a holder that renewed there while it was released and granted
    anew here; two sides granting the same fence) takes a new one."""
    top = max([lose.fence, *(r.fence for r in lose.retired)])
    if not win.live or win.fence > top or (
            win.fence == top and lose.token_hash == win.token_hash):
        return None
    return floor + 1




def _grant_order(claim: Claim) -> tuple[int, int, float, float, bytes]:
    """Which of two records of one grant is the later one (a total order of recorded fields):
    one that ended it (a grant's life runs one way: held, then released, completed or expired),
    then the higher fence, the later renewal and expiry, the event id."""
    return (0 if claim.live else 1, claim.fence, claim.renewed_at or 0.0,
            claim.expires_at or 0.0, claim.eid.encode())


def _rank(claim: Claim) -> int:
    # Finished work beats a holder, a holder beats a released claim.
    return 0 if claim.state == COMPLETED else (2 if claim.state == RELEASED else 1)


def _union_retired(*lists: tuple[Retired, ...]) -> tuple[Retired, ...]:
    seen: dict[str, Retired] = {}
    for retired in lists:
        for item in retired:
            seen.setdefault(item.token_hash, item)
    ordered = sorted(seen.values(), key=lambda r: (r.fence, r.token_hash.encode()))
    return tuple(ordered[-RETIRED_KEPT:])


def _imported(their_events: list[dict[str, Any]], our_ids: set[str]) -> list[dict[str, Any]]:
    """Their events that we lack, marked imported (kept for the record; their effect arrives
    in the registries_merged event), with their first seal as their identity."""
    out = []
    for event in their_events:
        eid = ev.event_id(event)
        if eid in our_ids:
            continue
        fields = {k: v for k, v in event.items() if k not in _SKIP_ON_IMPORT}
        fields["ots"] = fields.pop("ts", None)
        fields.update(imported=True, ohash=eid)
        out.append(fields)
    return out


def plan_merge(
    ours: State,
    our_events: list[dict[str, Any]],
    theirs: State,
    their_events: list[dict[str, Any]],
    now: Now,
    *,
    source: str,
    actor: str,
) -> MergePlan:
    """The events that merge ``theirs`` into ``ours`` (empty when there is nothing new)."""
    our_ids = ids_of(our_events)
    their_ids = ids_of(their_events)
    new_events = _imported(their_events, our_ids)

    merged: dict[str, Claim] = {}
    superseded: list[dict[str, Any]] = []
    conflicts: list[Conflict] = []
    changed: list[str] = []
    floor = max(ours.fence, theirs.fence)  # (the same whichever side merges into which)
    for task in sorted(set(ours.claims.tasks()) | set(theirs.claims.tasks())):
        a, b = ours.claims.get(task), theirs.claims.get(task)
        if b is None or (a is not None and (a.eid == b.eid or b.eid in our_ids)):
            continue  # nothing new from them for this task
        if a is None or a.eid in their_ids:
            changed.append(task)
            merged[task] = replace(b, retired=_union_retired(
                b.retired, () if a is None else a.retired))
            continue
        # Concurrent histories: settle by rank, then by the resolver order.
        same = False
        if a.token_hash and a.token_hash == b.token_hash:
            # One grant seen through two histories (one side ended it, the other re-granted it
            # a fence in a merge; or both sides merged the same pair): no conflict, its holder
            # is not superseded by itself, and a grant its holder ended stays ended (a release
            # beat by "held before released" brought the claim back on every clone).
            same = True
            win, lose = (a, b) if _grant_order(a) >= _grant_order(b) else (b, a)
            if lose.fence > win.fence:  # (fences never go back)
                win = replace(win, fence=lose.fence)
            rule = "same grant"
        elif _rank(a) != _rank(b):
            win, lose = (a, b) if _rank(a) < _rank(b) else (b, a)
            rule = "completed before held before released"
        else:
            order, rule = compare(a, stale_against(a, b), b, stale_against(b, a))
            win, lose = (a, b) if order <= 0 else (b, a)
        fence = _regranted(win, lose, floor)
        if fence is not None:  # (its token stays: renew returns the new fence)
            floor = fence
            win = replace(win, fence=fence, eid=f"{win.eid}{_REGRANT}{fence}")
        extra: tuple[Retired, ...] = ()
        if lose.live and not same:
            conflicts.append(Conflict(task, win.owner, win.fence, lose.owner, lose.fence, rule))
            extra = (Retired(lose.token_hash, lose.fence, lose.owner, "superseded", by=win.owner,
                             rule=rule, at=now.wall, expired_at=lose.expires_at),)
            superseded.append({
                "type": ev.CLAIM_SUPERSEDED, "task": task, "actor": actor, "owner": win.owner,
                "fence": win.fence, "winner": win.owner, "loser": lose.owner,
                "loser_fence": lose.fence, "loser_token_hash": lose.token_hash, "rule": rule,
            })
        record = replace(win, retired=_union_retired(win.retired, lose.retired, extra))
        if record != a:
            changed.append(task)
            merged[task] = record

    path_conflicts = _settle_paths(ours, merged, changed) if merged else []
    tasks, task_conflicts = _merge_queue(ours, theirs, our_ids, their_ids)
    cycles = _cycles_closed(ours, tasks)
    # Another registry's merge bookkeeping alone is no reason to write: without this rule two
    # registries merging back and forth would record each other's merge events forever.
    if not merged and not tasks and all(
            e.get("type") == ev.REGISTRIES_MERGED for e in new_events):
        return MergePlan((), 0, (), ())
    summary = {
        "type": ev.REGISTRIES_MERGED,
        "actor": actor,
        "source": source,
        "source_origin": theirs.origin,
        "imported_events": len(new_events),
        "claims": [claim.to_dict() for claim in merged.values()],
        "fence_floor": floor,
        "conflicts": [c.to_dict() for c in conflicts],
    }
    if path_conflicts:  # (absent when none: the event keeps its earlier shape)
        summary["path_conflicts"] = [c.to_dict() for c in path_conflicts]
    if tasks:  # (absent when the queue is untouched: the event keeps its earlier shape)
        summary.update(tasks=[t.to_dict() for t in tasks], task_conflicts=task_conflicts,
                       queue_cycles=[list(c) for c in cycles])
    return MergePlan(
        (*new_events, summary, *superseded), len(new_events), tuple(changed), tuple(conflicts),
        tuple(t.task for t in tasks), tuple(task_conflicts), tuple(cycles),
        tuple(path_conflicts),
    )


def _settle_paths(ours: State, merged: dict[str, Claim], changed: list[str]) -> list[PathConflict]:
    """Overlapping reservations granted apart (merge_paths): a loser's record, with the
    patterns it lost, joins the merged records."""
    view: dict[str, Claim] = {}
    for task, data in ours.claims.raw_items():
        if isinstance(data, dict) and (data.get("paths") or data.get("shared_paths")):
            claim = ours.claims.get(task)
            if claim is not None:
                view[task] = claim
    view.update(merged)
    found = settle(view)
    for conflict in found:
        task = conflict.loser_task
        merged[task] = view[task]
        if task not in changed:
            changed.append(task)
    return found


def _task_content(task: Task) -> str:
    """A record's content without its local seq: equal records are not a conflict, and it
    breaks ties between concurrent changes the same way on both sides."""
    data = task.to_dict()
    del data["seq"]
    return repr(sorted(data.items()))


def _merge_queue(ours: State, theirs: State, our_ids: set[str],
                 their_ids: set[str]) -> tuple[list[Task], list[str]]:
    """The other registry's work-queue records that this one should take, and the tasks both
    sides changed since they parted.

    As for claims: when one side has already seen the event that last changed the other's
    record, its own record is newer and wins. Otherwise both changed the task concurrently and
    the later change (its time, then its event identity, then its content) is kept whole, the
    same whichever side merges into which."""
    taken: list[Task] = []
    conflicts: list[str] = []
    for name in sorted(set(ours.tasks.names()) | set(theirs.tasks.names())):
        a, b = ours.tasks.get(name), theirs.tasks.get(name)
        if b is None or (a is not None and (b.eid in our_ids or
                                            _task_content(a) == _task_content(b))):
            continue  # nothing new from them for this task
        if a is None or a.eid in their_ids:
            taken.append(b)
            continue
        conflicts.append(name)
        if (b.changed_at, b.eid, _task_content(b)) > (a.changed_at, a.eid, _task_content(a)):
            taken.append(b)
    return taken, conflicts


def _cycles_closed(ours: State, taken: list[Task]) -> list[tuple[str, ...]]:
    """Dependency loops in the merged queue through a record taken from the other side (each
    side refused loops of its own, but two can close one between them: the tasks in it stay
    pending until someone changes their dependencies)."""
    if not taken:
        return []
    merged = ours.tasks.copy()
    for record in taken:
        merged.put(record, ours.claims)
    found: dict[frozenset[str], tuple[str, ...]] = {}
    for record in taken:
        loop = find_cycle(merged, record.task, record.depends_on)
        if loop is not None and frozenset(loop) not in found:
            found[frozenset(loop)] = tuple(loop)
    return [found[k] for k in sorted(found, key=sorted)]
