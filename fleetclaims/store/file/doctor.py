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

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ...core.errors import FleetclaimsError, HistoryLost, RegistryCorrupt, SegmentDamaged
from ...core.ports import ClaimView
from ...system import SystemClock, pid_exists
from . import anchor, doctor_history, fsutil, reserialised, seams, segments
from .faults import crash_point
from .lock import RegistryLock
from .salvage import DOCTOR_TMP, JournalScan, recoverable, salvage, scan_journal
from .snapshot import TMP_PREFIX, Snapshot, SnapshotError, claim_records, decode_snapshot
from .store import JOURNAL, LOCK, SNAPSHOT, FileStore

T = TypeVar("T")

ERROR = "error"
SEGMENT_DAMAGED = "segment_damaged"
#: what repairs damaged sealed history (doctor --fix does not: it never rewrites it)
SEALED_FIX = ("--fix does not rewrite sealed history: put the original segment back from a "
              "backup or the archive directory (`fleetclaims audit verify --with DIR` checks an "
              "archive), then run `fleetclaims audit verify`")
WARNING = "warning"
INFO = "info"


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


def check(directory: str | os.PathLike[str], fix: bool = False) -> DoctorReport:
    """Check the registry in ``directory``; repair what can be repaired when ``fix`` is true."""
    path = Path(directory).absolute()
    report = DoctorReport(str(path), fix=fix)
    if not _check_directory(path, report, fix) or not _check_files(path, report, fix):
        if not path.exists():
            doctor_history.check(path, JournalScan(path), None, report)
        return report
    _check_temp_files(path, report, fix)
    _check_quarantine(path, report)
    # Examined under the registry lock: a writer appending meanwhile (over its preallocated
    # zeros) or checkpointing made a healthy busy registry look broken ("data after unused
    # space", "snapshot ahead"), and --fix then salvaged it. Writers wait for the scan.
    examine = RegistryLock(path / LOCK, timeout=30.0)
    examine.open()
    try:
        with examine.held():
            generation = examine.generation()
            snapshot, snap_problem = _read_snapshot(path)
            journal: JournalScan | None = scan_journal(path, snapshot)
            assert journal is not None
            needs_salvage = _check_journal(path, journal, snapshot, report)
            snap_finding = _check_snapshot(path, journal, snapshot, snap_problem, report)
            history_fix = doctor_history.check(path, journal, snapshot, report)
    finally:
        examine.close()
    if not fix:
        return report
    pending = [f for f in report.findings if not f.fixed and f.severity != INFO]
    if not pending:
        return report
    if all(f.kind == SEGMENT_DAMAGED for f in pending):
        # Nothing doctor may do: sealed history is restored from a copy, and no write (not even
        # a checkpoint, which could rotate onto it) is made over it.
        raise SegmentDamaged(str(path / segments.DIRNAME), seq=pending[0].details["seq"],
                             offset=0, reason=pending[0].details["reason"])
    lock = RegistryLock(path / LOCK, timeout=30.0)
    lock.open()
    try:
        with lock.held():
            # Re-read under the lock: a writer may have moved on since the checks above. (The
            # old copies are let go first: two need not be in memory at once.)
            snapshot = None
            if not _same_break(path, journal, generation, lock.generation()):
                journal = None
                journal = scan_journal(path, None)
            done = False
            if history_fix and doctor_history.foreign_origin(
                    journal, _read_snapshot(path)[0]) is not None:
                # Another registry's journal over ours: kept aside; our snapshot restores.
                doctor_history.quarantine_foreign(path, report)
                journal = None
                journal = scan_journal(path, None)
                needs_salvage = True
            # (a tool re-serialises every line: the first one fails, or it is not one)
            if needs_salvage and journal.break_seq == 1 and reserialised.repair(path, report):
                needs_salvage, history_fix = False, True  # (the note is acknowledged below)
            if needs_salvage:
                done = salvage(path, journal, _read_snapshot(path)[0], report)
            elif snap_finding is not None and os.path.lexists(path / SNAPSHOT):
                fsutil.quarantine_file(path, path / SNAPSHOT, f"doctor: {snap_finding.kind}",
                                       extra={"finding": snap_finding.message})
            crash_point("doctor.after_repair")
            if needs_salvage or history_fix:
                # What was recorded outside the journal (anchor, fence mark) and is not in it
                # any more is named in it, and fences go on above it.
                if not (journal.salvaged and needs_salvage):
                    journal = None
                    journal = scan_journal(path, None)
                doctor_history.acknowledge(path, lock, journal)
        journal = snapshot = None  # what the store and the check below load is theirs
        if not done:
            # The store finishes the job: it repairs a torn tail and writes a fresh snapshot.
            # (A salvage wrote the snapshot of the journal it wrote.)
            store = FileStore(path, clock=SystemClock(), lock_timeout=30.0)
            try:
                store.checkpoint()
            except HistoryLost:
                pass  # reported: nothing of this registry's to restore (init --new-history)
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


def _same_break(path: Path, journal: JournalScan, before: int, now: int) -> bool:
    """Whether a scan from before the lock still holds: it found a break, and the journal is
    the same file at the same generation. Its verified prefix and the break in it are then
    unchanged (the journal is append-only; whatever cuts it back or replaces it bumps the
    generation), and a salvage reads what follows the prefix from the file itself."""
    if journal.break_seq is None or not journal.exists or before != now:
        return False
    try:
        st = os.lstat(path / JOURNAL)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == journal.ident


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
    me = fsutil.euid()
    if me is not None and st.st_uid != me:
        report.add("foreign_owner", f"{path} is owned by uid {st.st_uid}, not by you (uid "
                   f"{me}): it can be read (claims, get, explain, audit) but not written or "
                   "repaired by you. Run doctor as its owner, or use your own registry.")
        return False
    if st.st_mode & 0o077:
        # (advice, not damage: a directory the user made keeps its mode; exit 0)
        finding = report.add("permissions", f"{path} has mode {stat.S_IMODE(st.st_mode):o}; "
                             "a registry directory is best kept private (700; --fix sets it)",
                             INFO)
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
            pid = entry.name.removeprefix(TMP_PREFIX).split("-", 1)[0]
            if entry.name.startswith(TMP_PREFIX) and pid.isdigit() and pid_exists(int(pid)):
                continue  # a live writer's checkpoint in progress (written outside the lock)
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
        del data
        # Every entry must convert; checked one at a time and not kept (the snapshot stays
        # lazy: its entries as read take a fraction of the memory of Claim objects).
        for _ in claim_records(snap.state.claims):
            pass
    except SnapshotError as exc:
        return None, str(exc)
    except RegistryCorrupt as exc:
        return None, exc.reason
    return snap, None


def _check_journal(path: Path, journal: JournalScan, snapshot: Snapshot | None,
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
    sealed = _sealed_damage(path, journal)
    if (sealed is not None or (journal.break_seq is not None and segments.before_active(
            path, journal.break_seq))) and not _journal_stranger(path):
        # Sealed history is restored from a copy, never rewritten: the journal is not cut back
        # (or quarantined) in favour of a segment that does not chain into it.
        seq = sealed.seq if sealed is not None else journal.break_seq
        reason = _bare(sealed.reason if sealed is not None else journal.break_reason or "")
        reason += _foreign_note(journal, snapshot)
        report.add(SEGMENT_DAMAGED, f"the sealed history (segments/) is missing or damaged at "
                   f"seq {seq}: {reason}; {SEALED_FIX}", seq=seq, reason=reason, fix=SEALED_FIX)
        return False
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
    recovered = None if _foreign_snapshot(journal, snapshot) else recoverable(journal, snapshot)
    if recovered is not None and recovered.seq > journal.state.seq:
        report.add("snapshot_ahead", f"the snapshot (with the journal lines that chain after it) "
                   f"reaches seq {recovered.seq} but the verified journal ends at seq "
                   f"{journal.state.seq}: acknowledged events are missing from the journal; "
                   "--fix re-records those claims", seq=recovered.seq)
        salvage = True
    return salvage


def _check_snapshot(path: Path, journal: JournalScan, snapshot: Snapshot | None,
                    problem: str | None, report: DoctorReport) -> Finding | None:
    if problem is not None:
        return report.add("snapshot_damaged", f"the snapshot is unreadable: {problem}; --fix "
                          "quarantines it and rebuilds it from the journal")
    if snapshot is not None and _foreign_snapshot(journal, snapshot):
        return report.add("snapshot_foreign", f"the snapshot claims.json belongs to registry "
                          f"{snapshot.state.origin}, not to this registry ({journal.state.origin}, "
                          "as its journal and anchor say): another registry's snapshot; --fix "
                          "quarantines it (its claims are not adopted) and rebuilds the snapshot "
                          "from the journal", origin=snapshot.state.origin)
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


def _foreign_snapshot(journal: JournalScan, snapshot: Snapshot | None) -> bool:
    """Whether ``snapshot`` is another registry's: its origin is not the journal's, and the
    anchor names the journal's (without an anchor, doctor_history takes the snapshot's origin
    for ours and the journal for the stranger)."""
    if snapshot is None or journal.break_seq is not None:
        return False
    theirs, ours = snapshot.state.origin, journal.state.origin
    if not theirs or not ours or theirs == ours:
        return False
    found = anchor.read(journal.path)
    return found is not None and found.origin == ours


def _sealed_damage(path: Path, journal: JournalScan) -> SegmentDamaged | None:
    """Where the sealed segments do not form one chain with the journal (seams.broken): a
    segment missing, swapped, another registry's, or edited and re-sealed within itself."""
    if not journal.exists:
        return None
    return _on_journal(path, lambda fd: seams.broken(path, fd), None)


def _journal_stranger(path: Path) -> bool:
    """At a break between the sealed history and audit.jsonl: whether audit.jsonl is the
    stranger, lacking the anchor's line (seq and hash) that comes after the sealed segments
    (another registry's journal, or ours cut). Undecided (no anchor, or its line sealed):
    False, the sealed side is blamed, and nothing is rewritten."""
    found = anchor.read(path)
    if found is None:
        return False
    return _on_journal(
        path, lambda fd: seams.journal_holds(path, fd, found.seq, found.head) is False, False)


def _on_journal(path: Path, look: Callable[[int], T], unreadable: T) -> T:
    """``look`` at audit.jsonl through a descriptor of it opened read-only; ``unreadable``
    when it cannot be opened."""
    try:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    except OSError:
        return unreadable
    try:
        return look(fd)
    finally:
        os.close(fd)


def _bare(reason: str) -> str:
    """A reason without the "audit journal broken at seq N: " an error puts before it."""
    return re.sub(r"^(audit journal broken at seq \d+(, byte offset \d+)?: )+", "", reason)


def _foreign_note(journal: JournalScan, snapshot: Snapshot | None) -> str:
    ours = doctor_history.foreign_origin(journal, snapshot)
    if ours is None:
        return ""
    return (f" (the sealed history names registry {journal.state.origin}, not this registry "
            f"{ours}: another registry's segment)")


def _differing(actual: ClaimView, expected: ClaimView | None) -> list[str]:
    """The tasks whose claim records differ between two tables, sorted (one claim at a time:
    no second copy of the registry in memory)."""
    differ = []
    seen = set()
    for task, claim in claim_records(actual):
        seen.add(task)
        other = expected.get(task) if expected is not None else None
        if other is None or claim.to_dict() != other.to_dict():
            differ.append(task)
    if expected is not None:
        differ.extend(task for task in expected.tasks() if task not in seen)
    return sorted(differ)


# --- repairs ---------------------------------------------------------------------------------


def _lock_generation(path: Path) -> int:
    if not (path / LOCK).is_file():
        return 0
    lock = RegistryLock(path / LOCK, timeout=0)
    lock.open()
    try:
        return lock.generation()
    finally:
        lock.close()


def main_report(directory: str | os.PathLike[str], fix: bool = False) -> DoctorReport:
    """``check`` that turns fleetclaims errors into findings (for the command line)."""
    try:
        return check(directory, fix=fix)
    except FleetclaimsError as exc:
        report = DoctorReport(str(directory), fix=fix)
        report.add(exc.code, str(exc))
        return report


__all__ = ["DoctorReport", "Finding", "check", "main_report"]
