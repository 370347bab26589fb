"""Sealed history and foreign files that doctor must not adopt (a probe's findings).

Oracles: another registry's claims.json never gives its claims to this registry (doctor names it
and quarantines it); a sealed segment that does not chain into the journal (edited and re-sealed,
another registry's, swapped, missing) is sealed-history damage: doctor --fix refuses to rewrite
it and leaves audit.jsonl as it is; explain, audit --task and events fail with SegmentDamaged
(exit 5) rather than tell a shorter or different history; the advice given for it is what works
(restore the segment), never `doctor --fix`.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from fc_support import quarantined

from fleetclaims import Registry
from fleetclaims.core.chain import seal
from fleetclaims.core.errors import SegmentDamaged
from fleetclaims.store.file import doctor, preseal, segments, verify_par

pytestmark = pytest.mark.integration


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4_000)
    monkeypatch.setattr(segments, "BLOCK", 1_000)
    monkeypatch.setattr(preseal, "ENABLED", False)
    monkeypatch.setattr(verify_par, "PAR_MIN", 1 << 62)


def _sealed_registry(d: Path, n: int = 40) -> list[segments.Segment]:
    """A registry of n claims t-0..t-{n-1} by agent-a, with sealed segments and a few lines in
    audit.jsonl (closed: checkpointed and anchored)."""
    reg = Registry(d)
    for i in range(n):
        reg.claim(f"t-{i}", owner="agent-a")
    reg.close()
    size = segments.SEGMENT_BYTES
    segments.SEGMENT_BYTES = 1 << 30  # (no rotation at this close: lines stay active)
    try:
        reg = Registry(d)
        reg.claim("u-0", owner="agent-a")
        reg.close()
    finally:
        segments.SEGMENT_BYTES = size
    sealed = segments.sealed(d)
    assert len(sealed) >= 2 and (d / "audit.jsonl").stat().st_size > 0
    return sealed


def _lines(seg: segments.Segment) -> list[bytes]:
    return gzip.decompress(seg.path.read_bytes()).splitlines()


def _reseal(lines: list[bytes], prev: str) -> list[bytes]:
    out = []
    for line in lines:
        event = orjson.loads(line)
        event["prev"] = prev
        del event["hash"]
        sealed, prev = seal(orjson.dumps(event))
        out.append(sealed.rstrip(b"\n"))
    return out


def _write(seg: segments.Segment, lines: list[bytes]) -> None:
    seg.path.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines)))
    seg.index_path.unlink(missing_ok=True)  # (derived: the file is read)


def _forge_first(d: Path, task: str = "t-3") -> None:
    """The first segment edited (task's owner -> mallory) and re-sealed within itself."""
    seg = segments.sealed(d)[0]
    lines = [line.replace(b'"owner":"agent-a"', b'"owner":"mallory"')
             if orjson.dumps(task) in line else line for line in _lines(seg)]
    _write(seg, _reseal(lines, orjson.loads(lines[0])["prev"]))


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name not in (
        "claims.lock", "claims.json")}


# --- 1: another registry's claims.json ---------------------------------------------------------


def test_doctor_quarantines_another_registrys_snapshot_and_never_adopts_its_claims(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    reg = Registry(a)
    reg.claim("shared-task", owner="alice")
    reg.claim("a-only", owner="alice")
    reg.close()
    reg = Registry(b)
    reg.claim("shared-task", owner="bob")
    for i in range(5):
        reg.claim(f"b-{i}", owner="bob")
    reg.close()
    theirs = (b / "claims.json").read_bytes()
    (a / "claims.json").write_bytes(theirs)
    verify = _cli(a, "audit", "verify")
    assert verify.returncode == 5 and "another registry's snapshot" in verify.stdout, verify
    found = doctor.check(a)
    assert "snapshot_foreign" in found.kinds() and "snapshot_ahead" not in found.kinds()
    assert "another registry's snapshot" in found.findings[-1].message
    fixed = doctor.check(a, fix=True)
    assert fixed.ok, fixed.findings
    assert theirs in quarantined(a).values()
    reg = Registry(a)
    held = reg.get("shared-task")
    assert held is not None and (held.owner, held.fence) == ("alice", 1)
    assert sorted(c.task for c in reg.claims()) == ["a-only", "shared-task"]
    assert reg.claim("next", owner="carol").fence == 3
    assert "registry_rebuilt" not in (a / "audit.jsonl").read_text()


# --- 2: a sealed segment that does not chain into the journal -----------------------------


def test_doctor_fix_refuses_a_resealed_segment_and_keeps_the_journal(
        tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    _sealed_registry(d)
    _forge_first(d)
    before = _files(d)
    found = doctor.check(d)
    assert found.kinds() == ["segment_damaged"], found.findings
    assert "does not rewrite sealed history" in found.findings[0].message
    assert "journal_corrupt" not in found.kinds()
    with pytest.raises(SegmentDamaged, match="does not rewrite sealed history"):
        doctor.check(d, fix=True)
    assert "journal_break" not in (d / "audit.jsonl").read_text()
    assert _files(d) == before  # audit.jsonl not cut back nor quarantined
    assert not quarantined(d)
    with pytest.raises(SegmentDamaged, match="does not follow"):
        Registry(d).explain("t-3")
    for args in (("doctor",), ("doctor", "--fix")):
        done = _cli(d, *args)
        assert done.returncode == 5 and "doctor --fix` to repair" not in done.stdout, done
        assert "does not rewrite sealed history" in done.stdout
    verify = _cli(d, "audit", "verify")
    assert verify.returncode == 5 and "does not rewrite sealed history" in verify.stdout
    assert "doctor --fix` to repair" not in verify.stdout, verify.stdout


def test_another_registrys_segment_is_named_and_our_journal_not_quarantined(
        tmp_path: Path, small: None) -> None:
    ours, theirs = tmp_path / "a", tmp_path / "b"
    _sealed_registry(ours)
    _sealed_registry(theirs)
    seg = segments.sealed(theirs)[0]
    mine = segments.sealed(ours)[0]
    assert (seg.first, seg.last) == (mine.first, mine.last)
    shutil.copyfile(seg.path, mine.path)
    mine.index_path.unlink()
    before = _files(ours)
    found = doctor.check(ours)
    assert found.kinds() == ["segment_damaged"], found.findings
    assert "another registry's segment" in found.findings[0].message
    with pytest.raises(SegmentDamaged, match="another registry's segment"):
        doctor.check(ours, fix=True)
    assert _files(ours) == before and not quarantined(ours)
    with pytest.raises(SegmentDamaged):
        Registry(ours).explain("t-3")


def test_a_journal_that_does_not_follow_genuine_segments_is_the_journals_damage(
        tmp_path: Path, small: None) -> None:
    """The other way round: audit.jsonl replaced (another registry's, same seqs), our segments
    intact. The anchor's line is not in that journal, so the break at the seam is the
    journal's: doctor repairs it as a broken journal (the segments are kept as they are)."""
    ours, theirs = tmp_path / "a", tmp_path / "b"
    _sealed_registry(ours)
    _sealed_registry(theirs)
    (ours / "audit.jsonl").write_bytes((theirs / "audit.jsonl").read_bytes())
    sealed = {s.path.name: s.path.read_bytes() for s in segments.sealed(ours)}
    found = doctor.check(ours)
    assert "segment_damaged" not in found.kinds() and "journal_corrupt" in found.kinds(), (
        [f.message for f in found.findings], [(s.first, s.last) for s in segments.sealed(ours)],
        (ours / "audit.jsonl").read_bytes()[:60])
    assert doctor.check(ours, fix=True).ok
    assert {s.path.name: s.path.read_bytes() for s in segments.sealed(ours)} == sealed
    assert Registry(ours).verify().ok


# --- 3: reads of a task or of events over missing or damaged sealed history --------------------


@pytest.mark.parametrize("damage", ["edited", "swapped", "wiped", "archived_json_gone"])
def test_task_reads_fail_on_damaged_sealed_history(tmp_path: Path, small: None,
                                                   damage: str) -> None:
    d = tmp_path / "r"
    sealed = _sealed_registry(d)
    if damage == "edited":  # one line changed, not re-sealed
        lines = [line.replace(b'"owner":"agent-a"', b'"owner":"mallory"')
                 if b'"t-3"' in line else line for line in _lines(sealed[0])]
        _write(sealed[0], lines)
    elif damage == "swapped":
        one, two = sealed[0].path.read_bytes(), sealed[1].path.read_bytes()
        sealed[0].path.write_bytes(two)
        sealed[1].path.write_bytes(one)
        for seg in sealed[:2]:
            seg.index_path.unlink()
    elif damage == "wiped":
        for seg in sealed:
            seg.path.unlink()
            seg.index_path.unlink()
    else:
        assert _cli(d, "audit", "archive", "--before", "0s").returncode == 0
        (d / "segments" / "archived.json").unlink()
    reg = Registry(d)
    with pytest.raises(SegmentDamaged):
        reg.explain("t-3")
    with pytest.raises(SegmentDamaged):
        reg.events(task="t-3")
    if damage in ("wiped", "archived_json_gone"):
        with pytest.raises(SegmentDamaged, match="missing"):
            reg.events(limit=2)
    reg.close()
    for args in (("explain", "t-3"), ("audit", "--task", "t-3")):
        done = _cli(d, *args)
        assert done.returncode == 5, (args, done.stdout, done.stderr)
        assert "never claimed" not in done.stdout


# --- 4: the damage member of --json agrees with the message ---------------------------------


def test_damage_member_names_the_seq_the_events_shown_stop_at(tmp_path: Path) -> None:
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(5):
        reg.claim(f"t{i}", owner="agent-a")
    reg.close()  # (the snapshot at the end: the load reads none of the lines)
    lines = (d / "audit.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"owner":"agent-a"', b'"owner":"agent-b"')
    (d / "audit.jsonl").write_bytes(b"".join(lines))
    done = _cli(d, "explain", "t1", "--json")
    doc = orjson.loads(done.stdout)
    damage = doc["damage"]
    assert damage["from_seq"] == 3 and damage["verified_seq"] == 2, damage
    assert f"up to seq {damage['verified_seq']}" in done.stderr


def test_damage_member_of_a_sealed_segment_names_no_journal_bytes_and_says_restore(
        tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    sealed = _sealed_registry(d)
    lines = [line.replace(b'"owner":"agent-a"', b'"owner":"mallory"')
             if b'"t-3"' in line else line for line in _lines(sealed[0])]
    _write(sealed[0], lines)
    (d / "claims.json").unlink()  # (the load replays the segments and stops at the damage)
    done = _cli(d, "claims", "--json")
    damage = orjson.loads(done.stdout)["damage"]
    assert damage["file"] == str(sealed[0].path) and damage["verified_seq"] == damage[
        "from_seq"] - 1, damage
    assert damage["offset"] is None and damage["end"] is None, damage
    assert damage["fix"].startswith("restore the sealed segment"), damage
