"""Writes in one round trip: decided over this process's copy of the task's rows, checked and
numbered on the server in the message that commits.

A process that works its own tasks (an agent claiming, renewing and releasing them) holds the
latest version of each of their claim rows after its previous operation. Its next decision
over that copy is the one the server would let it make, if the copy is still current and the
clock agrees. So the decision is made before anything is sent, from the copy and an estimate
of the server's clock (the server's time at the last answer plus this process's monotonic
clock since, used only within ``GUESS_AGE`` of that answer), sealed at the head last seen and
cut into a ``numbered.Template``; one message then takes the task's lock, writes the event
numbered by the server only if the claim row is still that copy (same seq and event id, or
still no row), the task is not in the work queue and the server's clock is within
``CLOCK_TOLERANCE`` of the estimate, and commits. The rules decide exactly as in two round
trips (the same core function, over rows the server proves unchanged under the task's lock);
the one difference is the time a lease is decided at: the estimate, never more than
``CLOCK_TOLERANCE`` from the server's clock when the row is written.

When the server finds the copy stale (another process wrote the task), nothing was written: the
operation runs again the usual way (``numbered.py``, or the head row first), one round trip
more than before. Anything that is not one event of one task the guess can name (a refusal, a
no-op, the work queue, reservations) goes the usual way from the start, since only a write can
be checked by the server.
"""

from __future__ import annotations

import select
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from ...core.model import Claim, Now
from ...core.rules import Decision
from ...core.state import State
from ...system import Clock
from ..base import Decide
from ..file.faults import crash_point
from . import connection as pgc
from . import numbered
from .foresight import Foresight, foresee
from .journal import claim_row
from .schema import Queries
from .tables import PgClaimView, PgTaskView

GUESS_AGE = 2.0  # seconds after the server's last answer its clock may be estimated
CLOCK_TOLERANCE = 0.025  # seconds the estimate may be off when the row is written
GUESS_SHARE = 0.6  # of the budget, spent waiting for the answer (the rest: finding out)


class NumberedWrites:
    """The writes of ``PostgresStore`` numbered on the server: in one round trip, and the
    second round trip of one numbered after reading (``PostgresStore`` sets these attributes
    up)."""

    location: str
    sql: Queries
    _q: Queries
    clock: Clock | None
    server_clock: bool
    numbering: bool
    sync: bool
    _cache: dict[str, Claim]
    _head: tuple[int, int, str, str]
    _wall: float
    _wall_at: float
    _keys: dict[str, int]
    _queued: set[str]
    _async: bool
    _crowded: bool
    _flush_after: bool
    _numbers: tuple[int, int, str, str] | None
    _watchdog: pgc.Watchdog
    _in_txn: bool
    _mutex: threading.RLock
    _conn: psycopg.Connection[Any] | None
    _guard: tuple[float, float] | None

    if TYPE_CHECKING:  # (PostgresStore's)
        def _commit(self, batch: pgc.Batch) -> list[list[tuple[Any, ...]]]: ...

        def _seal_apply(self, state: State, events: Any, ts: float,
                        objs: list[dict[str, Any]] | None = None) -> list[tuple[Any, ...]]: ...

        def _remember(self, table: PgClaimView) -> None: ...

        def _failure(self, conn: psycopg.Connection[Any], exc: psycopg.Error,
                     committing: bool, first: tuple[int, str] | None, deadline: float,
                     tpl: numbered.Template | None = None) -> BaseException | None: ...

        def _abandon(self, conn: psycopg.Connection[Any]) -> None: ...

    def _committed(self, decision: Decision, state: State, table: PgClaimView,
                   tpl: numbered.Template | None, objs: list[dict[str, Any]]
                   ) -> tuple[Decision, State]:
        """After the commit: a numbered write brought to the server's numbers; remembered."""
        if tpl is not None:
            assert self._numbers is not None
            event = numbered.settle(self.location, tpl, objs[0], state, table, self._numbers)
            decision = numbered.renumbered(decision, event)
        self._head = (state.seq, state.fence, state.head, state.origin)
        self._remember(table)
        return decision, state

    def _write_numbered(self, conn: psycopg.Connection[Any], tpl: numbered.Template,
                        row: tuple[Any, ...], table: PgClaimView) -> tuple[int, int, str, str]:
        """Round trip 2 of a numbered write: the event numbered and sealed on the server with
        the head row locked, its claim row, COMMIT; answers (seq, fence, prev, hash)."""
        batch = pgc.Batch(conn)
        batch.add(self._q.numbered, numbered.params(
            tpl, row, claim_row(table, tpl.task, numbered=True)))
        seq, fence, prev, digest = self._commit(batch)[0][0]
        return int(seq), int(fence), str(prev), str(digest)

    def _numbered_keys(self, guess: Foresight) -> list[int] | None:
        """The task locks of a write that may be numbered in its commit (``numbered.py``),
        judged from the guessed decision; None: lock the head row first."""
        if (not self.numbering or guess.events is None or len(guess.events) > 1
                or not guess.claims or self._head[0] == 0
                or any(e.get("type") not in numbered.KINDS for e in guess.events)):
            return None
        keys = numbered.task_keys(self.sql.task_prefix, [*guess.claims, *guess.tasks],
                                  self._keys)
        return keys if len(keys) <= numbered.MAX_LOCKS else None

    def _server_estimate(self) -> float | None:
        """The server's clock now, estimated from its last answer (None: too old for that)."""
        age = time.monotonic() - self._wall_at
        return self._wall + age if 0 <= age <= GUESS_AGE else None

    def _guess(self, decide: Decide) -> tuple[Foresight, Now | None]:
        """The decision over this process's copies, and the time it was made at (None: it
        cannot be written without reading first). The time is the server's, estimated, or
        an injected clock's."""
        estimate = self._server_estimate()
        if not self.server_clock and self.clock is not None:
            now: Now | None = self.clock.now()
        else:
            now = None if estimate is None else Now(wall=estimate, boot=None, boot_id="")
        guess = foresee(decide, self.sql, self._cache, self._head,
                        now or Now(wall=self._wall, boot=None, boot_id=""))
        return guess, now if estimate is not None else None

    def _guessable(self, guess: Foresight, now: Now | None) -> bool:
        """Whether ``guess`` may be written in one round trip: one event about the one task
        whose rows it read."""
        decision = guess.decision
        return (now is not None and self.numbering and self._q is not self.sql
                and decision is not None
                and guess.state is not None and len(decision.events) == 1
                and decision.error is None and len(guess.claims) == 1
                and set(guess.tasks) <= set(guess.claims) and self._head[0] > 0
                and not self._queued.intersection(guess.tasks)
                and decision.events[0].get("type") in numbered.KINDS
                and not self._closing())

    def _closing(self) -> bool:
        """Whether the server has said something on the idle connection (it is going away: a
        shutdown's notice, or its end): the write then goes the way that finds out before
        sending anything it could not take back."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return True
        try:
            ready, _, _ = select.select([conn.pgconn.socket], [], [], 0)
        except (OSError, ValueError, psycopg.Error):
            return True
        return bool(ready)

    def _attempt_guessed(self, conn: psycopg.Connection[Any], guess: Foresight, now: Now,
                         deadline: float) -> tuple[Decision, State] | None:
        """Write ``guess`` (``_guessable``) in one round trip; None when it cannot be
        (nothing was written; the guess's state is spent)."""
        decision, state = guess.decision, guess.state
        assert decision is not None and state is not None
        task = guess.claims[0]
        table, tasks = state.claims, state.tasks
        assert isinstance(table, PgClaimView) and isinstance(tasks, PgTaskView)
        objs: list[dict[str, Any]] = []
        try:
            rows = self._seal_apply(state, list(decision.events), now.wall, objs)
        except (KeyError, TypeError, ValueError):
            return None
        tpl = numbered.template(objs[0], str(rows[0][-1]))
        if tpl is None or tpl.task != task or table.dirty != {task} or tasks.dirty:
            return None
        keys = numbered.task_keys(self.sql.task_prefix, [task], self._keys)
        copy = self._cache.get(task)
        # The server's clock must be within CLOCK_TOLERANCE of the estimate when the row is
        # written: the lease was decided at that time (with the server's clock), and a
        # message held up (a frozen server, a stalled network) can pass the check only within
        # that window, so not finding it once the server's clock is past it is definite.
        estimate = self._server_estimate()
        if estimate is None:
            return None
        window = (estimate - CLOCK_TOLERANCE, estimate + CLOCK_TOLERANCE)
        # (the task row is checked only if the decision looked at it: a release does not)
        guard = ((copy.seq, copy.eid) if copy is not None else (-1, "")) + (
            task, copy is None, task not in guess.tasks, task, *window)
        params = numbered.params(tpl, rows[0], claim_row(table, task, numbered=True))
        q = self._q
        batch = pgc.Batch(conn)
        batch.add("BEGIN")
        self._async = not self.sync or (self._flush_after and self._crowded)
        limits = pgc.local_settings(not self._async, deadline - time.monotonic())
        batch.add(q.peek, ("{" + ",".join(map(str, keys)) + "}", *limits))
        batch.add(q.guessed, (*params[:3], *guard, *params[3:]))
        first = (int(rows[0][0]), str(rows[0][-1]))
        self._in_txn = True
        # The answer is awaited for most of the budget; the rest is kept to find out what
        # became of the write if none comes (``_resolve_commit`` with ``_guard``).
        left = deadline - time.monotonic()
        self._guard = (window[1], deadline + pgc.GRACE_S)
        self._watchdog.arm(conn, time.monotonic() + max(0.0, left) * GUESS_SHARE)
        try:
            crash_point("pg.before_commit")
            answers = self._commit(batch)
            crash_point("pg.commit_answer")
        except psycopg.Error as exc:
            failure = self._failure(conn, exc, True, first, deadline, tpl)
            if failure is None:  # the COMMIT whose answer we lost did commit
                return self._settled(decision, state, table, tpl, objs)
            raise failure from None
        except BaseException:
            self._abandon(conn)
            raise
        finally:
            self._watchdog.disarm()
            self._in_txn = False
            self._guard = None
        head = answers[1][0]
        self._crowded = int(head[0]) != self._head[0]
        self._wall, self._wall_at = float(head[-1]), time.monotonic()
        if not answers[2]:  # the copy was stale (or the clock off): nothing written
            self._head = (int(head[0]), int(head[2]), str(head[1]), str(head[3]))
            return None
        seq, fence, prev, digest = answers[2][0]
        self._numbers = (int(seq), int(fence), str(prev), str(digest))
        return self._settled(decision, state, table, tpl, objs)

    def _settled(self, decision: Decision, state: State, table: PgClaimView,
                 tpl: numbered.Template, objs: list[dict[str, Any]]
                 ) -> tuple[Decision, State]:
        """A committed guess: at the server's numbers, its views reading from the server."""
        done = self._committed(decision, state, table, tpl, objs)
        table.rebind(self)  # type: ignore[arg-type]
        tasks = state.tasks
        if isinstance(tasks, PgTaskView):
            tasks.rebind(self)  # type: ignore[arg-type]
        return done
