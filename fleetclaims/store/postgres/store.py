"""The PostgreSQL store: the same registry, journal and hash chain, shared between machines.

Tables (in one schema per registry, default ``fleetclaims``; several registries can share a
database under different schema names):

- ``head``: one row (seq, head hash, last fence, origin). Every write transaction locks it
  ``FOR UPDATE`` first. That single lock serialises writers, so seq numbers are handed out
  gap-free and transactions commit in seq order: a reader that sees seq N sees every seq < N,
  which makes seq a safe event cursor (a SQL sequence would not be: it can be skipped while a
  writer is still in flight).
- ``audit``: one row per journal event holding the exact sealed line text (so the hash chain
  verifies byte for byte like the file store's ``audit.jsonl`` and a migration keeps every hash)
  plus seq/ts/type/task/owner/actor/fence/hash columns for filtering.
- ``claims``: the current record of each task (``Claim.to_dict`` as jsonb plus indexed
  columns), updated in the same transaction as the audit rows.
- ``schema_version``: the migrations applied (``migrate_schema()``).

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
import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

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
from ...core.model import GENESIS, Claim, ClaimTable, Now, State
from ...core.queue import Key, QueueIndex, Task, TaskTable
from ...core.rules import Decision
from ...system import Clock, SystemClock
from ..base import Decide, VerifyReport
from ..file.faults import crash_point
from ..file.journal import apply_checked, check_link, parse_line

SCHEMA_VERSION = 3
DEFAULT_SCHEMA = "fleetclaims"
SCHEMA_ENV = "FLEETCLAIMS_PG_SCHEMA"
PAGE = 2000  # audit rows fetched per round trip when streaming the journal
MAX_ATTEMPTS = 5  # safe retries of one operation (nothing committed) before giving up
IDLE_IN_TRANSACTION_S = 30  # the server ends a session stuck inside a transaction this long
CACHE_MAX = 10_000  # claims kept per process between operations (re-checked by seq and eid)

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_LOST_STATES = ("08", "57P")  # connection exceptions; admin/crash shutdown, cannot connect now
_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_BUSY_STATES = frozenset({"55P03", "57014"})  # lock_timeout, statement_timeout


def _migrations(s: str) -> dict[int, list[str]]:
    """Schema changes by version; ``s`` is the quoted schema name. Append, never edit."""
    return {
        1: [
            f"""CREATE TABLE {s}.head (
                id smallint PRIMARY KEY CHECK (id = 1),
                seq bigint NOT NULL CHECK (seq >= 0),
                head text NOT NULL,
                fence bigint NOT NULL CHECK (fence >= 0),
                origin text NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now())""",
            f"INSERT INTO {s}.head (id, seq, head, fence, origin) "
            f"VALUES (1, 0, '{GENESIS}', 0, '')",
            f"""CREATE TABLE {s}.audit (
                seq bigint PRIMARY KEY CHECK (seq > 0),
                ts double precision NOT NULL,
                type text NOT NULL,
                task text,
                owner text,
                actor text,
                fence bigint,
                hash text NOT NULL,
                line text NOT NULL)""",
            f"CREATE INDEX audit_task ON {s}.audit (task, seq)",
            f"CREATE INDEX audit_owner ON {s}.audit (owner, seq)",
            f"""CREATE TABLE {s}.claims (
                task text PRIMARY KEY,
                owner text NOT NULL,
                state text NOT NULL,
                fence bigint NOT NULL,
                expires_at double precision,
                seq bigint NOT NULL,
                data jsonb NOT NULL)""",
            f"CREATE INDEX claims_owner ON {s}.claims (owner)",
            f"CREATE INDEX claims_state ON {s}.claims (state, expires_at)",
            f"""CREATE FUNCTION {s}.head_guard() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.seq < OLD.seq OR NEW.fence < OLD.fence THEN
                    RAISE EXCEPTION 'fleetclaims: seq and fence never go back (% -> %, % -> %)',
                        OLD.seq, NEW.seq, OLD.fence, NEW.fence;
                END IF;
                RETURN NEW;
            END $$""",
            f"CREATE TRIGGER head_guard BEFORE UPDATE ON {s}.head "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.head_guard()",
            f"""CREATE FUNCTION {s}.audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'fleetclaims: the audit journal is append-only';
            END $$""",
            f"CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {s}.audit "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.audit_append_only()",
            f"COMMENT ON TABLE {s}.audit IS 'fleetclaims journal: one sealed, hash-chained "
            "line per event; seq is gap-free and commits in order'",
        ],
        2: [  # the work queue
            f"""CREATE TABLE {s}.tasks (
                task text PRIMARY KEY,
                seq bigint NOT NULL,
                data jsonb NOT NULL)""",
            # completing a task looks up its dependants without loading the whole queue
            f"CREATE INDEX tasks_depends_on ON {s}.tasks USING gin ((data->'depends_on'))",
        ],
        3: [  # claim_next walks the open tasks in hand-out order instead of sorting them all
            f"ALTER TABLE {s}.tasks ADD COLUMN done boolean NOT NULL DEFAULT false",
            f"UPDATE {s}.tasks t SET done = EXISTS (SELECT 1 FROM {s}.claims c "
            "WHERE c.task = t.task AND c.state = 'completed')",
            f"CREATE INDEX tasks_open ON {s}.tasks ({_TASK_KEY}) WHERE NOT done",
            # A task is done when its claim is completed: kept by the claims table itself, so
            # no writer (of any version of this schema) can forget it.
            f"""CREATE FUNCTION {s}.task_done() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE {s}.tasks SET done = (NEW.state = 'completed')
                 WHERE task = NEW.task AND done IS DISTINCT FROM (NEW.state = 'completed');
                RETURN NULL;
            END $$""",
            # (fired only when a claim becomes or stops being completed: claim and release,
            # the operations most often run, pay nothing)
            f"CREATE TRIGGER task_done AFTER INSERT ON {s}.claims FOR EACH ROW "
            f"WHEN (NEW.state = 'completed') EXECUTE FUNCTION {s}.task_done()",
            f"CREATE TRIGGER task_undone AFTER UPDATE OF state ON {s}.claims FOR EACH ROW "
            "WHEN (OLD.state IS DISTINCT FROM NEW.state AND "
            "(OLD.state = 'completed' OR NEW.state = 'completed')) "
            f"EXECUTE FUNCTION {s}.task_done()",
            f"""CREATE FUNCTION {s}.task_added() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                NEW.done := EXISTS (SELECT 1 FROM {s}.claims c
                                     WHERE c.task = NEW.task AND c.state = 'completed');
                RETURN NEW;
            END $$""",
            f"CREATE TRIGGER task_added BEFORE INSERT ON {s}.tasks "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.task_added()",
        ],
    }


# A task's place in hand-out order (queue.Key: priority, added_at, then the id by code point;
# COLLATE "C" is byte order, the same as code point order in UTF-8). The same expressions in
# the index and in the query, so the server walks the index.
_TASK_KEY = ("((data->>'priority')::bigint), ((data->>'added_at')::float8), "
             '(task COLLATE "C")')


def parse_location(url: str, schema: str | None = None) -> tuple[str, str, str]:
    """(libpq conninfo, schema, display location) for a ``postgresql://`` URL.

    The schema comes from the argument, else the URL's ``?schema=``, else ``FLEETCLAIMS_PG_SCHEMA``,
    else ``fleetclaims``. The display location has no password and names the schema, so it can
    be passed back to ``Registry`` (the password then comes from PGPASSWORD or ~/.pgpass).
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    chosen = schema or (from_url[-1] if from_url else None) or os.environ.get(SCHEMA_ENV) or (
        DEFAULT_SCHEMA
    )
    if not _SCHEMA_RE.match(chosen):
        from ...core.errors import ValidationError

        raise ValidationError(
            "schema", "must be 1-63 characters of a-z, 0-9 and _, not starting with a digit",
            value=chosen,
        )
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = userinfo.split(":", 1)[0] + "@" + hostport
    shown = urlunsplit(
        (parts.scheme, netloc, parts.path, urlencode([*rest, ("schema", chosen)]), "")
    )
    return conninfo, chosen, shown


class _Retry(Exception):
    """Internal: the attempt failed before anything could commit; run the operation again."""

    def __init__(self, error: FleetclaimsError) -> None:
        super().__init__(str(error))
        self.error = error


class _LazyRows:
    """What both database-backed tables share: a row is fetched on first use, a missing one is
    remembered as absent, the whole table is fetched once when a caller needs all of it, and
    ``dirty`` names the rows changed by applied events (upserted at commit). (No __slots__:
    two slotted bases cannot be combined; the tables are short-lived, one per transaction.)"""

    _store: PostgresStore
    _absent: set[str]
    _complete: bool
    _raw: dict[str, Any]
    dirty: set[str]

    def _start(self, store: PostgresStore, complete: bool) -> None:
        self._store = store
        self._absent = set()
        self._complete = complete
        self.dirty = set()

    def _in_memory(self, task: str) -> bool:
        raise NotImplementedError

    def _fetch_rows(self) -> Iterable[tuple[str, Any]]:
        raise NotImplementedError

    def _load_all(self) -> None:
        if self._complete:
            return
        for task, data in self._fetch_rows():
            if not self._in_memory(task):
                self._raw[task] = data
        self._absent.clear()
        self._complete = True

    def _changed(self, task: str) -> None:
        self._absent.discard(task)
        self.dirty.add(task)


class PgClaimTable(_LazyRows, ClaimTable):
    """A ClaimTable that loads claim rows from the database on first use.

    Inside a write transaction the rows come from that transaction (under the head lock, so
    they are exactly the state at ``seq``); afterwards a lookup of a task not loaded yet reads
    the latest committed row. ``dirty`` names the tasks changed by applied events.
    """

    __slots__ = ("_absent", "_complete", "_store", "dirty")

    def __init__(self, store: PostgresStore, *, complete: bool = False) -> None:
        ClaimTable.__init__(self)
        self._start(store, complete)

    def _in_memory(self, task: str) -> bool:
        return task in self._claims or task in self._raw

    def _fetch_rows(self) -> Iterable[tuple[str, Any]]:
        return self._store._fetch_all_claims()

    def get(self, task: str) -> Claim | None:
        claim = self._claims.get(task)
        if claim is not None or task in self._raw:
            return claim if claim is not None else super().get(task)
        if self._complete or task in self._absent:
            return None
        claim = self._store._fetch_claim(task)
        if claim is None:
            self._absent.add(task)
            return None
        self._claims[task] = claim
        return claim

    def __setitem__(self, task: str, claim: Claim) -> None:
        super().__setitem__(task, claim)
        self._changed(task)

    def __contains__(self, task: object) -> bool:
        return isinstance(task, str) and self.get(task) is not None

    def __len__(self) -> int:
        self._load_all()
        return super().__len__()

    def tasks(self) -> list[str]:
        self._load_all()
        return super().tasks()

    def values(self) -> Iterator[Claim]:
        self._load_all()
        return super().values()

    def materialize(self) -> None:
        self._load_all()
        super().materialize()

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        self._load_all()
        return super().raw_items()

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        self._load_all()
        return super().data_items()

    def copy(self) -> ClaimTable:
        self._load_all()
        return super().copy()


class PgTaskTable(_LazyRows, TaskTable):
    """The work queue's TaskTable over the ``tasks`` table: one row on ``get``; the whole
    table (and every claim row) when the ready index is needed (``claim_next``, ``ready``).
    ``dirty`` names the tasks changed by applied events."""

    __slots__ = ("_absent", "_complete", "_store", "dirty")

    def __init__(self, store: PostgresStore, *, complete: bool = False) -> None:
        TaskTable.__init__(self)
        self._start(store, complete)

    def _in_memory(self, task: str) -> bool:
        return task in self._tasks or task in self._raw

    def _fetch_rows(self) -> Iterable[tuple[str, Any]]:
        return [(str(task), orjson.loads(data))
                for task, data in self._store._query(self._store._sql_tasks)]

    def get(self, task: str) -> Task | None:
        if task in self._tasks or task in self._raw:
            return super().get(task)
        if self._complete or task in self._absent:
            return None
        rows = self._store._query(self._store._sql_task, (task,))
        if not rows:
            self._absent.add(task)
            return None
        self._raw[task] = orjson.loads(rows[0][0])
        return super().get(task)

    def put(self, record: Task, claims: ClaimTable) -> None:
        super().put(record, claims)
        self._changed(record.task)

    def __contains__(self, task: object) -> bool:
        return isinstance(task, str) and self.get(task) is not None

    def __len__(self) -> int:
        self._load_all()
        return super().__len__()

    def names(self) -> list[str]:
        self._load_all()
        return super().names()

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        self._load_all()
        return super().raw_items()

    def copy(self) -> TaskTable:
        self._load_all()
        return super().copy()

    def index(self, claims: ClaimTable) -> QueueIndex:
        if self._index is None:
            self._load_all()
            if isinstance(claims, PgClaimTable):
                claims._load_all()  # one query, not one per task
        return super().index(claims)

    def candidates(self, claims: ClaimTable, take_stale: bool,
                   labels: frozenset[str] = frozenset()) -> Iterator[tuple[Key, bool]]:
        """The candidates from the database, a page at a time, in hand-out order: the server
        works out readiness with its indexes, so ``claim_next`` does not load the queue (with
        the whole queue in memory already, the in-memory index is used)."""
        if self._index is not None or self._complete:
            return super().candidates(claims, take_stale, labels)
        return self._candidates_sql(take_stale, labels)

    def _candidates_sql(self, take_stale: bool,
                        labels: frozenset[str]) -> Iterator[tuple[Key, bool]]:
        store = self._store
        wanted = orjson.dumps(sorted(labels)).decode()
        after: Key = (-(1 << 62), float("-inf"), "")
        page = 16
        while True:
            rows = store._query(store._sql_candidates, (wanted, *after, page))
            for task, data, held, ready, priority, added_at in rows:
                after = (int(priority), float(added_at), str(task))
                if not ready or (held and not take_stale):
                    continue
                if not self._in_memory(after[2]):
                    self._raw[after[2]] = orjson.loads(data)
                record = self.get(after[2])
                if record is not None:
                    yield record.key, bool(held)
            if len(rows) < page:
                return
            page = min(page * 4, 1024)

    def ready_keys(self, claims: ClaimTable) -> list[Key]:
        return list(self.index(claims).ready)

    def dependants(self, task: str, claims: ClaimTable) -> list[str]:
        if self._index is not None:
            return super().dependants(task, claims)
        rows = self._store._query(self._store._sql_dependants, (task,))
        return sorted(str(r[0]) for r in rows)


class PostgresStore:
    """The store Protocol on PostgreSQL (psycopg 3). Thread-safe; fork-safe (a child opens its
    own connection)."""

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
        s = f'"{self.schema}"'
        self._s = s
        self._sql_head_lock = (
            f"SELECT seq, head, fence, origin, extract(epoch FROM clock_timestamp())::float8 "
            f"FROM {s}.head WHERE id = 1 FOR UPDATE"
        )
        self._sql_head = f"SELECT seq, head, fence, origin FROM {s}.head WHERE id = 1"
        self._sql_claim = (
            f"SELECT CASE WHEN seq = %s AND data->>'eid' = %s THEN NULL ELSE data::text END "
            f"FROM {s}.claims WHERE task = %s"
        )
        self._sql_claims = f"SELECT task, data::text FROM {s}.claims ORDER BY task"
        self._sql_task = f"SELECT data::text FROM {s}.tasks WHERE task = %s"
        self._sql_tasks = f"SELECT task, data::text FROM {s}.tasks ORDER BY task"
        self._sql_dependants = f"SELECT task FROM {s}.tasks WHERE data->'depends_on' ? %s"
        # claim_next's candidates (queue.TaskTable.candidates): the open tasks (not done) after
        # the last key seen, in hand-out order, a page at a time: the server walks the index
        # tasks_open and stops at the page's end. For each, whether a live claim holds it and
        # whether it is otherwise ready (not blocked, every dependency completed, the labels
        # asked for); the caller skips the rest but pages on from the last task walked.
        inner = _TASK_KEY
        outer = _TASK_KEY.replace("data->", "t.data->").replace("(task ", "(t.task ")
        self._sql_candidates = (
            "SELECT t.task, t.data::text, coalesce(c.state IN ('active', 'expired'), false), "
            "jsonb_typeof(t.data->'blocked') IS DISTINCT FROM 'string' "
            "AND c.state IS DISTINCT FROM 'completed' "
            "AND coalesce(t.data->'labels', '[]'::jsonb) @> %s::jsonb "
            "AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(t.data->'depends_on') d "
            f"WHERE NOT EXISTS (SELECT 1 FROM {s}.claims u WHERE u.task = d.value "
            "AND u.state = 'completed')), "
            "(t.data->>'priority')::bigint, (t.data->>'added_at')::float8 "
            f"FROM (SELECT task, data FROM {s}.tasks WHERE NOT done "
            f"AND ({inner}) > (%s, %s, %s COLLATE \"C\") ORDER BY {inner} LIMIT %s) t "
            f"LEFT JOIN {s}.claims c ON c.task = t.task ORDER BY {outer}"
        )
        self._sql_task_upsert = (
            f"INSERT INTO {s}.tasks (task, seq, data) VALUES (%s, %s, %s::jsonb) "
            "ON CONFLICT (task) DO UPDATE SET seq = EXCLUDED.seq, data = EXCLUDED.data"
        )
        self._sql_audit_insert = (
            f"INSERT INTO {s}.audit (seq, ts, type, task, owner, actor, fence, hash, line) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self._sql_claim_upsert = (
            f"INSERT INTO {s}.claims (task, owner, state, fence, expires_at, seq, data) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT (task) DO UPDATE SET "
            "owner = EXCLUDED.owner, state = EXCLUDED.state, fence = EXCLUDED.fence, "
            "expires_at = EXCLUDED.expires_at, seq = EXCLUDED.seq, data = EXCLUDED.data"
        )
        self._sql_head_update = (
            f"UPDATE {s}.head SET seq = %s, head = %s, fence = %s, origin = %s, "
            "updated_at = now() WHERE id = 1"
        )
        self._sql_lines = f"SELECT seq, line FROM {s}.audit WHERE seq > %s ORDER BY seq LIMIT %s"
        self._sql_line_at = f"SELECT line FROM {s}.audit WHERE seq = %s"

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
                    raise StoreUnavailable(self.location, _describe(exc), committed=False) from None
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
        try:
            row = conn.execute(f"SELECT max(version) FROM {self._s}.schema_version").fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            version = 0
        if version > SCHEMA_VERSION:
            raise RegistryCorrupt(
                self.location,
                f"schema {self.schema!r} is at version {version}, newer than this fleetclaims "
                f"understands ({SCHEMA_VERSION})",
                hint="Upgrade fleetclaims on this machine.",
            )
        if version < SCHEMA_VERSION:
            self._migrate(conn)
        self._schema_ok = True

    def migrate_schema(self) -> int:
        """Create or upgrade this registry's schema; returns the schema version now in place.
        Safe to run concurrently (an advisory lock serialises migrations)."""
        with self._mutex:
            conn = self._connection()
            return self._migrate(conn)

    def schema_version(self) -> int:
        rows = self._query(f"SELECT max(version) FROM {self._s}.schema_version")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    def _migrate(self, conn: psycopg.Connection[Any]) -> int:
        key = int.from_bytes(
            hashlib.sha256(f"fleetclaims-schema:{self.schema}".encode()).digest()[:8], "big",
            signed=True,
        )
        s = self._s
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer PRIMARY KEY, "
                    "applied_at timestamptz NOT NULL DEFAULT now(), by_version text NOT NULL)"
                )
                row = conn.execute(f"SELECT max(version) FROM {s}.schema_version").fetchone()
                current = int(row[0]) if row and row[0] is not None else 0
                from ... import __version__

                for version, statements in sorted(_migrations(s).items()):
                    if version <= current:
                        continue
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {s}.schema_version (version, by_version) VALUES (%s, %s)",
                        (version, __version__),
                    )
                    current = version
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreUnavailable(
                self.location,
                f"not allowed to create schema {self.schema!r}: {_describe(exc)} (ask the "
                "database owner to run `fleetclaims db migrate` or grant CREATE)",
                committed=False,
            ) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(self.location, _describe(exc), committed=False) from None
        self._schema_ok = True
        return current

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
            row = conn.execute(self._sql_head_lock).fetchone()
            if row is None:
                raise RegistryCorrupt(self.location, "the head row of the journal is missing")
            seq, head, fence, origin, server_wall = row
            if self.server_clock or self.clock is None:
                now = Now(wall=float(server_wall), boot=None, boot_id="")
            else:
                now = self.clock.now()
            wall = now.wall
            table = PgClaimTable(self)
            tasks = PgTaskTable(self)
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
                cur.execute(self._sql_audit_insert, audit_row)
            for claim_row in upserts:
                cur.execute(self._sql_claim_upsert, claim_row)
            for task_row in self._task_rows(tasks):
                cur.execute(self._sql_task_upsert, task_row)
            cur.execute(self._sql_head_update, (state.seq, state.head, state.fence, state.origin))
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

    def _claim_row(self, table: ClaimTable, task: str) -> tuple[Any, ...]:
        claim = table.get(task)
        assert claim is not None
        return (task, claim.owner, claim.state, claim.fence, claim.expires_at, claim.seq,
                orjson.dumps(claim.to_dict()).decode())

    @staticmethod
    def _task_rows(tasks: PgTaskTable) -> list[tuple[Any, ...]]:
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
                return _Retry(RegistryBusy(self.location, self.lock_timeout, _describe(exc)))
            if state in ("42P01", "3F000"):
                self._schema_ok = False
                return RegistryCorrupt(self.location, f"the registry tables are missing: "
                                       f"{_describe(exc)}",
                                       hint="Run `fleetclaims db migrate` (the journal is gone "
                                       "if the schema was dropped).")
            return StoreUnavailable(self.location, _describe(exc), committed=False)
        self._drop_connection()
        if not committing:
            # The session died before COMMIT was sent: the server rolled it back.
            return _Retry(StoreUnavailable(self.location, _describe(exc), committed=False))
        assert first is not None
        outcome = self._resolve_commit(first, deadline)
        if outcome is True:
            return None
        if outcome is False:
            return _Retry(StoreUnavailable(self.location, _describe(exc), committed=False))
        return StoreUnavailable(self.location, f"connection lost during COMMIT "
                                f"({_describe(exc)})", committed=None)

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
                conn.execute(self._sql_head_lock).fetchone()
                row = conn.execute(self._sql_line_at, (seq,)).fetchone()
        except psycopg.Error:
            self._drop_connection()
            return None
        return row is not None and row[0] == line

    # --- reading -----------------------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
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
                    raise StoreUnavailable(self.location, _describe(exc),
                                           committed=False) from None

    def _fetch_claim(self, task: str) -> Claim | None:
        """The committed claim row of ``task``; the row's JSON is sent and parsed only when it
        differs from the copy this process cached (same seq and event id)."""
        cached = self._cache.get(task)
        params = (cached.seq, cached.eid, task) if cached is not None else (-1, "", task)
        rows = self._query(self._sql_claim, params)
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

    def _remember(self, table: PgClaimTable) -> None:
        """After commit: keep the claims this transaction read or wrote for the next one."""
        for task, claim in table._claims.items():
            self._cache_put(task, claim)

    def _fetch_all_claims(self) -> list[tuple[str, Any]]:
        rows = self._query(self._sql_claims)
        return [(str(task), orjson.loads(data)) for task, data in rows]

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
        rows = self._query(self._sql_head)
        if not rows:
            raise RegistryCorrupt(self.location, "the head row of the journal is missing")
        seq, head, fence, origin = rows[0]
        return State(PgClaimTable(self), int(seq), int(fence), str(head), str(origin),
                     PgTaskTable(self))

    def now(self) -> Now:
        """The clock leases are decided on: the database server's (or an injected clock)."""
        if not self.server_clock and self.clock is not None:
            return self.clock.now()
        rows = self._query("SELECT extract(epoch FROM clock_timestamp())::float8")
        return Now(wall=float(rows[0][0]), boot=None, boot_id="")

    def iter_lines(self, after: int = 0) -> Iterator[tuple[int, str]]:
        """(seq, sealed line without newline) for every committed event with seq > after,
        fetched a page at a time. Seq has no gaps, so the stream never skips an event."""
        cursor = after
        while True:
            rows = self._query(self._sql_lines, (cursor, PAGE))
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
        rows = self._query(self._sql_head)
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
                    row = conn.execute(self._sql_head_lock).fetchone()
                    count = conn.execute(f"SELECT count(*) FROM {self._s}.audit").fetchone()
                    if row is None or int(row[0]) != 0 or (count and int(count[0]) != 0):
                        raise ValidationError(
                            "target", f"{self.location} already holds a registry; migrate into "
                            "an empty schema")
                    table = PgClaimTable(self, complete=True)
                    tasks = PgTaskTable(self, complete=True)
                    state = State(table, tasks=tasks)
                    where = f"{self.location} (import)"
                    offset = 0
                    with conn.cursor().copy(
                        f"COPY {self._s}.audit (seq, ts, type, task, owner, actor, fence, hash, "
                        "line) FROM STDIN"
                    ) as copy:
                        for raw in lines:
                            line = raw[:-1] if raw.endswith(b"\n") else raw
                            event = parse_line(line, seq=state.seq + 1, prev=state.head,
                                               offset=offset, path=where)
                            apply_checked(state, event, offset, where)
                            copy.write_row(_audit_row(event, state.head, line.decode()))
                            offset += len(line) + 1
                    upserts = [self._claim_row(table, task) for task in sorted(table.dirty)]
                    if upserts:
                        conn.cursor().executemany(self._sql_claim_upsert, upserts)
                    task_rows = self._task_rows(tasks)
                    if task_rows:
                        conn.cursor().executemany(self._sql_task_upsert, task_rows)
                    conn.execute(self._sql_head_update,
                                 (state.seq, state.head, state.fence, state.origin))
            except psycopg.Error as exc:
                self._abandon(conn)
                raise StoreUnavailable(self.location, _describe(exc), committed=False) from None
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


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    return f"{first} (SQLSTATE {state})" if state else first


__all__ = ["DEFAULT_SCHEMA", "SCHEMA_VERSION", "PgClaimTable", "PgTaskTable", "PostgresStore",
           "parse_location"]
