"""Rotating the active journal into a sealed segment (see segments.py for the layout).

Called by a writer under the registry lock, caught up to the journal's head, when the active
journal has passed ``segments.SEGMENT_BYTES``. The bulk of its lines is first sealed by a helper
process outside the lock (preseal.py); the rotation then seals the lines appended since, up to
the head, seq S. The snapshot at S (claims.json with offset 0, ~40 MB at 100,000 claims) is not
written under the lock: a child forked there, holding the state at S copy-on-write, writes it
beside claims.json (``claims.json.rot-S-PID``) while the writer goes on. A later operation of
the same writer, under the lock, once the child is done, finishes the rotation: the side file
renamed over claims.json, then a new ``audit.jsonl`` holding the lines appended after S (a
few, copied) put in place. Where no child can be forked (rest.fork_safe) the snapshot is
written under the lock and the switch follows at once, as before. Steps and crash points:

- ``segment.after_compress``: the gzip temp file is durable, not renamed (the next rotation
  writes it again; nothing refers to it);
- ``segment.after_seal``: the segment is in place, ``audit.jsonl`` still holds its lines (readers
  skip them, the next rotation seals only what follows); a side file being written is left to
  its child and removed by a later rotation once its writer is gone;
- ``segment.after_snapshot``: claims.json is at the sealed head with offset 0, which fits both
  the old active journal (lines up to its seq skipped) and the new one;
- ``segment.after_switch``: the new ``audit.jsonl`` (the lines after S) is in place, the
  generation bumped. Then the anchor and claims.lock's fence mark are moved to S (sealed, so
  durable): a rotation's snapshot is a checkpoint, and a close or a busy writer whose
  checkpoints are all rotations must leave them at the head too.

Unlocked checkpoints of other processes, taken of the old journal, are refused once the
generation moved (snapshot.write_snapshot ``unless``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...system import background_priority, pid_exists
from . import anchor, fsutil, preseal, rest, segments
from .faults import FAULTS, crash_point, osc
from .journal import seq_of
from .lock import swapping
from .reader import find_offset
from .snapshot import encode_snapshot, snapshot_seq, write_snapshot

if TYPE_CHECKING:
    import queue

    from ...core.state import State
    from .catchup import CatchUp

__all__ = ["rotate", "settle"]

SIDE_PREFIX = "claims.json.rot-"
# Lines appended since a helper sealed the bulk: sealed here, under the lock, below this many
# bytes (~5 ms of gzip); above, a second helper seals them (a 64 MiB bulk takes the helper
# seconds, and the lines written meanwhile are megabytes), once: what follows it is sealed
# here (a second helper takes ~0.2 s, so another round would leave as much again).
RESEAL_MIN = 256 << 10
# Seconds a rotation (holding the registry lock) waits for an unlocked checkpoint's rename
# (lock.swapping: milliseconds) before leaving its switch for later.
SWITCH_WAIT = 2.0


@dataclass
class _Pending:
    """A rotation sealed up to ``seq`` (journal bytes [0, ``base``)) whose snapshot a forked
    child writes to ``side``."""

    owner: int
    pid: int
    seq: int
    base: int
    side: Path
    journal: tuple[int, int]  # (inode, generation) of the journal sealed
    head: anchor.Sealed  # the sealed head, mirrored once the rotation is finished
    # Lines ``first``..``seq`` the child packs to ``packed`` for us to install (None: sealed
    # here already, before forking).
    first: int = 0
    packed: Path | None = None


_PENDING: weakref.WeakKeyDictionary[CatchUp, _Pending] = weakref.WeakKeyDictionary()


def rotate(store: CatchUp) -> None:
    """Seal the active journal of ``store`` (locked, at the head). Raises OSError."""
    state = store._state
    assert state is not None and store._fd >= 0
    pending = _PENDING.get(store)
    if pending is not None and pending.owner == os.getpid():
        # (a threshold's worth of lines written since it sealed: the child is waited for, so
        # the active journal and the lines carried over stay bounded however slow it is)
        block = store._offset - pending.base >= segments.SEGMENT_BYTES
        if _finish(store, pending, block=block) is not None:
            return  # still written by the child, or finished: the new journal is short
    elif pending is not None:
        del _PENDING[store]
    fd, end = store._fd, store._offset
    if store._lock.replaced():
        return  # (the folder was moved: its files are not at the paths a rotation writes)
    sync = bool(getattr(store, "sync", True))
    sealed = segments.sealed(store.directory)
    last = sealed[-1].last if sealed else 0
    first = seq_of(os.pread(fd, 64, 0))
    if first is None or state.seq <= last:
        return
    if end < 2 * segments.SEGMENT_BYTES and _others_pending(store):
        return  # another writer's child writes the snapshot of its rotation
    start = 0
    rounds = 0  # segments helpers sealed of this journal already
    if first <= last:  # a helper (or a rotation cut short) sealed the lines up to ``last``
        rounds = sum(1 for seg in sealed if seg.last >= first)
        start = find_offset(fd, last, 0, end, first - 1)
        first = last + 1
    if (start == 0 or (rounds < 2 and end - start > RESEAL_MIN)) and (
            end < 2 * segments.SEGMENT_BYTES and preseal.pending(
                store.directory, os.fstat(fd).st_ino, start, end, first, state.seq,
                store._lock.after.append)):
        return  # a helper process compresses them, outside the lock
    side = store.directory / f"{SIDE_PREFIX}{state.seq}-{os.getpid()}"
    journal = (os.fstat(fd).st_ino, store._generation)
    if FAULTS.crash_hook is None:
        # The lines left are packed (gzip: ~5 ms for 256 KiB) by the child that writes the
        # snapshot, and installed by us when we finish, under the lock, before the switch.
        tmp = segments.child_pack_path(store.directory, first, state.seq, os.getpid())
        child = rest.fork_worker(
            lambda: _pack_and_write_side(store, (start, end, first), tmp, side, sync),
            faults_ok=True)
        if child:
            _PENDING[store] = _Pending(os.getpid(), child, state.seq, end, side, journal,
                                       _head(state), first, tmp)
            return
    # (Crash points armed by a test fire in this process: sealed here, then the side file.)
    data = os.pread(fd, end - start, start)
    if len(data) != end - start:
        raise OSError(5, "short read of the journal to seal")
    segments.seal(store.directory, data, first, state.seq, sync=sync)
    del data
    child = rest.fork_worker(lambda: _write_side(store, side, sync), faults_ok=True)
    if child:
        _PENDING[store] = _Pending(os.getpid(), child, state.seq, end, side, journal,
                                   _head(state))
        return
    snap = encode_snapshot(state, 0)  # (no child: written here, under the lock)
    with swapping(store.directory, SWITCH_WAIT) as held:
        if not held:  # (sealed, not switched: the next rotation finishes it)
            return
        write_snapshot(store.directory, store.snapshot_path, snap, sync=sync)
        crash_point("segment.after_snapshot")
        _switch(store, sync, b"")
    store._snap_offset = 0
    store._snap_size = len(snap)
    crash_point("segment.after_switch")
    anchor.mirror(store.directory, store._lock, state)


def _head(state: State) -> anchor.Sealed:
    return anchor.Sealed(state.origin, state.seq, state.head, state.fence)


def _pack_and_write_side(store: CatchUp, lines: tuple[int, int, int], tmp: Path, side: Path,
                         sync: bool) -> bool:
    """In the forked child: pack the journal's bytes [start, end) (lines ``first`` up to the
    sealed head) to ``tmp`` for the parent to install, then write the side snapshot."""
    start, end, first = lines
    assert store._state is not None
    data = os.pread(store._fd, end - start, start)
    if len(data) != end - start:
        return False
    segments.pack_for_parent(store.directory, data, first, store._state.seq, sync=sync,
                             tmp=tmp)
    del data
    return _write_side(store, side, sync)


def _write_side(store: CatchUp, side: Path, sync: bool) -> bool:
    """In the forked child: the snapshot at the sealed head, offset 0, to ``side``."""
    assert store._state is not None
    snap = encode_snapshot(store._state, 0)
    write_snapshot(store.directory, side, snap, sync=sync)
    return True


def _install_packed(store: CatchUp, pending: _Pending, done: bool) -> None:
    """Put the segment the child packed in place (locked), unless it failed, the journal was
    replaced, or another writer sealed those lines meanwhile (then _finish starts again)."""
    assert pending.packed is not None
    sealed = segments.sealed(store.directory)
    packed = segments.packed_by_child(store.directory, pending.first, pending.seq,
                                      pending.packed) if done else None
    if (packed is not None and pending.journal == (os.fstat(store._fd).st_ino,
                                                   store._generation)
            and (sealed[-1].last if sealed else 0) == pending.first - 1):
        segments.install(packed, sync=bool(getattr(store, "sync", True)))
    segments.discard_child_pack(pending.packed)


def settle(store: CatchUp, *, block: bool) -> None:
    """Finish this handle's rotation if its child is done (waiting for it when ``block``),
    locked, at the head: a writer leaving the files at rest (close; the idle keeper's catch-up
    finishes one whose child is done), so that ``zcat segments/*; cat audit.jsonl`` is one
    chain."""
    pending = _PENDING.get(store)
    if pending is not None and pending.owner == os.getpid():
        _finish(store, pending, block=block)


def _finish(store: CatchUp, pending: _Pending, *, block: bool = False) -> bool | None:
    """Finish ``pending`` once its child is done: False while the child still writes, True
    once finished, None when it failed or was overtaken (the caller starts again)."""
    done = rest.reaped(pending.pid, block=block)
    if done is None:
        return False
    del _PENDING[store]
    if pending.packed is not None:
        _install_packed(store, pending, bool(done))
    sealed = segments.sealed(store.directory)
    end = store._offset
    tail = b""
    if done and end >= pending.base and pending.journal == (
            os.fstat(store._fd).st_ino, store._generation):
        tail = os.pread(store._fd, end - pending.base, pending.base)
    if not done or not sealed or sealed[-1].last != pending.seq or (
            pending.journal != (os.fstat(store._fd).st_ino, store._generation)
            or len(tail) != end - pending.base
            or (tail and seq_of(tail) != pending.seq + 1)
            or snapshot_seq(pending.side) != pending.seq or store._lock.replaced()):
        # (failed, overtaken by another writer's rotation, the journal replaced, or the
        # folder moved: nothing is renamed by path into what is now there)
        with contextlib.suppress(OSError):
            os.unlink(pending.side)
        return None
    sync = bool(getattr(store, "sync", True))
    size = os.path.getsize(pending.side)
    with swapping(store.directory, SWITCH_WAIT) as held:
        if not held:  # (sealed, not switched: the next rotation starts again)
            with contextlib.suppress(OSError):
                os.unlink(pending.side)
            return None
        # The replaced claims.json (~40 MB at 100,000 claims) is freed when its last
        # descriptor closes (~17 ms on ext4): closed off the lock.
        old = fsutil.replace_over(pending.side, store.snapshot_path)
        if old >= 0:
            _close_later(old)
        if sync:
            fsutil.fsync_dir(store.directory)
        crash_point("segment.after_snapshot")
        _switch(store, sync, tail)
    store._snap_offset = 0
    store._snap_size = size
    crash_point("segment.after_switch")
    anchor.mirror(store.directory, store._lock, pending.head)
    return True


def _others_pending(store: CatchUp) -> bool:
    """Whether another handle's rotation child (of a live process, or another handle of
    this one) writes a side file; the side files nobody waits for any more are removed."""
    found = False
    ours = {str(p.side) for s, p in list(_PENDING.items()) if s is not store}
    with contextlib.suppress(OSError):
        for entry in os.scandir(store.directory):
            if not entry.name.startswith(SIDE_PREFIX):
                continue
            pid = entry.name.rsplit("-", 1)[-1]
            mine = pid.isdigit() and int(pid) == os.getpid()
            if (entry.path in ours if mine else pid.isdigit() and pid_exists(int(pid))):
                found = True
            elif not (mine and (pending := _PENDING.get(store)) and str(pending.side)
                      == entry.path):
                _unlink_later(entry.path)
    return found


def _switch(store: CatchUp, sync: bool, tail: bytes) -> None:
    """Put a new active journal holding ``tail`` (the lines after the sealed head) in place
    and move this handle onto it."""
    path = store.journal_path
    tmp = path.with_name(f".{path.name}.next")
    new = fsutil.open_file(tmp, os.O_RDWR | os.O_TRUNC, create=True)
    try:
        if tail:
            written = osc.write(new, tail)
            if written != len(tail):
                raise OSError(5, "short write of the new active journal")
        if sync:
            osc.fsync(new)
        osc.replace(str(tmp), str(path))
    except BaseException:
        os.close(new)
        raise
    store._lock.bump_generation()  # every other handle reloads (the claims.json at offset 0)
    if sync:
        fsutil.fsync_dir(store.directory)
    _close_later(store._fd)  # (the old journal's blocks are freed then)
    store._fd = new
    store._generation = store._lock.generation()
    store._offset = len(tail)
    store._alloc = len(tail)
    store._reader = None
    store._padding_checked = True
    at_rest = getattr(store, "_rest", None)
    if at_rest is not None:
        at_rest.padded = False


def _unlink_later(path: str) -> None:
    """Remove ``path`` (a side file, ~40 MB at 100,000 claims) now, its blocks freed by the
    last close, off the lock (see _close_later)."""
    try:
        fd = os.open(path, os.O_RDONLY | fsutil.O_CLOEXEC | fsutil.O_NOFOLLOW)
    except OSError:
        fd = -1
    with contextlib.suppress(OSError):
        os.unlink(path)
    if fd >= 0:
        _close_later(fd)


class _Closer:
    """One background thread per process that closes descriptors handed to it: the last
    close of a replaced file frees its blocks (milliseconds for tens of MB) and the caller
    holds the lock. One thread, started once: starting a thread for each close made the
    caller wait up to ~10 ms for it to be scheduled on a busy machine."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[int] | None = None  # (made on first use: see below)
        self.pid = 0

    def close_later(self, fd: int) -> None:
        fds = self.queue
        if fds is None or self.pid != os.getpid():  # (first use, or a forked child)
            import queue  # (here: a cold command that never replaces a file saves ~3 ms)

            fds = self.queue = queue.SimpleQueue()
            try:
                threading.Thread(target=self._run, args=(fds,), daemon=True,
                                 name="fleetclaims-close").start()
            except RuntimeError:  # (no new threads: interpreter shutdown)
                with contextlib.suppress(OSError):
                    os.close(fd)
                return
            self.pid = os.getpid()
        fds.put(fd)

    @staticmethod
    def _run(fds: queue.SimpleQueue[int]) -> None:
        background_priority(19)  # (this thread only)
        while True:
            fd = fds.get()
            with contextlib.suppress(OSError):
                os.close(fd)


_close_later = _Closer().close_later
