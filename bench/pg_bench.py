"""PostgreSQL-backed throughput beside the file store and the SQLite peer.

    .venv/bin/python bench/pg_bench.py              # 3 s windows
    .venv/bin/python bench/pg_bench.py --seconds 10 --procs 1 4 8

Workload (the same for every system): each process loops claim + release on its own share of 20
tasks for a fixed window; 1 and 4 processes started together by a barrier. Reported: operations
per second (a claim and a release are two operations), for durability "full" (PostgreSQL
synchronous_commit on / SQLite synchronous=FULL / the file store's fdatasync) and "process"
(synchronous_commit off / NORMAL / no fsync).

The PostgreSQL server is a throwaway one started here (as in the tests: tests/pg_server.py,
fsync on, 127.0.0.1 only), unless --url names an existing database.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

N_TASKS = 20
SQLITE_SYNC = {"full": "FULL", "process": "NORMAL"}


def _loop(system: str, where: str, durability: str, index: int, procs: int, seconds: float,
          start: Any, out: Any) -> None:
    tasks = [f"task-{i}" for i in range(N_TASKS) if i % procs == index]
    owner = f"bench-{index}"
    if system == "sqlite":
        from sqlite_peer import SqliteRegistry

        db = SqliteRegistry(os.path.join(where, "claims.db"),
                            synchronous=SQLITE_SYNC[durability])

        def cycle(task: str) -> None:
            db.release(task, token=db.claim(task, owner=owner).token)

        close = db.close
    else:
        from fleetclaims import Registry

        reg = Registry(where, durability=durability)  # type: ignore[arg-type]

        def cycle(task: str) -> None:
            reg.release(task, token=reg.claim(task, owner=owner, ttl=600).token or "")

        close = reg.close
    cycle(tasks[0])  # connect / open before the clock starts
    start.wait()
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        cycle(tasks[done % len(tasks)])
        done += 1
    elapsed = time.perf_counter() - t0
    close()
    out.put(2 * done / elapsed)


def run(system: str, where: str, durability: str, procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(procs)
    out = ctx.Queue()
    workers = [ctx.Process(target=_loop, args=(system, where, durability, i, procs, seconds,
                                               start, out)) for i in range(procs)]
    for w in workers:
        w.start()
    rates = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"{system} worker failed ({w.exitcode})")
    return float(sum(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--url", help="an existing postgresql:// database (default: a "
                        "throwaway server)")
    args = parser.parse_args()

    server = None
    url = args.url
    if url is None:
        from pg_server import start_server

        server = start_server()
        url = server.create_database("bench")
    tmp = Path(tempfile.mkdtemp(prefix="fleetclaims-pgbench-"))
    try:
        print(f"claim+release ops/s, {N_TASKS} tasks, {args.seconds:g} s windows "
              f"({os.cpu_count()} CPUs)")
        print(f"{'durability':<10} {'procs':>5} {'postgres':>10} {'file':>10} {'sqlite':>10}")
        for durability in ("full", "process"):
            for procs in args.procs:
                tag = uuid.uuid4().hex[:8]
                row = {
                    "postgres": run("fleetclaims", f"{url}?schema=bench_{tag}", durability,
                                    procs, args.seconds),
                    "file": run("fleetclaims", str(tmp / f"file-{tag}"), durability, procs,
                                args.seconds),
                    "sqlite": run("sqlite", str(_mkdir(tmp / f"sqlite-{tag}")), durability,
                                  procs, args.seconds),
                }
                print(f"{durability:<10} {procs:>5} {row['postgres']:>10.0f} "
                      f"{row['file']:>10.0f} {row['sqlite']:>10.0f}", flush=True)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.destroy()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    main()
