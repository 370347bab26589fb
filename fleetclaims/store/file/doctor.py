"""``fleetclaims doctor``: check a file registry and, only when asked, repair it.

``check(directory, fix=False)`` looks at the directory and file permissions, unsafe files,
stray temp files, quarantined files, the journal (hash chain, seq continuity, events that apply,
torn tail) and the snapshot (checksum, anchor, and its claims against a replay of the journal).

Repairs (``fix=True``) never delete data: whatever is replaced is first copied or moved to
``quarantine/`` with a note saying what it was and what was lost.

- torn tail: the store's own repair (quarantine the bytes, truncate, record the repair);
- journal broken in the middle: keep the verified prefix, quarantine the whole original;
- snapshot ahead of the journal, or journal missing: keep the verified prefix and append a
  ``registry_rebuilt`` event carrying the snapshot's claim and work-queue records, quarantining
  both originals;
- snapshot damaged or disagreeing with the journal: quarantine it and write a new one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ...core import events as ev
from ...core.chain import envelope, seal
from ...core.errors import AuditCorrupt, FleetclaimsError, RegistryCorrupt
from ...core.model import Claim
from ...core.ports import ClaimView
from ...core.state import State
from ...system import SystemClock
from . import fsutil
from .journal import apply_checked
from .lock import RegistryLock, bump_generation_at
from .reader import CHUNK, JournalReader, first_nul, iter_lines
from .snapshot import TMP_PREFIX, Snapshot, SnapshotError, decode_snapshot
from .store import JOURNAL, LOCK, SNAPSHOT, FileStore

ERROR = "error"
WARNING = "warning"
INFO = "info"
DOCTOR_TMP = "audit.jsonl.tmp-doctor-"


@dataclass
class Finding:
    kind: str
    message: str
    fixed: bool = False
    severity: str = ERROR
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "message": self.message,
                "fixed": self.fixed, **({"details": self.details} if self.details else {})}


@dataclass
class DoctorReport:
    directory: str
    findings: list[Finding] = field(default_factory=list)
    fix: bool = False

    @property
    def ok(self) -> bool:
        """True when nothing is left to repair (informational findings do not count)."""
        return all(f.fixed or f.severity == INFO for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 5

    def add(self, kind: str, message: str, severity: str = ERROR, **details: Any) -> Finding:
        finding = Finding(kind, message, severity=severity, details=details)
        self.findings.append(finding)
        return finding

    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "ok": self.ok, "fix": self.fix,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class _Journal:
    """What one pass of the reader over the journal found (nothing of it is kept in memory but
    the state: doctor is linear in time and memory)."""

    path: Path
    exists: bool = False
    size: int = 0  # of the file, with its unused (zero) space
    data_end: int = 0  # where the data ends (its first NUL byte); known when broken
    good_end: int = 0  # end of the verified, applicable prefix
    state: State = field(default_factory=State)
    snap_claims: ClaimView | None = None  # the replay's claims at the snapshot's seq
    snap_anchor: str | None = None  # hash of the verified line ending at the snapshot offset
    break_seq: int | None = None
    break_offset: int | None = None
    break_reason: str | None = None
    torn: int = 0


def check(directory: str | os.PathLike[str], fix: bool = False) -> DoctorReport:
    """Check the registry in ``directory``; repair what can be repaired when ``fix`` is true."""
    path = Path(directory).absolute()
    report = DoctorReport(str(path), fix=fix)
    if not _check_directory(path, report, fix) or not _check_files(path, report, fix):
        return report
    _check_temp_files(path, report, fix)
    _check_quarantine(path, report)
    snapshot, snap_problem = _read_snapshot(path)
    journal = _read_journal(path, snapshot)
    needs_salvage = _check_journal(path, journal, snapshot, report)
    snap_finding = _check_snapshot(path, journal, snapshot, snap_problem, report)
    if not fix:
        return report
    pending = [f for f in report.findings if not f.fixed and f.severity != INFO]
    if not pending:
        return report
    lock = RegistryLock(path / LOCK, timeout=30.0)
    lock.open()
    try:
        with lock.held():
            # Re-read under the lock: a writer may have moved on since the checks above.
            snapshot, snap_problem = _read_snapshot(path)
            journal = _read_journal(path, snapshot)
            if needs_salvage:
                _salvage(path, journal, snapshot, report)
            elif snap_finding is not None and os.path.lexists(path / SNAPSHOT):
                fsutil.quarantine_file(path, path / SNAPSHOT, f"doctor: {snap_finding.kind}",
                                       extra={"finding": snap_finding.message})
        # The store finishes the job: it repairs a torn tail and writes a fresh snapshot.
        store = FileStore(path, clock=SystemClock(), lock_timeout=30.0)
        try:
            store.checkpoint()
        finally:
            store.close()
    finally:
        lock.close()
    after = check(path, fix=False)
    remaining = {f.kind for f in after.findings if f.severity != INFO}
    for finding in report.findings:
        if finding.severity != INFO and finding.kind not in remaining:
            finding.fixed = True
    return report


# --- checks ----------------------------------------------------------------------------------


def _check_directory(path: Path, report: DoctorReport, fix: bool) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        report.add("missing", f"{path} does not exist: there is no registry here", INFO)
        return False
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        report.add("unsafe_directory", f"{path} is not a plain directory (symlink or file); "
                   "fleetclaims refuses it. Move it aside and point fleetclaims elsewhere.")
        return False
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        report.add("foreign_owner", f"{path} is owned by uid {st.st_uid}, not by you; "
                   "fleetclaims refuses it. Use your own registry directory.")
        return False
    if st.st_mode & 0o077:
        finding = report.add("permissions", f"{path} has mode {stat.S_IMODE(st.st_mode):o}; "
                             "a registry directory is private (700)", WARNING)
        if fix:
            os.chmod(path, 0o700)
            finding.fixed = True
    return True


def _check_files(path: Path, report: DoctorReport, fix: bool) -> bool:
    safe = True
    for name in (JOURNAL, SNAPSHOT, LOCK, "quarantine"):
        target = path / name
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            continue
        wanted_dir = name == "quarantine"
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISDIR(st.st_mode) != wanted_dir) or not (
            stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
        ):
            kind = "directory" if wanted_dir else "file"
            report.add("unsafe_file", f"{target} is not a plain {kind} (symlink, FIFO, device "
                       "or wrong type); fleetclaims refuses it. Inspect and move it aside by "
                       "hand: doctor does not touch what it cannot vouch for.")
            safe = False
            continue
        if not wanted_dir and st.st_nlink > 1:
            report.add("unsafe_file", f"{target} has {st.st_nlink} hard links; a registry file has "
                       "one. Copy it and remove the other links by hand.")
            safe = False
            continue
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            report.add("foreign_owner", f"{target} is owned by uid {st.st_uid}, not by you")
            safe = False
            continue
        limit = 0o077 if wanted_dir else 0o177
        if st.st_mode & limit:
            finding = report.add("permissions", f"{target} has mode {stat.S_IMODE(st.st_mode):o}; "
                                 f"expected {'700' if wanted_dir else '600'}", WARNING)
            if fix:
                os.chmod(target, 0o700 if wanted_dir else 0o600)
                finding.fixed = True
    return safe


def _check_temp_files(path: Path, report: DoctorReport, fix: bool) -> None:
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name.startswith((TMP_PREFIX, DOCTOR_TMP)) and entry.is_file(follow_symlinks=False):
            finding = report.add("temp_file", f"stray temp file {entry.name} (left by a writer "
                                 "that died mid-checkpoint or mid-repair)", WARNING)
            if fix:
                fsutil.quarantine_file(path, Path(entry.path), "stray temp file")
                finding.fixed = True


def _check_quarantine(path: Path, report: DoctorReport) -> None:
    qdir = path / "quarantine"
    if not qdir.is_dir() or qdir.is_symlink():
        return
    names = sorted(p.name for p in qdir.iterdir() if not p.name.endswith(".note.json"))
    if names:
        report.add("quarantined", f"{len(names)} file(s) in quarantine/ (damaged bytes kept for "
                   "review; their .note.json says why)", INFO, files=names)


def _read_journal(path: Path, snapshot: Snapshot | None) -> _Journal:
    """One pass of the reader: the verified state, where the chain breaks, and what a check of
    ``snapshot`` needs (the claims at its seq, the line at its offset), taken on the way."""
    out = _Journal(path)
    try:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    except FileNotFoundError:
        return out
    try:
        out.exists = True
        out.size = os.fstat(fd).st_size
        _replay(fd, out, snapshot)
    finally:
        os.close(fd)
    return out


def _replay(fd: int, out: _Journal, snapshot: Snapshot | None) -> None:
    state = out.state
    where = str(out.path / JOURNAL)
    snap_seq, snap_offset = (snapshot.state.seq, snapshot.offset) if snapshot else (-1, -1)
    if snap_seq == 0:
        out.snap_claims = state.claims.copy()
    reader = JournalReader(fd, where)
    broken: AuditCorrupt | None = None
    for offset, _, event in reader.events():
        try:
            apply_checked(state, event, offset, where)
        except AuditCorrupt as exc:
            broken = exc
            break
        out.good_end = reader.offset
        if state.seq == snap_seq:  # (a shallow copy: claims are immutable)
            out.snap_claims = state.claims.copy()
        if reader.offset == snap_offset:
            out.snap_anchor = event["hash"]
    if broken is None and reader.damage is not None:
        broken = reader.corrupt()
    if broken is not None:
        out.break_seq, out.break_offset, out.break_reason = (broken.seq, broken.offset,
                                                             broken.reason)
        out.data_end = first_nul(fd, out.good_end)
        return
    out.torn = len(reader.torn)
    out.data_end = reader.data_end
    # The journal's data ends at its first NUL byte (the rest is preallocated zero space);
    # anything but zeros after that is damage, reported where the zeros begin.
    if reader.junk() is not None:
        out.break_seq, out.break_offset = state.seq + 1, reader.data_end
        out.break_reason = "data after unused (zero) space: lines lost or the file was damaged"


def _read_snapshot(path: Path) -> tuple[Snapshot | None, str | None]:
    try:
        fd = fsutil.open_file(path / SNAPSHOT, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    try:
        data = fsutil.read_all(fd)
    finally:
        os.close(fd)
    try:
        snap = decode_snapshot(data)
        snap.state.claims.materialize()
    except SnapshotError as exc:
        return None, str(exc)
    except RegistryCorrupt as exc:
        return None, exc.reason
    return snap, None


def _check_journal(path: Path, journal: _Journal, snapshot: Snapshot | None,
                   report: DoctorReport) -> bool:
    """Findings about the journal; True when a salvage (rewrite) is needed."""
    if not journal.exists:
        if snapshot is not None or os.path.lexists(path / SNAPSHOT):
            report.add("journal_missing", "the journal is missing but a snapshot exists: "
                       "acknowledged history is gone; --fix starts a new journal that records the "
                       "snapshot's claims")
            return snapshot is not None
        if _lock_generation(path) > 0:
            report.add("journal_missing", "the journal is missing, but this registry had one and "
                       "there is no snapshot to recover from; --fix starts a new journal that "
                       "records the loss (fences restart)")
            return True
        return False
    salvage = False
    if journal.break_seq is not None:
        lost = journal.data_end - journal.good_end
        report.add("journal_corrupt", f"the journal is broken at seq {journal.break_seq}, byte "
                   f"offset {journal.break_offset}: {journal.break_reason}; {lost} bytes after "
                   "the verified prefix; --fix keeps the prefix and quarantines the original",
                   seq=journal.break_seq, offset=journal.break_offset)
        salvage = True
    elif journal.torn:
        report.add("torn_tail", f"the journal ends with {journal.torn} bytes of an incomplete "
                   "line (a writer died mid-append); --fix quarantines and truncates them",
                   WARNING, bytes=journal.torn)
    recovered = _recoverable(journal, snapshot)
    if recovered is not None and recovered.seq > journal.state.seq:
        report.add("snapshot_ahead", f"the snapshot (with the journal lines that chain after it) "
                   f"reaches seq {recovered.seq} but the verified journal ends at seq "
                   f"{journal.state.seq}: acknowledged events are missing from the journal; "
                   "--fix re-records those claims", seq=recovered.seq)
        salvage = True
    return salvage


def _recoverable(journal: _Journal, snapshot: Snapshot | None) -> State | None:
    """The snapshot's state carried forward by the journal lines that chain after its offset
    (what the store itself would load), or None without a usable snapshot."""
    if snapshot is None:
        return None
    state = snapshot.state.copy()
    try:
        fd = fsutil.open_file(journal.path / JOURNAL, os.O_RDONLY)
    except FileNotFoundError:
        return state
    try:
        offset = snapshot.offset
        if offset > os.fstat(fd).st_size or (offset > 0 and os.pread(fd, 1, offset - 1) != b"\n"):
            return state
        reader = JournalReader(fd, JOURNAL, offset=offset, seq=state.seq, prev=state.head)
        for at, _, event in reader.events():
            apply_checked(state, event, at, JOURNAL)
    except AuditCorrupt:
        pass  # (an event that cannot be applied ends what can be carried forward)
    finally:
        os.close(fd)
    return state


def _check_snapshot(path: Path, journal: _Journal, snapshot: Snapshot | None,
                    problem: str | None, report: DoctorReport) -> Finding | None:
    if problem is not None:
        return report.add("snapshot_damaged", f"the snapshot is unreadable: {problem}; --fix "
                          "quarantines it and rebuilds it from the journal")
    if snapshot is None or snapshot.state.seq > journal.state.seq:
        return None  # reported (and repaired) as snapshot_ahead
    seq = snapshot.state.seq
    anchored = seq == 0 and snapshot.offset == 0
    if seq > 0 and journal.exists:
        # The verified line ending at the snapshot offset must be the snapshot's head.
        anchored = journal.snap_anchor == snapshot.state.head
    if not anchored:
        return report.add("snapshot_unanchored", "the snapshot's seq/offset/head do not match the "
                          "journal; --fix quarantines it and rebuilds it from the journal")
    differ = _differing(snapshot.state.claims, journal.snap_claims if seq else None)
    if differ:
        return report.add("snapshot_mismatch", f"the snapshot disagrees with a replay of the "
                          f"journal at seq {seq} on {len(differ)} task(s); --fix rebuilds it",
                          tasks=differ[:20])
    return None


def _differing(actual: ClaimView, expected: ClaimView | None) -> list[str]:
    """The tasks whose claim records differ between two tables, sorted (one claim at a time:
    no second copy of the registry in memory)."""
    tasks = set(actual.tasks())
    if expected is not None:
        tasks.update(expected.tasks())
    differ = []
    for task in tasks:
        a = actual.get(task)
        b = expected.get(task) if expected is not None else None
        if a is None or b is None or (a is not b and a.to_dict() != b.to_dict()):
            differ.append(task)
    return sorted(differ)


# --- repairs ---------------------------------------------------------------------------------


def _sealed_line(seq: int, fields: dict[str, Any], prev: str) -> bytes:
    """One journal line for an event doctor records itself, chained after ``prev``."""
    line, _ = seal(orjson.dumps(envelope(seq, time.time(), fields, prev)))
    return line


def _salvage(path: Path, journal: _Journal, snapshot: Snapshot | None,
             report: DoctorReport) -> None:
    """Keep the verified prefix; re-record a snapshot that is ahead; quarantine originals."""
    fd = -1
    if journal.exists:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    try:
        _salvage_from(path, fd, journal, snapshot, report)
    finally:
        if fd >= 0:
            os.close(fd)


def _salvage_from(path: Path, fd: int, journal: _Journal, snapshot: Snapshot | None,
                  report: DoctorReport) -> None:
    state = journal.state
    extra_lines: list[bytes] = []
    snap_name = None
    recovered = _recoverable(journal, snapshot)
    if recovered is not None and recovered.seq > state.seq:
        snap_name = fsutil.quarantine_file(
            path, path / SNAPSHOT, "doctor: snapshot ahead of the journal",
            extra={"snapshot_seq": recovered.seq, "journal_seq": state.seq},
        ).name
    else:
        recovered = None
    original = None
    carried: list[Claim] = []
    fence_floor = state.fence
    if fd >= 0:
        original = fsutil.quarantine_copy(
            path, JOURNAL, fd, "doctor: journal salvaged",
            extra={"verified_seq": state.seq, "verified_bytes": journal.good_end,
                   "lost_bytes": os.fstat(fd).st_size - journal.good_end,
                   "lost_events": _describe(_pieces(fd, journal.good_end, whole=True)),
                   "break": {"seq": journal.break_seq, "offset": journal.break_offset,
                             "reason": journal.break_reason}},
        ).name
        carried, fence_floor, _ = _carry_forward(state, _pieces(fd, journal.good_end))
    if snap_name is None and (carried or fence_floor > state.fence):
        # Only the verified prefix is kept (DESIGN), but never silently: the claims that the
        # intact lines after the break recorded are named here and in doctor's report, and the
        # fence counter never goes back below a fence that was handed out, so a holder of a
        # claim that was lost is fenced out by whoever claims the task next.
        lost_claims = [{"task": c.task, "owner": c.owner, "fence": c.fence, "state": c.state}
                       for c in carried]
        fields = {
            "type": ev.REGISTRY_REBUILT, "actor": "doctor",
            "reason": f"journal broken at seq {journal.break_seq}; kept the verified prefix "
            f"(seq {state.seq}); {len(lost_claims)} claim records after the break were not "
            "restored (see lost_claims and the quarantined journal)",
            "journal_quarantined": original, "fence_floor": fence_floor,
            "claims": [], "lost_claims": lost_claims[:1000],
        }
        extra_lines.append(_sealed_line(state.seq + 1, fields, state.head))
        if lost_claims:
            shown = ", ".join(f"{c['task']} ({c['owner']}, fence {c['fence']}, {c['state']})"
                              for c in lost_claims[:10])
            more = "" if len(lost_claims) <= 10 else f" and {len(lost_claims) - 10} more"
            report.add("claims_lost", f"not restored (recorded after the break; kept in the "
                       f"quarantined journal): {shown}{more}; their holders will be told they "
                       "no longer hold them, and new claims get higher fences", WARNING,
                       lost=lost_claims[:1000]).fixed = True
    if not journal.exists and recovered is None:
        fields = {
            "type": ev.REGISTRY_REBUILT, "actor": "doctor", "origin": secrets.token_hex(8),
            "reason": "the journal was missing and no snapshot could restore it: a new journal "
            "starts here; claims held before are not known to this registry", "claims": [],
        }
        extra_lines.append(_sealed_line(1, fields, state.head))
    if snap_name is not None and recovered is not None:
        claims = [Claim.to_dict(c) for c in recovered.claims.values()]
        fields = {
            "type": ev.REGISTRY_REBUILT, "actor": "doctor",
            "reason": f"the snapshot (seq {recovered.seq} with the lines chained after it) was "
            f"ahead of the verified journal (seq {state.seq}); its claims and work queue are "
            "re-recorded",
            "quarantined": snap_name, "journal_quarantined": original,
            "origin": recovered.origin, "fence_floor": max(recovered.fence, fence_floor),
            "claims": claims,
        }
        if len(recovered.tasks):
            fields["tasks"] = [t.to_dict() for t in recovered.tasks.values()]
        extra_lines.append(_sealed_line(state.seq + 1, fields, state.head))
    tmp = path / f"{DOCTOR_TMP}{os.getpid()}-{secrets.token_hex(4)}"
    out = fsutil.open_file(tmp, os.O_WRONLY | os.O_EXCL, create=True)
    try:
        for chunk in _prefix_chunks(fd, journal.good_end, extra_lines):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(out)
    os.replace(tmp, path / JOURNAL)
    fsutil.fsync_dir(path)
    bump_generation_at(path / LOCK)  # every open handle reloads the new journal
    if snap_name is None and os.path.lexists(path / SNAPSHOT):
        # Anchored to the old journal (or damaged): rebuilt from the salvaged one.
        fsutil.quarantine_file(path, path / SNAPSHOT, "doctor: journal salvaged")


def _prefix_chunks(fd: int, end: int, extra_lines: list[bytes]) -> Iterator[bytes]:
    """The salvaged journal: the original's bytes [0, end) (the verified prefix), a chunk at a
    time, then doctor's own lines."""
    pos = 0
    while pos < end:
        chunk = os.pread(fd, min(CHUNK, end - pos), pos)
        if not chunk:
            raise OSError(errno.EIO, f"the journal shrank while salvaging it (at byte {pos})")
        pos += len(chunk)
        yield chunk
    yield b"".join(extra_lines)


def _pieces(fd: int, start: int, *, whole: bool = False) -> Iterator[bytes]:
    """The bytes after the verified prefix split at newlines, complete or not: up to the first
    NUL byte (the end of the data), or with ``whole`` to the end of the file, zeros and
    anything after them included (what the quarantine note describes). These bytes failed
    verification, so they are not read as a journal (JournalReader) but as pieces to salvage."""
    if not whole:
        for _, line, _ in iter_lines(fd, start):
            yield line
        return
    pos = start
    pending = b""
    while True:
        chunk = os.pread(fd, CHUNK, pos)
        if not chunk:
            break
        pos += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        yield from lines
    yield pending


def _lock_generation(path: Path) -> int:
    if not (path / LOCK).is_file():
        return 0
    lock = RegistryLock(path / LOCK, timeout=0)
    lock.open()
    try:
        return lock.generation()
    finally:
        lock.close()


def _carry_forward(state: State, lost: Iterable[bytes]) -> tuple[list[Claim], int, dict[str, Any]]:
    """Replay the intact lines after a break onto a copy of the verified state.

    Returns the claims that differ from the verified state, the highest fence seen anywhere
    after the break, and a summary (applied count, skipped seqs). Lines that fail their own
    hash, do not parse or cannot be applied are skipped, never guessed at."""
    from ...core.chain import ChainError, unseal

    replayed = state.copy()
    fence = state.fence
    applied = 0
    skipped: list[Any] = []
    for raw in lost:
        if not raw:
            continue
        try:
            unseal(raw)
            event = orjson.loads(raw)
        except (ChainError, orjson.JSONDecodeError):
            skipped.append(None)
            continue
        if not isinstance(event, dict):
            skipped.append(None)
            continue
        if isinstance(event.get("fence"), int) and not isinstance(event.get("fence"), bool):
            fence = max(fence, event["fence"])
        if isinstance(event.get("fence_floor"), int):
            fence = max(fence, event["fence_floor"])
        try:
            ev.apply(replayed, event)
            applied += 1
        except (KeyError, TypeError, ValueError, AttributeError, FleetclaimsError):
            skipped.append(event.get("seq"))
    changed = [c for c in replayed.claims.values() if state.claims.get(c.task) != c]
    return changed, fence, {"applied": applied, "skipped": skipped}


def _describe(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """What the lost bytes held, as far as their lines parse (for the quarantine note)."""
    out: list[dict[str, Any]] = []
    for line in lines:
        if not line:
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append({"unparseable_bytes": len(line)})
            continue
        if isinstance(event, dict):
            out.append({k: event.get(k) for k in ("seq", "type", "task", "owner", "fence")})
        if len(out) >= 1000:
            out.append({"more": True})
            break
    return out


def main_report(directory: str | os.PathLike[str], fix: bool = False) -> DoctorReport:
    """``check`` that turns fleetclaims errors into findings (for the command line)."""
    try:
        return check(directory, fix=fix)
    except FleetclaimsError as exc:
        report = DoctorReport(str(directory), fix=fix)
        report.add(exc.code, str(exc))
        return report


__all__ = ["DoctorReport", "Finding", "check", "main_report"]
