"""The lines of a snapshot's two sections (format 3 and 4 of ``claims.json``; see
``snapshot_table.py``): one claim a line, sorted by the task's JSON-encoded name; found by
binary search, split and parsed here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

SEP = b",\n"
Section = tuple[int, int]  # [start, end) of a section's lines in the snapshot bytes
if TYPE_CHECKING:  # (a large snapshot as read is an mmap: no count, split, startswith)
    import mmap

    Buffer = bytes | mmap.mmap

__all__ = ["SEP", "Section", "find_line", "parse_line", "section_lines"]


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


def section_lines(data: Buffer, section: Section) -> list[bytes]:
    start, end = section
    return data[start:end].split(SEP) if end > start else []


def parse_line(line: bytes) -> tuple[str, Any]:
    """(task, packed entry) of one section line; raises ValueError when it is not one."""
    obj = orjson.loads(b"{" + line + b"}")
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError("not one member")
    return next(iter(obj.items()))
