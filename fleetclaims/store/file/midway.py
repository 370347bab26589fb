"""Reads that start in the middle of the history: a page of the events after a seq, and one
task's lines. Each checks the lines it returns (seal, seq, link to the line before) and trusts
the line before where it starts, as a page of the active journal always has; `verify` is what
checks the whole chain. Sealed segments are read from the gzip member holding the start (a
page) or through their index of a task's members (a task)."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError, check_seal
from ...core.errors import ArchiveMismatch, AuditCorrupt, SegmentDamaged
from ...core.model import GENESIS
from ..base import VerifyReport
from . import archive, seams, segments
from .journal import line_before, seq_of
from .reader import CHUNK, JournalReader, find_offset, iter_lines
from .snapshot import Snapshot

__all__ = ["archived_through", "events_after", "sealed_or_foreign", "task_lines"]


def events_after(fd: int, path: str, after: int, end: int) -> Iterator[dict[str, Any]]:
    """The events with seq > ``after`` in the journal's bytes before ``end`` (which this process
    has read and checked already); closes ``fd`` when done."""
    try:
        sealed = segments.sealed(Path(path).parent)
        # (names only, no segment read: a page's reader checks the chain from its start on;
        # a history whose sealed part is gone must not read as one that starts later)
        seams.check(Path(path).parent, fd, end, links=False)
        if sealed and after < sealed[-1].last:  # from the sealed segments on
            reader = JournalReader(fd, path, end=end, from_anchor=True)
            # A page deep in the history starts at the member holding it (as a page of the
            # active journal starts at its line), not at the first segment: paging through
            # 1,000,000 events read every earlier segment again for each page.
            at = next(k for k, seg in enumerate(sealed) if seg.last > after)
            point = segments.resume_point(sealed[at], after)
            if point is None:  # (no usable index: from the first segment, as a replay)
                lines = reader.events()
            else:
                start, reader.seq, reader.prev = point
                lines = itertools.chain(reader.sealed_events(sealed[at:], start),
                                        _unless_damaged(reader))
            for _, _, event in lines:
                if event["seq"] > after:
                    yield event
            if reader.damage is not None:
                raise reader.corrupt()
            return
        start = find_offset(fd, after, 0, end, 0)
        seq, prev = 0, GENESIS
        before = line_before(fd, start)
        if before is not None:  # the chain goes on from the line before
            event = orjson.loads(before[1])
            seq, prev = event["seq"], event["hash"]
        elif sealed:  # the first line of the active journal: it goes on from the sealed ones
            first = next(iter_lines(fd, 0, end), None)
            if first is None or not first[2]:
                return
            event = orjson.loads(first[1])
            seq, prev = event["seq"] - 1, event["prev"]
        reader = JournalReader(fd, path, offset=start, seq=seq, prev=prev, end=end,
                               from_anchor=True)
        for _, _, event in reader.events():
            yield event
        if reader.damage is not None:  # the bytes changed since this process read them
            raise reader.corrupt()
    finally:
        os.close(fd)


def _unless_damaged(reader: JournalReader) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """The reader's events on from the active journal, unless it stopped at damage."""
    if reader.damage is None:
        yield from reader.events()


def archived_through(directory: Path) -> int:
    """The seq up to which events were archived (`audit archive`; 0: none)."""
    try:
        found = archive.read_anchor(directory)
    except ArchiveMismatch:
        return 0  # (named by every read that needs the archive)
    return 0 if found is None else found.seq


def task_lines(fd: int, path: str, task: str, end: int) -> Iterator[dict[str, Any]]:
    """The events whose ``task`` is ``task``, and merges, among the lines before ``end``: large
    chunks of whole lines are searched for the bytes (no per-line Python work: ~0.3 s a 400 MB
    journal), then each candidate line's seal is checked and it is parsed, in journal order;
    closes ``fd`` when done. (Not mmap: a journal cut back under a mapping raises SIGBUS.)"""
    needles = (b'"task":' + orjson.dumps(task), b'"type":"registries_merged"')
    size = CHUNK * 8
    try:
        sealed = segments.sealed(Path(path).parent)
        # The segments read here are read in part: that they and the journal form one chain
        # is checked at their seams (a swapped, foreign, re-sealed or missing one).
        seams.check(Path(path).parent, fd, end)
        for seg in sealed:  # through each one's index of the task's blocks
            try:
                for _, line in segments.task_lines(seg, task):
                    yield from _task_event(line, task, str(seg.path), 0, sealed=True)
            except segments.SegmentError as exc:
                raise SegmentDamaged(str(seg.path), seq=exc.seq, offset=0,
                                     reason=exc.reason) from None
        skip = sealed[-1].last if sealed else 0  # (lines sealed by a rotation cut short)
        pos = 0
        while pos < end:
            chunk = os.pread(fd, min(size, end - pos), pos)
            cut = chunk.rfind(b"\n") + 1
            if not cut:  # no whole line (a line longer than the chunk, or the end moved)
                if len(chunk) < min(size, end - pos):
                    return
                size *= 2
                continue
            starts: set[int] = set()
            for needle in needles:
                at = chunk.find(needle, 0, cut)
                while at >= 0:
                    starts.add(chunk.rfind(b"\n", 0, at) + 1)
                    at = chunk.find(needle, chunk.find(b"\n", at, cut) + 1, cut)
            for line_at in sorted(starts):
                line = chunk[line_at : chunk.find(b"\n", line_at, cut)]
                if skip and (seq_of(line) or 0) <= skip:
                    continue
                yield from _task_event(line, task, path, pos + line_at)
            pos += cut
    finally:
        os.close(fd)


def _task_event(line: bytes, task: str, path: str, offset: int, *,
                sealed: bool = False) -> Iterator[dict[str, Any]]:
    try:
        check_seal(line)
        event = orjson.loads(line)
    except (ChainError, orjson.JSONDecodeError) as exc:
        # (a sealed line is restored from a backup, never shown as the verified part)
        kind = SegmentDamaged if sealed else AuditCorrupt
        reason = f"{Path(path).name}: {exc}" if sealed else str(exc)
        raise kind(path, seq=seq_of(line) or 0, offset=offset, reason=reason) from None
    if event.get("task") == task or event.get("type") == "registries_merged":
        yield event


def sealed_or_foreign(directory: Path, fd: int, report: VerifyReport,
                      snapshot: Snapshot | None) -> VerifyReport:
    """``audit verify``'s report, told apart: damage in the sealed history (a segment missing,
    damaged, swapped, another registry's or re-sealed; where the journal's first line does not
    follow the last segment) is restored from a copy, which ``sealed`` says (doctor --fix does
    not rewrite it); a snapshot of another registry's origin is named as such."""
    if not report.ok:
        if report.seq is not None and segments.before_active(directory, report.seq):
            return dataclasses.replace(report, sealed=True)
        damage = seams.broken(directory, fd)  # (a break at the seam, or all segments gone)
        if damage is not None:
            reason = damage.reason.split(": ", 1)[-1]
            return dataclasses.replace(report, error=reason, seq=damage.seq, offset=0,
                                       sealed=True)
        return report
    theirs = snapshot.state.origin if snapshot is not None else ""
    ours = seams.origin(directory, fd) if theirs else ""
    if theirs and ours and theirs != ours:
        return dataclasses.replace(report, anchor_ok=False, error=(
            f"it belongs to registry {theirs}, not to this registry ({ours}, the journal's): "
            "another registry's snapshot"))
    return report
