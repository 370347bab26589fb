"""The seams of the sealed history: that the sealed segments and the active journal form one
chain from the first event (or the archive's anchor) on, checked at their ends only.

A read of one task (``explain``, ``audit --task``) or a page of events reads a few gzip members,
not every sealed line; without this check a segment that is missing, swapped, another
registry's, or edited and re-sealed within itself would just tell a shorter or different history.
Each segment costs two member reads through its index (its first and last lines): cheap beside
the read itself, and independent of the number of events. (Lines inside a segment are checked
by the reads that return them, and every line by ``audit verify``.)
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import orjson

from ...core.chain import ChainError, check_seal
from ...core.errors import ArchiveMismatch, SegmentDamaged
from ...core.model import GENESIS
from . import archive, segments
from .journal import seq_of
from .reader import find_offset, iter_lines

__all__ = ["broken", "check", "ends", "journal_holds", "origin"]

Link = tuple[int, str]


def ends(seg: segments.Segment) -> tuple[Link, Link]:
    """((seq, prev) of the first line, (seq, hash) of the last line) of ``seg``: through the
    index's first and last members when it fits the file, else read whole. SegmentError when
    the file cannot be read or those lines do not verify."""
    quick = _ends_indexed(seg)
    if quick is not None and quick[0][0] == seg.first and quick[1][0] == seg.last:
        return quick
    first = last = b""  # (a derived index that does not fit: the file decides)
    for lines in segments.read_blocks(seg):
        if lines and not first:
            first = lines[0]
        if lines:
            last = lines[-1]
    return _link(seg, first, "prev"), _link(seg, last, "hash")


def _ends_indexed(seg: segments.Segment) -> tuple[Link, Link] | None:
    index = segments._indexed(seg)
    blocks = index.get("blocks") if index is not None else None
    if not isinstance(blocks, list) or not blocks:
        return None
    try:
        head = segments._block_lines(seg, int(blocks[0][0]), int(blocks[0][1]))
        tail = segments._block_lines(seg, int(blocks[-1][0]), int(blocks[-1][1]))
        return _link(seg, head[0], "prev"), _link(seg, tail[-1], "hash")
    except (segments.SegmentError, OSError, IndexError, TypeError, ValueError):
        return None


def _link(seg: segments.Segment, line: bytes, key: str) -> Link:
    try:
        digest = check_seal(line)
        event = orjson.loads(line)
        seq, value = event["seq"], digest if key == "hash" else event["prev"]
    except (ChainError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        where = "first" if key == "prev" else "last"
        raise segments.SegmentError(seg.path, seg.first,
                                    f"its {where} line does not verify: {exc}") from None
    if type(seq) is not int or not isinstance(value, str):
        raise segments.SegmentError(seg.path, seg.first, "a line without seq or hash")
    return seq, value


def broken(directory: Path, fd: int, end: int | None = None, *,
           links: bool = True) -> SegmentDamaged | None:
    """The first place where the sealed history does not form one chain with the active
    journal (open at ``fd``): a segment missing, starting or ending elsewhere than its name
    says, not linking to the line before it (swapped, another registry's, edited and
    re-sealed), or the journal's first line not linking to the last segment; else None.
    Without ``links`` only the names are compared with the journal's first seq (no segment
    is read: a page of events, whose reader checks the chain from where it starts)."""
    sealed = segments.sealed(directory)
    seq, prev = 0, GENESIS
    with contextlib.suppress(ArchiveMismatch):  # (named by the reads that need the archive)
        found = archive.read_anchor(directory)
        if found is not None and not (sealed and sealed[0].first == 1):
            seq, prev = found.seq, found.hash
            sealed = [s for s in sealed if s.last > seq]
    where = directory / segments.DIRNAME
    for seg in sealed:
        if seg.first > seq + 1:
            return _missing(where, seq + 1, seg.first - 1)
        if seg.first <= seq:  # (overlapping names: not what a rotation writes)
            return SegmentDamaged(str(seg.path), seq=seg.first, offset=0, reason=(
                f"{seg.path.name} overlaps the segment before it"))
        if not links:
            seq = seg.last
            continue
        try:
            (first, link), (last, digest) = ends(seg)
        except segments.SegmentError as exc:
            return SegmentDamaged(str(seg.path), seq=seg.first, offset=0, reason=(
                f"{seg.path.name}: {exc.reason}"))
        if first != seg.first or last != seg.last:
            return SegmentDamaged(str(seg.path), seq=seg.first, offset=0, reason=(
                f"{seg.path.name} holds seq {first}..{last}, its name says "
                f"{seg.first}..{seg.last} (segments renamed or swapped)"))
        if link != prev:
            return SegmentDamaged(str(seg.path), seq=seg.first, offset=0, reason=(
                f"{seg.path.name} does not follow the history before it (its first line "
                "links to another hash: a segment swapped, another registry's, or edited and "
                f"re-sealed)"))
        seq, prev = last, digest
    line = next(iter_lines(fd, 0, end), None)
    if line is None or not line[2] or (active := seq_of(line[1])) is None:
        return None
    if active > seq + 1:
        return _missing(where, seq + 1, active - 1)
    if active == seq + 1 and seq > 0 and links:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            if orjson.loads(line[1]).get("prev") != prev:
                name = sealed[-1].path.name if sealed else "segments/archived.json"
                return SegmentDamaged(str(sealed[-1].path if sealed else where), seq=seq,
                                      offset=0, reason=(
                    f"the journal's first line (seq {active}) does not follow {name}: the "
                    "sealed history's last hash is not the one the journal links to (a "
                    f"segment edited and re-sealed, or another registry's)"))
    return None


def check(directory: Path, fd: int, end: int | None = None, *, links: bool = True) -> None:
    """``broken``, raised."""
    damage = broken(directory, fd, end, links=links)
    if damage is not None:
        raise damage


def _missing(where: Path, lo: int, hi: int) -> SegmentDamaged:
    return SegmentDamaged(str(where), seq=lo, offset=0, reason=(
        f"sealed segment(s) with seq {lo}..{hi} missing from {where} (and not recorded as "
        f"archived in {segments.DIRNAME}/{archive.ANCHOR})"))


def origin(directory: Path, fd: int) -> str:
    """The origin the journal's first line (seq 1: in the first sealed segment, or the active
    journal) records; "" when it is archived or cannot be read (then not compared)."""
    sealed = segments.sealed(directory)
    first = b""
    with contextlib.suppress(segments.SegmentError, OSError, StopIteration):
        if sealed and sealed[0].first == 1:
            for lines in segments.read_blocks(sealed[0]):  # (its first member only)
                first = lines[0] if lines else b""
                break
        elif not sealed:
            line = next(iter_lines(fd, 0, None))
            first = line[1] if line[2] else b""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        event = orjson.loads(first) if first else None
        if isinstance(event, dict) and event.get("seq") == 1:
            found = event.get("origin")
            return found if isinstance(found, str) else ""
    return ""



def journal_holds(directory: Path, fd: int, seq: int, head: str) -> bool | None:
    """Whether the active journal (open at ``fd``) holds line ``seq`` with hash ``head`` (the
    anchor's): None when that seq is sealed (the journal cannot tell), else True or False.
    At a broken seam it says which side is the stranger: a journal without the anchor's
    line is not this registry's (or was cut), whatever the segments hold."""
    sealed = segments.sealed(directory)
    last = sealed[-1].last if sealed else 0
    if seq <= last or seq <= 0:
        return None
    end = os.fstat(fd).st_size
    first = seq_of(os.pread(fd, 64, 0))
    if first is None or seq < first:
        return False
    line = next(iter_lines(fd, find_offset(fd, seq - 1, 0, end, first - 1), end), None)
    if line is None or not line[2]:
        return False
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
        event = orjson.loads(line[1])
        return bool(event.get("seq") == seq and event.get("hash") == head)
    return False
