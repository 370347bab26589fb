"""The anchor and claims.lock's fence mark follow the head (at rest on close, ~1 s behind while
busy), also when rotations write the only snapshots; and an anchor deleted, overwritten or
stripped of its seal is refused, never silently replaced (a probe of honest history).

Oracle: after a close, the anchor and the fence mark name the journal's last line; a registry
whose history outside its folder says more than its files hold is refused (HistoryLost), so no
fence is handed out twice; no false alarm for a fresh, a moved or a pre-mark registry, nor
for concurrent writers replacing the anchor.
"""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from fc_support import forge_journal, journal_lines, run_python

from fleetclaims import HistoryLost, Registry, SegmentDamaged
from fleetclaims.store.file import anchor, doctor, segments
from fleetclaims.store.file.lock import ANCHOR_OFFSET, ANCHOR_SIZE, FENCE_OFFSET, FENCE_SIZE

pytestmark = pytest.mark.integration


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))  # (keeps FLEETCLAIMS_ANCHOR_DIR)
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def _fence_mark(d: Path) -> int:
    with open(d / "claims.lock", "rb") as f:
        f.seek(FENCE_OFFSET)
        digits = f.read(FENCE_SIZE).strip(b"\0 \n")
    return int(digits) if digits.isdigit() else 0


def _last_seq(d: Path) -> tuple[int, int]:
    """(seq, fence) of the last line of the whole journal (segments, then audit.jsonl)."""
    lines = [line for seg in segments.sealed(d) for line in
             gzip.decompress(seg.path.read_bytes()).splitlines()]
    lines += journal_lines(d)[0]
    top = max((orjson.loads(line).get("fence") or 0) for line in lines)
    return orjson.loads(lines[-1])["seq"], top


# One session of K claims with 4000-byte segments (as the README's example sets it), closed.
SESSION = """
import sys
from fleetclaims import Registry
from fleetclaims.store.file import segments
segments.SEGMENT_BYTES = 4000
reg = Registry(sys.argv[1])
for i in range(int(sys.argv[2])):
    reg.claim(f"t-{i}", owner="agent-a")
reg.close()
"""


def test_a_close_whose_last_write_rotated_leaves_the_anchor_at_the_head(tmp_path: Path) -> None:
    """12 claims in one process, the last one sealing the whole journal (audit.jsonl empty at
    rest): the close wrote no checkpoint, and used to leave no anchor and no fence mark, so
    `rm -rf` of the folder then went unnoticed and fences started again at 1."""
    d = tmp_path / "r"
    done = run_python(SESSION, str(d), "12")
    assert done.returncode == 0, done.stderr
    assert (d / "audit.jsonl").stat().st_size == 0 and segments.sealed(d)
    seq, fence = _last_seq(d)
    found = anchor.read(d)
    assert found is not None and (found.seq, found.fence) == (seq, fence) == (13, 12)
    assert _fence_mark(d) == fence
    shutil.rmtree(d)
    with pytest.raises(HistoryLost, match="removed or emptied"):
        Registry(d).claim("t-0", owner="mallory")


def test_a_cut_last_sealed_event_is_found_after_one_op_sessions(tmp_path: Path) -> None:
    """One claim per process until a close leaves audit.jsonl empty: the anchor names that
    last event (it used to lag by one), so cutting it from the last segment is refused."""
    d = tmp_path / "r"
    code = SESSION.replace('for i in range(int(sys.argv[2])):\n    reg.claim(f"t-{i}"',
                           'if True:\n    reg.claim(sys.argv[2]')
    for i in range(40):
        assert run_python(code, str(d), f"t-{i}").returncode == 0
        if (d / "audit.jsonl").stat().st_size == 0:
            break
    else:
        pytest.fail("no session left the journal empty")
    seq, fence = _last_seq(d)
    found = anchor.read(d)
    assert found is not None and (found.seq, found.fence) == (seq, fence)
    assert _fence_mark(d) == fence
    last = segments.sealed(d)[-1]
    kept = gzip.decompress(last.path.read_bytes()).splitlines(keepends=True)[:-1]
    last.path.unlink()
    for idx in d.glob("segments/*.idx.json"):
        idx.unlink()
    (d / "segments" / f"audit-{last.first:012d}-{seq - 1:012d}.jsonl.gz").write_bytes(
        gzip.compress(b"".join(kept)))
    (d / "claims.json").unlink()
    with pytest.raises(HistoryLost, match=f"reached seq {seq}"):
        Registry(d).claim("victim", owner="mallory")


BUSY = """
import sys, time
from fleetclaims import Registry
from fleetclaims.store.file import segments
segments.SEGMENT_BYTES = 20000
reg = Registry(sys.argv[1])
end = time.time() + float(sys.argv[3]); n = 0
while time.time() < end:
    c = reg.claim(f"w{sys.argv[2]}-{n % 50}", owner="agent-" + sys.argv[2])
    reg.renew(c.task, token=c.token)
    reg.release(c.task, token=c.token); n += 1
reg.close()
"""


def test_each_rotation_moves_the_anchor_while_the_writer_stays_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One open handle, 4000-byte segments: each finished rotation is a checkpoint, and moves
    the anchor and the fence mark to its sealed head (they stayed where the first checkpoint
    put them, while busy writing)."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4000)
    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("first", owner="a")
    reg.close()  # (anchored at seq 2, fence 1)
    reg = Registry(d)
    try:
        for i in range(60):
            reg.claim(f"t-{i}", owner="a")
            sealed = segments.sealed(d)
            if len(sealed) >= 3 and sealed[-1].first > 30:
                break
        sealed = segments.sealed(d)
        assert len(sealed) >= 3
        found = anchor.read(d)
        assert found is not None and found.seq >= sealed[-2].last, (found, sealed)
        assert _fence_mark(d) == found.fence > 1
    finally:
        reg.close()


@pytest.mark.slow
def test_the_anchor_follows_a_busy_writer_whose_checkpoints_are_rotations(
        tmp_path: Path) -> None:
    """Two writers, segments of 20 KB (a rotation every fraction of a second, each writing the
    snapshot): the anchor and the fence mark advance while they write (they stayed at the first
    CLI write's), and name the head at rest. Cutting the newest half of the segments is then
    refused (it used to be accepted: fences went back by hundreds)."""
    d = tmp_path / "r"
    assert _cli(d, "claim", "init", "--owner", "x").returncode == 0
    first = anchor.read(d)
    assert first is not None
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(d), str(i), "5"])
             for i in (1, 2)]
    seen = []
    try:
        for _ in range(8):
            time.sleep(0.5)
            found = anchor.read(d)
            seen.append((found.seq if found else 0, _fence_mark(d)))
    finally:
        assert all(p.wait(60) == 0 for p in procs)
    assert len(segments.sealed(d)) >= 4
    # (rotations every fraction of a second: sampled twice a second, it moves nearly each time)
    moved = sum(1 for a, b in itertools.pairwise(seen) if b[0] > a[0] and b[1] > a[1])
    assert moved >= 3, seen
    seq, fence = _last_seq(d)
    found = anchor.read(d)
    assert found is not None and (found.seq, found.fence) == (seq, fence)
    assert _fence_mark(d) == fence
    sealed = segments.sealed(d)
    for seg in sealed[len(sealed) // 2:]:
        seg.path.unlink()
    for idx in d.glob("segments/*.idx.json"):
        idx.unlink()
    (d / "audit.jsonl").write_bytes(b"")
    (d / "claims.json").unlink()
    assert _cli(d, "audit", "verify").returncode == 5
    # (history_lost; or, when the cut falls inside segments a helper sealed ahead of the
    # active journal, the missing segment is named first; or, when the emptied audit.jsonl
    # lacks the anchor's line at the seam, the journal is the broken side: refused every way)
    report = doctor.check(d)
    assert not report.ok
    assert {"history_lost", "segment_damaged", "journal_corrupt"} & set(report.kinds())
    with pytest.raises((HistoryLost, SegmentDamaged)):
        Registry(d).claim("after-cut", owner="mallory")


def test_a_rotation_snapshot_before_presealed_lines_is_not_quarantined(tmp_path: Path) -> None:
    """A rotation's snapshot (offset 0, seq S) and a helper that sealed the lines after S
    before any rotation switched the journal (a writer closed first): the state at rest of two
    concurrent writers. The snapshot fits (the journal starts at S+1); it used to be taken for
    unusable, never rewritten at rest, and quarantined by the next writer (registry_rebuilt)."""
    d = tmp_path / "r"
    done = run_python(SESSION, str(d), "12")  # (rotated at 13: snapshot at 13, offset 0)
    assert done.returncode == 0, done.stderr
    rotated = (d / "claims.json").read_bytes()
    assert orjson.loads(rotated)["offset"] == 0
    reg = Registry(d)
    for i in range(3):
        reg.claim(f"more-{i}", owner="b")
    reg.close()
    (d / "claims.json").write_bytes(rotated)  # (as a close that left its checkpoint to a helper)
    lines, _ = journal_lines(d)
    first, last = orjson.loads(lines[0])["seq"], orjson.loads(lines[-1])["seq"]
    assert (first, last) == (14, 16)
    segments.seal(d, b"".join(line + b"\n" for line in lines), first, last, sync=False)
    reg = Registry(d)
    assert reg.claim("next", owner="c").fence == 16
    reg.close()
    types = [orjson.loads(line)["type"] for line in journal_lines(d)[0]]
    assert "registry_rebuilt" not in types
    assert not (d / "quarantine").exists()


# --- an anchor deleted, overwritten or stripped of its seal ---------------------------------


def _history(d: Path) -> None:
    reg = Registry(d)
    for t in ("a", "b", "c"):
        reg.claim(t, owner="alice")
    reg.close()


def test_a_keyed_anchor_rewritten_without_the_key_is_refused_by_every_command(
        tmp_path: Path) -> None:
    """With the key: the journal re-sealed by a forger, the anchor's head changed to match
    but its seal left. audit verify refused it, but list, explain and doctor took it for
    healthy and a claim sealed the forgery under the user's key. Now all refuse; doctor --fix
    records the break (journal_break) and keeps the untrusted anchor beside the new one."""
    anchor.create_key()
    d = tmp_path / "r"
    _history(d)
    doc = orjson.loads(anchor.anchor_file(d).read_bytes())
    forge_journal(d)
    forged = journal_lines(d)[0][-1]
    doc["head"] = orjson.loads(forged)["hash"]
    anchor.anchor_file(d).write_bytes(orjson.dumps(doc))
    for args in (("list",), ("explain", "a"), ("audit", "verify"), ("doctor",),
                 ("claim", "d", "--owner", "z")):
        done = _cli(d, *args)
        assert done.returncode == 5, (args, done.stdout, done.stderr)
        assert "not sealed by your key" in done.stdout + done.stderr, args
    assert journal_lines(d)[0][-1] == forged  # (nothing written)
    fixed = doctor.check(d, fix=True)
    assert fixed.ok, fixed.to_dict()
    assert orjson.loads(journal_lines(d)[0][-1])["type"] == "journal_break"
    kept = list(anchor.anchor_file(d).parent.glob("*.untrusted-*"))
    assert len(kept) == 1 and orjson.loads(kept[0].read_bytes()) == doc
    assert Registry(d).claim("d", owner="z").fence == 4
    assert _cli(d, "audit", "verify").returncode == 0


@pytest.mark.parametrize("keyed", [True, False])
@pytest.mark.parametrize("junk", [b"garbage\n", b"[]", b'{"format":1}', None])
def test_an_anchor_overwritten_or_deleted_is_refused_not_replaced(
        tmp_path: Path, junk: bytes | None, keyed: bool) -> None:
    """The anchor overwritten with junk (or deleted) after a forger re-sealed the journal:
    verify, doctor and writes all passed and the anchor was silently written anew. claims.lock's
    anchor mark says one was written there: refused, the junk left as it is; doctor --fix
    records the break and fences go on above."""
    if keyed:
        anchor.create_key()
    d = tmp_path / "r"
    _history(d)
    path = anchor.anchor_file(d)
    forge_journal(d)
    if junk is None:
        path.unlink()
    else:
        path.write_bytes(junk)
    with pytest.raises(HistoryLost, match="deleted" if junk is None else "cannot be read"):
        Registry(d).claim("d", owner="z")
    with pytest.raises(HistoryLost):
        Registry(d).claims()
    assert _cli(d, "audit", "verify").returncode == 5
    assert "history_lost" in doctor.check(d).kinds()
    assert (path.read_bytes() if junk is not None else path.exists()) == (junk or False)
    assert doctor.check(d, fix=True).ok
    assert Registry(d).claim("d", owner="z").fence == 4


def test_a_seal_stripped_from_a_keyed_anchor_is_refused(tmp_path: Path) -> None:
    """An anchor written with the key, then rewritten to match a forged journal without a
    seal (as if written before the key was made): claims.lock's mark says the last one was
    sealed, so it is refused."""
    anchor.create_key()
    d = tmp_path / "r"
    _history(d)
    doc = orjson.loads(anchor.anchor_file(d).read_bytes())
    forge_journal(d)
    doc["head"] = orjson.loads(journal_lines(d)[0][-1])["hash"]
    doc.pop("mac")
    anchor.anchor_file(d).write_bytes(orjson.dumps(doc))
    with pytest.raises(HistoryLost, match="no seal of your key"):
        Registry(d).claims()


def test_no_false_alarm_for_fresh_moved_premark_or_prekey_registries(tmp_path: Path) -> None:
    """A fresh registry; one moved elsewhere (its anchor is at another path: none there yet);
    one whose anchor was written before anchor marks (claims.lock holds none) and is gone;
    one whose unsealed anchor was written before the key was made: all keep working."""
    fresh = tmp_path / "fresh"
    assert Registry(fresh).claim("a", owner="x").fence == 1
    moved = tmp_path / "moved"
    _history(tmp_path / "before-move")
    (tmp_path / "before-move").rename(moved)
    assert Registry(moved).claim("d", owner="x").fence == 4
    premark = tmp_path / "premark"
    _history(premark)
    with open(premark / "claims.lock", "r+b") as f:
        f.seek(ANCHOR_OFFSET)
        f.write(b"\0" * ANCHOR_SIZE)
    anchor.anchor_file(premark).unlink()
    assert Registry(premark).claim("d", owner="x").fence == 4
    prekey = tmp_path / "prekey"
    _history(prekey)
    anchor.create_key()
    unsealed = anchor.read(prekey)
    assert unsealed is not None and unsealed.mac is None
    reg = Registry(prekey)
    assert reg.claim("d", owner="x").fence == 4
    reg.close()
    found = anchor.read(prekey)
    assert found is not None and found.mac is not None and found.damage is None


def test_an_anchor_emptied_by_a_power_cut_is_no_alarm(tmp_path: Path) -> None:
    """Anchors are not fsynced (they only lag): after a power cut the renamed file may be
    empty or zeros. That is no alarm; the mark in claims.lock stands in for it, so a journal
    cut below what it recorded is still refused."""
    d = tmp_path / "r"
    _history(d)
    path = anchor.anchor_file(d)
    for lost in (b"", b"\0" * 200):
        path.write_bytes(lost)
        reg = Registry(d)
        assert [c.task for c in reg.claims()] == ["a", "b", "c"]
        reg.close()
    path.write_bytes(b"")
    lines, _ = journal_lines(d)
    (d / "audit.jsonl").write_bytes(b"".join(line + b"\n" for line in lines[:-1]))
    (d / "claims.json").unlink()
    with pytest.raises(HistoryLost, match="reached seq 4"):
        Registry(d).claim("c", owner="mallory")


def test_a_garbled_anchor_without_a_mark_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A registry last written before anchor marks, its anchor overwritten with junk: nothing
    says what it recorded, so the store refuses (the junk is never overwritten) and says how
    to go on: move it aside if the journal is trusted; then writes go on."""
    d = tmp_path / "r"
    _history(d)
    with open(d / "claims.lock", "r+b") as f:
        f.seek(ANCHOR_OFFSET)
        f.write(b"\0" * ANCHOR_SIZE)
    path = anchor.anchor_file(d)
    path.write_bytes(b"junk")
    with pytest.raises(HistoryLost, match="cannot be read") as caught:
        Registry(d).claim("d", owner="z")
    assert "move that file aside" in str(caught.value)
    assert path.read_bytes() == b"junk"
    # doctor says so too (it said healthy while every write was refused)
    from fleetclaims.store.file import doctor as doctor_module

    found = doctor_module.check(d)
    assert not found.ok and any("cannot be read" in f.message for f in found.findings)
    assert path.read_bytes() == b"junk"
    path.rename(path.with_name(path.name + ".damaged"))
    assert Registry(d).claim("d", owner="z").fence == 4


# Readers load the registry again and again while two writers (each close re-anchoring, with
# rotations) replace the anchor by temp file + rename: never read as damage.
READER = """
import sys, time
from fleetclaims import Registry
end = time.time() + float(sys.argv[2]); n = 0
while time.time() < end:
    reg = Registry(sys.argv[1]); reg.claims(); reg.close(); n += 1
print(n)
"""

WRITER = """
import sys, time
from fleetclaims import Registry
from fleetclaims.store.file import segments
segments.SEGMENT_BYTES = 20000
end = time.time() + float(sys.argv[3]); n = 0
while time.time() < end:
    reg = Registry(sys.argv[1])
    for _ in range(20):
        c = reg.claim(f"w{sys.argv[2]}-{n % 30}", owner="agent-" + sys.argv[2]); n += 1
        reg.release(c.task, token=c.token)
    reg.close()
"""


@pytest.mark.slow
def test_concurrent_writers_replacing_the_anchor_raise_no_alarm(tmp_path: Path) -> None:
    anchor.create_key()
    d = tmp_path / "r"
    _history(d)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(d), str(i), "3"],
                                stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    reader = subprocess.run([sys.executable, "-c", READER, str(d), "3"], capture_output=True,
                            text=True, timeout=60, check=False)
    for w in writers:
        _, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    assert reader.returncode == 0, reader.stderr
    assert int(reader.stdout) > 5
    assert _cli(d, "audit", "verify").returncode == 0
    found = anchor.read(d)
    assert found is not None and found.damage is None and found.mac is not None
    assert (found.seq, found.fence) == _last_seq(d)
