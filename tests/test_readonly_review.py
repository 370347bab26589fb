"""Read-only review (#16): a registry on a read-only mount (or whose files we may only read)
and a registry with a damaged journal can still be reviewed: reads show the verified state
and name the damage; only writes (and `audit verify`) fail.

The tests run as any user, root included (who may write 0444 files), so "read-only" is the
operating system's answer EROFS to every open for writing, injected at the store's one open seam.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from fleetclaims import AuditCorrupt, FleetclaimsError, Registry, UnsafeRegistry
from fleetclaims.store.file import faults, fsutil
from fleetclaims.store.file import store as file_store_module

pytestmark = pytest.mark.integration


@pytest.fixture
def read_only_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    real = faults.osc.open

    def open_(path: str, flags: int, mode: int = 0o600) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real(path, flags, mode)

    monkeypatch.setattr(faults.osc, "open", open_)


def _registry(d: Path) -> None:
    reg = Registry(d)
    reg.claim("t1", owner="a")
    reg.claim("t2", owner="b")
    reg.close()


def test_reads_work_on_a_read_only_registry(tmp_path: Path,
                                            read_only_mount: None) -> None:
    """list/get/events on a read-only mount: no write access needed (claims.lock and the
    journal opened for reading); a write fails typed, not with a raw OSError."""
    d = tmp_path / "r"
    with pytest.MonkeyPatch.context() as m:  # (made before the mount turned read-only)
        m.setattr(faults.osc, "open", os.open)
        _registry(d)
    reg = Registry(d)
    assert {c.task for c in reg.claims()} == {"t1", "t2"}
    assert reg.get("t1") is not None and reg.get("t1").owner == "a"  # type: ignore[union-attr]
    assert len(reg.events(limit=10).events) == 3
    with pytest.raises(FleetclaimsError):
        reg.claim("t9", owner="z")


def test_a_write_on_a_read_only_mount_says_so_and_reads_go_on(
        tmp_path: Path, read_only_mount: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The write is AccessDenied saying the registry can only be read here (it was a
    DurabilityError "Bad file descriptor ... fix the cause (disk space, permissions,
    hardware)"); nothing was written, and the same handle reads on."""
    from fleetclaims import AccessDenied
    from fleetclaims.cli import main

    d = tmp_path / "r"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(faults.osc, "open", os.open)
        _registry(d)
    before = (d / "audit.jsonl").read_bytes()
    reg = Registry(d)
    with pytest.raises(AccessDenied, match="can only be read here"):
        reg.claim("t9", owner="z")
    assert reg.get("t1") is not None and len(reg.claims()) == 2
    assert (d / "audit.jsonl").read_bytes() == before
    assert main(["--dir", str(d), "--json", "claim", "t9", "--owner", "z"]) == 1
    assert '"access_denied"' in capsys.readouterr().out


def _tree(*dirs: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``dirs``: bytes, mtime (ns) and mode, to show nothing was written."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
            for d in dirs if d.exists() for p in sorted(d.rglob("*")) if p.is_file()}


def _make_foreign(d: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make ``d`` another user's registry, read-only (files 0444, directory 0555). As root
    (who may do so) it is given to uid 54321 for real; otherwise the ownership check's seam
    (fsutil.euid) is told that we are someone else. Returns the owner's uid."""
    for p in d.iterdir():
        os.chmod(p, 0o444)
    if os.geteuid() == 0:
        for p in [*d.iterdir(), d]:
            os.chown(p, 54321, 54321)
        owner = 54321
    else:
        owner = os.geteuid()
        monkeypatch.setattr(fsutil, "euid", lambda: owner + 1)
    os.chmod(d, 0o555)
    return owner


def test_another_users_registry_is_read_never_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's 0444 registry: claims, get, events and explain show its state, with no
    file opened for writing, created or changed (not even claims.lock); a write is refused
    (UnsafeRegistry naming the owner, saying reads work and what to do) before the lock."""
    d = tmp_path / "theirs"
    _registry(d)
    owner = _make_foreign(d, monkeypatch)
    # (a reader that replayed a long journal leaves a snapshot where it may write: never here)
    monkeypatch.setattr(file_store_module, "REPLAY_SNAPSHOT", -1)
    before = _tree(d, tmp_path / "anchors")
    writes: list[str] = []
    real = faults.osc.open

    def open_(path: str, flags: int, mode: int = 0o600) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            writes.append(path)
        return real(path, flags, mode)

    monkeypatch.setattr(faults.osc, "open", open_)
    try:
        reg = Registry(d)
        assert {c.task for c in reg.claims()} == {"t1", "t2"}
        got = reg.get("t2")
        assert got is not None and got.owner == "b"
        assert len(reg.events(limit=10).events) == 3
        assert reg.explain("t1").holder == "a"
        with pytest.raises(UnsafeRegistry) as refused:
            reg.claim("t9", owner="z")
        message = str(refused.value)
        assert f"owned by uid {owner}" in message and "only read" in message
        assert "Reading works" in message and "FLEETCLAIMS_DIR" in message
        reg.close()
        from fleetclaims.store.file import doctor

        report = doctor.check(d, fix=True)  # (nor does doctor --fix touch it)
        assert not report.ok and "foreign_owner" in report.kinds(), report.to_dict()
    finally:
        os.chmod(d, 0o700)  # (so that tmp_path can be removed)
    assert writes == []
    after = _tree(d, tmp_path / "anchors")
    assert after == before


def _damaged(d: Path) -> tuple[int, int]:
    """A registry of 4 claims (t0..t3, fences 1..4), closed, without a snapshot, with a byte
    flipped inside seq 4 (t2's grant); returns that line's byte range."""
    reg = Registry(d)
    for i in range(4):
        reg.claim(f"t{i}", owner="a")
    reg.close()
    os.unlink(d / "claims.json")
    raw = bytearray((d / "audit.jsonl").read_bytes())
    lines = bytes(raw).split(b"\n")
    at = sum(len(x) + 1 for x in lines[:3])
    raw[at + 20] ^= 0x01
    (d / "audit.jsonl").write_bytes(bytes(raw))
    return at, at + len(lines[3]) + 1


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    from fleetclaims.cli import main

    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, (args, err)
    return json.loads(out)


def test_json_reads_name_the_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--json of claims, get, explain, audit, events and audit report on a damaged journal:
    the verified state plus a ``damage`` member (file, seq range, byte range, reason, what
    the damaged line held, what to run); `claims --json` becomes an object so that a script
    cannot take the verified part for the whole; on a healthy registry nothing changes."""
    healthy, d = tmp_path / "h", tmp_path / "r"
    _registry(healthy)
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(healthy))
    assert isinstance(_json(capsys, "claims"), list)
    for args in (["get", "t1"], ["get", "nope"], ["explain", "t1"], ["audit"], ["events"],
                 ["audit", "report", "--html", str(tmp_path / "h.html")]):
        assert "damage" not in _json(capsys, *args), args
    start, end = _damaged(d)
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(d))
    listed = _json(capsys, "claims")
    assert {c["task"] for c in listed["claims"]} == {"t0", "t1"}
    docs = [listed, _json(capsys, "get", "t0"), _json(capsys, "get", "t2"),
            _json(capsys, "explain", "t0"), _json(capsys, "audit"), _json(capsys, "events"),
            _json(capsys, "audit", "report", "--html", str(tmp_path / "r.html"))]
    for doc in docs:
        damage = doc["damage"]
        assert damage["file"] == str(d / "audit.jsonl")
        assert (damage["from_seq"], damage["to_seq"]) == (4, 4)
        assert (damage["offset"], damage["end"]) == (start, end)
        assert damage["verified_seq"] == 3 and damage["reason"]
        assert damage["fix"] == "fleetclaims doctor --fix"
        assert [(h["task"], h["type"]) for h in damage["held"]] == [("t2", "claim_created")]
    assert docs[2]["claim"] is None  # (t2's grant is in the damaged line)
    assert len(docs[4]["events"]) == 3


@pytest.mark.slow  # (imports the MCP SDK: ~1 s)
def test_mcp_read_tools_name_the_damage(tmp_path: Path) -> None:
    """The MCP read tools (get, claims, events, explain) carry the same ``damage`` member on a
    damaged journal, and none on a healthy one."""
    from fleetclaims.agents.mcp_server import ClaimsServer

    healthy, d = tmp_path / "h", tmp_path / "r"
    _registry(healthy)
    _damaged(d)
    for where, damaged in ((healthy, False), (d, True)):
        server = ClaimsServer(Registry(where), "agent-x")
        for result in (server.get("t0"), server.claims(), server.events(),
                       server.explain("t0"), server.ready(), server.brief()):
            doc = result.structured_content
            assert not result.is_error and doc is not None, result
            assert ("damage" in doc) is damaged, (where, doc)
            if damaged:
                assert doc["damage"]["from_seq"] == 4
        server.registry.close()


def test_reads_of_a_damaged_journal_show_the_verified_state(tmp_path: Path) -> None:
    """A damaged line mid-journal: reads return the state before it and name the damage
    (store.damage: seq and offset); a write refuses with AuditCorrupt."""
    d = tmp_path / "r"
    at, _ = _damaged(d)  # a byte flipped inside seq 4 (t2's grant)
    reg = Registry(d)
    assert {c.task for c in reg.claims()} == {"t0", "t1"}
    damage = reg.store.damage  # type: ignore[attr-defined]
    assert isinstance(damage, AuditCorrupt) and (damage.seq, damage.offset) == (4, at)
    with pytest.raises(AuditCorrupt):
        reg.claim("x", owner="b")


@pytest.mark.slow
def test_review_commands_on_a_damaged_journal_exit_0(tmp_path: Path) -> None:
    """claims, get, explain, audit and audit report exit 0 on a damaged journal and name the
    damage on stderr; audit verify and a write exit 5."""
    import subprocess
    import sys

    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(4):
        reg.claim(f"t{i}", owner="a")
    reg.close()
    os.unlink(d / "claims.json")
    raw = bytearray((d / "audit.jsonl").read_bytes())
    raw[sum(len(x) + 1 for x in bytes(raw).split(b"\n")[:3]) + 20] ^= 0x01
    (d / "audit.jsonl").write_bytes(bytes(raw))
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetclaims", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    for args in (["claims"], ["get", "t0"], ["explain", "t0"], ["audit"],
                 ["audit", "report", "--html", str(tmp_path / "r.html")]):
        done = run(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert "seq 4" in done.stderr, args
    assert run("audit", "verify").returncode == 5
    assert run("claim", "x", "--owner", "b").returncode == 5


def test_event_reads_stop_at_damage_before_the_snapshot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At rest claims.json is at the journal head, so damage in any older line lies before
    it: the state loads without reading it, but audit, events, explain and audit report read
    every line and once exited 5 with nothing shown. They show the events up to the damage,
    name it on stderr and in ``damage``, and exit 0; an export writes the verified part and
    exits 5 (a copy that is not whole)."""
    from fleetclaims.cli import main

    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(4):
        reg.claim(f"t{i}", owner="a")
    reg.close()  # (at rest: claims.json at the head, seq 5)
    raw = bytearray((d / "audit.jsonl").read_bytes())
    raw[sum(len(x) + 1 for x in bytes(raw).split(b"\n")[:3]) + 20] ^= 0x01  # seq 4
    (d / "audit.jsonl").write_bytes(bytes(raw))
    assert {c.task for c in Registry(d).claims()} == {"t0", "t1", "t2", "t3"}
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(d))
    for args in (["audit"], ["events"], ["explain", "t2"],
                 ["audit", "report", "--html", str(tmp_path / "r.html")]):
        doc = _json(capsys, *args)
        assert doc["damage"]["from_seq"] == 4, args
    assert [e["seq"] for e in _json(capsys, "audit")["events"]] == [1, 2, 3]
    caplog.clear()
    assert main(["audit"]) == 0
    out, _ = capsys.readouterr()
    assert "showing the verified events only (up to seq 3)" in caplog.text and "t1" in out
    assert main(["audit", "export", "-o", str(tmp_path / "x.jsonl")]) == 5
    capsys.readouterr()
    assert len((tmp_path / "x.jsonl").read_text().splitlines()) == 3


def test_every_json_read_names_the_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """tasks and ready --json were bare arrays on a damaged journal, and stats, brief and top
    --json had no damage member: a script took the verified part for the whole registry."""
    healthy, d = tmp_path / "h", tmp_path / "r"
    _registry(healthy)
    Registry(healthy).add("q1")
    _damaged(d)
    reads = (["tasks"], ["ready"], ["stats"], ["brief", "--owner", "a"], ["top"])
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(healthy))
    assert isinstance(_json(capsys, "tasks"), list) and isinstance(_json(capsys, "ready"), list)
    for args in reads[2:]:
        assert "damage" not in _json(capsys, *args), args
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(d))
    for args in reads:
        doc = _json(capsys, *args)
        assert doc["damage"]["from_seq"] == 4, args
        if args[0] in ("tasks", "ready"):
            assert isinstance(doc["tasks"], list)
