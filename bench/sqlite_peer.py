"""The SQLite peer for the benchmark: what a user would write instead of fleetclaims.

One table of claims and one of audit rows, WAL mode, ``synchronous=FULL`` (compared with
``durability="full"``) or ``NORMAL`` (compared with ``durability="process"``), ``BEGIN IMMEDIATE``
per operation, and the same claim/release rules as fleetclaims' core for the cycle workload:

- claim: a live claim (active, lease not expired) of another token is rejected, and the
  rejection is written to the audit table in the same transaction (then ``ClaimConflict``);
  otherwise the claim row is (re)written with a new fence and a ``claim_created`` audit row.
- release: only the holder's token releases; a ``claim_released`` audit row is written.

Tokens are random secrets stored only as SHA-256 hashes, as in fleetclaims, so both sides pay
for the same hashing. SQLite's own busy handler (``timeout=``) waits for the write lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    task        TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    token_hash  TEXT NOT NULL,
    fence       INTEGER NOT NULL,
    state       TEXT NOT NULL,
    claimed_at  REAL NOT NULL,
    expires_at  REAL,
    ttl         REAL,
    ended_at    REAL
);
CREATE TABLE IF NOT EXISTS audit (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    ts          REAL NOT NULL,
    type        TEXT NOT NULL,
    task        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    owner       TEXT,
    fence       INTEGER,
    token_hash  TEXT,
    detail      TEXT
);
CREATE TABLE IF NOT EXISTS meta (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    fence       INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, fence) VALUES (1, 0);
"""


class ClaimConflict(Exception):
    def __init__(self, task: str, holder: str, expires_at: float | None, reason: str) -> None:
        super().__init__(f"{task} is held by {holder} until {expires_at}: {reason}")
        self.task, self.holder, self.expires_at, self.reason = task, holder, expires_at, reason


class NotHolder(Exception):
    pass


@dataclass(frozen=True)
class SqlClaim:
    task: str
    owner: str
    fence: int
    token: str
    expires_at: float


def _hash(token: str) -> str:
    return hashlib.sha256(b"fleetclaims-token:" + token.encode()).hexdigest()


class SqliteRegistry:
    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL",
                 timeout: float = 10.0) -> None:
        if synchronous not in ("FULL", "NORMAL", "OFF", "EXTRA"):
            raise ValueError(synchronous)
        self.path = os.fspath(path)
        self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # --- operations ------------------------------------------------------------------------

    def claim(self, task: str, *, owner: str, ttl: float = 600.0) -> SqlClaim:
        token = secrets.token_urlsafe(24)
        th = _hash(token)
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            now = time.time()
            row = db.execute(
                "SELECT owner, token_hash, state, expires_at FROM claims WHERE task = ?", (task,)
            ).fetchone()
            if row is not None and row[2] == "active" and (row[3] is None or row[3] > now):
                reason = "held by a live lease"
                db.execute(
                    "INSERT INTO audit (ts, type, task, actor, owner, detail) "
                    "VALUES (?, 'claim_rejected', ?, ?, ?, ?)",
                    (now, task, owner, row[0], json.dumps({"reason": reason,
                                                           "expires_at": row[3]})),
                )
                db.execute("COMMIT")
                raise ClaimConflict(task, row[0], row[3], reason)
            fence = db.execute("UPDATE meta SET fence = fence + 1 WHERE id = 1 RETURNING fence"
                               ).fetchone()[0]
            expires = now + ttl
            db.execute(
                "INSERT INTO claims (task, owner, token_hash, fence, state, claimed_at, "
                "expires_at, ttl, ended_at) VALUES (?, ?, ?, ?, 'active', ?, ?, ?, NULL) "
                "ON CONFLICT(task) DO UPDATE SET owner=excluded.owner, "
                "token_hash=excluded.token_hash, fence=excluded.fence, state='active', "
                "claimed_at=excluded.claimed_at, expires_at=excluded.expires_at, "
                "ttl=excluded.ttl, ended_at=NULL",
                (task, owner, th, fence, now, expires, ttl),
            )
            db.execute(
                "INSERT INTO audit (ts, type, task, actor, owner, fence, token_hash, detail) "
                "VALUES (?, 'claim_created', ?, ?, ?, ?, ?, ?)",
                (now, task, owner, owner, fence, th, json.dumps({"ttl": ttl,
                                                                 "expires_at": expires})),
            )
            db.execute("COMMIT")
        except ClaimConflict:
            raise
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return SqlClaim(task, owner, fence, token, expires)

    def release(self, task: str, *, token: str) -> bool:
        th = _hash(token)
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            now = time.time()
            row = db.execute(
                "SELECT owner, token_hash, state, fence FROM claims WHERE task = ?", (task,)
            ).fetchone()
            if row is None or row[1] != th:
                db.execute("COMMIT")
                if row is None:
                    return False
                raise NotHolder(task)
            if row[2] != "active":
                db.execute("COMMIT")
                return False
            db.execute("UPDATE claims SET state = 'released', ended_at = ? WHERE task = ?",
                       (now, task))
            db.execute(
                "INSERT INTO audit (ts, type, task, actor, owner, fence, token_hash) "
                "VALUES (?, 'claim_released', ?, ?, ?, ?, ?)",
                (now, task, row[0], row[0], row[3], th),
            )
            db.execute("COMMIT")
            return True
        except NotHolder:
            raise
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # --- benchmark helpers -----------------------------------------------------------------

    def prepopulate(self, n: int, *, prefix: str = "live-", owner: str = "filler",
                    ttl: float = 86400.0) -> None:
        """Insert ``n`` live claims (with their audit rows) in one transaction."""
        now = time.time()
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        fence0 = db.execute("SELECT fence FROM meta").fetchone()[0]
        rows = [(f"{prefix}{i}", owner, _hash(secrets.token_urlsafe(24)), fence0 + i + 1, now,
                 now + ttl, ttl) for i in range(n)]
        db.executemany(
            "INSERT INTO claims (task, owner, token_hash, fence, state, claimed_at, expires_at, "
            "ttl) VALUES (?, ?, ?, ?, 'active', ?, ?, ?)", rows)
        db.executemany(
            "INSERT INTO audit (ts, type, task, actor, owner, fence, token_hash, detail) "
            "VALUES (?, 'claim_created', ?, ?, ?, ?, ?, ?)",
            [(now, r[0], owner, owner, r[3], r[2], json.dumps({"ttl": ttl})) for r in rows])
        db.execute("UPDATE meta SET fence = ?", (fence0 + n,))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def live_count(self) -> int:
        return int(self.db.execute(
            "SELECT count(*) FROM claims WHERE state = 'active' AND expires_at > ?",
            (time.time(),)).fetchone()[0])

    def audit_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM audit").fetchone()[0])
