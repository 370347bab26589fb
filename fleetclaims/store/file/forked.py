"""A checkpoint written by a forked child, and the parent re-basing on the file it wrote.

The child (``rest.fork_worker``) encodes the snapshot from its copy-on-write image of the state
and writes claims.json; it reports the file's size and checksum through a pipe. Once it is
reaped, the parent reads that file (on a helper thread: ~40 MB at 100,000 claims) and, at its
next checkpoint decision, swaps its claim table for one over those bytes that keeps only the
entries changed since the fork (``SnapshotClaims.adopted``). Without this the parent's changed
and ended claims would pile up in memory until it encoded a checkpoint itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.errors import FleetclaimsError
from ...core.ports import ClaimView
from ...core.state import ClaimTable
from ...system import background_priority, current_pid
from . import fsutil, rest
from .snapshot import SnapshotClaims, adoptable, snapshot_position
from .snapshot_lines import Section

if TYPE_CHECKING:
    from .store import FileStore

__all__ = ["Job", "adopt", "checkpoint_owed", "collect", "fork", "moved_since",
           "others_checkpointed", "poll", "report"]

_REPORT_MAX = 4096
# Re-basing reads the whole file the child wrote (~40 MB at 100,000 claims), and the fresh
# memory it fills stalled the writer's operations meanwhile by up to ~16 ms; done only once the
# changes held beside the old base (each entry a decoded claim, ~1 KB) are this many, so a
# writer cycling over a few tasks never pays it, and one touching many tasks pays it rarely.
ADOPT_MIN = 2048
# How far beyond the checkpoint bound a writer may wait for another writer's checkpoint
# (checkpoint_owed): a small snapshot lands within ~50 KiB of journal at 8 processes.
SLACK_MAX = 256 * 1024


@dataclass
class Job:
    """One forked checkpoint: the pipe its child reports on, the table it copied and what
    that table held beyond its lines then (``marks``), and, once reaped, the file's bytes."""

    seq: int
    table: ClaimView
    marks: tuple[dict[str, Any], frozenset[str]] | None
    rfd: int = -1
    wfd: int = -1
    reader: threading.Thread | None = None
    found: list[tuple[bytes, Section, Section, list[Any]]] = field(default_factory=list)

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.rfd = self.wfd = -1


def _marks(table: Any) -> tuple[dict[str, Any], frozenset[str]] | None:
    if isinstance(table, SnapshotClaims):
        return None if table._raw else table.marks()
    if type(table) is ClaimTable and not table._raw:
        return dict(table._claims), frozenset()
    return None


def fork(store: FileStore, work: Callable[[], bool]) -> int:
    """Fork a child running ``work`` (the checkpoint of ``store``), its job kept on the
    store for the child to report on; the child's pid, or 0 (then no job)."""
    store._fork_job = None
    state = store._state
    if state is None or current_pid() != os.getpid() or rest.fork_safe() is not None:
        return 0
    try:
        rfd, wfd = os.pipe()
    except OSError:
        return 0
    os.set_blocking(rfd, False)  # (another child forked meanwhile may hold the write end)
    job = store._fork_job = Job(state.seq, state.claims, _marks(state.claims), rfd, wfd)
    pid = rest.fork_worker(work)
    if not pid:
        job.close()
        store._fork_job = None
    return pid


def report(job: Job | None, data: bytes | None, failure: OSError | None) -> bool:
    """In the child: tell the parent what was written (size and checksum) or why not;
    whether it succeeded."""
    error = None if failure is None else str(failure)
    if job is None or job.wfd < 0:
        return error is None
    if data is not None:
        text = f"ok {len(data)} {data[-67:-3].decode()}"
    else:  # (none written and no error: a newer snapshot was there already)
        text = "no " + error if error else "skip"
    with contextlib.suppress(OSError):
        os.write(job.wfd, text.encode()[:_REPORT_MAX])
    return error is None


def collect(store: FileStore, job: Job | None, done: bool) -> bool:
    """In the parent, the child reaped (``done``: it exited 0): read its report; when it
    wrote claims.json, start reading that file for ``adopt`` (the file is opened and
    compared now, so a newer snapshot written meanwhile is not mistaken for it). False (the
    child's error logged) when it failed."""
    error = "killed, or it failed" if job is None else _collect(store, job)
    if done and error is None:
        return True
    if error is None or error.startswith("the checkpoint child said nothing"):
        error = "it was killed or exited early"
    import logging  # (rare)

    logging.getLogger("fleetclaims").warning(
        "fleetclaims: forked checkpoint of %s failed: %s", store.location, error)
    return False


def moved_since(store: FileStore) -> Callable[[], bool]:
    """Whether the journal was replaced (a rotation) after now, or the folder removed, moved
    or replaced (the path no longer leads to our claims.lock): then a snapshot taken of it
    must not land (its offset is of the old journal; the folder at the path is another
    registry's, or none)."""
    generation = store._generation

    def moved() -> bool:
        try:
            return store._lock.generation() != generation or store._lock.replaced()
        except OSError:
            return False

    return moved


def _collect(store: FileStore, job: Job) -> str | None:
    if job.wfd >= 0:
        os.close(job.wfd)
        job.wfd = -1
    try:
        text = os.read(job.rfd, _REPORT_MAX).decode(errors="replace")
    except OSError:
        text = ""
    job.close()
    if text == "skip":
        return None
    if not text.startswith("ok "):
        return text[3:] if text.startswith("no ") else "the checkpoint child said nothing"
    if job.marks is None or len(job.marks[0]) + len(job.marks[1]) < ADOPT_MIN:
        return None
    _, size, digest = text.split(" ", 2)
    try:
        fd = fsutil.open_file(store.snapshot_path, os.O_RDONLY)
    except (OSError, FleetclaimsError):
        return None
    try:
        ok = (os.fstat(fd).st_size == int(size)
              and os.pread(fd, 67, int(size) - 67)[:64] == digest.encode())
    except OSError:
        ok = False
    if not ok:
        os.close(fd)
        return None
    job.reader = threading.Thread(target=_read, args=(job, fd), daemon=True,
                                  name="fleetclaims-adopt")
    try:
        job.reader.start()
    except RuntimeError:
        job.reader = None
        os.close(fd)
    return None


def _read(job: Job, fd: int) -> None:
    background_priority(19)  # (this thread only: the operations of its process go first)
    try:
        data = fsutil.read_all(fd)
    except OSError:
        return
    finally:
        os.close(fd)
    found = adoptable(data, job.seq)
    if found is not None:
        job.found.append((data, *found))


def poll(store: FileStore) -> None:
    """After each operation while a job is on ``store``: reap its child (no wait) and adopt
    the file once read, so the changes made meanwhile leave memory a checkpoint earlier."""
    if store._forked[0] and not store._reap(block=False):
        return
    job = store._fork_job
    if job is not None and adopt(store, job):
        store._fork_job = None


def adopt(store: FileStore, job: Job, *, wait: bool = False) -> bool:
    """Swap ``store``'s claim table for one over the file the child wrote, keeping the
    changes made since the fork; False while the file is still being read."""
    reader = job.reader
    if reader is not None:
        if reader.is_alive() and not wait:
            return False
        reader.join()
    state = store._state
    if (job.found and job.marks is not None and state is not None
            and state.claims is job.table and state.seq >= job.seq):
        data, live, ended, identities = job.found[0]
        table = job.table
        if not isinstance(table, SnapshotClaims):  # (a plain ClaimTable: see _marks)
            base = SnapshotClaims()
            base._claims = dict(getattr(table, "_claims", {}))
            table = base
        state.claims = table.adopted(data, live, ended, identities, job.marks)
    job.found.clear()
    job.reader = None
    return True


def checkpoint_owed(store: FileStore, tail: int, bound: int) -> bool:
    """Whether ``store``, ``tail`` bytes past its last checkpoint (more than ``bound``), owes
    one now, or another writer's checkpoint stands in for it.

    Every writer catches up on every line, so all of them cross the bound at about the same
    moment, and each wrote its own copy of the same snapshot: at 8 processes 8 encodes and
    renames per 512 KiB of journal (20 claims: ~3 ms of CPU and ~10 ms of wall time each, on
    the operation that triggered it; at full durability two fsyncs beside the others' journal
    flushes). So while others write (the last catch-up under the lock found their lines), a
    writer waits a slack of its own beyond the bound (from its pid: up to half the bound, at
    most SLACK_MAX, so a cold start replays little more), and the first one's snapshot has
    landed when the next one looks. A writer alone keeps the bound (and its checkpoints)."""
    if store._others_wrote and tail <= bound + hash((os.getpid(), store._snap_offset)) % (
            min(bound // 2, SLACK_MAX) + 1):
        return False
    return not others_checkpointed(store, bound)


def others_checkpointed(store: FileStore, bound: int) -> bool:
    """Whether claims.json, written by another writer since our last checkpoint, leaves our
    tail within ``bound``: then our offset counts from it and no checkpoint is owed yet.

    Only the header is read (seq, offset), for scheduling: nothing is loaded from it. It counts
    only for the journal we read (same generation: no rotation or replacement since), at an
    offset between our last checkpoint and our own, and not ahead of our seq. Not while our
    table holds many changed entries (ADOPT_MIN): our own checkpoint is what re-bases the
    table, so memory stays bounded as before."""
    state = store._state
    if (state is None or not isinstance(state.claims, SnapshotClaims)
            or state.claims.changed() >= ADOPT_MIN):
        return False
    seq, offset = snapshot_position(store.snapshot_path)
    if not (store._snap_offset < offset <= store._offset and 0 < seq <= state.seq
            and store._offset - offset <= bound):
        return False
    try:
        if store._lock.generation() != store._generation:
            return False
    except OSError:
        return False
    store._snap_offset = offset
    return True
