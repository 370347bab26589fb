"""Connections to the PostgreSQL registry: bounded waits and typed failures.

Everything here holds for a server reached directly and through PgBouncer in transaction
pooling mode, so nothing is session state: the settings a transaction needs (synchronous
commit, lock and statement timeouts) are sent with each transaction as ``set_config(...,
true)`` (SET LOCAL), TCP keepalives and the connect timeout are options of the client's
socket, and statements are prepared (SQL PREPARE, run by EXECUTE inside ``Batch``'s two
messages) only on a connection that is a server session of its own (``direct``): PgBouncer
before 1.21 cannot route prepared statements, and psycopg's own need one protocol message per
statement.

Waits are bounded by one budget, the ``lock_timeout`` the file store uses for its lock
(``FLEETCLAIMS_LOCK_TIMEOUT``): the server enforces it as lock_timeout (a writer holding the
journal head: ``RegistryBusy``) and statement_timeout; a server that cannot enforce anything
(a frozen process, a network that stopped forwarding) is cut off by the client's ``Watchdog``,
which shuts the socket down when the budget has run out, so the blocked call returns.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Any

import psycopg
from psycopg.generators import execute as _execute

from ...core.errors import (
    AccessDenied,
    FleetclaimsError,
    RegistryBusy,
    SchemaMismatch,
    StoreOverloaded,
    StoreReadOnly,
    StoreUnavailable,
)
from ...system import shutdown_socket
from .schema import describe

#: connection exceptions, admin/crash shutdown, cannot connect now: the session is gone
LOST_STATES = ("08", "57P")
RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock
BUSY_STATES = frozenset({"55P03"})  # lock_not_available (lock_timeout)
TIMEOUT_STATES = frozenset({"57014"})  # query_canceled (statement_timeout)
MISSING_STATES = frozenset({"42P01", "3F000", "42883"})  # no table, no schema, no function
GRACE_S = 0.5  # how long past the budget the watchdog waits for the server's own timeout


def connect(conninfo: str, budget: float) -> psycopg.Connection[Any]:
    """A new autocommit connection. ``budget`` bounds the connect (libpq counts whole seconds,
    at least 2) and sets the TCP keepalives and user timeout, so a dead peer is noticed by the
    kernel too, even while no statement runs."""
    seconds = max(2, int(budget + 0.999))
    idle = max(1, min(int(budget / 2) or 1, 30))
    return psycopg.connect(
        conninfo,
        autocommit=True,
        prepare_threshold=None,  # psycopg prepares nothing itself (see above)
        connect_timeout=seconds,
        keepalives=1,
        keepalives_idle=idle,
        keepalives_interval=1,
        keepalives_count=max(2, int(budget) // 2 or 2),
        tcp_user_timeout=int(max(budget, 1.0) * 1000),
        application_name="fleetclaims",
    )


def local_settings(sync: bool, remaining: float) -> tuple[str, ...]:
    """The parameters of ``Queries.settings``, this transaction's settings (SET LOCAL:
    nothing outlives it).

    The idle-in-transaction limit matters as much as the others: a client whose network died
    while it held the head lock leaves a session that waits for its next statement; the
    server ends it (releasing the lock) once it has idled as long as the budget, instead of
    holding every other writer up until TCP gives up."""
    lock_ms = max(1, int(remaining * 1000))
    return ("on" if sync else "off", f"{lock_ms}ms", f"{lock_ms + int(GRACE_S * 500)}ms",
            f"{lock_ms + int(GRACE_S * 1000)}ms")


def direct(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` is a server session of its own (not a pooler's client connection).

    A pooler such as PgBouncer hands a client a cancel key of its own making, so the backend
    pid libpq was told at login is not the pid of the server process that runs the statement.
    Only a direct session may keep prepared statements from one transaction to the next."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and int(row[0]) == conn.info.backend_pid


def prepare(conn: psycopg.Connection[Any], statements: str) -> bool:
    """Run ``statements`` (PREPAREs) when ``conn`` is a session of its own; whether it is."""
    if not direct(conn):
        return False
    batch = Batch(conn)
    batch.add(statements)
    batch.run()
    return True


class Batch:
    """Statements sent as one message and answered together (one round trip).

    One simple-protocol message: measured on a local server, psycopg's pipeline mode costs
    more client CPU than it saves (2,100 against 3,000 transactions/s for BEGIN, SELECT FOR
    UPDATE, UPDATE, COMMIT sent one by one), while the same statements as one message reach
    3,500. The values are written as SQL literals by ``literal`` (numbers, NULL, and strings
    as E'' literals, so the server's standard_conforming_strings does not matter), and the
    answers are read straight from libpq's results as text: the cursor's machinery
    (adaptation, a description and loaders per result) was half the client's time per
    operation. ``run`` returns each statement's rows in order.
    """

    __slots__ = ("_conn", "_parts")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._parts: list[str] = []

    def __len__(self) -> int:
        """Statements added (each ``add`` of one statement is answered by one result)."""
        return len(self._parts)

    def add(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self._parts.append(sql % tuple(map(literal, params)) if params else sql)

    def run(self) -> list[list[tuple[Any, ...]]]:
        conn = self._conn
        encoding = conn.info.encoding
        query = "; ".join(self._parts).encode(encoding)
        with conn.lock:
            conn.pgconn.send_query(query)
            results = conn.wait(_execute(conn.pgconn))
        out: list[list[tuple[Any, ...]]] = []
        for res in results:
            status = res.status
            if status == _TUPLES_OK:
                width = range(res.nfields)
                out.append([tuple(_text(res.get_value(row, col), encoding) for col in width)
                            for row in range(res.ntuples)])
            elif status == _FATAL_ERROR:
                error = psycopg.errors.error_from_result(res, encoding=encoding)
                # How many statements had completed before this one (the message stopped here):
                # a transaction whose COMMIT came before it did commit.
                error.fc_answered = len(out)  # type: ignore[attr-defined]
                raise error
            else:
                out.append([])
        return out


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
_FATAL_ERROR = psycopg.pq.ExecStatus.FATAL_ERROR


def _text(value: bytes | None, encoding: str) -> str | None:
    return None if value is None else bytes(value).decode(encoding)


def literal(value: Any) -> str:
    """``value`` as an SQL literal: None, bool, int, float and str (what the store sends)."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        if "\\" in text:
            return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
        return "'" + text.replace("'", "''") + "'" if "'" in text else "'" + text + "'"
    if kind is int:
        return str(value)
    if value is None:
        return "NULL"
    if kind is float:
        if math.isfinite(value):
            return repr(value)
        return "'NaN'" if math.isnan(value) else ("'Infinity'" if value > 0 else "'-Infinity'")
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):  # a subclass: as its base type
        return literal((str if isinstance(value, str) else float if isinstance(value, float)
                        else int)(value))
    raise TypeError(f"no SQL literal for {type(value).__name__}")


class Watchdog:
    """Cuts a connection off when the call running on it outlives its deadline.

    One daemon thread per store, started by the first ``arm`` (and again after ``stop`` or in
    a forked child). ``arm`` and ``disarm`` take a lock and rarely wake the thread: it sleeps
    to the armed deadline (at most ``TICK``) and re-reads it, so the hot path costs two
    uncontended lock round trips.
    """

    TICK = 0.25

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._conn: psycopg.Connection[Any] | None = None
        self._deadline = 0.0
        # True only while the thread waits without a timeout (arm must wake it). It used to
        # start True, and a thread started by arm with a connection set waits with a timeout,
        # so it stayed True while operations ran back to back: every arm woke the thread
        # (measured: ~2 more context switches per operation, 3.5-3.8 against 1.55).
        self._idle = False
        self._owner: tuple[int, int] | None = None  # (pid, generation) of the running thread
        self._generation = 0
        self.fired = False

    def arm(self, conn: psycopg.Connection[Any], deadline: float) -> None:
        with self._cond:
            if self._owner is None or self._owner[0] != os.getpid():
                self._generation += 1
                self._owner = (os.getpid(), self._generation)
                threading.Thread(target=self._run, args=(self._owner,), daemon=True,
                                 name="fleetclaims-pg-watchdog").start()
                self._idle = False  # (the new thread reads _conn before it first waits)
            self._conn = conn
            self._deadline = deadline
            self.fired = False
            if self._idle:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._conn = None

    def stop(self) -> None:
        """End the thread."""
        with self._cond:
            self._conn = None
            self._owner = None
            self._cond.notify_all()

    def _run(self, owner: tuple[int, int]) -> None:
        with self._cond:
            while self._owner == owner:
                conn = self._conn
                if conn is None:
                    self._idle = True
                    self._cond.wait()
                    if self._owner == owner:  # (a stopped thread leaves the flag to its heir)
                        self._idle = False
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(min(left, self.TICK))
                    continue
                self.fired = True
                self._conn = None
                _shutdown(conn)


def _shutdown(conn: psycopg.Connection[Any]) -> None:
    """Make a call blocked on ``conn`` return: shut its socket down (the descriptor stays
    psycopg's; shutdown acts on the socket behind every descriptor of it)."""
    with contextlib.suppress(OSError, psycopg.Error, ValueError):
        shutdown_socket(conn.pgconn.socket)


def is_lost(conn: psycopg.Connection[Any] | None, exc: psycopg.Error) -> bool:
    """Whether the session is gone (so the server rolled back whatever had not committed)."""
    state = exc.sqlstate or ""
    if conn is not None and (conn.closed or conn.broken):
        return True
    return state.startswith(LOST_STATES) or (
        isinstance(exc, psycopg.OperationalError) and not state)


def connect_error(where: str, exc: psycopg.Error) -> FleetclaimsError | None:
    """The typed error for a failed connect, or None when it is worth retrying."""
    text = str(exc)
    state = exc.sqlstate or ""
    if state == "53300" or "too many clients" in text or "too many connections" in text \
            or "no more connections allowed" in text:
        return StoreOverloaded(where, describe(exc))
    if state in ("28000", "28P01", "42501") or "authentication failed" in text \
            or "permission denied" in text:
        return AccessDenied(where, describe(exc), hint="Check the user name and password "
                            "(PGPASSWORD, ~/.pgpass) and the role's CONNECT right.")
    if 'role "' in text and "does not exist" in text:
        return AccessDenied(where, describe(exc), hint="The server has no such role: fix the "
                            "user name in the URL (or PGUSER), or ask the database owner to "
                            "CREATE ROLE it WITH LOGIN.")
    if state == "3D000" or ("database" in text and "does not exist" in text):
        return StoreUnavailable(where, describe(exc), hint="Create the database first "
                                "(createdb), or fix the database name in the URL.")
    return None


def typed(where: str, exc: psycopg.Error, budget: float) -> FleetclaimsError:
    """The typed error for a statement the server refused (nothing committed)."""
    state = exc.sqlstate or ""
    if state in BUSY_STATES:
        return RegistryBusy(where, budget, "another writer")
    if state in TIMEOUT_STATES:
        return StoreUnavailable(where, f"the server did not finish within {budget:g}s "
                                f"({describe(exc)})", hint="The server is overloaded or a "
                                "statement is stuck; retry, or raise lock_timeout "
                                "(FLEETCLAIMS_LOCK_TIMEOUT).")
    if state == "25006":
        return StoreReadOnly(where, describe(exc))
    if state == "42501":
        return AccessDenied(where, describe(exc), hint="Ask the database owner to GRANT this "
                            "role USAGE on the registry's schema and SELECT, INSERT, UPDATE on "
                            "its tables (or use the role that ran `fleetclaims db migrate`).")
    if state in MISSING_STATES:
        return missing_schema(where, describe(exc))
    if state == "53300":
        return StoreOverloaded(where, describe(exc))
    return StoreUnavailable(where, describe(exc))


def missing_schema(where: str, reason: str) -> SchemaMismatch:
    return SchemaMismatch(where, f"the registry's tables are missing: {reason}",
                          hint="Run `fleetclaims db migrate` to create them (if the schema "
                          "was dropped, its journal is gone: restore it from a backup).")
