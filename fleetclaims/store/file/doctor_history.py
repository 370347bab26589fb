"""doctor's side of honest history: compare the journal with its anchor (anchor.py) and the
fence mark in claims.lock, and, with --fix, acknowledge what is lost in the journal itself.

- journal cut short (or its fences below the recorded high-water): a ``journal_break`` line is
  appended naming the lost seq range and raising the fence floor above every fence recorded
  anywhere; the anchor then follows the repaired journal;
- another registry's journal in place of ours, with our snapshot kept: the foreign journal is
  quarantined and our snapshot's claims re-recorded (the salvage of a missing journal);
- a vanished folder, or a foreign journal without our snapshot: nothing of ours is left to
  restore: only ``fleetclaims init --new-history`` (a deliberate reset) goes on.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core import events as ev
from ...core.state import State
from . import anchor, fsutil, segments
from .faults import osc
from .journal import seal_events, write_at
from .lock import FENCE_OFFSET, FENCE_SIZE, RegistryLock
from .store import JOURNAL, LOCK, SNAPSHOT

if TYPE_CHECKING:
    from .doctor import DoctorReport
    from .salvage import JournalScan
    from .snapshot import Snapshot

KIND = "history_lost"


def lock_fence(path: Path) -> int:
    """The fence mark in claims.lock, read without opening it for writing."""
    try:
        with open(path / LOCK, "rb") as f:
            f.seek(FENCE_OFFSET)
            digits = f.read(FENCE_SIZE).strip(b"\0 \n")
    except OSError:
        return 0
    return int(digits) if digits.isdigit() else 0


def foreign_origin(journal: JournalScan, snapshot: Snapshot | None) -> str | None:
    """The origin the journal should have when it is another registry's, else None: the
    anchor's, or (without one) our snapshot's."""
    found = anchor.read(journal.path)
    ours = found.origin if found is not None else (snapshot.state.origin if snapshot else "")
    theirs = journal.state.origin
    return ours if ours and theirs and ours != theirs else None


def check(path: Path, journal: JournalScan, snapshot: Snapshot | None,
          report: DoctorReport) -> bool:
    """Add a finding when the history falls short of what was recorded; True when --fix can
    act on it (a cut journal, or a foreign one with our snapshot to restore from)."""
    found, unreadable = anchor.load(path)
    if unreadable is not None and journal.exists:  # (the store refuses to work: so do we)
        report.add(KIND, f"{unreadable}, and claims.lock keeps no mark of the last anchor to "
                   "compare with: nothing can tell whether the journal was cut or replaced. If "
                   "you trust the journal, move the anchor aside (the next write writes a new "
                   "one); else restore the registry from a backup")
        return False
    if not journal.exists:
        if found is not None and snapshot is None and "journal_missing" not in report.kinds():
            report.add(KIND, f"the registry's journal and snapshot are gone (registry "
                       f"{found.origin} had reached seq {found.seq}, fence {found.fence}, as its "
                       f"anchor {found.path} records): nothing is left to restore; run "
                       "`fleetclaims init --new-history` to start a new history above fence "
                       f"{found.fence}", origin=found.origin, seq=found.seq, fence=found.fence)
        return False
    if "segment_damaged" in report.kinds():
        return False  # the origin read is the sealed history's: reported there, not repaired
    ours = foreign_origin(journal, snapshot)
    if ours is not None:
        can = snapshot is not None and snapshot.state.origin == ours
        report.add(KIND, f"the journal belongs to registry {journal.state.origin}, not to this "
                   f"registry ({ours}): another registry's history was put in its place; "
                   + ("--fix quarantines it and restores this registry's snapshot" if can else
                      "nothing of this registry is left to restore: move the journal aside and "
                      "run `fleetclaims init --new-history`"), origin=ours)
        return can
    if journal.break_seq is not None:
        return False  # the break is reported (and salvaged) first; the floor follows below
    reason = anchor.problem(journal.state, found, lock_fence(path)) or _rewritten(
        path, journal, found)
    if reason is None:
        return False
    report.add(KIND, reason + "; --fix records the loss in the journal (journal_break) and "
               "continues fences above every fence recorded")
    return True


def _rewritten(path: Path, journal: JournalScan, found: anchor.Anchor | None) -> str | None:
    """history.rewritten of the journal doctor read."""
    from .history import rewritten

    try:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    except OSError:
        return None
    try:
        return rewritten(fd, journal.good_end, found, journal.state.seq)
    finally:
        os.close(fd)


def quarantine_foreign(path: Path, report: DoctorReport) -> None:
    """Move another registry's journal aside (kept, never deleted)."""
    fsutil.quarantine_file(path, path / JOURNAL, "doctor: another registry's journal",
                           extra={"finding": KIND})


def acknowledge(path: Path, lock: RegistryLock, journal: JournalScan) -> dict[str, Any] | None:
    """After the repairs (under the lock): when the verified journal still falls short of the
    anchor or the fence mark, append a journal_break that names the loss and raises the fence
    floor; then mirror the journal's head (forced: a recorded repair). Returns the event."""
    if not journal.exists or journal.break_seq is not None or journal.torn:
        return None
    state = journal.state
    found = anchor.read(path)
    if found is not None and state.origin and found.origin != state.origin:
        return None  # not ours: only init --new-history goes on
    mark = lock.fence_mark()
    reason = anchor.problem(state, found, mark) or _rewritten(path, journal, found)
    event: dict[str, Any] | None = None
    if reason is not None:
        event = {"type": ev.JOURNAL_BREAK, "actor": "doctor", "reason": reason,
                 "fence_floor": max(mark, state.fence, found.fence if found else 0)}
        if found is not None and found.seq > state.seq:
            event.update(from_seq=state.seq + 1, to_seq=found.seq,
                         lost=f"events {state.seq + 1}..{found.seq} (not in these bytes)")
        events = [event]
        if not state.origin and found is not None:  # an emptied journal: keep our identity
            events.insert(0, {"type": ev.REGISTRY_CREATED, "actor": "doctor",
                              "origin": found.origin, "reason": "journal emptied"})
        _append(path, lock, state, journal.good_end, events)
    anchor.record(path, state, force=True)
    lock.mark_fence(state.fence, force=True)
    return event


def _append(path: Path, lock: RegistryLock, state: State, at: int,
            events: list[dict[str, Any]]) -> None:
    data, sealed = seal_events(events, state.seq, state.head, time.time())
    fd = fsutil.open_file(path / JOURNAL, os.O_RDWR)
    try:
        write_at(fd, data, at)
        osc.fsync(fd)
    finally:
        os.close(fd)
    lock.bump_generation()  # every handle reloads (and meets the break)
    for obj in sealed:
        ev.apply(state, obj)


def new_history(path: Path) -> dict[str, Any]:
    """``fleetclaims init --new-history``: a deliberate reset. Whatever journal and snapshot
    are here are moved to quarantine/ (never deleted); a new journal starts with a
    registry_created above every fence recorded anywhere (anchor, claims.lock, and every fence
    written in the old bytes, sealed or not); the anchor then follows the new history."""
    from .salvage import highest_fence

    fsutil.check_directory(path, create=True)
    lock = RegistryLock(path / LOCK, timeout=30.0)
    lock.open()
    try:
        with lock.held():
            found = anchor.read(path)
            floor = max(lock.fence_mark(), found.fence if found is not None else 0)
            quarantined = []
            # (segments/ too: the sealed head of the old chain, which the new one cannot
            # follow; archived.json inside it names an archive of the old history)
            for name in (JOURNAL, SNAPSHOT, segments.DIRNAME):
                if os.path.lexists(path / name):
                    if name != SNAPSHOT:
                        floor = max(floor, _highest_in(path / name, highest_fence))
                    quarantined.append(fsutil.quarantine_file(
                        path, path / name, "init --new-history: the previous history").name)
            event: dict[str, Any] = {
                "type": ev.REGISTRY_CREATED, "actor": "fleetclaims",
                "origin": secrets.token_hex(8), "fence_floor": floor,
                "reason": "init --new-history: a deliberate reset"}
            if found is not None:
                event["previous_origin"] = found.origin
            state = State()
            fd = fsutil.open_file(path / JOURNAL, os.O_RDWR | os.O_EXCL, create=True)
            os.close(fd)
            fsutil.fsync_dir(path)
            _append(path, lock, state, 0, [event])
            anchor.record(path, state, force=True)
            lock.mark_fence(state.fence, force=True)
    finally:
        lock.close()
    return {"origin": state.origin, "seq": state.seq, "head": state.head,
            "fence_floor": floor, "previous_origin": event.get("previous_origin"),
            "quarantined": quarantined}


def _highest_in(where: Path, highest: Callable[[bytes], int]) -> int:
    """The highest fence written in a journal, or in the sealed segments of a folder (as far
    as each reads: a damaged one still has the anchor and claims.lock above it)."""
    if not where.is_dir():
        with open(where, "rb") as f:
            return _highest_in_lines(f, highest)
    import gzip

    top = 0
    for seg in segments.sealed(where.parent):
        with contextlib.suppress(OSError, EOFError, zlib.error), gzip.open(seg.path) as f:
            top = max(top, _highest_in_lines(f, highest))
    return top


def _highest_in_lines(lines: Iterable[bytes], highest: Callable[[bytes], int]) -> int:
    top = 0
    for line in lines:  # (by line: a number is never cut in two)
        top = max(top, highest(line))
    return top
