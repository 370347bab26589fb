"""One checkpoint for all writers (#21): a writer whose checkpoint is due counts its tail from
a claims.json another writer wrote meanwhile (forked.checkpoint_owed / others_checkpointed)
instead of encoding and renaming the same snapshot again.

Oracles: the snapshot writes counted against the windows of journal written; the whole journal
one chain that verifies and replays to the registry's state (open_one_chain); and for each
guard (another journal generation, a header that is not one, a snapshot ahead of the handle,
a table holding many changes) that the handle still checkpoints itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
from fc_support import file_store, open_one_chain

from fleetclaims import ClaimConflict, Registry
from fleetclaims.store.file import forked, snapshot
from fleetclaims.store.file import store as fstore

pytestmark = pytest.mark.integration

BOUND = 4000  # CHECKPOINT_MIN_TAIL here; the divisor is raised so that it is the bound


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A 4000-byte checkpoint bound; returns the file where each snapshot write that landed
    leaves a line (forked workers inherit the patch and append to it too)."""
    monkeypatch.setattr(fstore, "CHECKPOINT_MIN_TAIL", BOUND)
    monkeypatch.setattr(fstore, "CHECKPOINT_DIVISOR", 10**6)
    log = tmp_path / "writes.log"
    log.touch()
    real = snapshot.write_snapshot

    def counted(*args: Any, **kw: Any) -> bool:
        done = real(*args, **kw)
        if done:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return done

    monkeypatch.setattr(fstore, "write_snapshot", counted)
    return log


def _writes(log: Path) -> int:
    return len(log.read_text().split())


def _cycle(reg: Registry, task: str, owner: str) -> None:
    token = reg.claim(task, owner=owner, ttl=60).token
    assert token is not None
    reg.release(task, token=token)


def _caught_up_pair(d: Path) -> tuple[Registry, Registry]:
    """Two handles; ``a`` checkpointed after both wrote, ``b`` read up to the same head."""
    a, b = Registry(d, durability="process"), Registry(d, durability="process")
    for i in range(6):
        _cycle(a, f"a{i % 2}", "a")
        _cycle(b, f"b{i % 2}", "b")
    file_store(a).checkpoint()
    file_store(b).read()
    return a, b


def test_a_checkpoint_of_another_writer_stands_in(tmp_path: Path, small_bound: Path) -> None:
    a, b = _caught_up_pair(tmp_path / "reg")
    sb = file_store(b)
    seq, offset = snapshot.snapshot_position(sb.snapshot_path)
    assert seq == sb.read().seq and offset == sb._offset
    assert sb._snap_offset < offset
    assert forked.others_checkpointed(sb, BOUND)
    assert sb._snap_offset == offset
    assert not forked.others_checkpointed(sb, BOUND)  # (nothing newer now)
    a.close()
    b.close()


def test_guards_keep_the_handles_own_checkpoint(tmp_path: Path, small_bound: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _caught_up_pair(tmp_path / "reg")
    sb = file_store(b)
    before = sb._snap_offset
    # A table holding many changes is re-based only by its own checkpoint.
    monkeypatch.setattr(forked, "ADOPT_MIN", 0)
    assert not forked.others_checkpointed(sb, BOUND)
    monkeypatch.setattr(forked, "ADOPT_MIN", 2048)
    # Another journal generation (a rotation, doctor --fix): its offsets are not ours.
    real_generation = sb._generation
    sb._generation = real_generation - 1
    assert not forked.others_checkpointed(sb, BOUND)
    sb._generation = real_generation
    # A snapshot ahead of what this handle read.
    _cycle(a, "a0", "a")
    file_store(a).checkpoint()
    assert not forked.others_checkpointed(sb, BOUND)
    # Our tail counted from it would still exceed the bound.
    _cycle(a, "a1", "a")
    sb.read()
    assert not forked.others_checkpointed(sb, 1)
    # A header that is not one.
    raw = sb.snapshot_path.read_bytes()
    sb.snapshot_path.write_bytes(b'{"format":4,"seq":x,"offset":-3,' + raw[40:])
    assert snapshot.snapshot_position(sb.snapshot_path) == (-1, -1)
    assert not forked.others_checkpointed(sb, BOUND)
    sb.snapshot_path.unlink()
    assert snapshot.snapshot_position(sb.snapshot_path) == (-1, -1)
    assert not forked.others_checkpointed(sb, BOUND)
    assert sb._snap_offset == before
    a.close()
    b.close()


def test_two_writers_share_checkpoints(tmp_path: Path, small_bound: Path) -> None:
    """Two handles taking turns: about one snapshot write per window of journal, not one per
    handle; the registry verifies and replays to the same state, claims.json at the head."""
    d = tmp_path / "reg"
    a, b = Registry(d, durability="process"), Registry(d, durability="process")
    for i in range(150):
        _cycle(a, f"a{i % 3}", "a")
        _cycle(b, f"b{i % 3}", "b")
    windows = file_store(a)._offset // BOUND
    assert windows >= 20
    assert _writes(small_bound) <= windows + 3, (_writes(small_bound), windows)
    a.close()
    b.close()
    reg = open_one_chain(d)
    assert snapshot.snapshot_seq(d / "claims.json") == reg.store.read().seq
    reg.close()


def _worker(d: str, w: int, n: int) -> None:
    reg = Registry(d, durability="process")
    for i in range(n):
        _cycle(reg, f"w{w}-{i % 3}", f"worker-{w}")
        if i % 7 == 0:  # and a task everyone takes turns on
            with contextlib.suppress(ClaimConflict):  # (held by another worker now)
                _cycle(reg, "shared", f"worker-{w}")
    reg.close()


@pytest.mark.slow
def test_processes_share_checkpoints(tmp_path: Path, small_bound: Path) -> None:
    """Four processes cycling at once, a checkpoint due every 4000 bytes: fewer snapshot writes
    than one per process per window, and the journal is one chain that replays to the state."""
    d = tmp_path / "reg"
    Registry(d, durability="process").close()
    ctx = mp.get_context("fork")  # (the workers inherit the small bound and the counting)
    procs = [ctx.Process(target=_worker, args=(str(d), w, 200)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    reg = open_one_chain(d)
    windows = file_store(reg)._offset // BOUND
    writes = _writes(small_bound)
    assert windows >= 40
    # Each process would write one per window (4 x windows); shared, far fewer. (Closing
    # writes one each.)
    assert writes < 2 * windows + 4, (writes, windows)
    assert snapshot.snapshot_seq(d / "claims.json") == reg.store.read().seq
    reg.close()
