"""fleetclaims on PostgreSQL against a bare psycopg peer doing the same claim + release.

    .venv/bin/python bench/pg_bench.py                       # 6 rounds of 2 s windows, 1 and 4 procs
    .venv/bin/python bench/pg_bench.py --rounds 6 --procs 4 --peers bare unprepared advisory
    .venv/bin/python bench/pg_bench.py --others              # also the file store and SQLite
    .venv/bin/python bench/pg_bench.py --base /tmp/base      # also fleetclaims from a clone
    .venv/bin/python bench/pg_bench.py --cost --base /tmp/base   # CPU and WAL per operation

Workload: each process loops claim + release on its own share of 20 tasks for a fixed window;
the processes of one run start together (a barrier). Reported: operations per second (a claim
and a release are two operations), durability "full" (synchronous_commit on, the server runs
with fsync on).

The bare peer is what a user would write with psycopg 3 instead of fleetclaims: per operation
one transaction of one conditional upsert (claim: insert or take over a row that is not live;
release: end the row if the token matches) and one audit insert that takes its sequence number
from a one-row counter (so writers serialise on one row, as fleetclaims' head row serialises
them: a gap-free journal). Variants (``--peers``): ``bare`` (psycopg's defaults: statements
prepared after 5 runs), ``unprepared`` (nothing prepared, as fleetclaims runs through a pooler
such as PgBouncer; connected directly it prepares its statements too), ``advisory``
(serialised on a transaction advisory lock and a sequence instead of the counter row).

Systems run interleaved, round after round (in ABBA order), so a noisy machine hurts them
alike; medians with the [min-max] range over the rounds, and the median of the per-round
ratios fleetclaims/bare, with the load average before and after each line (the machine may be
shared: under load both sides wait on the disk's flushes and the ratio rises; on a quiet
machine CPU per operation decides). ``--base DIR`` adds ``base``: fleetclaims imported from
DIR (a clone at an earlier commit), run in the same rounds, with the ratio fleetclaims/base.
``--cost`` measures instead, per operation of one process (CYCLES claim + release, the systems
alternated ROUNDS times): the client's CPU (its process time), the server's CPU (every server
process's, from /proc), and the WAL written (pg_current_wal_lsn). The PostgreSQL server is a
throwaway one started here (tests/pg_server.py: fsync on, 127.0.0.1 only), unless --url names
an existing database.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

N_TASKS = 20
TTL = 600.0

PEER_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.counter (id int PRIMARY KEY, seq bigint NOT NULL);
INSERT INTO {s}.counter VALUES (1, 0) ON CONFLICT DO NOTHING;
CREATE SEQUENCE IF NOT EXISTS {s}.audit_seq;
CREATE TABLE IF NOT EXISTS {s}.claims (task text PRIMARY KEY, owner text NOT NULL,
    token_hash text NOT NULL, fence bigint NOT NULL, state text NOT NULL,
    claimed_at float8 NOT NULL, expires_at float8);
CREATE TABLE IF NOT EXISTS {s}.audit (seq bigint PRIMARY KEY, ts float8 NOT NULL,
    type text NOT NULL, task text NOT NULL, owner text NOT NULL, fence bigint NOT NULL,
    line text NOT NULL);
"""


class BarePeer:
    """claim / release in plain psycopg 3: one conditional upsert + one audit insert each."""

    def __init__(self, url: str, schema: str, variant: str) -> None:
        import psycopg

        threshold = None if variant == "unprepared" else 5
        self.conn = psycopg.connect(url, prepare_threshold=threshold)
        s = f'"{schema}"'
        self.claim_sql = (
            f"INSERT INTO {s}.claims AS c VALUES (%(task)s, %(owner)s, %(th)s, 1, 'active', "
            "extract(epoch FROM clock_timestamp()), extract(epoch FROM clock_timestamp()) + "
            "%(ttl)s) ON CONFLICT (task) DO UPDATE SET owner = EXCLUDED.owner, token_hash = "
            "EXCLUDED.token_hash, fence = c.fence + 1, state = 'active', claimed_at = "
            "EXCLUDED.claimed_at, expires_at = EXCLUDED.expires_at WHERE c.state <> 'active' "
            "OR c.expires_at < EXCLUDED.claimed_at RETURNING fence")
        self.release_sql = (
            f"UPDATE {s}.claims SET state = 'released' WHERE task = %(task)s AND "
            "token_hash = %(th)s AND state = 'active' RETURNING fence")
        if variant == "advisory":
            self.audit_sql = (
                f"WITH l AS (SELECT pg_advisory_xact_lock(42)) INSERT INTO {s}.audit "
                f"SELECT nextval('{s}.audit_seq'), extract(epoch FROM clock_timestamp()), "
                "%(type)s, %(task)s, %(owner)s, %(fence)s, %(line)s FROM l")
        else:
            self.audit_sql = (
                f"WITH h AS (UPDATE {s}.counter SET seq = seq + 1 WHERE id = 1 RETURNING seq) "
                f"INSERT INTO {s}.audit SELECT h.seq, extract(epoch FROM clock_timestamp()), "
                "%(type)s, %(task)s, %(owner)s, %(fence)s, %(line)s FROM h")

    def _op(self, sql: str, kind: str, task: str, owner: str, th: str) -> int:
        args = {"task": task, "owner": owner, "th": th, "ttl": TTL}
        with self.conn.transaction():
            row = self.conn.execute(sql, args).fetchone()
            if row is None:
                raise RuntimeError(f"{kind} of {task} refused")
            line = f'{{"type":"{kind}","task":"{task}","owner":"{owner}","fence":{row[0]}}}'
            self.conn.execute(self.audit_sql, {**args, "type": kind, "fence": row[0],
                                               "line": line})
        return int(row[0])

    def cycle(self, task: str, owner: str) -> None:
        th = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()
        self._op(self.claim_sql, "claim_created", task, owner, th)
        self._op(self.release_sql, "claim_released", task, owner, th)

    def close(self) -> None:
        self.conn.close()


def _cycler(system: str, where: str, owner: str) -> tuple[Callable[[str], None], Callable[[], None]]:
    if system.startswith("peer-"):
        url, schema = where.split("#")
        peer = BarePeer(url, schema, system[5:])
        return (lambda task: peer.cycle(task, owner)), peer.close
    if system == "sqlite":
        from sqlite_peer import SqliteRegistry

        db = SqliteRegistry(os.path.join(where, "claims.db"), synchronous="FULL")
        return (lambda task: db.release(task, token=db.claim(task, owner=owner).token)), db.close
    if system.startswith("base="):  # fleetclaims as the clone at ``base=DIR`` has it
        sys.path.insert(0, system[5:])
    from fleetclaims import Registry

    reg = Registry(where, durability="full")

    def cycle(task: str) -> None:
        reg.release(task, token=reg.claim(task, owner=owner, ttl=TTL).token or "")

    return cycle, reg.close


def _loop(system: str, where: str, index: int, procs: int, seconds: float, start: Any,
          out: Any) -> None:
    tasks = [f"task-{i}" for i in range(N_TASKS) if i % procs == index]
    cycle, close = _cycler(system, where, f"bench-{index}")
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


def run(system: str, where: str, procs: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(procs)
    out = ctx.Queue()
    workers = [ctx.Process(target=_loop, args=(system, where, i, procs, seconds, start, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    rates = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise RuntimeError(f"{system} worker failed ({w.exitcode})")
    return float(sum(rates))


def _where(system: str, url: str, tmp: Path) -> str:
    """A fresh registry (schema, directory) for one run of ``system``."""
    tag = uuid.uuid4().hex[:8]
    if system == "fleetclaims" or system.startswith("base="):
        return f"{url}?schema=bench_{tag}"
    if system.startswith("peer-"):
        import psycopg

        schema = f"peer_{tag}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(PEER_SCHEMA.format(s=f'"{schema}"').encode())
        return f"{url}#{schema}"
    path = tmp / f"{system}-{tag}"
    path.mkdir(parents=True)
    return str(path / "reg") if system == "file" else str(path)


def _load() -> str:
    """The machine's load averages (1, 5, 15 min), as uptime shows them."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load unknown"
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):>7.0f} [{min(values):.0f}-{max(values):.0f}]"


def _name(system: str) -> str:
    return "base" if system.startswith("base=") else system


def _ratio(results: dict[str, list[float]], top: str, bottom: str) -> str:
    ratios = [f / b for f, b in zip(results[top], results[bottom], strict=True)]
    return (f"ratio {_name(top)}/{_name(bottom)} {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]")


def throughput(args: argparse.Namespace, systems: list[str], url: str, tmp: Path) -> None:
    print(f"claim+release ops/s, durability full (fsync on), {N_TASKS} tasks, "
          f"{args.seconds:g} s windows, {args.rounds} rounds interleaved, "
          f"{os.cpu_count()} CPUs; median [min-max]")
    peer = next(s for s in systems if s.startswith("peer-"))
    for procs in args.procs:
        before = _load()
        results: dict[str, list[float]] = {name: [] for name in systems}
        for round_no in range(args.rounds):
            # ABBA order: a load that drifts during a round hurts both sides alike
            for name in systems if round_no % 2 == 0 else systems[::-1]:
                results[name].append(run(name, _where(name, url, tmp), procs, args.seconds))
        cells = "  ".join(f"{_name(name)} {_summary(v)}" for name, v in results.items())
        ratios = [_ratio(results, "fleetclaims", peer)]
        ratios += [_ratio(results, s, peer) for s in systems if s.startswith("base=")]
        ratios += [_ratio(results, "fleetclaims", s) for s in systems if s.startswith("base=")]
        print(f"procs {procs}: {cells}  {'  '.join(ratios)}  "
              f"({before} before, {_load()} after; {os.cpu_count()} CPUs)", flush=True)


def _server_cpu(postmaster: int) -> float:
    """CPU seconds of the server: the postmaster and every process it started (from /proc;
    a process that ended meanwhile is left out, none do while the benchmark runs)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry) == postmaster or int(fields[1]) == postmaster:  # (fields[1]: ppid)
            total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / tick


def _cost_child(system: str, where: str, url: str, postmaster: int, cycles: int,
                out: Any) -> None:
    import psycopg

    cycle, close = _cycler(system, where, "cost")
    tasks = [f"task-{i}" for i in range(N_TASKS)]
    for i in range(50):  # connected, statements prepared, caches warm
        cycle(tasks[i % N_TASKS])
    with psycopg.connect(url, autocommit=True) as conn:
        def lsn() -> int:
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
            return int(row[0]) if row else 0
        wal0, server0, client0 = lsn(), _server_cpu(postmaster), time.process_time()
        for i in range(cycles):
            cycle(tasks[i % N_TASKS])
        client, server = time.process_time() - client0, _server_cpu(postmaster) - server0
        wal = lsn() - wal0
    close()
    ops = 2 * cycles
    out.put((client / ops * 1e6, server / ops * 1e6, wal / ops))


def cost(args: argparse.Namespace, systems: list[str], url: str, postmaster: int,
         tmp: Path) -> None:
    """Client CPU, server CPU (µs) and WAL (bytes) per operation, one process at a time."""
    print(f"per operation, 1 process, {args.cycles} claim+release cycles, durability full, "
          f"{args.rounds} rounds alternated; median [min-max] ({_load()} before)")
    ctx = mp.get_context("spawn")
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in systems}
    for round_no in range(args.rounds):
        for name in systems if round_no % 2 == 0 else systems[::-1]:
            out = ctx.Queue()
            child = ctx.Process(target=_cost_child, args=(name, _where(name, url, tmp), url,
                                                          postmaster, args.cycles, out))
            child.start()
            results[name].append(out.get(timeout=600))
            child.join()
    for name, rows in results.items():
        cells = [_summary([r[i] for r in rows]) for i in range(3)]
        print(f"  {_name(name):<12} client CPU {cells[0]} us  server CPU {cells[1]} us  "
              f"WAL {cells[2]} B", flush=True)
    print(f"({_load()} after)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--peers", nargs="+", default=["bare"],
                        choices=["bare", "unprepared", "advisory"])
    parser.add_argument("--others", action="store_true",
                        help="also the file store and the SQLite peer")
    parser.add_argument("--base", help="also fleetclaims as imported from this directory "
                        "(a clone at an earlier commit)")
    parser.add_argument("--cost", action="store_true",
                        help="CPU and WAL per operation instead of throughput")
    parser.add_argument("--cycles", type=int, default=1500, help="cycles per --cost run")
    parser.add_argument("--url", help="an existing postgresql:// database (default: a "
                        "throwaway server)")
    args = parser.parse_args()
    systems = ["fleetclaims", *(f"peer-{p}" for p in args.peers)]
    if args.base:
        systems.insert(1, "base=" + str(Path(args.base).resolve()))
    if args.others:
        systems += ["file", "sqlite"]

    server = None
    url = args.url
    if url is None:
        from pg_server import start_server

        server = start_server()
        url = server.create_database("bench")
    tmp = Path(tempfile.mkdtemp(prefix="fleetclaims-pgbench-"))
    try:
        if args.cost:
            postmaster = server.postmaster_pid() if server is not None else None
            if postmaster is None:
                parser.error("--cost needs the throwaway server (no --url)")
            cost(args, systems, url, postmaster, tmp)
        else:
            throughput(args, systems, url, tmp)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if server is not None:
            server.destroy()


if __name__ == "__main__":
    main()
