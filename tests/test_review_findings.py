"""Defects found by a review of the file store's write and read paths, each demonstrated.

1. A handle that opens the journal without the lock (a reader, or a writer's pre-lock catch-up)
   read the generation *after* opening the journal: a doctor --fix replacing the journal in
   between left it with the old inode and the new generation, so it never reloaded and later
   acknowledged writes into the unlinked old journal.
2. Undoing a failed append cut the journal back, then fsync'ed, then bumped the generation: when
   the fsync failed (likely on a device that just failed fdatasync) the generation was not bumped
   although the bytes were gone, so a handle that had read the undone lines appended past the
   end of the file: a hole of zeros, then an acknowledged line that every later load reports as
   damage (AuditCorrupt) and doctor --fix drops.
3. The blocking lock wait raised RegistryBusy when the SIGALRM timer fired just after flock()
   granted the lock, and left the lock held: every other process was then locked out.
4. A handle that first loaded as a reader over a damaged snapshot never quarantined it when it
   later wrote (see the test).
5. Undoing a failed fdatasync could leave a snapshot ahead of the journal (see the test).
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fc_support import events_of

import fleetclaims
import fleetclaims.store.file.lock as lock_mod
import fleetclaims.store.file.store as sf
from fleetclaims import DurabilityError, RegistryBusy
from fleetclaims.store.file import faults
from fleetclaims.store.file.lock import RegistryLock, bump_generation_at

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    faults.disarm()


def _data_of(path: Path) -> bytes:
    data = path.read_bytes()
    nul = data.find(b"\0")
    return data if nul < 0 else data[:nul]


def _replace_journal_like_doctor(directory: Path) -> None:
    """What doctor --fix's salvage does: under the lock, write the (verified) journal to a temp
    file, rename it over audit.jsonl, bump the generation."""
    lock = RegistryLock(directory / "claims.lock", timeout=5)
    lock.open()
    try:
        with lock.held():
            tmp = directory / "audit.jsonl.doctor-tmp"
            tmp.write_bytes(_data_of(directory / "audit.jsonl"))
            os.chmod(tmp, 0o600)
            os.replace(tmp, directory / "audit.jsonl")
            bump_generation_at(directory / "claims.lock")
    finally:
        lock.close()


def test_journal_replaced_while_a_reader_opens_it(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "reg"
    first = fleetclaims.Registry(directory)
    first.claim("before", owner="a", ttl=600)
    first.close()

    real_open = faults.osc.open
    fired: list[str] = []

    def racing_open(path: str, flags: int, mode: int = 0o600) -> int:
        fd = real_open(path, flags, mode)
        if path.endswith("audit.jsonl") and not fired:
            fired.append(path)
            _replace_journal_like_doctor(directory)  # lands between open() and generation()
        return fd

    monkeypatch.setattr(faults.osc, "open", racing_open)
    reg = fleetclaims.Registry(directory)
    assert reg.get("before") is not None  # first use: a reader load, no lock
    monkeypatch.undo()
    assert fired

    lease = reg.claim("after", owner="b", ttl=600)  # acknowledged
    fresh = fleetclaims.Registry(directory)
    got = fresh.get("after")
    assert got is not None and got.fence == lease.fence, (
        "an acknowledged claim went to the replaced (unlinked) journal and is lost")


def test_failed_undo_fsync_still_bumps_the_generation(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "reg"
    writer = fleetclaims.Registry(directory)
    other = fleetclaims.Registry(directory)
    writer.claim("warm", owner="a", ttl=600)
    assert other.get("warm") is not None

    # Between writer's lock release and its fdatasync, the other handle reads its line.
    def hook(name: str) -> None:
        if name == "journal.before_sync":
            faults.set_crash_hook(None)
            assert other.get("undone") is not None  # read uncommitted, as the design allows

    journal_fd: list[int] = [writer.store._fd]  # type: ignore[attr-defined]
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if fd == journal_fd[0]:
            raise OSError(errno.EIO, "injected: the device fails the undo's fsync too")
        real_fsync(fd)

    faults.set_crash_hook(hook)
    faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected fdatasync failure"))
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(DurabilityError):
        writer.claim("undone", owner="a", ttl=600)
    monkeypatch.undo()
    faults.disarm()

    lease = other.claim("next", owner="b", ttl=600)  # acknowledged
    fresh = fleetclaims.Registry(directory)
    got = fresh.get("next")  # before the fix: AuditCorrupt (data after zeros)
    assert got is not None and got.fence == lease.fence
    assert fresh.get("undone") is None
    assert fresh.verify().ok


class _FlockGrantedAtTheDeadline:
    """fcntl stand-in: a blocking flock() is granted (the holder let go) and the interval timer
    fires right after, before the waiter disarms it."""

    def __init__(self, holder: RegistryLock) -> None:
        import fcntl

        self._fcntl = fcntl
        self._holder = holder
        self.LOCK_EX, self.LOCK_NB, self.LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

    def flock(self, fd: int, op: int) -> Any:
        if op == self.LOCK_EX:  # the blocking wait
            self._holder.release()
            self._fcntl.flock(fd, op)
            signal.raise_signal(signal.SIGALRM)
            return None
        return self._fcntl.flock(fd, op)


@pytest.fixture
def _no_pytest_alarm() -> Iterator[None]:
    """pytest-timeout owns SIGALRM; give it back to the default so the blocking wait is used."""
    handler = signal.getsignal(signal.SIGALRM)
    timer = signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGALRM, handler)
    if timer[0] > 0:
        signal.setitimer(signal.ITIMER_REAL, *timer)


def test_lock_timeout_racing_the_grant_never_keeps_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _no_pytest_alarm: None
) -> None:
    path = tmp_path / "claims.lock"
    holder = RegistryLock(path, timeout=5)
    holder.open()
    holder.acquire()
    waiter = RegistryLock(path, timeout=5)
    waiter.open()
    bystander = RegistryLock(path, timeout=0.2)
    bystander.open()
    monkeypatch.setattr(lock_mod, "SPIN", 0)
    monkeypatch.setattr(lock_mod, "fcntl", _FlockGrantedAtTheDeadline(holder))
    try:
        try:
            waiter.acquire()
            got = True
        except RegistryBusy:
            got = False
        monkeypatch.undo()
        if got:  # it holds the lock, as it was told
            waiter.release()
        # Either way, once the waiter has let go (or was told it never had it), others can lock.
        bystander.acquire()
        bystander.release()
    finally:
        for lock in (holder, waiter, bystander):
            lock.close()


def test_damaged_snapshot_seen_first_by_a_reader_is_still_quarantined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4. A handle whose first use is a read rebuilds a damaged snapshot in memory only; its
    later writes took the fast path under the lock, so the snapshot was never quarantined, no
    registry_rebuilt was recorded, and the next checkpoint silently overwrote it."""
    monkeypatch.setattr(sf, "CHECKPOINT_MIN_TAIL", 200)
    monkeypatch.setattr(sf, "CHECKPOINT_DIVISOR", 1000)
    directory = tmp_path / "reg"
    reg = fleetclaims.Registry(directory)
    for i in range(3):
        reg.claim(f"t{i}", owner="a", ttl=600)
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()
    snap = directory / "claims.json"
    data = bytearray(snap.read_bytes())
    at = data.find(b'"owner":"a"')
    data[at + 9 : at + 10] = b"b"  # the checksum no longer matches
    damaged = bytes(data)
    snap.write_bytes(damaged)

    reg = fleetclaims.Registry(directory)
    assert reg.get("t1") is not None  # reader load: rebuilt from the journal in memory
    reg.claim("x", owner="c", ttl=600)
    quarantine = directory / "quarantine"
    kept = [p.read_bytes() for p in quarantine.iterdir()] if quarantine.exists() else []
    assert damaged in kept, "the damaged snapshot was not quarantined"
    assert "registry_rebuilt" in [e["type"] for e in events_of(directory)]


def test_cut_back_never_strands_a_snapshot_ahead_of_the_journal(tmp_path: Path) -> None:
    """5. A locked checkpoint (doctor --fix ends with one) can include another writer's lines
    written but not yet fdatasync'ed. When that fdatasync fails and nobody appended after them,
    the writer cut them off although the snapshot already covers them: every later load then
    reports `acknowledged events are missing from the journal` (RegistryCorrupt)."""
    directory = tmp_path / "reg"
    writer = fleetclaims.Registry(directory)
    other = fleetclaims.Registry(directory)
    writer.claim("warm", owner="a", ttl=600)

    def hook(name: str) -> None:
        if name == "journal.before_sync":
            faults.set_crash_hook(None)
            other.store.checkpoint()  # type: ignore[attr-defined]

    faults.set_crash_hook(hook)
    faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected fdatasync failure"))
    with pytest.raises(DurabilityError):
        writer.claim("unsynced", owner="a", ttl=600)
    faults.disarm()

    fresh = fleetclaims.Registry(directory)
    fresh.claim("next", owner="b", ttl=600)
    assert fresh.get("next") is not None
    assert fleetclaims.Registry(directory).get("warm") is not None
