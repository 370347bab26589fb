"""The PostgreSQL store: the same registry, journal and hash chain, shared between machines.

Beside it: ``session.py`` (the connection, schema checks, single reads), ``schema.py`` (schema,
statements), ``tables.py`` (the views the core decides over), ``connection.py`` (bounded
waits, typed errors), ``journal.py`` (rows), ``foresight.py``, and the writes numbered on the
server: ``numbered.py``, ``numbered_sql.py``, ``guessed.py``.

One operation is one transaction; the core decides (the one decision path; nothing of the
rules in SQL). A write of one task's claim goes in one round trip over this process's current
copy of its row (``guessed.py``), or in two with its task locked in the first and the event
numbered by the server in the second (``numbered.py``). Every other write goes the way this
module began with: (1) BEGIN, this transaction's limits and the head row locked (it serialises
writers) with the server's clock, and the rows the decision is expected to read; (2) the
sealed audit rows, the changed claim and task rows, the head, COMMIT. Either way, with full
durability and other writers about, the COMMIT is asynchronous and a flush follows it, so no
lock is held across the fsync (``_commit``). What was measured and taken or not: README
(PostgreSQL) and bench/README.md.

No ambiguous outcome reaches the caller. Nothing can commit before round trip 2 is sent, so a
connection lost before then is retried while the ``lock_timeout`` budget lasts, then reported
as ``StoreUnavailable(committed=False)``. Lost after that, the outcome is found out: reconnect
(waiting for a restarting server up to the budget again), wait behind the head lock for the old
session to end, and look for our first audit line: found, the call returns its result; absent,
the operation runs again (its tokens were minted by the client: the same request). Only a server
unreachable for that whole second budget leaves it unknown (``committed=None``). A write sent in
one round trip is found out within its own budget instead (``guessed.py``).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import psycopg

from ...core import events as ev
from ...core.chain import ChainError, check_seal, envelope, seal
from ...core.errors import (
    AuditCorrupt,
    FleetclaimsError,
    RegistryCorrupt,
    StoreUnavailable,
    ValidationError,
)
from ...core.model import GENESIS, Claim, Now
from ...core.rules import Decision
from ...core.state import State
from ...system import Clock, SystemClock, fork_safe_mutex
from ..base import SCHEMA_MIGRATIONS, SERVER_CLOCK, SHARED, Capabilities, Decide, VerifyReport
from ..file.faults import crash_point
from . import connection as pgc
from . import numbered
from .foresight import Foresight
from .guessed import NumberedWrites
from .journal import audit_row, claim_object, claim_row, import_journal, task_rows, verify_chain
from .schema import DEFAULT_SCHEMA, SCHEMA_VERSION, Queries, describe, parse_location
from .session import PgSession
from .tables import PgClaimView, PgTaskView

PAGE = 2000  # audit rows fetched per round trip when streaming the journal
MAX_ATTEMPTS = 5  # safe retries of one operation (nothing committed) before giving up
CACHE_MAX = 10_000  # claims kept per process between operations (re-checked by seq and eid)

#: where tests may crash the server or lose the connection (``faults.set_crash_hook``)
PG_CRASH_POINTS = (
    "pg.after_lock",  # head locked, rows read; nothing written
    "pg.before_commit",  # decided; the writes and COMMIT not yet sent
    "pg.commit_answer",  # COMMIT answered; a hook that raises here plays a lost answer
)


class _Retry(Exception):
    """Internal: the attempt did not commit; run the operation again."""

    def __init__(self, error: FleetclaimsError, *, fresh: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.fresh = fresh  # the outcome was just resolved: one more attempt is worth it


class _HeadWay(Exception):
    """Internal: a numbered write's decision needs more than its locked tasks; it is made
    again with the head row locked first."""


class _FlushFailed(psycopg.OperationalError):
    """Internal: the write transaction committed, the flush behind it answered an error."""


class PostgresStore(NumberedWrites, PgSession):
    """The store Protocol on PostgreSQL (psycopg 3). Thread-safe; fork-safe (a child opens its
    own connection)."""

    capabilities = Capabilities("postgres", frozenset({SHARED, SERVER_CLOCK, SCHEMA_MIGRATIONS}))

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        durability: str = "full",
        lock_timeout: float = 10.0,
        schema: str | None = None,
        connect_timeout: float | None = None,
        create: bool = True,
    ) -> None:
        if durability not in ("full", "process"):
            raise ValueError("durability must be 'full' or 'process'")
        self.conninfo, self.schema, self.location = parse_location(url, schema)
        self.clock = clock
        # Leases run on the database server's clock, so machines with skewed clocks agree. An
        # injected clock (anything but the default SystemClock, e.g. a test's FakeClock) is
        # honoured instead, exactly as the file store honours it.
        self.server_clock = clock is None or isinstance(clock, SystemClock)
        self.durability = durability
        self.lock_timeout = float(lock_timeout)
        self.connect_timeout = connect_timeout
        self.create = create  # False: a schema not there is refused (session.py), not made
        self._mutex = fork_safe_mutex(self)
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = -1
        self._schema_ok = False
        self._in_txn = False
        self._cache: dict[str, Claim] = {}
        self._head: tuple[int, int, str, str] = (0, 0, GENESIS, "")  # the last one seen
        self._wall = 0.0  # the server's clock at the last transaction
        self._wall_at = -1e9  # (time.monotonic() when it was read)
        self._watchdog = pgc.Watchdog()
        self._s = f'"{self.schema}"'
        self.sql = Queries(self._s)
        self._prepares, self._fast = self.sql.prepared()
        self._q = self.sql  # the write transaction's statements on this connection
        self._writes = 0  # write transactions begun on this connection
        # Full durability: while other writers are about, the write commits asynchronously
        # and a flush follows it (the head lock is not held across the fsync); alone, the write
        # commits synchronously itself (the flush would only add a transaction). _flush_after
        # is off where the flush cannot run (a role denied pg_logical_emit_message).
        self._flush_after = True
        self._crowded = False  # whether others wrote between our last two operations
        self._async = False  # whether this transaction's write was begun with an async commit
        # A write of one task is numbered by the server (numbered.py, guessed.py); with
        # FLEETCLAIMS_PG_NUMBERED=0 every write locks the head row first, as before schema 6.
        numbering = os.environ.get("FLEETCLAIMS_PG_NUMBERED") or "1"
        if numbering not in ("0", "1"):
            raise ValidationError("FLEETCLAIMS_PG_NUMBERED", "must be 0 or 1 (a value from the "
                                  "environment: fix or unset it)", value=numbering)
        self.numbering = numbering == "1"
        self._numbers: tuple[int, int, str, str] | None = None  # a lost answer's, as found
        self._keys: dict[str, int] = {}  # task -> its advisory lock key
        self._queued: set[str] = set()  # tasks last seen in the work queue
        self._guard: tuple[float, float] | None = None  # (guessed.py, while one is sent)

    def schema_version(self) -> int:
        rows = self.query(self.sql.version)
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    # --- the transaction ---------------------------------------------------------------------

    def transact(self, decide: Decide) -> tuple[Decision, State]:
        with self._mutex:
            deadline = time.monotonic() + self.budget
            attempt = 0
            head_way = False
            while True:
                attempt += 1
                conn = self._connection(deadline)
                self._prepare(conn, deadline)
                if self._conn is not conn:  # lost while preparing
                    conn = self._connection(deadline)
                try:
                    guess: Foresight | None
                    guess, now = self._guess(decide)
                    if attempt == 1 and not head_way and self._guessable(guess, now):
                        assert now is not None
                        done = self._attempt_guessed(conn, guess, now, deadline)
                        if done is not None:
                            return done
                        guess = None  # (spent: the copy was stale)
                    return self._attempt(conn, decide, deadline, head_way, guess)
                except _HeadWay:  # (rolled back; not a failure)
                    head_way = True
                    attempt -= 1
                except _Retry as retry:
                    self._drop_connection()
                    if attempt >= MAX_ATTEMPTS or (
                            time.monotonic() >= deadline and not retry.fresh):
                        raise retry.error from None
                    if retry.fresh:  # the server is back: give the retry a budget of its own
                        deadline = max(deadline, time.monotonic() + self.budget)
                    time.sleep(min(0.05 * attempt, max(0.0, deadline - time.monotonic())))

    def _attempt(
        self, conn: psycopg.Connection[Any], decide: Decide, deadline: float, head_way: bool,
        guess: Foresight | None,
    ) -> tuple[Decision, State]:
        committing = False
        first: tuple[int, str] | None = None  # (seq, line) of our first audit row
        if guess is None:
            guess = self._guess(decide)[0]
        keys = None if head_way else self._numbered_keys(guess)
        tpl: numbered.Template | None = None
        objs: list[dict[str, Any]] = []
        self._in_txn = True
        self._watchdog.arm(conn, deadline + pgc.GRACE_S)
        try:
            table, tasks, now, watch = self._begin(conn, guess.claims, guess.tasks, deadline,
                                                   keys)
            crash_point("pg.after_lock")
            seq, fence, head, origin = self._head
            state = State(table, seq, fence, head, origin, tasks)
            rows: list[tuple[Any, ...]] = []
            if state.seq == 0:  # a new registry: its first event names it
                created = {"type": ev.REGISTRY_CREATED, "origin": secrets.token_hex(8),
                           "actor": "fleetclaims"}
                rows += self._seal_apply(state, [created], now.wall)
            decision = decide(state, now)
            if decision.events:
                rows += self._seal_apply(state, list(decision.events), now.wall, objs)
            if watch is not None:  # numbered: only one event of the locked tasks
                tpl = (numbered.template(objs[0], str(rows[0][-1])) if len(rows) == 1 and objs
                       else None)
                if watch.strayed or tasks.dirty or len(rows) > 1 or (rows and (
                        tpl is None or table.dirty != {tpl.task})):
                    conn.execute("ROLLBACK")
                    raise _HeadWay
            if not rows:
                conn.execute("ROLLBACK")
                self._remember(table)
                return decision, state
            first = (int(rows[0][0]), str(rows[0][-1]))
            crash_point("pg.before_commit")
            committing = True  # from here a lost connection leaves the outcome to be found
            if tpl is None:
                self._write(conn, rows, table, tasks, state)
            else:
                self._numbers = self._write_numbered(conn, tpl, rows[0], table)
            crash_point("pg.commit_answer")
            committing = False
            return self._committed(decision, state, table, tpl, objs)
        except psycopg.Error as exc:
            failure = self._failure(conn, exc, committing, first, deadline, tpl)
            if failure is None:  # the COMMIT whose answer we lost did commit
                return self._committed(decision, state, table, tpl, objs)
            raise failure from None
        except BaseException:
            self._abandon(conn)
            raise
        finally:
            self._watchdog.disarm()
            self._in_txn = False

    def _begin(
        self, conn: psycopg.Connection[Any], claims: list[str], task_names: list[str],
        deadline: float, keys: list[int] | None,
    ) -> tuple[PgClaimView, PgTaskView, Now, numbered.Watch | None]:
        """Round trip 1: begin, set this transaction's limits, lock the head (or, a numbered
        write, its tasks: ``keys``), read the rows the decision is expected to look at; one
        message of statements (simple protocol)."""
        q = self._q
        batch = pgc.Batch(conn)
        batch.add("BEGIN")
        # (with full durability a synchronous commit only where _write cannot flush after it)
        self._async = not self.sync or (self._flush_after and self._crowded)
        limits = pgc.local_settings(not self._async, deadline - time.monotonic())
        if keys is None:
            batch.add(q.lock, limits)
        else:
            batch.add(q.peek, ("{" + ",".join(map(str, keys)) + "}", *limits))
        # One equality lookup per row (measured: far cheaper for the server to plan than one
        # statement joining an array of tasks); a claim row's JSON comes only when it differs
        # from our copy.
        for task in claims:
            cached = self._cache.get(task)
            batch.add(q.claim, (cached.seq, cached.eid, task) if cached is not None
                      else (-1, "", task))
        for name in task_names:
            batch.add(q.task, (name,))
        results = batch.run()
        row = results[1][0] if results[1] else None
        if row is None:
            raise RegistryCorrupt(self.location, "the head row of the journal is missing")
        seq, head, fence, origin = row[:4]
        server_wall = row[-1]
        # Another writer committed since our last operation: the head is contended.
        self._crowded = int(seq) != self._head[0]
        self._head = (int(seq), int(fence), str(head), str(origin))
        self._wall, self._wall_at = float(server_wall), time.monotonic()
        if self.server_clock or self.clock is None:
            now = Now(wall=float(server_wall), boot=None, boot_id="")
        else:
            now = self.clock.now()
        watch = None if keys is None else numbered.Watch(self)
        table = PgClaimView(watch or self)
        tasks = PgTaskView(watch or self)
        found: dict[str, Claim] = {}
        for task, rows in zip(claims, results[2:2 + len(claims)], strict=True):
            if rows:
                data = rows[0][0]
                hit = self._cache.get(task) if data is None else None
                found[task] = hit or self._claim_from(task, claim_object(self.location, task, data))
                self._cache_put(task, found[task])
        table.preload(claims, found)
        task_data = {name: orjson.loads(rows[0][0]) for name, rows in
                     zip(task_names, results[2 + len(claims):], strict=True) if rows}
        tasks.preload(task_names, task_data)
        self._queued.difference_update(task_names)  # (a guess over a queued task would be
        self._queued.update(task_data)  # refused: guessed.py)
        return table, tasks, now, watch

    def _write(self, conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]],
               table: PgClaimView, tasks: PgTaskView, state: State) -> None:
        """Round trip 2: the audit rows, the changed claim and task rows, the head, COMMIT;
        one message of statements."""
        q = self._q
        batch = pgc.Batch(conn)
        head = (state.seq, state.head, state.fence, state.origin)
        if len(rows) == 1 and len(table.dirty) == 1 and not tasks.dirty:
            (task,) = table.dirty
            batch.add(q.write1, (*rows[0], *claim_row(table, task), *head))
        else:
            for row in rows:
                batch.add(q.audit_insert, row)
            for task in sorted(table.dirty):
                batch.add(q.claim_upsert, claim_row(table, task))
            for task_row in task_rows(tasks):
                batch.add(q.task_upsert, task_row)
            batch.add(q.head_update, head)
        self._commit(batch)

    def _commit(self, batch: pgc.Batch) -> list[list[tuple[Any, ...]]]:
        """COMMIT the write in ``batch`` (with full durability and other writers about, an
        asynchronous COMMIT and a flush behind it); the write's answers."""
        q = self._q
        flush = self.sync and self._flush_after and self._crowded
        if self.sync and self._async != flush:  # (crowded or not since the lock was asked for)
            batch.add(q.commit_mode, ("off" if flush else "on",))
        batch.add("COMMIT")
        if not flush:
            return batch.run()
        committed = len(batch)  # answers up to and including the write's COMMIT
        # (the head lock is released before the flush: Queries.flush)
        batch.add("BEGIN")
        batch.add(q.flush)
        batch.add("COMMIT")
        try:
            return batch.run()
        except psycopg.Error as exc:
            if getattr(exc, "fc_answered", 0) >= committed:
                # The write committed and its flush failed: the outcome is found out as for a
                # lost COMMIT answer (and made durable) before the caller hears of it.
                if exc.sqlstate in ("42501", "42883"):  # not allowed here, or no such function
                    self._flush_after = False
                raise _FlushFailed(str(exc)) from exc
            raise

    def _seal_apply(
        self, state: State, events: Iterable[dict[str, Any]], ts: float,
        objs: list[dict[str, Any]] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Seal events onto the chain exactly as the file store does and apply them (each
        sealed event appended to ``objs``)."""
        rows: list[tuple[Any, ...]] = []
        for fields in events:
            obj = envelope(state.seq + 1, ts, fields, state.head)
            line, digest = seal(orjson.dumps(obj))
            obj["hash"] = digest
            ev.apply(state, obj)
            rows.append(audit_row(obj, digest, line[:-1].decode()))
            if objs is not None:
                objs.append(obj)
        return rows

    def _abandon(self, conn: psycopg.Connection[Any]) -> None:
        """Roll back after a non-database error (or drop a connection that is unusable)."""
        if conn.closed or conn.broken:
            self._drop_connection()
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._drop_connection()

    def _failure(
        self,
        conn: psycopg.Connection[Any],
        exc: psycopg.Error,
        committing: bool,
        first: tuple[int, str] | None,
        deadline: float,
        tpl: numbered.Template | None = None,
    ) -> BaseException | None:
        """Turn a database error into a typed error or a safe retry (``_Retry``); None when
        the connection was lost during COMMIT and the transaction turns out to have committed."""
        state = exc.sqlstate or ""
        if not pgc.is_lost(conn, exc) and not isinstance(exc, _FlushFailed):
            self._abandon(conn)
            # The server answered with an error, so the transaction (COMMIT included) did
            # not commit.
            if state in pgc.RETRY_STATES or state == "23505":
                return _Retry(pgc.typed(self.location, exc, self.budget))
            return self._typed(exc)
        reason = describe(exc)
        if self._watchdog.fired:
            reason = f"the server did not answer within {self.budget:g}s ({reason})"
        self._drop_connection()
        if not committing:
            # The session died before the writes were sent: the server rolled it back.
            return _Retry(StoreUnavailable(self.location, reason, committed=False))
        assert first is not None
        guarded = self._guard is not None
        outcome = self._resolve_commit(first, tpl)
        if outcome is True:
            return None
        if outcome is False:
            # (a write made in one round trip is resolved within the call's own budget: the
            # retry gets what is left of it, as a write lost before its COMMIT would)
            return _Retry(StoreUnavailable(self.location, reason, committed=False),
                          fresh=not guarded)
        return StoreUnavailable(
            self.location, f"the connection was lost during COMMIT ({reason}) and the server "
            + ("did not answer again within the budget" if guarded else
               f"stayed unreachable for {self.budget:g}s more"), committed=None,
            hint="Retry the same call once the server is back (claim with the same token= "
            "returns the claim if it was granted).")

    def _resolve_commit(self, first: tuple[int, str], tpl: numbered.Template | None
                        ) -> bool | None:
        """After losing the connection during COMMIT: did our transaction commit? Waits for a
        restarting server up to the budget. ``first``: our first line as sealed at the head
        we read (a numbered write's line, ``tpl``, is looked for among its task's lines after
        that head, and its numbers kept for ``_committed``)."""
        seq, line = first
        guard = self._guard  # a guessed write: (the latest server time it could pass, by when)
        deadline = time.monotonic() + self.budget if guard is None else guard[1]
        while True:
            try:
                conn = self._connection(deadline)
            except FleetclaimsError:
                return None
            self._watchdog.arm(conn, deadline + pgc.GRACE_S)
            try:
                # Behind the head lock: if the old session is still committing, we wait for
                # it to finish (or for the server to end it, idle in its transaction).
                batch = pgc.Batch(conn)
                batch.add("BEGIN")
                batch.add(self.sql.lock,
                          pgc.local_settings(self.sync, deadline - time.monotonic()))
                if tpl is None:
                    batch.add(self.sql.line_at, (seq,))
                else:
                    batch.add(self.sql.task_lines, (tpl.task, seq - 1))
                # A synchronous COMMIT (the row lock gave this transaction an xid) returns once
                # the WAL is flushed past the line found: an operation whose own flush answer
                # was lost is acknowledged only when durable.
                batch.add("COMMIT" if self.sync else "ROLLBACK")
                answers = batch.run()
                found = answers[2]
                if tpl is not None:
                    self._numbers = numbered.found(tpl, found, int(answers[1][0][2]))
                    if self._numbers is not None:
                        return True
                    # A guessed write not found behind the writers' lock has not begun (it
                    # would hold its task's lock); it can never pass its clock guard once the
                    # server's clock is past it. Before that, look again.
                    if guard is None or float(answers[1][0][-1]) > guard[0]:
                        return False
                    time.sleep(0.01)
                    continue
                return bool(found) and found[0][0] == line
            except psycopg.Error:
                self._abandon(conn)
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
            finally:
                self._watchdog.disarm()

    # --- reading -----------------------------------------------------------------------------

    def fetch_claim(self, task: str) -> Claim | None:
        """The committed claim row of ``task``; the row's JSON is sent and parsed only when it
        differs from the copy this process cached (same seq and event id)."""
        cached = self._cache.get(task)
        params = (cached.seq, cached.eid, task) if cached is not None else (-1, "", task)
        rows = self.query(self.sql.claim, params)
        if not rows:
            return None
        data = rows[0][0]
        if data is None and cached is not None:
            return cached
        claim = self._claim_from(task, claim_object(self.location, task, data))
        self._cache_put(task, claim)
        return claim

    def _cache_put(self, task: str, claim: Claim) -> None:
        if len(self._cache) >= CACHE_MAX and task not in self._cache:
            self._cache.clear()
        self._cache[task] = claim

    def _remember(self, table: PgClaimView) -> None:
        """After commit: keep the claims this transaction read or wrote for the next one."""
        for task, claim in table.loaded():
            self._cache_put(task, claim)

    def _claim_from(self, task: str, data: dict[str, Any]) -> Claim:
        try:
            return Claim.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryCorrupt(
                self.location, f"claim row {task!r} is malformed: {exc}"
            ) from None

    def read(self) -> State:
        """The latest committed head, with claim rows loaded when first looked at (each row
        read is the latest committed version of that task)."""
        rows = self.query(self.sql.head)
        if not rows:
            raise RegistryCorrupt(self.location, "the head row of the journal is missing")
        seq, head, fence, origin = rows[0]
        return State(PgClaimView(self), int(seq), int(fence), str(head), str(origin),
                     PgTaskView(self))

    def now(self) -> Now:
        """The clock leases are decided on: the database server's (or an injected clock)."""
        if not self.server_clock and self.clock is not None:
            return self.clock.now()
        rows = self.query(self.sql.server_time)
        return Now(wall=float(rows[0][0]), boot=None, boot_id="")

    def iter_lines(self, after: int = 0) -> Iterator[tuple[int, str]]:
        """(seq, sealed line without newline) for every committed event with seq > after,
        fetched a page at a time. Seq has no gaps, so the stream never skips an event."""
        cursor = after
        while True:
            rows = self.query(self.sql.lines, (cursor, PAGE))
            for seq, line in rows:
                yield int(seq), str(line)
            if len(rows) < PAGE:
                return
            cursor = int(rows[-1][0])

    def raw_lines(self, after: int = 0) -> Iterator[bytes]:
        """The journal as the file store writes it: sealed lines with their newline."""
        for _, line in self.iter_lines(after):
            yield line.encode() + b"\n"

    def iter_events(self, after: int = 0) -> Iterator[dict[str, Any]]:
        """Each audit row as an event, its seal checked as the file store checks every line it
        reads: a row edited outside fleetclaims (not JSON, or bytes its hash does not match)
        is AuditCorrupt naming it, never shown as history."""
        for seq, line in self.iter_lines(after):
            raw = line.encode()
            try:
                event = orjson.loads(raw)
                sound = (isinstance(event, dict) and event.get("seq") == seq
                         and check_seal(raw) == event.get("hash"))
            except (orjson.JSONDecodeError, ChainError):
                sound = False
            if not sound:
                raise AuditCorrupt(self.location, seq=seq, offset=0, reason=(
                    "the audit row does not verify (not JSON, its hash does not match its "
                    "bytes, or its seq is not the row's): it was changed outside fleetclaims; "
                    "`fleetclaims audit verify` names the first break"), hint=(
                    "Nothing was written. doctor repairs file registries only: restore the "
                    "database from a backup, or migrate the verified part out and review it."))
            yield event

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every audit row like ``audit verify`` checks audit.jsonl: each line's hash,
        seq continuity and prev links; offsets are the byte offsets the same journal has as a
        file. ``anchor_ok`` says whether the head row names the chain's last line."""
        rows = self.query(self.sql.head)
        head_row = (int(rows[0][0]), str(rows[0][1])) if rows else None
        return verify_chain(self.iter_lines(0), head_row, progress)

    # --- migration ---------------------------------------------------------------------------

    def import_events(self, lines: list[bytes]) -> None:
        """Store already-sealed lines (verbatim) into an empty registry, in one transaction."""
        self.import_lines(lines)

    def import_lines(self, lines: Iterable[bytes]) -> int:
        with self._mutex:
            conn = self._connection()
            self._in_txn = True
            try:
                return import_journal(conn, self, lines, self.location)
            except psycopg.Error as exc:
                self._abandon(conn)
                raise self._typed(exc) from None
            finally:
                self._in_txn = False


__all__ = ["DEFAULT_SCHEMA", "SCHEMA_VERSION", "PgClaimView", "PgTaskView", "PostgresStore",
           "parse_location"]
