"""Contention with an oracle: many processes claim, renew, release, complete and take over stale
claims while some are SIGSTOPped and SIGKILLed at random; each logs what it observed; the oracle
replays the journal and checks every guarantee against it.

CI form: 8 workers x 120 operations; FLEETCLAIMS_LONG=1 (or stress/contention.py): 8 x 500.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from fc_support import LONG, append_raw, journal_lines, replay

from fleetclaims.core import events as ev

pytestmark = pytest.mark.slow

GRANTS = {"claim_created", "claim_recovered", "claim_preempted", "claim_handed_off"}
ENDS = {"claim_released", "claim_released_forced", "claim_completed"}
LEASE_SLACK = 0.05  # boot clock vs wall clock between two readings on one machine

WORKER = r"""
import json, os, random, sys, time
import fleetclaims
from fleetclaims.core import events as ev
from fleetclaims.core.chain import token_hash

directory, owner, seed, log_path = sys.argv[1], sys.argv[2], sys.argv[4], sys.argv[5]
nops = int(sys.argv[3])
rnd = random.Random(seed)
reg = fleetclaims.Registry(directory, lock_timeout=4)
tasks = [f"job-{k}" for k in range(10)]
held = {}  # task -> (token, fence)
log = open(log_path, "a", buffering=1)

def emit(**entry):
    log.write(json.dumps(entry) + "\n")

for i in range(nops):
    r = rnd.random()
    if held and r < 0.30:
        op, task = "renew", rnd.choice(sorted(held))
    elif held and r < 0.45:
        op, task = "release", rnd.choice(sorted(held))
    elif held and r < 0.55:
        op, task = "complete", rnd.choice(sorted(held))
    elif held and r < 0.60:
        op, task = "abandon", rnd.choice(sorted(held))
    else:
        op, task = "claim", rnd.choice(tasks)
    try:
        if op == "claim":
            c = reg.claim(task, owner=owner, ttl=1.0, take_stale=rnd.random() < 0.8)
            held[task] = (c.token, c.fence)
            emit(i=i, op=op, task=task, ok=True, seq=c.seq, fence=c.fence,
                 th=token_hash(c.token), kind="grant")
        elif op == "renew":
            c = reg.renew(task, token=held[task][0])
            emit(i=i, op=op, task=task, ok=True, seq=c.seq, fence=c.fence)
        elif op == "complete":
            c = reg.complete(task, token=held[task][0])
            held.pop(task)
            emit(i=i, op=op, task=task, ok=True, seq=c.seq, fence=c.fence)
        elif op == "release":
            token, fence = held.pop(task)
            live = reg.release(task, token=token)
            emit(i=i, op=op, task=task, ok=True, live=live, fence=fence)
        else:  # stop renewing: the lease runs out and someone may take it over
            held.pop(task)
            emit(i=i, op=op, task=task, ok=True)
    except fleetclaims.TaskCompleted as exc:
        emit(i=i, op=op, task=task, ok=False, err=exc.code)
        if op == "claim":
            try:
                back = reg.reopen(task, reason="contention test", actor=owner)
                emit(i=i, op="reopen", task=task, ok=True, reopened=back is not None)
            except fleetclaims.FleetclaimsError as again:  # reopened and claimed meanwhile
                emit(i=i, op="reopen", task=task, ok=False, err=again.code)
        else:
            held.pop(task, None)
    except fleetclaims.ClaimConflict as exc:
        emit(i=i, op=op, task=task, ok=False, err=exc.code, holder=exc.holder, fence=exc.fence,
             stale=exc.stale)
    except fleetclaims.RegistryBusy as exc:
        emit(i=i, op=op, task=task, ok=False, err=exc.code)
    except fleetclaims.NotHolder as exc:  # LeaseExpired, ClaimSuperseded too
        held.pop(task, None)
        emit(i=i, op=op, task=task, ok=False, err=exc.code)
    except Exception as exc:
        emit(i=i, op=op, task=task, ok=False, err="UNTYPED", detail=repr(exc))
        raise
    if rnd.random() < 0.3:
        time.sleep(rnd.random() * 0.02)
emit(done=True, t=time.time())
"""


@dataclass
class Incarnation:
    owner: str
    proc: subprocess.Popen[bytes]
    log: Path
    killed_at: float | None = None


@dataclass
class Run:
    directory: Path
    incarnations: list[Incarnation] = field(default_factory=list)
    stops: int = 0
    kills: int = 0
    elapsed: float = 0.0


def run_contention(root: Path, workers: int, nops: int, *, seed: int = 1,
                   max_kills: int = 6, chaos: bool = True) -> Run:
    directory = root / "reg"
    script = root / "worker.py"
    script.write_text(WORKER)
    rnd = random.Random(seed)
    run = Run(directory)
    started = time.monotonic()

    def spawn(slot: int, gen: int, ops: int) -> Incarnation:
        owner = f"w{slot}-g{gen}"
        log = root / f"{owner}.log"
        with open(root / f"{owner}.err", "wb") as err:
            proc = subprocess.Popen([sys.executable, str(script), str(directory), owner,
                                     str(ops), f"{seed}:{owner}", str(log)], stderr=err)
        inc = Incarnation(owner, proc, log)
        run.incarnations.append(inc)
        return inc

    # Create the registry first so that workers do not race on creating it.
    import fleetclaims

    fleetclaims.Registry(directory).close()
    fleetclaims.Registry(directory).stats()
    live: dict[int, tuple[Incarnation, int]] = {s: (spawn(s, 0, nops), 0) for s in range(workers)}
    stopped: set[int] = set()
    timers: list[threading.Timer] = []
    rounds = 0
    while live:
        time.sleep(rnd.uniform(0.02, 0.12))
        for slot, (inc, _) in list(live.items()):
            if inc.proc.poll() is not None and inc.proc.pid not in stopped:
                del live[slot]
        if not chaos or not live:
            continue
        slot = rnd.choice(sorted(live))
        inc, gen = live[slot]
        # The first two rounds of chaos always stop one worker and kill another.
        roll = {1: 0.0, 2: 0.12}.get(rounds := rounds + 1, rnd.random())
        if roll < 0.10 and inc.proc.pid not in stopped and inc.proc.poll() is None:
            try:
                inc.proc.send_signal(signal.SIGSTOP)
            except ProcessLookupError:
                continue
            stopped.add(inc.proc.pid)
            run.stops += 1

            def resume(p: subprocess.Popen[bytes] = inc.proc) -> None:
                stopped.discard(p.pid)
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)

            timer = threading.Timer(rnd.uniform(0.1, 1.6), resume)
            timer.start()
            timers.append(timer)
        elif roll < 0.14 and run.kills < max_kills and inc.proc.poll() is None:
            inc.killed_at = time.time()
            inc.proc.kill()
            inc.proc.wait()
            run.kills += 1
            done = _count_logged(inc.log)
            remaining = max(nops // 4, nops - done)
            live[slot] = (spawn(slot, gen + 1, remaining), gen + 1)
    for timer in timers:
        timer.join()
    for inc in run.incarnations:
        inc.proc.wait()
    run.elapsed = time.monotonic() - started
    return run


def _count_logged(path: Path) -> int:
    try:
        return sum(1 for line in path.read_bytes().split(b"\n") if line.startswith(b'{"i"'))
    except FileNotFoundError:
        return 0


def _read_log(path: Path) -> tuple[list[dict[str, Any]], float | None]:
    """The logged entries, and when the worker finished (None if it did not)."""
    if not path.exists():
        return [], None
    entries: list[dict[str, Any]] = []
    done: float | None = None
    for line in path.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # the last line of a killed worker may be cut
            continue
        if entry.get("done"):
            done = entry["t"]
        else:
            entries.append(entry)
    return entries, done


# --- the oracle -------------------------------------------------------------------------------


@dataclass
class OracleStats:
    events: int = 0
    grants: int = 0
    takeovers: int = 0
    takeovers_dead: int = 0
    rejections: int = 0
    acked: int = 0
    unacked_in_flight: int = 0
    busy: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


def oracle(run: Run) -> OracleStats:
    stats = OracleStats()
    lines, tail = journal_lines(run.directory)
    assert tail == b"", "a writer left an unrepaired torn tail after all workers finished"
    replay(lines)  # hash chain, seq contiguity, prev links, every event applies
    events = [orjson.loads(line) for line in lines]
    stats.events = len(events)
    # When each client process was gone: killed by us, or exited after its last op.
    killed = {inc.owner: inc.killed_at or _read_log(inc.log)[1] for inc in run.incarnations}
    holder: dict[str, dict[str, Any]] = {}
    last_fence = 0
    for index, e in enumerate(events, start=1):
        assert e["seq"] == index
        kind, task = e["type"], e.get("task")
        stats.by_type[kind] = stats.by_type.get(kind, 0) + 1
        # JSON as the journal holds it; `live` below says whether there is a current holder
        cur: Any = holder.get(task) if task else None
        live = cur is not None and cur["state"] in ("active", "expired")
        if kind in GRANTS:
            stats.grants += 1
            assert e["fence"] > last_fence, f"seq {index}: fence {e['fence']} <= {last_fence}"
            last_fence = e["fence"]
            if kind == "claim_created":
                assert not live, f"seq {index}: {task} granted to {e['owner']} while {cur} holds it"
            elif kind == "claim_recovered":
                stats.takeovers += 1
                assert live and e["prev_fence"] == cur["fence"] and e["prev_owner"] == cur["owner"]
                reason = e["reason"]
                if "owner dead" in reason:
                    stats.takeovers_dead += 1
                    died = killed.get(cur["owner"])
                    assert died is not None and died <= e["ts"] + LEASE_SLACK, (
                        f"seq {index}: {cur['owner']} declared dead while it was running")
                elif cur["state"] != "expired":
                    assert cur["expires_at"] is not None and e["ts"] >= cur["expires_at"] - \
                        LEASE_SLACK, f"seq {index}: a live lease was taken over: {cur} {e}"
            holder[task] = {"owner": e["owner"], "fence": e["fence"], "state": "active",
                            "expires_at": e["expires_at"], "th": e["token_hash"]}
        elif kind == "lease_renewed":
            # (a compact renewal, #15, names no fence: it renews the holder's own lease, to
            # ts + ttl)
            assert live and cur["fence"] == e.get("fence", cur["fence"])
            assert cur["state"] == "active"
            assert cur["expires_at"] is None or e["ts"] <= cur["expires_at"] + LEASE_SLACK, (
                f"seq {index}: renewed after expiry")
            cur["expires_at"] = e.get("expires_at", round(e["ts"] + e["ttl"], 6))
        elif kind in ENDS:
            assert live and cur["fence"] == e["fence"], f"seq {index}: {e} ends {cur}"
            if kind == "claim_completed":
                assert e["ts"] <= cur["expires_at"] + LEASE_SLACK, "completed after expiry"
            cur["state"] = "completed" if kind == "claim_completed" else "released"
        elif kind == "lease_expired":
            assert live
            cur["state"] = "expired"
        elif kind == "claim_reopened":
            assert cur is not None and cur["state"] == "completed"
            cur["state"] = "released"
        elif kind == "claim_rejected":
            stats.rejections += e.get("count", 1)
            # (a coalesced line is written after its refusals, when the holder may have gone)
            if cur is not None and e["holder"] is not None and "count" not in e:
                assert e["holder"] == cur["owner"] and e["fence"] == cur["fence"]
    _match_clients(run, events, stats)
    return stats


def _match_refusals(inc: Incarnation, entries: list[dict[str, Any]],
                    lines: list[dict[str, Any]]) -> None:
    """Refusals are coalesced (#15): per task, a client's refusals are its full lines plus the
    counts of its coalesced ones: exactly, or fewer for a killed client (counts not yet written
    die with it), and never more. (Each line's holder is checked against the journal.)"""
    refused: dict[str, int] = {}
    for entry in entries:
        if not entry["ok"] and entry["err"] in ("conflict", "completed") and entry["op"] == "claim":
            key = entry["task"]
            refused[key] = refused.get(key, 0) + 1
    recorded: dict[str, int] = {}
    firsts: dict[str, int] = {}
    for e in lines:
        key = e["task"]
        recorded[key] = recorded.get(key, 0) + e.get("count", 1)
        firsts[key] = firsts.get(key, 0) + ("count" not in e)
    for key, n in recorded.items():
        assert n <= refused.get(key, 0), (inc.owner, key, n, refused.get(key))
    for key, n in refused.items():
        if inc.killed_at is None:
            assert recorded.get(key) == n, (inc.owner, key, n, recorded.get(key))
        else:  # the first refusal of a run is written at once; the in-flight one may be lost
            assert firsts.get(key, 0) >= 1 or n == 1, (inc.owner, key, n)


def _match_clients(run: Run, events: list[dict[str, Any]], stats: OracleStats) -> None:
    """One journal record per acknowledged state-changing op, in order, per client; every
    observed result consistent with its record; at most the in-flight op of a killed client
    recorded without an acknowledgement. Refusals: see _match_refusals."""
    by_owner: dict[str, list[dict[str, Any]]] = {}
    refusals: dict[str, list[dict[str, Any]]] = {}
    holders: dict[str, tuple[Any, Any]] = {}  # (a compact renewal's actor is its holder: #15)
    for e in (ev.fill_renewal(e, holders) for e in events):
        if e["type"] in ("registry_created", "journal_tail_repaired", "registry_rebuilt"):
            continue
        if e["type"] == "claim_rejected":
            refusals.setdefault(e.get("actor", ""), []).append(e)
            continue
        by_owner.setdefault(e.get("actor", ""), []).append(e)
    owners = {inc.owner for inc in run.incarnations}
    assert set(by_owner) | set(refusals) <= owners, set(by_owner) - owners
    for inc in run.incarnations:
        entries, done = _read_log(inc.log)
        _match_refusals(inc, entries, refusals.get(inc.owner, []))
        mine = by_owner.get(inc.owner, [])
        pos = 0
        for entry in entries:
            assert entry.get("err") != "UNTYPED", entry
            op, task = entry["op"], entry["task"]
            nxt = mine[pos] if pos < len(mine) else None
            if not entry["ok"]:
                if entry["err"] == "busy":
                    stats.busy += 1
                continue
            stats.acked += op != "abandon"
            if op == "claim":
                assert nxt is not None and nxt["type"] in GRANTS, (entry, nxt)
                assert (nxt["seq"], nxt["fence"], nxt["token_hash"]) == (
                    entry["seq"], entry["fence"], entry["th"]), (entry, nxt)
                pos += 1
            elif op in ("renew", "complete"):
                want = "lease_renewed" if op == "renew" else "claim_completed"
                assert nxt is not None and nxt["type"] == want and nxt["seq"] == entry["seq"], (
                    entry, nxt)
                assert nxt["fence"] == entry["fence"]
                pos += 1
            elif op == "release":
                if nxt is not None and nxt["type"] == "claim_released" and nxt["task"] == task \
                        and nxt["fence"] == entry["fence"]:
                    assert bool(nxt.get("expired")) == (not entry["live"]), (entry, nxt)
                    pos += 1
                else:
                    assert not entry["live"], f"release acknowledged without a record: {entry}"
            elif op == "reopen" and entry["reopened"]:
                assert nxt is not None and nxt["type"] == "claim_reopened", (entry, nxt)
                pos += 1
        extra = mine[pos:]
        if inc.killed_at is not None:
            assert len(extra) <= 1, (inc.owner, extra)
            stats.unacked_in_flight += len(extra)
        else:
            assert done is not None, f"{inc.owner} did not finish: {inc.proc.returncode}"
            assert extra == [], (inc.owner, extra)


def _report(run: Run, stats: OracleStats, workers: int, nops: int) -> str:
    return (f"{workers} workers x {nops} ops: {len(run.incarnations)} processes, "
            f"{run.stops} SIGSTOPs, {run.kills} SIGKILLs, {stats.events} events, "
            f"{stats.acked} acked ops, {stats.grants} grants, {stats.takeovers} take-overs "
            f"({stats.takeovers_dead} of dead owners), {stats.rejections} rejections, "
            f"{stats.busy} busy, {stats.unacked_in_flight} unacked in-flight records, "
            f"{run.elapsed:.1f}s; double holders 0, lost acks 0, untyped 0")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_contention_with_oracle(tmp_path: Path) -> None:
    """8 processes with SIGSTOP/SIGKILL chaos: the oracle finds no violation."""
    workers, nops = (8, 500) if LONG else (8, 200)
    run = run_contention(tmp_path, workers, nops, seed=int(os.environ.get("FC_SEED", "7")))
    stats = oracle(run)
    print(_report(run, stats, workers, nops))
    assert stats.grants > workers
    assert stats.takeovers > 0, "no stale claim was ever taken over"
    assert run.kills > 0 and run.stops > 0


def test_oracle_catches_a_double_holder(tmp_path: Path) -> None:
    """The oracle is not vacuous: a forged second grant while a lease is live is caught."""
    import fleetclaims
    from fleetclaims.core.chain import envelope, seal

    directory = tmp_path / "reg"
    reg = fleetclaims.Registry(directory)
    reg.claim("t", owner="a", ttl=600)
    reg.close()
    lines, _ = journal_lines(directory)
    last = orjson.loads(lines[-1])
    forged = dict(last, owner="b", actor="b", fence=last["fence"] + 1)
    for key in ("seq", "ts", "prev", "hash"):
        forged.pop(key)
    line, _ = seal(orjson.dumps(envelope(last["seq"] + 1, last["ts"], forged, last["hash"])))
    append_raw(directory / "audit.jsonl", line)
    with pytest.raises(AssertionError, match="while"):
        oracle(Run(directory))
