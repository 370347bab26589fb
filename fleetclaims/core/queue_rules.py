"""The rules of the work queue's own changes (add, depend, block, unblock): given the state
and a request, decide. Pure, like ``rules`` (claims and grants, claim_next included)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import events as ev
from . import queue
from .errors import FleetclaimsError
from .model import Task
from .rules import Decision
from .state import State

__all__ = ["decide_add", "decide_add_many", "decide_block", "decide_depend", "decide_unblock"]


def decide_add(state: State, spec: Task | queue.TaskPatch, actor: str) -> Decision:
    """Put a task in the queue, or update it; an identical repeat writes nothing."""
    try:
        events, current = queue.add_events(state.tasks, spec, actor)
    except FleetclaimsError as exc:
        return Decision((), exc)
    return Decision(events, result=current)


def decide_add_many(state: State, specs: tuple[Task | queue.TaskPatch, ...],
                    actor: str) -> Decision:
    """Put several tasks in the queue in one transaction: all of them or none."""
    try:
        events = queue.add_many_events(state.tasks, specs, actor)
    except FleetclaimsError as exc:
        return Decision((), exc)
    return Decision(events, result=len(events))


def decide_depend(state: State, task: str, on: tuple[str, ...], actor: str) -> Decision:
    """Add dependencies to a queued task (refusing a cycle, or more than 256 of them)."""
    try:
        spec = queue.depend_patch(queue.require(state.tasks, task), on)
    except FleetclaimsError as exc:
        return Decision((), exc)
    return decide_add(state, spec, actor)


def decide_block(state: State, task: str, reason: str, actor: str) -> Decision:
    try:
        current = queue.require(state.tasks, task)
    except FleetclaimsError as exc:
        return Decision((), exc)
    if current.blocked == reason:
        return Decision(result=False)
    event = {"type": ev.TASK_BLOCKED, "task": task, "actor": actor, "reason": reason}
    return Decision((event,), result=True)


def decide_unblock(state: State, task: str, actor: str, reason: str | None) -> Decision:
    """Unblock; records ``became_ready`` too when nothing else holds the task back."""
    try:
        current = queue.require(state.tasks, task)
    except FleetclaimsError as exc:
        return Decision((), exc)
    if current.blocked is None:
        return Decision(result=False)
    events: list[dict[str, Any]] = [
        {"type": ev.TASK_UNBLOCKED, "task": task, "actor": actor, "reason": reason}]
    if queue.status(replace(current, blocked=None), state.claims).status == queue.READY:
        events.append({"type": ev.BECAME_READY, "task": task, "actor": actor,
                       "after": "unblock"})
    return Decision(tuple(events), result=True)
