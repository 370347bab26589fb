"""A long replay holds no lock (#21): one process replays a journal with no snapshot while
another writer, loaded before, keeps writing with a short lock timeout.

    .venv/bin/python bench/replay_bench.py [--claims 100000] [--lock-timeout 1.0] [--keep DIR]

Builds a registry of N claims (durability="process"), removes claims.json, starts a fresh
process whose first claim replays the whole journal, and meanwhile cycles claim+release in
this process. Prints the replay time, the cycles done meanwhile, how many hit RegistryBusy
(target: none), the slowest cycle, and whether the replayer left claims.json behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fleetclaims import Registry, RegistryBusy  # noqa: E402

REPLAYER = ("import os, sys, time; from fleetclaims import Registry; t = time.perf_counter(); "
            "r = Registry(sys.argv[1]); r.claim('replayer-%d' % os.getpid(), owner='a'); "
            "print(time.perf_counter() - t); r.close()")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claims", type=int, default=100_000)
    ap.add_argument("--lock-timeout", type=float, default=1.0)
    ap.add_argument("--keep", help="reuse/keep the registry here (built when absent)")
    cfg = ap.parse_args()
    base = cfg.keep or tempfile.mkdtemp(prefix="replay-", dir=HERE / "results")
    path = os.path.join(base, "reg")
    if not os.path.exists(path):
        from run import populate_fc

        print(f"populating {cfg.claims} claims: {populate_fc(path, cfg.claims):.0f} s")
    writer = Registry(path, lock_timeout=cfg.lock_timeout, durability="process")
    writer.claim(f"writer-{os.getpid()}", owner="b")
    os.unlink(os.path.join(path, "claims.json"))
    replayer = subprocess.Popen([sys.executable, "-c", REPLAYER, path], stdout=subprocess.PIPE,
                                text=True)
    busy = cycles = 0
    worst = 0.0
    while replayer.poll() is None:
        t = time.perf_counter()
        try:
            c = writer.claim(f"w{cycles % 5}", owner="b")
            writer.release(f"w{cycles % 5}", token=c.token)
        except RegistryBusy:
            busy += 1
        worst = max(worst, time.perf_counter() - t)
        cycles += 1
    took = float((replayer.stdout.read() if replayer.stdout else "nan").strip() or "nan")
    writer.close()
    print(f"replay {took:.1f} s; meanwhile {cycles} cycles, {busy} RegistryBusy, slowest "
          f"{worst * 1e3:.0f} ms; claims.json left: "
          f"{os.path.exists(os.path.join(path, 'claims.json'))}; load {os.getloadavg()[0]:.1f}")
    if not cfg.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if busy else 0


if __name__ == "__main__":
    raise SystemExit(main())
