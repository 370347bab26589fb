"""Which rows will a decision read? Asked before the head lock is taken, so those rows travel
with the lock in one round trip instead of one round trip each while the lock is held.

The decision is run once, speculatively, over this process's cached copies of the claims and
an empty work queue, with no I/O: the tasks it looks up are recorded. It is only a guess (the
cached rows may be old, so the real decision may look elsewhere: those rows are then read
inside the transaction as before); the decision that counts is the one made under the lock.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...core.model import Claim, Now
from ...core.rules import Decision
from ...core.state import State
from ..base import Decide
from .schema import Queries
from .tables import PgClaimView, PgTaskView


class _Unforeseeable(Exception):
    """The decision needs more than single rows (a scan): stop guessing there."""


class Foresight:
    """The ``Rows`` the views read through during the speculative run: cached claims, no
    task rows, and a record of every task asked for."""

    schema = ""  # (never used: a statement other than a task lookup ends the guess)

    def __init__(self, sql: Queries, cache: dict[str, Claim]) -> None:
        self.sql = sql
        self._cache = cache
        self.claims: list[str] = []
        self.tasks: list[str] = []
        # the guessed decision's events when it ran to the end (None: it did not), so the
        # store can tell whether the write may be numbered in its commit (numbered.py)
        self.events: tuple[dict[str, Any], ...] | None = None
        self.state: State | None = None  # the state the guess decided over
        self.decision: Decision | None = None  # and its decision (None: it raised)

    def fetch_claim(self, task: str) -> Claim | None:
        if task not in self.claims:
            self.claims.append(task)
        return self._cache.get(task)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if sql == self.sql.task and params:
            task = str(params[0])
            if task not in self.tasks:
                self.tasks.append(task)
            return []
        raise _Unforeseeable(sql)


def foresee(decide: Decide, sql: Queries, cache: dict[str, Claim],
            head: tuple[int, int, str, str], now: Now) -> Foresight:
    """Run ``decide`` speculatively (``head``: the last (seq, fence, hash, origin) seen) and
    return what it asked for, the state and the decision. Never raises: a guess that fails is
    just a shorter guess."""
    rows = Foresight(sql, cache)
    seq, fence, digest, origin = head
    state = State(PgClaimView(rows), max(seq, 1), fence, digest, origin, PgTaskView(rows))
    rows.state = state
    # A speculative run: any failure just ends the guess there.
    with contextlib.suppress(Exception):
        rows.decision = decide(state, now)
        rows.events = rows.decision.events
    return rows
