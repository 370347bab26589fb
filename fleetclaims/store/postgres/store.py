"""The PostgreSQL store: the same registry, journal and hash chain, shared between machines.

The schema (tables, versions, upgrades, statements) is in ``schema.py``; the claim and task
views the core decides over, by composition over SQL rows, are in ``tables.py``.

One operation is one transaction: lock the head row, read the clock of the database server (so
workstations with skewed clocks agree on leases), read the task rows the decision asks for, let
``core`` decide, insert the audit rows, upsert the changed claim rows, advance the head, commit.

Failures are typed. Nothing can have committed before COMMIT is sent, so a connection lost
before then (a server restart, a dropped network) is retried on a new connection while the
``lock_timeout`` budget lasts, then reported as ``StoreUnavailable(committed=False)``. A
connection lost during COMMIT is resolved by reconnecting and looking for our own first audit
line (behind the head lock, so an in-flight commit of the old session finishes first): found
means the change committed and the call succeeds, absent means it did not and the operation is
retried; unresolvable gives ``StoreUnavailable(committed=None)``. Lock and statement timeouts
give ``RegistryBusy``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import psycopg

from ...core import events as ev
from ...core.chain import ChainError, envelope, seal
from ...core.errors import (
    FleetclaimsError,
    RegistryBusy,
    RegistryCorrupt,
    StoreUnavailable,
    ValidationError,
)
from ...core.model import GENESIS, Claim, Now
from ...core.ports import ClaimView
from ...core.rules import Decision
from ...core.state import State
from ...system import Clock, SystemClock
from ..base import SCHEMA_MIGRATIONS, SERVER_CLOCK, SHARED, Capabilities, Decide, VerifyReport
from ..file.faults import crash_point
from ..file.journal import apply_checked, check_link, parse_line
from .schema import (
    DEFAULT_SCHEMA,
    SCHEMA_VERSION,
    Queries,
    check_version,
    describe,
    installed_version,
    migrate,
    parse_location,
)
from .tables import PgClaimView, PgTaskView

PAGE = 2000  # audit rows fetched per round trip when streaming the journal
MAX_ATTEMPTS = 5  # safe retries of one operation (nothing committed) before giving up
IDLE_IN_TRANSACTION_S = 30  # the server ends a session stuck inside a transaction this long
CACHE_MAX = 10_000  # claims kept per process between operations (re-checked by seq and eid)

_LOST_STATES = ("08", "57P")  # connection exceptions; admin/crash shutdown, cannot connect now
_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_BUSY_STATES = frozenset({"55P03", "57014"})  # lock_timeout, statement_timeout


class _Retry(Exception):
    """Internal: the attempt failed before anything could commit; run the operation again."""

    def __init__(self, error: FleetclaimsError) -> None:
        super().__init__(str(error))
        self.error = error


class PostgresStore:
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
        self._mutex = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = -1
        self._schema_ok = False
        self._in_txn = False
        self._cache: dict[str, Claim] = {}
        self._s = f'"{self.schema}"'
        self.sql = Queries(self._s)

    # --- connections -------------------------------------------------------------------------

    @property
    def sync(self) -> bool:
        return self.durability == "full"

    def _connect(self) -> psycopg.Connection[Any]:
        timeout = self.connect_timeout
        if timeout is None:
            timeout = min(max(self.lock_timeout, 2.0), 10.0)
        conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=max(2, int(timeout)),
            application_name="fleetclaims",
        )
        try:
            lock_ms = max(1, int(self.lock_timeout * 1000))
            conn.execute(
                "SELECT set_config('synchronous_commit', %s, false), "
                "set_config('lock_timeout', %s, false), "
                "set_config('statement_timeout', %s, false), "
                "set_config('idle_in_transaction_session_timeout', %s, false), "
                "set_config('client_encoding', 'UTF8', false)",
                ("on" if self.sync else "off", f"{lock_ms}ms",
                 f"{lock_ms + 30_000}ms", f"{IDLE_IN_TRANSACTION_S * 1000}ms"),
            )
        except BaseException:
            conn.close()
            raise
        return conn

    def _connection(self, deadline: float | None = None) -> psycopg.Connection[Any]:
        """The open connection of this process, (re)connecting until ``deadline``."""
        pid = os.getpid()
        if self._pid != pid:
            # A forked child must not touch the parent's session: forget it (psycopg does not
            # close a connection inherited across fork).
            self._conn = None
            self._pid = pid
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._drop_connection()
        if deadline is None:
            deadline = time.monotonic() + max(self.lock_timeout, 1.0)
        delay = 0.05
        while True:
            try:
                conn = self._connect()
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() + delay >= deadline:
                    raise StoreUnavailable(self.location, describe(exc), committed=False) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        self._conn = conn
        if not self._schema_ok:
            self._ensure_schema(conn)
        return conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        with self._mutex:
            self._drop_connection()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()

    # --- schema ------------------------------------------------------------------------------

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        version = installed_version(conn, self._s)
        check_version(version, self.schema, self.location)
        if version < SCHEMA_VERSION:
            migrate(conn, self.schema, self.location)
        self._schema_ok = True

    def migrate_schema(self) -> int:
        """Create or upgrade this registry's schema; returns the schema version now in place.
        Safe to run concurrently (an advisory lock serialises migrations)."""
        with self._mutex:
            conn = self._connection()
            version = migrate(conn, self.schema, self.location)
            self._schema_ok = True
            return version

    def schema_version(self) -> int:
        rows = self.query(self.sql.version)
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    # --- the transaction ---------------------------------------------------------------------

    def transact(self, decide: Decide) -> tuple[Decision, State]:
        with self._mutex:
            deadline = time.monotonic() + max(self.lock_timeout, 1.0)
            attempt = 0
            while True:
                attempt += 1
                conn = self._connection(deadline)
                try:
                    return self._attempt(conn, decide, deadline)
                except _Retry as retry:
                    self._drop_connection()
                    if attempt >= MAX_ATTEMPTS or time.monotonic() >= deadline:
                        raise retry.error from None
                    time.sleep(min(0.05 * attempt, max(0.0, deadline - time.monotonic())))

    def _attempt(
        self, conn: psycopg.Connection[Any], decide: Decide, deadline: float
    ) -> tuple[Decision, State]:
        committing = False
        first: tuple[int, str] | None = None  # (seq, line) of our first audit row
        self._in_txn = True
        try:
            conn.execute("BEGIN")
            row = conn.execute(self.sql.head_lock).fetchone()
            if row is None:
                raise RegistryCorrupt(self.location, "the head row of the journal is missing")
            seq, head, fence, origin, server_wall = row
            if self.server_clock or self.clock is None:
                now = Now(wall=float(server_wall), boot=None, boot_id="")
            else:
                now = self.clock.now()
            wall = now.wall
            table = PgClaimView(self)
            tasks = PgTaskView(self)
            state = State(table, int(seq), int(fence), str(head), str(origin), tasks)
            rows: list[tuple[Any, ...]] = []
            if state.seq == 0:  # a new registry: its first event names it
                created = {"type": ev.REGISTRY_CREATED, "origin": secrets.token_hex(8),
                           "actor": "fleetclaims"}
                rows += self._seal_apply(state, [created], float(wall))
            decision = decide(state, now)
            if decision.events:
                rows += self._seal_apply(state, list(decision.events), float(wall))
            if not rows:
                conn.execute("ROLLBACK")
                self._remember(table)
                return decision, state
            first = (int(rows[0][0]), str(rows[0][-1]))
            upserts = [self._claim_row(table, task) for task in sorted(table.dirty)]
            cur = conn.cursor()
            for audit_row in rows:
                cur.execute(self.sql.audit_insert, audit_row)
            for claim_row in upserts:
                cur.execute(self.sql.claim_upsert, claim_row)
            for task_row in self._task_rows(tasks):
                cur.execute(self.sql.task_upsert, task_row)
            cur.execute(self.sql.head_update, (state.seq, state.head, state.fence, state.origin))
            crash_point("pg.before_commit")
            committing = True
            conn.execute("COMMIT")
            committing = False
            self._remember(table)
            crash_point("pg.after_commit")
            return decision, state
        except psycopg.Error as exc:
            failure = self._failure(conn, exc, committing, first, deadline)
            if failure is None:  # the COMMIT whose answer we lost did commit
                self._remember(table)
                return decision, state
            raise failure from None
        except BaseException:
            self._abandon(conn)
            raise
        finally:
            self._in_txn = False

    def _seal_apply(
        self, state: State, events: Iterable[dict[str, Any]], ts: float
    ) -> list[tuple[Any, ...]]:
        """Seal events onto the chain exactly as the file store does and apply them."""
        rows: list[tuple[Any, ...]] = []
        for fields in events:
            obj = envelope(state.seq + 1, ts, fields, state.head)
            line, digest = seal(orjson.dumps(obj))
            obj["hash"] = digest
            ev.apply(state, obj)
            rows.append(_audit_row(obj, digest, line[:-1].decode()))
        return rows

    def _claim_row(self, table: ClaimView, task: str) -> tuple[Any, ...]:
        claim = table.get(task)
        assert claim is not None
        return (task, claim.owner, claim.state, claim.fence, claim.expires_at, claim.seq,
                orjson.dumps(claim.to_dict()).decode())

    @staticmethod
    def _task_rows(tasks: PgTaskView) -> list[tuple[Any, ...]]:
        rows = []
        for name in sorted(tasks.dirty):
            record = tasks.get(name)
            assert record is not None
            rows.append((name, record.seq, orjson.dumps(record.to_dict()).decode()))
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
    ) -> BaseException | None:
        """Turn a database error into a typed error or a safe retry (``_Retry``); None when
        the connection was lost during COMMIT and the transaction turns out to have committed."""
        state = exc.sqlstate or ""
        lost = conn.closed or conn.broken or state.startswith(_LOST_STATES) or (
            isinstance(exc, psycopg.OperationalError) and not state
        )
        if not lost:
            self._abandon(conn)
            # The server answered with an error, so the transaction (COMMIT included) did
            # not commit.
            if state in _BUSY_STATES:
                return RegistryBusy(self.location, self.lock_timeout, "another writer")
            if state in _RETRY_STATES or state == "23505":
                return _Retry(RegistryBusy(self.location, self.lock_timeout, describe(exc)))
            if state in ("42P01", "3F000"):
                self._schema_ok = False
                return RegistryCorrupt(self.location, f"the registry tables are missing: "
                                       f"{describe(exc)}",
                                       hint="Run `fleetclaims db migrate` (the journal is gone "
                                       "if the schema was dropped).")
            return StoreUnavailable(self.location, describe(exc), committed=False)
        self._drop_connection()
        if not committing:
            # The session died before COMMIT was sent: the server rolled it back.
            return _Retry(StoreUnavailable(self.location, describe(exc), committed=False))
        assert first is not None
        outcome = self._resolve_commit(first, deadline)
        if outcome is True:
            return None
        if outcome is False:
            return _Retry(StoreUnavailable(self.location, describe(exc), committed=False))
        return StoreUnavailable(self.location, f"connection lost during COMMIT "
                                f"({describe(exc)})", committed=None)

    def _resolve_commit(self, first: tuple[int, str], deadline: float) -> bool | None:
        """After losing the connection during COMMIT: did our transaction commit?"""
        seq, line = first
        try:
            conn = self._connection(max(deadline, time.monotonic() + 2.0))
        except FleetclaimsError:
            return None
        try:
            with conn.transaction():
                # Behind the head lock: if the old session is still committing, we wait for it.
                conn.execute(self.sql.head_lock).fetchone()
                row = conn.execute(self.sql.line_at, (seq,)).fetchone()
        except psycopg.Error:
            self._drop_connection()
            return None
        return row is not None and row[0] == line

    # --- reading -----------------------------------------------------------------------------

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one read-only statement. Inside a write transaction it runs there (errors go to
        the transaction's handler); otherwise on its own, reconnecting while the lock_timeout
        budget lasts when the connection was lost (a read is always safe to repeat)."""
        with self._mutex:
            if self._in_txn:
                return self._require_conn().execute(sql, params).fetchall()
            deadline = time.monotonic() + max(self.lock_timeout, 1.0)
            while True:
                conn = self._connection(deadline)
                try:
                    return conn.execute(sql, params).fetchall()
                except psycopg.Error as exc:
                    state = exc.sqlstate or ""
                    lost = conn.closed or conn.broken or state.startswith(_LOST_STATES)
                    if lost:
                        self._drop_connection()
                        if time.monotonic() < deadline:
                            continue
                    if state in _BUSY_STATES:
                        raise RegistryBusy(self.location, self.lock_timeout,
                                           "a slow query") from None
                    if state in ("42P01", "3F000"):
                        self._schema_ok = False
                    raise StoreUnavailable(self.location, describe(exc),
                                           committed=False) from None

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
        loaded = orjson.loads(data)
        if not isinstance(loaded, dict):
            raise RegistryCorrupt(self.location, f"claim row {task!r} is not an object")
        claim = self._claim_from(task, loaded)
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

    def _require_conn(self) -> psycopg.Connection[Any]:
        assert self._conn is not None
        return self._conn

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
        for _, line in self.iter_lines(after):
            event = orjson.loads(line)
            assert isinstance(event, dict)
            yield event

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Check every audit row like ``audit verify`` checks audit.jsonl: each line's hash,
        seq continuity and prev links; offsets are the byte offsets the same journal has as a
        file. ``anchor_ok`` says whether the head row names the chain's last line."""
        rows = self.query(self.sql.head)
        head_row = (int(rows[0][0]), str(rows[0][1])) if rows else None
        total = head_row[0] if head_row else 0
        seq = 0
        prev = GENESIS
        offset = 0
        for found, text in self.iter_lines(0):
            line = text.encode()
            expected = seq + 1
            try:
                if found != expected:
                    raise ChainError(f"expected seq {expected}, found {found}")
                digest = check_link(line, expected, prev)
            except (ChainError, orjson.JSONDecodeError) as exc:
                return VerifyReport(False, seq, offset, prev, str(exc), expected, offset, None)
            seq = expected
            prev = digest
            offset += len(line) + 1
            if progress is not None and seq % 65536 == 0:
                progress(seq, max(total, seq))
        if progress is not None:
            progress(seq, seq)
        anchor_ok = head_row is not None and head_row == (seq, prev)
        error = None
        if not anchor_ok:
            error = (f"head row: the head row says seq {head_row[0] if head_row else None} but "
                     f"the journal ends at seq {seq}")
        return VerifyReport(True, seq, offset, prev, error, None, None, anchor_ok)

    # --- migration ---------------------------------------------------------------------------

    def import_events(self, lines: list[bytes]) -> None:
        """Store a whole journal of already-sealed lines (verbatim) into an empty registry,
        checking the chain and rebuilding the claim rows, in one transaction."""
        self.import_lines(lines)

    def import_lines(self, lines: Iterable[bytes]) -> int:
        with self._mutex:
            conn = self._connection()
            self._in_txn = True
            try:
                with conn.transaction():
                    row = conn.execute(self.sql.head_lock).fetchone()
                    count = conn.execute(self.sql.audit_count).fetchone()
                    if row is None or int(row[0]) != 0 or (count and int(count[0]) != 0):
                        raise ValidationError(
                            "target", f"{self.location} already holds a registry; migrate into "
                            "an empty schema")
                    table = PgClaimView(self, complete=True)
                    tasks = PgTaskView(self, complete=True)
                    state = State(table, tasks=tasks)
                    where = f"{self.location} (import)"
                    offset = 0
                    with conn.cursor().copy(self.sql.audit_copy) as copy:
                        for raw in lines:
                            line = raw[:-1] if raw.endswith(b"\n") else raw
                            event = parse_line(line, seq=state.seq + 1, prev=state.head,
                                               offset=offset, path=where)
                            apply_checked(state, event, offset, where)
                            copy.write_row(_audit_row(event, state.head, line.decode()))
                            offset += len(line) + 1
                    upserts = [self._claim_row(table, task) for task in sorted(table.dirty)]
                    if upserts:
                        conn.cursor().executemany(self.sql.claim_upsert, upserts)
                    task_rows = self._task_rows(tasks)
                    if task_rows:
                        conn.cursor().executemany(self.sql.task_upsert, task_rows)
                    conn.execute(self.sql.head_update,
                                 (state.seq, state.head, state.fence, state.origin))
            except psycopg.Error as exc:
                self._abandon(conn)
                raise StoreUnavailable(self.location, describe(exc), committed=False) from None
            finally:
                self._in_txn = False
            return state.seq


def _audit_row(event: dict[str, Any], digest: str, line: str) -> tuple[Any, ...]:
    def text(key: str) -> str | None:
        value = event.get(key)
        return value if isinstance(value, str) else None

    fence = event.get("fence")
    return (
        int(event["seq"]), float(event["ts"]), str(event["type"]), text("task"), text("owner"),
        text("actor"), fence if isinstance(fence, int) and not isinstance(fence, bool) else None,
        digest, line,
    )


__all__ = ["DEFAULT_SCHEMA", "SCHEMA_VERSION", "PgClaimView", "PgTaskView", "PostgresStore",
           "parse_location"]
