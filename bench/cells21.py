"""The cells of issue #21 for bench/run.py: cost independent of size and history.

sizes   1-process claim+release windows on registries holding 20, 10,000 and 100,000 live
        claims, at both durabilities, interleaved (rep by rep, size by size); ops/s and the
        ratio to 20 claims (the window itself: a checkpoint due in it is paid in it), p99 and
        the slowest operation (the one that triggers a checkpoint); per size, a fresh process's
        first write (wall, Registry() to the claim returned) and its peak RSS, beside a SQLite
        peer process holding the same claims.
queue   bench/queue_bench.py's cycles (claim_next, complete, add) at 10,000 open tasks, full
        durability, against its SQLite work queue, alternated.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_FRESH = r"""
import json, os, resource, sys, time
sys.path.insert(0, {here!r})
system, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if system == "fleetclaims":
    from fleetclaims import Registry
    reg = Registry(path)
    reg.claim("fresh-%d" % os.getpid(), owner="fresh", ttl=600)
else:
    from sqlite_peer import SqliteRegistry
    db = SqliteRegistry(os.path.join(path, "claims.db"), synchronous="FULL")
    db.claim("fresh-%d" % os.getpid(), owner="fresh", ttl=600)
ms = (time.perf_counter() - t) * 1e3
try:  # this process's peak (ru_maxrss would carry the forking parent's over the exec)
    with open("/proc/self/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
except (OSError, StopIteration):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"first_write_ms": ms, "rss_mb": rss}}))
os._exit(0)  # (no settle on the way out: the next window starts from a settled registry)
"""


def fresh_process(system: str, path: str) -> dict[str, float]:
    """A new interpreter's first write on ``path`` and its peak RSS (imports included)."""
    code = _FRESH.format(here=str(HERE))
    r = subprocess.run([sys.executable, "-c", code, system, path], capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"fresh {system} process failed: {r.stderr[-500:]}")
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def section_sizes(cfg: Any, work: Any, log: Any) -> list[dict[str, Any]]:
    from run import FC, SQ, populate_fc, run_cycles
    from sqlite_peer import SqliteRegistry

    sizes = cfg.size_cells
    paths: dict[int, tuple[str, str]] = {}
    for size in sizes:
        fc_path = os.path.join(work.fresh(f"size-fc-{size}"), "reg")
        sq_path = work.fresh(f"size-sq-{size}")
        pop = populate_fc(fc_path, size)
        db = SqliteRegistry(os.path.join(sq_path, "claims.db"), synchronous="FULL")
        db.prepopulate(size)
        db.close()
        log(f"  {size} claims populated ({pop:.1f} s)")
        paths[size] = (fc_path, sq_path)
    trials: dict[tuple[int, str], list[dict[str, Any]]] = {}
    fresh: dict[tuple[int, str], list[dict[str, float]]] = {}
    duration = max(cfg.duration * 2, 2.0)  # long enough for a checkpoint at 100,000 claims
    for rep in range(cfg.reps):
        for size in sizes if rep % 2 == 0 else sizes[::-1]:
            fc_path, sq_path = paths[size]
            for durability in ("full", "process") if rep % 2 == 0 else ("process", "full"):
                r = run_cycles(FC, fc_path, durability, 1, duration)
                trials.setdefault((size, durability), []).append(r)
                log(f"    rep {rep + 1} {size:>7} claims {durability:7}: {r['ops_s']:7.0f} "
                    f"ops/s p99 {r['p99_ms']:.2f} ms max {r['max_ms']:.0f} ms")
            for system, path in ((FC, fc_path), (SQ, sq_path)):
                f = fresh_process(system, path)
                fresh.setdefault((size, system), []).append(f)
            log(f"    rep {rep + 1} {size:>7} claims fresh process: fleetclaims "
                f"{fresh[(size, FC)][-1]['first_write_ms']:.0f} ms "
                f"{fresh[(size, FC)][-1]['rss_mb']:.0f} MB, sqlite "
                f"{fresh[(size, SQ)][-1]['first_write_ms']:.0f} ms "
                f"{fresh[(size, SQ)][-1]['rss_mb']:.0f} MB")
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"claims": size}
        for durability in ("full", "process"):
            ts = trials[(size, durability)]
            base = trials[(sizes[0], durability)]
            ratios = [t["ops_s"] / b["ops_s"] for t, b in zip(ts, base, strict=True)]
            row[durability] = {
                "ops_s": statistics.median(t["ops_s"] for t in ts),
                "ratio_to_20": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "p99_ms": statistics.median(t["p99_ms"] for t in ts),
                "max_ms": statistics.median(t["max_ms"] for t in ts),
                "max_ms_range": [min(t["max_ms"] for t in ts), max(t["max_ms"] for t in ts)],
            }
        for system in (FC, SQ):
            fs = fresh[(size, system)]
            row[system] = {k: statistics.median(f[k] for f in fs)
                           for k in ("first_write_ms", "rss_mb")}
            row[system]["first_write_range"] = [min(f["first_write_ms"] for f in fs),
                                                max(f["first_write_ms"] for f in fs)]
        rows.append(row)
    return rows


def section_queue(cfg: Any, log: Any) -> dict[str, Any]:
    import queue_bench

    # 1,000 cycles in --quick too: 300 held no checkpoint (one per ~350 cycles here) and read
    # 0.96-1.08x where 1,000 read 0.90-0.93x (bench/README.md, tenth round).
    n, cycles = 10_000, 1000
    fc, sq, first = [], [], []
    for rep in range(cfg.reps):
        order = ("fc", "sq") if rep % 2 == 0 else ("sq", "fc")
        for who in order:
            if who == "fc":
                rate, ms = queue_bench.run_fleetclaims(n, cycles, "full")
                fc.append(rate)
                first.append(ms)
            else:
                sq.append(queue_bench.run_sqlite(n, cycles, "full"))
        log(f"    rep {rep + 1} queue {n} open tasks: fleetclaims {fc[-1]:.0f}/s, "
            f"sqlite {sq[-1]:.0f}/s")
    ratios = [f / s for f, s in zip(fc, sq, strict=True)]
    return {"open_tasks": n, "cycles": cycles, "fleetclaims": statistics.median(fc),
            "sqlite": statistics.median(sq), "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)], "first_call_ms": statistics.median(first)}


def report_lines(res: dict[str, Any], table: Any, verdict: Any) -> tuple[list[str], list[Any]]:
    """The sections' tables and their rows of the TARGETS table."""
    out: list[str] = []
    checks: list[list[str]] = []
    if "sizes" in res:
        out.append("\nSIZES: 1 process claim+release with N live claims (window ops/s, ratio to "
                   "20 claims per rep), a fresh process's first write and peak RSS")
        rows = []
        for r in res["sizes"]:
            f, p = r["full"], r["process"]
            rows.append([f"{r['claims']:,}", f"{f['ops_s']:.0f}", f"{f['ratio_to_20']:.2f}x",
                         f"{f['max_ms']:.0f}", f"{p['ops_s']:.0f}", f"{p['ratio_to_20']:.2f}x",
                         f"{p['max_ms']:.0f}", f"{r['fleetclaims']['first_write_ms']:.0f}",
                         f"{r['sqlite']['first_write_ms']:.0f}",
                         f"{r['fleetclaims']['rss_mb']:.0f}", f"{r['sqlite']['rss_mb']:.0f}"])
        out.append(table(["claims", "full ops/s", "vs 20", "max ms", "process ops/s", "vs 20",
                          "max ms", "fc 1st ms", "sql 1st ms", "fc MB", "sql MB"], rows))
        for r in res["sizes"]:
            need = {10_000: 0.9, 100_000: 0.8}.get(r["claims"])
            if need:
                for d in ("full", "process"):
                    x = r[d]
                    checks.append([f"{r['claims']:,} claims {d} >= {need}x of 20",
                                   f"{x['ratio_to_20']:.2f}x ({x['ratio_range'][0]:.2f}-"
                                   f"{x['ratio_range'][1]:.2f})", verdict(x["ratio_to_20"] >= need)])
            if r["claims"] == 100_000:
                worst = max(r[d]["max_ms"] for d in ("full", "process"))
                checks.append(["slowest op at 100,000 claims <= 20 ms", f"{worst:.0f} ms",
                               verdict(worst <= 20)])
                rss = r["fleetclaims"]["rss_mb"]
                checks.append(["RSS holding 100,000 claims <= 100 MB",
                               f"{rss:.0f} MB (SQLite {r['sqlite']['rss_mb']:.0f})",
                               verdict(rss <= 100)])
                fw = r["fleetclaims"]["first_write_ms"]
                checks.append(["first write, fresh process, 100,000 claims <= 200 ms",
                               f"{fw:.0f} ms", verdict(fw <= 200)])
    if "queue" in res:
        q = res["queue"]
        out.append(f"\nQUEUE: claim_next+complete+add, {q['open_tasks']:,} open tasks, full "
                   f"durability: fleetclaims {q['fleetclaims']:.0f}/s, SQLite {q['sqlite']:.0f}/s,"
                   f" ratio {q['ratio']:.2f}x ({q['ratio_range'][0]:.2f}-{q['ratio_range'][1]:.2f})"
                   f"; first claim_next of a process {q['first_call_ms']:.0f} ms")
        checks.append(["queue 10,000 open tasks >= 0.95x SQLite", f"{q['ratio']:.2f}x",
                       verdict(q["ratio"] >= 0.95)])
    return out, checks
