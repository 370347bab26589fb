"""Honest history (#16): no cut, forged, foreign or wiped history goes unnoticed, fences never
go back, and doctor --fix / init --new-history go on above every fence handed out.

Oracle of every case: no fence handed out twice (the next grant is above every fence the old
history granted), nothing deleted (what is replaced is in quarantine/ or still in the journal).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from fc_support import (
    file_store,
    forge_journal,
    journal_lines,
    quarantined,
    replay,
    run_python,
    token_of,
)

from fleetclaims import (
    AuditCorrupt,
    ClaimConflict,
    HistoryLost,
    Registry,
    RegistryCorrupt,
    TaskCompleted,
)
from fleetclaims.core.chain import seal
from fleetclaims.location import resolve as fleetclaims_location
from fleetclaims.store.file import anchor, doctor, forked, segments
from fleetclaims.store.file.snapshot import encode_snapshot, read_snapshot

pytestmark = pytest.mark.integration


def _history(d: Path, n: int = 5) -> int:
    """A registry with n grants (fences 1..n), closed (checkpointed, mirrored); its top fence."""
    reg = Registry(d)
    for i in range(n):
        reg.claim(f"t{i}", owner="a")
    reg.close()
    return n


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def _cut(d: Path, keep: int) -> bytes:
    lines, _ = journal_lines(d)
    data = b"".join(line + b"\n" for line in lines[:keep])
    (d / "audit.jsonl").write_bytes(data)
    return data


def test_cut_tail_without_snapshot_is_refused_and_fences_go_on_above(tmp_path: Path) -> None:
    """Last lines removed (no snapshot): refused with HistoryLost naming the lost seqs; doctor
    --fix records a journal_break and the next grant is above every fence handed out."""
    d = tmp_path / "r"
    top = _history(d)
    os.unlink(d / "claims.json")
    kept = _cut(d, 3)
    with pytest.raises(HistoryLost, match=r"events 4\.\.6 are lost"):
        Registry(d).claims()
    with pytest.raises(HistoryLost):
        Registry(d).claim("x", owner="b")
    assert "history_lost" in doctor.check(d).kinds()
    assert doctor.check(d, fix=True).ok
    assert doctor.check(d, fix=True).ok  # converged
    assert (d / "audit.jsonl").read_bytes().startswith(kept)  # nothing deleted
    assert Registry(d).claim("x", owner="b").fence == top + 1
    kinds = [e["type"] for e in map(orjson.loads, journal_lines(d)[0])]
    assert "journal_break" in kinds


def test_cut_tail_below_the_snapshot_is_refused_and_restored(tmp_path: Path) -> None:
    """Lines cut below the snapshot: refused (typed); doctor --fix restores the snapshot's
    claims and fences go on above."""
    d = tmp_path / "r"
    top = _history(d)
    _cut(d, 2)
    with pytest.raises(RegistryCorrupt):
        Registry(d).claim("x", owner="b")
    assert doctor.check(d, fix=True).ok
    reg = Registry(d)
    assert {c.task for c in reg.claims()} >= {f"t{i}" for i in range(top)}
    assert reg.claim("x", owner="b").fence == top + 1


def test_a_crash_before_the_mirror_is_updated_is_no_false_alarm(tmp_path: Path) -> None:
    """A writer killed after its appends but before any checkpoint: the anchor lags the
    journal, never leads it, so the next opener works and fences go on."""
    d = tmp_path / "r"
    top = _history(d)
    code = (
        "import os, sys\nfrom fleetclaims import Registry\n"
        "reg = Registry(sys.argv[1])\n"
        "for i in range(3):\n    reg.claim(f'k{i}', owner='c')\n"
        "os._exit(0)\n"
    )
    done = run_python(code, str(d))
    assert done.returncode == 0, done.stderr
    found = anchor.read(d)
    assert found is not None and found.fence == top  # lagging
    assert Registry(d).claim("x", owner="b").fence == top + 4


def test_wiped_folder_outside_a_repository_is_refused(tmp_path: Path) -> None:
    """The registry folder removed: reads and writes refuse (exit 5), not a new registry with
    fence 1; init --new-history starts above the old fences and keeps nothing silently."""
    d = tmp_path / "r"
    top = _history(d)
    shutil.rmtree(d)
    for read in (("audit", "verify"), ("doctor",), ("claims",)):  # (not "no registry", exit 2)
        assert _cli(d, *read).returncode == 5, read
        assert _cli(d, "--dir", str(d), *read).returncode == 5, read
    assert not d.exists()  # (reading created nothing)
    with pytest.raises(HistoryLost, match="removed or emptied"):
        Registry(d).claim("x", owner="b")
    assert _cli(d, "claims").returncode == 5
    assert "history_lost" in doctor.check(d).kinds()
    done = _cli(d, "init", "--new-history")
    assert done.returncode == 0, done.stderr
    assert Registry(d).claim("x", owner="b").fence == top + 1


def test_new_history_sets_sealed_segments_aside_too(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """init --new-history over a registry whose journal was rotated into segments/: the sealed
    segments (the old chain's head) go to quarantine/ with the journal, so the new history
    starts clean (it used to meet the old segments and refuse its first claim)."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 16_000)
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(40):
        token = token_of(reg.claim(f"issue-{i}", owner="a"))
        reg.renew(f"issue-{i}", token=token)
        reg.release(f"issue-{i}", token=token)
    reg.close()
    assert segments.sealed(d)
    done = _cli(d, "init", "--new-history")
    assert done.returncode == 0, done.stderr
    assert not (d / "segments").exists()
    assert any("segments" in p.name and not p.name.endswith(".note.json")
               for p in (d / "quarantine").iterdir())
    assert Registry(d).claim("x", owner="b").fence == 41
    assert Registry(d).verify().ok
    assert doctor.check(d).kinds() == ["quarantined"]  # (an [info] line: what was set aside)


def test_a_handle_whose_folder_was_wiped_refuses_its_next_write(tmp_path: Path) -> None:
    """A long-lived handle, its folder removed under it: its next write is refused like a new
    handle's, not appended to the deleted journal (acknowledged, then lost with it)."""
    d = tmp_path / "r"
    top = _history(d)
    reg = Registry(d)
    assert len(reg.claims()) == top
    shutil.rmtree(d)
    with pytest.raises(HistoryLost, match="removed or emptied"):
        reg.claim("x", owner="b")
    with pytest.raises(HistoryLost):
        reg.claims()
    reg.close()


def test_a_handle_whose_folder_was_replaced_joins_the_new_registry(tmp_path: Path) -> None:
    """The folder replaced under a live handle (removed, and a new registry started there with
    no anchor to refuse it): the handle writes to the registry now at the path and takes its
    lock, so the two handles still never both hold a task."""
    d = tmp_path / "r"
    old = Registry(d)
    old.claim("a", owner="old")  # (never closed: nothing anchored, the new registry is allowed)
    shutil.rmtree(d)
    new = Registry(d)
    assert new.claims() == []
    b = old.claim("b", owner="old")
    assert [c.task for c in new.claims()] == ["b"]
    with pytest.raises(ClaimConflict):
        new.claim("b", owner="new")
    assert b.fence == 1 and [c.task for c in old.claims()] == ["b"]
    old.close()
    new.close()
    assert Registry(d).verify().ok


def test_a_folder_moved_under_a_writer_gets_nothing_written_at_the_old_path(
        tmp_path: Path) -> None:
    """The folder moved aside under a live handle and a new registry started at the path: the
    handle goes on in the moved folder (its files, as every process holding them open), and
    its checkpoint is not renamed into the new registry by path (which left that one with a
    snapshot of another registry: refused as a foreign journal)."""
    d = tmp_path / "r"
    old = Registry(d)
    old.claim("x", owner="a", ttl=600)
    d.rename(tmp_path / "moved")
    new = Registry(d)
    new.claim("y", owner="b", ttl=600)
    new.close()
    old.claim("z", owner="a", ttl=600)
    old.close()
    fresh = Registry(d)
    assert [c.task for c in fresh.claims()] == ["y"]
    assert fresh.claim("w", owner="b").fence == 2
    assert fresh.verify().ok
    moved = Registry(tmp_path / "moved")
    assert sorted(c.task for c in moved.claims()) == ["x", "z"]
    assert moved.verify().ok


def test_no_snapshot_lands_in_a_folder_replaced_under_its_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder restored from a copy while a handle still has the old one open: the handle's
    checkpoint (at close here; a settle helper's or a forked child's likewise) is not written
    into the restored folder, where it would stand ahead of that journal."""
    d, backup = tmp_path / "r", tmp_path / "backup"
    reg = Registry(d, durability="process")
    for i in range(3):
        reg.claim(f"t{i}", owner="a")
    reg.close()
    shutil.copytree(d, backup)
    reg = Registry(d, durability="process")
    for i in range(5):
        reg.claim(f"u{i}", owner="a")
    assert file_store(reg).lagging()  # (a checkpoint is owed at close)
    moved = forked.moved_since(file_store(reg))
    assert not moved()
    shutil.rmtree(d)
    shutil.copytree(backup, d)
    assert moved()
    monkeypatch.setenv("FLEETCLAIMS_ANCHOR_DIR", str(tmp_path / "other-anchors"))  # (deliberate)
    reg.close()
    restored = Registry(d)
    assert sorted(c.task for c in restored.claims()) == ["t0", "t1", "t2"]
    assert restored.verify().ok


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.mark.parametrize("layout", ["repository", "worktree", "bare"])
def test_git_clean_in_a_repository_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              layout: str) -> None:
    """git clean -fdx removes .cache/fleetclaims/: the anchor in the git common dir (shared by
    worktrees, a bare repository's own directory) survives it, so the next command refuses
    instead of handing out fence 1; init --new-history starts above the old fences."""
    monkeypatch.delenv("FLEETCLAIMS_ANCHOR_DIR")
    monkeypatch.delenv("FLEETCLAIMS_DIR")
    repo = tmp_path / "repo"
    repo.mkdir()
    commit = ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty",
              "-m", "x"]
    if layout == "bare":
        _git(repo, "init", "-q", "--bare")
        seed = tmp_path / "seed"
        _git(tmp_path, "clone", "-q", str(repo), str(seed))
        _git(seed, *commit)
        _git(seed, "push", "-q", "origin", "HEAD")
        common, where = repo, tmp_path / "wt"
        _git(repo, "worktree", "add", "-q", str(where))
        d = where / ".cache" / "fleetclaims"
    else:
        _git(repo, "init", "-q")
        _git(repo, *commit)
        common, where = repo / ".git", repo
        if layout == "worktree":
            where = tmp_path / "wt"
            _git(repo, "worktree", "add", "-q", str(where))
        d = repo / ".cache" / "fleetclaims"
    monkeypatch.chdir(where)
    assert Path(fleetclaims_location()) == d
    top = _history(d)
    mirror = anchor.anchor_file(d)
    assert mirror.is_file() and common.resolve() in mirror.resolve().parents
    if layout != "bare":
        assert mirror == common / "fleetclaims" / "anchor.json"
    _git(d.parents[1], "clean", "-fdxq")  # (in the working tree that holds the registry)
    assert not d.exists()
    with pytest.raises(HistoryLost):
        Registry(d).claim("x", owner="b")
    assert _cli(d, "init", "--new-history").returncode == 0
    assert Registry(d).claim("x", owner="b").fence == top + 1


def _foreign(tmp_path: Path) -> Path:
    other = tmp_path / "other"
    _history(other, 2)
    return other


def test_foreign_journal_with_our_snapshot_is_refused_and_ours_restored(
        tmp_path: Path) -> None:
    """Another registry's journal copied over ours (our snapshot kept): refused, our snapshot
    is not quarantined as 'unanchored'; doctor --fix keeps the foreign journal aside and
    restores our claims, fences above ours."""
    d = tmp_path / "r"
    top = _history(d)
    ours = (d / "claims.json").read_bytes()
    foreign = (_foreign(tmp_path) / "audit.jsonl").read_bytes()
    (d / "audit.jsonl").write_bytes(foreign)
    with pytest.raises(HistoryLost, match="belongs to registry"):
        Registry(d).claim("x", owner="b")
    assert (d / "claims.json").read_bytes() == ours  # not quarantined by the refusal
    assert doctor.check(d, fix=True).ok
    assert foreign in quarantined(d).values()
    reg = Registry(d)
    assert {c.task for c in reg.claims()} == {f"t{i}" for i in range(top)}
    assert reg.claim("x", owner="b").fence == top + 1


def test_another_registrys_snapshot_over_our_journal_is_quarantined(tmp_path: Path) -> None:
    """claims.json copied from another registry over ours, our journal intact (the anchor says
    it is ours): the snapshot is the stranger, quarantined and rebuilt as a damaged one; not a
    refusal that calls our journal foreign and advises init --new-history (which would have
    set the good journal aside)."""
    ours, theirs = tmp_path / "a", tmp_path / "b"
    _history(ours, 2)
    _history(theirs, 3)
    (ours / "claims.json").write_bytes((theirs / "claims.json").read_bytes())
    reg = Registry(ours)
    assert reg.claim("x", owner="c").fence == 3
    assert sorted(c.task for c in reg.claims()) == ["t0", "t1", "x"]
    assert reg.verify().ok
    assert (theirs / "claims.json").read_bytes() in quarantined(ours).values()


def test_foreign_journal_without_snapshot_is_refused(tmp_path: Path) -> None:
    """A foreign journal and no snapshot of ours: refused; doctor cannot restore (says so);
    init --new-history starts above both histories' fences."""
    d = tmp_path / "r"
    top = _history(d)
    os.unlink(d / "claims.json")
    (d / "audit.jsonl").write_bytes((_foreign(tmp_path) / "audit.jsonl").read_bytes())
    with pytest.raises(HistoryLost):
        Registry(d).claims()
    assert not doctor.check(d, fix=True).ok
    assert _cli(d, "init", "--new-history").returncode == 0
    assert Registry(d).claim("x", owner="b").fence == top + 1


def test_forged_snapshot_fence_is_not_trusted(tmp_path: Path) -> None:
    """A snapshot at the journal's end with fence 0 (checksum recomputed): the fence mark in
    claims.lock exposes it; it is rebuilt from the journal and the next fence is top + 1."""
    d = tmp_path / "r"
    top = _history(d)
    snap, problem = read_snapshot(d / "claims.json")
    assert snap is not None and problem is None
    state = snap.state
    state.fence = 0
    (d / "claims.json").write_bytes(encode_snapshot(state, snap.offset))
    reg = Registry(d)
    assert reg.claim("x", owner="b").fence == top + 1
    assert any(b"snapshot" in name.encode() for name in quarantined(d))


def test_forged_appended_grant_reusing_a_fence_is_damage(tmp_path: Path) -> None:
    """A re-sealed, correctly chained claim_created that reuses fence 1: applying it fails
    (a grant is the high-water + 1), so reads and writes report AuditCorrupt at its seq."""
    d = tmp_path / "r"
    _history(d)
    os.unlink(d / "claims.json")
    lines, _ = journal_lines(d)
    last = orjson.loads(lines[-1])
    forged = orjson.loads(lines[1])  # the grant of fence 1
    forged.update(seq=last["seq"] + 1, task="forged", prev=last["hash"])
    del forged["hash"]
    line, _ = seal(orjson.dumps(forged))
    with open(d / "audit.jsonl", "ab") as f:
        f.write(line if line.endswith(b"\n") else line + b"\n")
    with pytest.raises(AuditCorrupt, match="fence 1 after high-water"):
        Registry(d).claim("x", owner="b")
    reg = Registry(d)
    assert "forged" not in {c.task for c in reg.claims()}  # reads show the verified state
    damage = file_store(reg).damage
    assert damage is not None and damage.seq == last["seq"] + 1
    assert not doctor.check(d).ok


@pytest.mark.slow
def test_audit_anchor_and_verify_anchor(tmp_path: Path) -> None:
    """audit anchor prints SEQ:HASH; verify --anchor holds it (exit 0), refuses another hash
    for that seq or a seq beyond the journal (exit 5), and a malformed anchor is usage (2)."""
    d = tmp_path / "r"
    _history(d)
    printed = _cli(d, "audit", "anchor")
    assert printed.returncode == 0, printed.stderr
    head = printed.stdout.strip()
    seq, digest = head.split(":")
    assert _cli(d, "audit", "verify", "--anchor", head).returncode == 0
    assert _cli(d, "audit", "verify", "--anchor", f"{seq}:{'f' * 64}").returncode == 5
    assert _cli(d, "audit", "verify", "--anchor", f"{int(seq) + 5}:{digest}").returncode == 5
    assert _cli(d, "audit", "verify", "--anchor", "nonsense").returncode == 2


def test_verify_fails_whenever_the_store_would_refuse(tmp_path: Path) -> None:
    """audit verify exits 5 for a missing journal (snapshot kept) and for a lost history,
    though the remaining chain itself verifies."""
    d = tmp_path / "r"
    _history(d)
    os.unlink(d / "audit.jsonl")
    assert _cli(d, "audit", "verify").returncode == 5
    e = tmp_path / "e"
    _history(e)
    os.unlink(e / "claims.json")
    _cut(e, 3)
    assert _cli(e, "audit", "verify").returncode == 5


def _flip_ts(d: Path, k: int) -> tuple[dict[str, Any], bytes]:
    """Flip one bit inside the ts of journal line ``k`` (same length, seal broken): that
    line's event as it was, and the damaged journal's bytes."""
    lines, _ = journal_lines(d)
    victim = orjson.loads(lines[k])
    raw = bytearray((d / "audit.jsonl").read_bytes())
    raw[sum(len(x) + 1 for x in lines[:k]) + 12] ^= 0x01
    (d / "audit.jsonl").write_bytes(bytes(raw))
    return victim, bytes(raw)


def test_damage_in_the_middle_keeps_the_verified_remainder(tmp_path: Path) -> None:
    """One flipped byte in the middle of a ~145-event journal: doctor --fix keeps every line
    after it that verifies (a journal_break records seq and byte range), completed tasks stay
    completed (also the one whose grant was the damaged line: its completion verified), only
    the damaged line's task is named lost, and fences go on above."""
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(48):
        c = reg.claim(f"t{i}", owner="a")
        reg.renew(c.task, token=c.token or "")
        reg.complete(c.task, token=c.token or "")
    reg.close()
    os.unlink(d / "claims.json")  # (else the snapshot restores everything)
    lines, _ = journal_lines(d)
    assert len(lines) >= 145
    k = 70
    victim, raw = _flip_ts(d, k)
    report = doctor.check(d, fix=True)
    assert report.ok, report.to_dict()
    lost = [f for f in report.findings if f.kind == "claims_lost"]
    assert {x["task"] for x in lost[0].details["lost"]} == {victim["task"]}
    restored = [f for f in report.findings if f.kind == "completions_restored"]
    assert restored and restored[0].details["tasks"] == [victim["task"]]
    assert doctor.check(d, fix=True).ok  # converged
    fresh = Registry(d)
    done = {c.task for c in fresh.claims(include_completed=True) if c.state == "completed"}
    # ... the victim too: its grant was in the damaged line, its completion verified (#16)
    assert done == {f"t{i}" for i in range(48)}
    again = fresh.get(victim["task"])
    assert again is not None and (again.owner, again.fence) == ("a", victim["fence"])
    with pytest.raises(TaskCompleted):
        fresh.claim(victim["task"], owner="b")
    breaks = [orjson.loads(x) for x in journal_lines(d)[0]
              if orjson.loads(x)["type"] == "journal_break"]
    assert breaks and breaks[0]["from_seq"] == victim["seq"] == breaks[0]["to_seq"]
    assert breaks[0]["offset"] == sum(len(x) + 1 for x in lines[:k])
    assert fresh.claim("new", owner="b").fence == 49
    assert bytes(raw) in quarantined(d).values()  # nothing deleted


@pytest.mark.parametrize("snapshot_at", ["head", "middle"])
def test_damage_in_the_middle_with_a_snapshot_keeps_the_history_after_it(
        tmp_path: Path, snapshot_at: str) -> None:
    """The same with claims.json in place (at the head, the usual state at rest, or before the
    damage): the verified lines after the damage are kept too, so `explain` still tells their
    tasks' history, and the snapshot only adds what they do not hold (the damaged line's
    claim). It used to re-record the snapshot's claims and drop every later line (they were
    only in quarantine: `explain` said "never claimed" of tasks `get` showed held)."""
    d = tmp_path / "r"
    reg = Registry(d)
    early = b""
    for i in range(8):
        reg.claim(f"t{i}", owner="a", ttl=600)
        if i == 1:
            file_store(reg).checkpoint()
            early = (d / "claims.json").read_bytes()
    reg.close()  # (claims.json at the head)
    if snapshot_at == "middle":
        (d / "claims.json").write_bytes(early)
    victim, raw = _flip_ts(d, 4)  # (t3's grant)
    report = doctor.check(d, fix=True)
    assert report.ok, report.to_dict()
    assert "segment_kept" in report.kinds()
    assert doctor.check(d, fix=True).ok  # converged
    fresh = Registry(d)
    assert fresh.verify().ok
    held = {c.task: c.fence for c in fresh.claims()}
    if snapshot_at == "head":  # (the snapshot restores the damaged line's claim too)
        assert held == {f"t{i}": i + 1 for i in range(8)}
    else:
        assert held == {f"t{i}": i + 1 for i in range(8) if f"t{i}" != victim["task"]}
    for i in range(8):
        if f"t{i}" != victim["task"]:
            why = fresh.explain(f"t{i}")
            assert why.steps and why.holder == "a", (i, why)
    assert fresh.claim("new", owner="b").fence == 9
    assert bytes(raw) in quarantined(d).values()


def test_a_resealed_forgery_is_found_by_the_anchor(tmp_path: Path) -> None:
    """A journal re-sealed after an edit verifies as a chain, but not against the registry's
    anchor (its head is not in the forged journal): audit verify exits 5."""
    d = tmp_path / "r"
    _history(d)
    forge_journal(d)
    done = _cli(d, "audit", "verify")
    assert done.returncode == 5 and "anchor" in done.stdout, done.stdout


def test_a_resealed_forgery_longer_than_the_anchor_is_refused_before_any_write(
        tmp_path: Path) -> None:
    """The same forgery with a line more at the end (so the journal goes on past the anchor's
    seq): the store refuses it (HistoryLost: the line at the anchor's seq is not the one
    recorded) instead of adopting it, and doctor reports it, so no write moves the anchor past
    the evidence. It used to be accepted and the first claim made verify pass."""
    d = tmp_path / "r"
    _history(d)
    reg = Registry(d)
    with pytest.raises(ClaimConflict):
        reg.claim("t0", owner="zz")  # (recorded: the line the forger repeats at the end)
    reg.close()
    assert orjson.loads(journal_lines(d)[0][-1])["type"] == "claim_rejected"
    forge_journal(d, extra=1)
    with pytest.raises(HistoryLost, match="rewritten"):
        Registry(d).claim("x", owner="b")
    with pytest.raises(HistoryLost, match="rewritten"):
        Registry(d).claims()
    assert _cli(d, "audit", "verify").returncode == 5
    assert _cli(d, "audit", "verify").returncode == 5  # (still: nothing was written)
    assert "history_lost" in doctor.check(d).kinds()
    fixed = doctor.check(d, fix=True)  # (records the break; fences go on above)
    assert fixed.ok, fixed.to_dict()
    assert Registry(d).claim("x", owner="b").fence == 6


def test_the_key_seals_the_anchor_against_a_forger_who_rewrites_it(tmp_path: Path) -> None:
    """With the per-user key (0600), a forger who re-seals the journal and rewrites the anchor
    to match is found (the anchor's HMAC); without the key the same forgery passes, which is
    what the README says the chain alone cannot prove."""
    for keyed in (True, False):
        d = tmp_path / f"r{keyed}"
        if keyed:
            path, _ = anchor.create_key()
            assert (path.stat().st_mode & 0o777) == 0o600
        else:
            anchor.key_file().unlink()
        _history(d)
        forge_journal(d)
        forged = replay(journal_lines(d)[0])  # the forger's view, then a matching anchor
        doc = orjson.loads(anchor.anchor_file(d).read_bytes())
        doc.update(seq=forged.seq, head=forged.head, fence=forged.fence)
        doc.pop("mac", None)
        anchor.anchor_file(d).write_bytes(orjson.dumps(doc))
        done = _cli(d, "audit", "verify")
        assert (done.returncode == 5) is keyed, (keyed, done.stdout)
        if keyed:
            assert "seal of your key" in done.stdout


def test_a_resealed_grant_below_the_high_water_is_named_in_words(tmp_path: Path) -> None:
    """A forged line, sealed onto the chain, granting a fence at or below one already handed
    out: the refusal says what is wrong in words ("grant of fence 1 after high-water 2"), not
    as a Python repr (ValueError('...'))."""
    from fc_support import append_raw, journal_lines

    from fleetclaims.core.chain import envelope, seal

    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("t", owner="a")
    reg.claim("u", owner="a")
    reg.close()
    lines, _ = journal_lines(d)
    last = orjson.loads(lines[-1])
    forged = {k: v for k, v in last.items() if k not in ("seq", "ts", "prev", "hash")}
    forged.update(task="v", fence=1)
    line, _ = seal(orjson.dumps(envelope(last["seq"] + 1, last["ts"] + 1, forged, last["hash"])))
    append_raw(d / "audit.jsonl", line)
    with pytest.raises(AuditCorrupt) as info:
        Registry(d).claim("w", owner="x")
    assert "grant of fence 1 after high-water 2" in str(info.value)
    assert "ValueError(" not in str(info.value)
