"""The journal's line format and how lines are appended.

One event per line, sealed by ``core.chain``: ``parse_line`` / ``check_event`` check a complete
line against the chain, ``check_link`` does the same with byte checks only. Reading a journal
(lines from an offset, torn tails, damage) is ``reader.JournalReader``'s job; this module is the
format of one line and the writing side: ``write_at`` and ``preallocate``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import orjson

from ...core import events as ev
from ...core.chain import ChainError, check_seal, envelope, seal
from ...core.errors import AuditCorrupt, FleetclaimsError, ValidationError
from ...core.ports import ClaimView
from ...core.state import State
from .faults import osc
from .lock import RegistryLock

# Zero-filled space kept ahead of the journal's data (see preallocate).
PREALLOCATE = 1 << 20

__all__ = [
    "PREALLOCATE", "apply_checked", "check_event", "check_link", "cut_back", "line_before",
    "parse_line", "preallocate", "seal_events", "seq_of", "undo_unsynced", "write_at",
]


def check_event(line: bytes, seq: int, prev: str) -> dict[str, Any]:
    """Check one complete line (no newline) against the chain and return the event.

    Raises ChainError (or orjson.JSONDecodeError) saying what is wrong."""
    check_seal(line)
    event = orjson.loads(line)
    if not isinstance(event, dict):
        raise ChainError("line is not a JSON object")
    if event.get("seq") != seq:
        raise ChainError(
            f"expected seq {seq}, found {event.get('seq')!r} (lines missing or reordered)")
    if event.get("prev") != prev:
        raise ChainError(
            "prev hash does not match the line before (lines missing, reordered or edited)")
    if not isinstance(event.get("type"), str) or not isinstance(event.get("ts"), (int, float)):
        raise ChainError("event lacks a type or timestamp")
    return event


def parse_line(line: bytes, *, seq: int, prev: str, offset: int, path: str) -> dict[str, Any]:
    """``check_event`` raising AuditCorrupt (seq and offset) for a line that fails."""
    try:
        return check_event(line, seq, prev)
    except (ChainError, orjson.JSONDecodeError) as exc:
        raise AuditCorrupt(path, seq=seq, offset=offset, reason=str(exc)) from None


def apply_checked(state: State, event: dict[str, Any], offset: int, path: str) -> None:
    try:
        ev.apply(state, event)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AuditCorrupt(
            path, seq=int(event.get("seq", state.seq + 1)), offset=offset,
            reason=f"event cannot be applied: {_why(exc)}",
        ) from None


def check_link(line: bytes, seq: int, prev: str) -> str:
    """Check that ``line`` is sealed, is number ``seq`` and follows ``prev``; return its hash.

    Raises ChainError (or orjson.JSONDecodeError). Used by every store's verify: only a line
    that fails the cheap byte checks is parsed."""
    digest = check_seal(line)
    if seq_of(line) != seq:
        event = orjson.loads(line)
        found = event.get("seq") if isinstance(event, dict) else None
        raise ChainError(f"expected seq {seq}, found {found!r}")
    # prev sits right before the hash member; a bytes check avoids a full parse.
    if line[-(75 + 74) : -75] != b',"prev":"' + prev.encode() + b'"':
        event = orjson.loads(line)
        if not isinstance(event, dict) or event.get("prev") != prev:
            raise ChainError("prev hash does not match the line before")
    return digest


def line_before(fd: int, offset: int) -> tuple[int, bytes] | None:
    """The complete line that ends at ``offset`` (its offset and bytes), or None at 0."""
    if offset <= 0:
        return None
    back = 4096
    while True:
        start = max(0, offset - back)
        data = os.pread(fd, offset - start, start)
        if len(data) != offset - start or not data.endswith(b"\n"):
            return None
        nl = data.rfind(b"\n", 0, len(data) - 1)
        if nl >= 0:
            return start + nl + 1, data[nl + 1 : -1]
        if start == 0:
            return 0, data[:-1]
        back *= 4


def seq_of(line: bytes) -> int | None:
    """The seq of a line cheaply (it is the first member), or None."""
    if not line.startswith(b'{"seq":'):
        return None
    end = line.find(b",", 7)
    try:
        return int(line[7:end])
    except ValueError:
        return None


def _why(exc: BaseException) -> str:
    """What was wrong with an event, in words: a ValueError's own message ("grant of fence 2
    after high-water 3"), a missing member by name; never a Python repr."""
    if isinstance(exc, KeyError):
        return f"the member {exc.args[0]!r} is missing" if exc.args else "a member is missing"
    return str(exc) or type(exc).__name__



# --- appending -------------------------------------------------------------------------------


def seal_events(events: list[dict[str, Any]], seq: int, head: str, ts: float,
                claims: ClaimView | None = None) -> tuple[bytes, list[dict[str, Any]]]:
    """The journal lines for ``events`` chained after line ``seq`` (whose hash is ``head``), and
    the events as sealed (with seq, ts, prev and hash: what applying them needs). With
    ``claims`` (the state they apply to), a lone renewal that only extends the holder's lease
    is recorded compactly (``events.compact_renewal``)."""
    lines: list[bytes] = []
    sealed: list[dict[str, Any]] = []
    if claims is not None and len(events) == 1 and events[0].get("type") == ev.LEASE_RENEWED:
        events = [ev.compact_renewal(events[0], ts, claims.get(str(events[0]["task"])))]
    for fields in events:
        seq += 1
        obj = envelope(seq, ts, fields, head)
        try:
            body = orjson.dumps(obj)
        except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits in metadata
            raise ValidationError(
                "event", f"cannot be stored as JSON ({exc})", value=fields.get("type")
            ) from None
        line, head = seal(body)
        obj["hash"] = head
        lines.append(line)
        sealed.append(obj)
    return b"".join(lines), sealed


def write_at(fd: int, data: bytes, start: int) -> None:
    """Write all of ``data`` at ``start``. A short write is legal (a signal, a nearly full
    disk): write the rest, so the real cause (ENOSPC) surfaces from the next call; no progress
    at all is EIO."""
    written = 0
    while written < len(data):
        n = osc.write(fd, data[written:], start + written)
        if n <= 0:
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")
        written += n


def cut_back(fd: int, lock: RegistryLock, start: int, *, sync: bool) -> None:
    """Cut the journal back to ``start``, undoing lines that were not made durable (raises
    OSError). The generation is bumped before the fsync: the bytes are gone even if the fsync
    fails, and other handles that read them (readers take no lock) must reload rather than
    append past the new end."""
    osc.ftruncate(fd, start)
    lock.bump_generation()
    if sync:
        os.fsync(fd)


def undo_unsynced(fd: int, lock: RegistryLock, start: int, end: int,
                  covered: Callable[[], bool]) -> str:
    """After a failed fdatasync of our lines [start, end): cut them off again, under the lock,
    unless others appended after them (they built on them) or a snapshot covers them
    (``covered``; it would be left ahead of the journal). Returns what that left to say."""
    try:
        with lock.held():
            if os.pread(fd, 1, end) in (b"", b"\0") and not covered():
                cut_back(fd, lock, start, sync=True)
                return ""
            return " (not undone: other writers appended after it or a checkpoint covers it)"
    except (OSError, FleetclaimsError):
        return " (and undoing it)"


def preallocate(fd: int, alloc: int, needed: int, *, sync: bool) -> int:
    """Keep zero-filled space ahead of the data, so appends overwrite allocated blocks and their
    fdatasync flushes data only: an extending append also commits the file size to the
    filesystem journal, which costs ~50% more per operation (bench/fsync_floor.py).

    ``alloc`` is the size this handle last knew; returns the new one."""
    if needed <= alloc:
        return alloc
    size = os.fstat(fd).st_size  # another writer may have grown it
    if needed <= size:
        return size
    grow = max(PREALLOCATE, needed - size)
    zeros = bytes(min(grow, 1 << 20))
    pos = size
    try:
        while pos < size + grow:
            n = osc.write(fd, zeros[: size + grow - pos], pos)
            if n <= 0:
                raise OSError(errno.EIO, "short write while preallocating")
            pos += n
        if sync:
            osc.fdatasync(fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        # A nearly full disk: give the space back and append without preallocating; the
        # append itself then succeeds or reports ENOSPC.
        osc.ftruncate(fd, size)
        return size
    return size + grow
