"""``audit verify`` of sealed segments in parallel: each segment's lines are checked by a worker
process (its chain from its own first line), then the junctions here: one segment's first line
must follow the previous segment's last line (seq and hash), so the whole is the same proof as
reading them one after the other. Worth it for large journals only (each worker is a fresh
interpreter, ~0.1 s); the serial reader does the rest and everything small, and takes over
if a worker fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError
from ...core.model import GENESIS
from . import archive, preseal, segments
from .journal import check_link, seq_of

PAR_MIN = 32 << 20  # compressed bytes of sealed segments from which workers are used
WORKERS = 4

__all__ = ["PAR_MIN", "Pending", "Sealed", "start"]


@dataclass(frozen=True)
class Sealed:
    """What the sealed segments proved: ``count`` lines, ending at ``seq`` with hash ``prev``;
    or the first damage (seq, reason, file)."""

    count: int
    seq: int
    prev: str
    damage: tuple[int, str, str] | None = None
    index_problems: tuple[str, ...] = ()  # segments.IndexCheck.problem of each segment


def _segment(path: str, first: int, last: int) -> tuple[int, str, str, int, str, str]:
    """(lines, first line's prev, last hash, damage seq or 0, why, what is wrong with its
    index or "") of one segment."""
    seg = segments.Segment(Path(path), first, last)
    seq, prev, head, count = first - 1, "", "", 0
    check = segments.IndexCheck()
    try:
        for lines in segments.read_blocks(seg, 0, check):
            for line in lines:
                seq += 1
                if not prev:
                    event = orjson.loads(line)
                    prev = head = str(event.get("prev")) if isinstance(event, dict) else "?"
                head = check_link(line, seq, head)
                count += 1
    except (ChainError, orjson.JSONDecodeError) as exc:
        return count, prev, head, seq, f"{seg.path.name}: {exc}", ""
    except segments.SegmentError as exc:
        return count, prev, head, seq + 1, (
            f"{seg.path.name}: {exc.reason}; keep the file as it is (copy it aside) and restore "
            "it from a backup or the archive"), ""
    if seq != last:
        return count, prev, head, seq + 1, (
            f"{seg.path.name} ends at seq {seq}, its name says {last}"), ""
    return count, prev, head, 0, "", check.problem(seg) or ""


_WORKER = ("import sys, orjson\nfrom fleetclaims.store.file.verify_par import _segment\n"
           "for arg in sys.argv[1:]:\n    path, first, last = orjson.loads(arg)\n"
           "    sys.stdout.buffer.write(orjson.dumps(_segment(path, first, last)) + b'\\n')\n")


class Pending:
    """Workers checking the sealed segments; ``finish`` waits for them."""

    def __init__(self, sealed: list[segments.Segment], seq: int, prev: str,
                 procs: list[tuple[subprocess.Popen[bytes], list[int]]]) -> None:
        self.sealed, self.seq, self.prev, self.procs = sealed, seq, prev, procs
        self._done: Sealed | None = None

    def finish(self) -> Sealed:
        if self._done is None:
            self._done = self._finish()
        return self._done

    def _finish(self) -> Sealed:
        sealed, seq, prev = self.sealed, self.seq, self.prev
        results: list[Any] = [None] * len(sealed)
        for proc, share in self.procs:
            out, _ = proc.communicate()
            lines = out.splitlines()
            if proc.returncode == 0 and len(lines) == len(share):
                for i, line in zip(share, lines, strict=True):
                    results[i] = orjson.loads(line)
        count = 0
        problems = []
        for i, seg in enumerate(sealed):
            if results[i] is None or len(results[i]) != 6:  # a worker failed: read here
                results[i] = _segment(str(seg.path), seg.first, seg.last)
            n, first_prev, head, bad, why, index_problem = results[i]
            if first_prev != prev and n:
                return Sealed(count, seq, prev, (seg.first, f"{seg.path.name}: prev hash does "
                                                 "not match the line before", str(seg.path)))
            if bad:
                return Sealed(count + n, seq, prev, (bad, why, str(seg.path)))
            count += n
            seq, prev = seg.last, head
            if index_problem:
                problems.append(index_problem)
        return Sealed(count, seq, prev, None, tuple(problems))


def start(directory: Path, fd: int) -> Pending | None:
    """Workers started on the sealed segments, or None when the serial reader should read them
    (small, a rotation cut short left lines in both, or the archive anchor unreadable)."""
    sealed = segments.sealed(directory)
    if len(sealed) < 2 or sum(s.path.stat().st_size for s in sealed) < PAR_MIN:
        return None
    try:
        anchor = archive.read_anchor(directory)
    except Exception:
        return None
    seq, prev = (anchor.seq, anchor.hash) if anchor is not None else (0, GENESIS)
    sealed = [s for s in sealed if s.last > seq]
    first_active = seq_of(os.pread(fd, 64, 0))
    if (len(sealed) < 2 or segments.gap(sealed, seq + 1) is not None
            or (first_active is not None and first_active <= sealed[-1].last)):
        return None  # (a gap is named by the serial reader, as everywhere)
    n = max(1, min(WORKERS, len(sealed), os.cpu_count() or 1))
    procs = []
    for share in (list(range(i, len(sealed), n)) for i in range(n)):
        try:
            procs.append((subprocess.Popen(
                [sys.executable, "-c", _WORKER,
                 *(orjson.dumps([str(sealed[i].path), sealed[i].first, sealed[i].last]).decode()
                   for i in share)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                env=preseal.helper_env()),
                share))
        except OSError:
            continue  # (its segments are read by finish)
    return Pending(sealed, seq, prev, procs)
