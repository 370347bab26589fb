"""The MCP server's planning tools: adding tasks, dependencies, blocking, and phases.

A base class of ``ClaimsServer`` (kept apart so each module stays readable). The queue events
these tools record name the server's owner as their actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from mcp.types import CallToolResult  # at run time: the SDK reads the annotations
from pydantic import Field

from .mcp_host import ServerHost

if TYPE_CHECKING:
    from ..core.queue import Task as QueuedTask

Task = Annotated[str, Field(max_length=200, description="The task id, e.g. 'issue-42'.")]
Names = Annotated[list[str] | None, Field(description="Task ids, e.g. ['write-docs'].")]
Labels = Annotated[list[str] | None, Field(
    description="Labels workers can ask for with claim_next, e.g. ['docs'].")]
Title = Annotated[str | None, Field(max_length=200, description="A one-line summary.")]
Description = Annotated[str | None, Field(max_length=20000,
                                          description="What to do, as long as it needs.")]
Priority = Annotated[int | None, Field(
    ge=-1_000_000, le=1_000_000,
    description="Lower numbers are handed out first (a new task: 100).")]
Reason = Annotated[str, Field(max_length=2000, description="Why, for the audit log.")]


def task_doc(t: QueuedTask) -> dict[str, Any]:
    return {"task": t.task, "title": t.title, "priority": t.priority,
            "depends_on": list(t.depends_on), "labels": list(t.labels), "blocked": t.blocked}


class PlanningTools(ServerHost):
    """``add``, ``add_many``, ``depend``, ``block``, ``unblock`` and ``transition``."""

    def add(self, task: Task, title: Title = None, description: Description = None,
            labels: Labels = None, priority: Priority = None, depends_on: Names = None,
            ) -> CallToolResult:
        def op() -> dict[str, Any]:  # (an argument left out keeps a queued task's value)
            t = self.registry.add(task, title=title, description=description, labels=labels,
                                  priority=priority, depends_on=depends_on, actor=self.owner)
            status = self.registry.task(t.task)
            return {**task_doc(t), "status": status.status if status else None}

        return self.call(op)

    def add_many(self, tasks: Annotated[list[dict[str, Any]], Field(
            max_length=10_000, description="Objects with id (or task) and optionally title, "
            "description, labels, priority, depends_on; added in one transaction, all or "
            "none.")]) -> CallToolResult:
        def op() -> dict[str, Any]:
            written = self.registry.add_many(tasks, actor=self.owner)
            return {"tasks": len(tasks), "events": written, "queue": self.registry.stats().queue}

        return self.call(op)

    def depend(self, task: Task, on: Annotated[list[str], Field(
            min_length=1, description="The tasks it must wait for.")]) -> CallToolResult:
        return self.call(lambda: task_doc(self.registry.depend(task, on=on, actor=self.owner)))

    def block(self, task: Task, reason: Reason) -> CallToolResult:
        return self.call(lambda: {"task": task, "blocked": True, "changed": self.registry.block(
            task, reason=reason, actor=self.owner)})

    def unblock(self, task: Task, reason: Annotated[str | None, Field(
            max_length=2000, description="Why, for the audit log.")] = None) -> CallToolResult:
        def op() -> dict[str, Any]:
            changed = self.registry.unblock(task, reason=reason, actor=self.owner)
            status = self.registry.task(task)
            return {"task": task, "blocked": False, "changed": changed,
                    "status": status.status if status else None}

        return self.call(op)

    def transition(self, task: Task,
                   phase: Annotated[str, Field(max_length=64, description="The new phase, "
                                               "e.g. 'review'.")],
                   ttl: Annotated[float | None, Field(ge=1, le=86400, description="A lease in "
                                  "the new phase; omit to park the claim.")] = None,
                   max_park: Annotated[float | None, Field(
                       ge=1, le=30 * 86400, description="Parked: the claim is stale after this "
                       "many seconds (default one day).")] = None,
                   token: Annotated[str | None, Field(description="Omit it: the server keeps "
                                    "the tokens of claims it made.")] = None,
                   ) -> CallToolResult:
        def op() -> dict[str, Any]:
            tok = self.token_for(task, token)
            c = self.forget_if_lost(task, lambda: self.registry.transition(
                task, token=tok, phase=phase, ttl=ttl, max_park=max_park))
            return self.summary(c)

        return self.call(op)


TOOLS = {
    "add": "Put a task in the work queue (or update it), with a title, a description, labels, "
           "a priority and the tasks it depends on. An update changes only the arguments "
           "given (labels and depends_on as given replace the lists; [] empties them). "
           "Repeating it changes nothing.",
    "add_many": "Put many tasks in the work queue in one transaction (all or none); a task may "
                "depend on another of the same batch.",
    "depend": "Make a queued task also wait until the tasks in `on` are completed.",
    "block": "Keep a queued task from being handed out until unblock, with a reason.",
    "unblock": "Let a blocked task be handed out again.",
    "transition": "Move a task you hold to another phase (e.g. review). Without ttl the claim "
                  "is parked: no lease to renew, stale after max_park seconds (default a day).",
}
