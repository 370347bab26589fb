"""The lines of a snapshot's two sections (format 3 and 4 of ``claims.json``; see
``snapshot_table.py``): one claim a line, sorted by the task's JSON-encoded name; found by
binary search, split and parsed here."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING, Any

import orjson

SEP = b",\n"
Section = tuple[int, int]  # [start, end) of a section's lines in the snapshot bytes
if TYPE_CHECKING:  # (a large snapshot as read is an mmap: no count, split, startswith)
    import mmap

    Buffer = bytes | mmap.mmap

__all__ = ["SEP", "Samples", "Section", "find_line", "narrow", "parse_line", "sample",
           "section_lines"]

# A large section is first narrowed by a sample of its lines (one every SAMPLE_EVERY bytes,
# the first SAMPLE_HEAD bytes of each kept): a binary search in Python costs ~0.5 us a step,
# 14 steps at 10,000 lines, and a work queue looks up every new task's claim that way (most
# have none); bisect over the sample runs in C, leaving a few steps inside one window.
SAMPLE_EVERY = 4096
SAMPLE_HEAD = 48
SAMPLE_MIN = 16 * SAMPLE_EVERY  # smaller sections are searched directly
Samples = tuple[list[bytes], list[int]]  # (heads, line starts), in the section's order


def find_line(data: Buffer, section: Section, probe: bytes) -> tuple[int, int, bool]:
    """Binary search of a sorted section for the line that starts with ``probe`` (a task's
    JSON-encoded name and ":"): (line start, content end, True) when found, else (the start
    of the first greater line or the section end, same, False). Two JSON strings are never
    prefixes of one another, so comparing a line's first bytes with the probe orders them."""
    start, end = section
    lo, hi = start, end
    n = len(probe)
    while lo < hi:
        mid = (lo + hi) // 2
        ls = data.rfind(b"\n", start, mid) + 1 or start
        ls = max(ls, start)
        le = data.find(b"\n", mid, end)
        if le < 0:
            le = end
        head = data[ls : ls + n]
        if head == probe:
            return ls, (le - 1 if le < end else end), True
        if head < probe:
            lo = le + 1 if le < end else end
        else:
            hi = ls
    return lo, lo, False


def sample(data: Buffer, section: Section) -> Samples:
    """Every SAMPLE_EVERY bytes, the next line's start and the first SAMPLE_HEAD bytes of its
    probe (the JSON-encoded name and ":"), so heads and probes cut to one length compare as the
    names do (~1 ms a 4 MiB section, built once per table: its bytes never change under it)."""
    start, end = section
    heads: list[bytes] = []
    starts: list[int] = []
    pos = start + SAMPLE_EVERY
    while pos < end:
        ls = data.find(b"\n", pos, end) + 1
        if ls <= 0 or ls >= end:
            break
        head = data[ls : ls + SAMPLE_HEAD]
        cut = head.find(b'":', 1)  # (after the opening quote: a name may start with ':')
        if cut >= 0:
            head = head[: cut + 2]  # (the probe's form: the JSON-encoded name and ":")
        if b"\\" in head:
            return [], []  # an escaped name could hide '":' in it: search this section whole
        starts.append(ls)
        heads.append(head)
        pos = ls + SAMPLE_EVERY
    return heads, starts


def narrow(samples: Samples, section: Section, probe: bytes) -> Section:
    """The part of ``section`` that holds ``probe``'s line if it has one, and where it would
    go if not: from the last sampled line whose head is below the probe's first bytes to the
    first one whose head is above them. Probes never prefix one another, and truncation keeps
    byte order (a < b gives a[:k] <= b[:k]; a[:k] < b[:k] gives a < b), so every line before the
    part is below the probe and every line from its end on is above it; heads equal to the
    probe's first bytes decide nothing and stay inside."""
    heads, starts = samples
    head = probe[:SAMPLE_HEAD]
    i = bisect_left(heads, head)
    j = bisect_right(heads, head, i)
    return (starts[i - 1] if i else section[0], starts[j] if j < len(starts) else section[1])


def section_lines(data: Buffer, section: Section) -> list[bytes]:
    start, end = section
    return data[start:end].split(SEP) if end > start else []


def parse_line(line: bytes) -> tuple[str, Any]:
    """(task, packed entry) of one section line; raises ValueError when it is not one."""
    obj = orjson.loads(b"{" + line + b"}")
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError("not one member")
    return next(iter(obj.items()))
