"""The claim and task views of a PostgreSQL registry: the core's ClaimView and TaskView
Protocols over SQL rows, by composition.

Each view keeps an in-memory table of the core (``ClaimTable`` / ``TaskTable``) as its cache
and fills it through that table's public methods: a row is fetched on first use, a missing one
is remembered as absent, the whole table is fetched once when a caller needs all of it, and
``dirty`` names the rows changed by applied events (upserted at commit). The core sees only
the Protocols; the SQL stays here and in ``schema.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from ...core.model import Claim, Key, Task
from ...core.ports import ClaimView
from ...core.state import ClaimTable, TaskTable
from .schema import Queries


class Rows(Protocol):
    """What the views need from the store: its statements, a read, and a claim row lookup
    that reuses the store's copies of unchanged rows."""

    sql: Queries
    schema: str  # the schema's name (quoted in statements)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...

    def fetch_claim(self, task: str) -> Claim | None: ...


class PgClaimView:
    """The claims table as a ClaimView. Inside a write transaction the rows come from that
    transaction (under the head lock, so they are exactly the state at ``seq``); afterwards a
    lookup of a task not loaded yet reads the latest committed row."""

    __slots__ = ("_absent", "_before", "_complete", "_rows", "_table", "dirty")

    def __init__(self, rows: Rows, *, complete: bool = False) -> None:
        self._rows = rows
        self._table = ClaimTable()
        self._absent: set[str] = set()
        self._complete = complete
        self.dirty: set[str] = set()
        # each changed claim as its row stood before (None: no row), so the write knows which
        # retired grants are new (journal.claim_row)
        self._before: dict[str, Claim | None] = {}

    def rebind(self, rows: Rows) -> None:
        """Read further rows through ``rows`` (a guess's view, once its write committed)."""
        self._rows = rows

    def before(self, task: str) -> Claim | None:
        """``task``'s claim as read, before this transaction changed it."""
        return self._before[task] if task in self._before else self.get(task)

    def load_all(self) -> None:
        """Fetch every row not held yet (one query)."""
        if self._complete:
            return
        for task, data in self._rows.query(self._rows.sql.claims):
            self._table.put_raw(str(task), orjson.loads(data))
        self._absent.clear()
        self._complete = True

    def preload(self, asked: list[str], found: dict[str, Claim]) -> None:
        """Take the rows fetched with the head lock: ``found`` by task; the rest of ``asked``
        do not exist."""
        for task in asked:
            claim = found.get(task)
            if claim is None:
                self._absent.add(task)
            else:
                self._table[task] = claim

    def get(self, task: str) -> Claim | None:
        if task in self._table:
            return self._table.get(task)
        if self._complete or task in self._absent:
            return None
        claim = self._rows.fetch_claim(task)
        if claim is None:
            self._absent.add(task)
            return None
        self._table[task] = claim  # loaded, not changed: not dirty
        return claim

    def __setitem__(self, task: str, claim: Claim) -> None:
        if task not in self._before:
            self._before[task] = self.get(task)
        self._table[task] = claim
        self._absent.discard(task)
        self.dirty.add(task)

    def discard(self, task: str) -> None:
        """A recorded prune removed ``task``'s record: its row goes in this transaction."""
        self._table.discard(task)
        self.dirty.discard(task)
        self._absent.add(task)
        s = f'"{self._rows.schema}"'
        self._rows.query(f"WITH r AS (DELETE FROM {s}.retired WHERE task = %s) "
                         f"DELETE FROM {s}.claims WHERE task = %s RETURNING task", (task, task))
        self._before[task] = None  # (a row written again after this starts a new ring)

    def __contains__(self, task: object) -> bool:
        return isinstance(task, str) and self.get(task) is not None

    def __len__(self) -> int:
        self.load_all()
        return len(self._table)

    def tasks(self) -> list[str]:
        self.load_all()
        return self._table.tasks()

    def values(self) -> Iterator[Claim]:
        self.load_all()
        return self._table.values()

    def materialize(self) -> None:
        self.load_all()
        self._table.materialize()

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        self.load_all()
        return self._table.raw_items()

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        self.load_all()
        return self._table.data_items()

    def copy(self) -> ClaimTable:
        self.load_all()
        return self._table.copy()

    def loaded(self) -> Iterator[tuple[str, Claim]]:
        """The claims read or written so far (what the store keeps for the next transaction)."""
        return self._table.loaded()


class PgTaskView:
    """The work queue's ``tasks`` table as a TaskView: one row on ``get``; the whole table (and
    every claim row) when the ready index is needed; ``claim_next``'s candidates and a task's
    dependants asked of the server while the index is not built."""

    __slots__ = ("_absent", "_complete", "_rows", "_table", "dirty")

    def __init__(self, rows: Rows, *, complete: bool = False) -> None:
        self._rows = rows
        self._table = TaskTable()
        self._absent: set[str] = set()
        self._complete = complete
        self.dirty: set[str] = set()

    def rebind(self, rows: Rows) -> None:
        """Read further rows through ``rows`` (a guess's view, once its write committed)."""
        self._rows = rows

    def load_all(self) -> None:
        if self._complete:
            return
        for task, data in self._rows.query(self._rows.sql.tasks):
            self._table.put_raw(str(task), orjson.loads(data))
        self._absent.clear()
        self._complete = True

    def preload(self, asked: list[str], found: dict[str, Any]) -> None:
        """Take the task rows fetched with the head lock (``found``: task -> row data); the
        rest of ``asked`` are not in the queue."""
        for task in asked:
            data = found.get(task)
            if data is None:
                self._absent.add(task)
            else:
                self._table.put_raw(task, data)

    def get(self, task: str) -> Task | None:
        if task in self._table:
            return self._table.get(task)
        if self._complete or task in self._absent:
            return None
        rows = self._rows.query(self._rows.sql.task, (task,))
        if not rows:
            self._absent.add(task)
            return None
        self._table.put_raw(task, orjson.loads(rows[0][0]))
        return self._table.get(task)

    def put(self, record: Task, claims: ClaimView) -> None:
        self.get(record.task)  # the current row first: put replaces it (and its index edges)
        self._table.put(record, claims)
        self._absent.discard(record.task)
        self.dirty.add(record.task)

    def __contains__(self, task: object) -> bool:
        return isinstance(task, str) and self.get(task) is not None

    def __len__(self) -> int:
        self.load_all()
        return len(self._table)

    def names(self) -> list[str]:
        self.load_all()
        return self._table.names()

    def values(self) -> Iterator[Task]:
        self.load_all()
        return self._table.values()

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        self.load_all()
        return self._table.raw_items()

    def copy(self) -> TaskTable:
        self.load_all()
        return self._table.copy()

    @property
    def indexed(self) -> bool:
        return self._table.indexed

    def drop_index(self) -> None:
        self._table.drop_index()

    def changed(self, task: str, claims: ClaimView) -> None:
        self._table.changed(task, claims)

    def _indexed(self, claims: ClaimView) -> TaskTable:
        """The in-memory table with its ready index built over every row (two queries, not
        one per task)."""
        if not self._table.indexed:
            self.load_all()
            if isinstance(claims, PgClaimView):
                claims.load_all()
            self._table.index(claims)
        return self._table

    def candidates(self, claims: ClaimView, take_stale: bool,
                   labels: frozenset[str] = frozenset()) -> Iterator[tuple[Key, bool]]:
        """The candidates from the database, a page at a time, in hand-out order: the server
        works out readiness with its indexes, so ``claim_next`` does not load the queue (with
        the whole queue in memory already, the in-memory index is used)."""
        if self._table.indexed or self._complete:
            return self._indexed(claims).candidates(claims, take_stale, labels)
        return self._candidates_sql(take_stale, labels)

    def _candidates_sql(self, take_stale: bool,
                        labels: frozenset[str]) -> Iterator[tuple[Key, bool]]:
        wanted = orjson.dumps(sorted(labels)).decode()
        after: Key = (-(1 << 62), float("-inf"), "")
        page = 16
        while True:
            rows = self._rows.query(self._rows.sql.candidates, (wanted, *after, page))
            for task, data, held, ready, priority, added_at in rows:
                after = (int(priority), float(added_at), str(task))
                if not ready or (held and not take_stale):
                    continue
                self._table.put_raw(after[2], orjson.loads(data))
                record = self.get(after[2])
                if record is not None:
                    yield record.key, bool(held)
            if len(rows) < page:
                return
            page = min(page * 4, 1024)

    def ready_keys(self, claims: ClaimView) -> list[Key]:
        return self._indexed(claims).ready_keys(claims)

    def dependants(self, task: str, claims: ClaimView) -> list[str]:
        if self._table.indexed:
            return self._table.dependants(task, claims)
        rows = self._rows.query(self._rows.sql.dependants, (task,))
        return sorted(str(r[0]) for r in rows)
