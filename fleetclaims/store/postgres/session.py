"""The PostgreSQL store's session: its one connection per process, (re)connected within the
``lock_timeout`` budget, its statements prepared on a direct session, the schema checked or
migrated on connecting, errors typed, and single read-only statements (``query``). The
transaction protocol on top of it is ``store.py``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import psycopg

from ...core.errors import FleetclaimsError, RegistryNotFound, StoreUnavailable
from . import connection as pgc
from . import schema as pgs
from .schema import SCHEMA_VERSION, Queries, describe

PREPARE_AFTER = 3  # a connection's statements are prepared before its third write


class PgSession:
    """The connection side of ``PostgresStore`` (which sets these attributes up)."""

    location: str
    schema: str
    conninfo: str
    durability: str
    lock_timeout: float
    connect_timeout: float | None
    create: bool
    sql: Queries
    _s: str
    _mutex: threading.RLock
    _conn: psycopg.Connection[Any] | None
    _pid: int
    _schema_ok: bool
    _in_txn: bool
    _watchdog: pgc.Watchdog
    _prepares: str
    _fast: Queries
    _q: Queries  # the write transaction's statements on this connection
    _writes: int  # write transactions begun on this connection

    # --- connections -------------------------------------------------------------------------

    @property
    def sync(self) -> bool:
        return self.durability == "full"

    @property
    def budget(self) -> float:
        """Seconds one operation may wait in all (FLEETCLAIMS_LOCK_TIMEOUT, lock_timeout=)."""
        return max(self.lock_timeout, 1.0)

    def _connection(self, deadline: float | None = None) -> psycopg.Connection[Any]:
        """The open connection of this process, (re)connecting until ``deadline``."""
        pid = os.getpid()
        if self._pid != pid:
            # A forked child must not touch the parent's session: forget it (psycopg does not
            # close a connection inherited across fork), and the watchdog (its lock may have
            # been held by the parent's thread at the fork).
            self._conn = None
            self._pid = pid
            self._watchdog = pgc.Watchdog()
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._drop_connection()
        if deadline is None:
            deadline = time.monotonic() + self.budget
        delay = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                conn = pgc.connect(self.conninfo, self.connect_timeout or max(left, 0.1))
                break
            except psycopg.OperationalError as exc:
                typed = pgc.connect_error(self.location, exc)
                if typed is not None and not isinstance(typed, StoreUnavailable):
                    raise typed from None
                if time.monotonic() + delay >= deadline:
                    raise typed or StoreUnavailable(self.location, describe(exc)) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        self._conn = conn
        self._watchdog.arm(conn, max(deadline, time.monotonic() + 1.0) + pgc.GRACE_S)
        try:
            if not self._schema_ok:  # (checked again on every new connection until it passes)
                self._ensure_schema(conn)
        except psycopg.Error as exc:
            self._drop_connection()
            raise self._typed(exc) from None
        except BaseException:
            self._drop_connection()
            raise
        finally:
            self._watchdog.disarm()
        return conn

    def _prepare(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        """Before the PREPARE_AFTER-th write on a connection that is its own server session,
        prepare the write transaction's statements (parsed and planned once instead of on
        every operation: the larger part of the server's time per operation; a short command
        writing once does not pay for it). Through a pooler (PgBouncer in transaction mode)
        the next transaction may run in another session: nothing is prepared there."""
        self._writes += 1
        if self._writes != PREPARE_AFTER:
            return
        self._watchdog.arm(conn, deadline + pgc.GRACE_S)
        try:
            if pgc.prepare(conn, self._prepares):
                self._q = self._fast
        except psycopg.Error:
            self._drop_connection()  # (nothing was written: the caller connects again)
        finally:
            self._watchdog.disarm()

    def _typed(self, exc: psycopg.Error) -> FleetclaimsError:
        if self._watchdog.fired:
            return StoreUnavailable(self.location, f"the server did not answer within "
                                    f"{self.budget:g}s ({describe(exc)})")
        if (exc.sqlstate or "") in pgc.MISSING_STATES:
            self._schema_ok = False
        return pgc.typed(self.location, exc, self.budget)

    def _drop_connection(self) -> None:
        self._q = self.sql
        self._writes = 0
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        with self._mutex:
            self._drop_connection()
            self._watchdog.stop()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()

    # --- schema ------------------------------------------------------------------------------

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        version = pgs.installed_version(conn, self._s)
        pgs.check_version(version, self.schema, self.location)
        if version == 0 and not self.create:
            raise RegistryNotFound(self.location, f"the database has no fleetclaims schema "
                                   f"{self.schema!r} (a misspelt ?schema= or "
                                   "FLEETCLAIMS_PG_SCHEMA?); `fleetclaims db migrate` or a "
                                   "first write creates it")
        if version < SCHEMA_VERSION:
            pgs.migrate(conn, self.schema, self.location)
        self._schema_ok = True

    def migrate_schema(self) -> int:
        """Create or upgrade this registry's schema; returns the schema version now in place.
        Safe to run concurrently (an advisory lock serialises migrations)."""
        with self._mutex:
            conn = self._connection()
            version = pgs.migrate(conn, self.schema, self.location)
            self._schema_ok = True
            return version

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one read-only statement. Inside a write transaction it runs there (errors go to
        the transaction's handler); otherwise on its own, reconnecting while the lock_timeout
        budget lasts when the connection was lost (a read is always safe to repeat), and cut
        off by the watchdog when the server does not answer within the budget."""
        with self._mutex:
            if self._in_txn:
                return self._require_conn().execute(sql, params).fetchall()
            try:
                return self._query_alone(sql, params)
            except StoreUnavailable as exc:
                raise exc.as_read() from None  # (no write transaction: "not committed" misleads)

    def _query_alone(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """``query`` outside a transaction (the caller holds the mutex)."""
        deadline = time.monotonic() + self.budget
        while True:
            conn = self._connection(deadline)
            self._watchdog.arm(conn, deadline + pgc.GRACE_S)
            try:
                return conn.execute(sql, params).fetchall()
            except psycopg.Error as exc:
                if pgc.is_lost(conn, exc):
                    error = self._typed(exc)
                    self._drop_connection()
                    if time.monotonic() < deadline:
                        continue
                    raise error from None
                raise self._typed(exc) from None
            finally:
                self._watchdog.disarm()

    def _require_conn(self) -> psycopg.Connection[Any]:
        assert self._conn is not None
        return self._conn
