"""Checkpoints written by a forked child (#21): the parent re-bases its claim table on the file
the child wrote, so its changed and ended claims do not pile up in memory; the fork can be
turned off (FLEETCLAIMS_NO_FORK) and is skipped where unsafe; the child never runs the host's
atexit handlers, signal handlers or logging handlers.

Oracles: the count of changed entries the parent holds, against the number of tasks changed;
the parent's state against a fresh reader's; marker files the host's handlers would write.
"""

from __future__ import annotations

import _thread
import atexit
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fc_support import claims_view

from fleetclaims import Registry
from fleetclaims.store.file import forked, rest, snapshot
from fleetclaims.store.file import store as fstore
from fleetclaims.store.file.snapshot_table import SnapshotClaims

pytestmark = pytest.mark.integration


def _changed(reg: Registry) -> int:
    """Entries the parent holds beyond the lines of its snapshot bytes (set or removed)."""
    table = reg.store._state.claims  # type: ignore[attr-defined]
    assert isinstance(table, SnapshotClaims)
    return len(table._claims) + len(table._gone)


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.setattr(rest, "FORK_MIN", 0)
    monkeypatch.setattr(fstore, "CHECKPOINT_MIN_TAIL", 3000)
    monkeypatch.delenv("FLEETCLAIMS_NO_FORK", raising=False)
    forks: list[int] = []
    real = rest.fork_worker

    def fork(work: Any, **kw: Any) -> int:
        pid = real(work, **kw)
        forks.append(pid)
        return pid

    monkeypatch.setattr(rest, "fork_worker", fork)
    return forks


@pytest.mark.slow
def test_the_parent_rebases_on_the_files_its_children_wrote(
        tmp_path: Path, forking: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "ADOPT_MIN", 100)  # (2048 by default: scaled to this test)
    reg = Registry(tmp_path / "reg", durability="process")
    reg.claim("first", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    most = 0
    for i in range(900):
        task = f"t{i}"
        token = reg.claim(task, owner="a", ttl=600).token
        assert token is not None
        if i % 3:
            reg.complete(task, token=token)
        elif i % 2:
            reg.release(task, token=token)
        most = max(most, _changed(reg))
        if i % 50 == 49:
            time.sleep(0.05)  # (a moment for the child: the bound must not need a fast one)
    assert len([p for p in forking if p > 0]) >= 5, forking
    # 900 tasks changed; the parent held a few checkpoints' worth at most (~130 measured).
    assert most < 300, most
    store = reg.store
    store._reap(block=True)  # type: ignore[attr-defined]
    fresh = Registry(tmp_path / "reg")
    assert claims_view(store.read()) == claims_view(fresh.store.read())
    for i in (0, 1, 2, 899):
        assert reg.get(f"t{i}") == fresh.get(f"t{i}")
    fresh.close()
    reg.close()


@pytest.mark.slow
def test_few_changes_are_kept_without_rereading_the_file(
        tmp_path: Path, forking: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ADOPT_MIN changed entries the parent does not read back what its child wrote
    (that read stalled its operations at 100,000 claims): a writer cycling over a few tasks
    keeps them beside its old base, checkpoint after checkpoint, and stays right."""
    reads: list[int] = []
    real = forked._read

    def counted(job: Any, fd: int) -> None:
        reads.append(fd)
        real(job, fd)

    monkeypatch.setattr(forked, "_read", counted)
    reg = Registry(tmp_path / "reg", durability="process")
    reg.claim("first", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    for i in range(600):
        task = f"t{i % 20}"
        reg.release(task, token=reg.claim(task, owner="a", ttl=600).token)
        if i % 50 == 49:
            time.sleep(0.05)
    assert len([p for p in forking if p > 0]) >= 3, forking
    assert reads == [] and _changed(reg) <= 21
    reg.store._reap(block=True)  # type: ignore[attr-defined]
    fresh = Registry(tmp_path / "reg")
    assert claims_view(reg.store.read()) == claims_view(fresh.store.read())
    fresh.close()
    reg.close()


def test_no_fork_when_turned_off_or_unsafe(tmp_path: Path, forking: list[int],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCLAIMS_NO_FORK", "1")
    assert rest.fork_safe() == "FLEETCLAIMS_NO_FORK is set"
    assert rest.fork_worker(lambda: True) == 0
    reg = Registry(tmp_path / "reg", durability="process")
    reg.claim("first", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    for i in range(60):
        token = reg.claim(f"t{i % 4}", owner="a").token
        assert token is not None
        reg.release(f"t{i % 4}", token=token)
    assert all(pid == 0 for pid in forking)
    assert reg.store._snap_offset > 0  # type: ignore[attr-defined]  # (made in process)
    reg.close()
    monkeypatch.delenv("FLEETCLAIMS_NO_FORK")
    # (a thread close() joined may still be leaving the kernel on a loaded machine: CI saw
    # one outlive a join; foreign_threads waits 50 ms for such a thread, this waits longer)
    deadline = time.monotonic() + 5
    while rest.fork_safe() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rest.fork_safe() is None
    # A thread Python's threading module does not know of (as a native library's would be).
    stop = threading.Event()
    started = threading.Event()

    def native() -> None:
        started.set()
        stop.wait(10)

    _thread.start_new_thread(native, ())
    try:
        started.wait(5)
        assert rest.fork_safe() == "native threads unknown to Python"
        assert rest.fork_worker(lambda: True) == 0
    finally:
        stop.set()
        deadline = time.monotonic() + 10
        while rest.fork_safe() is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # (until that thread is gone: the next test forks)


def test_the_child_runs_none_of_the_hosts_handlers(tmp_path: Path, forking: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    marks = tmp_path / "marks"
    parent = os.getpid()

    def mark(what: str) -> None:
        with open(marks, "a") as f:
            f.write(f"{what} {os.getpid()}\n")

    atexit.register(mark, "atexit")
    old = signal.signal(signal.SIGTERM, lambda *_: mark("sigterm"))

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            mark("log")

    handler = Handler()
    logger = logging.getLogger("fleetclaims")
    was = logger.level, logger.disabled  # (other tests may have quietened it)
    logger.setLevel(logging.WARNING)
    logger.disabled = False
    logger.addHandler(handler)
    real_write = snapshot.write_snapshot

    def failing(*args: Any, **kw: Any) -> bool:
        if os.getpid() != parent:
            raise OSError(28, "No space left on device")
        return real_write(*args, **kw)

    monkeypatch.setattr(fstore, "write_snapshot", failing)
    try:
        # A child that sends itself the host's signal dies of it (default action).
        def suicide() -> bool:
            os.kill(os.getpid(), signal.SIGTERM)
            return True

        pid = rest.fork_worker(suicide)
        assert pid > 0 and rest.reaped(pid, block=True) is False
        reg = Registry(tmp_path / "reg", durability="process")
        reg.claim("first", owner="a")
        reg.store.checkpoint()  # type: ignore[attr-defined]
        for i in range(30):
            token = reg.claim(f"t{i % 4}", owner="a").token
            assert token is not None
            reg.release(f"t{i % 4}", token=token)
        assert any(p > 0 for p in forking)
        reg.store._reap(block=True)  # type: ignore[attr-defined]
        reg.close()
    finally:
        atexit.unregister(mark)
        signal.signal(signal.SIGTERM, old)
        logger.removeHandler(handler)
        logger.setLevel(was[0])
        logger.disabled = was[1]
    lines = marks.read_text().splitlines() if marks.exists() else []
    # The child's failure was logged by the parent, and nothing ran in a child.
    assert lines and all(line == f"log {parent}" for line in lines), lines


def test_encoding_leaves_the_table_it_was_given_as_it_was(tmp_path: Path) -> None:
    """encode_snapshot swaps a new table into the state; a thread still reading the old one
    (taken before) sees it whole: its changes and bytes untouched, every answer the same."""
    reg = Registry(tmp_path / "reg", durability="process")
    for i in range(20):
        reg.claim(f"t{i}", owner="a", ttl=600)
    reg.store.checkpoint()  # type: ignore[attr-defined]
    for i in range(5):
        token = reg.claim(f"n{i}", owner="b", ttl=600).token
        assert token is not None
        reg.complete(f"n{i}", token=token)
    state = reg.store._state  # type: ignore[attr-defined]
    old = state.claims
    assert isinstance(old, SnapshotClaims) and old._claims
    changed, data = dict(old._claims), old._data
    before = {t: old.get(t) for t in old.tasks()}
    snapshot.encode_snapshot(state, reg.store._offset)  # type: ignore[attr-defined]
    assert state.claims is not old
    assert old._claims == changed and old._data is data
    assert {t: old.get(t) for t in old.tasks()} == before
    assert {t: state.claims.get(t) for t in state.claims.tasks()} == before
    reg.close()
