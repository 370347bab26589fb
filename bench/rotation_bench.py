"""The operation that rotates the journal at 100,000 claims (#21: no operation > 20 ms).

    .venv/bin/python bench/rotation_bench.py [--src DIR] [--reps 3] [--ops 30000]

Copies a registry built by bench/state_bench.py (100,000 claims, 20% live; ``--src``) and, in
a fresh interpreter per run, lowers ``segments.SEGMENT_BYTES`` to ``--segment-mib`` (32 MiB:
above the copied journal's ~25 MB, which would otherwise be sealed inline at once, the
fallback for a journal already past twice the threshold) so that the journal rotates within ``--ops`` claim+release cycles (durability
"process"); every operation is timed. (Much smaller segments are not what a rotation meets:
once a threshold's worth of lines follows the sealed head, a writer waits for its rotation's
child, which at 100,000 claims takes ~1 s, the time it takes to write ~1 MiB of journal.) Two modes, interleaved run by run:

- ``child``: as shipped (the rotation's snapshot written by a forked child, the switch at a
  later operation);
- ``locked``: the rotation's snapshot written under the lock, as before (rotation's fork
  refused; checkpoints are still forked off in both modes).

Printed per mode: the slowest operation, p99, rotations seen, medians with [min-max] over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time, types
sys.path.insert(0, sys.argv[3])
import fleetclaims
from fleetclaims.store.file import rest, rotation, segments
segments.SEGMENT_BYTES = int(sys.argv[5]) << 20
if sys.argv[2] == "locked":
    rotation.rest = types.SimpleNamespace(fork_worker=lambda *a, **k: 0, reaped=rest.reaped)
reg = fleetclaims.Registry(sys.argv[1], durability="process")
reg.claim("warm", owner="bench", ttl=600)
times = []
for i in range(int(sys.argv[4])):
    t = time.perf_counter()
    c = reg.claim("rot-%d" % (i % 50), owner="bench", ttl=600)
    t1 = time.perf_counter()
    reg.release(c.task, token=c.token)
    times += [(t1 - t) * 1e3, (time.perf_counter() - t1) * 1e3]
    if i % 500 == 0:
        time.sleep(0.05)
rotations = len(segments.sealed(reg.store.directory))
reg.close()
times.sort()
print(json.dumps({"max": times[-1], "p99": times[int(len(times) * 0.99)],
                  "rotations": rotations}))
"""


def run(src: Path, mode: str, ops: int, segment_mib: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fc-rot-") as tmp:
        reg = Path(tmp) / "reg"
        shutil.copytree(src, reg)
        out = subprocess.run([sys.executable, "-c", CHILD, str(reg), mode,
                              str(HERE.parent), str(ops), str(segment_mib)],
                             capture_output=True, text=True, timeout=900, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{mode} run failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ops", type=int, default=30000, help="claim+release cycles per run")
    ap.add_argument("--segment-mib", type=int, default=32)
    args = ap.parse_args()
    src = Path(args.src) if args.src else next(
        p / "fc" for p in sorted(Path("/tmp/fc-state-bench").glob("c100000-l0.2-*")))
    print(f"load before: {os.getloadavg()}")
    results: dict[str, list[dict[str, float]]] = {"child": [], "locked": []}
    for _ in range(args.reps):
        for mode in results:
            results[mode].append(run(src, mode, args.ops, args.segment_mib))
    for mode, runs in results.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> str:
            vals = [r[key] for r in runs]
            return f"{statistics.median(vals):7.1f} [{min(vals):.1f}-{max(vals):.1f}]"

        print(f"{mode:7s} slowest op ms {med('max')}  p99 ms {med('p99')}  "
              f"rotations {[int(r['rotations']) for r in runs]}")
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
