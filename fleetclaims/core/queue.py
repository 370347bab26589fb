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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import DependencyCycle, TaskNotReady, UnknownTask, ValidationError
from .events import (
    BECAME_READY,
    CLAIM_COMPLETED,
    CLAIM_CREATED,
    CLAIM_RECOVERED,
    TASK_ADDED,
    TASK_BLOCKED,
    TASK_EVENTS,
    TASK_UNBLOCKED,
    TASK_UPDATED,
)
from .model import (
    BLOCKED,
    COMPLETED,
    DONE,
    HELD,
    PENDING,
    READINESS_ORDER,
    READY,
    Key,
    Readiness,
    Task,
    TaskStatus,
)
from .ports import ClaimView, TaskView
from .state import QueueIndex, TaskTable, completed, eligible
from .validate import NAMES_MAX


def status(task: Task, claims: ClaimView) -> TaskStatus:
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


def not_ready(task: Task | None, claims: ClaimView) -> TaskNotReady | None:
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


# --- decisions -----------------------------------------------------------------------------
# Each returns (events, result); rules.py wraps them into Decisions.


class Lookup(Protocol):
    """What the add decisions read of the task table: one record by name."""

    def get(self, task: str) -> Task | None: ...


def find_cycle(tasks: Lookup, task: str, deps: Iterable[str]) -> list[str] | None:
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


@dataclass(frozen=True)
class TaskPatch:
    """What one ``add`` gives for a task: each field is None when not given. A new task takes
    the defaults for the fields not given; a queued one keeps its own (an update changes
    only what was given). An empty text (title, description, note) clears that field; empty
    ``labels`` or ``depends_on`` clear those sets."""

    task: str
    priority: int | None = None
    depends_on: tuple[str, ...] | None = None
    labels: tuple[str, ...] | None = None
    note: str | None = None
    title: str | None = None
    description: str | None = None

    def over(self, current: Task | None) -> Task:
        """The task as this add leaves ``current`` (None: not queued yet). Built field by
        field: ``dataclasses.replace`` costs ~8 us of introspection, on every ``add`` of a
        work queue (tests/test_queue.py checks every field against it)."""
        base = current if current is not None else Task(self.task)
        return Task(
            task=base.task,
            priority=base.priority if self.priority is None else self.priority,
            depends_on=base.depends_on if self.depends_on is None else self.depends_on,
            labels=base.labels if self.labels is None else self.labels,
            note=_text(self.note, base.note),
            title=_text(self.title, base.title),
            description=_text(self.description, base.description),
            added_at=base.added_at,
            added_by=base.added_by,
            blocked=base.blocked,
            blocked_by=base.blocked_by,
            seq=base.seq,
            eid=base.eid,
            changed_at=base.changed_at,
        )


_PATCHED = ("priority", "depends_on", "labels", "note", "title", "description")


def _text(given: str | None, current: str | None) -> str | None:
    """A text field of an add: not given keeps it, an empty text clears it."""
    if given is None:
        return current
    return given or None


def depend_patch(current: Task, on: Iterable[str]) -> TaskPatch:
    """``depend``: ``current`` waiting also for ``on``; refused (nothing written) when the
    task would then wait for more than NAMES_MAX tasks, the limit ``add`` enforces."""
    deps = frozenset({*current.depends_on, *on})
    if len(deps) > NAMES_MAX:
        raise ValidationError(
            "on", f"would make {current.task!r} wait for {len(deps)} tasks; a task may depend "
            f"on at most {NAMES_MAX} (it has {len(current.depends_on)})")
    return TaskPatch(current.task, depends_on=tuple(sorted(deps)))


def add_events(
    tasks: Lookup, spec: Task | TaskPatch, actor: str
) -> tuple[tuple[dict[str, Any], ...], Task | None]:
    """``add``: a task_added event, a task_updated event naming what changed, or nothing for
    an identical repeat (then the current record is returned). A ``TaskPatch`` changes only
    the fields it gives; a ``Task`` is the whole new definition."""
    current = tasks.get(spec.task)
    if isinstance(spec, TaskPatch):
        spec = spec.over(current)
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
    fields.update({k: v for k in ("title", "description")
                   if (v := getattr(spec, k)) is not None})
    if current is None:
        return ({"type": TASK_ADDED, **fields},), None
    changed = [name for name in _PATCHED
               if getattr(current, name) != getattr(spec, name)]
    return ({"type": TASK_UPDATED, **fields, "changed": changed},), None


class _Overlay:
    """The task table as it will be once the batch so far is applied (for ``add_many``)."""

    def __init__(self, base: Lookup) -> None:
        self.base = base
        self.added: dict[str, Task] = {}

    def get(self, task: str) -> Task | None:
        found = self.added.get(task)
        return found if found is not None else self.base.get(task)


def add_many_events(
    tasks: Lookup, specs: Iterable[Task | TaskPatch], actor: str
) -> tuple[dict[str, Any], ...]:
    """``add`` of each spec in order, as one batch: a later spec sees the earlier ones (its
    dependencies, a cycle among them), identical repeats write nothing, a task named twice
    is refused (which of the two was meant?)."""
    overlay = _Overlay(tasks)
    events: list[dict[str, Any]] = []
    seen: set[str] = set()
    for spec in specs:
        if spec.task in seen:
            raise ValidationError("tasks", "name a task twice; each task once per batch",
                                  value=spec.task)
        seen.add(spec.task)
        if isinstance(spec, TaskPatch):
            spec = spec.over(overlay.get(spec.task))
        found, _ = add_events(overlay, spec, actor)
        events.extend(found)
        overlay.added[spec.task] = spec
    return tuple(events)


def require(tasks: TaskView, task: str) -> Task:
    found = tasks.get(task)
    if found is None:
        raise UnknownTask(task)
    return found


def became_ready_after(
    tasks: TaskView, claims: ClaimView, done: str, actor: str
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
        if eligible(record, claims, finished):
            out.append({"type": BECAME_READY, "task": user, "actor": actor, "after": done})
    return out


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
        elif kind in (CLAIM_CREATED, CLAIM_RECOVERED) and row["claimed"] is None:
            row["claimed"] = float(ts)
            if row["ready"] is None:
                row["ready"] = float(ts)
        elif kind == CLAIM_COMPLETED:
            row["completed"] = float(ts)
    return out


# Names callers import from here (the queue's vocabulary), declared in model/state/events.
__all__ = [
    "BECAME_READY", "BLOCKED", "DONE", "HELD", "PENDING", "READINESS_ORDER", "READY",
    "TASK_ADDED", "TASK_BLOCKED", "TASK_EVENTS", "TASK_UNBLOCKED", "TASK_UPDATED", "Key",
    "Lookup", "QueueIndex", "Readiness", "Task", "TaskPatch", "TaskStatus", "TaskTable",
    "add_events", "add_many_events", "became_ready_after", "completed", "depend_patch",
    "eligible", "find_cycle", "not_ready", "queue_times", "require", "status",
]
