"""Profile the single-process claim+release path and print where the time goes, per operation.

    .venv/bin/python bench/profile_claims.py [--cycles 3000] [--durability full] [--claims 0]
    .venv/bin/python bench/profile_claims.py --loop 20   # just run the loop (for py-spy)

Three views:
1. floors: what the unavoidable pieces cost alone on this disk (append+fdatasync of one
   journal-sized line, flock lock+unlock, the SQLite peer's op) in microseconds;
2. wall-clock per operation without a profiler;
3. cProfile: top functions by own time and by cumulative time, in microseconds per operation
   (cProfile inflates Python-heavy code; compare with the wall-clock figure).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fleetclaims import Registry  # noqa: E402


def cycles(reg: Registry, n: int) -> None:
    for i in range(n):
        task = f"task-{i % 20}"
        c = reg.claim(task, owner="bench", ttl=600)
        reg.release(task, token=c.token)


def floors(tmp: str, n: int = 2000) -> dict[str, float]:
    out = {}
    line = b"x" * 700 + b"\n"
    fd = os.open(os.path.join(tmp, "floor.jsonl"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    t = time.perf_counter()
    for _ in range(n):
        os.write(fd, line)
        os.fdatasync(fd)
    out["append 700 B + fdatasync"] = (time.perf_counter() - t) / n * 1e6
    os.close(fd)
    import fcntl

    lfd = os.open(os.path.join(tmp, "floor.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    t = time.perf_counter()
    for _ in range(n * 10):
        fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lfd, fcntl.LOCK_UN)
    out["flock LOCK_EX|NB + LOCK_UN"] = (time.perf_counter() - t) / (n * 10) * 1e6
    os.close(lfd)
    from sqlite_peer import SqliteRegistry

    for sync in ("FULL", "NORMAL"):
        db = SqliteRegistry(os.path.join(tmp, f"peer-{sync}.db"), synchronous=sync)
        for _ in range(20):
            db.release("w", token=db.claim("w", owner="o").token)
        t = time.perf_counter()
        for i in range(n // 2):
            task = f"task-{i % 20}"
            db.release(task, token=db.claim(task, owner="o").token)
        out[f"sqlite peer op (synchronous={sync})"] = (time.perf_counter() - t) / n * 1e6
        db.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--durability", default="full", choices=["full", "process"])
    ap.add_argument("--claims", type=int, default=0, help="live claims to pre-populate")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--loop", type=float, help="only run cycles for this many seconds")
    ap.add_argument("--procs", type=int, default=1,
                    help="profile N processes cycling on disjoint tasks at once (merged stats)")
    cfg = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="prof-", dir=HERE / "results" if (HERE / "results").exists()
                           else None)
    try:
        path = os.path.join(tmp, "reg")
        if cfg.claims:
            pre = Registry(path, durability="process")
            for i in range(cfg.claims):
                pre.claim(f"live-{i}", owner="filler", ttl=86400)
            pre.store.checkpoint()
            pre.close()
            os.sync()
        reg = Registry(path, durability=cfg.durability)  # type: ignore[arg-type]
        cycles(reg, 50)
        if cfg.loop:
            end = time.monotonic() + cfg.loop
            n = 0
            while time.monotonic() < end:
                cycles(reg, 100)
                n += 200
            print(f"{n} ops in {cfg.loop} s")
            return 0
        if cfg.procs > 1:
            return profile_procs(path, cfg)
        ops = cfg.cycles * 2
        print("# floors on this disk (µs per op)")
        for k, v in floors(tmp).items():
            print(f"  {v:8.1f}  {k}")
        t = time.perf_counter()
        cycles(reg, cfg.cycles)
        wall = (time.perf_counter() - t) / ops * 1e6
        print(f"\n# fleetclaims durability={cfg.durability}, {cfg.claims} live claims: "
              f"{wall:.1f} µs per op wall ({1e6 / wall:.0f} ops/s), no profiler")
        prof = cProfile.Profile()
        prof.enable()
        cycles(reg, cfg.cycles)
        prof.disable()
        print_stats(pstats.Stats(prof), ops, cfg.top)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _proc_worker(path: str, durability: str, n: int, wid: int, procs: int, barrier, out: str):
    reg = Registry(path, durability=durability)  # type: ignore[arg-type]
    tasks = [f"task-{k}" for k in range(20)][wid::procs]
    for t in tasks:
        reg.release(t, token=reg.claim(t, owner=f"w{wid}", ttl=600).token)
    barrier.wait()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        task = tasks[i % len(tasks)]
        reg.release(task, token=reg.claim(task, owner=f"w{wid}", ttl=600).token)
    prof.disable()
    prof.dump_stats(out)


def profile_procs(path: str, cfg: argparse.Namespace) -> int:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(cfg.procs)
    outs = [f"{path}.prof{w}" for w in range(cfg.procs)]
    n = cfg.cycles // cfg.procs
    t = time.perf_counter()
    ps = [ctx.Process(target=_proc_worker, args=(path, cfg.durability, n, w, cfg.procs, barrier,
                                                 outs[w])) for w in range(cfg.procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    wall = time.perf_counter() - t
    ops = n * 2 * cfg.procs
    print(f"# {cfg.procs} processes, durability={cfg.durability}: {ops} ops, "
          f"{ops / wall:.0f} ops/s under cProfile (includes start-up)")
    st = pstats.Stats(outs[0])
    for o in outs[1:]:
        st.add(o)
    print("# µs per operation summed over all processes (each process's own ops)")
    print_stats(st, ops, cfg.top)
    return 0


def print_stats(st: pstats.Stats, ops: int, top: int) -> None:
    if True:
        total = st.total_tt / ops * 1e6  # type: ignore[attr-defined]
        print(f"# under cProfile: {total:.1f} µs per op\n")
        rows = []
        for (file, line, name), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
            short = file.replace(str(HERE.parent) + "/", "").replace(sys.prefix, "<py>")
            if "/lib/python" in short:
                short = "<stdlib>/" + short.split("/lib/python")[1].split("/", 1)[1]
            rows.append((tt / ops * 1e6, ct / ops * 1e6, nc / ops, f"{short}:{line}({name})"))
        print(f"# top {top} by own time (µs/op  cum µs/op  calls/op  function)")
        for tt, ct, calls, where in sorted(rows, reverse=True)[: top]:
            print(f"  {tt:7.1f}  {ct:8.1f}  {calls:6.1f}  {where}")
        print(f"\n# top {top} by cumulative time")
        for tt, ct, calls, where in sorted(rows, key=lambda r: -r[1])[: top]:
            print(f"  {tt:7.1f}  {ct:8.1f}  {calls:6.1f}  {where}")


if __name__ == "__main__":
    raise SystemExit(main())
