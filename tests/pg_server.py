"""A throwaway PostgreSQL server for the tests (and the benchmark).

``PgServer`` runs ``initdb`` into a fresh temporary directory and starts ``postgres`` on
127.0.0.1 (a free port; the unix socket lives in the temporary directory too), as the
``postgres`` OS user when we are root (PostgreSQL refuses to run as root). ``stop()`` shuts it
down and removes the directory. ``crash()`` / ``start()`` kill and restart it for the
server-restart tests. ``back_to`` puts a registry's schema back to an earlier version, for
the upgrade tests.

The session fixture ``postgres_url`` yields a URL for one such server; tests skip with a clear
reason only when no server binaries are installed (searched on PATH and in
/usr/lib/postgresql/*/bin, /usr/local/pgsql/bin, the Homebrew prefixes).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fleetclaims.system import pid_exists

if TYPE_CHECKING:
    import psycopg

RUN_AS = "postgres"
_BINARIES = ("initdb", "pg_ctl", "postgres")


def find_bin_dir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres; the newest version wins."""
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    env = os.environ.get("FLEETCLAIMS_PG_BIN")
    if env:
        candidates.insert(0, Path(env))

    def version(path: str) -> tuple[int, ...]:
        parts = Path(path).parts
        for part in reversed(parts):
            if part.replace(".", "").isdigit():
                return tuple(int(p) for p in part.split(".") if p)
        return (0,)

    patterns = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin",
                "/opt/homebrew/opt/postgresql*/bin", "/usr/local/opt/postgresql*/bin",
                "/usr/local/pgsql/bin")
    for pattern in patterns:
        for path in sorted(glob.glob(pattern), key=version, reverse=True):
            candidates.append(Path(path))
    for directory in candidates:
        if all((directory / name).is_file() and os.access(directory / name, os.X_OK)
               for name in _BINARIES):
            return directory
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster in a temporary directory, listening on 127.0.0.1 only."""

    def __init__(self, bin_dir: Path, *, fsync: bool = True, options: str = "") -> None:
        self.bin_dir = bin_dir
        self.fsync = fsync
        self.options = options  # more server settings ("-c name=value ...")
        self.root = Path(tempfile.mkdtemp(prefix="fleetclaims-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "server.log"
        self.port = 0
        self.user = "postgres"
        self.as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self._initdb()

    # --- running commands as the server's user -----------------------------------------------

    def _cmd(self, *args: str) -> list[str]:
        if not self.as_root:
            return list(args)
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", RUN_AS, "--", *args]
        return ["su", RUN_AS, "-s", "/bin/sh", "-c", " ".join(_quote(a) for a in args)]

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=self.root)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")

    def _initdb(self) -> None:
        self.sockets.mkdir()
        if self.as_root:
            import pwd

            pw = pwd.getpwnam(RUN_AS)
            for path in (self.root, self.sockets):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(self.root, 0o700)
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.user,
                  "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, attempts: int = 5) -> None:
        last: Exception | None = None
        for _ in range(attempts):
            if not self.port:
                self.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sockets} "
                f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=60 "
                f"-c shared_buffers=32MB -c logging_collector=off {self.options}"
            )
            try:
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-o", options, "-w", "-t", "60", "start")
                return
            except RuntimeError as exc:
                last = exc
                self.port = 0  # probably lost the race for the port: pick another
        raise RuntimeError(f"could not start PostgreSQL: {last}\n{self.read_log()}")

    def stop(self, mode: str = "fast") -> None:
        if self.postmaster_pid() is None:
            return
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "-t", "60", "stop")

    def crash(self) -> None:
        """Stop as a crash does: every server process dies at once, no checkpoint."""
        self.stop("immediate")

    def kill9(self) -> None:
        """SIGKILL the postmaster (its backends notice and exit); the next start recovers."""
        pid = self.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and pid_exists(pid):
                time.sleep(0.02)
        # The shared memory and socket lock files are cleaned up by the next start.

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        pid = int(first)
        return pid if pid_exists(pid) else None

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        try:
            self.stop("fast")
        except (RuntimeError, subprocess.TimeoutExpired):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def start_server(*, fsync: bool = True, options: str = "") -> PgServer:
    """Start a throwaway server; raises LookupError when no server binaries are installed."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise LookupError(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or in "
            "/usr/lib/postgresql/*/bin; install Debian's `postgresql` package"
        )
    server = PgServer(bin_dir, fsync=fsync, options=options)
    try:
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL server for the whole test session, removed at the end."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'fleetclaims[postgres]')")
    yield from serve()


def serve(options: str = "") -> Iterator[PgServer]:
    """The body of a fixture: a throwaway server (``options``: more settings), skipping the
    test where no server binaries are installed, removed when the fixture ends."""
    try:
        server = start_server(options=options)
    except LookupError as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def postgres_url(pg_server: PgServer) -> str:
    """URL of a database on the session's throwaway PostgreSQL server."""
    return pg_server.create_database("fleetclaims_test")


def back_to(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    """Put a registry's schema back to ``version`` (3, 4 or 5) as an earlier fleetclaims left
    it: before 6, the head guard that does not ask writers for their protocol and no ``prev``
    column; before 5, the grants inline in each claim row again, no ring, no rn/rlen columns,
    the claims table's owner and state indexes back."""
    s = f'"{schema}"'
    conn.execute(f"ALTER TABLE {s}.head DROP COLUMN prev")
    from fleetclaims.store.postgres.schema import migrations

    # (schema 1's head guard, as it stood until schema 6 replaced it)
    guard = next(st for st in migrations(s)[1] if "head_guard() RETURNS" in st)
    conn.execute(guard.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    if version == 5:
        conn.execute(f"DELETE FROM {s}.schema_version WHERE version > 5")
        return
    conn.execute(f"ALTER TABLE {s}.claims DROP CONSTRAINT grants_in_ring")
    conn.execute(
        f"UPDATE {s}.claims c SET data = c.data || jsonb_build_object('retired', "
        f"(SELECT jsonb_agg(r.data ORDER BY r.ord) FROM {s}.retired r WHERE r.task = c.task "
        "AND r.ord > c.rn - c.rlen AND r.ord <= c.rn)) WHERE c.rlen > 0")
    conn.execute(f"DROP TABLE {s}.retired")
    conn.execute(f"ALTER TABLE {s}.claims DROP COLUMN rn, DROP COLUMN rlen")
    conn.execute(f"CREATE INDEX claims_owner ON {s}.claims (owner)")
    conn.execute(f"CREATE INDEX claims_state ON {s}.claims (state, expires_at)")
    if version < 4:
        conn.execute(f"ALTER TABLE {s}.claims RESET (toast_tuple_target)")
    conn.execute(f"DELETE FROM {s}.schema_version WHERE version > %s", (version,))
