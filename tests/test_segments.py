"""Journal segments (#15): the active journal rotates into sealed gzip segments under
``segments/``; the chain runs on across them and every reader reads them transparently.

Oracles: the whole journal (every sealed segment unzipped, then audit.jsonl past the sealed
seq) is one chain that replays to the registry's state; a writer SIGKILLed at each step of a
rotation loses no acknowledged operation, and the next writer finishes the job; damaged or
missing segments are named (file, what to do), and nothing is deleted or rewritten.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from fc_support import claims_view, open_one_chain, replay, run_python, whole_journal

import fleetclaims
from fleetclaims.core.errors import AuditCorrupt, SegmentDamaged
from fleetclaims.store.file import doctor, preseal, segments, verify_par
from fleetclaims.store.file.faults import CRASH_POINTS

pytestmark = pytest.mark.unit


def _work(reg: fleetclaims.Registry, n: int, prefix: str = "t") -> None:
    for i in range(n):
        c = reg.claim(f"{prefix}{i % 40}", owner=f"a{i % 3}", ttl=60)
        if c.token:
            reg.renew(c.task, token=c.token)
            reg.release(c.task, token=c.token)


@pytest.fixture(params=["inline", "prefetch"])
def small(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Small segments and blocks; each test twice: segments read inline, and decompressed
    ahead by the helper thread (errors handed over to the reader) and verified by workers."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 16_000)
    monkeypatch.setattr(segments, "BLOCK", 2_000)
    monkeypatch.setattr(segments, "PREFETCH_MIN", 1 << 40 if request.param == "inline" else 0)
    # (and verify checks the segments in worker processes: verify_par). Rotations seal
    # inline: a helper finishing later would change the files under a test's feet.
    monkeypatch.setattr(preseal, "ENABLED", False)
    monkeypatch.setattr(verify_par, "PAR_MIN", 1 << 62 if request.param == "inline" else 0)


def test_the_journal_rotates_and_reads_across_segments(tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 200)
    report = reg.verify()
    reg.close()
    sealed = segments.sealed(d)
    assert len(sealed) >= 3 and segments.gap(sealed) is None
    lines = whole_journal(d)
    assert report.ok and report.events == len(lines) == 601, report
    assert all(seg.index_path.exists() for seg in sealed)
    state = replay(lines)
    reg = fleetclaims.Registry(d)
    assert claims_view(reg.store.read()) == claims_view(state)
    events = list(reg.store.iter_events(0))
    assert [e["seq"] for e in events] == list(range(1, 602))
    assert [e["seq"] for e in reg.store.iter_events(250)] == list(range(251, 602))
    after_sealed = sealed[-1].last + 2
    assert [e["seq"] for e in reg.store.iter_events(after_sealed)] == list(
        range(after_sealed + 1, 602))
    for task in ("t3", "t17"):
        full = [e for e in events if e.get("task") == task]
        assert list(reg.store.task_events(task)) == full and full  # type: ignore[attr-defined]
        assert len(reg.explain(task).steps) == len(full)
    reg.close()
    # Without claims.json a reader replays the segments, then the active journal.
    (d / "claims.json").unlink()
    cold = fleetclaims.Registry(d)
    assert claims_view(cold.store.read()) == claims_view(state)
    cold.close()


def test_a_missing_or_damaged_index_is_not_needed(tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 120)
    full = [e for e in reg.store.iter_events(0) if e.get("task") == "t5"]
    sealed = segments.sealed(d)
    sealed[0].index_path.unlink()
    sealed[1].index_path.write_bytes(b"{not json")
    assert list(reg.store.task_events("t5")) == full  # type: ignore[attr-defined]
    reg.close()


def whole_journal_of(segment: Path) -> list[dict[str, Any]]:
    """The events of one sealed segment file."""
    import gzip

    return [json.loads(line) for line in gzip.decompress(segment.read_bytes()).splitlines()]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
            and p.name != "claims.lock"}


def test_a_segment_missing_from_the_middle_is_named(tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 200)
    reg.close()
    middle = segments.sealed(d)[1]
    moved = tmp_path / middle.path.name
    middle.path.rename(moved)
    before = _files(d)
    reg = fleetclaims.Registry(d)
    report = reg.verify()
    assert not report.ok and report.seq == middle.first
    assert f"{middle.first}..{middle.last} missing" in str(report.error)
    assert "put the file back" in str(report.error)
    with pytest.raises(AuditCorrupt, match="missing"):
        list(reg.store.iter_events(0))
    gone = next(e["task"] for e in whole_journal_of(moved) if "task" in e)
    with pytest.raises(SegmentDamaged, match="missing"):  # (not a shorter history)
        reg.explain(gone)
    with pytest.raises(SegmentDamaged, match="missing"):
        list(reg.store.task_events(gone))  # type: ignore[attr-defined]  # (audit --task)
    (d / "claims.json").unlink()
    del before["claims.json"]
    with pytest.raises(AuditCorrupt, match="missing"):
        fleetclaims.Registry(d).claim("x", owner="o", ttl=5)
    assert _files(d) == before  # nothing deleted or rewritten
    found = doctor.check(d)
    assert [f.kind for f in found.findings] == ["segment_damaged"], found.findings
    with pytest.raises(SegmentDamaged, match="does not rewrite sealed history"):
        doctor.check(d, fix=True)  # (no salvage of audit.jsonl over a sealed segment's loss)
    assert _files(d) == before
    moved.rename(middle.path)  # put back: all is well again
    assert fleetclaims.Registry(d).verify().ok
    reg.close()


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_segment_that_fails_to_decompress_is_named(tmp_path: Path, small: None,
                                                     damage: str) -> None:
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 200)
    reg.close()
    seg = segments.sealed(d)[1]
    data = bytearray(seg.path.read_bytes())
    if damage == "flip":
        for i in range(40, 60):
            data[len(data) // 2 + i] ^= 0x55
    else:
        del data[len(data) - 30 :]
    seg.path.write_bytes(bytes(data))
    seg.index_path.unlink()  # (explain then reads the whole segment)
    before = _files(d)
    reg = fleetclaims.Registry(d)
    report = reg.verify()
    assert not report.ok and seg.path.name in str(report.error), report
    assert "restore it from a backup" in str(report.error)
    with pytest.raises(AuditCorrupt) as exc:
        for task in ("t1", "t2", "t3", "t4", "t5"):
            list(reg.store.task_events(task))  # type: ignore[attr-defined]
    assert str(seg.path) in str(exc.value)
    reg.close()
    assert _files(d) == before


CHILD = r"""
import json, sys
import fleetclaims
from fleetclaims.store.file import preseal, segments
segments.SEGMENT_BYTES = 6000
segments.BLOCK = 1000
preseal.ENABLED = sys.argv[3] == "helper"
reg = fleetclaims.Registry(sys.argv[1])
for i in range(int(sys.argv[2])):
    c = reg.claim("task%d" % i, owner="crasher", ttl=3600)
    print(json.dumps({"task": c.task, "fence": c.fence}), flush=True)
print("DONE", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith("segment.")])
@pytest.mark.parametrize("nth", [1, 2])
def test_writer_killed_during_a_rotation(tmp_path: Path, point: str, nth: int) -> None:
    d = tmp_path / "r"
    proc = run_python(CHILD, str(d), "120", "inline",
                      env={"FLEETCLAIMS_CRASH_AT": f"{point}:{nth}"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert acks
    # A reader: every acknowledged claim is there, the chain verifies across the segments.
    reader = fleetclaims.Registry(d)
    report = reader.verify()
    assert report.ok, report
    for ack in acks:
        claim = reader.get(ack["task"])
        assert claim is not None and claim.fence == ack["fence"], ack
    reader.close()
    # The next writer finishes the rotation (or the next one does): no line is lost or
    # doubled, and the registry is the replay of its whole journal.
    proc = run_python(CHILD.replace('"task%d"', '"more%d"'), str(d), "60", "inline")
    assert proc.returncode == 0, proc.stderr
    reg = open_one_chain(d)
    assert not [n for n in os.listdir(d / "segments") if n.startswith(".")] or (
        point == "segment.after_compress")
    reg.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["segment.after_compress", "segment.after_seal"])
def test_sealing_helpers_killed(tmp_path: Path, point: str) -> None:
    """The helper processes that seal a full journal outside the lock killed at each step
    (the writer too, if it reaches the point itself): nothing acknowledged is lost, the
    chain verifies, and later writers go on rotating (the dead helper's marker ages out, and
    past twice the threshold a writer seals inline)."""
    d = tmp_path / "r"
    proc = run_python(CHILD, str(d), "150", "helper", env={"FLEETCLAIMS_CRASH_AT": point})
    acks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert acks and proc.returncode in (0, -signal.SIGKILL), proc.stderr
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok
    for ack in acks:
        claim = reg.get(ack["task"])
        assert claim is not None and claim.fence == ack["fence"], ack
    reg.close()
    proc = run_python(CHILD.replace('"task%d"', '"more%d"'), str(d), "150", "helper")
    assert proc.returncode == 0, proc.stderr
    lines = whole_journal(d)
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok and claims_view(reg.store.read()) == claims_view(replay(lines))
    reg.close()


def _data_size(d: Path) -> int:
    """audit.jsonl's data (a busy writer keeps zero bytes ahead of it)."""
    return len((d / "audit.jsonl").read_bytes().rstrip(b"\0"))


def _first_seq(d: Path) -> int:
    return int(json.loads((d / "audit.jsonl").read_bytes().split(b"\n", 1)[0])["seq"])


@pytest.mark.slow
def test_a_helper_seals_the_bulk_outside_the_lock(tmp_path: Path, small: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the threshold a writer only spawns the helper; once it has sealed the bulk, the
    next writer's rotation seals just the lines appended since (a small segment)."""
    import time

    monkeypatch.setattr(preseal, "ENABLED", True)
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    n = 0
    reg.claim("first", owner="o", ttl=60)
    while _data_size(d) < segments.SEGMENT_BYTES:
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
    reg.claim("spawn", owner="o", ttl=60)  # the rotation check: a helper is spawned
    deadline = time.monotonic() + 20
    while not segments.sealed(d) and time.monotonic() < deadline:
        time.sleep(0.05)
    bulk = segments.sealed(d)
    assert len(bulk) == 1 and _data_size(d) >= segments.SEGMENT_BYTES
    reg.claim("tail", owner="o", ttl=60)  # rotates: only the lines after the bulk
    # A forked child packs those lines and writes the snapshot; the writer's next operation
    # once the child is done installs the small segment and switches the journal (the lines
    # after the sealed head carried over).
    n = 0
    while len(segments.sealed(d)) < 2 and time.monotonic() < deadline:
        n += 1
        reg.claim(f"after{n}", owner="o", ttl=60)
        time.sleep(0.01)
    sealed = segments.sealed(d)
    assert len(sealed) == 2 and sealed[1].first == bulk[0].last + 1
    assert sealed[1].last - sealed[1].first < 5
    assert _first_seq(d) == sealed[1].last + 1 and len(segments.sealed(d)) == 2
    lines = (d / "audit.jsonl").read_bytes().rstrip(b"\0").splitlines()
    assert len(lines) == n + 1  # the operation that sealed ("tail") and those after it
    assert reg.verify().ok
    reg.close()


def test_zcat_and_cat_show_one_chain(tmp_path: Path, small: None) -> None:
    """What the README says a person can do: zcat the segments, cat the active journal."""
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 100)
    reg.close()
    proc = run_python(
        "import subprocess,sys,glob;"
        "out=subprocess.run('zcat segments/*.jsonl.gz; cat audit.jsonl',shell=True,cwd=sys.argv[1],"
        "capture_output=True,check=True).stdout;sys.stdout.write(str(len(out.splitlines())))",
        str(d))
    assert proc.stdout == "301"
    seen: list[Any] = [json.loads(line)["seq"] for line in whole_journal(d)]
    assert seen == list(range(1, 302))


WORKER = r"""
import json, sys
import fleetclaims
from fleetclaims.store.file import segments
segments.SEGMENT_BYTES = 8000
reg = fleetclaims.Registry(sys.argv[1], durability=sys.argv[3])
for i in range(int(sys.argv[2])):
    c = reg.claim("w%s-%d" % (sys.argv[4], i), owner="w" + sys.argv[4], ttl=3600)
    reg.renew(c.task, token=c.token)
    print(json.dumps({"task": c.task, "fence": c.fence}), flush=True)
reg.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["full", "process"])
def test_concurrent_writers_across_rotations(tmp_path: Path, durability: str) -> None:
    """Three processes write while the journal rotates under them (each rotation makes the
    others reload): every acknowledged claim is there once with its fence, fences are unique,
    and the whole journal is one chain from seq 1."""
    import subprocess
    import sys

    d = tmp_path / "r"
    fleetclaims.Registry(d).close()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(d), "60", durability, str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    acks = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        acks += [json.loads(line) for line in out.splitlines()]
    assert len(acks) == 180 and len({a["fence"] for a in acks}) == 180
    assert len(segments.sealed(d)) >= 3
    lines = whole_journal(d)
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok
    state = replay(lines)
    assert claims_view(reg.store.read()) == claims_view(state)
    for ack in acks:
        claim = reg.get(ack["task"])
        assert claim is not None and claim.fence == ack["fence"]
    reg.close()


def test_audit_task_reads_the_task_lines_alone(tmp_path: Path, small: None,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`events(task=T)` and `audit --task T` (through the segments' index) list what a scan of
    every event finds, page by page, and the last cursor is the head (a --follow goes on)."""
    from fleetclaims.cli import main

    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 120)
    head = reg.store.read().seq
    scanned = [e for e in reg.store.iter_events(0) if e.get("task") == "t7"]
    assert [e.data for e in reg.events(task="t7", limit=1000).events] == scanned
    reg.close()
    assert len(scanned) > 4
    assert main(["--dir", str(d), "audit", "--task", "t7", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["events"] == scanned and doc["next_cursor"] == head and not doc["more"]
    assert main(["--dir", str(d), "audit", "--task", "t7", "--limit", "3", "--after",
                 str(scanned[0]["seq"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["events"] == scanned[1:4] and doc["more"]


@pytest.mark.slow
def test_a_rotation_sealed_but_not_switched_verifies_before_and_after_an_archive(
        tmp_path: Path) -> None:
    """The state a rotation leaves between sealing a segment and switching journals (its
    writer killed there, or closed before the next operation finished it): the active journal
    still holds the sealed lines, and a checkpoint taken then sits at its own offset in it.
    `audit verify` and doctor agree with the store that this is healthy, also once `audit
    archive` has moved every sealed segment out (the snapshot then stands at the archive's
    anchor: no line of the chain after it is read). Both used to report the snapshot as not
    anchored (verify exit 5; doctor after any archive: a problem --fix could not clear)."""
    d = tmp_path / "r"
    proc = run_python(CHILD, str(d), "120", "inline",
                      env={"FLEETCLAIMS_CRASH_AT": "segment.after_seal:1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    reg = fleetclaims.Registry(d)
    store = reg.store
    state = store.read()
    sealed = segments.sealed(d)
    assert sealed and sealed[-1].last == state.seq  # (sealed up to the head, not switched)
    assert _first_seq(d) <= state.seq
    store._checkpoint(unlocked=True)  # type: ignore[attr-defined]  # (as a settle would)
    reg.close()
    assert json.loads((d / "claims.json").read_bytes()[:200].split(b',"head"')[0] + b"}")[
        "offset"] > 0
    for when in ("before", "after"):
        report = fleetclaims.Registry(d).verify()
        assert report.ok and report.anchor_ok, (when, report)
        check = doctor.check(d)
        assert [f.kind for f in check.findings if f.severity != "info"] == [], (when, check)
        if when == "before":
            done = run_python("import sys; from fleetclaims.cli import main; "
                              "sys.exit(main(['--dir', sys.argv[1], 'audit', 'archive', "
                              "'--before', '0s']))", str(d))
            assert done.returncode == 0, done.stderr
            assert (d / "segments" / "archived.json").exists()
    assert doctor.check(d, fix=True).ok
    top = max(json.loads(line)["fence"] for line in proc.stdout.splitlines()
              if line.startswith("{"))
    assert fleetclaims.Registry(d).claim("after", owner="b").fence == top + 1


def test_markers_of_sealing_helpers_long_gone_are_swept(tmp_path: Path) -> None:
    """A sealing helper's marker left behind (its helper found the lines changed, or its
    journal was rotated away) is removed by the next sweep once older than STALE; a fresh
    one (a helper at work) stays."""
    import time

    folder = tmp_path / "segments"
    folder.mkdir()
    old, fresh = folder / ".presealing-11", folder / ".presealing-12"
    old.touch()
    fresh.touch()
    past = time.time() - preseal.STALE - 5
    os.utime(old, (past, past))
    preseal._sweep(folder)
    assert not old.exists() and fresh.exists()


@pytest.mark.parametrize("left", [0, 1, 7, 8, 9, 20])
def test_a_reader_stopping_early_never_waits_forever(tmp_path: Path, left: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of ``events(after=, limit=)`` ends inside a large segment: the reader stops
    taking blocks while the thread decompressing ahead may have finished the file and be
    handing over its end with the queue full. That hand-over once blocked for good and the
    reader's join with it (bench/run.py's audit section hung on a 1,000,000-event registry)."""
    import threading
    import time
    from collections.abc import Generator

    monkeypatch.setattr(segments, "BLOCK", 100)
    monkeypatch.setattr(segments, "PREFETCH_MIN", 0)
    (tmp_path / segments.DIRNAME).mkdir()
    lines = [json.dumps({"seq": i, "pad": "x" * 60}).encode() for i in range(1, 301)]
    seg = segments.seal(tmp_path, b"\n".join(lines) + b"\n", 1, 300, sync=False)
    blocks = sum(1 for _ in segments.read_blocks(seg))
    assert blocks > 30
    reader = segments.read_blocks(seg)
    assert isinstance(reader, Generator)
    for _ in range(max(1, blocks - left)):
        next(reader, None)
    time.sleep(0.3)  # (the thread ahead has filled the queue, or reached the end)
    closer = threading.Thread(target=reader.close, daemon=True)
    closer.start()
    closer.join(timeout=10)
    assert not closer.is_alive(), "closing the segment reader hung"


def test_a_page_deep_in_the_history_reads_only_from_its_member(
        tmp_path: Path, small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``events(after=, limit=)`` inside the sealed segments starts at the gzip member holding
    ``after`` + 1 (found through the segment's index), not at the first segment: paging
    through 1,000,000 events re-read every earlier segment for each page (200,000 events in
    48 segments: 167 s, now 3 s). Every page is still exactly the events after the cursor, a
    line damaged inside a page is still refused, and a segment whose index is unreadable is
    read from its start."""
    import gzip

    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    _work(reg, 300)
    sealed = segments.sealed(d)
    total = len(whole_journal(d))
    assert len(sealed) >= 4
    everything = [e.seq for e in reg.events(after=0, limit=100_000).events]
    assert everything == list(range(1, total + 1))
    read: list[tuple[int, int, int]] = []  # (segment's first seq, its last, member offset)
    real = segments._blocks

    def counted(seg: segments.Segment, start: int = 0) -> Any:
        read.append((seg.first, seg.last, start))
        return real(seg, start)

    monkeypatch.setattr(segments, "_blocks", counted)
    cuts = sorted({0, 1, *(s.first - 1 for s in sealed), *(s.first for s in sealed),
                   *(s.last for s in sealed), *((s.first + s.last) // 2 for s in sealed),
                   total - 1, total})
    for after in cuts:
        read.clear()
        page = reg.events(after=after, limit=7)
        assert [e.seq for e in page.events] == everything[after:after + 7], after
        assert all(last > after for _, last, _ in read), (after, read)  # no earlier segment
    last = sealed[-1]
    read.clear()
    reg.events(after=last.last - 2, limit=3)  # deep in the last segment: from its member
    assert read and read[0][:2] == (last.first, last.last) and read[0][2] > 0
    # A line inside the page altered (the segment rewritten, index and all): refused.
    lines = gzip.decompress(last.path.read_bytes()).split(b"\n")[:-1]
    k = last.last - 1 - last.first
    assert b'"ts":' in lines[k]
    lines[k] = lines[k].replace(b'"ts":', b'"ts": ', 1)  # (one byte more: the seal breaks)
    last.path.unlink()
    last.index_path.unlink()
    segments.seal(d, b"\n".join(lines) + b"\n", last.first, last.last, sync=False)
    with pytest.raises(AuditCorrupt):
        reg.events(after=last.last - 3, limit=5)
    # An unreadable index: the segment is read from its start (the page is the same).
    last.index_path.write_bytes(b"{not json")
    read.clear()
    assert [e.seq for e in reg.events(after=sealed[-2].last - 1, limit=3).events] == everything[
        sealed[-2].last - 1:sealed[-2].last + 2]
    reg.close()


KILLED_MID_ROTATION = """
import sys, fleetclaims
from fleetclaims.store.file import preseal, segments
segments.SEGMENT_BYTES = 3000
preseal.ENABLED = False
r = fleetclaims.Registry(sys.argv[1])
for i in range(60):
    c = r.claim(f"t{i}", owner="w"); r.release(c.task, token=c.token)
"""


@pytest.mark.parametrize("point", ["segment.after_seal:2", "segment.after_compress:2"])
def test_doctor_agrees_with_verify_after_a_writer_killed_mid_rotation(tmp_path: Path,
                                                                     point: str) -> None:
    """Killed at its second rotation: the active journal's lines are sealed too and claims.json
    is the first rotation's (offset 0). audit verify said anchored and doctor said the
    snapshot's seq/offset/head did not match (exit 5): every sealed line reads at offset 0,
    and doctor took the last one read for the snapshot's anchor."""
    from fc_support import run_python

    from fleetclaims.store.file import doctor

    d = tmp_path / "r"
    done = run_python(KILLED_MID_ROTATION, str(d), env={"FLEETCLAIMS_CRASH_AT": point,
                                                       "FLEETCLAIMS_NO_FORK": "1"})
    assert done.returncode != 0  # (killed at the crash point)
    assert fleetclaims.Registry(d).verify().ok
    report = doctor.check(d)
    assert report.ok, report.to_dict()
