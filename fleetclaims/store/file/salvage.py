"""doctor's reading of a journal and its salvage (``fleetclaims doctor --fix``).

``scan_journal`` replays the journal once through the one reader, keeping only the state (and
what a check of the snapshot needs, taken on the way): linear in time and memory however long
the journal is. ``salvage`` keeps the verified prefix of a broken journal, re-records a snapshot
that is ahead of it, names what the lost bytes held, and switches to the result with one rename
(crash-safe at every step: the original stays in place until then and is quarantined first).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...core import events as ev
from ...core.chain import envelope, seal
from ...core.errors import AuditCorrupt, FleetclaimsError
from ...core.model import Claim, Task
from ...core.ports import ClaimView
from ...core.state import State
from . import archive, fsutil, segments
from .faults import crash_point
from .journal import apply_checked
from .lock import bump_generation_at
from .reader import CHUNK, JournalReader, at_archive, at_offset, first_nul, iter_lines
from .snapshot import Snapshot, claim_records, encode_snapshot, write_snapshot
from .store import JOURNAL, LOCK, SNAPSHOT

if TYPE_CHECKING:
    from .doctor import DoctorReport

DOCTOR_TMP = "audit.jsonl.tmp-doctor-"
WARNING = "warning"  # (doctor's severity of a finding)

__all__ = ["DOCTOR_TMP", "JournalScan", "recoverable", "salvage", "scan_journal"]


@dataclass
class JournalScan:
    """What one pass of the reader over the journal found (nothing of it is kept in memory but
    the state: doctor is linear in time and memory)."""

    path: Path
    exists: bool = False
    ident: tuple[int, int] = (0, 0)  # the file read (device, inode)
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
    salvaged: bool = False  # describes the journal salvage wrote (see salvage)


def scan_journal(path: Path, snapshot: Snapshot | None) -> JournalScan:
    """One pass of the reader: the verified state, where the chain breaks, and what a check of
    ``snapshot`` needs (the claims at its seq, the line at its offset), taken on the way."""
    out = JournalScan(path)
    try:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    except FileNotFoundError:
        return out
    try:
        out.exists = True
        st = os.fstat(fd)
        out.size, out.ident = st.st_size, (st.st_dev, st.st_ino)
        _replay(fd, out, snapshot)
    finally:
        os.close(fd)
    return out


def _replay(fd: int, out: JournalScan, snapshot: Snapshot | None) -> None:
    where = str(out.path / JOURNAL)
    if snapshot is not None and (out.path / segments.DIRNAME / archive.ANCHOR).exists():
        # Events were archived (`audit archive`): a replay from seq 1 cannot build the state,
        # claims.json stands for them. The chain is checked from the archive's anchor, as
        # `audit verify` does, and the state is the snapshot's carried on by the lines after
        # it, as the store loads it. (A broken chain: the replay below names the archive.)
        links = JournalReader(fd, where, from_anchor=True)
        mark = (snapshot.state.seq, snapshot.offset, snapshot.state.head)
        for _, _, digest in links.links():
            if links.seq == mark[0] and digest == mark[2] and at_offset(links, mark):
                out.snap_anchor = digest
        if out.snap_anchor is None and at_archive(links, mark):
            out.snap_anchor = mark[2]
        if links.damage is None and not links.torn:
            out.state = snapshot.state.copy()
            out.snap_claims = out.state.claims.copy()
            _apply_lines(fd, out, JournalReader(fd, where, offset=snapshot.offset,
                                                seq=snapshot.state.seq,
                                                prev=snapshot.state.head), -1, -1)
            return
        out.snap_anchor = None
    snap_seq, snap_offset = (snapshot.state.seq, snapshot.offset) if snapshot else (-1, -1)
    if snap_seq == 0:
        out.snap_claims = out.state.claims.copy()
    _apply_lines(fd, out, JournalReader(fd, where), snap_seq, snap_offset)


def _apply_lines(fd: int, out: JournalScan, reader: JournalReader, snap_seq: int,
                 snap_offset: int) -> None:
    state = out.state
    where = reader.path
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
        # (the line of the snapshot's seq: a line of a sealed segment reads at offset 0, so
        # an offset alone matched every sealed line of a snapshot at offset 0, and the last
        # one read was taken for its anchor: doctor called a writer killed mid-rotation's
        # registry unanchored while audit verify said anchored)
        if state.seq == snap_seq and at_offset(reader, (snap_seq, snap_offset, event["hash"])):
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


def recoverable(journal: JournalScan, snapshot: Snapshot | None) -> State | None:
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


# Claim (and work-queue) records per registry_rebuilt event when doctor re-records a snapshot
# that was ahead: every process that replays the journal parses a line whole, and a line of
# 100,000 claims (64 MB) takes ~370 MB of memory to parse; 10,000 take ~37 MB. A registry with
# no more records than this gets one event, as before.
RECORDS_PER_EVENT = 10_000


class _Lines:
    """The lines doctor appends to the verified prefix, each chained after the one before and
    applied to the verified state at once, so the state ends as the salvaged journal's (its
    snapshot is written from it) without holding the events (one can carry many claims)."""

    def __init__(self, state: State, offset: int) -> None:
        self.state = state
        self.seq, self.head = state.seq, state.head
        self.offset = offset
        self.lines: list[bytes] = []
        self.applied = True  # False once an apply failed: the store replays and reports it
        self.restored: list[str] = []  # tasks whose completion outlived their grant (keep)
        self.kept_to = 0  # the original seq of the last line kept after a break (keep)

    def add(self, fields: dict[str, Any]) -> None:
        event = envelope(self.seq + 1, time.time(), fields, self.head)
        line, self.head = seal(orjson.dumps(event))
        event["hash"] = self.head
        self.seq += 1
        if self.applied:
            try:
                apply_checked(self.state, event, self.offset, JOURNAL)
            except AuditCorrupt:
                self.applied = False
        self.offset += len(line)
        self.lines.append(line)


    def keep(self, event: dict[str, Any]) -> bool:
        """Keep a verified line of a segment after a break: re-sealed after our head with its
        time and its original hash (``ohash``); False (nothing written) when it cannot be
        applied without the damaged lines."""
        fields = {k: v for k, v in event.items() if k not in ("seq", "ts", "prev", "hash")}
        fields.setdefault("ohash", event["hash"])
        if fields.get("type") == ev.CLAIM_COMPLETED:
            self._restore_completed(event)
        fence = fields.get("fence")
        if (fields.get("type") in ev.GRANTS and type(fence) is int
                and fence > self.state.fence + 1):
            fields["fence_floor"] = fence - 1  # the damaged bytes held the grants between
        sealed = envelope(self.seq + 1, event["ts"], fields, self.head)
        line, digest = seal(orjson.dumps(sealed))
        sealed["hash"] = digest
        try:
            apply_checked(self.state, sealed, self.offset, JOURNAL)
        except AuditCorrupt:
            return False
        self.seq, self.head = self.seq + 1, digest
        self.offset += len(line)
        self.lines.append(line)
        self.kept_to = max(self.kept_to, int(event["seq"]))
        return True

    def _restore_completed(self, event: dict[str, Any]) -> None:
        """A verified completion of a claim granted in the damaged lines (no claim of its fence
        here): the claim is re-recorded from what the completion names (task, owner, fence;
        the grant's other details are lost), so the kept completion leaves the task completed,
        refused to a new claim unless reopened, and the fence high-water at least its fence."""
        task, owner, fence = event.get("task"), event.get("owner"), event.get("fence")
        if not (isinstance(task, str) and isinstance(owner, str) and type(fence) is int
                and type(event.get("ts")) is float):
            return  # (malformed: the apply refuses it, and it stays in quarantine)
        current = self.state.claims.get(task)
        if current is not None and current.fence == fence:
            return  # its grant verified: the completion applies as it is
        claim = Claim(task=task, owner=owner, fence=fence, claimed_at=event["ts"],
                      renewed_at=event["ts"], retired=() if current is None else current.retired)
        self.add({
            "type": ev.REGISTRY_REBUILT, "actor": "doctor",
            "reason": f"{owner}'s claim on {task} (fence {fence}) was granted in the damaged "
            f"journal lines; its completion (seq {event['seq']}) verified and is kept, so the "
            "claim is restored from what the completion names (the grant's details are lost)",
            "claims": [claim.to_dict()], "fence_floor": max(self.state.fence, fence)})
        self.restored.append(task)


def salvage(path: Path, journal: JournalScan, snapshot: Snapshot | None,
            report: DoctorReport) -> bool:
    """Keep the verified prefix; re-record a snapshot that is ahead; quarantine originals; and
    write the salvaged journal's snapshot (so the store need not replay it all again). Returns
    whether that snapshot was written."""
    fd = -1
    if journal.exists:
        fd = fsutil.open_file(path / JOURNAL, os.O_RDONLY)
    state = journal.state
    lines = _Lines(state, journal.good_end)
    try:
        snap_name = None
        recovered = recoverable(journal, snapshot)
        if recovered is not None and recovered.seq > state.seq:
            # A copy, not a move: until the repaired journal is in place (one rename), the
            # snapshot must stay where the next doctor finds it (a kill in between).
            snap_name = _copy_snapshot(path, recovered.seq, state.seq)
        else:
            recovered = None
        original, carried, fence_floor = _quarantine_journal(path, fd, journal)
        if fd >= 0 and journal.break_seq is not None:
            # The verified lines after the break are kept (their history), also when a
            # snapshot ahead is re-recorded below: it only settles the claims they leave off.
            carried = _keep_segments(fd, journal, lines, original, carried, report,
                                     restored=snap_name is not None)
        if snap_name is None and (carried or fence_floor > state.fence):
            lines.add(_record_lost(journal, carried, fence_floor, original, report))
        carried = []  # (can be every claim: let them go)
        if not journal.exists and recovered is None:
            from . import anchor  # keep the registry's identity and its fences (#16)

            known = anchor.read(path)
            lines.add({
                "type": ev.REGISTRY_REBUILT, "actor": "doctor",
                "origin": known.origin if known is not None else secrets.token_hex(8),
                "fence_floor": max(known.fence if known is not None else 0, state.fence),
                "reason": "the journal was missing and no snapshot could restore it: a new "
                "journal starts here; claims held before are not known to this registry",
                "claims": [],
            })
        if snap_name is not None and recovered is not None:
            # (lines kept from beyond the snapshot's seq are newer than it: it then only adds
            # the claims and queued tasks they do not hold, e.g. those of the damaged lines)
            _record_snapshot(lines, recovered, snap_name, original, fence_floor,
                             missing_only=lines.kept_to > recovered.seq)
        snapshot = recovered = None  # no longer needed: let them go before the snapshot below
        crash_point("doctor.after_copies")
        end = _write_journal(path, fd, journal.good_end, lines.lines)
        crash_point("doctor.after_switch")
        lines.lines.clear()
        if lines.applied:  # the scan now describes the salvaged journal (no second pass)
            journal.exists, journal.good_end, journal.size, journal.data_end = True, end, end, end
            journal.break_seq = journal.break_offset = journal.break_reason = None
            journal.torn = 0
            journal.salvaged = True
    finally:
        if fd >= 0:
            os.close(fd)
    if snap_name is not None:
        # (its copy is in quarantine/; the snapshot of the repaired journal replaces it below,
        # or the store rebuilds one from the journal, which holds its claims now)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / SNAPSHOT)
    elif os.path.lexists(path / SNAPSHOT):
        # Anchored to the old journal (or damaged): rebuilt from the salvaged one.
        fsutil.quarantine_file(path, path / SNAPSHOT, "doctor: journal salvaged")
    # The snapshot of the salvaged journal: the verified state plus doctor's own events. (On
    # any failure the store, which checkpoints next, replays the journal and writes it.)
    if not lines.applied:
        return False
    try:
        return write_snapshot(path, path / SNAPSHOT, encode_snapshot(state, end), sync=True)
    except (OSError, FleetclaimsError):
        return False


def _keep_segments(fd: int, journal: JournalScan, lines: _Lines, original: str | None,
                   carried: list[Claim], report: DoctorReport, *, restored: bool) -> list[Claim]:
    """Keep the verified lines after the break (salvage_segments); returns the claims still
    lost (those the kept lines do not restore as they were). ``restored``: a snapshot that
    was ahead re-records every claim afterwards (none is lost)."""
    from .salvage_segments import keep_segments

    counts = keep_segments(fd, journal.good_end, journal.break_seq or journal.state.seq + 1,
                           journal.break_reason or "damaged", original, lines, highest_fence)
    if counts["damaged"] and not restored:
        shown = ", ".join(f"{d['task']} ({d['type']}, seq {d['seq']})"
                          for d in counts["damaged"][:10])
        report.add("claims_lost", f"held by the damaged lines (kept in the quarantined "
                   f"journal): {shown}; new claims get higher fences", WARNING,
                   lost=counts["damaged"][:1000]).fixed = True
    if lines.restored:
        shown = ", ".join(lines.restored[:10])
        more = "" if len(lines.restored) <= 10 else f" and {len(lines.restored) - 10} more"
        report.add("completions_restored", f"completed tasks whose grant was in the damaged "
                   f"lines stay completed (their completion verified): {shown}{more}", WARNING,
                   tasks=lines.restored[:1000]).fixed = True
    if counts["kept"]:
        report.add("segment_kept", f"kept {counts['kept']} verified lines after the damage "
                   f"({counts['breaks']} break(s) recorded as journal_break; "
                   f"{counts['unapplied']} lines that need the damaged ones stay in quarantine)",
                   WARNING, kept=counts["kept"], unapplied=counts["unapplied"],
                   breaks=counts["breaks"]).fixed = True

    def gist(c: Claim | None) -> tuple[Any, ...]:
        return () if c is None else (c.owner, c.fence, c.state, c.phase)

    return [c for c in carried if gist(lines.state.claims.get(c.task)) != gist(c)]


def _copy_snapshot(path: Path, snapshot_seq: int, journal_seq: int) -> str:
    fd = fsutil.open_file(path / SNAPSHOT, os.O_RDONLY)
    try:
        return fsutil.quarantine_copy(
            path, SNAPSHOT, fd, "doctor: snapshot ahead of the journal",
            extra={"snapshot_seq": snapshot_seq, "journal_seq": journal_seq}).name
    finally:
        os.close(fd)


def _quarantine_journal(path: Path, fd: int,
                        journal: JournalScan) -> tuple[str | None, list[Claim], int]:
    """Copy the original journal into quarantine, with a note of what its lost bytes held;
    returns its name, the claims recorded after the break and the highest fence seen."""
    state = journal.state
    if fd < 0:
        return None, [], state.fence
    original = fsutil.quarantine_copy(
        path, JOURNAL, fd, "doctor: journal salvaged",
        extra={"verified_seq": state.seq, "verified_bytes": journal.good_end,
               "lost_bytes": os.fstat(fd).st_size - journal.good_end,
               "lost_events": _describe(_pieces(fd, journal.good_end, whole=True)),
               "break": {"seq": journal.break_seq, "offset": journal.break_offset,
                         "reason": journal.break_reason}},
    ).name
    carried, fence_floor, _ = _carry_forward(state, _pieces(fd, journal.good_end))
    return original, carried, fence_floor


def _record_lost(journal: JournalScan, carried: list[Claim], fence_floor: int,
                 original: str | None, report: DoctorReport) -> dict[str, Any]:
    """Only the verified prefix is kept (DESIGN), but never silently: the claims that the
    intact lines after the break recorded are named here and in doctor's report, and the
    fence counter never goes back below a fence that was handed out, so a holder of a claim
    that was lost is fenced out by whoever claims the task next."""
    state = journal.state
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
    if lost_claims:
        shown = ", ".join(f"{c['task']} ({c['owner']}, fence {c['fence']}, {c['state']})"
                          for c in lost_claims[:10])
        more = "" if len(lost_claims) <= 10 else f" and {len(lost_claims) - 10} more"
        report.add("claims_lost", f"not restored (recorded after the break; kept in the "
                   f"quarantined journal): {shown}{more}; their holders will be told they "
                   "no longer hold them, and new claims get higher fences", WARNING,
                   lost=lost_claims[:1000]).fixed = True
    return fields


def _record_snapshot(lines: _Lines, recovered: State, snap_name: str, original: str | None,
                     fence_floor: int, *, missing_only: bool) -> None:
    """The events re-recording the claims and work queue of a snapshot that was ahead: one, or
    one per RECORDS_PER_EVENT records (applying them is an upsert of each record, so the parts
    add up to the whole). ``missing_only``: only what the salvaged lines do not hold."""
    verified = lines.seq
    kept = lines.state
    # (each claim built afresh and let go: the recovered table stays as read)
    records: Iterator[tuple[str, Claim]] = iter(claim_records(recovered.claims))
    tasks: Iterator[Task] = iter(recovered.tasks.values())
    counts = (len(recovered.claims), len(recovered.tasks))
    if missing_only:  # (few: what the damaged lines held)
        claims = [(t, c) for t, c in records if kept.claims.get(t) is None]
        queued = [t for t in tasks if kept.tasks.get(t.task) is None]
        records, tasks, counts = iter(claims), iter(queued), (len(claims), len(queued))
    parts = max(1, -(-max(counts) // RECORDS_PER_EVENT))
    for part in range(parts):
        fields: dict[str, Any] = {
            "type": ev.REGISTRY_REBUILT, "actor": "doctor",
            "reason": f"the snapshot (seq {recovered.seq} with the lines chained after it) was "
            f"ahead of the verified journal (seq {verified}); its claims and work queue are "
            "re-recorded" + (f" (part {part + 1} of {parts})" if parts > 1 else ""),
            "quarantined": snap_name, "journal_quarantined": original,
            "origin": recovered.origin, "fence_floor": max(recovered.fence, fence_floor),
            "claims": sorted((c.to_dict() for _, c in itertools.islice(records,
                                                                        RECORDS_PER_EVENT)),
                             key=lambda d: str(d["task"])),
        }
        chunk = [t.to_dict() for t in itertools.islice(tasks, RECORDS_PER_EVENT)]
        if chunk:
            fields["tasks"] = chunk
        lines.add(fields)


def _write_journal(path: Path, fd: int, good_end: int, extra_lines: list[bytes]) -> int:
    """Build the salvaged journal beside the original and switch with one rename; returns its
    length."""
    tmp = path / f"{DOCTOR_TMP}{os.getpid()}-{secrets.token_hex(4)}"
    out = fsutil.open_file(tmp, os.O_WRONLY | os.O_EXCL, create=True)
    size = 0
    try:
        for chunk in _prefix_chunks(fd, good_end, extra_lines):
            view = memoryview(chunk)
            size += len(view)
            while view:
                view = view[os.write(out, view) :]
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(out)
    crash_point("doctor.before_switch")
    os.replace(tmp, path / JOURNAL)
    fsutil.fsync_dir(path)
    bump_generation_at(path / LOCK)  # every open handle reloads the new journal
    return size


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
    yield from extra_lines


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
        fence = max(fence, highest_fence(raw))  # also of lines that fail their seal
        try:
            unseal(raw)
            event = orjson.loads(raw)
        except (ChainError, orjson.JSONDecodeError):
            skipped.append(None)
            continue
        if not isinstance(event, dict):
            skipped.append(None)
            continue
        grant = event.get("fence")
        if event.get("type") in ev.GRANTS and type(grant) is int and grant > replayed.fence:
            # Across the break the fences jump (the damaged lines held the grants between):
            # the break is the recorded floor; a reused fence is still refused.
            replayed.fence = grant - 1
        try:
            ev.apply(replayed, event)
            applied += 1
        except (KeyError, TypeError, ValueError, AttributeError, FleetclaimsError):
            skipped.append(event.get("seq"))
    changed = [c for c in replayed.claims.values() if state.claims.get(c.task) != c]
    return changed, fence, {"applied": applied, "skipped": skipped}


_FENCE_RE = re.compile(rb'"(?:fence|fence_floor|prev_fence|loser_fence)"\s*:\s*(\d{1,18})')


def highest_fence(raw: bytes) -> int:
    """The highest fence number written in ``raw``, parsed or not (a line that fails its seal,
    a pretty-printed or damaged one): a repair starts above every fence ever handed out."""
    return max((int(m) for m in _FENCE_RE.findall(raw)), default=0)


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
