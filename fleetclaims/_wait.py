"""Waiting for work without polling: ``claim(..., wait=)`` and ``claim_next(..., wait=)``.

A waiter tries once (recording its refusal, as any refused claim is recorded), then sleeps until
the registry changes and tries again, quietly: later attempts are decided on a read of the
state first and take the write lock only when they can win, and a refusal they still meet is
not recorded. So a wait records at most one refusal, however long it lasts.

What wakes a waiter:
- the file store on Linux: inotify on the registry directory (via ctypes, no dependency); every
  journal append wakes every waiter within a millisecond or two. A lease running out or an
  owner dying is not an append, so a waiter also looks again every ``RECHECK`` seconds.
- elsewhere (macOS, PostgreSQL, no inotify): a bounded backoff from ``BACKOFF_START`` doubling
  to ``BACKOFF_MAX`` seconds; each look is one read of the state (no lock, nothing written).

Fairness: a woken waiter asks for the write lock like everyone else; on the main thread the file
store blocks in ``flock``, which the kernel wakes when the lock is let go, so a process that
releases and re-claims in a tight loop does not starve a waiter (tests/test_wait.py measures it).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .core.errors import ClaimConflict, FleetclaimsError, TaskNotReady, ValidationError
from .core.rules import Decision

if TYPE_CHECKING:
    from .core.model import Now
    from .core.state import State
    from .store.base import Store


class Registry(Protocol):
    """What a wait needs of ``fleetclaims.Registry``: its store and its one transaction."""

    @property
    def store(self) -> Store: ...

    def _run(self, decide: Callable[[State, Now], Decision]) -> tuple[Decision, State]: ...

    def _now(self) -> Now: ...

WAIT_MAX = 7 * 86400.0  # the longest wait accepted: a week (a typo of units is refused)
RECHECK = 1.0  # with inotify: look again at least this often (expiries write nothing)
BACKOFF_START = 0.01  # without inotify: the first sleep, doubled after each look ...
BACKOFF_MAX = 0.5  # ... up to this (the latency a waiter may add, measured in test_wait.py)

# inotify(7) masks: a file in the directory written, closed after writing, created, renamed in.
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
WAITABLE = (ClaimConflict, TaskNotReady)


_local = threading.local()


@contextlib.contextmanager
def continued() -> Iterator[None]:
    """Waits in this block continue an earlier one that recorded its refusal already (the MCP
    server waits in slices): they record none."""
    _local.continued = True
    try:
        yield
    finally:
        _local.continued = False


class Stopped(Exception):
    """A wait in a ``stoppable`` block was told to stop before it tried again; ``refusal``
    is the last refusal it met (None when it met none)."""

    def __init__(self, refusal: FleetclaimsError | None) -> None:
        super().__init__("the wait was stopped")
        self.refusal = refusal


@contextlib.contextmanager
def stoppable(stop: threading.Event) -> Iterator[None]:
    """Waits in this block end once ``stop`` is set, raising ``Stopped`` instead of trying
    again (the MCP server: its client cancelled the call or went away, and a claim must not
    be made for nobody). A wait notices within ``RECHECK`` seconds (0.5 without inotify)."""
    _local.stop = stop
    try:
        yield
    finally:
        _local.stop = None


def check_wait(value: object) -> float | None:
    """``wait`` as seconds (None: do not wait); refused when not a number in [0, a week]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= WAIT_MAX:
        raise ValidationError("wait", f"must be a number of seconds from 0 to {WAIT_MAX:.0f}",
                              value=value)
    return float(value)


class Watcher:
    """Sleeps until the watched directory changes (inotify) or, without it, backs off."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.fd = -1 if directory is None else _inotify(os.fspath(directory))
        self._sleep = BACKOFF_START

    @property
    def inotify(self) -> bool:
        return self.fd >= 0

    def wait(self, timeout: float) -> None:
        timeout = max(0.0, timeout)
        if self.fd < 0:
            time.sleep(min(timeout, self._sleep))
            self._sleep = min(self._sleep * 2, BACKOFF_MAX)
            return
        ready, _, _ = select.select([self.fd], [], [], min(timeout, RECHECK))
        if ready:
            self._drain()

    def _drain(self) -> None:
        try:
            while os.read(self.fd, 65536):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _inotify(directory: str) -> int:
    """An inotify descriptor watching ``directory``, or -1 where there is none."""
    import sys

    if not sys.platform.startswith("linux"):
        return -1
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return -1
    if fd < 0:
        return -1
    mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
    if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
        os.close(fd)  # a vanished directory, no watches left: back off instead
        return -1
    return fd


def watched_directory(reg: Registry) -> Path | None:
    """The directory whose changes mean the registry changed (the file store's), else None."""
    journal = getattr(reg.store, "journal_path", None)
    return Path(journal).parent if journal is not None else None


def _quiet(decide: Callable[[State, Now], Decision]) -> Callable[[State, Now], Decision]:
    """``decide`` whose refusals record nothing (this wait already recorded one)."""

    def quiet(state: State, now: Now) -> Decision:
        decision = decide(state, now)
        if decision.error is not None:
            return Decision((), decision.error)
        return decision

    return quiet


def transact(
    reg: Registry,
    decide: Callable[[State, Now], Decision],
    wait: float | None,
    *,
    found: Callable[[Decision], bool] = lambda d: True,
) -> tuple[Decision, State]:
    """``reg._run(decide)``, and with ``wait`` retried until it succeeds (a decision without a
    waitable error for which ``found`` holds) or ``wait`` seconds have passed. On time out the
    last refusal is raised (or the last decision returned, when ``found`` said no)."""
    if wait is None:
        return reg._run(decide)
    deadline = time.monotonic() + wait
    last: tuple[Decision, State] | None = None
    refusal: FleetclaimsError | None = None
    stop: threading.Event | None = getattr(_local, "stop", None)
    with Watcher(watched_directory(reg)) as watcher:
        attempt = _quiet(decide) if getattr(_local, "continued", False) else decide
        while True:
            if stop is not None and stop.is_set():  # checked right before every attempt
                raise Stopped(refusal)
            try:
                if attempt is not decide and not _could_win(reg, decide, found):
                    raise _NotYet
                last = reg._run(attempt)
                if found(last[0]):
                    return last
            except (_NotYet, *WAITABLE) as exc:
                if not isinstance(exc, _NotYet):
                    refusal = exc
                if time.monotonic() >= deadline:
                    if isinstance(exc, _NotYet):
                        return last if last is not None else reg._run(attempt)
                    raise
            attempt = _quiet(decide)
            left = deadline - time.monotonic()
            if left <= 0:
                return last if last is not None else reg._run(attempt)
            watcher.wait(left)


class _NotYet(Exception):
    """A read says the attempt would not succeed: wait without taking the lock."""


def _could_win(reg: Registry, decide: Callable[[State, Now], Decision],
               found: Callable[[Decision], bool]) -> bool:
    """Whether ``decide`` over a read of the state (no lock, nothing written) succeeds."""
    try:
        decision = decide(reg.store.read(), reg._now())
    except FleetclaimsError:
        return True  # let the real attempt raise it, typed
    if decision.error is not None:
        return not isinstance(decision.error, WAITABLE)
    return found(decision)

