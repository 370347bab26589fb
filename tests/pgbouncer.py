"""A throwaway PgBouncer in transaction pooling mode in front of the tests' PostgreSQL server.

``start_pgbouncer(server)`` writes a configuration into a temporary directory and runs
``pgbouncer`` on a free port of 127.0.0.1 (as the ``postgres`` OS user when we are root:
PgBouncer refuses to run as root), pooling every database of ``server`` with
``pool_mode = transaction``: each transaction may run on another server connection, so any
session state a client relied on would be lost (or leak into another client's session).
``stop()`` ends it and removes the directory. Tests skip when ``pgbouncer`` is not installed
(Debian: ``apt-get install pgbouncer``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pg_server import RUN_AS, PgServer, free_port


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/local/bin/pgbouncer") if os.access(p, os.X_OK)),
        None)


class PgBouncer:
    def __init__(self, binary: str, server: PgServer, *, pool_size: int = 5) -> None:
        self.server = server
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fleetclaims-pgbouncer-"))
        (self.root / "users.txt").write_text(f'"{server.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
        )
        command = [binary, str(self.root / "pgbouncer.ini")]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam(RUN_AS)
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            command = ["runuser", "-u", RUN_AS, "--", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.process.returncode}): "
                                   f"{self.read_log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen within 10 s: {self.read_log()}")

    def read_log(self) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.server.user}@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        if self.process.poll() is None:
            try:  # PgBouncer's own pid (runuser's child): SIGTERM is its immediate shutdown
                pid = int((self.root / "pgbouncer.pid").read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def start_pgbouncer(server: PgServer, *, pool_size: int = 5) -> PgBouncer:
    """Start PgBouncer in front of ``server``; LookupError when it is not installed."""
    binary = find_pgbouncer()
    if binary is None:
        raise LookupError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    return PgBouncer(binary, server, pool_size=pool_size)
