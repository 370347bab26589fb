"""The registry at rest: what a writer undoes when it goes quiet, and refusals kept small.

While a writer is busy it keeps zero-filled space ahead of the journal's data (appends then
overwrite allocated blocks: ~50% cheaper fdatasyncs) and checkpoints lazily. At rest (no write
for ``IDLE`` seconds, ``close()``, interpreter exit) the files are what a person expects:
``claims.json`` reflects the journal head and ``audit.jsonl`` ends with its last line.

Padding is shared: a writer that preallocated holds a shared ``flock`` on its journal
descriptor until it settles. Whoever settles trims the padding only when it can take that flock
exclusively: nobody else is using the space (a crashed writer's flock died with it), so the
last writer to go quiet, or the next opener after a crash, removes it. Trimming takes the
registry lock and never bumps the generation: others' lines all end before the cut, and a
handle that thought the space was allocated simply extends the file with its next append.

Refusals (``claim_rejected``) are not state changes: they are appended without an fsync, and
a requester refused the same task again by the same holder is counted in memory, then recorded
as one line with ``count``, ``first`` and ``last`` (see ``Refusals``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from ...core import events as ev
from ...system import background_priority
from .faults import crash_point, osc

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

IDLE = 1.0  # seconds without a write after which a handle settles
REFUSAL_FLUSH = 30.0  # a pending count of repeated refusals is recorded at least this often


def share_padding(fd: int) -> None:
    """Mark the padding of the journal open at ``fd`` as in use by this handle."""
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)


def trim_padding(fd: int, end: int) -> bool:
    """Cut the journal at ``end`` (the end of its last complete line; the caller holds the
    registry lock and has caught up) unless another live handle uses the space beyond it.
    Drops this handle's share either way. True when the file now ends at ``end``."""
    size = os.fstat(fd).st_size
    if size <= end:
        release_padding(fd)
        return True
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            release_padding(fd)
            return False
    try:
        # Only zeros may go: anything else is damage, for the reader to report.
        if os.pread(fd, min(size - end, 1 << 20), end).strip(b"\0"):
            return False
        crash_point("rest.before_trim")
        osc.ftruncate(fd, end)
        crash_point("rest.after_trim")
        return True
    finally:
        release_padding(fd)


def release_padding(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)


class Settles(Protocol):
    def settle(self, *, wait: bool, defer: bool = False) -> bool: ...


# Handles to settle at interpreter exit (a CLI command's end, a script that never closes).
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()
_atexit_registered = False


def _settle_all() -> None:
    for store in list(_OPEN):
        with contextlib.suppress(Exception):
            store.settle(wait=True, defer=True)


def settle_at_exit(store: Settles) -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_settle_all)
        _atexit_registered = True
    _OPEN.add(store)


class IdleKeeper:
    """One daemon thread per busy handle: after ``IDLE`` seconds without a write it settles
    the handle (a long-lived process, e.g. an MCP server or ``hold()``, leaves the files at rest
    between operations). The hot path only stores a timestamp (``touch``)."""

    def __init__(self, store: Settles) -> None:
        self._store = weakref.ref(store)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.last = time.monotonic()
        self.sleeping = False
        self._settled = -1.0  # ``last`` as of the last settle
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="fleetclaims-idle", daemon=True)
        self._thread.start()

    def touch(self, when: float) -> None:
        self.last = when
        if self.sleeping:  # (it looks at ``last`` again after saying so: no lost wake-up)
            self._wake.set()

    def stop(self, *, join: bool = False) -> None:
        self._store = lambda: None  # type: ignore[assignment]
        self._stopped.set()
        self._wake.set()
        if join and threading.current_thread() is not self._thread:
            self._thread.join(0.5)

    def _run(self) -> None:
        while True:
            self.sleeping = True
            if self.last <= self._settled:  # nothing written since: sleep until a write
                self._wake.wait()
            self._wake.clear()
            self.sleeping = False
            while True:  # until IDLE seconds passed without a write
                left = self.last + IDLE - time.monotonic()
                if left <= 0:
                    break
                if self._stopped.wait(left):
                    return
            store = self._store()
            if store is None:
                return
            mark = self.last
            try:
                done = store.settle(wait=False)
            except Exception as exc:
                import logging

                logging.getLogger("fleetclaims").warning("fleetclaims: settling failed: %s", exc)
                done = True
            del store
            if done:
                self._settled = mark
            elif self._stopped.wait(0.05):  # the handle was busy (a read): try again shortly
                return


# A one-shot process (a CLI command) does not rewrite a large claims.json on its way out: that
# costs a cold command on 10,000 claims ~20 ms of CPU (encoding and hashing ~4 MB). It starts a
# settle helper instead (a fresh interpreter: forking the parent was measured dearer still, its
# copy-on-write faults at exit cost the parent ~40 ms), which checkpoints once the journal has
# been quiet for a moment, within IDLE of the last write. At most one helper is pending: it
# holds a POSIX record lock on one byte of claims.lock (independent of the registry's flock)
# until it starts catching up; a writer that finds it held knows its lines will be included.
DEFER_MIN = 256 * 1024  # snapshot size above which a one-shot process defers its checkpoint
SETTLE_BYTE = 1 << 20
_QUIET = 0.2


def helper_pending(lock_fd: int) -> bool:
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SETTLE_BYTE)
    except OSError:
        return True
    fcntl.lockf(lock_fd, fcntl.LOCK_UN, 1, SETTLE_BYTE)
    return False


def spawn_helper(argv: list[str], env: Mapping[str, str]) -> int:
    """Start a helper interpreter (``argv`` after the executable) in a session of its own (it
    may outlive us, and a terminal's signals are not meant for it), its stdio on /dev/null;
    its pid, or 0 when none could be started. posix_spawn copies none of this process's
    memory: ~1 ms, where subprocess took 10-17 ms of a writer holding 100,000 claims."""
    if not hasattr(os, "posix_spawn"):  # pragma: no cover
        return 0
    null = os.devnull
    try:
        return os.posix_spawn(sys.executable, [sys.executable, *argv], env, setsid=True,
                              file_actions=[(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                                            (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                                            (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0)])
    except (OSError, TypeError, NotImplementedError, AttributeError):
        return 0


def spawn_settler(directory: str, lock_fd: int) -> bool:
    """Leave the checkpoint to a settle helper; False when none could be started."""
    if fcntl is None:  # pragma: no cover
        return False
    if helper_pending(lock_fd):
        return True
    return spawn_helper(["-m", __spec__.name, directory], os.environ) != 0


def _settle_helper(directory: str) -> int:
    """The helper: wait until the journal is quiet, then checkpoint if claims.json lags."""
    background_priority(10, session=True)
    from pathlib import Path

    from .store import JOURNAL, LOCK

    fd = os.open(Path(directory) / LOCK, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SETTLE_BYTE)
    except OSError:
        return 0  # another helper is pending
    deadline = time.monotonic() + IDLE - 2 * _QUIET
    while True:
        time.sleep(_QUIET)
        quiet = time.time() - os.stat(Path(directory) / JOURNAL).st_mtime
        if quiet >= _QUIET or time.monotonic() >= deadline:
            break
    # Released before catching up: a write after this point starts a helper of its own.
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, SETTLE_BYTE)
    checkpoint_lagging(directory)
    return 0


def checkpoint_lagging(directory: str) -> None:
    """claims.json brought to the journal head this process reads, if it lags: written
    without the registry lock (a writer that started meanwhile must not wait ~0.3 s for
    100,000 claims to be encoded: it did, 300 ms operations at 100,000 claims) and never
    over a newer snapshot."""
    from ...system import SystemClock
    from .store import FileStore

    store = FileStore(directory, clock=SystemClock(), create=False)
    try:
        store.read()
        if store.lagging():
            with store._mutex:  # (unlocked: see FileStore._leave_snapshot)
                store._leave_snapshot()
    finally:
        store.close()


# A busy writer's checkpoint of a large snapshot (encoding 100,000 claims costs ~0.35 s of CPU)
# is made by a forked child: a copy-on-write image of the state at the writer's offset, taken
# after the registry lock is released in ~5 ms, so no operation waits for the encoding.
FORK_MIN = 1 << 20  # snapshot bytes above which a checkpoint is forked off


def fork_safe() -> str | None:
    """Why forking a checkpoint child is not safe here, or None. Off when FLEETCLAIMS_NO_FORK
    is set, where there is no fork, off Linux (macOS system libraries are not fork-safe), and
    when the process runs native threads Python does not know of (a gRPC or database driver
    pool could hold a lock the child would need): the checkpoint is then made in process."""
    if os.environ.get("FLEETCLAIMS_NO_FORK", "") not in ("", "0"):
        return "FLEETCLAIMS_NO_FORK is set"
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return "no fork on this platform"
    from ...system import foreign_threads

    foreign = foreign_threads()
    if foreign is None:
        return "the process's threads cannot be listed"
    if foreign:
        return "native threads unknown to Python"
    return None


def fork_worker(work: Any, *, faults_ok: bool = False) -> int:
    """Run ``work()`` (True: done) in a forked child that exits when it returns; the child's
    pid, or 0 when this process cannot fork (``fork_safe``; faults armed by a test: crash
    points must fire in the process under test, unless ``faults_ok``: those of the work
    are then not armed in the child), and then the caller does the work itself. The child
    never returns into the host: no atexit handler, finalizer or buffered output of the host
    runs there (``os._exit``), the host's signal handlers are reset, and ``work`` must take
    no lock another thread of the host may hold."""
    from .faults import FAULTS

    if fork_safe() is not None or FAULTS.os_faults or (
            not faults_ok and FAULTS.crash_hook is not None):
        return 0
    import warnings

    try:
        with warnings.catch_warnings():  # (3.12+ warns of forking a threaded process: the
            warnings.simplefilter("ignore", DeprecationWarning)  # child only runs ``work``)
            pid = os.fork()
    except OSError:
        return 0
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            import gc
            import signal

            gc.disable()  # (a collection would copy every page it touches)
            background_priority(10)  # (on a busy machine the writer it was forked from goes first)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            FAULTS.crash_hook = None  # (faults_ok: the crash points are the parent's)
            code = 0 if work() else 1
        finally:
            os._exit(code)
    return pid


REAP_WAIT = 10.0  # seconds a blocking reap waits before it kills a stuck worker


def reaped(pid: int, *, block: bool) -> bool | None:
    """The forked worker's outcome: True done, False failed, None still running. Blocking,
    it waits at most ``REAP_WAIT`` seconds, then kills the worker (a child forked from a
    threaded process might hang on a lock another thread held) and says failed."""
    deadline = time.monotonic() + REAP_WAIT
    pause = 0.001
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return False  # reaped by someone else (a SIGCHLD handler): assume the worst
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if not block:
            return None
        if time.monotonic() >= deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class Refusals:
    """Repeated refusals of one requester for one task by one holder, counted in memory.

    The first refusal of a key is appended (unsynced) as today; later ones within
    ``REFUSAL_FLUSH`` seconds only count. ``due``/``take`` hand the counted ones back as one
    ``claim_rejected`` line with ``count``, ``first`` and ``last``."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], list[Any]] = {}  # key -> [event, count, first, last]
        self.counted = 0  # repeats counted and not yet recorded (0 on the hot path: one test)

    @staticmethod
    def key(event: dict[str, Any]) -> tuple[Any, ...]:
        return (event.get("task"), event.get("actor"), event.get("holder"), event.get("fence"),
                event.get("reason"))

    def absorb(self, events: tuple[dict[str, Any], ...], wall: float) -> bool:
        """True when ``events`` (one refusal) repeats a recorded one and was counted."""
        if len(events) != 1 or events[0].get("type") != ev.CLAIM_REJECTED:
            return False
        key = self.key(events[0])
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = [events[0], 0, wall, wall]
            return False
        seen[1] += 1
        self.counted += 1
        if seen[1] == 1:
            seen[2] = wall
        seen[3] = wall
        return True

    def due(self, wall: float) -> bool:
        return any(s[1] and wall - s[2] >= REFUSAL_FLUSH for s in self._seen.values())

    def take(self) -> list[dict[str, Any]]:
        """The coalesced lines owed (their counts start again from zero)."""
        out = []
        for seen in self._seen.values():
            event, count, first, last = seen
            if count:
                out.append({**event, "count": count, "first": first, "last": last})
                seen[1] = 0  # the key stays known: the next repeat is counted again
        self.counted = 0
        return out

    def forget(self) -> None:
        """At rest: the next refusal of any key is recorded in full again."""
        self._seen.clear()
        self.counted = 0


class AtRest:
    """One store handle's at-rest bookkeeping: when it last wrote, whether it shares padding,
    whether it owes a settle, its idle keeper and the refusals it counts."""

    def __init__(self) -> None:
        self.last_write = -1e9  # monotonic
        self.padded = False
        self.trim_checked = False  # the opener's look for a crashed writer's padding
        self.dirty = False  # wrote since the last settle
        self.keeper: IdleKeeper | None = None
        self.refusals = Refusals()
        self._snap_mono = 0.0

    def busy(self) -> bool:
        """Whether this handle wrote within IDLE (then padding pays for itself); marks a write."""
        now = time.monotonic()
        busy, self.last_write = now - self.last_write < IDLE, now
        return busy

    def quiet(self) -> bool:
        return time.monotonic() - self.last_write >= IDLE

    def checkpoint_late(self, snapshot: Any) -> bool:
        """While busy, claims.json lags the head by at most ~IDLE seconds: True once a second,
        unless another writer checkpointed within that second. A one-shot write never is."""
        now = self.last_write  # (read by busy() for the write just made)
        if not self._snap_mono:
            self._snap_mono = now
        if now - self._snap_mono < IDLE:
            return False
        self._snap_mono = now
        try:
            return time.time() - os.stat(snapshot).st_mtime >= IDLE
        except OSError:
            return True

    def wrote(self, store: Settles, pid: int) -> None:
        """After a write: the idle keeper settles the handle once it has been quiet."""
        self.dirty = True
        keeper = self.keeper
        if keeper is not None and keeper.pid == pid:
            keeper.touch(self.last_write)
            return
        self.keeper = IdleKeeper(store)
        settle_at_exit(store)

    def settled(self) -> None:
        self.last_write = -1e9  # the next write starts unpadded (one-shot)
        self.dirty = self.padded = False
        self.refusals.forget()

    def stop(self, *, join: bool = False) -> None:
        if self.keeper is not None:
            self.keeper.stop(join=join)
            self.keeper = None

    def reset(self) -> None:
        self.stop()
        self.padded = self.trim_checked = False


if __name__ == "__main__":  # the settle helper (spawn_settler)
    import sys

    with contextlib.suppress(Exception):
        sys.exit(_settle_helper(sys.argv[1]))
    sys.exit(1)

__all__ = [
    "DEFER_MIN",
    "FORK_MIN",
    "IDLE",
    "REAP_WAIT",
    "REFUSAL_FLUSH",
    "AtRest",
    "IdleKeeper",
    "Refusals",
    "fork_safe",
    "fork_worker",
    "reaped",
    "release_padding",
    "settle_at_exit",
    "share_padding",
    "spawn_helper",
    "spawn_settler",
    "trim_padding",
]
