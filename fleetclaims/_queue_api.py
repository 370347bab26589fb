"""The work-queue half of ``Registry`` (a base class, so ``api.py`` stays readable): adding
and planning tasks, handing out the next ready one, and listing the queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import _paths, _wait
from .core import queue, queue_rules, rules, validate
from .core.errors import DependencyCycle, ValidationError
from .core.model import Claim, Now
from .core.rules import Decision, Grant
from .core.state import State

if TYPE_CHECKING:
    from .store.base import Store

TITLE_MAX = 200  # a title is one line of a listing
DESCRIPTION_MAX = 20_000  # what to do, as long as a good issue body
BATCH_MAX = 10_000  # tasks per add_many: one journal transaction stays a few MB at most


class QueueMethods:
    """``Registry``'s work-queue methods; they use its store and its one transaction."""

    store: Store

    if TYPE_CHECKING:  # provided by Registry
        def _run(self, decide: Callable[[State, Now], Decision]) -> tuple[Decision, State]: ...

        def _grant(self, owner: str, token: str | None, ttl: float | None, *,
                   note: str | None = None, metadata: dict[str, Any] | None = None,
                   process: bool | int = True) -> tuple[str, Grant]: ...

        def _verdict(self, claim: Claim | None) -> Any: ...

        def _mine(self, state: State, task: str, raw: str) -> Claim: ...

        def _now(self) -> Now: ...

    def add(
        self,
        task: str,
        *,
        priority: int | None = None,
        depends_on: Iterable[str] | None = None,
        labels: Iterable[str] | None = None,
        note: str | None = None,
        actor: str = "operator",
        title: str | None = None,
        description: str | None = None,
    ) -> queue.Task:
        """Put ``task`` in the work queue, or update it. An argument left at None is not
        given: a new task takes the default (priority 100, no dependencies, no labels, no
        text), a queued one keeps what it has, so an update changes only the fields given
        (``depends_on`` and ``labels`` as given replace the sets; ``[]`` empties them, an
        empty title, description or note clears it). Idempotent for identical input; a
        change is recorded as ``task_updated``. Raises DependencyCycle when ``depends_on``
        would make the task wait for itself."""
        spec = _spec(task, priority=priority, depends_on=depends_on, labels=labels, note=note,
                     title=title, description=description)
        who = validate.owner(actor, "actor")
        _, state = self._run(lambda s, now: queue_rules.decide_add(s, spec, who))
        return queue.require(state.tasks, spec.task)

    def add_many(self, tasks: Iterable[Mapping[str, Any]], *, actor: str = "operator") -> int:
        """Put several tasks in the queue in one transaction (all or none). Each item is a
        mapping with ``task`` (or ``id``) and optionally ``title``, ``description``,
        ``labels``, ``priority``, ``depends_on``, ``note``: the arguments of ``add``, and
        like them a key left out (or null) keeps a queued task's value. A task may depend on
        one added earlier or later in the same batch. Returns how many events
        were written (identical repeats write nothing)."""
        who = validate.owner(actor, "actor")
        specs = tuple(_item_spec(i, item) for i, item in enumerate(_items(tasks)))
        decision, _ = self._run(lambda s, now: queue_rules.decide_add_many(s, specs, who))
        return int(decision.result or 0)

    def depend(self, task: str, *, on: Iterable[str], actor: str = "operator") -> queue.Task:
        """Make ``task`` (already in the queue) also wait for the tasks in ``on``."""
        task = validate.task(task)
        deps = validate.names("on", on)
        who = validate.owner(actor, "actor")
        _, state = self._run(lambda s, now: queue_rules.decide_depend(s, task, deps, who))
        return queue.require(state.tasks, task)

    def block(self, task: str, *, reason: str, actor: str = "operator") -> bool:
        """Keep ``task`` from being claimed until ``unblock``; False if already blocked so."""
        task = validate.task(task)
        why = validate.required_reason(reason, "say why the task is blocked")
        who = validate.owner(actor, "actor")
        decision, _ = self._run(lambda s, now: queue_rules.decide_block(s, task, why, who))
        return bool(decision.result)

    def unblock(self, task: str, *, reason: str | None = None, actor: str = "operator") -> bool:
        """Let ``task`` be claimed again; False if it was not blocked."""
        task = validate.task(task)
        why = validate.reason(reason)
        who = validate.owner(actor, "actor")
        decision, _ = self._run(lambda s, now: queue_rules.decide_unblock(s, task, who, why))
        return bool(decision.result)

    def claim_next(
        self,
        *,
        owner: str,
        labels: Iterable[str] | None = None,
        ttl: float = validate.DEFAULT_TTL,
        note: str | None = None,
        metadata: dict[str, Any] | None = None,
        take_stale: bool = False,
        process: bool | int = True,
        wait: float | None = None,
        paths: Iterable[str] | None = None,
        shared_paths: Iterable[str] | None = None,
    ) -> Claim | None:
        """Atomically claim the best ready task (lowest priority number, then oldest, then
        id) carrying every label in ``labels``; None when nothing is ready. With
        ``take_stale``, a stale claim of an otherwise ready task counts as ready. With
        ``wait`` (seconds), wait that long for a task to become ready (see ``_wait``)."""
        wanted = frozenset(validate.names("labels", labels, validate.label))
        take_stale = validate.flag("take_stale", take_stale)
        wait = _wait.check_wait(wait)
        raw, grant = self._grant(owner, None, ttl, note=note, metadata=metadata,
                                 process=process)
        grant = _paths.with_paths(grant, paths, shared_paths)  # a task whose paths conflict
        # with another claim's is passed over like a held one

        def decide(state: State, now: Now) -> Decision:
            return rules.decide_claim_next(state, grant, now, self._verdict, labels=wanted,
                                           take_stale=take_stale)

        decision, state = _wait.transact(self, decide, wait,
                                         found=lambda d: d.result is not None)
        if decision.result is None:
            return None
        return self._mine(state, str(decision.result), raw)

    def task(self, task: str) -> queue.TaskStatus | None:
        """A queued task with its readiness now, or None when it is not in the queue."""
        state = self.store.read()
        record = state.tasks.get(validate.task(task))
        return None if record is None else queue.status(record, state.claims)

    def tasks(self, status: Iterable[str] | None = None,
              labels: Iterable[str] | None = None) -> list[queue.TaskStatus]:
        """Every queued task with its readiness, in hand-out order (priority number, age,
        id); filtered to the given readiness states and to tasks carrying every label."""
        wanted = None if status is None else set(validate.names("status", status, _readiness))
        need = frozenset(validate.names("labels", labels, validate.label))
        state = self.store.read()
        found = []
        for record in sorted(state.tasks.values(), key=lambda t: t.key):
            if not need <= set(record.labels):
                continue
            item = queue.status(record, state.claims)
            if wanted is None or item.status in wanted:
                found.append(item)
        return found

    def ready(self, labels: Iterable[str] | None = None) -> list[queue.Task]:
        """What ``claim_next`` would hand out now, best first (stale claims not included)."""
        need = frozenset(validate.names("labels", labels, validate.label))
        state = self.store.read()
        out = []
        for key in state.tasks.ready_keys(state.claims):
            record = state.tasks.get(key[2])
            if record is not None and need <= set(record.labels):
                out.append(record)
        return out


def _readiness(value: Any) -> str:
    """One readiness state of a ``tasks`` filter, as given: a string naming one (never
    converted with str(), which a value nested deep enough turns into a RecursionError)."""
    if not isinstance(value, str) or value not in queue.READINESS_ORDER:
        raise ValidationError("status", "must be among " + ", ".join(queue.READINESS_ORDER),
                              value=value)
    return value


_ITEM_KEYS = frozenset({"task", "id", "title", "description", "labels", "priority",
                        "depends_on", "note"})


def _spec(task: Any, *, priority: Any = None, depends_on: Any = None, labels: Any = None,
          note: Any = None, title: Any = None, description: Any = None) -> queue.TaskPatch:
    """What ``add``'s arguments give for a task, each one checked (None: not given). A task
    named among its own dependencies is refused here, before the registry is touched."""
    title = validate.text("title", title, TITLE_MAX)
    if title is not None and ("\n" in title or "\r" in title):
        raise ValidationError("title", "must be one line (put the rest in description)")
    name = validate.task(task)
    deps = None if depends_on is None else validate.names("depends_on", depends_on)
    if deps is not None and name in deps:
        raise DependencyCycle(name, [name, name])
    return queue.TaskPatch(
        task=name,
        priority=None if priority is None else validate.priority(priority),
        depends_on=deps,
        labels=None if labels is None else validate.names("labels", labels, validate.label),
        note=validate.text("note", note),
        title=title,
        description=validate.text("description", description, DESCRIPTION_MAX),
    )


def _items(tasks: Any) -> list[Any]:
    """The batch as a list, refused when it is not a list of objects or is too long (a huge
    iterable is not read whole to be refused)."""
    import itertools

    if isinstance(tasks, (str, bytes, Mapping)) or not hasattr(tasks, "__iter__"):
        raise ValidationError("tasks", "must be a list of objects", value=tasks)
    items = list(itertools.islice(tasks, BATCH_MAX + 1))
    if len(items) > BATCH_MAX:
        raise ValidationError("tasks", f"has more than {BATCH_MAX} entries; add them in parts")
    return items


def _item_spec(index: int, item: Any) -> queue.TaskPatch:
    """One item of ``add_many``: a mapping of ``add``'s arguments (``id`` for ``task``)."""
    if not isinstance(item, Mapping):
        raise ValidationError(f"tasks[{index}]", "must be an object with a task id",
                              value=item)
    # (named as given when a string, else by type: str() of a key nested deep recurses)
    # (shortened: a key may be any length, and the message is shown whole)
    unknown = sorted((k if len(k) <= 64 else k[:61] + "...") if isinstance(k, str)
                     else f"<{type(k).__name__}>" for k in item if k not in _ITEM_KEYS)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more"
                                           if len(unknown) > 10 else "")
        raise ValidationError(f"tasks[{index}]", "has unknown keys " + shown
                              + "; known: " + ", ".join(sorted(_ITEM_KEYS)))
    if ("task" in item) == ("id" in item):
        raise ValidationError(f"tasks[{index}]", "must carry exactly one of task or id")
    return _spec(item.get("task", item.get("id")), priority=item.get("priority"),
                 depends_on=item.get("depends_on"), labels=item.get("labels"),
                 note=item.get("note"), title=item.get("title"),
                 description=item.get("description"))
