"""Nothing slow under the registry lock (#21): liveness probes before it, a long journal
replayed without it (and a snapshot left behind), a large checkpoint forked off so the
operation that triggers it does not encode it."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fc_support import events_of

from fleetclaims import ClaimConflict, Registry
from fleetclaims.core.model import Identity, Verdict
from fleetclaims.store.file import catchup, journal, rest, snapshot
from fleetclaims.store.file import store as fstore
from fleetclaims.system import SystemProber
from fleetclaims.testing import FakeClock

pytestmark = pytest.mark.integration


def lock_free(directory: Path) -> bool:
    """Whether nobody holds the registry lock right now (taken and given back at once)."""
    fd = os.open(directory / "claims.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (closing drops a lock this descriptor took)
    return True


class WatchingProber(SystemProber):
    """The real prober, noting for each verdict whether the registry lock was free."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.free: list[bool] = []

    def verdict(self, identity: Identity | None) -> Verdict:
        self.free.append(lock_free(self.directory))
        return super().verdict(identity)


def test_holder_probed_before_the_lock(tmp_path: Path) -> None:
    reg_dir = tmp_path / "reg"
    holder = Registry(reg_dir)
    holder.claim("t", owner="a")
    prober = WatchingProber(reg_dir)
    other = Registry(reg_dir, prober=prober)
    for _ in range(3):
        with pytest.raises(ClaimConflict):
            other.claim("t", owner="b")
    assert prober.free == [True, True, True]  # one probe a refusal, none under the lock
    holder.close()
    other.close()


def test_holder_changed_meanwhile_is_probed_under_the_lock(tmp_path: Path) -> None:
    """The verdict made before the lock is only reused for the same owner process."""
    reg_dir = tmp_path / "reg"
    first = Registry(reg_dir)
    token = first.claim("t", owner="a").token
    prober = WatchingProber(reg_dir)
    other = Registry(reg_dir, prober=prober)
    with pytest.raises(ClaimConflict):
        other.claim("t", owner="b")
    assert token is not None
    first.release("t", token=token)
    first.claim("t", owner="c", process=os.getppid())  # another owner process now
    with pytest.raises(ClaimConflict, match="held by 'c'"):
        other.claim("t", owner="b")
    # the second refusal saw holder a before the lock (probed), then c under it (probed again)
    assert prober.free == [True, True, False]
    first.close()
    other.close()


def test_sweep_probes_each_owner_process_once_before_the_lock(tmp_path: Path) -> None:
    reg_dir = tmp_path / "reg"
    prober = WatchingProber(reg_dir)
    reg = Registry(reg_dir, prober=prober)
    for i in range(5):
        reg.claim(f"t{i}", owner="a")
    prober.free.clear()
    report = reg.sweep()
    assert not report.found
    assert prober.free == [True]
    reg.close()


def long_journal(reg_dir: Path, n: int) -> None:
    """A registry of ``n`` claims whose claims.json is gone (never checkpointed)."""
    reg = Registry(reg_dir, durability="process")
    for i in range(n):
        reg.claim(f"live-{i}", owner="filler", ttl=86400.0, process=False)
    reg.close()
    os.unlink(reg_dir / "claims.json")


def _locked_applies(reg_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per journal line applied from now on: whether the lock was held then."""
    held: list[bool] = []
    real = journal.apply_checked

    def watched(state: Any, event: Any, offset: int, path: str) -> None:
        held.append(not lock_free(reg_dir))
        real(state, event, offset, path)

    monkeypatch.setattr(catchup, "apply_checked", watched)
    return held


def test_long_replay_holds_no_lock_and_leaves_a_snapshot(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    reg_dir = tmp_path / "reg"
    long_journal(reg_dir, 400)
    held = _locked_applies(reg_dir, monkeypatch)
    reg = Registry(reg_dir)
    reg.claim("new", owner="b")
    assert len(held) >= 400
    assert sum(held) == 0  # every line replayed while the lock was free
    reg.close()
    assert (reg_dir / "claims.json").exists()


def test_a_damaged_snapshot_is_replayed_past_once_and_without_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal is replayed before the lock (the snapshot is unusable), and under the lock
    the writer quarantines the snapshot and records the rebuild without replaying again."""
    reg_dir = tmp_path / "reg"
    reg = Registry(reg_dir, durability="process")
    for i in range(300):
        reg.claim(f"live-{i}", owner="filler", ttl=86400.0, process=False)
    reg.close()
    (reg_dir / "claims.json").write_bytes(b'{"format": 2, "seq": 1, "garbage"')
    held = _locked_applies(reg_dir, monkeypatch)
    again = Registry(reg_dir)
    again.claim("new", owner="b")
    assert 300 <= len(held) < 330  # once, not twice
    assert sum(held) == 0
    kinds = [e["type"] for e in events_of(reg_dir)]
    assert kinds.count("registry_rebuilt") == 1
    assert list((reg_dir / "quarantine").iterdir())
    assert len(again.claims()) == 301
    again.close()


def test_a_reader_that_replayed_a_long_journal_leaves_a_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg_dir = tmp_path / "reg"
    long_journal(reg_dir, 200)
    monkeypatch.setattr(fstore, "REPLAY_SNAPSHOT", 10_000)
    reader = Registry(reg_dir, create=False)
    assert len(reader.claims()) == 200
    assert (reg_dir / "claims.json").exists()
    reader.close()
    applied = []
    real = journal.apply_checked
    def counted(*a: Any) -> None:
        applied.append(1)
        real(*a)

    monkeypatch.setattr(catchup, "apply_checked", counted)
    again = Registry(reg_dir, create=False)
    assert len(again.claims()) == 200
    assert applied == []  # the next reader starts from that snapshot
    again.close()


@pytest.mark.slow
def test_writers_do_not_time_out_behind_a_long_replay(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One handle replays a journal slowly (2 ms a line, ~1.2 s) while another writes with a
    0.3 s lock timeout: no RegistryBusy."""
    reg_dir = tmp_path / "reg"
    long_journal(reg_dir, 600)
    busy = Registry(reg_dir, lock_timeout=0.3, durability="process")
    busy.claim("warm", owner="w")  # loaded before the slow replay starts
    real = journal.apply_checked
    slow = threading.local()

    def crawl(*a: Any) -> None:
        if getattr(slow, "on", 0) > 0:  # (the old lines only: new ones come faster)
            slow.on -= 1
            time.sleep(0.002)
        real(*a)

    monkeypatch.setattr(catchup, "apply_checked", crawl)
    done: list[BaseException | None] = []

    def replayer() -> None:
        slow.on = 600
        try:
            Registry(reg_dir, lock_timeout=0.3).claim("late", owner="r")
            done.append(None)
        except BaseException as exc:  # (reported below)
            done.append(exc)

    t = threading.Thread(target=replayer)
    t.start()
    n = 0
    while t.is_alive():
        token = busy.claim(f"w{n % 5}", owner="w").token
        assert token is not None
        busy.release(f"w{n % 5}", token=token)
        n += 1
    t.join()
    assert done == [None]
    assert n > 50  # the writer went on all along
    busy.close()


def test_a_large_checkpoint_is_forked_off(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The operation that makes a checkpoint due does not encode the snapshot: a forked child
    does; closing waits for it, and claims.json is then at the head."""
    monkeypatch.setattr(rest, "FORK_MIN", 0)
    monkeypatch.setattr(fstore, "CHECKPOINT_MIN_TAIL", 2000)
    encodes: list[int] = []
    real = snapshot.encode_snapshot

    def counted(state: Any, offset: int) -> bytes:
        encodes.append(os.getpid())  # (a child's append stays in the child)
        return real(state, offset)

    monkeypatch.setattr(fstore, "encode_snapshot", counted)
    forks: list[int] = []
    real_fork = rest.fork_worker

    def fork(work: Any) -> int:
        pid = real_fork(work)
        forks.append(pid)
        return pid

    monkeypatch.setattr(rest, "fork_worker", fork)
    reg_dir = tmp_path / "reg"
    reg = Registry(reg_dir)
    reg.claim("first", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    encodes.clear()
    for i in range(40):
        token = reg.claim(f"t{i % 4}", owner="a").token
        assert token is not None
        reg.release(f"t{i % 4}", token=token)
    assert forks and all(pid > 0 for pid in forks)
    assert encodes == []  # the parent encoded nothing
    seq = reg.store.read().seq
    reg.close()


    assert snapshot.snapshot_seq(reg_dir / "claims.json") == seq


def test_human_listing_rows_match_the_claim_rows(tmp_path: Path) -> None:
    """The human table made from persisted dicts (one verdict per owner process) says what
    output.claim_rows says of Claim objects through Registry.is_stale, claim by claim."""
    from fleetclaims.cli.claims import data_rows
    from fleetclaims.cli.output import claim_rows

    clock = FakeClock(wall=time.time())
    reg = Registry(tmp_path / "reg", clock=clock)
    reg.claim("alive", owner="a", note="n1", paths=["src/**"], shared_paths=["docs"])
    gone = Registry(tmp_path / "reg", clock=clock)
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    for i in range(3):
        gone.claim(f"dead-{i}", owner="b", process=int(dead.stdout))
    reg.claim("lease-only", owner="c", process=False, ttl=5)
    token = reg.claim("done", owner="a").token
    assert token is not None
    reg.complete("done", token=token)
    token = reg.claim("let-go", owner="a").token
    assert token is not None
    reg.release("let-go", token=token)
    parked = reg.claim("parked", owner="a").token
    assert parked is not None
    reg.transition("parked", token=parked, phase="review", ttl=None)
    clock.advance(10)
    now = clock.now().wall
    objects = claim_rows(reg.claims(include_expired=True, include_completed=True,
                                    include_released=True), now, reg.is_stale)
    dicts = data_rows(reg.claims_data(include_expired=True, include_completed=True,
                                      include_released=True), now, reg)
    assert dicts == objects
    assert sum(row[5].startswith("STALE: owner dead") for row in dicts) == 3
    reg.close()
    gone.close()


@pytest.mark.slow
def test_a_stuck_checkpoint_child_is_killed_and_the_checkpoint_made_at_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest, "FORK_MIN", 0)
    monkeypatch.setattr(rest, "REAP_WAIT", 0.5)
    monkeypatch.setattr(fstore, "CHECKPOINT_MIN_TAIL", 2000)
    monkeypatch.setattr(fstore.FileStore, "_checkpoint_child", lambda self: time.sleep(60))
    reg_dir = tmp_path / "reg"
    reg = Registry(reg_dir)
    reg.claim("first", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    for i in range(40):
        token = reg.claim(f"t{i % 4}", owner="a").token
        assert token is not None
        reg.release(f"t{i % 4}", token=token)
    pid = reg.store._forked[0]  # type: ignore[attr-defined]
    assert pid > 0
    seq = reg.store.read().seq
    t = time.monotonic()
    reg.close()
    assert time.monotonic() - t < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped
    assert snapshot.snapshot_seq(reg_dir / "claims.json") == seq
