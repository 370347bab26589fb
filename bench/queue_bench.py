"""claim_next with a large queue: fleetclaims against a SQLite work queue, same run.

Workload: N open tasks (every tenth depends on the task before it, so readiness matters),
then one process loops claim_next -> complete -> add one new task, so the queue stays at N
open tasks. Reported: cycles/s at N = 100 and N = 10,000 for both, the ratio fleetclaims /
SQLite, and each system's 10,000 / 100 ratio (a queue that scanned every task per call would
fall far below 1.0 there), and each system's CPU per cycle (user + system, of the loop only:
steadier than the rates, which follow the disk's flush time). Also the time of the first
claim_next of a fresh process on the 10,000-task queue (it builds the ready index).

The SQLite peer is what a user would write: tasks(priority, added_at, id, state) with an
index in hand-out order, a deps table, WAL, ``BEGIN IMMEDIATE`` per operation, audit rows in
the same transaction, and readiness as a ``NOT EXISTS`` over unmet dependencies.

    .venv/bin/python bench/queue_bench.py [--durability full|process] [--cycles 1000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetclaims import Registry

SCHEMA = """
CREATE TABLE tasks (id TEXT PRIMARY KEY, priority INTEGER NOT NULL, added_at REAL NOT NULL,
                    state TEXT NOT NULL, owner TEXT, token_hash TEXT, fence INTEGER);
CREATE INDEX tasks_order ON tasks (state, priority, added_at, id);
CREATE TABLE deps (task TEXT NOT NULL, dep TEXT NOT NULL, PRIMARY KEY (task, dep));
CREATE INDEX deps_dep ON deps (dep);
CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL, type TEXT, task TEXT,
                    owner TEXT, fence INTEGER);
CREATE TABLE meta (id INTEGER PRIMARY KEY, fence INTEGER NOT NULL);
INSERT INTO meta VALUES (1, 0);
"""

NEXT = """
SELECT id FROM tasks t WHERE state = 'open' AND NOT EXISTS (
    SELECT 1 FROM deps d JOIN tasks u ON u.id = d.dep
    WHERE d.task = t.id AND u.state != 'completed')
ORDER BY priority, added_at, id LIMIT 1
"""


class SqliteQueue:
    def __init__(self, path: str, durability: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")

    def setup(self, n: int) -> None:
        self.db.executescript(SCHEMA)
        self.db.execute("BEGIN")
        now = time.time()
        for i in range(n):
            self.db.execute("INSERT INTO tasks VALUES (?, ?, ?, 'open', NULL, NULL, NULL)",
                            (f"t{i:06d}", i % 5, now + i * 1e-6))
            if i % 10 == 9:
                self.db.execute("INSERT INTO deps VALUES (?, ?)", (f"t{i:06d}", f"t{i-1:06d}"))
        self.db.execute("COMMIT")

    def claim_next(self, owner: str) -> tuple[str, str] | None:
        token = secrets.token_urlsafe(24)
        th = hashlib.sha256(token.encode()).hexdigest()
        self.db.execute("BEGIN IMMEDIATE")
        row = self.db.execute(NEXT).fetchone()
        if row is None:
            self.db.execute("COMMIT")
            return None
        fence = self.db.execute("UPDATE meta SET fence = fence + 1 RETURNING fence").fetchone()[0]
        self.db.execute("UPDATE tasks SET state='held', owner=?, token_hash=?, fence=? WHERE id=?",
                        (owner, th, fence, row[0]))
        self.db.execute("INSERT INTO audit (ts, type, task, owner, fence) VALUES (?,?,?,?,?)",
                        (time.time(), "claim_created", row[0], owner, fence))
        self.db.execute("COMMIT")
        return row[0], token

    def complete(self, task: str, token: str) -> None:
        th = hashlib.sha256(token.encode()).hexdigest()
        self.db.execute("BEGIN IMMEDIATE")
        row = self.db.execute("SELECT token_hash, fence, owner FROM tasks WHERE id=?",
                              (task,)).fetchone()
        if row is None or not secrets.compare_digest(row[0], th):
            self.db.execute("ROLLBACK")
            raise RuntimeError("not holder")
        self.db.execute("UPDATE tasks SET state='completed' WHERE id=?", (task,))
        self.db.execute("INSERT INTO audit (ts, type, task, owner, fence) VALUES (?,?,?,?,?)",
                        (time.time(), "claim_completed", task, row[2], row[1]))
        self.db.execute("COMMIT")

    def add(self, task: str, priority: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("INSERT INTO tasks VALUES (?, ?, ?, 'open', NULL, NULL, NULL)",
                        (task, priority, time.time()))
        self.db.execute("INSERT INTO audit (ts, type, task, owner, fence) VALUES (?,?,?,?,?)",
                        (time.time(), "task_added", task, None, None))
        self.db.execute("COMMIT")


def _cpu() -> float:
    """This process's user+system CPU seconds: steadier than the rate when fsync times wander."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_sqlite(n: int, cycles: int, durability: str,
               cpu_out: list[float] | None = None) -> float:
    with tempfile.TemporaryDirectory() as d:
        q = SqliteQueue(os.path.join(d, "q.db"), durability)
        q.setup(n)
        c0, t0 = _cpu(), time.perf_counter()
        for k in range(cycles):
            got = q.claim_next("w")
            assert got is not None
            q.complete(*got)
            q.add(f"n{k:06d}", k % 5)
        rate = cycles / (time.perf_counter() - t0)
        if cpu_out is not None:
            cpu_out.append((_cpu() - c0) / cycles * 1e6)
        return rate


def run_fleetclaims(n: int, cycles: int, durability: str,
                    cpu_out: list[float] | None = None) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        reg = Registry(d, durability="process")
        for i in range(n):
            deps = [f"t{i-1:06d}"] if i % 10 == 9 else []
            reg.add(f"t{i:06d}", priority=i % 5, depends_on=deps)
        reg.close()
        reg = Registry(d, durability=durability)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        first = reg.claim_next(owner="w")  # a fresh process: builds the ready index
        first_ms = (time.perf_counter() - t0) * 1000
        assert first is not None
        reg.complete(first.task, token=first.token or "")
        c0, t0 = _cpu(), time.perf_counter()
        for k in range(cycles):
            c = reg.claim_next(owner="w")
            assert c is not None
            reg.complete(c.task, token=c.token or "")
            reg.add(f"n{k:06d}", priority=k % 5)
        rate = cycles / (time.perf_counter() - t0)
        if cpu_out is not None:
            cpu_out.append((_cpu() - c0) / cycles * 1e6)
        reg.close()
        return rate, first_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--durability", choices=("full", "process"), default="full")
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    rows = {}
    for n in (100, 10_000):
        fc, sq, first = [], [], []
        fc_cpu: list[float] = []
        sq_cpu: list[float] = []
        for _ in range(args.reps):  # alternating, medians
            rate, ms = run_fleetclaims(n, args.cycles, args.durability, fc_cpu)
            fc.append(rate)
            first.append(ms)
            sq.append(run_sqlite(n, args.cycles, args.durability, sq_cpu))
        rows[n] = (statistics.median(fc), statistics.median(sq), statistics.median(first),
                   statistics.median(fc_cpu), statistics.median(sq_cpu))
    print(f"claim_next + complete + add, 1 process, durability={args.durability}, "
          f"{args.cycles} cycles x {args.reps} reps (medians)")
    print(f"{'open tasks':>10} {'fleetclaims/s':>14} {'sqlite/s':>10} {'ratio':>6} "
          f"{'first call ms':>14} {'cpu us/cycle fc/sql':>20}")
    for n, (f, s, ms, fcpu, scpu) in rows.items():
        print(f"{n:>10} {f:>14.0f} {s:>10.0f} {f / s:>6.2f} {ms:>14.1f} "
              f"{f'{fcpu:.0f}/{scpu:.0f}':>20}")
    print(f"10,000 vs 100 tasks: fleetclaims {rows[10_000][0] / rows[100][0]:.2f}x, "
          f"sqlite {rows[10_000][1] / rows[100][1]:.2f}x")


if __name__ == "__main__":
    main()
