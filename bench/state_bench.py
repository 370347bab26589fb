"""Compact state (#21): memory and first write of a fresh process holding a big registry.

    .venv/bin/python bench/state_bench.py                      # 100,000 claims, 20% live
    .venv/bin/python bench/state_bench.py --claims 100000 --live 1.0 --reps 5

A registry of ``--claims`` claims is built once (``--live`` of them held, the rest ended:
half released, half completed) and kept under ``--cache``; the SQLite peer
(``bench/sqlite_peer.py``) holds the same number of claim rows. Each repetition starts a fresh
interpreter per system, interleaved (fleetclaims, SQLite, fleetclaims, ...), that:

- opens the registry and times its first write (a claim of a new task, durability "full"),
- times ``get`` of an ended claim (fleetclaims only: the compact records must answer it),
- reports its resident set size (psutil) after the write, and the RSS of the same interpreter
  with the package imported and nothing opened (the floor), so "held" = RSS - floor.

Printed: medians with [min-max] over the repetitions, and the ratio fleetclaims/SQLite.
The child checkpoints after measuring, so every repetition starts from a registry at rest.

Measured 2026-12-01 on the shared 2-core machine (load average 6-7 from other work), 7 reps:

    100,000 claims   first write          RSS      (before #21, format 2, load ~1.7)
    20% live         214 ms [161-285]     69 MB    997 ms [976-1203], 203 MB
    100% live        130 ms [118-157]     64 MB
    SQLite peer      8-13 ms              20.5 MB

What a first write still pays at 100,000 claims: reading the 40-45 MB claims.json (~40 ms)
and its SHA-256 (~45 ms); no object is built per claim.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CHILD_FC = r"""
import json, os, sys, time, psutil
import fleetclaims
floor = psutil.Process().memory_info().rss
path, tag = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
reg = fleetclaims.Registry(path)
reg.claim("first-" + tag, owner="bench", ttl=600.0)
t1 = time.perf_counter()
rss = psutil.Process().memory_info().rss
t2 = time.perf_counter()
got = reg.get("task-1")
t3 = time.perf_counter()
assert got is not None, "an ended claim must stay reachable"
reg.store.checkpoint()
reg.close()
print(json.dumps({"first_ms": (t1 - t0) * 1e3, "rss": rss, "floor": floor,
                  "get_ms": (t3 - t2) * 1e3, "state": got.state}))
"""

CHILD_SQ = r"""
import json, os, sys, time, psutil
sys.path.insert(0, sys.argv[3])
from sqlite_peer import SqliteRegistry
floor = psutil.Process().memory_info().rss
path, tag = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
db = SqliteRegistry(os.path.join(path, "claims.db"), synchronous="FULL")
db.claim("first-" + tag, owner="bench", ttl=600.0)
t1 = time.perf_counter()
rss = psutil.Process().memory_info().rss
db.close()
print(json.dumps({"first_ms": (t1 - t0) * 1e3, "rss": rss, "floor": floor}))
"""


def build_fc(path: Path, claims: int, live: float) -> None:
    import fleetclaims

    reg = fleetclaims.Registry(path, durability="process")
    n_live = int(claims * live)
    for i in range(claims):
        task = f"task-{i}"
        c = reg.claim(task, owner=f"agent-{i % 4}", ttl=86400.0)
        if i >= n_live:  # (task-0.. stay held; the rest end)
            if i % 2:
                reg.complete(task, token=c.token)
            else:
                reg.release(task, token=c.token)
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()


def build_sq(path: Path, claims: int) -> None:
    from sqlite_peer import SqliteRegistry

    db = SqliteRegistry(os.path.join(path, "claims.db"), synchronous="NORMAL")
    db.prepopulate(claims, prefix="task-")
    db.close()


def child(code: str, path: Path, tag: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, str(path), tag, str(HERE)],
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def fmt(values: list[float], unit: str, scale: float = 1.0) -> str:
    vals = [v / scale for v in values]
    return (f"{statistics.median(vals):8.1f} {unit} "
            f"[{min(vals):.1f}-{max(vals):.1f}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=100_000)
    ap.add_argument("--live", type=float, default=0.2, help="fraction of claims held")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cache", default="/tmp/fc-state-bench")
    args = ap.parse_args()
    # (a registry folder, once removed, is refused by its anchor: each build gets a new name)
    prefix = f"c{args.claims}-l{args.live}-"
    built = sorted(p for p in Path(args.cache).glob(prefix + "*") if (p / "built").exists())
    base = built[-1] if built else Path(args.cache) / f"{prefix}{int(time.time())}"
    fc, sq = base / "fc", base / "sq"
    if not (base / "built").exists():
        print(f"building {args.claims} claims ({args.live:.0%} live) in {fc} ...", flush=True)
        t = time.perf_counter()
        fc.mkdir(parents=True, exist_ok=True)
        build_fc(fc, args.claims, args.live)
        print(f"  built in {time.perf_counter() - t:.0f} s", flush=True)
        sq.mkdir(parents=True, exist_ok=True)
        build_sq(sq, args.claims)
        (base / "built").touch()
    print(f"load: {os.getloadavg()}  claims.json {os.path.getsize(fc / 'claims.json') / 1e6:.1f} MB"
          f"  audit.jsonl {os.path.getsize(fc / 'audit.jsonl') / 1e6:.1f} MB")
    # A pip install byte-compiles the package; with PYTHONDONTWRITEBYTECODE (as on these
    # machines) every process would otherwise compile the modules it imports (as bench/run.py).
    import compileall

    compileall.compile_dir(str(HERE.parent / "fleetclaims"), quiet=1)
    res: dict[str, list[dict[str, float]]] = {"fc": [], "sq": []}
    stamp = f"{os.getpid()}-{int(time.time())}"
    for rep in range(args.reps):
        res["fc"].append(child(CHILD_FC, fc, f"{stamp}-{rep}"))
        res["sq"].append(child(CHILD_SQ, sq, f"{stamp}-{rep}"))
    f_first = [r["first_ms"] for r in res["fc"]]
    s_first = [r["first_ms"] for r in res["sq"]]
    f_rss = [r["rss"] for r in res["fc"]]
    s_rss = [r["rss"] for r in res["sq"]]
    f_held = [r["rss"] - r["floor"] for r in res["fc"]]
    s_held = [r["rss"] - r["floor"] for r in res["sq"]]
    mb = 1e6
    print(f"{args.claims} claims, {args.live:.0%} live, {args.reps} reps (median [range])")
    print(f"  first write  fleetclaims {fmt(f_first, 'ms')}   sqlite {fmt(s_first, 'ms')}"
          f"   ratio {statistics.median(f_first) / statistics.median(s_first):.1f}x")
    print(f"  RSS          fleetclaims {fmt(f_rss, 'MB', mb)}   sqlite {fmt(s_rss, 'MB', mb)}"
          f"   ratio {statistics.median(f_rss) / statistics.median(s_rss):.1f}x")
    print(f"  held (RSS - import floor) fleetclaims {fmt(f_held, 'MB', mb)}"
          f"   sqlite {fmt(s_held, 'MB', mb)}")
    print(f"  get(ended claim)  fleetclaims {fmt([r['get_ms'] for r in res['fc']], 'ms')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
