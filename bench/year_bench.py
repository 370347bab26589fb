"""A year of use: a registry of 1,000,000 events (4 agents, heartbeats, refusals, 20,000
tasks) and what it costs at rest and to a person reading it (issue 15, part 4).

    .venv/bin/python bench/year_bench.py                  # 1,000,000 events
    .venv/bin/python bench/year_bench.py --events 100000  # quicker

The journal is written directly (building a million events through the Registry takes many
minutes): tests/report_synth.py simulates the fleet, each event is given the fields the real
store records (a grant's token hash, owner process identity and boot deadline, a renewal's ttl
and boot deadline) and sealed with the store's own ``seal_events``, so the lines are the bytes
the store writes. Refusals are recorded the way the store records them since #15: the first of
a run (same requester, task and holder) in full, the repeats as one line with a count.

Measured, each as a fresh process (median of --runs): bytes on disk per event, the first write
(it replays the journal and leaves claims.json), cold ``fleetclaims list --json``,
``audit verify`` (events/s), ``explain TASK`` and the first write of a fresh process; the last
three also on a fresh registry of 20,000 claims, for comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import report_synth  # noqa: E402

from fleetclaims.store.file.journal import seal_events  # noqa: E402

BOOT = "28f399a4-bebd-4903-87b5-6495c35fc527"
IDENTITY = {"host": "laptop", "machine": "3fbe8c259158d247d09c645aeb04064a", "boot": BOOT,
            "pidns": "pid:[4026531836]", "pid": 26940, "start": 539291}
GRANTS = {"claim_created", "claim_recovered", "claim_preempted", "claim_handed_off"}


def _realistic(e: dict[str, Any]) -> dict[str, Any]:
    """The synthetic event with the members the store records for its type."""
    fields = {k: v for k, v in e.items() if k not in ("seq", "ts")}
    kind = fields["type"]
    if kind in GRANTS:
        fields.update(token_hash=os.urandom(32).hex(), note=None, metadata=None,
                      identity={**IDENTITY, "pid": 20000 + hash(fields["owner"]) % 1000},
                      ttl=45.0, boot_deadline=round(e["ts"] % 1e5 + 45, 6), deadline_boot=BOOT)
        fields.setdefault("phase", "working")
        fields.setdefault("priority", 100)
    elif kind == "lease_renewed":
        fields.update(ttl=45.0, boot_deadline=round(e["ts"] % 1e5 + 45, 6), deadline_boot=BOOT)
    elif kind == "claim_completed":
        fields.setdefault("result", None)
    return fields


def write_journal(directory: Path, n: int) -> tuple[int, int]:
    """Seal ``n`` simulated events into ``directory``/audit.jsonl; (lines, refusals)."""
    directory.mkdir(parents=True, mode=0o700)
    seq, head = 0, "0" * 64
    runs: dict[tuple[Any, ...], list[Any]] = {}  # a refusal run -> [fields, count, first, last]
    refusals = 0
    with open(directory / "audit.jsonl", "wb") as out:
        def put(fields: dict[str, Any], ts: float) -> None:
            nonlocal seq, head
            data, sealed = seal_events([fields], seq, head, ts)
            out.write(data)
            seq, head = sealed[-1]["seq"], sealed[-1]["hash"]

        def flush(key: tuple[Any, ...]) -> None:
            fields, count, first, last = runs.pop(key)
            if count:
                put({**fields, "count": count, "first": first, "last": last}, last)

        for e in report_synth.events(n):
            fields = _realistic(e)
            if fields["type"] == "claim_rejected":
                refusals += 1
                key = (fields["task"], fields["actor"], fields.get("holder"), fields.get("fence"))
                run = runs.get(key)
                if run is not None and run[1] and e["ts"] - run[2] >= 30:
                    flush(key)  # the store records a pending count at least every 30 s
                    runs[key] = run = [fields, 0, e["ts"], e["ts"]]
                if run is None:
                    runs[key] = [fields, 0, e["ts"], e["ts"]]
                    put(fields, e["ts"])
                else:
                    run[1] += 1
                    run[2] = run[2] if run[1] > 1 else e["ts"]
                    run[3] = e["ts"]
                continue
            if fields["type"] != "lease_renewed":  # the holding changed: runs are recorded
                for key in [k for k in runs if k[0] == fields.get("task")]:
                    flush(key)
            put(fields, e["ts"])
        for key in list(runs):
            flush(key)
    return seq, refusals


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def timed(argv: list[str], directory: Path, runs: int) -> tuple[float, str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(directory), PYTHONPATH=str(ROOT))
    times, out = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "fleetclaims", *argv], env=env,
                              capture_output=True, text=True, cwd=tempfile.gettempdir())
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 3):
            raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr.strip()}")
        out = done.stdout
        time.sleep(1.1)  # at rest before the next run (claims.json settled)
    return statistics.median(times), out


def fresh_registry(directory: Path, claims: int) -> None:
    code = ("import sys, fleetclaims\nr = fleetclaims.Registry(sys.argv[1], "
            "durability='process')\n"
            f"for i in range({claims}):\n    r.claim(f'task-{{i:05d}}', owner='pop', ttl=86400)\n"
            "r.close()\n")
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="build the registry here and keep it")
    cfg = ap.parse_args(argv)
    base = Path(cfg.keep or tempfile.mkdtemp(prefix="fc-year-"))
    # The registries' anchors (#16) live beside them, not in the user's state directory: a
    # rerun into the same --keep directory is then a new history, not a vanished one.
    os.environ["FLEETCLAIMS_ANCHOR_DIR"] = str(base / "anchors")
    year, fresh = base / "year", base / "fresh"
    try:
        started = time.perf_counter()
        lines, refusals = write_journal(year, cfg.events)
        print(f"journal: {cfg.events:,} events ({refusals:,} refusals) in {lines:,} lines, "
              f"{disk_bytes(year) / 1e6:.1f} MB, written in {time.perf_counter() - started:.0f} s")
        # The first writer replays the journal and leaves claims.json (a reader writes nothing:
        # until then every command would replay the whole journal).
        first, _ = timed(["claim", "year-first", "--owner", "bench"], year, 1)
        size = disk_bytes(year)
        print(f"first write (replays the journal, leaves claims.json): {first:.1f} s")
        print(f"on disk at rest: {size / 1e6:.1f} MB = {size / cfg.events:.0f} bytes per event "
              f"({size / lines:.0f} per line)")
        fresh_registry(fresh, 20_000)
        task = "test/item-00001"
        rows = [
            ("fleetclaims list --json", ["list", "--json"], ["list", "--json"]),
            ("fleetclaims explain TASK", ["explain", task], ["explain", "task-00001"]),
            ("first write (claim)", ["claim", "year-new-{}", "--owner", "bench"],
             ["claim", "fresh-new-{}", "--owner", "bench"]),
        ]
        for name, a, b in rows:
            stamp = str(time.time_ns())
            ty, _ = timed([x.replace("{}", stamp) for x in a], year, cfg.runs)
            tf, _ = timed([x.replace("{}", stamp) for x in b], fresh, cfg.runs)
            print(f"{name}: {ty * 1e3:.0f} ms on the year, {tf * 1e3:.0f} ms on a fresh "
                  "20,000-claim registry")
        tv, _ = timed(["audit", "verify", "--json"], year, 1)
        print(f"audit verify: {tv:.1f} s, {lines / tv:,.0f} lines/s "
              f"({cfg.events / tv:,.0f} events/s)")
    finally:
        if not cfg.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
