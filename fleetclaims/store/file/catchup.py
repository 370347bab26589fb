"""The file store's reading side: loading the snapshot and catching up on the journal.

``CatchUp`` is the part of ``FileStore`` that readers and writers share: open the journal, load
the snapshot (or rebuild from the journal when it is unusable), apply the lines after its offset
through the one reader, and hand out events and verification. The writing side (``store.py``)
supplies what a writer does on the way: create the journal, repair a torn tail, rebuild a
damaged snapshot.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError
from ...core.errors import AuditCorrupt, DurabilityError, RegistryCorrupt
from ...core.state import State
from ..base import VerifyReport
from . import fsutil, rotation, segments
from .journal import apply_checked, check_event
from .lock import RegistryLock
from .midway import archived_through, events_after, sealed_or_foreign, task_lines
from .reader import CATCH_UP_CHUNK, JournalReader, snapshot_problem, verify_fd
from .snapshot import Snapshot, read_snapshot

JOURNAL = "audit.jsonl"
SNAPSHOT = "claims.json"
LOCK = "claims.lock"


class CatchUp:
    """State and journal descriptor of one handle, kept up to date with the files."""

    location: str
    directory: Path
    journal_path: Path
    snapshot_path: Path
    _mutex: threading.RLock
    _lock: RegistryLock
    _fd: int
    _generation: int
    _alloc: int
    _state: State | None
    _reader: JournalReader | None
    _offset: int
    _snap_offset: int
    _snap_size: int
    _poisoned: DurabilityError | None
    _padding_checked: bool
    _rebuild_owed: bool
    _rebuild_problem: str | None = None  # why the snapshot a reader replayed past is unusable
    _swept_temps: bool

    # What the writing side provides.
    def _ensure_open(self) -> None:
        raise NotImplementedError

    def _io_failure(self, operation: str, exc: OSError) -> DurabilityError:
        raise NotImplementedError

    def _reopen(self) -> None:
        raise NotImplementedError

    def _stranger(self, snapshot: Snapshot) -> bool:
        """Whether ``snapshot`` is known to be another registry's (then it does not fit,
        rather than being ahead of a journal cut short). See History."""
        return False

    def _sweep_temp_files(self) -> None:
        raise NotImplementedError

    def _create_journal(self) -> None:
        raise NotImplementedError

    def _rebuild_snapshot(self, problem: str) -> None:
        raise NotImplementedError

    def _repair_tail(self, offset: int, tail: bytes) -> None:
        raise NotImplementedError

    def read(self) -> State:
        with self._mutex:
            if self._poisoned is not None:
                raise self._poisoned
            try:
                self._ensure_open()
                if self._lock.unlinked():  # the folder was removed or replaced under us
                    self._reopen()
                try:
                    return self._catch_up(writer=False)
                except AuditCorrupt:
                    # Without the lock a read can overlap a writer cutting its lines back
                    # (a failed fdatasync) and see half a line; that writer bumped the
                    # generation first. Then reload once; real damage fails again.
                    if self._fd < 0 or self._lock.generation() == self._generation:
                        raise
                    self._drop_state()
                    return self._catch_up(writer=False)
            except OSError as exc:
                raise self._io_failure("reading the registry", exc) from exc

    def _open_journal(self, *, create: bool) -> bool:
        """Open the journal descriptor; False when there is no journal (and create is False)."""
        # The generation before the open: read after it, a replacement (doctor --fix) landing
        # in between would pair the old inode with the new generation, and this handle would
        # never reload (readers open without the lock). Read before, such a race only costs a
        # needless reload.
        generation = self._lock.generation()
        try:
            self._fd = fsutil.open_file(self.journal_path, os.O_RDWR, create=create)
        except FileNotFoundError:
            return False
        self._generation = generation
        self._alloc = os.fstat(self._fd).st_size
        return True

    def _catch_up(self, *, writer: bool) -> State:
        if writer and not self._swept_temps and self._fd >= 0:
            # A handle that first loaded as a reader still owes the writer's clean-up.
            self._sweep_temp_files()
        if writer and self._rebuild_owed and not self._rebuild_in_place():
            # Loaded by a reader over a damaged snapshot (rebuilt in memory only): reload under
            # the lock, so the writer quarantines it and records registry_rebuilt.
            self._drop_state()
        if self._state is not None and self._fd < 0:
            # A reader that found no journal yet: look again (a writer may have created it).
            self._drop_state()
        if self._state is not None:
            if self._lock.generation() != self._generation:
                # Replaced (doctor --fix) or cut back (a failed write undone, a torn tail
                # repaired): start again from disk.
                self._drop_state()
            elif os.pread(self._fd, 1, self._offset) in (b"", b"\0"):
                if writer and self._offset >= segments.SEGMENT_BYTES:
                    rotation.rotate(self)  # (segments.py: seal the active journal)
                return self._state  # nothing new: EOF or the preallocated (zero) space
        if self._state is None:
            self._load(writer=writer)
            assert self._state is not None
            if self._fd < 0:  # no journal yet: nothing to read (readers never create one)
                return self._state
        self._consume(writer=writer)
        if writer and self._offset >= segments.SEGMENT_BYTES:
            rotation.rotate(self)  # (segments.py: seal the active journal)
        return self._state

    def _rebuild_in_place(self) -> bool:
        """A reader replayed the journal over a damaged snapshot, without the lock (a writer
        does so before taking it): now, under the lock, quarantine that snapshot and record the
        rebuild from the state already replayed, instead of replaying the journal again under
        the lock. False when that state cannot be used: the journal was replaced meanwhile,
        the reason is not known here, or the snapshot is no longer the damaged one (another
        writer rebuilt it: then reloading from it is cheap)."""
        problem = self._rebuild_problem
        if (problem is None or self._state is None or self._fd < 0
                or self._lock.generation() != self._generation):
            return False
        if os.path.lexists(self.snapshot_path):
            snapshot, now = read_snapshot(self.snapshot_path)
            if snapshot is not None:
                now = snapshot_problem(self._fd, snapshot, self.directory)
            if now is None:
                return False
        self._rebuild_owed = False
        self._rebuild_problem = None
        self._consume(writer=True)
        self._rebuild_snapshot(problem)
        return True

    def _drop_state(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
        self._state = None
        self._offset = 0
        self._padding_checked = False
        self._rebuild_owed = False
        self._rebuild_problem = None

    def _load(self, *, writer: bool) -> None:
        self._rebuild_owed = False
        self._rebuild_problem = None
        snap_exists = os.path.lexists(self.snapshot_path)
        if not self._open_journal(create=False):
            if snap_exists or self._lock.generation() > 0:
                raise RegistryCorrupt(
                    str(self.journal_path),
                    "the journal is missing, but this registry had one"
                    + (" and a snapshot exists" if snap_exists else ""),
                    hint="Run `fleetclaims doctor --fix` to start a new journal from the snapshot.",
                )
            if not writer:
                self._state = State()
                self._offset = 0
                return
            self._create_journal()
            return
        if writer and not self._swept_temps:
            self._sweep_temp_files()
        snapshot, problem = read_snapshot(self.snapshot_path) if snap_exists else (None, None)
        if snapshot is not None:
            problem = snapshot_problem(self._fd, snapshot, self.directory)
            if problem is None:
                self._state = snapshot.state
                self._offset = self._snap_offset = snapshot.offset
                self._snap_size = snapshot.size
                return
        self._state = State()
        self._offset = 0
        self._snap_offset = self._snap_size = 0
        if problem is None:
            return
        # A bad snapshot: rebuild from the journal (readers in memory, writers on disk too).
        self._consume(writer=False)
        if (snapshot is not None and snapshot.state.seq > self._state.seq
                and not self._stranger(snapshot)):
            raise RegistryCorrupt(
                str(self.journal_path),
                f"the snapshot is at seq {snapshot.state.seq} but the journal ends at seq "
                f"{self._state.seq}: acknowledged events are missing from the journal",
                hint="Run `fleetclaims doctor --fix`: it keeps the verified journal, re-records "
                "the snapshot's claims, and quarantines both originals.",
            )
        if writer:
            self._rebuild_snapshot(problem)
        else:
            self._rebuild_owed = True
            self._rebuild_problem = problem

    def _consume(self, *, writer: bool) -> None:
        """Apply complete journal lines after our offset; repair a torn tail when writing."""
        state = self._state
        assert state is not None
        if self._padding_checked and self._offset > 0 and self._consume_few(state):
            return
        path = str(self.journal_path)
        reader = self._reader  # (kept between catch-ups: building one costs the hot path)
        if reader is None or reader.fd != self._fd:
            reader = self._reader = JournalReader(self._fd, path, chunk_size=CATCH_UP_CHUNK)
        reader.offset, reader.seq, reader.prev = self._offset, state.seq, state.head
        while True:
            offset = self._offset
            try:
                for offset, _, event in reader.events():
                    apply_checked(state, event, offset, path)
            finally:
                # Our offset is the end of the last line applied: the reader's, unless the
                # apply of the line at ``offset`` failed (it sets the seq last).
                self._offset = reader.offset if state.seq == reader.seq else offset
            if reader.damage is not None:
                raise reader.corrupt()
            if reader.torn:
                # Only a partial line followed by nothing but unused space is a torn tail;
                # bytes beyond a run of zeros mean the file was damaged mid-way. (A reader
                # seeing bytes right after it sees a writer finishing that line.)
                junk = reader.junk()
                if junk is not None and (writer or junk != reader.data_end):
                    raise reader.corrupt(reader.junk_damage(junk))
                if writer:
                    self._repair_tail(reader.offset, reader.torn)
                return
            if self._padding_checked:
                return
            # Once per load: the data ends at the first NUL byte, and everything after it must
            # be unused space; lines beyond a run of zeros would otherwise be silently ignored.
            junk = reader.junk()
            if junk is None:
                self._padding_checked = True
                return
            if junk != self._offset or writer:
                raise reader.corrupt(reader.junk_damage(junk))
            # A writer appended while we looked: read on.

    def _consume_few(self, state: State) -> bool:
        """The hot path of ``_consume``: the few lines other writers appended since our last
        look, read in one small chunk, each checked (``check_event``) and applied. True when
        they were all there was; False leaves the rest (more than a chunk, a line that does not
        check, an incomplete line) to the general path, from the first line not applied, which
        reports damage and torn tails as ever. An apply that fails raises as there."""
        start = self._offset
        data = os.pread(self._fd, CATCH_UP_CHUNK, start)
        nul = data.find(b"\0")
        ends = nul >= 0 or len(data) < CATCH_UP_CHUNK  # the data ends within this chunk
        if nul >= 0:
            data = data[:nul]
        seq, prev = state.seq, state.head
        cut = 0
        while (nl := data.find(b"\n", cut)) >= 0:
            seq += 1
            try:
                event = check_event(data[cut:nl], seq, prev)
            except (ChainError, orjson.JSONDecodeError):
                return False
            apply_checked(state, event, start + cut, str(self.journal_path))
            prev = event["hash"]
            cut = nl + 1
            self._offset = start + cut
        return ends and cut == len(data)

    def iter_events(self, after: int = 0) -> Iterator[dict[str, Any]]:
        with self._mutex:
            state = self.read()
            end = self._offset
            if self._fd < 0 or after >= state.seq:
                return iter(())
            fd = os.dup(self._fd)
        return events_after(fd, str(self.journal_path), after, end)

    def task_events(self, task: str) -> Iterator[dict[str, Any]]:
        """The events about ``task`` (and merges, which may carry its records), quickly: a
        bytes test picks the lines, and only those are parsed and their seals checked, so
        ``explain`` on a journal of a million lines reads it once without hashing it all.
        (Whether the chain holds is ``audit verify``'s question; a line that fails its seal
        raises AuditCorrupt as everywhere.)"""
        with self._mutex:
            state = self.read()
            end = self._offset
            if self._fd < 0 or state.seq == 0:
                return iter(())
            fd = os.dup(self._fd)
        return task_lines(fd, str(self.journal_path), task, end)

    def archived_through(self) -> int:
        """The seq up to which events were archived (`audit archive`; 0: none)."""
        return archived_through(self.directory)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        with self._mutex:
            try:
                self._ensure_open()
                fd = fsutil.open_file(self.journal_path, os.O_RDONLY)
            except FileNotFoundError:
                return VerifyReport(True, 0, 0, "0" * 64, None, anchor_ok=None)
            except OSError as exc:
                raise DurabilityError("opening the journal to verify it", self.location,
                                      exc) from exc
        try:
            snapshot, problem = read_snapshot(self.snapshot_path)
            report = verify_fd(fd, str(self.journal_path), progress=progress, snapshot=snapshot,
                               snapshot_problem=problem)
            return sealed_or_foreign(self.directory, fd, report, snapshot)
        finally:
            os.close(fd)
