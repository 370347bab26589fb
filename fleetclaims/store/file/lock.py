"""The registry's write lock on ``claims.lock`` (never deleted).

The descriptor stays open for the life of the store, so an uncontended acquire is one
``flock`` call (what filelock's ``lock_descriptor`` does). Contended waits matter for tail latency:
polling in coarse steps makes waiters miss the moment the lock is free, so on the main thread
we block in the kernel (woken as soon as the holder releases) with an interval timer as the
timeout, and elsewhere poll in fine, growing steps.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from ...core.errors import RegistryBusy, UnsafeRegistry
from .fsutil import open_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


# filelock's lock_descriptor/unlock_descriptor are flock(LOCK_EX|LOCK_NB) on POSIX and
# LockFileEx on Windows. Where fcntl exists we make the same call directly: importing filelock
# costs a cold CLI command ~10 ms (a third of its budget left after the interpreter).
def _try_lock(fd: int) -> bool:
    if fcntl is None:  # pragma: no cover - Windows
        from filelock import lock_descriptor

        return lock_descriptor(fd, blocking=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if fcntl is None:  # pragma: no cover - Windows
        from filelock import unlock_descriptor

        unlock_descriptor(fd)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


GEN_OFFSET = 128
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
# Yields before sleeping in the kernel. Measured (bench/run.py, 4 processes, 2 CPUs): with
# 0-50 the p99 wait is ~8 ms (a waiter woken by the kernel loses the lock again to the
# releaser and sleeps a whole time slice); with 100-200 it is ~2 ms, at equal throughput.
SPIN = 200
GEN_SIZE = 24
FENCE_OFFSET = GEN_OFFSET + GEN_SIZE + 8  # the fence high-water mark (see fence_mark)
FENCE_SIZE = 24
# What the last anchor written recorded (anchor.py): which anchor file, and whether it carried
# the user's key's seal. An anchor deleted or overwritten with junk is then told from one that
# was never written (a new registry, one made before anchors, one moved or copied elsewhere).
ANCHOR_OFFSET = FENCE_OFFSET + FENCE_SIZE + 8
ANCHOR_SIZE = 256


class _Timeout(Exception):
    pass


def _raise_timeout(signum: int, frame: FrameType | None) -> None:
    raise _Timeout


class RegistryLock:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.fd = -1
        # Work decided under the lock that must not run under it (starting a helper process
        # takes ~10 ms): run, in order, right after the next release.
        self.after: list[Callable[[], None]] = []

    def open(self) -> None:
        try:
            self.fd = open_file(self.path, os.O_RDWR, create=True)
        except OSError as exc:
            if exc.errno not in READ_ONLY_ERRNOS:
                raise
            # Read-only review (a read-only mount, a registry we may only read): reading needs
            # no write access to claims.lock; a writer fails later, typed, at its first write.
            self.fd = open_file(self.path, os.O_RDONLY)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        _unlock(self.fd)
        if self.after:
            self._run_after()

    def _run_after(self) -> None:
        jobs, self.after = self.after, []
        for job in jobs:
            job()  # (each job handles its own failures: it is best effort by design)

    def acquire(self, idle: Callable[[], bool] | None = None) -> None:
        """Take the lock; while contended, call ``idle()`` between tries (see ``_wait``)."""
        if not _try_lock(self.fd):
            self._wait(idle)

    def replaced(self) -> bool:
        """Whether the path no longer leads to the claims.lock we hold: removed, renamed over,
        or its folder moved or replaced (a stat of the path, ~3 us: checked before writing a
        file by path, never per operation)."""
        try:
            st = os.stat(self.path)
            own = os.fstat(self.fd)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino)

    def unlinked(self) -> bool:
        """Whether claims.lock was removed, or renamed over, since we opened it: the folder was
        deleted (or replaced) under this handle, whose descriptors then hold files that are no
        longer the registry's, and whose flock excludes nobody who opens it now. One fstat of
        this file (never the journal's: see ``generation``)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return False

    def generation(self) -> int:
        """The journal generation: bumped (under the lock) whenever the journal is replaced or
        cut back, so every handle reloads. Kept here rather than found by stat()ing the
        journal: on current Linux a stat between writes makes every later write update the
        file's timestamps finely, which costs each fdatasync ~60 us (bench/fsync_floor.py)."""
        raw = os.pread(self.fd, GEN_SIZE, GEN_OFFSET)
        digits = raw.strip(b"\0 \n")
        return int(digits) if digits.isdigit() else 0

    def bump_generation(self) -> None:
        os.pwrite(self.fd, str(self.generation() + 1).encode().ljust(GEN_SIZE - 1) + b"\n",
                  GEN_OFFSET)

    def fence_mark(self) -> int:
        """The fence high-water last marked here (at checkpoints): it survives a journal that
        is cut short or replaced while the folder stays, so the next load notices."""
        raw = os.pread(self.fd, FENCE_SIZE, FENCE_OFFSET)
        digits = raw.strip(b"\0 \n")
        return int(digits) if digits.isdigit() else 0

    def mark_fence(self, fence: int, *, force: bool = False) -> None:
        """Raise the mark to ``fence`` (only ``force``, a recorded repair, lowers it). Unlocked
        callers may race: the mark may then lag, never lead."""
        if force or fence > self.fence_mark():
            os.pwrite(self.fd, str(fence).encode().ljust(FENCE_SIZE - 1) + b"\n", FENCE_OFFSET)

    def _wait(self, idle: Callable[[], bool] | None = None) -> None:
        # A short spin first: the holder's critical section is tens of microseconds, and
        # yielding the CPU to it is quicker than sleeping in the kernel and being woken late.
        # ``idle`` is work the waiter owes anyway (the file store applies the lines others
        # appended meanwhile); it returns False when there was none, and only then do we yield.
        # Measured (bench/run.py, durability="process", 4 processes, 2 CPUs): yielding alone
        # left the holder ~10,500 ops/s, as the critical section then applied every line
        # written while its owner waited; working while waiting gives ~19,000.
        for _ in range(SPIN):
            if idle is None or not idle():
                os.sched_yield()
            if _try_lock(self.fd):
                return
        if (
            fcntl is not None
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and 0 < self.timeout < 1e6
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
        ):
            self._wait_blocking()
        else:
            self._wait_polling()

    def _wait_blocking(self) -> None:
        assert fcntl is not None
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        try:
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            # The timer may fire just after flock() granted the lock (the handler runs at the
            # next bytecode): we then hold it, and raising would leave it held for good. A
            # last non-blocking try settles it (it succeeds on a lock this descriptor holds).
            if _try_lock(self.fd):
                return
            raise self._busy() from None
        finally:
            signal.signal(signal.SIGALRM, previous)

    def _wait_polling(self) -> None:
        deadline = time.monotonic() + self.timeout
        pause = 0.00005
        while not _try_lock(self.fd):
            if time.monotonic() >= deadline:
                raise self._busy()
            time.sleep(pause)
            pause = min(pause * 1.5, 0.002)

    def _busy(self) -> RegistryBusy:
        # Who holds it, asked of the kernel only now (writing a stamp on every acquisition
        # would cost each operation a syscall to serve this rare message).
        from ...system import flock_holder, pid_exists

        holder = None
        try:
            st = os.fstat(self.fd)
            pid = flock_holder(st.st_dev, st.st_ino)
        except OSError:
            pid = None
        if pid is not None:
            holder = f"pid={pid}" + ("" if pid_exists(pid) else " (exited)")
        return RegistryBusy(str(self.path), self.timeout, holder)


def bump_generation_at(path: Path) -> None:
    """Bump the journal generation in the lock file at ``path`` (the caller holds the lock)."""
    lock = RegistryLock(path, timeout=0)
    lock.open()
    try:
        lock.bump_generation()
    finally:
        lock.close()


def read_anchor_mark(path: Path) -> bytes:
    """The anchor mark of the claims.lock at ``path`` (b"" when there is none or no file)."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except (OSError, UnsafeRegistry):
        return b""
    try:
        return os.pread(fd, ANCHOR_SIZE, ANCHOR_OFFSET)
    except OSError:
        return b""
    finally:
        os.close(fd)


def write_anchor_mark(path: Path, data: bytes) -> None:
    """Write the anchor mark (``data``, one line shorter than ANCHOR_SIZE) into the existing
    claims.lock at ``path``. Raises OSError (the caller's is best effort)."""
    if len(data) >= ANCHOR_SIZE:
        raise ValueError("anchor mark too long")
    fd = open_file(path, os.O_WRONLY)  # (never created here: a removed folder stays removed)
    try:
        os.pwrite(fd, data.ljust(ANCHOR_SIZE - 1) + b"\n", ANCHOR_OFFSET)
    finally:
        os.close(fd)


@contextlib.contextmanager
def swapping(directory: Path, wait: float) -> Iterator[bool]:
    """Hold the registry directory's own flock for the block (yields False when another
    descriptor held it for ``wait`` seconds: a stopped process must not hold the registry up).

    A checkpoint written without the registry lock (a forked child's, the settle helper's)
    checks that the journal it was taken of is still the active one, then renames over
    claims.json; a rotation (under the registry lock) replaces claims.json and then the
    journal. Checked and renamed while a rotation ran between the two, a stale snapshot landed
    on the new journal and the next writer quarantined it (registry_rebuilt on a healthy busy
    registry). Both hold this lock across their check-and-rename and replace-and-switch. A
    flock on the directory: no file of its own, held per open descriptor (a POSIX record lock
    is dropped when its process closes any descriptor of the file), excluding two handles of
    one process too."""
    if fcntl is None:  # pragma: no cover - Windows
        yield True
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        yield True  # (the folder is gone: the caller's own checks refuse what follows)
        return
    try:
        deadline = time.monotonic() + wait
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        yield True
    finally:
        os.close(fd)  # (releases the flock)
