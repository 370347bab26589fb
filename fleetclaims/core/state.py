"""The registry state and its in-memory tables.

``State`` holds a claim table and a task table behind the view Protocols of ``ports.py``: the
in-memory ``ClaimTable`` and ``TaskTable`` here (used by the file and memory stores and by
tests), or a store's own views (PostgreSQL's, over SQL, by composition). Persisted entries stay
raw dicts until first looked at, so opening a registry of 100,000 claims does not build 100,000
objects when a command needs one.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import RegistryCorrupt
from .model import (
    COMPLETED,
    GENESIS,
    LISTING_BASE,
    RELEASED,
    Claim,
    Identity,
    Key,
    Task,
    _mapping,
)
from .paths import PathIndex
from .ports import ClaimView, TaskView


class ClaimTable:
    """task -> Claim, holding snapshot entries as raw dicts until they are first looked at."""

    __slots__ = ("_claims", "_raw")

    def __init__(self, raw: dict[str, Any] | None = None) -> None:
        self._claims: dict[str, Claim] = {}
        self._raw: dict[str, Any] = dict(raw) if raw else {}

    def get(self, task: str) -> Claim | None:
        claim = self._claims.get(task)
        if claim is None and task in self._raw:
            claim = Claim.from_dict(_mapping(self._raw.pop(task)))
            self._claims[task] = claim
        return claim

    def __setitem__(self, task: str, claim: Claim) -> None:
        self._raw.pop(task, None)
        self._claims[task] = claim

    def __contains__(self, task: object) -> bool:
        return task in self._claims or task in self._raw

    def __len__(self) -> int:
        return len(self._claims) + len(self._raw)

    def tasks(self) -> list[str]:
        return sorted([*self._claims, *self._raw])

    def values(self) -> Iterator[Claim]:
        for task in self.tasks():
            claim = self.get(task)
            if claim is not None:
                yield claim

    def materialize(self) -> None:
        """Convert every raw entry now (surfaces damage as an exception at a chosen moment)."""
        for task in list(self._raw):
            self.get(task)

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        """(task, persisted dict) pairs without building Claim objects for untouched entries."""
        yield from self._raw.items()
        for task, claim in self._claims.items():
            yield task, claim.to_dict(compact=True)

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(task, persisted dict) pairs for listings: each dict is new (the caller may change
        it) and has every optional member, None when unset; no Claim objects are built."""
        for task, data in self.raw_items():
            yield task, {**LISTING_BASE, **data}

    def discard(self, task: str) -> None:
        """Forget ``task``'s record (a prune: see events.CLAIMS_PRUNED)."""
        self._claims.pop(task, None)
        self._raw.pop(task, None)

    def put_raw(self, task: str, data: Any) -> None:
        """Hold ``data`` (a persisted claim dict) for ``task``, converted on first lookup; a
        no-op when the task is already held (a store's view filling in rows it fetched)."""
        if task not in self._claims and task not in self._raw:
            self._raw[task] = data

    def loaded(self) -> Iterator[tuple[str, Claim]]:
        """(task, Claim) for the entries converted or set so far (not the raw ones)."""
        yield from self._claims.items()

    def copy(self) -> ClaimTable:
        clone = ClaimTable()
        clone._claims = dict(self._claims)
        clone._raw = dict(self._raw)
        return clone


def completed(claim: Claim | None) -> bool:
    return claim is not None and claim.state == COMPLETED


def eligible(task: Task, claims: ClaimView, done: frozenset[str] = frozenset()) -> bool:
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

    def place(self, task: Task, claims: ClaimView) -> None:
        """Put ``task`` in the list its current state calls for (or none)."""
        found = self._where.pop(task.task, None)
        if found is not None:
            lst, key = found
            i = bisect_left(lst, key)
            if i < len(lst) and lst[i] == key:
                del lst[i]
        if not eligible(task, claims):
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

    def put(self, record: Task, claims: ClaimView) -> None:
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

    def put_raw(self, task: str, data: Any) -> None:
        """Hold ``data`` (a persisted task dict) for ``task``, converted on first lookup; a
        no-op when the task is already held (a store's view filling in rows it fetched)."""
        if task not in self._tasks and task not in self._raw:
            self._raw[task] = data

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

    def index(self, claims: ClaimView) -> QueueIndex:
        if self._index is None:
            index = QueueIndex()
            records = list(self.values())
            for record in records:
                index.link(record.task, record.depends_on)
            for record in records:
                index.place(record, claims)
            self._index = index
        return self._index

    def candidates(self, claims: ClaimView, take_stale: bool,
                   labels: frozenset[str] = frozenset()) -> Iterator[tuple[Key, bool]]:
        """(key, held) of the tasks ``claim_next`` may hand out, in hand-out order: the ready
        ones, merged with the held ones when stale claims may be taken over. ``labels`` is a
        hint (a store may skip tasks without them); the caller still checks every candidate."""
        return self.index(claims).candidates(take_stale)

    def ready_keys(self, claims: ClaimView) -> list[Key]:
        """The ready tasks in hand-out order: a copy of the index, or (when it is not built)
        worked out without building it, so a reader outside the store's lock never touches
        an index that a writer maintains."""
        if self._index is not None:
            return list(self._index.ready)
        keys = []
        for record in self.values():
            claim = claims.get(record.task)
            if eligible(record, claims) and not (claim is not None and claim.live):
                keys.append(record.key)
        return sorted(keys)

    def dependants(self, task: str, claims: ClaimView) -> list[str]:
        """The queued tasks that depend on ``task``."""
        if not self._tasks and not self._raw:
            return []  # no queue: completing a task must not build anything
        return sorted(self.index(claims).dependants.get(task, ()))

    def changed(self, task: str, claims: ClaimView) -> None:
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



@dataclass
class State:
    """The registry state: the claim table and the work queue, plus the journal counters they
    were built from."""

    claims: ClaimView = field(default_factory=ClaimTable)
    seq: int = 0
    fence: int = 0  # the last fence number granted; only grows
    head: str = GENESIS  # hash of the last journal line
    origin: str = ""  # this registry's identity, from its first event
    tasks: TaskView = field(default_factory=TaskTable)
    # The owner processes apply has seen, so the grants of one process share one Identity
    # (a memo of this state, bounded by events.IDENTITY_MEMO_MAX; not copied, not compared).
    identities: dict[tuple[Any, ...], Identity] = field(
        default_factory=dict, repr=False, compare=False)
    # Live claims' path reservations by leading literal segments (core/reserve.py builds it
    # on first use; apply keeps it in step once built; None: not built, or dropped by a merge).
    reservations: PathIndex | None = field(default=None, repr=False, compare=False)

    def copy(self) -> State:
        return State(self.claims.copy(), self.seq, self.fence, self.head, self.origin,
                     self.tasks.copy())


# --- pruning (core/prune.py decides; events.apply applies claims_pruned through here) -------


def prunable(claims: ClaimView, before: float) -> Iterator[tuple[str, str]]:
    """(task, state) of every record a prune at ``before`` changes: released or completed
    before it, and not already a compact record. Read from the persisted dicts (no Claim is
    built for the records it leaves alone)."""
    for task, data in claims.data_items():
        state = data.get("state")
        ended = data.get("ended_at")
        if (state in (RELEASED, COMPLETED) and isinstance(ended, (int, float))
                and ended < before and not (state == COMPLETED and not data.get("token_hash"))):
            yield task, str(state)


def compact_completion(claim: Claim, seq: int, eid: str) -> Claim:
    """The record a completed claim keeps after a prune: enough to refuse a new claim of the
    task (owner, fence, completion time) and to reopen it; no grant has an empty token hash."""
    return Claim(task=claim.task, owner=claim.owner, fence=claim.fence, state=COMPLETED,
                 ended_at=claim.ended_at, seq=seq, eid=eid)


def prune_ended(claims: ClaimView, before: float, seq: int, eid: str) -> None:
    """Apply a recorded prune: released records before ``before`` go, completed ones shrink."""
    for task, state in list(prunable(claims, before)):
        if state == RELEASED:
            claims.discard(task)
        else:
            claim = claims.get(task)
            if claim is not None:
                claims[task] = compact_completion(claim, seq, eid)
