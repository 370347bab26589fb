"""Disk floors for the journal write, to choose a write path (no fleetclaims code involved).

    .venv/bin/python bench/fsync_floor.py [--n 2000]

1 process:  one ~700-byte journal line made durable per op, four ways:
  append + fdatasync            what the file store does now (the file grows: ext4 must also
                                commit the inode size in its journal on every fdatasync)
  pwritev(RWF_DSYNC) append     one syscall instead of two, same metadata work
  in place over zero-filled     what SQLite's WAL does once it has grown: overwrite already
                                allocated, already-sized blocks, so fdatasync is a data flush only
4 processes (flock on a shared lock file, disjoint work):
  write+fdatasync under lock    the current design: one fdatasync per op, serialised
  write under lock, fdatasync after unlock
                                the kernel (jbd2) batches concurrent fdatasyncs into one commit
                                (group commit); every op is still acknowledged only after an
                                fdatasync that covers its bytes
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

LINE = b"x" * 699 + b"\n"


def one(path: str, n: int, how: str) -> float:
    flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if how != "inplace" else 0)
    fd = os.open(path, flags | os.O_TRUNC, 0o600)
    if how == "inplace":
        os.write(fd, b"\0" * (n * len(LINE)))
        os.fsync(fd)
    t = time.perf_counter()
    off = 0
    for _ in range(n):
        if how == "append":
            os.write(fd, LINE)
            os.fdatasync(fd)
        elif how == "dsync":
            os.pwritev(fd, [LINE], off, os.RWF_DSYNC | getattr(os, "RWF_APPEND", 0))
        else:
            os.pwrite(fd, LINE, off)
            os.fdatasync(fd)
        off += len(LINE)
    dt = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return dt / n * 1e6


def _locked_worker(path: str, n: int, outside: bool, barrier, q) -> None:
    lfd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        fcntl.flock(lfd, fcntl.LOCK_EX)
        os.write(fd, LINE)
        if not outside:
            os.fdatasync(fd)
        fcntl.flock(lfd, fcntl.LOCK_UN)
        if outside:
            os.fdatasync(fd)
        lat.append(time.perf_counter() - a)
    q.put((t0, time.perf_counter(), lat))


def four(path: str, n: int, outside: bool, procs: int = 4) -> tuple[float, float, float]:
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_locked_worker, args=(path, n, outside, barrier, q))
          for _ in range(procs)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    lat = sorted(x for r in res for x in r[2])
    wall = max(r[1] for r in res) - min(r[0] for r in res)
    for suffix in ("", ".lock"):
        os.unlink(path + suffix)
    return len(lat) / wall, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    cfg = ap.parse_args()
    base = Path(__file__).resolve().parent / "results"
    base.mkdir(exist_ok=True)
    d = tempfile.mkdtemp(dir=base)
    p = os.path.join(d, "j")
    print("1 process, µs per durable ~700-byte line (median of reps; all reps)")
    for how in ("append", "dsync", "inplace"):
        xs = [one(p, cfg.n, how) for _ in range(cfg.reps)]
        print(f"  {how:8} {statistics.median(xs):7.1f}   {[round(x) for x in xs]}")
    print("4 processes on one flock, ops/s  p50 ms  p99 ms (median of reps)")
    for outside in (False, True):
        rs = [four(p, cfg.n // 4, outside) for _ in range(cfg.reps)]
        name = "fdatasync after unlock" if outside else "fdatasync under lock"
        print(f"  {name:24} {statistics.median(r[0] for r in rs):7.0f}  "
              f"{statistics.median(r[1] for r in rs):6.2f}  {statistics.median(r[2] for r in rs):6.2f}")
    os.rmdir(d)


if __name__ == "__main__":
    main()
