"""Fault injection seams on the write path.

Production code calls ``osc.<name>(...)`` for each OS call that can fail on the write path and
``crash_point(name)`` at each step where a crash matters. Both are no-ops unless a test arms them:
in-process through ``arm_os_fault``/``set_crash_hook``, or in a child process through the
environment variable ``FLEETCLAIMS_CRASH_AT=point[:n]`` (die by SIGKILL at the n-th arrival).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

CRASH_POINTS = (
    "journal.after_write",  # line written, not yet fdatasync'ed
    "journal.before_sync",  # lock released (others may append), not yet fdatasync'ed
    "journal.after_sync",  # durable, not yet acknowledged
    "snapshot.during_write",  # temp file half written
    "snapshot.after_fsync",  # temp file durable, not renamed
    "snapshot.after_rename",  # renamed, directory not yet fsync'ed
    "repair.after_quarantine",  # torn tail copied to quarantine, journal not yet truncated
    "repair.after_truncate",  # journal truncated, repair event not yet written
    "rebuild.after_quarantine",  # damaged snapshot moved aside, state not yet rebuilt
    "rest.before_trim",  # settling: padding checked free and zero, journal not yet cut
    "rest.after_trim",  # padding cut off, claims.json not yet at the head
    "doctor.after_copies",  # originals copied to quarantine/, nothing replaced yet
    "doctor.before_switch",  # the repaired journal written beside the damage, not renamed
    "doctor.after_switch",  # the repaired journal renamed in place, its snapshot not written
    "doctor.after_repair",  # the repair done, the loss not yet acknowledged (anchor, mark)
    "segment.after_compress",  # sealed segment's gzip temp file durable, not renamed
    "segment.after_seal",  # sealed segment in place, its lines still in audit.jsonl
    "segment.after_snapshot",  # claims.json at the sealed head (offset 0), not switched
    "segment.after_switch",  # empty audit.jsonl in place, generation bumped
    "archive.after_copy",  # archived segments copied (fsynced) to DIR, nothing else changed
    "archive.after_anchor",  # segments/archived.json names them, still in segments/ too
    "archive.after_remove",  # archived segments removed from segments/
    "prune.after_sync",  # a prune's claims_pruned line durable, its caller not told yet
)


class _Faults:
    def __init__(self) -> None:
        self.crash_hook: Callable[[str], None] | None = None
        self.os_faults: dict[str, list[Any]] = {}
        self.counts: dict[str, int] = {}
        env = os.environ.get("FLEETCLAIMS_CRASH_AT")
        if env:
            point, _, nth = env.partition(":")
            target = int(nth or "1")
            seen = {"n": 0}

            def die(name: str) -> None:
                if name == point:
                    seen["n"] += 1
                    if seen["n"] >= target:
                        os.kill(os.getpid(), signal.SIGKILL)

            self.crash_hook = die


FAULTS = _Faults()


def crash_point(name: str) -> None:
    hook = FAULTS.crash_hook
    if hook is not None:
        hook(name)


def set_crash_hook(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(point)`` at every crash point (None: no hook). Garbage is collected before
    a hook is installed, as in ``arm_os_fault``: a handle left unreachable by earlier code,
    finalized during the test, passes crash points on its way out (its close settles it)."""
    if hook is not None:
        gc.collect()
    FAULTS.crash_hook = hook


def arm_os_fault(call: str, nth: int, error: BaseException | Callable[..., Any]) -> None:
    """Make the ``nth`` use (1-based, counted from now) of OS call ``call`` fail with ``error``
    (an exception to raise, or a callable that replaces the call, e.g. for a short write).
    Only the arming thread's uses count: the idle keeper of a handle some earlier test left
    open, settling it in the background, once took a fault meant for the operation under
    test (which then did not fail). Handles left unreachable by earlier code are finalized
    first, for the same reason: a garbage collection during the test runs their ``close`` (it
    settles the files at rest, with an fdatasync) on the arming thread."""
    gc.collect()
    FAULTS.counts[call] = 0
    FAULTS.os_faults[call] = [nth, error, threading.get_ident()]


def disarm() -> None:
    FAULTS.os_faults.clear()
    FAULTS.counts.clear()
    FAULTS.crash_hook = None


class _OS:
    """os functions with an injectable failure on their n-th use."""

    def _call(self, name: str, real: Callable[..., Any], *args: Any) -> Any:
        fault = FAULTS.os_faults.get(name)
        if fault is not None and fault[2] == threading.get_ident():
            FAULTS.counts[name] = FAULTS.counts.get(name, 0) + 1
            if FAULTS.counts[name] == fault[0]:
                error = fault[1]
                if isinstance(error, BaseException):
                    raise error
                return error(*args)
        return real(*args)

    def write(self, fd: int, data: bytes | memoryview, offset: int | None = None) -> int:
        if offset is None:
            return int(self._call("write", os.write, fd, data))
        return int(self._call("write", os.pwrite, fd, data, offset))

    def fsync(self, fd: int) -> None:
        self._call("fsync", os.fsync, fd)

    def fdatasync(self, fd: int) -> None:
        self._call("fdatasync", _fdatasync, fd)

    def replace(self, src: str, dst: str) -> None:
        self._call("replace", os.replace, src, dst)

    def ftruncate(self, fd: int, size: int) -> None:
        self._call("ftruncate", os.ftruncate, fd, size)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return int(self._call("open", os.open, path, flags, mode))


def _fdatasync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
        return
    # macOS: fsync does not reach the platter; F_FULLFSYNC does (falls back to fsync).
    import fcntl

    full = getattr(fcntl, "F_FULLFSYNC", None)
    if full is not None:
        try:
            fcntl.fcntl(fd, full)
            return
        except OSError:
            pass
    os.fsync(fd)


osc = _OS()
