"""The work queue: tasks known before anyone claims them, their readiness, and the order in
which ``claim_next`` hands them out.

A task is *ready* when it is in the queue, not blocked, not completed, has no live claim, and
every task it depends on is completed; *pending* while a dependency is not completed;
*blocked* between ``block`` and ``unblock``. Readiness is never stored: it is derived from the
task records and the claim table, so it cannot drift from them. What is kept is an index of
the ready tasks in hand-out order, built on first use and then updated by ``apply`` in
O(log n) per event, so ``claim_next`` does not scan the registry.

Pure like the rest of ``core``: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from .errors import DependencyCycle, RegistryCorrupt, TaskNotReady, UnknownTask
from .model import COMPLETED, Claim, ClaimTable, _float, _int, _mapping, _opt_str, _str

READY: Final = "ready"
PENDING: Final = "pending"
BLOCKED: Final = "blocked"
HELD: Final = "held"
DONE: Final = "completed"
Readiness = Literal["ready", "pending", "blocked", "held", "completed"]
READINESS_ORDER: Final = (READY, HELD, PENDING, BLOCKED, DONE)

TASK_ADDED: Final = "task_added"
TASK_UPDATED: Final = "task_updated"
TASK_BLOCKED: Final = "task_blocked"
TASK_UNBLOCKED: Final = "task_unblocked"
BECAME_READY: Final = "became_ready"
TASK_EVENTS: Final = frozenset({TASK_ADDED, TASK_UPDATED, TASK_BLOCKED, TASK_UNBLOCKED,
                                BECAME_READY})

Key = tuple[int, float, str]  # hand-out order: priority number, then age, then id


@dataclass(frozen=True, slots=True)
class Task:
    """A task in the work queue, as recorded (readiness is derived, see ``status``)."""

    task: str
    priority: int = 100
    depends_on: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    note: str | None = None
    added_at: float = 0.0
    added_by: str = ""
    blocked: str | None = None  # the reason, while blocked
    blocked_by: str | None = None
    seq: int = 0  # last journal seq that changed this record
    # The identity of the event that last changed this record (the hash it was first sealed
    # with) and its time: what a merge of two registries compares (see core/merge.py).
    eid: str = ""
    changed_at: float = 0.0

    @property
    def key(self) -> Key:
        return (self.priority, self.added_at, self.task)

    def same_spec(self, other: Task) -> bool:
        """Whether ``add`` with ``other``'s input would change nothing."""
        return (self.priority, self.depends_on, self.labels, self.note) == (
            other.priority, other.depends_on, other.labels, other.note)

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """The persisted form. ``compact`` (the snapshot's) leaves out members at the defaults
        from_dict supplies, and ``changed_at`` when it is ``added_at``: at 10,000 queued
        tasks, a third of the bytes a checkpoint writes and a cold start parses."""
        data: dict[str, Any] = {
            "task": self.task,
            "priority": self.priority,
            "depends_on": list(self.depends_on),
            "labels": list(self.labels),
            "note": self.note,
            "added_at": self.added_at,
            "added_by": self.added_by,
            "blocked": self.blocked,
            "blocked_by": self.blocked_by,
            "seq": self.seq,
            "eid": self.eid,
            "changed_at": self.changed_at,
        }
        if compact:
            for key, default in _TASK_DEFAULTS:
                if data[key] == default and type(data[key]) is type(default):
                    del data[key]
            if data["changed_at"] == self.added_at:
                del data["changed_at"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Rebuild a task from its persisted form; raises KeyError/TypeError/ValueError."""
        return cls(
            task=_str(data["task"]),
            priority=_int(data.get("priority", 100)),
            depends_on=_names(data.get("depends_on") or ()),
            labels=_names(data.get("labels") or ()),
            note=_opt_str(data.get("note")),
            added_at=_float(data.get("added_at", 0.0)),
            added_by=_str(data.get("added_by") or ""),
            blocked=_opt_str(data.get("blocked")),
            blocked_by=_opt_str(data.get("blocked_by")),
            seq=_int(data.get("seq", 0)),
            eid=_str(data.get("eid") or ""),
            changed_at=_float(data.get("changed_at", data.get("added_at", 0.0))),
        )


# (member, default) pairs that Task.to_dict(compact=True) leaves out; from_dict supplies them.
_TASK_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("priority", 100), ("depends_on", []), ("labels", []), ("note", None), ("added_by", ""),
    ("blocked", None), ("blocked_by", None), ("eid", ""),
)


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """A task with its readiness now: what ``fleetclaims ready`` and ``list --tasks`` show."""

    task: Task
    status: Readiness
    waits_for: tuple[str, ...] = ()  # unmet dependencies (pending)
    holder: str | None = None  # owner of the live claim (held)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError("expected a list of names")
    return tuple(_str(v) for v in value)


def completed(claim: Claim | None) -> bool:
    return claim is not None and claim.state == COMPLETED


def status(task: Task, claims: ClaimTable) -> TaskStatus:
    """The readiness of ``task`` given the claim table."""
    claim = claims.get(task.task)
    if claim is not None and claim.state == COMPLETED:
        return TaskStatus(task, DONE)
    if claim is not None and claim.live:
        return TaskStatus(task, HELD, holder=claim.owner)
    if task.blocked is not None:
        return TaskStatus(task, BLOCKED)
    waits = tuple(d for d in task.depends_on if not completed(claims.get(d)))
    if waits:
        return TaskStatus(task, PENDING, waits)
    return TaskStatus(task, READY)


def not_ready(task: Task | None, claims: ClaimTable) -> TaskNotReady | None:
    """Why a claim of ``task`` must be refused (blocked, or a dependency not completed), or
    None. A task outside the queue is never refused here."""
    if task is None:
        return None
    if task.blocked is not None:
        return TaskNotReady(task.task, status=BLOCKED, waits_for=[], reason=task.blocked)
    waits = [d for d in task.depends_on if not completed(claims.get(d))]
    if waits:
        return TaskNotReady(task.task, status=PENDING, waits_for=waits)
    return None


def _eligible(task: Task, claims: ClaimTable, done: frozenset[str] = frozenset()) -> bool:
    """Open, not blocked, every dependency completed (whether or not anyone holds it)."""
    return (
        task.blocked is None
        and not completed(claims.get(task.task))
        and all(d in done or completed(claims.get(d)) for d in task.depends_on)
    )


class QueueIndex:
    """Ready tasks and held-but-eligible tasks (candidates for ``take_stale``), each kept
    sorted in hand-out order, plus the reverse dependency edges."""

    __slots__ = ("_where", "dependants", "held", "ready")

    def __init__(self) -> None:
        self.dependants: dict[str, set[str]] = {}
        self.ready: list[Key] = []
        self.held: list[Key] = []
        self._where: dict[str, tuple[list[Key], Key]] = {}

    def link(self, task: str, deps: Iterable[str]) -> None:
        for dep in deps:
            self.dependants.setdefault(dep, set()).add(task)

    def unlink(self, task: str, deps: Iterable[str]) -> None:
        for dep in deps:
            users = self.dependants.get(dep)
            if users is not None:
                users.discard(task)
                if not users:
                    del self.dependants[dep]

    def place(self, task: Task, claims: ClaimTable) -> None:
        """Put ``task`` in the list its current state calls for (or none)."""
        found = self._where.pop(task.task, None)
        if found is not None:
            lst, key = found
            i = bisect_left(lst, key)
            if i < len(lst) and lst[i] == key:
                del lst[i]
        if not _eligible(task, claims):
            return
        claim = claims.get(task.task)
        target = self.held if claim is not None and claim.live else self.ready
        key = task.key
        insort(target, key)
        self._where[task.task] = (target, key)

    def candidates(self, take_stale: bool) -> Iterator[tuple[Key, bool]]:
        """(key, held) in hand-out order: the ready tasks, merged with the held ones when
        stale claims may be taken over."""
        if not take_stale:
            return ((key, False) for key in self.ready)
        return heapq.merge(((k, False) for k in self.ready), ((k, True) for k in self.held))


class TaskTable:
    """task -> Task. Persisted entries stay raw dicts until first looked at (a cold
    ``fleetclaims claim`` must not convert the whole queue) and are kept after conversion
    until the task changes, so a checkpoint re-encodes only what changed."""

    __slots__ = ("_extra", "_index", "_raw", "_tasks")

    def __init__(self, raw: Mapping[str, Any] | None = None) -> None:
        self._tasks: dict[str, Task] = {}  # converted or changed records
        self._raw: dict[str, Any] = dict(raw) if raw else {}  # persisted, unchanged since
        self._extra = 0  # tasks in _tasks but not in _raw (changed or new)
        self._index: QueueIndex | None = None

    def get(self, task: str) -> Task | None:
        found = self._tasks.get(task)
        if found is None and task in self._raw:
            try:
                found = Task.from_dict(_mapping(self._raw[task]))
            except (KeyError, TypeError, ValueError) as exc:
                raise RegistryCorrupt(
                    "work queue", f"the record of task {task!r} is malformed ({exc})",
                    hint="Run `fleetclaims doctor --fix`: it rebuilds the registry from the "
                    "journal.",
                ) from None
            self._tasks[task] = found
        return found

    def put(self, record: Task, claims: ClaimTable) -> None:
        """Store ``record``; keeps the index (when built) in step."""
        name = record.task
        old = self.get(name)
        if old is None or name in self._raw:
            self._extra += 1  # from now on only in _tasks
        self._raw.pop(name, None)
        self._tasks[name] = record
        if self._index is not None:
            if old is not None:
                self._index.unlink(name, old.depends_on)
            self._index.link(name, record.depends_on)
            self._index.place(record, claims)

    def __contains__(self, task: object) -> bool:
        return task in self._tasks or task in self._raw

    def __len__(self) -> int:
        return len(self._raw) + self._extra

    def names(self) -> list[str]:
        return sorted({*self._raw, *self._tasks})

    def values(self) -> Iterator[Task]:
        for name in self.names():
            found = self.get(name)
            if found is not None:
                yield found

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        yield from self._raw.items()
        for name, record in self._tasks.items():
            if name not in self._raw:
                yield name, record.to_dict(compact=True)

    def copy(self) -> TaskTable:
        """A detached in-memory copy (of a store's table too, as ClaimTable.copy)."""
        clone = TaskTable()
        clone._tasks = dict(self._tasks)
        clone._raw = dict(self._raw)
        clone._extra = self._extra
        return clone  # the index is rebuilt on demand: it holds mutable lists

    # --- the index ---------------------------------------------------------------------------

    @property
    def indexed(self) -> bool:
        return self._index is not None

    def drop_index(self) -> None:
        self._index = None

    def index(self, claims: ClaimTable) -> QueueIndex:
        if self._index is None:
            index = QueueIndex()
            records = list(self.values())
            for record in records:
                index.link(record.task, record.depends_on)
            for record in records:
                index.place(record, claims)
            self._index = index
        return self._index

    def candidates(self, claims: ClaimTable, take_stale: bool,
                   labels: frozenset[str] = frozenset()) -> Iterator[tuple[Key, bool]]:
        """(key, held) of the tasks ``claim_next`` may hand out, in hand-out order: the ready
        ones, merged with the held ones when stale claims may be taken over. ``labels`` is a
        hint (a store may skip tasks without them); the caller still checks every candidate."""
        return self.index(claims).candidates(take_stale)

    def ready_keys(self, claims: ClaimTable) -> list[Key]:
        """The ready tasks in hand-out order: a copy of the index, or (when it is not built)
        worked out without building it, so a reader outside the store's lock never touches
        an index that a writer maintains."""
        if self._index is not None:
            return list(self._index.ready)
        keys = []
        for record in self.values():
            claim = claims.get(record.task)
            if _eligible(record, claims) and not (claim is not None and claim.live):
                keys.append(record.key)
        return sorted(keys)

    def dependants(self, task: str, claims: ClaimTable) -> list[str]:
        """The queued tasks that depend on ``task``."""
        if not self._tasks and not self._raw:
            return []  # no queue: completing a task must not build anything
        return sorted(self.index(claims).dependants.get(task, ()))

    def changed(self, task: str, claims: ClaimTable) -> None:
        """A claim event touched ``task``: re-place it and the tasks that depend on it."""
        index = self._index
        if index is None:
            return
        record = self.get(task)
        if record is not None:
            index.place(record, claims)
        for user in index.dependants.get(task, ()):
            found = self.get(user)
            if found is not None:
                index.place(found, claims)


# --- decisions -----------------------------------------------------------------------------
# Each returns (events, result); rules.py wraps them into Decisions.


def find_cycle(tasks: TaskTable, task: str, deps: Iterable[str]) -> list[str] | None:
    """A dependency path from ``task`` back to itself if it depended on ``deps``, else None."""
    parent: dict[str, str] = {}  # node -> the task that depends on it (how we reached it)
    stack = []
    for dep in deps:
        if dep == task:
            return [task, task]
        if dep not in parent:
            parent[dep] = task
            stack.append(dep)
    while stack:
        node = stack.pop()
        record = tasks.get(node)
        if record is None:
            continue
        for dep in record.depends_on:
            if dep == task:
                chain = [node]
                while parent[chain[-1]] != task:
                    chain.append(parent[chain[-1]])
                return [task, *reversed(chain), task]
            if dep not in parent:
                parent[dep] = node
                stack.append(dep)
    return None


def add_events(
    tasks: TaskTable, spec: Task, actor: str
) -> tuple[tuple[dict[str, Any], ...], Task | None]:
    """``add``: a task_added event, a task_updated event naming what changed, or nothing for
    an identical repeat (then the current record is returned)."""
    current = tasks.get(spec.task)
    if current is not None and current.same_spec(spec):
        return (), current
    cycle = find_cycle(tasks, spec.task, spec.depends_on)
    if cycle is not None:
        raise DependencyCycle(spec.task, cycle)
    fields = {
        "task": spec.task,
        "actor": actor,
        "priority": spec.priority,
        "depends_on": list(spec.depends_on),
        "labels": list(spec.labels),
        "note": spec.note,
    }
    if current is None:
        return ({"type": TASK_ADDED, **fields},), None
    changed = [name for name in ("priority", "depends_on", "labels", "note")
               if getattr(current, name) != getattr(spec, name)]
    return ({"type": TASK_UPDATED, **fields, "changed": changed},), None


def require(tasks: TaskTable, task: str) -> Task:
    found = tasks.get(task)
    if found is None:
        raise UnknownTask(task)
    return found


def became_ready_after(
    tasks: TaskTable, claims: ClaimTable, done: str, actor: str
) -> list[dict[str, Any]]:
    """``became_ready`` for every dependant of ``done`` whose last unmet dependency it was."""
    out = []
    finished = frozenset({done})
    for user in tasks.dependants(done, claims):
        record = tasks.get(user)
        if record is None:
            continue
        claim = claims.get(user)
        if claim is not None and claim.live:
            continue
        if _eligible(record, claims, finished):
            out.append({"type": BECAME_READY, "task": user, "actor": actor, "after": done})
    return out


def apply_task_event(tasks: TaskTable, claims: ClaimTable, kind: str, event: dict[str, Any],
                     seq: int, ts: float) -> None:
    """Apply one work-queue event (see events.apply)."""
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


def queue_times(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per queued task, from the audit log: when it was added, became ready, was first
    claimed and was completed. Ready time is the add time when nothing held it back."""
    out: dict[str, dict[str, float | None]] = {}
    deps: dict[str, bool] = {}
    for e in events:
        task, kind = e.get("task"), e.get("type")
        if not isinstance(task, str):
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        row = out.get(task)
        if kind == TASK_ADDED:
            out[task] = {"added": float(ts), "ready": None, "claimed": None, "completed": None}
            deps[task] = bool(e.get("depends_on"))
            if not deps[task]:
                out[task]["ready"] = float(ts)
        elif row is None:
            continue
        elif kind == BECAME_READY and row["claimed"] is None:
            row["ready"] = float(ts)
        elif kind == TASK_BLOCKED and row["claimed"] is None:
            row["ready"] = None
        elif kind in ("claim_created", "claim_recovered") and row["claimed"] is None:
            row["claimed"] = float(ts)
            if row["ready"] is None:
                row["ready"] = float(ts)
        elif kind == "claim_completed":
            row["completed"] = float(ts)
    return out
