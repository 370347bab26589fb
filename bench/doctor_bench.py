"""How `fleetclaims doctor` grows with the registry: time and peak memory of ``check`` and
``check(fix=True)`` on registries of N claims, for several N.

    .venv/bin/python bench/doctor_bench.py                 # 25k, 50k, 100k claims, 10 events each
    .venv/bin/python bench/doctor_bench.py --claims 2000 4000 --events-per-claim 5

Each registry is built directly (sealed lines written with the core's chain functions, which is
~50x quicker than going through the API), given its snapshot by the store itself, then a tail
of 1,000 renewals after the snapshot (as a registry between checkpoints has), and checked by
doctor, so it is a valid registry. Measured, each in a fresh process (peak RSS is that
process's):

- check: ``doctor`` on the registry as built;
- fix: ``doctor --fix`` on a copy with one byte flipped in the tail after the snapshot (the
  common damage: the last lines written). doctor keeps the verified prefix, quarantines the
  original, names the claims the rest held, writes a new snapshot and checks again;
- fix-mid: the same with the byte flipped three quarters of the way into the journal, before
  the snapshot: the snapshot is then ahead of the verified journal, and doctor re-records its
  claims in ``registry_rebuilt`` events of at most 10,000 records each.

Target (issue 14): 2x the claims costs at most 2.3x the time, and 100,000 claims / 1,000,000
events take under 60 s and 500 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetclaims.core.chain import GENESIS, envelope, seal  # noqa: E402

T0 = 1_800_000_000.0
IDENTITY = {"host": "benchhost", "machine": "bench-machine", "boot": "bench-boot",
            "pidns": "pidns:1", "pid": 4242, "start": 1}


TAIL = 1000


def build(directory: Path, claims: int, per_claim: int) -> int:
    """Write a registry of ``claims`` live claims, each created then renewed ``per_claim - 1``
    times (renewals interleaved in rounds, as many holders would), give it its snapshot, then
    renew the first TAIL claims once more; returns the event count."""
    directory.mkdir(mode=0o700, parents=True)
    with open(directory / "audit.jsonl", "wb") as out:
        os.chmod(directory / "audit.jsonl", 0o600)
        seq, prev = _write(out, 0, GENESIS, claims, range(per_claim))
    finish(directory)
    with open(directory / "audit.jsonl", "ab") as out:
        seq, prev = _write(out, seq, prev, min(TAIL, claims), [per_claim])
    return seq


def _write(out: Any, seq: int, prev: str, claims: int, rounds: Iterable[int]) -> tuple[int, str]:
    batch: list[bytes] = []

    def emit(fields: dict[str, object], ts: float) -> None:
        nonlocal seq, prev
        seq += 1
        line, prev = seal(orjson.dumps(envelope(seq, ts, fields, prev)))
        batch.append(line)
        if len(batch) >= 10_000:
            out.write(b"".join(batch))
            batch.clear()

    if seq == 0:
        emit({"type": "registry_created", "origin": "bench0000000000", "actor": "fleetclaims"},
             T0)
    for round_ in rounds:
        for i in range(claims):
            ts = T0 + round_ * 10.0 + i * 1e-4
            common = {"task": f"task-{i:07d}", "actor": f"agent-{i % 50}",
                      "owner": f"agent-{i % 50}", "fence": i + 1}
            lease = {"ttl": 3600.0, "expires_at": ts + 3600.0, "boot_deadline": 1060.0 + ts - T0,
                     "deadline_boot": "bench-boot"}
            if round_ == 0:
                token = hashlib.sha256(b"bench-token:%d" % i).hexdigest()
                emit({"type": "claim_created", **common, "token_hash": token, "phase": "working",
                      "priority": 100, "note": None, "metadata": None, "identity": IDENTITY,
                      **lease}, ts)
            else:
                emit({"type": "lease_renewed", **common, **lease}, ts)
    out.write(b"".join(batch))
    return seq, prev


def finish(directory: Path) -> None:
    """Give the registry its snapshot through the store."""
    from fleetclaims.store.file.store import FileStore
    from fleetclaims.system import SystemClock

    store = FileStore(directory, clock=SystemClock())
    try:
        store.checkpoint()
    finally:
        store.close()


def damage(directory: Path, where: float) -> None:
    """Flip one byte in the line at fraction ``where`` of the journal."""
    path = directory / "audit.jsonl"
    with open(path, "r+b") as f:
        f.seek(int(os.path.getsize(path) * where))
        f.readline()
        at = f.tell() + 40
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def measure(directory: str, fix: bool) -> None:
    """(in a fresh process) run doctor once and print its time and peak RSS as JSON."""
    from fleetclaims.store.file import doctor

    start = time.perf_counter()
    report = doctor.check(directory, fix=fix)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if sys.platform == "darwin":
        peak //= 1024  # bytes there, KiB on Linux
    print(json.dumps({"seconds": elapsed, "rss": peak, "ok": report.ok,
                      "kinds": report.kinds()}))


def run_measure(directory: Path, fix: bool) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--measure", str(directory)]
                         + (["--fix"] if fix else []), check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, nargs="+", default=[25_000, 50_000, 100_000])
    parser.add_argument("--events-per-claim", type=int, default=10)
    parser.add_argument("--dir", help="where to build the registries (default: a temp dir)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--fix", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.fix)
        return
    base = Path(tempfile.mkdtemp(prefix="fc-doctor-", dir=args.dir))
    rows: list[tuple[int, dict[str, dict[str, Any]]]] = []
    try:
        for n in args.claims:
            rows.append((n, run_size(base, n, args.events_per_claim)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print("claims ratio " + "".join(f"  {c} time  {c} RSS" for c in CASES))
    for (n1, a), (n2, b) in itertools.pairwise(rows):
        cells = "".join(f"  {b[c]['seconds'] / a[c]['seconds']:>{len(c) + 5}.2f}"
                        f"  {b[c]['rss'] / a[c]['rss']:>{len(c) + 4}.2f}" for c in CASES)
        print(f"{n2 / n1:>12.2f} {cells}")


CASES = ("check", "fix", "fix-mid")


def run_size(base: Path, n: int, per_claim: int) -> dict[str, dict[str, Any]]:
    reg = base / f"r{n}"
    t = time.perf_counter()
    events = build(reg, n, per_claim)
    built = time.perf_counter() - t
    out = {"check": run_measure(reg, fix=False)}
    if not out["check"]["ok"]:
        raise SystemExit(f"the built registry does not check: {out['check']}")
    size = os.path.getsize(reg / "audit.jsonl")
    tail = TAIL * (size // events)  # about where the tail after the snapshot begins
    for case, where in (("fix", 1 - tail / 2 / size), ("fix-mid", 0.75)):
        broken = base / f"r{n}-{case}"
        shutil.copytree(reg, broken)
        damage(broken, where)
        out[case] = run_measure(broken, fix=True)
        shutil.rmtree(broken)
    shutil.rmtree(reg)
    line = "   ".join(f"{c} {out[c]['seconds']:6.2f} s {out[c]['rss'] / 1e6:5.0f} MB"
                      for c in CASES)
    print(f"{n:>8} claims {events:>9} events ({size / 1e6:.0f} MB)  built in {built:5.1f} s   "
          f"{line}   (fix found: {', '.join(out['fix']['kinds'])}; fix-mid found: "
          f"{', '.join(out['fix-mid']['kinds'])})", flush=True)
    return out


if __name__ == "__main__":
    main()
