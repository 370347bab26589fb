"""Work beside the writer (#21): what keeps a writer's slowest operation short at 100,000
claims must neither stall it nor lose anything when a process dies.

- A rotation's last lines are packed by the forked child that writes the side snapshot; the
  parent installs the segment when it finishes. The writer SIGKILLed while that child is
  pending, and the child SIGKILLed mid-work: nothing acknowledged is lost, the next writer
  finishes the rotation, the whole journal is one chain that replays to the state.
- Large files are written in paced pieces, each flushed when the file is flushed at all, and a
  large snapshot is flushed even at process durability (else ext4 flushes it inside the
  rename, under the directory's lock).
- Work queued under the registry lock (starting a helper) runs after the lock is released.
- A background thread lowers its own priority only (nice is per thread on Linux).

Oracles: acknowledged fences against a fresh reader; the replay of the whole journal; counted
fdatasync calls; the lock's state seen from a second descriptor; the nice value of the main
thread.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fc_support import open_one_chain, run_python

import fleetclaims
from fleetclaims.store.file import fsutil, segments, snapshot
from fleetclaims.store.file.faults import osc
from fleetclaims.store.file.lock import RegistryLock, _try_lock, _unlock
from fleetclaims.system import background_priority

pytestmark = pytest.mark.integration

# Writes until a rotation's child is pending (the parent has forked it, nothing is sealed or
# switched yet), then: "parent" kills this process once the child is done (the pack and the
# side snapshot written, not installed); "child" kills the child and writes on, so that the
# parent finds it failed and rotates again.
WRITER = r"""
import json, os, signal, sys, time
import fleetclaims
from fleetclaims.store.file import preseal, rest, rotation, segments
segments.SEGMENT_BYTES = 6000
segments.BLOCK = 1000
preseal.ENABLED = False
reg = fleetclaims.Registry(sys.argv[1], durability="process")
store, victim = reg.store, sys.argv[2]
i = 0
def claim():
    global i
    c = reg.claim("task%d" % i, owner="w", ttl=3600)
    print(json.dumps({"task": c.task, "fence": c.fence}), flush=True)
    i += 1
while rotation._PENDING.get(store) is None:
    claim()
pending = rotation._PENDING[store]
if victim == "parent":
    while not os.path.exists(pending.side):
        time.sleep(0.01)
    time.sleep(0.3)  # (the child's exit: it has packed and written the side snapshot)
    os.kill(os.getpid(), signal.SIGKILL)
os.kill(pending.pid, signal.SIGKILL)
for _ in range(40):
    claim()
    time.sleep(0.005)
print("DONE", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # (no settle on the way out: the next writer finishes)
"""

MORE = r"""
import sys, time
import fleetclaims
from fleetclaims.store.file import preseal, segments
segments.SEGMENT_BYTES = 6000
segments.BLOCK = 1000
preseal.ENABLED = False
reg = fleetclaims.Registry(sys.argv[1], durability="process")
for i in range(60):
    reg.claim("more%d" % i, owner="m", ttl=3600)
    time.sleep(0.005)
reg.close()
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="forked rotation children: Linux")
@pytest.mark.parametrize("victim", ["parent", "child"])
def test_killed_while_a_rotation_child_is_pending(tmp_path: Path, victim: str) -> None:
    d = tmp_path / "r"
    proc = run_python(WRITER, str(d), victim, env={"FLEETCLAIMS_NO_FORK": ""})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(acks) >= 5 and ("DONE" in proc.stdout) == (victim == "child")
    reader = fleetclaims.Registry(d)
    assert reader.verify().ok
    for ack in acks:
        claim = reader.get(ack["task"])
        assert claim is not None and claim.fence == ack["fence"], ack
    reader.close()
    proc = run_python(MORE, str(d), env={"FLEETCLAIMS_NO_FORK": ""})
    assert proc.returncode == 0, proc.stderr
    sealed = segments.sealed(d)
    assert sealed and segments.gap(sealed) is None
    assert all(a.last < b.first for a, b in itertools.pairwise(sealed))
    reg = open_one_chain(d)
    for ack in acks:
        claim = reg.get(ack["task"])
        assert claim is not None and claim.fence == ack["fence"], ack
    # What a dead process left is temp files only (swept once stale), never a half segment.
    assert all(name.endswith(".tmp") for name in os.listdir(d / "segments")
               if name.startswith("."))
    reg.close()


def _note(seen: list[int]) -> None:
    seen.append(1)


def _count_fdatasync(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = osc.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(osc, "fdatasync", counted)  # (one object: every module's osc)
    return calls


def test_large_files_are_written_in_flushed_pieces(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_fdatasync(monkeypatch)
    data = os.urandom(fsutil.PACE * 3 + 1234)
    for sync, flushes in ((True, 3), (False, 0)):
        calls.clear()
        path = tmp_path / f"f{sync}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        halfway: list[int] = []
        try:
            fsutil.write_paced(fd, data, sync=sync, halfway=functools.partial(_note, halfway))
        finally:
            os.close(fd)
        assert path.read_bytes() == data and len(calls) == flushes and halfway == [1]


@pytest.mark.parametrize("size", [1000, fsutil.PACE + 1])
def test_a_large_snapshot_is_flushed_before_its_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    calls = _count_fdatasync(monkeypatch)
    target = tmp_path / "claims.json"
    target.write_bytes(b"old")
    keep = os.open(target, os.O_RDONLY)
    try:
        assert snapshot.write_snapshot(tmp_path, target, b"x" * size, sync=False)
        assert os.read(keep, 10) == b"old"  # (the replaced file, read through a descriptor)
    finally:
        os.close(keep)
    assert target.read_bytes() == b"x" * size
    assert (len(calls) > 0) == (size > fsutil.PACE)
    assert not [p for p in os.listdir(tmp_path) if p != "claims.json"]


def test_replace_over_hands_back_the_replaced_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "new", tmp_path / "old"
    src.write_bytes(b"new")
    assert fsutil.replace_over(src, dst) == -1  # nothing replaced
    src.write_bytes(b"newer")
    fd = fsutil.replace_over(src, dst)
    try:
        assert fd >= 0 and os.read(fd, 10) == b"new" and dst.read_bytes() == b"newer"
    finally:
        os.close(fd)


def test_work_queued_under_the_lock_runs_after_release(tmp_path: Path) -> None:
    lock = RegistryLock(tmp_path / "claims.lock", timeout=5)
    lock.open()
    other = os.open(tmp_path / "claims.lock", os.O_RDWR)
    seen: list[Any] = []
    try:
        with lock.held():
            lock.after.append(lambda: seen.append(("first", _try_lock(other))))
            lock.after.append(lambda: seen.append(("second", None)))
            assert not _try_lock(other) and seen == []
        assert seen == [("first", True), ("second", None)] and lock.after == []
        _unlock(other)
        lock.acquire()
        lock.release()
        assert len(seen) == 2  # (run once)
    finally:
        os.close(other)
        lock.close()


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice: Linux")
def test_a_background_thread_lowers_its_own_priority_only() -> None:
    before = os.nice(0)
    seen: list[int] = []

    def work() -> None:
        background_priority(19)
        seen.append(os.nice(0))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [19] and os.nice(0) == before


def test_the_settle_helper_encodes_without_the_registry_lock(tmp_path: Path) -> None:
    """A one-shot process leaves the at-rest checkpoint of a large registry to a helper; a
    writer arriving while the helper encodes must not wait for it (at 100,000 claims the
    helper held the lock ~0.3 s: 300 ms operations in bench/run.py's sizes cell)."""
    from fleetclaims.store.file import faults, rest

    reg = tmp_path / "reg"
    made = run_python("import fleetclaims, os, sys\n"
               "r = fleetclaims.Registry(sys.argv[1])\n"
               "for i in range(20): r.claim('t%d' % i, owner='w', ttl=3600)\n"
               "r.store.checkpoint()\n"
               "r.claim('lagging', owner='w', ttl=3600)\n"
               "os._exit(0)\n", str(reg))  # (no settle: claims.json lags one line)
    assert made.returncode == 0, made.stderr
    other = os.open(reg / "claims.lock", os.O_RDWR)
    free: list[bool] = []

    def halfway(name: str) -> None:
        if name == "snapshot.during_write":
            free.append(_try_lock(other))
            _unlock(other)

    faults.set_crash_hook(halfway)
    try:
        rest.checkpoint_lagging(str(reg))
    finally:
        faults.set_crash_hook(None)
        os.close(other)
    assert free == [True]  # the helper's snapshot was written, the lock free meanwhile
    assert json.loads((reg / "claims.json").read_bytes())["claims"]["lagging"]["owner"] == "w"
