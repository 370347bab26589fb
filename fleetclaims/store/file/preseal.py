"""Sealing a full active journal without stalling writers: the bulk is compressed by a helper
process, outside the registry lock.

When the active journal passes ``segments.SEGMENT_BYTES``, the writer that notices (under the
lock) only spawns a detached helper (``python -c``, ~2 ms) with the journal's inode and the
byte range of its lines, and goes on. The helper reads those lines (immutable: the journal is
append-only), compresses them into a temp file, then, under the registry lock, renames it into
``segments/`` unless the journal was replaced or the lines were sealed meanwhile. That is the
state a rotation cut short after ``segment.after_seal`` leaves (lines both sealed and in
``audit.jsonl``), which every reader handles; the next writer's rotation then seals only the
few lines appended since, writes claims.json and switches the journal, all quick.

If the helper does not finish (killed, no disk space), a marker ages out after ``STALE`` s and
another is spawned; past twice the threshold the writer seals inline, under the lock, as a
last resort. ``ENABLED`` False (tests of the inline path) seals inline always.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...system import background_priority
from . import rest, segments
from .journal import seq_of

ENABLED = True
STALE = 120.0  # seconds after which a helper that left its marker is taken for dead

_CODE = ("import sys\nfrom fleetclaims.store.file.preseal import main\n"
         "sys.exit(main(sys.argv[1:]))\n")

__all__ = ["ENABLED", "helper_env", "main", "pending"]

_HELPERS: list[int] = []  # this process's helpers (pids), until reaped


def helper_env() -> dict[str, str]:
    """The environment of a helper interpreter: ours, with this fleetclaims importable (a
    caller may have found it through sys.path rather than an installation)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _marker(directory: Path, ino: int) -> Path:
    return directory / segments.DIRNAME / f".presealing-{ino}"


def pending(directory: Path, ino: int, start: int, end: int, first: int, last: int,
            later: Callable[[Callable[[], None]], None]) -> bool:
    """Whether a helper is (now) sealing the journal's lines ``first``..``last`` (bytes
    [start, end)): True when the writer should go on without sealing inline. A new helper
    is claimed here (its marker) and started by ``later`` (after the lock is released:
    starting a process takes ~10 ms); should that fail, its marker goes and the next
    rotation seals the lines."""
    if not ENABLED:
        return False
    marker = _marker(directory, ino)
    with contextlib.suppress(FileNotFoundError):
        if time.time() - marker.stat().st_mtime < STALE:
            return True
        marker.unlink()  # its helper died
    try:
        (directory / segments.DIRNAME).mkdir(mode=0o700, exist_ok=True)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    except FileExistsError:
        return True  # another writer spawned one just now
    except OSError:
        return False
    argv = ["-c", _CODE, str(directory), str(ino), str(start), str(end), str(first),
            str(last)]
    later(lambda: _start(directory, marker, argv))
    return True


def _start(directory: Path, marker: Path, argv: list[str]) -> None:
    _HELPERS[:] = [pid for pid in _HELPERS if rest.reaped(pid, block=False) is None]
    with contextlib.suppress(OSError):
        _sweep(directory / segments.DIRNAME)
    pid = rest.spawn_helper(argv, helper_env())
    if pid:
        _HELPERS.append(pid)
    else:
        with contextlib.suppress(OSError):
            marker.unlink()


def _sweep(folder: Path) -> None:
    """Remove temp files that helpers (or rotations) killed long ago left behind, and markers
    of helpers long gone (a helper that found its lines changed leaves its marker to age out;
    one of a journal since rotated away is never asked about again)."""
    now = time.time()
    for entry in os.listdir(folder):
        if entry.startswith(".") and (entry.endswith(".tmp") or entry.startswith(".presealing-")):
            with contextlib.suppress(OSError):
                path = folder / entry
                if now - path.stat().st_mtime > STALE:
                    path.unlink()


def main(argv: list[str]) -> int:
    """The helper: pack lines ``first``..``last`` (bytes [start, end) of the journal whose
    inode is ``ino``) and install them as a sealed segment, under the lock, if still wanted."""
    from .catchup import JOURNAL, LOCK
    from .lock import RegistryLock

    background_priority(10, session=True)  # (writers go first: it is work no operation waits on)

    directory = Path(argv[0])
    ino, start, end, first, last = (int(a) for a in argv[1:6])
    journal = directory / JOURNAL
    try:
        fd = os.open(journal, os.O_RDONLY)
        try:
            if os.fstat(fd).st_ino != ino:
                return 0
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        if (len(data) != end - start or not data.endswith(b"\n") or seq_of(data) != first
                or seq_of(data[data.rfind(b"\n", 0, len(data) - 1) + 1 :]) != last):
            return 1  # not the lines it was told (the writer seals inline past 2x)
        packed = segments.pack(directory, data, first, last, sync=True)
        lock = RegistryLock(directory / LOCK, 30.0)
        lock.open()
        try:
            with lock.held():
                covered = any(s.last >= first for s in segments.sealed(directory))
                if covered or os.stat(journal).st_ino != ino:
                    segments.discard(packed)
                else:
                    segments.install(packed, sync=True)
        finally:
            lock.close()
    except Exception:  # (no disk space, ...): the marker stays and ages out; no respawn storm
        return 1
    with contextlib.suppress(OSError):
        _marker(directory, ino).unlink()
    return 0
