"""The embedded file store: a hash-chained journal, a checkpoint snapshot, one lock file.

Write path (under the lock): catch up on journal bytes this process has not seen (repairing a
torn tail), decide, append the event lines and fdatasync, apply, checkpoint if due, return.
Read path (no lock): snapshot, then journal lines after its offset; incomplete last line ignored.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ...core import events as ev
from ...core.errors import DurabilityError, FleetclaimsError, UnsafeRegistry, ValidationError
from ...core.model import Now
from ...core.rules import Decision
from ...core.state import State
from ...system import Clock, current_pid, fork_safe_mutex, unsafe_filesystem
from ..base import LOCAL_DIRECTORY, Capabilities, Decide
from . import forked, fsutil, rest, rotation
from .catchup import JOURNAL, LOCK, SNAPSHOT
from .faults import crash_point, osc
from .history import History
from .journal import cut_back, preallocate, seal_events, undo_unsynced, write_at
from .lock import RegistryLock
from .reader import JournalReader
from .snapshot import encode_snapshot, snapshot_seq, sweep_temp_files, write_snapshot

# Checkpoint when the journal tail since the last snapshot exceeds max(MIN, snapshot/DIVISOR):
# the snapshot write is then paid for by at least snapshot/DIVISOR bytes of appends, so the
# amortised cost per operation stays constant however many claims there are, and a cold start
# replays at most that much.
CHECKPOINT_MIN_TAIL = 512 * 1024
CHECKPOINT_DIVISOR = 8

# A reader that replayed more journal than this beyond the snapshot leaves a snapshot behind.
REPLAY_SNAPSHOT = 4 * 1024 * 1024

__all__ = ["CHECKPOINT_DIVISOR", "CHECKPOINT_MIN_TAIL", "JOURNAL", "LOCK", "SNAPSHOT", "FileStore"]


class FileStore(History):
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
        self._mutex = fork_safe_mutex(self)
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
        self._forked = (0, 0)  # a forked checkpoint pending: (pid, snapshot offset before it)
        self._fork_job: forked.Job | None = None  # its pipe, then the file to re-base on
        self._padding_checked = False
        self._rebuild_owed = False
        self._swept_temps = False
        self.last_checkpoint_error: OSError | None = None
        self._rest = rest.AtRest()

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
        if not self.allow_unsafe_fs:  # (before anything is created there)
            reason = unsafe_filesystem(self.directory)
            if reason is not None:
                raise UnsafeRegistry(
                    self.location,
                    reason + ": file locks or atomic rename are unreliable there",
                    hint="Use a local directory (FLEETCLAIMS_DIR), or pass allow_unsafe_fs=True / "
                    "--allow-unsafe-fs / FLEETCLAIMS_ALLOW_UNSAFE_FS=1 if you are sure.",
                )
        self.foreign_owner = fsutil.check_directory(self.directory, create=self._create,
                                                    others_ok=True)
        if self.foreign_owner is None:
            self._lock.open()
        else:  # another user's registry: read it, never write to it (see History)
            self._lock.fd = fsutil.open_file(self._lock.path, os.O_RDONLY)
        self._pid = pid

    def _reopen(self) -> None:
        """claims.lock was removed under this handle (the folder deleted or replaced): its files
        are no longer the registry's. Start again from the path, as a new handle would."""
        self._reset_handles()
        self._pid = -1
        self._ensure_open()

    def _reset_handles(self) -> None:
        if self._forked[0] and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                self._reap(block=True)
        self._forked = (0, 0)
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
        self._rest.reset()

    def now(self) -> Now:
        return self.clock.now()

    def peek(self) -> State | None:
        """The state as this handle last read it, without the lock (possibly behind the files;
        for work done before the lock, such as probing a holder's liveness). No I/O but on a
        handle's first use: then it loads, as its first operation would, before the lock."""
        if self._state is None and self._poisoned is None:
            with self._mutex:
                try:
                    self._ensure_open()
                    if self._state is None and self.foreign_owner is None:
                        self._read_ahead()
                except (OSError, FleetclaimsError):
                    return None  # (the operation itself reports it)
        return self._state if self._pid == current_pid() else None

    def close(self) -> None:
        with self._mutex:
            if self._pid == os.getpid():
                with contextlib.suppress(Exception):
                    # (a large checkpoint finishes in a forked child, within IDLE: see rest.py)
                    self.settle(wait=True, defer=True)
                self._reset_handles()
            self._pid = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:  # noqa: SIM105 - no module globals: this may run at interpreter shutdown
            self.close()
        except Exception:
            pass

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

    def _transact(self, decide: Decide, *, reopened: bool = False) -> tuple[Decision, State]:
        self._ensure_open()
        self._refuse_foreign()
        if self._state is None or self._others_wrote:
            self._read_ahead()
        lock = self._lock
        # (not lock.held(): a generator context manager costs ~1 us an op)
        lock.acquire(self._wait_work if self._state is not None else None)
        if not reopened and lock.unlinked():  # (our folder was removed or replaced)
            lock.release()
            self._reopen()
            return self._transact(decide, reopened=True)
        mine: list[dict[str, Any]] = []  # our sealed lines, applied after releasing the lock
        try:
            seen = self._offset
            state = self._catch_up(writer=True)
            self._others_wrote = self._offset != seen
            if not self._rest.trim_checked:  # the opener removes a crashed writer's padding
                self._rest.trim_checked = True
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
            quiet = decision.error is not None and all(
                e["type"] == ev.CLAIM_REJECTED for e in events)
            owed = self._rest.refusals
            if events and not (quiet and owed.absorb(events, now.wall)):
                if owed.counted and (not quiet or owed.due(now.wall)):
                    events = (*owed.take(), *events)
                # Group commit: write under the lock, fdatasync after releasing it, so the
                # flushes of concurrent writers overlap and share one ext4 journal commit.
                mine = self._append(list(events), now.wall, sync=False, defer=True)
                end = self._offset
        finally:
            try:
                lock.release()
            finally:
                if mine:
                    self._apply_own(mine)
        if end > start:
            crash_point("journal.before_sync")
            if self.sync and not quiet:
                self._sync_appended(start, end, seq_before)
            crash_point("journal.after_sync")
            if self._checkpoint_due():
                self._checkpoint_soon()
            self._rest.wrote(self, self._pid)
        assert self._state is not None
        return decision, self._state

    def _read_ahead(self) -> None:
        """Before taking the lock, as a reader (readers need none): load, or replay a long
        journal, while other writers go on; else apply what others appended since our last
        operation, which under contention is most of the work a writer does for others. The
        critical section is then left with the last few lines. (Skipped while nobody else
        writes: it would only cost two syscalls an operation.)"""
        try:
            self._catch_up(writer=False)
        except FleetclaimsError:
            self._drop_state()  # the locked path reloads and reports real damage

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

    def _append(self, events: list[dict[str, Any]], ts: float, *, sync: bool = True,
                defer: bool = False) -> list[dict[str, Any]]:
        """Seal and write ``events`` after our offset, then apply them; with ``defer`` return
        them unapplied instead (``_apply_own``, after releasing the lock: applying our own
        lines needs no lock, and other writers wait for it no longer)."""
        state = self._state
        assert state is not None
        data, sealed = seal_events(events, state.seq, state.head, ts, state.claims)
        start = self._offset
        try:
            if self._rest.busy():
                # Keep zero-filled space ahead (a one-shot write just extends the file).
                if not self._rest.padded:
                    self._rest.padded = True
                    rest.share_padding(self._fd)
                self._alloc = preallocate(self._fd, self._alloc, start + len(data),
                                          sync=self.sync)
            write_at(self._fd, data, start)
            crash_point("journal.after_write")
            if self.sync and sync:
                osc.fdatasync(self._fd)
        except OSError as exc:
            self._fail_append(exc, start)
        if sync:
            crash_point("journal.after_sync")
        self._offset = start + len(data)
        if defer:
            return sealed
        self._apply_own(sealed)
        return []

    def _apply_own(self, sealed: list[dict[str, Any]]) -> None:
        """Apply the lines we just wrote (our offset is already past them); should that fail,
        drop the state, so the next operation reloads rather than lag behind its offset."""
        state = self._state
        assert state is not None
        try:
            for obj in sealed:
                ev.apply(state, obj)
        except BaseException:
            self._drop_state()
            raise

    def _fail_append(self, exc: OSError, start: int) -> None:
        """Undo a write that was not made durable, then refuse further writes from this handle.
        After a failed fsync the page cache cannot be trusted to hold what we wrote, so we do not
        retry: we cut the journal back to the last acknowledged byte and stop. (A journal this
        process may only read was written nothing: AccessDenied, the handle reads on.)"""
        fsutil.refuse_read_only(self._fd, self.location, exc)
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
        self._before_rebuild()  # a foreign or cut journal is refused, the snapshot kept
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
        if self._fork_job is not None:  # (a forked checkpoint: reaped, adopted when done)
            forked.poll(self)
        tail = self._offset - self._snap_offset
        if tail > (bound := max(CHECKPOINT_MIN_TAIL, self._snap_size // CHECKPOINT_DIVISOR)):
            return forked.checkpoint_owed(self, tail, bound)  # (or another writer's stands in)
        return tail > 0 and self._rest.checkpoint_late(self.snapshot_path)

    def read(self) -> State:
        with self._mutex:
            state = super().read()
            if self._offset - self._snap_offset > REPLAY_SNAPSHOT:
                self._leave_snapshot()
            return state

    def _leave_snapshot(self) -> None:
        """A reader that replayed a long journal (no snapshot, or one far behind) leaves its
        state as claims.json, so the next process does not replay it again. Only a verified
        state, never over a snapshot owed to quarantine, and only where we may write; written
        as a writer's checkpoint after its lock is released (never replacing a newer one)."""
        if (self.damage is not None or self._rebuild_owed or self._fd < 0
                or self._state is None or self.foreign_owner is not None
                or not os.access(self.directory, os.W_OK)):
            return
        if self.sync:  # what we read may not be flushed yet: the snapshot must not lead
            try:
                os.fdatasync(self._fd)
            except OSError:
                return
        self._checkpoint(unlocked=True)

    def lagging(self) -> bool:
        """Whether claims.json is behind what this handle has read of the journal."""
        return self._offset > self._snap_offset

    def settle(self, *, wait: bool, defer: bool = False) -> bool:
        """Leave the files at rest: the counted refusals recorded, the padding trimmed (unless
        another live writer uses it), claims.json at the journal head. Best effort; False when
        the handle was in use (the idle keeper tries again)."""
        if not self._mutex.acquire(blocking=wait):
            return False
        try:
            at = self._rest
            if (self._poisoned is not None or self._pid != os.getpid() or self._fd < 0
                    or self._state is None or not at.dirty or self._lock.unlinked()):
                return True  # (only read, or the folder is gone: nothing of ours to settle)
            if not (wait or at.quiet()):
                return True  # written meanwhile: the keeper waits for quiet again
            with self._lock.held():
                self._catch_up(writer=True)
                if wait:  # (a rotation whose snapshot a child writes: finished)
                    rotation.settle(self, block=True)
                owed = at.refusals.take()
                if owed:
                    self._append(owed, self.clock.now().wall, sync=False)
                if (at.padded or self._alloc > self._offset) and rest.trim_padding(
                        self._fd, self._offset):
                    self._alloc = self._offset
            at.settled()
            if self._forked[0]:
                self._reap(block=wait)
            if self.sync and self._offset > self._snap_offset:
                osc.fdatasync(self._fd)  # (others' lines just read: no mirror may lead them)
            if self._offset > self._snap_offset and not (
                    defer and self._snap_size >= rest.DEFER_MIN
                    and rest.spawn_settler(str(self.directory), self._lock.fd)):
                if wait:
                    self._checkpoint(unlocked=True)
                else:  # the idle keeper: an operation arriving now must not wait for it
                    self._checkpoint_soon()
            if not self._forked[0]:  # (a forked child mirrors what it writes)
                self._after_checkpoint()  # at the head also when no checkpoint is written here
        except (OSError, FleetclaimsError) as exc:
            import logging

            logging.getLogger("fleetclaims").warning(
                "fleetclaims: leaving %s at rest failed: %s", self.location, exc)
        finally:
            self._mutex.release()
        return True

    def _checkpoint_soon(self) -> None:
        """A checkpoint after the lock is released: a large one by a forked child (see
        rest.FORK_MIN), at most one at a time, so the operation that triggers it returns at
        once; a small one here."""
        if self._forked[0] and not self._reap(block=False):
            return  # the last one is still being written: due again once it is done
        if self._fork_job is not None and not forked.adopt(self, self._fork_job):
            return  # the file the last child wrote is still being read: adopted first
        big = (self._snap_size >= rest.FORK_MIN  # (or no snapshot yet behind a long journal)
               or self._offset - self._snap_offset > REPLAY_SNAPSHOT)
        pid = forked.fork(self, self._checkpoint_child) if big else 0
        if pid:
            self._forked = (pid, self._snap_offset)
            self._snap_offset = self._offset  # (put back if the child fails)
            return
        self._checkpoint(unlocked=True)

    def _checkpoint_child(self) -> bool:  # (no logging in the child: the parent does)
        data = self._checkpoint(unlocked=True, quiet=True)
        return forked.report(self._fork_job, data, self.last_checkpoint_error)

    def _reap(self, *, block: bool) -> bool:
        """Whether no forked checkpoint is pending any more (waits for it when ``block``);
        the parent re-bases on the file its child wrote (forked.py) now or at the next due."""
        pid, before = self._forked
        done = rest.reaped(pid, block=block)
        if done is None:
            return False
        self._forked = (0, 0)
        job = self._fork_job
        if forked.collect(self, job, done):
            with contextlib.suppress(OSError):
                self._snap_size = os.path.getsize(self.snapshot_path)
            if job is not None and block:
                forked.adopt(self, job, wait=True)
                self._fork_job = None
        else:  # failed (logged): owed again
            self._fork_job = None
            self._snap_offset = min(self._snap_offset, before)
        return True

    def _checkpoint(self, *, unlocked: bool = False, quiet: bool = False) -> bytes | None:
        """Write the snapshot by temp file + fsync + rename + directory fsync; the bytes written
        or None. Best effort: the journal holds everything; a failure is logged (not ``quiet``).

        ``unlocked``: written after releasing the registry lock (writers are not stalled by a
        large snapshot). Our state is consistent at our offset, whose bytes are durable; a
        concurrent checkpoint of another process may race us, so we never replace a snapshot
        that is already newer than ours."""
        assert self._state is not None
        data = encode_snapshot(self._state, self._offset)
        try:
            written = write_snapshot(self.directory, self.snapshot_path, data, sync=self.sync,
                                     unless_seq=self._state.seq if unlocked else None,
                                     unless=forked.moved_since(self),
                                     guard=self.directory if unlocked else None)
        except (OSError, FleetclaimsError) as exc:
            again = str(self.last_checkpoint_error) == str(exc)  # (told once, not every op)
            self.last_checkpoint_error = exc if isinstance(exc, OSError) else OSError(str(exc))
            if not quiet and not again:
                import logging  # imported on this rare path only (~4 ms of a cold command)

                logging.getLogger("fleetclaims").warning(
                    "fleetclaims: checkpoint of %s skipped: %s", self.location, exc
                )
            return None
        if not written:  # a newer snapshot is there already
            self._snap_offset = self._offset
            return None
        self._snap_offset = self._offset
        self._snap_size = len(data)
        self.last_checkpoint_error = None
        self._after_checkpoint()
        return data

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
