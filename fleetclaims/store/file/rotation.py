"""Rotating the active journal into a sealed segment (see segments.py for the layout).

Called by a writer under the registry lock, caught up to the journal's head, when the active
journal has passed ``segments.SEGMENT_BYTES``. The bulk of its lines is first sealed by a helper
process outside the lock (preseal.py); the rotation then seals the lines appended since. Steps
and their crash points:

- ``segment.after_compress``: the gzip temp file is durable, not renamed (the next rotation
  writes it again; nothing refers to it);
- ``segment.after_seal``: the segment is in place, ``audit.jsonl`` still holds its lines (readers
  skip them, the next rotation seals only what follows);
- ``segment.after_snapshot``: claims.json is at the sealed head with offset 0, which fits both
  the old active journal (lines up to its seq skipped) and an empty one;
- ``segment.after_switch``: an empty ``audit.jsonl`` is in place, the generation bumped.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from . import fsutil, preseal, segments
from .faults import crash_point, osc
from .journal import seq_of
from .reader import find_offset
from .snapshot import encode_snapshot, write_snapshot

if TYPE_CHECKING:
    from .catchup import CatchUp

__all__ = ["rotate"]


def rotate(store: CatchUp) -> None:
    """Seal the active journal of ``store`` (locked, at the head). Raises OSError."""
    state = store._state
    assert state is not None and store._fd >= 0
    fd, end = store._fd, store._offset
    sync = bool(getattr(store, "sync", True))
    sealed = segments.sealed(store.directory)
    last = sealed[-1].last if sealed else 0
    first = seq_of(os.pread(fd, 64, 0))
    if first is None or state.seq <= last:
        return
    start = 0
    if first <= last:  # a helper (or a rotation cut short) sealed the lines up to ``last``
        start = find_offset(fd, last, 0, end, first - 1)
        first = last + 1
    elif end < 2 * segments.SEGMENT_BYTES and preseal.pending(
            store.directory, os.fstat(fd).st_ino, 0, end, first, state.seq):
        return  # a helper process compresses them, outside the lock
    data = os.pread(fd, end - start, start)
    if len(data) != end - start:
        raise OSError(5, "short read of the journal to seal")
    segments.seal(store.directory, data, first, state.seq, sync=sync)
    snap = encode_snapshot(state, 0)
    write_snapshot(store.directory, store.snapshot_path, snap, sync=sync)
    crash_point("segment.after_snapshot")
    _switch(store, sync)
    store._snap_offset = 0
    store._snap_size = len(snap)
    crash_point("segment.after_switch")


def _switch(store: CatchUp, sync: bool) -> None:
    """Put an empty active journal in place and move this handle onto it."""
    path = store.journal_path
    tmp = path.with_name(f".{path.name}.next")
    new = fsutil.open_file(tmp, os.O_RDWR | os.O_TRUNC, create=True)
    try:
        if sync:
            osc.fsync(new)
        osc.replace(str(tmp), str(path))
    except BaseException:
        os.close(new)
        raise
    store._lock.bump_generation()  # every other handle reloads (the claims.json at offset 0)
    if sync:
        fsutil.fsync_dir(store.directory)
    with contextlib.suppress(OSError):
        os.close(store._fd)
    store._fd = new
    store._generation = store._lock.generation()
    store._offset = 0
    store._alloc = 0
    store._reader = None
    store._padding_checked = True
    at_rest = getattr(store, "_rest", None)
    if at_rest is not None:
        at_rest.padded = False
