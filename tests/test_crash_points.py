"""Crash points: a writer SIGKILLed at every step of the write path never loses an acknowledged
operation, never shows an unacknowledged one as acknowledged, and leaves a registry that loads,
verifies and is cleaned up (no temp files) by the next writer.

CI form: RUNS_CI runs per crash point; FLEETCLAIMS_LONG=1 (or stress/crash_points.py) runs
RUNS_LONG per point.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest
from fc_support import (
    BOOKKEEPING,
    LONG,
    append_raw,
    claims_view,
    file_store,
    journal_lines,
    quarantined,
    replay,
    run_python,
    temp_files,
)

import fleetclaims
from fleetclaims.core import events as ev
from fleetclaims.store.file.faults import CRASH_POINTS

pytestmark = pytest.mark.slow

RUNS_CI = 5
RUNS_LONG = 50
RUNS = int(os.environ.get("FLEETCLAIMS_CRASH_RUNS", RUNS_LONG if LONG else RUNS_CI))

# The child: a deterministic sequence of operations, one event each, acknowledged on stdout
# (flushed) only after the call returned. Small checkpoint bounds make snapshots frequent.
CHILD = r"""
import json, sys
import fleetclaims
import fleetclaims.store.file.store as sf
sf.CHECKPOINT_MIN_TAIL = int(sys.argv[3])
sf.CHECKPOINT_DIVISOR = 1000
from fc_plan import plan
reg = fleetclaims.Registry(sys.argv[1], lock_timeout=10)
tokens = {}
start = int(sys.argv[4])
for i, (op, task) in enumerate(plan(int(sys.argv[2]))):
    if i < start:
        continue
    if op == "claim":
        c = reg.claim(task, owner="crasher", ttl=3600)
        tokens[task] = c.token
        fence = c.fence
    elif op == "renew":
        fence = reg.renew(task, token=tokens[task]).fence
    elif op == "release":
        assert reg.release(task, token=tokens[task]) is True
        fence = None
    else:
        fence = reg.complete(task, token=tokens[task], result={"i": i}).fence
    seq = reg.store.read().seq
    print(json.dumps({"i": i, "op": op, "task": task, "seq": seq, "fence": fence}), flush=True)
print("DONE", flush=True)
"""

PLAN = '''
def plan(n):
    """n operations over three slots: claim, renew, then release or complete, on fresh tasks."""
    out, gen, step = [], [0, 0, 0], [0, 0, 0]
    for i in range(n):
        s = i % 3
        task = "slot%d-gen%d" % (s, gen[s])
        if step[s] == 0:
            out.append(("claim", task))
        elif step[s] == 1:
            out.append(("renew", task))
        else:
            out.append(("release" if gen[s] % 2 else "complete", task))
            gen[s] += 1
        step[s] = (step[s] + 1) % 3
    return out
'''

EXPECTED_TYPE = {
    "claim": ev.CLAIM_CREATED,
    "renew": ev.LEASE_RENEWED,
    "release": ev.CLAIM_RELEASED,
    "complete": ev.CLAIM_COMPLETED,
}


def _plan(n: int) -> list[tuple[str, str]]:
    scope: dict[str, Any] = {}
    exec(PLAN, scope)
    return scope["plan"](n)  # type: ignore[no-any-return]


def _run_child(tmp: Path, directory: Path, nops: int, crash: str | None, *, start: int = 0,
               tail: int = 1500) -> tuple[list[dict[str, Any]], int, str]:
    (tmp / "fc_plan.py").write_text(PLAN)
    env = {"PYTHONPATH": str(tmp)}
    if crash:
        env["FLEETCLAIMS_CRASH_AT"] = crash
    proc = run_python(CHILD, str(directory), str(nops), str(tail), str(start), env=env,
                      timeout=60)
    acks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return acks, proc.returncode, proc.stderr


def check_after_crash(directory: Path, acks: list[dict[str, Any]], nops: int, *,
                      prior: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    """The guarantees after a crash, then after the next writer."""
    plan = _plan(nops)
    all_acks = [*prior, *acks]
    # 1. A reader loads it (no writer has run yet: a torn tail is ignored, not repaired).
    reader = fleetclaims.Registry(directory)
    reader.claims(include_completed=True, include_released=True)
    report = reader.verify()
    assert report.ok, report
    reader.close()
    # 2. Every acknowledged op is in the journal at the seq it was acknowledged with.
    lines, _ = journal_lines(directory)
    state = replay(lines)
    holders: dict[str, tuple[Any, Any]] = {}  # (a compact renewal names its holder so)
    events = {e["seq"]: e for e in (ev.fill_renewal(json.loads(line), holders)
                                    for line in lines)}
    for ack in all_acks:
        event = events.get(ack["seq"])
        assert event is not None, f"acknowledged op lost: {ack}"
        assert event["type"] == EXPECTED_TYPE[ack["op"]], (ack, event)
        assert event["task"] == ack["task"], (ack, event)
        if ack["fence"] is not None:
            assert event["fence"] == ack["fence"], (ack, event)
    # 3. Nothing unacknowledged shows up as acknowledged: client events are exactly the acked
    #    ones, plus at most the single op that was in flight when the writer died.
    acked_seqs = {a["seq"] for a in all_acks}
    extra = [e for s, e in sorted(events.items())
             if e["type"] not in BOOKKEEPING and s not in acked_seqs]
    assert len(extra) <= 1, extra
    if extra:
        nxt = max((a["i"] for a in all_acks), default=-1) + 1
        op, task = plan[nxt]
        assert extra[0]["type"] == EXPECTED_TYPE[op] and extra[0]["task"] == task, extra
        assert extra[0]["seq"] > max(acked_seqs, default=0)
    # 4. The registry (snapshot + journal) agrees with a replay of the journal.
    reg = fleetclaims.Registry(directory)
    assert claims_view(reg.store.read()) == claims_view(state)
    # 5. The next writer: works, leaves no temp files, and the audit verifies with its anchor.
    reg.claim("after-crash", owner="next-writer", ttl=60)
    file_store(reg).checkpoint()
    assert temp_files(directory) == []
    report = reg.verify()
    assert report.ok and report.anchor_ok in (True, None) and report.torn_tail == 0, report
    _, tail = journal_lines(directory)
    assert tail == b""
    reg.close()


def _seeded(point: str, run: int) -> random.Random:
    return random.Random(f"{point}:{run}")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.split(".")[0] in
                                   ("journal", "snapshot", "rest")])
def test_writer_killed_at_point(point: str, tmp_path: Path) -> None:
    """SIGKILL at each journal/snapshot/at-rest crash point, at varying arrivals: nothing acked
    is lost; after the next writer closes, the journal holds no padding."""
    nops = 24
    crashed = 0
    for run in range(RUNS):
        rnd = _seeded(point, run)
        nth = rnd.randint(1, {"journal": 18, "snapshot": 6}.get(point.split(".")[0], 1))
        directory = tmp_path / f"run{run}" / "reg"
        acks, rc, err = _run_child(tmp_path, directory, nops, f"{point}:{nth}")
        assert rc in (0, -signal.SIGKILL), err
        crashed += rc == -signal.SIGKILL
        check_after_crash(directory, acks, nops)
        assert b"\0" not in (directory / "audit.jsonl").read_bytes()
    assert crashed == RUNS, f"only {crashed} of {RUNS} runs reached {point}"


def _prepared(tmp_path: Path, directory: Path, nops: int) -> list[dict[str, Any]]:
    acks, rc, err = _run_child(tmp_path, directory, nops, None)
    assert rc == 0, err
    return acks


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", ["repair.after_quarantine", "repair.after_truncate"])
def test_killed_during_torn_tail_repair(point: str, tmp_path: Path) -> None:
    """A torn tail is being repaired when the repairer dies: the tail stays in quarantine and the
    next writer finishes the job."""
    nops = 15
    crashed = 0
    for run in range(RUNS):
        rnd = _seeded(point, run)
        directory = tmp_path / f"run{run}" / "reg"
        prior = _prepared(tmp_path, directory, 9)
        # A torn tail: the first bytes of a plausible line, cut anywhere, maybe NUL padded.
        lines, _ = journal_lines(directory)
        sample = lines[rnd.randrange(len(lines))]
        tail = sample[: rnd.randint(1, len(sample) - 1)]
        if rnd.random() < 0.3:
            tail += b"\0" * rnd.randint(1, 64)
        append_raw(directory / "audit.jsonl", tail)
        acks, rc, err = _run_child(tmp_path, directory, nops, f"{point}:1", start=9)
        assert rc == -signal.SIGKILL, err
        crashed += 1
        # The zeros after a partial line are unused space, not part of what was torn.
        assert tail.split(b"\0", 1)[0] in quarantined(directory).values()
        check_after_crash(directory, acks, nops, prior=prior)
        assert tail.split(b"\0", 1)[0] in quarantined(directory).values()
    assert crashed == RUNS


@pytest.mark.timeout(240)
def test_killed_during_rebuild(tmp_path: Path) -> None:
    """A damaged snapshot was moved to quarantine when the rebuilder died: the next writer
    rebuilds from the journal; the exact state is kept."""
    point = "rebuild.after_quarantine"
    nops = 15
    for run in range(RUNS):
        rnd = _seeded(point, run)
        directory = tmp_path / f"run{run}" / "reg"
        prior = _prepared(tmp_path, directory, 9)
        snap = directory / "claims.json"
        assert snap.exists()
        before = claims_view(replay(journal_lines(directory)[0]))
        data = bytearray(snap.read_bytes())
        damage = rnd.choice(["flip", "truncate", "junk"])
        if damage == "flip":
            data[rnd.randrange(len(data))] ^= 0x20
        elif damage == "truncate":
            del data[rnd.randrange(len(data)) :]
        else:
            data += b"junk"
        snap.write_bytes(bytes(data))
        acks, rc, err = _run_child(tmp_path, directory, nops, f"{point}:1", start=9)
        assert rc == -signal.SIGKILL, err
        assert bytes(data) in quarantined(directory).values()
        assert not snap.exists()
        reg = fleetclaims.Registry(directory)
        assert claims_view(reg.store.read()) == before
        reg.close()
        check_after_crash(directory, acks, nops, prior=prior)
        assert bytes(data) in quarantined(directory).values()


def test_every_crash_point_is_covered() -> None:
    """The suites above exercise every declared crash point."""
    covered = {"journal.after_write", "journal.before_sync", "journal.after_sync",
               "snapshot.during_write",
               "snapshot.after_fsync", "snapshot.after_rename", "repair.after_quarantine",
               "repair.after_truncate", "rebuild.after_quarantine",
               "rest.before_trim", "rest.after_trim",
               # (test_doctor_crash.py kills doctor --fix at each of these)
               "doctor.after_copies", "doctor.before_switch", "doctor.after_switch",
               "doctor.after_repair",
               # (test_segments.py kills a rotation at each of these)
               "segment.after_compress", "segment.after_seal", "segment.after_snapshot",
               "segment.after_switch",
               # (test_archive.py kills `audit archive` at each of these)
               "archive.after_copy", "archive.after_anchor", "archive.after_remove",
               # (test_prune.py kills a prune at this, and at each journal/snapshot step)
               "prune.after_sync"}
    assert set(CRASH_POINTS) == covered


def test_child_without_crash_acknowledges_everything(tmp_path: Path) -> None:
    """Control run: with no crash armed the plan completes and every op is acknowledged."""
    directory = tmp_path / "reg"
    acks, rc, err = _run_child(tmp_path, directory, 15, None)
    assert rc == 0, err
    assert [a["i"] for a in acks] == list(range(15))
    check_after_crash(directory, acks, 15)
    assert os.path.exists(directory / "claims.json")
