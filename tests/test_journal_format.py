"""The journal's performance features keep the guarantees: group commit, preallocated zero
space, and the generation counter that replaces stat() between writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from fc_support import journal_lines

from fleetclaims import DurabilityError, Registry
from fleetclaims.store.file import faults, journal
from fleetclaims.store.file.journal import PREALLOCATE

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _disarm() -> object:
    yield
    faults.disarm()


def test_journal_is_preallocated_with_zeros(tmp_path: Path) -> None:
    """The data is followed by zero bytes; readers, export and verify see only the lines."""
    reg = Registry(tmp_path / "r")
    for i in range(5):
        reg.claim(f"t{i}", owner="a")
    raw = (tmp_path / "r" / "audit.jsonl").read_bytes()
    data, _, rest = raw.partition(b"\0")
    assert len(raw) >= PREALLOCATE and not rest.strip(b"\0")
    assert data.count(b"\n") == 6 and data.endswith(b"\n")
    assert reg.verify().bytes == len(data) and reg.verify().events == 6
    lines, tail = journal_lines(tmp_path / "r")
    assert len(lines) == 6 and tail == b""


def test_preallocation_grows_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the data reaches the end of the zero space, another chunk is added."""
    monkeypatch.setattr(journal, "PREALLOCATE", 4096)
    reg = Registry(tmp_path / "r", durability="process")
    for i in range(40):
        reg.claim(f"task-{i}", owner="a")
    path = tmp_path / "r" / "audit.jsonl"
    raw = path.read_bytes()
    data = raw.split(b"\0", 1)[0]
    assert len(data) > 4096 and len(raw) - len(data) <= 4096 + 1024
    assert Registry(tmp_path / "r").verify().ok


def test_failed_fsync_after_others_appended_is_not_undone(tmp_path: Path) -> None:
    """Group commit: A writes and releases the lock, B appends after A's line, then A's
    fdatasync fails. A cannot cut its line off (B built on it): it reports that, refuses
    further use, and B's acknowledged line stays."""
    d = tmp_path / "r"
    a, b = Registry(d), Registry(d)
    a.claim("warm", owner="a")
    b.claim("warm-b", owner="b")
    injected = {"done": False}

    def between(point: str) -> None:
        if point == "journal.before_sync" and not injected["done"]:
            injected["done"] = True
            faults.set_crash_hook(None)
            b.claim("from-b", owner="b")  # B appends after A's line, before A's fdatasync
            faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected"))

    faults.set_crash_hook(between)
    with pytest.raises(DurabilityError) as info:
        a.claim("from-a", owner="a")
    assert "other writers appended after it" in str(info.value)
    with pytest.raises(DurabilityError):
        a.claim("again", owner="a")
    faults.disarm()
    fresh = Registry(d)
    assert fresh.get("from-b") is not None and fresh.verify().ok


def test_failed_fsync_alone_is_undone_and_others_reload(tmp_path: Path) -> None:
    """A's fdatasync fails with nobody after it: A cuts its line off and bumps the journal
    generation, so B, which had already read that line, reloads and no longer sees it."""
    d = tmp_path / "r"
    a, b = Registry(d), Registry(d)
    a.claim("warm", owner="a")

    def between(point: str) -> None:
        if point == "journal.before_sync":
            faults.set_crash_hook(None)
            assert b.get("doomed") is not None  # B reads A's not-yet-durable line
            faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected"))

    faults.set_crash_hook(between)
    with pytest.raises(DurabilityError) as info:
        a.claim("doomed", owner="a")
    assert "not undone" not in str(info.value) and "undoing it" not in str(info.value)
    faults.disarm()
    assert b.get("doomed") is None  # the generation told B to reload
    assert b.claim("after", owner="b").fence == 2
    assert Registry(d).verify().ok


def test_generation_bump_makes_open_handles_reload(tmp_path: Path) -> None:
    """A journal replaced under open handles (doctor --fix) is noticed through the generation
    counter in claims.lock, not by stat()ing the journal."""
    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("t1", owner="a")
    other = Registry(d)
    assert other.get("t1") is not None
    # Replace the journal by a fresh registry's journal, as doctor --fix would, then bump.
    fresh = tmp_path / "fresh"
    Registry(fresh).claim("only-in-fresh", owner="z")
    os.replace(fresh / "audit.jsonl", d / "audit.jsonl")
    if (d / "claims.json").exists():
        os.unlink(d / "claims.json")
    from fleetclaims.store.file.lock import bump_generation_at

    bump_generation_at(d / "claims.lock")
    assert other.get("t1") is None and other.get("only-in-fresh") is not None


def test_no_stat_of_the_journal_between_writes(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The write path never stats the journal (on Linux 6.13+ that makes each following
    fdatasync ~60 us slower); measured in bench/fsync_floor.py, guarded here."""
    reg = Registry(tmp_path / "r")
    reg.claim("warm", owner="a")
    journal = str(tmp_path / "r" / "audit.jsonl")
    seen: list[str] = []
    real_stat, real_fstat = os.stat, os.fstat
    fd_path = os.readlink

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path) == journal:
            seen.append("stat")
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def fstat(fd: int) -> os.stat_result:
        try:
            if fd_path(f"/proc/self/fd/{fd}") == journal:
                seen.append("fstat")
        except OSError:
            pass
        return real_fstat(fd)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "fstat", fstat)
    for i in range(20):
        c = reg.claim(f"t{i}", owner="a")
        reg.release(c.task, token=c.token)
    assert seen == []


def test_deleted_journal_is_damage_not_an_empty_registry(tmp_path: Path) -> None:
    """A registry whose journal vanished (and which has no snapshot yet) reports damage
    instead of starting over silently; doctor --fix records the loss and starts anew."""
    from fleetclaims import RegistryCorrupt
    from fleetclaims.store.file import doctor

    d = tmp_path / "r"
    Registry(d).claim("t1", owner="a")
    os.unlink(d / "audit.jsonl")
    os.unlink(d / "claims.json")  # (written at rest since #15; this case has none)
    with pytest.raises(RegistryCorrupt, match="journal is missing"):
        Registry(d).claims()
    with pytest.raises(RegistryCorrupt):
        Registry(d).claim("t1", owner="b")
    assert not doctor.check(d).ok
    assert doctor.check(d, fix=True).ok
    reg = Registry(d)
    assert reg.events(limit=10).events[0].type == "registry_rebuilt"
    assert reg.claim("t1", owner="b").owner == "b"


def test_doctor_never_reissues_a_fence_and_names_lost_claims(tmp_path: Path) -> None:
    """A byte flipped mid-journal: doctor --fix keeps the verified prefix and the verified
    lines after the damage, names the claim the damaged line held, and new grants get fences
    above every fence handed out before (a holder of a lost claim is fenced out)."""
    from fleetclaims.store.file import doctor

    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(1, 7):
        reg.claim(f"d{i}", owner="o")
    reg.close()
    os.unlink(d / "claims.json")  # (written at rest since #15: it would restore d4-d6)
    path = d / "audit.jsonl"
    raw = bytearray(path.read_bytes())
    lines = bytes(raw).split(b"\n")
    at = sum(len(x) + 1 for x in lines[:3]) + 30  # inside seq 4 (d3)
    raw[at] = ord("X") if raw[at] != ord("X") else ord("Y")
    path.write_bytes(bytes(raw))
    report = doctor.check(d, fix=True)
    assert report.ok
    # (#16: the lines after the damaged one verify among themselves and are kept; only what
    # the damaged bytes held is named lost)
    lost = [f for f in report.findings if f.kind == "claims_lost"]
    assert lost and {c["task"] for c in lost[0].details["lost"]} == {"d3"}
    fresh = Registry(d)
    assert {c.task for c in fresh.claims()} == {"d1", "d2", "d4", "d5", "d6"}
    c = fresh.claim("d3", owner="intruder")
    assert c.fence > 6  # above every fence handed out before the damage
