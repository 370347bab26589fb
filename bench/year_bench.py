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

from fleetclaims.store.file import segments  # noqa: E402
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
    elif kind == "lease_renewed":  # the holder extending its own lease: the compact form
        fields = {"type": kind, "task": fields["task"], "ttl": 45.0,
                  "boot_deadline": round(e["ts"] % 1e5 + 45, 6)}
    elif kind == "claim_completed":
        fields.setdefault("result", None)
    return fields


def write_journal(directory: Path, n: int) -> tuple[int, int]:
    """Seal ``n`` simulated events into ``directory``: sealed segments of SEGMENT_BYTES, as the
    store rotates them (``--plain``: one audit.jsonl), then audit.jsonl; (lines, refusals)."""
    directory.mkdir(parents=True, mode=0o700)
    seq, head = 0, "0" * 64
    runs: dict[tuple[Any, ...], list[Any]] = {}  # a refusal run -> [fields, count, first, last]
    refusals = 0
    active: list[bytes] = []
    size, first = 0, 1
    with open(directory / "audit.jsonl", "wb") as out:
        def put(fields: dict[str, Any], ts: float) -> None:
            nonlocal seq, head, size, first
            data, sealed = seal_events([fields], seq, head, ts)
            seq, head = sealed[-1]["seq"], sealed[-1]["hash"]
            if not SEGMENTED:
                out.write(data)
                return
            active.append(data)
            size += len(data)
            if size >= segments.SEGMENT_BYTES:
                segments.seal(directory, b"".join(active), first, seq, sync=False)
                active.clear()
                size, first = 0, seq + 1

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
        out.write(b"".join(active))
    return seq, refusals


SEGMENTED = True


def make_plain(year: Path, plain: Path) -> None:
    """The same journal as one plain audit.jsonl (the peer: the journal before segments)."""
    plain.mkdir(mode=0o700)
    with open(plain / "audit.jsonl", "wb") as out:
        for seg in segments.sealed(year):
            for lines in segments.read_blocks(seg):
                out.write(b"".join(line + b"\n" for line in lines))
        out.write((year / "audit.jsonl").read_bytes())


def in_process_explain(directory: Path, task: str, runs: int) -> list[float]:
    code = ("import sys, time, fleetclaims\nr = fleetclaims.Registry(sys.argv[1])\n"
            "r.store.read()\nt = time.perf_counter()\nx = r.explain(sys.argv[2])\n"
            "print(time.perf_counter() - t)\n")
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code, str(directory), task], check=True,
                              capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out.append(float(done.stdout))
    return out


def _ms(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1e3:.0f} ms ({min(values) * 1e3:.0f}-"
            f"{max(values) * 1e3:.0f})")


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# The command line, run so that the plain peer stays one plain journal (a write to it would
# otherwise seal its 400 MB into a segment): every command goes through this, the year's too.
CLI = ("import sys\nfrom fleetclaims.store.file import rest, segments\n"
       "if sys.argv[1] == 'plain':\n    segments.SEGMENT_BYTES = rest.DEFER_MIN = 1 << 62\n"
       "sys.argv = ['fleetclaims', *sys.argv[2:]]\n"
       "from fleetclaims.cli.console import run\nrun()\n")


# The plain peer's claims.json, left by this process itself (no settle helper).
PLAIN_SETTLE = ("import sys, fleetclaims\nfrom fleetclaims.store.file import rest, segments\n"
                "segments.SEGMENT_BYTES = 1 << 62\nrest.DEFER_MIN = 1 << 62\n"
                "r = fleetclaims.Registry(sys.argv[1])\nr.store.checkpoint()\nr.close()\n")


def timed(argv: list[str], directory: Path, runs: int) -> tuple[float, str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(directory), PYTHONPATH=str(ROOT),
               FLEETCLAIMS_LOCK_TIMEOUT="120")  # (a loaded machine: a checkpoint may be slow)
    times, out = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CLI, directory.name, *argv], env=env,
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
    ap.add_argument("--plain", action="store_true",
                    help="one plain audit.jsonl (no sealed segments), as before #15 part 3")
    cfg = ap.parse_args(argv)
    global SEGMENTED
    SEGMENTED = not cfg.plain
    base = Path(cfg.keep or tempfile.mkdtemp(prefix="fc-year-"))
    # The registries' anchors (#16) live beside them, not in the user's state directory: a
    # rerun into the same --keep directory is then a new history, not a vanished one.
    os.environ["FLEETCLAIMS_ANCHOR_DIR"] = str(base / "anchors")
    year, plain, fresh = base / "year", base / "plain", base / "fresh"
    try:
        started = time.perf_counter()
        lines, refusals = write_journal(year, cfg.events)
        print(f"journal: {cfg.events:,} events ({refusals:,} refusals) in {lines:,} lines, "
              f"{disk_bytes(year) / 1e6:.1f} MB, written in {time.perf_counter() - started:.0f} s")
        make_plain(year, plain)
        # The first writer replays the journal and leaves claims.json (a reader writes nothing:
        # until then every command would replay the whole journal).
        for name, d in (("segments", year), ("plain", plain)):
            first, _ = timed(["claim", "year-first", "--owner", "bench"], d, 1)
            if name == "plain":  # (the settle helper, a fresh interpreter, would seal it)
                subprocess.run([sys.executable, "-c", PLAIN_SETTLE, str(d)], check=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
            size = disk_bytes(d)
            print(f"{name}: first write (replays the journal, leaves claims.json): {first:.1f} s; "
                  f"on disk at rest: {size / 1e6:.1f} MB = {size / cfg.events:.0f} bytes per "
                  f"event")
        fresh_registry(fresh, 20_000)
        task = "test/item-00001"
        rows = [
            ("fleetclaims list --json", ["list", "--json"], ["list", "--json"]),
            ("fleetclaims explain TASK", ["explain", task], ["explain", "task-00001"]),
            ("first write (claim)", ["claim", "year-new-{}", "--owner", "bench"],
             ["claim", "fresh-new-{}", "--owner", "bench"]),
        ]
        for name, a, b in rows:
            got: dict[str, list[float]] = {"segments": [], "fresh": []}
            if a[0] != "claim":  # (reads only: a write to the plain peer could seal it)
                got["plain"] = []
            for _ in range(cfg.runs):  # interleaved: one run of each in turn
                stamp = str(time.time_ns())
                for key, d, argv in (("segments", year, a), ("plain", plain, a),
                                     ("fresh", fresh, b)):
                    if key in got:
                        got[key].append(timed([x.replace("{}", stamp) for x in argv], d, 1)[0])
            print(f"{name}: " + ", ".join(f"{k} {_ms(v)}" for k, v in got.items())
                  + " (fresh: a new 20,000-claim registry)")
        print("explain in process (no interpreter start): segments "
              f"{_ms(in_process_explain(year, task, cfg.runs))}, plain "
              f"{_ms(in_process_explain(plain, task, cfg.runs))}")
        ver: dict[str, list[float]] = {"segments": [], "plain": []}
        for _ in range(cfg.runs):
            for key, d in (("segments", year), ("plain", plain)):
                ver[key].append(timed(["audit", "verify", "--json"], d, 1)[0])
        print("audit verify events/s: " + ", ".join(
            f"{k} {cfg.events / statistics.median(v):,.0f} ({cfg.events / max(v):,.0f}-"
            f"{cfg.events / min(v):,.0f})" for k, v in ver.items()))
    finally:
        if not cfg.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
