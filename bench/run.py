"""fleetclaims benchmark suite: fleetclaims against a SQLite peer, on the same workload.

    .venv/bin/python bench/run.py --quick     # about 2-3 minutes on 2 cores
    .venv/bin/python bench/run.py             # full: more repetitions, longer windows, 1M events

Sections (each printed as a plain-text table; everything also written as JSON to
bench/results/):

throughput  claim+release cycles on 20 tasks from 1, 4 and 8 processes (real processes started
            together by a barrier), fleetclaims durability="full" vs SQLite synchronous=FULL and
            "process" vs NORMAL; the two systems alternate within each repetition; medians of
            the repetitions; ops/s, p50/p99/max latency per operation, ratio fleetclaims/SQLite,
            and the workers' CPU (user+sys) per operation, steadier than ops/s on a shared machine.
sizes       (#21) 1-process cycles on 20 / 10,000 / 100,000 live claims at both durabilities,
            interleaved, ratio to 20 per rep, slowest op (the checkpoint's trigger), and a fresh
            process's first write and peak RSS beside a SQLite peer process (bench/cells21.py).
queue       (#21) bench/queue_bench.py at 10,000 open tasks, full durability, vs SQLite.
scaling     (only with --only scaling) the same 1-process full-durability cycles with 20, 1,000, 10,000, 100,000 live
            claims already in the registry; ops/s and ratio to the 20-claim figure. fleetclaims
            checkpoints (rewrites the snapshot) every max(512 KiB, snapshot/8) journal bytes; a
            short window may hold fewer checkpoints than its share, so "amortised" charges the
            missing fraction at the measured checkpoint cost (the ratio uses it).
coldstart   wall time of one CLI process (`fleetclaims claim`, `fleetclaims list --json`) on a
            10,000-claim registry; when the CLI does not exist yet, the equivalent `python -c`
            library call, marked as such.
audit       store.verify() events/s and events(after=...) paging over a journal of 1,000,000
            events (--quick: 100,000).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cells21  # noqa: E402
from sqlite_peer import ClaimConflict as SqlConflict  # noqa: E402
from sqlite_peer import SqliteRegistry  # noqa: E402

import fleetclaims  # noqa: E402
from fleetclaims import ClaimConflict as FcConflict  # noqa: E402
from fleetclaims import Registry  # noqa: E402

FC, SQ = "fleetclaims", "sqlite"
SQLITE_SYNC = {"full": "FULL", "process": "NORMAL"}
TTL = 600.0
N_TASKS = 20

# --- systems -------------------------------------------------------------------------------


def open_system(system: str, path: str, durability: str) -> tuple[Any, Any, Any, Any]:
    """(handle, claim(task) -> token, release(task, token), close())"""
    if system == FC:
        reg = Registry(path, durability=durability)  # type: ignore[arg-type]

        def claim(task: str, owner: str) -> str:
            return reg.claim(task, owner=owner, ttl=TTL).token  # type: ignore[return-value]

        def release(task: str, token: str) -> None:
            reg.release(task, token=token)

        return reg, claim, release, reg.close
    db = SqliteRegistry(os.path.join(path, "claims.db"), synchronous=SQLITE_SYNC[durability])

    def sclaim(task: str, owner: str) -> str:
        return db.claim(task, owner=owner, ttl=TTL).token

    def srelease(task: str, token: str) -> None:
        db.release(task, token=token)

    return db, sclaim, srelease, db.close


CONFLICTS = (FcConflict, SqlConflict)


def journal_size(system: str, path: str) -> int:
    p = os.path.join(path, "audit.jsonl") if system == FC else os.path.join(path, "claims.db-wal")
    try:
        return os.path.getsize(p)
    except OSError:
        return 0


# --- the cycle worker ------------------------------------------------------------------------


def _worker(system: str, path: str, durability: str, tasks: list[str], duration: float,
            barrier: Any, queue: Any, wid: int, shared: bool) -> None:
    try:
        _, claim, release, close = open_system(system, path, durability)
        owner = f"bench-{wid}"
        for task in tasks[:5]:  # warm up: open files, load state, first fsyncs
            with contextlib.suppress(*CONFLICTS):
                release(task, claim(task, owner))
        lat = array.array("d")
        conflicts = 0
        n = len(tasks)
        i = wid * 5
        if shared:  # every process draws from all 20 tasks in its own random order
            rng = random.Random(wid)
            tasks = [rng.choice(tasks) for _ in range(4096)]
            n = len(tasks)
        perf = time.perf_counter
        barrier.wait(timeout=120)
        size0 = journal_size(system, path)
        cpu0 = sum(os.times()[:2])  # (CPU per operation: robust where wall time is shared)
        t_start = perf()
        deadline = t_start + duration
        while True:
            task = tasks[i % n]
            i += 1
            t0 = perf()
            try:
                token = claim(task, owner)
            except CONFLICTS:
                conflicts += 1
                lat.append(perf() - t0)
                if t0 >= deadline:
                    break
                continue
            t1 = perf()
            lat.append(t1 - t0)
            release(task, token)
            t2 = perf()
            lat.append(t2 - t1)
            if t2 >= deadline:
                break
        t_end = perf()
        cpu = sum(os.times()[:2]) - cpu0
        size1 = journal_size(system, path)
        close()
        queue.put((wid, t_start, t_end, lat.tobytes(), conflicts, size0, size1, None, cpu))
    except BaseException:  # report, never hang the parent
        import traceback

        # Free the others from the barrier, or they (and the parent) wait forever.
        barrier.abort()
        queue.put((wid, 0.0, 0.0, b"", 0, 0, 0, traceback.format_exc(), 0.0))


def pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return math.nan
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


def run_cycles(system: str, path: str, durability: str, procs: int, duration: float,
               shared: bool = False) -> dict[str, Any]:
    """One trial: ``procs`` processes cycle claim+release for ``duration`` seconds."""
    if system == SQ:
        # Create the database (WAL mode, schema) once, before the workers: four connections
        # switching a new file to WAL at once can fail with "database is locked" (SQLite's busy
        # handler does not cover that switch), which killed a worker before the start barrier.
        SqliteRegistry(os.path.join(path, "claims.db"), synchronous=SQLITE_SYNC[durability]).close()
    os.sync()  # start from a clean page cache: earlier writes must not bill this trial's fsyncs
    ctx = mp.get_context("fork")
    all_tasks = [f"task-{k}" for k in range(N_TASKS)]
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    workers = []
    for w in range(procs):
        # Disjoint tasks per process (no conflicts) unless shared: then all 20 for everyone.
        tasks = all_tasks if shared or procs == 1 else all_tasks[w::procs]
        p = ctx.Process(target=_worker,
                        args=(system, path, durability, tasks, duration, barrier, queue, w,
                              shared))
        p.start()
        workers.append(p)
    results = [queue.get(timeout=duration + 120) for _ in workers]
    for p in workers:
        p.join(timeout=30)
    # The real failure first, before the others' BrokenBarrierError it caused.
    errors = sorted((r[7] for r in results if r[7]), key=lambda e: "BrokenBarrierError" in e)
    if errors:
        raise RuntimeError(f"{system} worker failed: {errors[0]}")
    lat: list[float] = []
    for r in results:
        a = array.array("d")
        a.frombytes(r[3])
        lat.extend(a)
    lat.sort()
    start = min(r[1] for r in results)
    end = max(r[2] for r in results)
    ops = len(lat)
    return {
        "ops": ops,
        "seconds": end - start,
        "ops_s": ops / (end - start),
        "p50_ms": pct(lat, 0.50) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "max_ms": lat[-1] * 1e3 if lat else math.nan,
        "conflicts": sum(r[4] for r in results),
        "cpu_us": sum(r[8] for r in results) / max(ops, 1) * 1e6,
        "bytes": max(r[6] for r in results) - min(r[5] for r in results),
    }


def med(trials: list[dict[str, Any]], key: str) -> float:
    return statistics.median(t[key] for t in trials)


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: med(trials, k) for k in ("ops_s", "p50_ms", "p99_ms", "max_ms", "cpu_us")}
    out["conflicts"] = sum(t["conflicts"] for t in trials)
    out["reps"] = [round(t["ops_s"]) for t in trials]
    return out


# --- sections --------------------------------------------------------------------------------


class Workdir:
    def __init__(self, base: Path) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="work-", dir=base))
        self.n = 0

    def fresh(self, name: str) -> str:
        self.n += 1
        d = self.root / f"{self.n:03d}-{name}"
        d.mkdir(mode=0o700)
        return str(d)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def section_throughput(cfg: argparse.Namespace, work: Workdir, log: Any) -> list[dict[str, Any]]:
    cells = [(d, p, False) for d in ("full", "process") for p in (1, 4, 8)]
    cells.append(("full", 4, True))
    trials: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rep in range(cfg.reps):
        order = (FC, SQ) if rep % 2 == 0 else (SQ, FC)
        for durability, procs, shared in cells:
            for system in order:
                path = work.fresh(f"{system}-{durability}-{procs}")
                if system == FC:
                    path = os.path.join(path, "reg")
                r = run_cycles(system, path, durability, procs, cfg.duration, shared)
                trials.setdefault((durability, procs, shared, system), []).append(r)
                log(f"  rep {rep + 1} {system:11} {durability:7} {procs}p"
                    f"{' shared' if shared else ''}: {r['ops_s']:8.0f} ops/s "
                    f"p99 {r['p99_ms']:.2f} ms")
                shutil.rmtree(os.path.dirname(path) if system == FC else path,
                              ignore_errors=True)
    rows = []
    for durability, procs, shared in cells:
        fc = summarise(trials[(durability, procs, shared, FC)])
        sq = summarise(trials[(durability, procs, shared, SQ)])
        rows.append({"durability": durability, "sqlite_sync": SQLITE_SYNC[durability],
                     "procs": procs, "tasks": "shared 20" if shared else "20",
                     "fleetclaims": fc, "sqlite": sq, "ratio": fc["ops_s"] / sq["ops_s"]})
    return rows


def populate_fc(path: str, n: int) -> float:
    t = time.perf_counter()
    reg = Registry(path, durability="process")
    for i in range(n):
        reg.claim(f"live-{i}", owner="filler", ttl=86400.0)
    reg.store.checkpoint()
    reg.close()
    os.sync()
    return time.perf_counter() - t


def checkpoint_policy() -> tuple[int, int]:
    try:
        from fleetclaims.store.file import store as fstore

        return int(fstore.CHECKPOINT_MIN_TAIL), int(fstore.CHECKPOINT_DIVISOR)
    except (ImportError, AttributeError):
        return 512 * 1024, 8


def section_scaling(cfg: argparse.Namespace, work: Workdir, log: Any,
                    keep: dict[str, str]) -> list[dict[str, Any]]:
    min_tail, divisor = checkpoint_policy()
    rows = []
    for size in cfg.sizes:
        fc_path = os.path.join(work.fresh(f"scale-fc-{size}"), "reg")
        sq_path = work.fresh(f"scale-sq-{size}")
        pop = populate_fc(fc_path, size)
        t = time.perf_counter()
        db = SqliteRegistry(os.path.join(sq_path, "claims.db"), synchronous="FULL")
        db.prepopulate(size)
        db.close()
        sq_pop = time.perf_counter() - t
        snap = os.path.getsize(os.path.join(fc_path, "claims.json"))
        log(f"  {size} claims: populated fleetclaims in {pop:.1f} s (snapshot {snap / 1e6:.1f} MB)"
            f", sqlite in {sq_pop:.1f} s")
        fc_trials, sq_trials, ckpts = [], [], []
        for rep in range(cfg.reps):
            order = (FC, SQ) if rep % 2 == 0 else (SQ, FC)
            for system in order:
                if system == FC:
                    # Start each window right after a checkpoint, and time that checkpoint at
                    # full durability: it is the cost the window may owe.
                    reg = Registry(fc_path, durability="full")
                    t = time.perf_counter()
                    reg.store.checkpoint()
                    ckpt = time.perf_counter() - t
                    reg.close()
                    ckpts.append(ckpt)
                    r = run_cycles(FC, fc_path, "full", 1, cfg.duration)
                    snap = os.path.getsize(os.path.join(fc_path, "claims.json"))
                    interval = max(min_tail, snap // divisor)
                    owed = r["bytes"] / interval
                    done = math.floor(owed)
                    r["ckpt_s"] = ckpt
                    r["ckpt_interval"] = interval
                    r["amortised_ops_s"] = r["ops"] / (r["seconds"] + (owed - done) * ckpt)
                    fc_trials.append(r)
                    log(f"    rep {rep + 1} fleetclaims {size}: {r['ops_s']:8.0f} ops/s window, "
                        f"{r['amortised_ops_s']:8.0f} amortised (checkpoint {ckpt * 1e3:.0f} ms "
                        f"every {interval / 1e6:.1f} MB), max {r['max_ms']:.0f} ms")
                else:
                    r = run_cycles(SQ, sq_path, "full", 1, cfg.duration)
                    sq_trials.append(r)
                    log(f"    rep {rep + 1} sqlite      {size}: {r['ops_s']:8.0f} ops/s")
        fc = summarise(fc_trials)
        fc["amortised_ops_s"] = med(fc_trials, "amortised_ops_s")
        fc["checkpoint_ms"] = statistics.median(ckpts) * 1e3
        fc["snapshot_mb"] = snap / 1e6
        rows.append({"claims": size, "fleetclaims": fc, "sqlite": summarise(sq_trials)})
        if size == cfg.cold_size:
            keep["cold"] = fc_path
        else:
            shutil.rmtree(os.path.dirname(fc_path), ignore_errors=True)
        shutil.rmtree(sq_path, ignore_errors=True)
    base = rows[0]
    for row in rows:
        row["fc_ratio_to_base"] = (row["fleetclaims"]["amortised_ops_s"]
                                   / base["fleetclaims"]["amortised_ops_s"])
        row["fc_window_ratio_to_base"] = row["fleetclaims"]["ops_s"] / base["fleetclaims"]["ops_s"]
        row["sq_ratio_to_base"] = row["sqlite"]["ops_s"] / base["sqlite"]["ops_s"]
        row["fc_vs_sqlite"] = row["fleetclaims"]["amortised_ops_s"] / row["sqlite"]["ops_s"]
    return rows


def cli_available(py: str) -> tuple[bool, str]:
    try:
        r = subprocess.run([py, "-m", "fleetclaims", "--help"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, repr(exc)
    if r.returncode != 0:
        return False, (r.stderr.strip().splitlines() or ["exit " + str(r.returncode)])[-1]
    return True, ""


def timed_run(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    return time.perf_counter() - t, r.returncode, (r.stderr or r.stdout)[-300:]


def section_coldstart(cfg: argparse.Namespace, work: Workdir, log: Any,
                      keep: dict[str, str]) -> dict[str, Any]:
    py = sys.executable
    path = keep.get("cold")
    if path is None:
        path = os.path.join(work.fresh("cold"), "reg")
        populate_fc(path, cfg.cold_size)
    else:  # the scaling registry: checkpoint so the tail is short, as after a quiet period
        reg = Registry(path)
        reg.store.checkpoint()
        reg.close()
    env = dict(os.environ, FLEETCLAIMS_DIR=path)
    has_cli, why = cli_available(py)
    bindir = Path(py).parent
    exe = str(bindir / "fleetclaims") if (bindir / "fleetclaims").exists() else None
    runs: dict[str, list[float]] = {}
    notes: list[str] = []

    def measure(name: str, make_argv: Any) -> None:
        times = []
        for i in range(cfg.cold_reps):
            argv = make_argv(i)
            dt, rc, err = timed_run(argv, env)
            if rc != 0:
                notes.append(f"{name}: exit {rc}: {err.strip()}")
                return
            times.append(dt)
        runs[name] = times

    # A pip install byte-compiles the package; an editable one compiles on first import,
    # unless PYTHONDONTWRITEBYTECODE is set (as on these machines), in which case every
    # process would recompile every module (~40 ms). Compile once, as an install would.
    import compileall

    compileall.compile_dir(str(HERE.parent / "fleetclaims"), quiet=1)
    notes.append("package byte-compiled first (compileall), as a pip install does")
    measure("python -c pass (interpreter floor)", lambda i: [py, "-c", "pass"])
    measure("python -c 'import fleetclaims'", lambda i: [py, "-c", "import fleetclaims"])
    if has_cli:
        cli = [exe] if exe else [py, "-m", "fleetclaims"]
        measure("fleetclaims claim", lambda i: [*cli, "claim", f"cold-{i}", "--owner", "bench"])
        measure("fleetclaims list --json", lambda i: [*cli, "list", "--json"])
        measure("fleetclaims list (human table)", lambda i: [*cli, "list"])
        if "fleetclaims claim" not in runs or "fleetclaims list --json" not in runs:
            has_cli = False
            why = "CLI present but a command failed: " + "; ".join(notes)
    if not has_cli:
        notes.append(f"CLI not available ({why}): measured the library call in `python -c` "
                     "instead")
        measure("python -c Registry().claim() [no CLI]", lambda i: [
            py, "-c", "import os,fleetclaims; r=fleetclaims.Registry(os.environ['FLEETCLAIMS_DIR']);"
            f" r.claim('coldlib-{i}', owner='bench', ttl=600)"])
        measure("python -c claims()+to_dict json [no CLI]", lambda i: [
            py, "-c", "import os,sys,orjson,fleetclaims; r=fleetclaims.Registry("
            "os.environ['FLEETCLAIMS_DIR']); sys.stdout.buffer.write(orjson.dumps("
            "[c.to_dict() for c in r.claims()]))"])
    out = {"claims": cfg.cold_size, "cli": has_cli, "notes": notes,
           "ms": {k: statistics.median(v) * 1e3 for k, v in runs.items()},
           "min_ms": {k: min(v) * 1e3 for k, v in runs.items()}}
    for k, v in out["ms"].items():
        log(f"  {k}: median {v:.0f} ms")
    with contextlib.suppress(OSError):
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return out


def section_audit(cfg: argparse.Namespace, work: Workdir, log: Any) -> dict[str, Any]:
    path = os.path.join(work.fresh("audit"), "reg")
    n = cfg.audit_events
    t = time.perf_counter()
    reg = Registry(path, durability="process")
    cycles = (n - 1) // 2  # +1 registry_created
    for i in range(cycles):
        task = f"task-{i % N_TASKS}"
        c = reg.claim(task, owner="gen", ttl=TTL)
        reg.release(task, token=c.token)
    if (n - 1) % 2:
        reg.claim("task-last", owner="gen", ttl=TTL)
    reg.store.checkpoint()
    reg.close()
    os.sync()
    gen = time.perf_counter() - t
    size = os.path.getsize(os.path.join(path, "audit.jsonl"))
    log(f"  generated {n} events ({size / 1e6:.0f} MB) in {gen:.1f} s")
    res: dict[str, Any] = {"events": n, "journal_mb": size / 1e6, "generate_s": gen}

    verify = []
    for _ in range(cfg.audit_reps):
        r2 = Registry(path)
        t = time.perf_counter()
        report = r2.store.verify()
        dt = time.perf_counter() - t
        r2.close()
        if not report.ok or report.events != n:
            raise RuntimeError(f"verify failed: {report}")
        verify.append(n / dt)
    res["verify_events_s"] = statistics.median(verify)
    log(f"  verify: {res['verify_events_s']:.0f} events/s")

    # events(after=...) paging: a cold first page, a cold deep page, then a full scan.
    page = 1000
    r3 = Registry(path)
    t = time.perf_counter()
    p = r3.events(after=0, limit=page)
    res["first_page_cold_ms"] = (time.perf_counter() - t) * 1e3
    r3.close()
    r4 = Registry(path)
    t = time.perf_counter()
    p = r4.events(after=n - page - 1, limit=page)
    res["deep_page_cold_ms"] = (time.perf_counter() - t) * 1e3
    r4.close()
    r5 = Registry(path)
    deep = []
    for k in range(20):
        after = (k * 7919 * 53) % (n - page)
        t = time.perf_counter()
        r5.events(after=after, limit=page)
        deep.append(time.perf_counter() - t)
    res["random_page_warm_ms"] = statistics.median(deep) * 1e3
    t = time.perf_counter()
    cursor, seen, pages = 0, 0, 0
    while True:
        p = r5.events(after=cursor, limit=page)
        seen += len(p.events)
        pages += 1
        cursor = p.next_cursor
        if not p.more:
            break
    dt = time.perf_counter() - t
    r5.close()
    if seen != n:
        raise RuntimeError(f"paging saw {seen} of {n} events")
    res["paging_events_s"] = seen / dt
    res["paging_page_ms"] = dt / pages * 1e3
    log(f"  paging: {res['paging_events_s']:.0f} events/s ({res['paging_page_ms']:.1f} ms per "
        f"{page}-event page); cold first page {res['first_page_cold_ms']:.0f} ms, cold deep page "
        f"{res['deep_page_cold_ms']:.0f} ms, warm random page {res['random_page_warm_ms']:.1f} ms")
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return res


# --- report ----------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=False)))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=False))))
    return "\n".join(out)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(res: dict[str, Any]) -> str:
    out = []
    meta = res["meta"]
    out.append(f"fleetclaims {meta['fleetclaims']} vs SQLite {meta['sqlite']} | {meta['mode']} | "
               f"{meta['cpus']} cpus | {meta['python']} | reps {meta['reps']} x "
               f"{meta['duration']} s windows | medians | {meta['elapsed_s']:.0f} s")
    out.append(f"load average at start {meta['loadavg_start'][0]:.2f}, at end "
               f"{meta['loadavg_end'][0]:.2f} (other work on the machine adds noise); "
               f"git {meta['git']} + {meta['fleetclaims_dirty']} uncommitted fleetclaims/ files")
    if "throughput" in res:
        out.append("\nTHROUGHPUT: claim+release cycles on 20 tasks (latency per operation)")
        rows = []
        for r in res["throughput"]:
            fc, sq = r["fleetclaims"], r["sqlite"]
            rows.append([
                f"{r['durability']} vs {r['sqlite_sync']}", str(r["procs"]), r["tasks"],
                f"{fc['ops_s']:.0f}", f"{sq['ops_s']:.0f}", f"{r['ratio']:.2f}x",
                f"{fc['p50_ms']:.2f}", f"{sq['p50_ms']:.2f}",
                f"{fc['p99_ms']:.2f}", f"{sq['p99_ms']:.2f}",
                f"{fc['max_ms']:.1f}", f"{sq['max_ms']:.1f}",
                f"{fc['conflicts']}/{sq['conflicts']}",
                f"{fc.get('cpu_us', 0):.0f}/{sq.get('cpu_us', 0):.0f}"])
        out.append(table(["durability", "procs", "tasks", "fc ops/s", "sql ops/s", "fc/sql",
                          "fc p50ms", "sql p50ms", "fc p99ms", "sql p99ms", "fc max",
                          "sql max", "rejects fc/sql", "cpu us/op fc/sql"], rows))
    if "scaling" in res:
        out.append("\nSCALING: 1 process, durability full vs synchronous=FULL, N live claims "
                   "pre-populated")
        rows = []
        for r in res["scaling"]:
            fc, sq = r["fleetclaims"], r["sqlite"]
            rows.append([
                f"{r['claims']:,}", f"{fc['ops_s']:.0f}", f"{fc['amortised_ops_s']:.0f}",
                f"{r['fc_ratio_to_base']:.2f}x", f"{fc['p99_ms']:.2f}", f"{fc['max_ms']:.0f}",
                f"{fc['checkpoint_ms']:.0f}", f"{fc['snapshot_mb']:.1f}",
                f"{sq['ops_s']:.0f}", f"{r['sq_ratio_to_base']:.2f}x", f"{r['fc_vs_sqlite']:.2f}x"])
        out.append(table(["claims", "fc ops/s", "fc amortised", "fc vs 20", "fc p99ms",
                          "fc max ms", "ckpt ms", "snap MB", "sql ops/s", "sql vs 20",
                          "fc/sql"], rows))
    if "coldstart" in res:
        c = res["coldstart"]
        out.append(f"\nCOLD START: one process on a {c['claims']:,}-claim registry "
                   f"(median of {meta['cold_reps']})")
        out.append(table(["command", "median ms", "min ms"],
                         [[k, f"{v:.0f}", f"{c['min_ms'][k]:.0f}"] for k, v in c["ms"].items()]))
        for n in c["notes"]:
            out.append(f"note: {n}")
    if "audit" in res:
        a = res["audit"]
        out.append(f"\nAUDIT: journal of {a['events']:,} events ({a['journal_mb']:.0f} MB, "
                   f"generated in {a['generate_s']:.0f} s with durability=process)")
        out.append(table(["measure", "value"], [
            ["store.verify() events/s", f"{a['verify_events_s']:,.0f}"],
            ["events(after=...) full scan, 1000/page, events/s", f"{a['paging_events_s']:,.0f}"],
            ["  per page ms", f"{a['paging_page_ms']:.1f}"],
            ["cold first page ms (new Registry)", f"{a['first_page_cold_ms']:.0f}"],
            ["cold deepest page ms (new Registry)", f"{a['deep_page_cold_ms']:.0f}"],
            ["warm random page ms", f"{a['random_page_warm_ms']:.1f}"]]))
    out.append("\nTARGETS")
    checks = []
    for r in res.get("throughput", []):
        if r["tasks"] == "20":
            checks.append([f"{r['durability']} {r['procs']}p >= 1.0x SQLite",
                           f"{r['ratio']:.2f}x", verdict(r["ratio"] >= 1.0)])
            if r["procs"] == 4:
                p99 = r["fleetclaims"]["p99_ms"]
                checks.append([f"{r['durability']} 4p p99 <= 5 ms", f"{p99:.2f} ms",
                               verdict(p99 <= 5.0)])
    for r in res.get("scaling", []):
        need = {10_000: 0.8, 100_000: 0.5}.get(r["claims"])
        if need:
            checks.append([f"{r['claims']:,} claims >= {need}x of 20 (amortised)",
                           f"{r['fc_ratio_to_base']:.2f}x", verdict(r["fc_ratio_to_base"] >= need)])
    if "coldstart" in res:
        ms = res["coldstart"]["ms"]
        for k, v in ms.items():
            if (k.startswith("fleetclaims ") or "[no CLI]" in k) and "human" not in k:
                checks.append([f"cold start {k} <= 150 ms", f"{v:.0f} ms", verdict(v <= 150)])
        human, js = ms.get("fleetclaims list (human table)"), ms.get("fleetclaims list --json")
        if human and js:
            checks.append(["list (human) <= 1.5x list --json", f"{human / js:.2f}x",
                           verdict(human <= 1.5 * js)])
    more, extra = cells21.report_lines(res, table, verdict)
    out[-1:-1] = more  # (before the TARGETS heading)
    checks.extend(extra)
    checks.append(["explain / audit --task on 1,000,000 events <= 0.5 s",
                   "bench/year_bench.py", "n/a"])
    if "audit" in res:
        v = res["audit"]["verify_events_s"]
        checks.append(["audit verify >= 200k events/s", f"{v:,.0f}", verdict(v >= 200_000)])
    out.append(table(["target", "measured", ""], checks))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="bounded run (about 2-3 minutes)")
    ap.add_argument("--only", nargs="*",
                    choices=["throughput", "sizes", "scaling", "coldstart", "queue", "audit"],
                    help="run only these sections")
    ap.add_argument("--reps", type=int, help="repetitions per cell (quick 3, full 5)")
    ap.add_argument("--duration", type=float, help="seconds per trial window (quick 1, full 3)")
    ap.add_argument("--audit-events", type=int, help="journal size (quick 100k, full 1M)")
    ap.add_argument("--workdir", default=str(HERE / "results"),
                    help="where temporary registries go (must be the disk you measure)")
    ap.add_argument("--size-cells", type=int, nargs="*",
                    help="live claims per sizes cell (default 20 10000 100000; first is the base)")
    ap.add_argument("--out", help="JSON output path (default bench/results/<time>.json)")
    cfg = ap.parse_args(argv)
    cfg.reps = cfg.reps or (3 if cfg.quick else 5)
    cfg.duration = cfg.duration or (1.0 if cfg.quick else 3.0)
    cfg.audit_events = cfg.audit_events or (100_000 if cfg.quick else 1_000_000)
    cfg.audit_reps = 3
    cfg.cold_reps = 5 if cfg.quick else 9
    cfg.cold_size = 10_000
    cfg.sizes = [20, 1_000, 10_000, 100_000]
    cfg.size_cells = cfg.size_cells or [20, 10_000, 100_000]
    # (scaling, the older 4-size full-durability table, runs when asked: --only scaling)
    sections = cfg.only or ["throughput", "sizes", "coldstart", "queue", "audit"]

    import compileall
    import sqlite3

    # Byte-compile the package first, as pip does on a regular install: with
    # PYTHONDONTWRITEBYTECODE set (as on some machines) an editable checkout is otherwise
    # compiled from source by every fresh process, which bills ~40 ms of compile() to the
    # first-write and cold-start cells and measures nothing a user would see.
    compileall.compile_dir(str(Path(fleetclaims.__file__).parent), quiet=1)

    res: dict[str, Any] = {"meta": {
        "fleetclaims": fleetclaims.__version__, "sqlite": sqlite3.sqlite_version,
        "mode": "quick" if cfg.quick else "full", "cpus": os.cpu_count(),
        "python": platform.python_version(), "reps": cfg.reps, "duration": cfg.duration,
        "audit_events": cfg.audit_events, "cold_reps": cfg.cold_reps,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv[1:],
        "git": subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip(),
    }}
    res["meta"]["loadavg_start"] = os.getloadavg()
    res["meta"]["fleetclaims_dirty"] = subprocess.run(
        ["git", "-C", str(HERE.parent), "status", "--short", "--", "fleetclaims"],
        capture_output=True, text=True).stdout.count("\n")
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    work = Workdir(Path(cfg.workdir))
    keep: dict[str, str] = {}
    try:
        if "throughput" in sections:
            log("throughput")
            res["throughput"] = section_throughput(cfg, work, log)
        if "sizes" in sections:
            log("sizes (#21)")
            res["sizes"] = cells21.section_sizes(cfg, work, log)
        if "scaling" in sections:
            log("scaling")
            res["scaling"] = section_scaling(cfg, work, log, keep)
        if "coldstart" in sections:
            log("cold start")
            res["coldstart"] = section_coldstart(cfg, work, log, keep)
        if "queue" in sections:
            log("queue (#21)")
            res["queue"] = cells21.section_queue(cfg, log)
        if "audit" in sections:
            log(f"audit ({cfg.audit_events} events)")
            res["audit"] = section_audit(cfg, work, log)
    finally:
        work.cleanup()
    res["meta"]["elapsed_s"] = time.perf_counter() - t0
    res["meta"]["loadavg_end"] = os.getloadavg()
    text = report(res)
    print(text)
    out = Path(cfg.out) if cfg.out else HERE / "results" / (
        time.strftime("%Y%m%d-%H%M%S") + ("-quick" if cfg.quick else "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res["table"] = text
    out.write_text(json.dumps(res, indent=2, default=str))
    (out.parent / "latest.json").write_text(json.dumps(res, indent=2, default=str))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
