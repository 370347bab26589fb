"""The embedded file store: a hash-chained journal, a checkpoint snapshot, one lock file.

Write path (under the lock): catch up on journal bytes this process has not seen (repairing a
torn tail), decide, append the event lines and fdatasync, apply, checkpoint if due, return.
Read path (no lock): snapshot, then journal lines after its offset; incomplete last line ignored.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...core import events as ev
from ...core.errors import (
    AuditCorrupt,
    DurabilityError,
    FleetclaimsError,
    RegistryCorrupt,
    UnsafeRegistry,
    ValidationError,
)
from ...core.model import Now
from ...core.rules import Decision
from ...core.state import State
from ...system import Clock, current_pid, unsafe_filesystem
from ..base import LOCAL_DIRECTORY, Capabilities, Decide, VerifyReport
from . import fsutil, rest
from .faults import crash_point, osc
from .journal import (
    apply_checked,
    cut_back,
    preallocate,
    seal_events,
    undo_unsynced,
    write_at,
)
from .lock import RegistryLock
from .reader import CATCH_UP_CHUNK, JournalReader, events_after, verify_fd
from .snapshot import (
    anchor_problem,
    encode_snapshot,
    read_snapshot,
    snapshot_seq,
    sweep_temp_files,
    write_snapshot,
)

JOURNAL = "audit.jsonl"
SNAPSHOT = "claims.json"
LOCK = "claims.lock"
# Checkpoint when the journal tail since the last snapshot exceeds max(MIN, snapshot/DIVISOR):
# the snapshot write is then paid for by at least snapshot/DIVISOR bytes of appends, so the
# amortised cost per operation stays constant however many claims there are, and a cold start
# replays at most that much.
CHECKPOINT_MIN_TAIL = 512 * 1024
CHECKPOINT_DIVISOR = 8


class FileStore:
    capabilities = Capabilities("file", frozenset({LOCAL_DIRECTORY}))

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        clock: Clock,
        durability: str = "full",
        lock_timeout: float = 10.0,
        allow_unsafe_fs: bool = False,
        create: bool = True,
    ) -> None:
        if durability not in ("full", "process"):
            raise ValueError("durability must be 'full' or 'process'")
        self.directory = Path(directory).absolute()
        self.location = str(self.directory)
        self.clock = clock
        self.durability = durability
        self.lock_timeout = lock_timeout
        self.allow_unsafe_fs = allow_unsafe_fs
        self._create = create
        self.journal_path = self.directory / JOURNAL
        self.snapshot_path = self.directory / SNAPSHOT
        self._mutex = threading.RLock()
        self._pid = -1
        self._lock = RegistryLock(self.directory / LOCK, lock_timeout)
        self._fd = -1
        self._generation = 0
        self._others_wrote = True
        self._alloc = 0
        self._state: State | None = None
        self._reader: JournalReader | None = None
        self._offset = 0
        self._snap_offset = 0
        self._snap_size = 0
        self._poisoned: DurabilityError | None = None
        self._padding_checked = False
        self._rebuild_owed = False
        self._swept_temps = False
        self.last_checkpoint_error: OSError | None = None
        # At rest (rest.py): when this handle last wrote (monotonic), whether it holds a share
        # of preallocated padding, its idle keeper, and the refusals it counts.
        self._last_write = -1e9
        self._padded = False
        self._trim_checked = False
        self._keeper: rest.IdleKeeper | None = None
        self._refusals = rest.Refusals()
        self._snap_mono = 0.0
        self._dirty = False

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def sync(self) -> bool:
        return self.durability == "full"

    def _ensure_open(self) -> None:
        pid = current_pid()
        if self._pid == pid:
            return
        # First use, or we are a forked child: never share lock or journal descriptors (and
        # their flock) with the parent.
        self._reset_handles()
        fsutil.check_directory(self.directory, create=self._create)
        if not self.allow_unsafe_fs:
            reason = unsafe_filesystem(self.directory)
            if reason is not None:
                raise UnsafeRegistry(
                    self.location,
                    reason + ": file locks or atomic rename are unreliable there",
                    hint="Use a local directory (FLEETCLAIMS_DIR), or pass allow_unsafe_fs=True / "
                    "--allow-unsafe-fs / FLEETCLAIMS_ALLOW_UNSAFE_FS=1 if you are sure.",
                )
        self._lock.open()
        self._pid = pid

    def _reset_handles(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        if self._pid == os.getpid():
            self._lock.close()
        self._lock.fd = -1
        self._fd = -1
        self._state = None
        self._offset = 0
        self._padding_checked = False
        self._padded = self._trim_checked = False
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None

    def now(self) -> Now:
        return self.clock.now()

    def close(self) -> None:
        with self._mutex:
            if self._pid == os.getpid():
                with contextlib.suppress(Exception):
                    # (a large checkpoint finishes in a forked child, within IDLE: see rest.py)
                    self.settle(wait=True, defer=True)
                self._reset_handles()
            self._pid = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()

    # --- the transaction ---------------------------------------------------------------------

    def transact(self, decide: Decide) -> tuple[Decision, State]:
        with self._mutex:
            if self._poisoned is not None:
                raise self._poisoned
            try:
                return self._transact(decide)
            except OSError as exc:
                raise self._io_failure("writing to the registry", exc) from exc

    def _io_failure(self, operation: str, exc: OSError) -> DurabilityError:
        """An OS call failed outside the append (opening, reading, quarantining, creating): never
        a raw OSError for the caller, and no retry on a handle whose view may be stale."""
        return self._poison(DurabilityError(operation, self.location, exc))

    def _poison(self, error: DurabilityError) -> DurabilityError:
        """Refuse further use of this handle (raising ``error`` each time) and drop its state."""
        self._poisoned = error
        self._drop_state()
        return error

    def _transact(self, decide: Decide) -> tuple[Decision, State]:
        self._ensure_open()
        if self._state is not None and self._others_wrote:
            # Read what other writers appended before taking the lock (readers need none), so
            # the critical section only has the last few lines left to apply: under contention
            # that is most of the work a writer does for others. (Skipped while nobody else
            # writes: then it would only cost two syscalls an operation.)
            try:
                self._catch_up(writer=False)
            except FleetclaimsError:
                self._drop_state()  # the locked path reloads and reports real damage
        lock = self._lock
        # (not lock.held(): a generator context manager costs ~1 us an op)
        lock.acquire(self._wait_work if self._state is not None else None)
        try:
            seen = self._offset
            state = self._catch_up(writer=True)
            self._others_wrote = self._offset != seen
            if not self._trim_checked:  # the next opener removes what a crashed writer left
                self._trim_checked = True
                if self._alloc > self._offset and rest.trim_padding(self._fd, self._offset):
                    self._alloc = self._offset
            if state.seq == 0:  # an empty journal (a crash right after creating it)
                self._append([{"type": ev.REGISTRY_CREATED, "origin": os.urandom(8).hex(),
                               "actor": "fleetclaims"}], self.clock.now().wall)
            now = self.clock.now()
            decision = decide(state, now)
            start = end = self._offset
            seq_before = state.seq
            events = decision.events
            # A refusal is no state change: never fsynced, and a repeat is only counted.
            quiet = all(e["type"] == ev.CLAIM_REJECTED for e in events)
            if events and not (quiet and self._refusals.absorb(events, now.wall)):
                owed = self._refusals
                if (not quiet and owed.pending()) or owed.due(now.wall):
                    events = (*owed.take(), *events)
                # Group commit: write under the lock, fdatasync after releasing it, so the
                # flushes of concurrent writers overlap and share one ext4 journal commit.
                self._append(list(events), now.wall, sync=False)
                end = self._offset
        finally:
            lock.release()
        if end > start:
            crash_point("journal.before_sync")
            if self.sync and not quiet:
                self._sync_appended(start, end, seq_before)
            crash_point("journal.after_sync")
            if self._checkpoint_due():
                self._checkpoint(unlocked=True)
            self._wrote()
        assert self._state is not None
        return decision, self._state

    def _wait_work(self) -> bool:
        """While waiting for the lock: apply what others appended meanwhile (no lock needed, as
        for readers), so the critical section is left with at most the holder's own lines.
        True when there was work (then the waiter need not yield its CPU)."""
        if self._state is None:
            return False
        seen = self._offset
        try:
            self._catch_up(writer=False)
        except FleetclaimsError:
            self._drop_state()  # the locked path reloads and reports real damage
            return False
        return self._offset != seen

    def _sync_appended(self, start: int, end: int, seq_before: int) -> None:
        """Make our appended bytes [start, end) durable before acknowledging them.

        fdatasync flushes every dirty byte of the file, so an acknowledged line never follows
        a line that could vanish on power loss. On failure nothing is acknowledged and there is
        no retry: if nobody appended after us we cut our lines off again, else (others built on
        them, and their own fdatasync reports the same error) we only refuse further use. Nor
        do we cut them off when a snapshot already covers them (a locked checkpoint, such as
        doctor's, may have read them): the snapshot would be left ahead of the journal.
        """
        try:
            osc.fdatasync(self._fd)
        except OSError as exc:
            undone = undo_unsynced(self._fd, self._lock, start, end,
                                   lambda: snapshot_seq(self.snapshot_path) > seq_before)
            raise self._poison(DurabilityError("making the journal durable" + undone,
                                               str(self.journal_path), exc)) from exc

    def read(self) -> State:
        with self._mutex:
            if self._poisoned is not None:
                raise self._poisoned
            try:
                self._ensure_open()
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

    # --- catching up -------------------------------------------------------------------------

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
        if writer and self._rebuild_owed:
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
                return self._state  # nothing new: EOF or the preallocated (zero) space
        if self._state is None:
            self._load(writer=writer)
            assert self._state is not None
            if self._fd < 0:  # no journal yet: nothing to read (readers never create one)
                return self._state
        self._consume(writer=writer)
        return self._state

    def _drop_state(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
        self._state = None
        self._offset = 0
        self._padding_checked = False
        self._rebuild_owed = False

    def _load(self, *, writer: bool) -> None:
        self._rebuild_owed = False
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
            problem = anchor_problem(self._fd, snapshot)
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
        if snapshot is not None and snapshot.state.seq > self._state.seq:
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

    def _consume(self, *, writer: bool) -> None:
        """Apply complete journal lines after our offset; repair a torn tail when writing."""
        state = self._state
        assert state is not None
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

    # --- writing -----------------------------------------------------------------------------

    def _create_journal(self) -> None:
        self._open_journal(create=True)
        # Remember that this registry has a journal (generation >= 1): if it ever vanishes, a
        # reader reports damage instead of an empty registry.
        self._lock.bump_generation()
        self._generation = self._lock.generation()
        self._state = State()
        self._offset = 0
        if self.sync:
            fsutil.fsync_dir(self.directory)

    def _append(self, events: list[dict[str, Any]], ts: float, *, sync: bool = True) -> None:
        state = self._state
        assert state is not None
        data, sealed = seal_events(events, state.seq, state.head, ts)
        start = self._offset
        try:
            if time.monotonic() - self._last_write < rest.IDLE:
                # Busy: keep zero-filled space ahead (a one-shot write just extends the file).
                if not self._padded:
                    self._padded = True
                    rest.share_padding(self._fd)
                self._alloc = preallocate(self._fd, self._alloc, start + len(data),
                                          sync=self.sync)
            self._last_write = time.monotonic()
            write_at(self._fd, data, start)
            crash_point("journal.after_write")
            if self.sync and sync:
                osc.fdatasync(self._fd)
        except OSError as exc:
            self._fail_append(exc, start)
        if sync:
            crash_point("journal.after_sync")
        for obj in sealed:
            ev.apply(state, obj)
        self._offset = start + len(data)

    def _fail_append(self, exc: OSError, start: int) -> None:
        """Undo a write that was not made durable, then refuse further writes from this handle.

        After a failed fsync the page cache cannot be trusted to hold what we wrote, so we do not
        retry: we cut the journal back to the last acknowledged byte and stop.
        """
        what = "appending to the journal"
        try:
            cut_back(self._fd, self._lock, start, sync=self.sync)
        except OSError:
            what += " (and undoing it)"
        raise self._poison(DurabilityError(what, str(self.journal_path), exc)) from exc

    def _repair_tail(self, offset: int, tail: bytes) -> None:
        """A writer died mid-line: keep its bytes in quarantine, cut them off, record it."""
        name = fsutil.quarantine_bytes(
            self.directory, JOURNAL, tail, "torn journal tail",
            sync=self.sync,
            extra={"offset": offset, "after_seq": self._state.seq if self._state else 0},
        ).name
        crash_point("repair.after_quarantine")
        try:
            osc.ftruncate(self._fd, offset)
            if self.sync:
                osc.fsync(self._fd)
            self._alloc = offset
        except OSError as exc:
            self._fail_append(exc, offset)
        crash_point("repair.after_truncate")
        self._offset = offset
        self._append(
            [{"type": ev.JOURNAL_TAIL_REPAIRED, "actor": "fleetclaims", "offset": offset,
              "bytes": len(tail), "quarantined": name}],
            self.clock.now().wall,
        )

    def _rebuild_snapshot(self, problem: str) -> None:
        quarantined = None
        if os.path.lexists(self.snapshot_path):
            quarantined = fsutil.quarantine_file(
                self.directory, self.snapshot_path, f"snapshot unusable: {problem}", sync=self.sync
            ).name
        crash_point("rebuild.after_quarantine")
        assert self._state is not None
        self._append(
            [{"type": ev.REGISTRY_REBUILT, "actor": "fleetclaims", "reason": problem,
              "quarantined": quarantined, "claims": []}],
            self.clock.now().wall,
        )
        self._checkpoint()

    def _checkpoint_due(self) -> bool:
        tail = self._offset - self._snap_offset
        if tail > max(CHECKPOINT_MIN_TAIL, self._snap_size // CHECKPOINT_DIVISOR):
            return True
        # While busy, claims.json lags the head by at most ~IDLE seconds: once a second, unless
        # another writer checkpointed within that second.
        now = time.monotonic()
        if not self._snap_mono:  # (a one-shot write leaves this to settle)
            self._snap_mono = now
        if tail <= 0 or now - self._snap_mono < rest.IDLE:
            return False
        self._snap_mono = now
        try:
            return time.time() - os.stat(self.snapshot_path).st_mtime >= rest.IDLE
        except OSError:
            return True

    def _wrote(self) -> None:
        """After a write: the idle keeper settles this handle once it has been quiet."""
        self._dirty = True
        keeper = self._keeper
        if keeper is not None and keeper.pid == self._pid:
            keeper.touch()
            return
        self._keeper = rest.IdleKeeper(self)
        rest.settle_at_exit(self)

    def _late_checkpoint(self) -> None:
        """In a settle child: catch up with what others wrote meanwhile, then checkpoint."""
        with self._lock.held():
            self._catch_up(writer=False)
        self._checkpoint(unlocked=True)

    def settle(self, *, wait: bool, defer: bool = False) -> None:
        """Leave the files at rest: the counted refusals recorded, the padding trimmed (unless
        another live writer uses it), claims.json at the journal head. Best effort."""
        if not self._mutex.acquire(blocking=wait):
            return
        try:
            if (self._poisoned is not None or self._pid != os.getpid() or self._fd < 0
                    or self._state is None or not self._dirty):
                return  # (a handle that only read leaves the files as they are)
            if time.monotonic() - self._last_write < rest.IDLE and not wait:
                return  # written meanwhile: the keeper tries again later
            with self._lock.held():
                self._catch_up(writer=True)
                owed = self._refusals.take()
                self._refusals.forget()
                if owed:
                    self._append(owed, self.clock.now().wall, sync=False)
                if self._padded or self._alloc > self._offset:
                    if rest.trim_padding(self._fd, self._offset):
                        self._alloc = self._offset
                    self._padded = False
            self._last_write = -1e9  # the next write starts unpadded (one-shot)
            self._dirty = False
            if self._offset > self._snap_offset:
                if defer and self._keeper is not None:
                    self._keeper.stop(join=True)  # (a settle child is forked only alone)
                    self._keeper = None
                if not (defer and self._snap_size >= rest.DEFER_MIN and rest.fork_settler(
                        self._lock.fd, str(self.journal_path), (self._fd, self._lock.fd),
                        self._late_checkpoint)):
                    self._checkpoint(unlocked=True)
        except (OSError, FleetclaimsError) as exc:
            import logging

            logging.getLogger("fleetclaims").warning(
                "fleetclaims: leaving %s at rest failed: %s", self.location, exc)
        finally:
            self._mutex.release()

    def _checkpoint(self, *, unlocked: bool = False) -> None:
        """Write the snapshot by temp file + fsync + rename + directory fsync. Best effort: the
        journal already holds everything, so a failure here is logged, not raised.

        ``unlocked``: written after releasing the registry lock (writers are not stalled by a
        large snapshot). Our state is consistent at our offset, whose bytes are durable; a
        concurrent checkpoint of another process may race us, so we never replace a snapshot
        that is already newer than ours."""
        assert self._state is not None
        data = encode_snapshot(self._state, self._offset)
        try:
            written = write_snapshot(self.directory, self.snapshot_path, data, sync=self.sync,
                                     unless_seq=self._state.seq if unlocked else None)
        except (OSError, FleetclaimsError) as exc:
            self.last_checkpoint_error = exc if isinstance(exc, OSError) else OSError(str(exc))
            import logging  # imported on this rare path only (~4 ms of a cold command)

            logging.getLogger("fleetclaims").warning(
                "fleetclaims: checkpoint of %s skipped: %s", self.location, exc
            )
            return
        if not written:  # a newer snapshot is there already
            self._snap_offset = self._offset
            return
        self._snap_offset = self._offset
        self._snap_size = len(data)
        self.last_checkpoint_error = None

    def _sweep_temp_files(self) -> None:
        self._swept_temps = True
        sweep_temp_files(self.directory)

    def checkpoint(self) -> None:
        """Write a snapshot now (used by tests, doctor and benchmarks)."""
        with self._mutex:
            if self._poisoned is not None:
                raise self._poisoned
            try:
                self._ensure_open()
                with self._lock.held():
                    self._catch_up(writer=True)
                    self._checkpoint()
            except OSError as exc:
                raise self._io_failure("checkpointing the registry", exc) from exc

    # --- reading events ----------------------------------------------------------------------

    def iter_events(self, after: int = 0) -> Iterator[dict[str, Any]]:
        with self._mutex:
            state = self.read()
            end = self._offset
            if self._fd < 0 or after >= state.seq:
                return iter(())
            fd = os.dup(self._fd)
        return events_after(fd, str(self.journal_path), after, end)

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
            return verify_fd(fd, str(self.journal_path), progress=progress, snapshot=snapshot,
                             snapshot_problem=problem)
        finally:
            os.close(fd)

    # --- migration and repair ----------------------------------------------------------------

    def import_events(self, lines: list[bytes]) -> None:
        """Write a whole journal of already-sealed lines into an empty registry."""
        with self._mutex:
            self._ensure_open()
            with self._lock.held():
                if os.path.lexists(self.journal_path) and os.path.getsize(self.journal_path) > 0:
                    raise ValidationError(
                        "target", f"{self.location} already holds a registry; migrate into an "
                        "empty directory")
                self._drop_state()
                self._open_journal(create=True)
                data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
                try:
                    write_at(self._fd, data, 0)
                    osc.fdatasync(self._fd)
                except OSError as exc:
                    self._fail_append(exc, 0)
                fsutil.fsync_dir(self.directory)
                self._drop_state()
                self._catch_up(writer=True)
                self._checkpoint()
