"""Honest history for the file store: a loaded history is compared with what was recorded
outside it (the anchor, see anchor.py; the fence mark in claims.lock), so a vanished folder, a
foreign journal, a journal cut short or a snapshot with a forged fence is refused with
``HistoryLost`` instead of handing out fences again.

``History`` sits between ``CatchUp`` (loading and catching up) and ``FileStore`` (writing): it
checks once per load, never per operation, and marks the anchor after each checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import orjson

from ...core.errors import (
    AuditCorrupt,
    HistoryLost,
    RegistryCorrupt,
    SegmentDamaged,
    UnsafeRegistry,
)
from ...core.state import State
from . import anchor, fsutil
from .catchup import CatchUp
from .journal import seq_of
from .lock import READ_ONLY_ERRNOS
from .reader import find_offset, iter_lines
from .snapshot import Snapshot, read_snapshot


def rewritten(fd: int, end: int, found: anchor.Anchor | None, seq: int) -> str | None:
    """When the journal (open at ``fd``, read to ``end``, at ``seq``) went on past the anchor's
    seq: why its line there is not the one recorded, or None. A journal re-sealed from end to
    end and extended by a line would otherwise be adopted, and the next checkpoint would move
    the anchor past the evidence. Looked up in the active journal (a few reads of a binary
    search, once per load); a line already sealed into a segment is `audit verify`'s."""
    if found is None or found.seq <= 0 or seq <= found.seq:
        return None
    first = seq_of(os.pread(fd, 64, 0))
    if first is None or found.seq < first:
        return None
    line = next(iter_lines(fd, find_offset(fd, found.seq - 1, 0, end, first - 1), end), None)
    if line is None or not line[2]:
        return None
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        event = orjson.loads(line[1])
        if event.get("seq") == found.seq and event.get("hash") != found.head:
            return (f"the journal's line {found.seq} is not the one recorded (hash "
                    f"{found.head[:16]}...): the history was rewritten")
    return None


Recorded = tuple[tuple["anchor.Anchor | None", "str | None"], int]  # (anchor.load(), fence mark)


class History(CatchUp):
    _history_owed = False
    _recorded: Recorded | None = None  # read at the start of a load (see _load)
    damage: AuditCorrupt | None = None  # what a read could not verify (see read)
    #: the uid owning the registry directory when it is not ours (another user's registry:
    #: read only, never written: no lock taken, no file created or changed)
    foreign_owner: int | None = None

    def _refuse_foreign(self) -> None:
        """Before any write (even taking the lock): another user's registry is refused."""
        if self.foreign_owner is None:
            return
        raise UnsafeRegistry(
            str(self.directory), f"it is owned by uid {self.foreign_owner}, not by you (uid "
            f"{fsutil.euid()}): another user's registry is only read, never written",
            hint="Reading works (claims, get, explain, audit, audit report); to change it, run "
            "the command as its owner, or claim in your own registry (--dir, FLEETCLAIMS_DIR).")

    def _load(self, *, writer: bool) -> None:
        # What was recorded outside the journal, read before the journal: it names only lines
        # durable by then, so a writer that appends and mirrors while we read (without the
        # lock) is no alarm (see _check_history).
        self._recorded = (anchor.load(self.directory), self._lock.fence_mark())
        if (self._lock.generation() == 0 and not os.path.lexists(self.journal_path)
                and not os.path.lexists(self.snapshot_path)):
            # Nothing here and a fresh lock file: a new registry, unless one lived here.
            anchor.check_vanished(self.directory)
        try:
            super()._load(writer=writer)
        except RegistryCorrupt:
            # (e.g. "the snapshot is ahead of the journal": say so when the journal is another
            # registry's rather than ours cut short)
            if self._state is not None:
                self._check_origin()
            raise
        self._history_owed = True

    def _open_journal(self, *, create: bool) -> bool:
        if create:
            self._refuse_foreign()
        try:
            if self.foreign_owner is None:
                return super()._open_journal(create=create)
        except OSError as exc:
            if create or exc.errno not in READ_ONLY_ERRNOS:
                raise
        # Read-only review: a journal we may not write is still read (writes fail, typed).
        generation = self._lock.generation()
        try:
            self._fd = fsutil.open_file(self.journal_path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        self._generation = generation
        self._alloc = os.fstat(self._fd).st_size
        return True

    def read(self) -> State:
        """The verified state; on a damaged journal, the state up to the damage, which is
        named in ``damage`` (and logged): a reviewer must see what is there. Writes still
        refuse (AuditCorrupt), and so does ``audit verify``."""
        try:
            state = super().read()
        except AuditCorrupt as exc:
            verified = self._state
            if verified is None or self._poisoned is not None:
                raise
            state = verified
            if self.damage is None or str(self.damage) != str(exc):
                import logging

                logging.getLogger("fleetclaims").warning(
                    "fleetclaims: showing the verified state only (up to seq %d): %s",
                    state.seq, exc)
            self.damage = exc
            return state
        self.damage = None
        return state

    def note_damage(self, exc: AuditCorrupt) -> None:
        """A read of the events (audit, explain, a report) stopped at damage before the
        snapshot, which the load does not read: named as the load's own damage is."""
        if self.damage is None or str(self.damage) != str(exc):
            import logging

            logging.getLogger("fleetclaims").warning(
                "fleetclaims: showing the verified events only (up to seq %d): %s",
                exc.seq - 1, exc)
        self.damage = exc

    def damage_doc(self) -> dict[str, Any] | None:
        """What the last read could not verify, as data (``--json``'s ``damage``, #16), or
        None on a healthy registry: the file, the seq range and byte range [offset, end) of the
        damage (``to_seq`` None: it runs to the end), why, the seq the state shown stops at,
        what the damaged lines held as far as they read, and what to run."""
        damage = self.damage
        if damage is None:
            return None
        reason = damage.reason.split(": ", 1)[-1] if damage.reason.startswith(
            "audit journal broken") else damage.reason
        # (a read of the events stops before the state's seq: the state shown is then only
        # verified as far as the line before the damage)
        verified = min(self._state.seq if self._state is not None else 0, damage.seq - 1)
        doc: dict[str, Any] = {
            "file": damage.path, "from_seq": damage.seq, "to_seq": None,
            "offset": damage.offset, "end": None, "reason": reason,
            "verified_seq": max(verified, 0),
            "held": [], "fix": "fleetclaims doctor --fix", "message": str(damage)}
        if isinstance(damage, SegmentDamaged) or damage.path.endswith(".jsonl.gz"):
            # Sealed history: no byte range of audit.jsonl, and restored, not repaired.
            doc.update(offset=None, end=None, fix="restore the sealed segment from a backup or "
                       "the archive directory (doctor --fix does not rewrite sealed history)")
            return doc
        try:
            fd = fsutil.open_file(self.journal_path, os.O_RDONLY)
        except OSError:
            return doc
        try:
            from .salvage_segments import damaged_range

            doc.update(damaged_range(fd, damage.offset, damage.seq))
            if doc["to_seq"] is None and doc["end"] == damage.offset:  # (after zero space)
                doc["end"] = os.fstat(fd).st_size
        except OSError:
            pass
        finally:
            os.close(fd)
        return doc

    def _consume(self, *, writer: bool) -> None:
        super()._consume(writer=writer)
        if self._history_owed:  # the first catch-up of a load reached the journal's end
            self._history_owed = False
            self._check_history(writer=writer)

    def _check_history(self, *, writer: bool = False) -> None:
        recorded, self._recorded = self._recorded, None
        reason, found, mark, garbled = self._history_problem(recorded)
        if reason is not None and recorded is not None:
            # Read before the journal, the anchor may be older than a repair that moved it
            # back (doctor --fix): only what the current one says too is an alarm.
            reason, found, mark, garbled = self._history_problem(None)
        if reason is None:
            return
        if garbled:  # (an anchor file that cannot be read and no mark of it: never replaced)
            raise anchor.unreadable(self.directory, reason, mark)
        state = self._state
        assert state is not None
        floor = max(mark, found.fence if found is not None else 0)
        if self._snap_offset > 0 and state.fence < floor and self._replay_alone(
                writer, floor, found, mark):
            return  # the snapshot's fence was forged (or stale): the journal holds the grants
        raise anchor.lost(self.directory, reason, found, mark)

    def _history_problem(self, recorded: Recorded | None) -> tuple[
            str | None, anchor.Anchor | None, int, bool]:
        """(why the loaded history falls short of ``recorded``, or None; the anchor; the
        fence mark; whether the reason is an anchor file that cannot be read), ``recorded``
        read now when None."""
        state = self._state
        assert state is not None
        if recorded is None:
            recorded = (anchor.load(self.directory), self._lock.fence_mark())
        (found, garbled), mark = recorded
        if garbled is not None:
            return garbled, None, mark, True
        return anchor.problem(state, found, mark) or rewritten(
            self._fd, self._offset, found, state.seq), found, mark, False

    def _replay_alone(self, writer: bool, floor: int, found: anchor.Anchor | None,
                      mark: int) -> bool:
        """Load the journal without the snapshot; True when it reaches what was recorded (then
        the snapshot is quarantined by a writer, or owed to the next one, as any bad one)."""
        snap_fence = self._state.fence if self._state is not None else 0
        self._state = State()
        self._offset = self._snap_offset = self._snap_size = 0
        super()._consume(writer=False)
        if anchor.problem(self._state, found, mark):
            return False
        problem = (f"the snapshot's fence high-water {snap_fence} is below fence {floor}, "
                   "recorded in the journal and outside the snapshot")
        if writer:
            self._rebuild_snapshot(problem)
        else:
            self._rebuild_owed = True
        return True

    def _before_rebuild(self) -> None:
        """Before a writer quarantines a snapshot that does not fit the journal: a snapshot of
        another origin means the journal was replaced, not the snapshot damaged; and the
        journal must still reach the anchor. (Refused: nothing is quarantined.)"""
        self._check_origin()
        self._check_history()

    def _stranger(self, snapshot: Snapshot) -> bool:
        state = self._state
        if state is None or not state.origin or snapshot.state.origin in ("", state.origin):
            return False
        found = anchor.read(self.directory)
        return found is not None and found.origin == state.origin

    def _check_origin(self) -> None:
        """HistoryLost when the snapshot is of another origin than the journal, unless the
        anchor says the journal is this registry's (then the snapshot is the stranger: it is
        quarantined and rebuilt as any snapshot that does not fit)."""
        state = self._state
        assert state is not None
        snapshot, _ = read_snapshot(self.snapshot_path)
        if snapshot is not None and snapshot.state.origin and state.origin and (
                snapshot.state.origin != state.origin):
            if self._stranger(snapshot):
                return
            raise HistoryLost(
                str(self.directory),
                f"the journal belongs to registry {state.origin}, but the snapshot (at seq "
                f"{snapshot.state.seq}) to {snapshot.state.origin}: another registry's journal "
                "was put in place of this one's",
                anchor=str(self.snapshot_path), origin=snapshot.state.origin,
                seq=snapshot.state.seq, fence=snapshot.state.fence)

    def _after_checkpoint(self) -> None:
        """Mirror the checkpointed head (durable in the journal already): the fence mark in
        claims.lock and the anchor outside the folder. Best effort, never on the hot path."""
        assert self._state is not None
        anchor.mirror(self.directory, self._lock, self._state)
