"""THE journal reader: every reader of journal bytes goes through ``JournalReader``.

The store's catch-up (the hot path: every process applies every other writer's lines),
``audit verify``, ``doctor``, ``migrate`` and ``iter_events`` all read the journal the same way:
complete lines from a byte offset, each checked against its seal and chained to the line before,
stopping at the first damage (named by seq and byte offset) and noting an incomplete last line
(a torn tail). What to do about damage or a torn tail is the caller's decision: the store
raises or repairs, verify reports, doctor salvages.

The journal is preallocated with zero bytes (so an append rewrites allocated blocks and its
fdatasync needs no metadata commit): the first NUL byte is the end of the data, and anything
but zeros after it is damage (``junk``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError, check_seal
from ...core.errors import ArchiveMismatch, AuditCorrupt, SegmentDamaged
from ...core.model import GENESIS
from ..base import VerifyReport
from . import archive, segments
from .journal import check_event, check_link, line_before, seq_of
from .snapshot import Snapshot, anchor_problem

CHUNK = 1 << 20
# A writer catching up reads a few lines: its first read is this small (the preallocated zeros
# after the data cost a copy too), then reads grow to CHUNK for long replays.
CATCH_UP_CHUNK = 4096
_RAW, _LINKS, _EVENTS = 0, 1, 2  # what JournalReader._scan does with each line

__all__ = [
    "CATCH_UP_CHUNK", "CHUNK", "Damage", "JournalReader", "at_archive", "at_offset",
    "find_offset", "first_nonzero", "first_nul", "iter_lines", "verify_fd",
]


@dataclass(frozen=True)
class Damage:
    """The first line that does not verify: its seq (the one expected), offset and why."""

    seq: int
    offset: int
    reason: str
    path: str = ""  # the sealed segment it is in ("": the active journal)


class JournalReader:
    """Reads the complete lines of a journal from ``offset``, checking each one's seal, seq and
    link to ``prev``.

    Iterate ``events()`` (each line parsed) or ``links()`` (byte checks only, for verify). The
    reader's ``offset``, ``seq`` and ``prev`` always describe the end of the last verified line
    yielded; when iteration stops, ``damage`` holds the first bad line (its seq and offset, and
    why; ``corrupt()`` makes it an AuditCorrupt) or ``torn`` the bytes of an incomplete last
    line (at ``offset``). A reader can be iterated again to read on from where it stopped (a
    writer may have appended meanwhile): set ``offset``, ``seq`` and ``prev`` to start elsewhere.
    """

    __slots__ = ("chunk_size", "damage", "end", "fd", "from_anchor", "index_problems", "offset",
                 "path", "prev", "seq", "torn")

    def __init__(self, fd: int, path: str, *, offset: int = 0, seq: int = 0,
                 prev: str = GENESIS, end: int | None = None, chunk_size: int = CHUNK,
                 from_anchor: bool = False) -> None:
        # from_anchor: when segments were archived (`audit archive`), start after them (verify,
        # listing); otherwise (a replay needs every event) that is damage naming the archive.
        self.from_anchor = from_anchor
        self.fd = fd
        self.path = path
        self.offset = offset
        self.seq = seq
        self.prev = prev
        self.end = end
        self.chunk_size = chunk_size
        self.torn = b""
        self.damage: Damage | None = None
        # verify sets a list: each sealed segment read whole is checked against its index
        self.index_problems: list[str] | None = None

    def events(self) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        """(offset, line without newline, event) for each verified line."""
        return self._scan(_EVENTS)

    def links(self) -> Iterator[tuple[int, bytes, str]]:
        """(offset, line without newline, its hash) for each verified line, not parsed: only a
        line that fails the cheap byte checks is parsed (for the message)."""
        return self._scan(_LINKS)

    def _scan(self, mode: int) -> Iterator[Any]:
        # One loop splits and checks (a second generator under it would cost every line of the
        # hot path a resumption). Reads start at chunk_size and grow to CHUNK.
        self.torn = b""
        self.damage = None
        if self.offset == 0 and mode != _RAW:
            # The start of the active journal: after sealed segments when there are some.
            if self.seq == 0:
                sealed = self._after_archive(segments.sealed(Path(self.path).parent))
                if self.damage is not None:
                    return
                if sealed:
                    yield from self._sealed(mode, sealed)
                    if self.damage is not None:
                        return
            if self.seq > 0 and not self._skip_sealed():
                return
        fd, end, seq, prev = self.fd, self.end, self.seq, self.prev
        pos = pending_at = self.offset
        pending = b""
        long: list[bytes] = []  # the chunks of a line longer than a chunk, joined at its end
        want = self.chunk_size
        while end is None or pos < end:
            if end is not None:
                want = min(want, end - pos)
            chunk = os.pread(fd, want, pos)
            want = min(want * 8, CHUNK)
            if not chunk:
                break
            nul = chunk.find(b"\0")
            if nul >= 0:
                chunk = chunk[:nul]
                end = pos + nul  # stop here: the rest is unused space
            pos += len(chunk)
            if pending and nul < 0 and b"\n" not in chunk:
                long.append(chunk)  # (not pending + chunk: quadratic over a long line)
                continue
            if long:
                data = b"".join([pending, *long, chunk])
                long.clear()
            else:
                data = pending + chunk if pending else chunk
            base = pending_at
            cut = 0
            while (nl := data.find(b"\n", cut)) >= 0:
                offset = base + cut
                line = data[cut:nl]
                cut = nl + 1
                if mode == _RAW:
                    yield offset, line, True
                    continue
                seq += 1
                item: Any
                try:
                    if mode == _EVENTS:
                        item = check_event(line, seq, prev)
                        prev = item["hash"]
                    else:
                        item = prev = check_link(line, seq, prev)
                except (ChainError, orjson.JSONDecodeError) as exc:
                    self.damage = Damage(seq, offset, str(exc))
                    return
                # Before the yield: a caller that stops early (or whose apply fails) sees the
                # reader at the end of the last line it was given.
                self.seq = seq
                self.prev = prev
                self.offset = base + cut
                yield offset, line, item
            pending = data[cut:]
            pending_at = base + cut
        if long:
            pending = b"".join([pending, *long])
        if pending:
            if mode == _RAW:
                yield pending_at, pending, False
            else:
                self.torn = pending

    def _after_archive(self, sealed: list[segments.Segment]) -> list[segments.Segment]:
        """The sealed segments to read from seq 0: after the archive anchor if there is one
        (``seq`` and ``prev`` set to it), or none and ``damage`` set."""
        try:
            anchor = archive.read_anchor(Path(self.path).parent)
        except ArchiveMismatch as exc:
            self.damage = Damage(1, 0, str(exc), exc.path)
            return []
        if anchor is None or (not self.from_anchor and sealed and sealed[0].first == 1
                              and segments.gap(sealed) is None):
            return sealed  # (archived segments copied back: a replay reads them all)
        if not self.from_anchor:
            dirs = sorted({str(f.get("dir")) for f in anchor.files})
            self.damage = Damage(1, 0, (
                f"events 1..{anchor.seq} were archived (to {', '.join(dirs)}) and this read "
                "needs them all (claims.json is missing or unusable): copy the archived "
                f"segments back into {anchor.path.parent}"), str(anchor.path))
            return []
        self.seq, self.prev = anchor.seq, anchor.hash
        return [seg for seg in sealed if seg.last > anchor.seq]

    def sealed_events(self, sealed: list[segments.Segment],
                      start: int) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
        """``events()`` of ``sealed`` only, the first read from its gzip member at ``start``
        (``seq`` and ``prev`` set to where that member begins)."""
        return self._sealed(_EVENTS, sealed, start)

    def _sealed(self, mode: int, sealed: list[segments.Segment],
                start: int = 0) -> Iterator[Any]:
        """The lines of the sealed segments, checked as the active journal's (offset 0)."""
        missing = segments.gap(sealed, self.seq + 1)
        if missing is not None:
            self.damage = Damage(missing[0], 0, (
                f"sealed segment(s) with seq {missing[0]}..{missing[1]} missing from "
                f"{sealed[0].path.parent}: put the file back (from a backup or the archive "
                "directory) and run `fleetclaims audit verify`"), str(sealed[0].path.parent))
            return
        seq, prev = self.seq, self.prev
        for seg in sealed:
            if seg.last <= seq:
                continue
            at = start if seg is sealed[0] else 0
            check = None if self.index_problems is None or at else segments.IndexCheck()
            try:
                for lines in segments.read_blocks(seg, at, check):
                    for line in lines:
                        seq += 1
                        try:
                            if mode == _EVENTS:
                                item: Any = check_event(line, seq, prev)
                                prev = item["hash"]
                            else:
                                item = prev = check_link(line, seq, prev)
                        except (ChainError, orjson.JSONDecodeError) as exc:
                            self.damage = Damage(seq, 0, f"{seg.path.name}: {exc}",
                                                 str(seg.path))
                            return
                        self.seq, self.prev = seq, prev
                        yield 0, line, item
            except segments.SegmentError as exc:
                self.damage = Damage(seq + 1, 0, f"{seg.path.name}: {exc.reason}; keep the "
                                     "file as it is (copy it aside) and restore it from a "
                                     "backup or the archive",
                                     str(seg.path))
                return
            if seq != seg.last:
                self.damage = Damage(seq + 1, 0, f"{seg.path.name} ends at seq {seq}, its name "
                                     f"says {seg.last}", str(seg.path))
                return
            problems = self.index_problems
            if check is not None and problems is not None and (found := check.problem(seg)):
                problems.append(found)

    def _skip_sealed(self) -> bool:
        """At the start of the active journal of a segmented registry (``seq`` > 0): skip its
        lines up to ``seq`` that a rotation cut short by a crash has sealed already, checking
        that the chain meets there. False (``damage`` set) when it does not."""
        first = seq_of(os.pread(self.fd, 64, 0))
        if first is None or first > self.seq:
            return True  # the usual case: it starts at seq + 1 (the chain check follows)
        for offset, line, complete in iter_lines(self.fd, 0, self.end):
            if not complete:
                break
            if seq_of(line) == self.seq:
                try:
                    ok = check_seal(line) == self.prev
                except ChainError:
                    ok = False
                if ok:
                    self.offset = offset + len(line) + 1
                    return True
                break
        self.damage = Damage(self.seq + 1, 0, f"the journal's lines already sealed do not end "
                             f"at seq {self.seq} with the sealed chain's hash")
        return False

    @property
    def data_end(self) -> int:
        """Where the bytes read end: after the last verified line and any torn tail."""
        return self.offset + len(self.torn)

    def junk(self) -> int | None:
        """Offset of a non-zero byte after the data (past the unused zero space), or None.

        Right at ``data_end`` it may be a writer appending meanwhile (read on); further on it
        means lines were lost or the file was damaged (``junk_damage``)."""
        return first_nonzero(self.fd, self.data_end)

    def junk_damage(self, junk: int) -> Damage:
        return Damage(self.seq + 1, self.offset, f"data found at byte {junk} after unused (zero) "
                      f"space at byte {self.data_end}: lines lost or the file was damaged")

    def corrupt(self, damage: Damage | None = None) -> AuditCorrupt:
        """The error naming ``damage`` (by default the damage found)."""
        damage = damage or self.damage
        assert damage is not None
        kind = SegmentDamaged if damage.path else AuditCorrupt
        return kind(damage.path or self.path, seq=damage.seq, offset=damage.offset,
                    reason=damage.reason)


def iter_lines(
    fd: int, start: int, end: int | None = None, *, chunk_size: int = CHUNK
) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, line without newline, complete) for each line from ``start`` (to ``end``), up to
    the first NUL byte, unchecked: JournalReader's splitting alone. Used only where lines are
    known not to verify (doctor describing what damaged bytes held) or are located, not read
    (find_offset)."""
    reader = JournalReader(fd, "", offset=start, end=end, chunk_size=chunk_size)
    return reader._scan(_RAW)


def first_nonzero(fd: int, start: int) -> int | None:
    """Offset of the first non-zero byte at or after ``start``, or None (all zeros to EOF)."""
    pos = start
    while True:
        chunk = os.pread(fd, CHUNK, pos)
        if not chunk:
            return None
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return pos + len(chunk) - len(stripped)
        pos += len(chunk)


def first_nul(fd: int, start: int) -> int:
    """Offset of the first NUL byte at or after ``start`` (or of EOF): where the data ends."""
    pos = start
    while True:
        chunk = os.pread(fd, CHUNK, pos)
        nul = chunk.find(b"\0")
        if nul >= 0:
            return pos + nul
        if not chunk:
            return pos
        pos += len(chunk)


def find_offset(fd: int, after_seq: int, lo: int, hi: int, lo_seq: int) -> int:
    """Byte offset of the first line with seq > after_seq, by binary search in [lo, hi).

    ``lo`` is a line start whose line has seq ``lo_seq + 1``; lines are in seq order. The lines
    are not checked here: the reader that starts at the offset checks them.
    """
    if after_seq <= lo_seq:
        return lo
    while hi - lo > 4096:
        mid = (lo + hi) // 2
        chunk = os.pread(fd, 65536, mid)
        nl = chunk.find(b"\n")
        if nl < 0:
            break
        start = mid + nl + 1
        if start >= hi:
            hi = mid
            continue
        seq = seq_of(os.pread(fd, 256, start))
        if seq is None:
            break
        if seq <= after_seq:
            lo = start
        else:
            hi = start
    for off, line, complete in iter_lines(fd, lo, None):
        if not complete:
            return off
        seq = seq_of(line)
        if seq is not None and seq > after_seq:
            return off
    return hi


def verify_fd(
    fd: int,
    path: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    snapshot: Snapshot | None = None,
    snapshot_problem: str | None = None,
) -> VerifyReport:
    """Check every line of a journal: hash, seq continuity and prev links; and that the
    snapshot's anchor (seq, offset, head) names a line boundary of this chain. A snapshot that
    could not be read (``snapshot_problem``) is reported as a failed anchor."""
    anchor = None
    if snapshot is not None:
        anchor = (snapshot.state.seq, snapshot.offset, snapshot.state.head)
    report = _verify(fd, path, progress, anchor)
    if snapshot_problem is None:
        return report
    return dataclasses.replace(report, error=report.error or f"snapshot: {snapshot_problem}",
                               anchor_ok=False)


def _verify(fd: int, path: str, progress: Callable[[int, int], None] | None,
            anchor: tuple[int, int, str] | None) -> VerifyReport:
    reader = JournalReader(fd, path, from_anchor=True)
    pending = None
    if path:  # large sealed segments: verified by worker processes meanwhile (verify_par)
        from . import verify_par

        pending = verify_par.start(Path(path).parent, fd)
    if pending is None:
        reader.index_problems = []
        report = _verify_from(reader, progress, anchor, None if anchor is None else False)
        return dataclasses.replace(report, index_problems=tuple(reader.index_problems))
    # The active journal from its own first line, while the workers check the segments; the
    # junction (its first line follows their last) is checked when both are done.
    first = next(iter_lines(fd, 0), None)
    start: tuple[int, str] | None = None
    if first is not None and first[2] and (seq := seq_of(first[1])) is not None:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            start = (seq - 1, str(orjson.loads(first[1]).get("prev")))
    sealed = None
    if start is None:  # an empty journal: it starts where the segments end
        sealed = pending.finish()
        reader.seq, reader.prev = sealed.seq, sealed.prev
    else:
        reader.seq, reader.prev = start
    anchor_ok: bool | None = None if anchor is None else False
    if anchor is not None and anchor[0] == reader.seq:
        anchor_ok = anchor[1] == 0 and anchor[2] == reader.prev
    active = _verify_from(reader, progress, anchor, anchor_ok)
    sealed = sealed or pending.finish()
    if sealed.damage is not None:
        return VerifyReport(False, sealed.count, 0, sealed.prev, sealed.damage[1],
                            sealed.damage[0], 0, active.anchor_ok)
    if start is not None and start != (sealed.seq, sealed.prev):
        return VerifyReport(False, sealed.count, 0, sealed.prev, "the first line of the "
                            "journal does not follow the last sealed segment (seq or prev hash)",
                            sealed.seq + 1, 0, active.anchor_ok)
    return VerifyReport(active.ok, active.events + sealed.count, active.bytes, active.head,
                        active.error, active.seq, active.offset, active.anchor_ok,
                        active.torn_tail, index_problems=sealed.index_problems)


def _verify_from(reader: JournalReader, progress: Callable[[int, int], None] | None,
                 anchor: tuple[int, int, str] | None, anchor_ok: bool | None) -> VerifyReport:
    size = os.fstat(reader.fd).st_size
    count = 0
    while True:
        for offset, _, digest in reader.links():
            count += 1
            if anchor is not None and reader.seq == anchor[0]:
                anchor_ok = digest == anchor[2] and at_offset(reader, anchor)
            if progress is not None and count % 65536 == 0:
                progress(offset, size)
        if anchor is not None and not anchor_ok and reader.from_anchor:
            anchor_ok = at_archive(reader, anchor)
        damage = reader.damage
        if damage is not None:
            return VerifyReport(False, count, reader.offset, reader.prev, damage.reason,
                                damage.seq, damage.offset, anchor_ok)
        # Everything after the data must be unused (zero) space. A non-zero byte right at the
        # end means a writer appended meanwhile: read on.
        junk = reader.junk()
        if junk is None:
            break
        if junk == reader.data_end:
            continue
        damage = reader.junk_damage(junk)
        return VerifyReport(False, count, reader.offset, reader.prev, damage.reason,
                            damage.seq, damage.offset, anchor_ok)
    return VerifyReport(True, count, reader.offset, reader.prev, None, None, None, anchor_ok,
                        len(reader.torn))


def at_offset(reader: JournalReader, anchor: tuple[int, int, str]) -> bool:
    """Whether the line ``reader`` just read (seq and hash those of ``anchor``, a snapshot's)
    ends at the snapshot's offset. A line read from a sealed segment (offset 0) that the active
    journal still holds too (a rotation sealed it but did not switch journals yet) is looked
    up there, as the store does."""
    if reader.offset == anchor[1]:
        return True
    return reader.offset == 0 and anchor[1] > 0 and _line_ends_at(reader.fd, anchor)


def at_archive(reader: JournalReader, anchor: tuple[int, int, str]) -> bool:
    """Whether a snapshot is at the archive anchor ``reader`` started from (the line at its
    seq archived, so never read): the archive anchor's seq and hash are the snapshot's, and
    its offset is 0 or ends that line in the active journal (sealed, not switched yet)."""
    try:
        found = archive.read_anchor(Path(reader.path).parent)
    except ArchiveMismatch:
        return False
    return found is not None and (found.seq, found.hash) == (anchor[0], anchor[2]) and (
        anchor[1] == 0 or _line_ends_at(reader.fd, anchor))


def _line_ends_at(fd: int, anchor: tuple[int, int, str]) -> bool:
    found = line_before(fd, anchor[1])
    if found is None:
        return False
    with contextlib.suppress(orjson.JSONDecodeError):
        event = orjson.loads(found[1])
        seq, _, head = anchor
        return isinstance(event, dict) and (event.get("seq"), event.get("hash")) == (seq, head)
    return False


def snapshot_problem(fd: int, snapshot: Snapshot, directory: Path) -> str | None:
    """``snapshot.anchor_problem`` knowing sealed segments: a snapshot at offset 0 of the active
    journal with events is the one a rotation wrote, when the sealed segments end at its seq
    (the chain from there is checked by the reader that goes on from it); or when the active
    journal starts right after it and a segment ends at its seq: a helper (preseal.py) sealed
    the next lines already, the rotation that switches the journal is still to come (a writer
    that closed before it: found quarantined as unusable by the next one)."""
    if snapshot.offset == 0 and snapshot.state.seq > 0:
        sealed = segments.sealed(directory)
        seq = snapshot.state.seq
        if sealed and (sealed[-1].last == seq or (
                any(seg.last == seq for seg in sealed)
                and seq_of(os.pread(fd, 64, 0)) == seq + 1)):
            return None
    return anchor_problem(fd, snapshot)
