"""Disk floors for the journal write, to choose a write path (no fleetclaims code involved).

    .venv/bin/python bench/fsync_floor.py [--n 2000]

1 process:  one ~700-byte journal line made durable per op, four ways:
  append + fdatasync            what the file store does now (the file grows: ext4 must also
                                commit the inode size in its journal on every fdatasync)
  pwritev(RWF_DSYNC) append     one syscall instead of two, same metadata work
  in place over zero-filled     what SQLite's WAL does once it has grown: overwrite already
                                allocated, already-sized blocks, so fdatasync is a data flush only
4 processes (flock on a shared lock file, disjoint work), appending in place over zero-filled
space as the journal does (the offset kept in the lock file):
  fdatasync under lock          one fdatasync per op, serialised
  fdatasync after unlock        the file store's group commit: flushes of concurrent writers
                                overlap (every op acknowledged only after an fdatasync that
                                began after its bytes were written)
  shared flush after unlock     the same, but one writer at a time flushes (a try-lock) and
                                records when its fdatasync began; a writer whose bytes are older
                                than a recorded flush returns without one of its own (measured
                                for #21, not taken: see bench/README.md, "Two things measured")

The 4-process lines are the floor under "one claim+release under 4-process contention" at full
durability: no fleetclaims code runs in them, only the write pattern.
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


def _shared_flush(fd: int, lfd: int, sfd: int) -> int:
    """Flush as 'shared flush after unlock' does; the number of fdatasyncs made (0 or 1)."""
    written = time.monotonic_ns()
    while True:
        raw = os.pread(lfd, 8, 200)
        if len(raw) == 8 and int.from_bytes(raw, "little") > written:
            return 0  # a flush that began after our write has finished
        try:
            fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.00005)
            continue
        try:
            began = time.monotonic_ns()
            os.fdatasync(fd)
            os.pwrite(lfd, began.to_bytes(8, "little"), 200)
        finally:
            fcntl.flock(sfd, fcntl.LOCK_UN)
        return 1


def _locked_worker(path: str, n: int, how: str, barrier, q) -> None:
    lfd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    sfd = os.open(path + ".sync", os.O_RDWR | os.O_CREAT, 0o600)
    fd = os.open(path, os.O_RDWR, 0o600)
    lat, syncs = [], 0
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        fcntl.flock(lfd, fcntl.LOCK_EX)
        off = int(os.pread(lfd, 24, 100).strip(b"\0 ") or b"0")
        os.pwrite(fd, LINE, off)
        os.pwrite(lfd, str(off + len(LINE)).encode().ljust(24), 100)
        if how == "under":
            os.fdatasync(fd)
            syncs += 1
        fcntl.flock(lfd, fcntl.LOCK_UN)
        if how == "after":
            os.fdatasync(fd)
            syncs += 1
        elif how == "shared":
            syncs += _shared_flush(fd, lfd, sfd)
        lat.append(time.perf_counter() - a)
    q.put((t0, time.perf_counter(), lat, syncs))


def four(path: str, n: int, how: str, procs: int = 4) -> tuple[float, float, float, float]:
    """(ops/s, p50 ms, p99 ms, fdatasyncs per op) of ``procs`` writers appending in place."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, bytes(n * procs * len(LINE) + (1 << 20)))  # zero-filled, as preallocated
    os.fsync(fd)
    os.close(fd)
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_locked_worker, args=(path, n, how, barrier, q))
          for _ in range(procs)]
    for p in ps:
        p.start()
    res = [q.get() for _ in ps]
    for p in ps:
        p.join()
    lat = sorted(x for r in res for x in r[2])
    wall = max(r[1] for r in res) - min(r[0] for r in res)
    for suffix in ("", ".lock", ".sync"):
        os.unlink(path + suffix)
    return (len(lat) / wall, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3,
            sum(r[3] for r in res) / len(lat))


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
    print("4 processes on one flock, in place: ops/s  p50 ms  p99 ms  fdatasyncs/op "
          "(median of reps; p99 range)")
    names = {"under": "fdatasync under lock", "after": "fdatasync after unlock",
             "shared": "shared flush after unlock"}
    rs: dict[str, list[tuple[float, float, float, float]]] = {how: [] for how in names}
    for _ in range(cfg.reps):  # interleaved: the disk's mood drifts
        for how in names:
            rs[how].append(four(p, cfg.n // 4, how))
    for how, name in names.items():
        r = rs[how]
        print(f"  {name:26} {statistics.median(x[0] for x in r):7.0f}  "
              f"{statistics.median(x[1] for x in r):6.2f}  {statistics.median(x[2] for x in r):6.2f}"
              f"  {statistics.median(x[3] for x in r):4.2f}   "
              f"[{min(x[2] for x in r):.2f}-{max(x[2] for x in r):.2f}]")
    os.rmdir(d)


if __name__ == "__main__":
    main()
