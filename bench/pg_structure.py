"""What caps fleetclaims on PostgreSQL at 4 processes: the order of its round trips.

    .venv/bin/python bench/pg_structure.py            # 4 rounds of 2.5 s windows, 4 processes

Two clients that do the same SQL work per operation with no decision logic at all (a claim
upsert or release update, one audit insert, the serialising counter row), sent as batches of
simple-protocol statements, differ only in where the serialising lock is taken:

- ``lockfirst`` (fleetclaims' order): round trip 1 locks the counter row and reads the task's
  row; round trip 2 writes and commits. The lock is held across the reply to the client and
  the client's next message: a hop through the client inside the critical section.
- ``peerlike`` (the bare peer's order in pg_bench.py, batched): round trip 1 does the per-task
  upsert (row locks of that task only); round trip 2 takes the counter row, inserts the audit
  row and commits in one message: the critical section never leaves the server.

fleetclaims decides in the client between its two round trips (the core's one decision path:
seq, the previous hash and the fence come from the locked head), so it has the first shape.
Printed: ops/s of each and the ratio lockfirst/peerlike, medians [min-max] over interleaved
rounds (bench/README.md, PostgreSQL).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

SCHEMA = """
CREATE SCHEMA {s};
CREATE TABLE {s}.counter (id int PRIMARY KEY, seq bigint NOT NULL);
INSERT INTO {s}.counter VALUES (1, 0);
CREATE TABLE {s}.claims (task text PRIMARY KEY, owner text NOT NULL, token_hash text NOT NULL,
    fence bigint NOT NULL, state text NOT NULL, claimed_at float8 NOT NULL, expires_at float8);
CREATE TABLE {s}.audit (seq bigint PRIMARY KEY, ts float8 NOT NULL, type text NOT NULL,
    task text NOT NULL, owner text NOT NULL, fence bigint NOT NULL, line text NOT NULL);
"""
LINE = "x" * 350  # about the size of a sealed journal line


def _q(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _worker(url: str, s: str, order: str, index: int, procs: int, seconds: float,
            start: Any, out: Any) -> None:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    pg = conn.pgconn

    def run(sql: str) -> list[list[Any]]:
        pg.send_query(sql.encode())
        answers = []
        while (res := pg.get_result()) is not None:
            answers.append([res.get_value(k, 0) for k in range(res.ntuples)])
        return answers

    def op(kind: str, task: str, th: str) -> None:
        if kind == "claim":
            write = (f"INSERT INTO {s}.claims AS c VALUES ({_q(task)}, 'o', {_q(th)}, 1, "
                     "'active', 1, 2) ON CONFLICT (task) DO UPDATE SET owner = EXCLUDED.owner, "
                     "token_hash = EXCLUDED.token_hash, fence = c.fence + 1, state = 'active'")
        else:
            write = f"UPDATE {s}.claims SET state = 'released' WHERE task = {_q(task)}"
        line = _q(f'{{"type":"{kind}","task":"{task}"}}' + LINE)
        if order == "lockfirst":
            got = run(f"BEGIN; SELECT seq FROM {s}.counter WHERE id = 1 FOR UPDATE; "
                      f"SELECT fence FROM {s}.claims WHERE task = {_q(task)}")
            seq = int(got[1][0]) + 1
            run(f"{write}; INSERT INTO {s}.audit VALUES ({seq}, 1, {_q(kind)}, {_q(task)}, 'o', "
                f"1, {line}); UPDATE {s}.counter SET seq = {seq} WHERE id = 1; COMMIT")
        else:
            run(f"BEGIN; {write}")
            run(f"WITH h AS (UPDATE {s}.counter SET seq = seq + 1 WHERE id = 1 RETURNING seq) "
                f"INSERT INTO {s}.audit SELECT h.seq, 1, {_q(kind)}, {_q(task)}, 'o', 1, {line} "
                "FROM h; COMMIT")

    tasks = [f"t{j}" for j in range(20) if j % procs == index]
    start.wait()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        task, th = tasks[done % len(tasks)], secrets.token_hex(8)
        op("claim", task, th)
        op("release", task, th)
        done += 1
    out.put(2 * done / (time.perf_counter() - t0))
    conn.close()


def _run(url: str, order: str, procs: int, seconds: float, tag: str) -> float:
    import psycopg

    s = f'"{tag}"'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA.format(s=s).encode())
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(url, s, order, i, procs, seconds, start, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    rates = [out.get(timeout=seconds + 60) for _ in workers]
    for w in workers:
        w.join()
    return float(sum(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.5)
    args = parser.parse_args()
    from pg_server import start_server

    server = start_server()
    try:
        url = server.create_database("structure")
        results: dict[str, list[float]] = {"lockfirst": [], "peerlike": []}
        orders = list(results)
        for n in range(args.rounds):
            for order in orders if n % 2 == 0 else orders[::-1]:
                results[order].append(_run(url, order, args.procs, args.seconds,
                                           f"{order}_{n}"))
        for order, rates in results.items():
            print(f"{order:>9}: {statistics.median(rates):7.0f} ops/s "
                  f"[{min(rates):.0f}-{max(rates):.0f}]")
        ratios = [a / b for a, b in zip(results["lockfirst"], results["peerlike"], strict=True)]
        print(f"ratio lockfirst/peerlike {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}-{max(ratios):.2f}], {args.procs} processes, fsync on")
    finally:
        server.destroy()


if __name__ == "__main__":
    main()
