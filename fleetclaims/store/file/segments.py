"""Sealed journal segments: the journal rotates into gzip files under ``segments/``.

``audit.jsonl`` is always the active segment (appended to). When it passes ``SEGMENT_BYTES``
after a checkpoint, a writer seals it, under the registry lock:

1. its lines are compressed to ``segments/audit-<first seq>-<last seq>.jsonl.gz`` (through a
   temp file, fsynced, renamed), with a per-task index beside it (``.idx.json``, derived);
2. ``claims.json`` is written at the sealed head with offset 0 (it fits the old active journal,
   whose lines up to that seq are sealed, and the new empty one alike);
3. an empty ``audit.jsonl`` replaces the active one and the lock's generation is bumped, so
   every other handle reloads.

A crash between steps leaves lines both sealed and in ``audit.jsonl``: readers skip the active
journal's lines up to the last sealed seq (checking that the chain meets there), and the next
rotation seals only the lines after it. The hash chain runs on across segments unchanged:
``zcat segments/*.gz; cat audit.jsonl`` is the whole journal.

Each sealed file is a series of gzip members of ~``BLOCK`` bytes of whole lines (plain gzip to
``zcat``); the index names, per task, the members that hold its lines, so ``explain`` reads
only those.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError, check_seal
from . import fsutil
from .faults import crash_point, osc
from .journal import seq_of, write_at

SEGMENT_BYTES = 64 << 20  # rotate the active journal past this size (tests patch it small)
BLOCK = 256 << 10  # raw bytes of whole lines per gzip member (the index's unit)
PREFETCH_MIN = 1 << 20  # a sealed file this large is decompressed ahead by a helper thread
DIRNAME = "segments"
_NAME = re.compile(r"^audit-(\d{12})-(\d{12})\.jsonl\.gz$")
_TASK = re.compile(rb'"task":("(?:[^"\\]|\\.)*")')
_MERGE = b'"type":"registries_merged"'

__all__ = ["BLOCK", "DIRNAME", "SEGMENT_BYTES", "IndexCheck", "Segment", "SegmentError",
           "read_lines", "seal", "sealed", "task_lines"]


class SegmentError(Exception):
    """A sealed segment cannot be read: ``reason`` says why and what to do."""

    def __init__(self, path: Path, seq: int, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.seq = seq
        self.reason = reason


@dataclass(frozen=True)
class Segment:
    path: Path
    first: int
    last: int

    @property
    def index_path(self) -> Path:
        return self.path.with_name(self.path.name[: -len(".jsonl.gz")] + ".idx.json")


def name(first: int, last: int) -> str:
    return f"audit-{first:012d}-{last:012d}.jsonl.gz"


def sealed(directory: Path) -> list[Segment]:
    """The sealed segments in seq order (none: an empty list, one listdir)."""
    try:
        names = os.listdir(directory / DIRNAME)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in names:
        m = _NAME.match(entry)
        if m:
            found.append(Segment(directory / DIRNAME / entry, int(m[1]), int(m[2])))
    found.sort(key=lambda s: s.first)
    return found


def gap(segments: list[Segment], start: int = 1) -> tuple[int, int] | None:
    """The first seq range missing between ``start`` and the segments, or None."""
    expected = start
    for seg in segments:
        if seg.first > expected:
            return expected, seg.first - 1
        expected = max(expected, seg.last + 1)
    return None


def read_lines(seg: Segment) -> Iterator[bytes]:
    """The lines (without newline) of a sealed segment; SegmentError when it cannot be
    decompressed or is cut short."""
    for lines in read_blocks(seg):
        yield from lines


def read_blocks(seg: Segment, start: int = 0,
                check: IndexCheck | None = None) -> Iterator[list[bytes]]:
    """``read_lines`` a list of lines at a time (no generator resumption per line: verify and
    replay read every line of every segment), from the gzip member at byte ``start``. A large
    segment is decompressed by a helper thread a few blocks ahead (zlib releases the GIL),
    overlapping the caller's hashing. ``check`` (a read from byte 0) is fed what the read
    decompresses, to compare the segment's index with afterwards (verify)."""
    try:
        size = seg.path.stat().st_size
    except FileNotFoundError:
        size = 0
    # (a test counts _blocks calls with a two-argument stand-in)
    args: tuple[Any, ...] = (seg, start) if check is None or start else (seg, start, check)
    if size - start < PREFETCH_MIN:
        yield from _blocks(*args)
        return
    import queue  # (here: a cold command that reads no large segment saves ~3 ms)

    ahead: queue.Queue[Any] = queue.Queue(maxsize=8)
    stop = threading.Event()

    def hand(item: Any) -> bool:
        """Queue ``item`` unless the reader has stopped: every hand-over, the end and an
        error too (a plain put blocked for good when a reader stopped 8 blocks before the
        end, and so did the reader's join)."""
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for block in _blocks(*args):
                if not hand(block):
                    return
            hand(None)
        except BaseException as exc:  # handed to the reader, raised there
            hand(exc)

    worker = threading.Thread(target=work, name="fleetclaims-segment-read", daemon=True)
    worker.start()
    try:
        while (item := ahead.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):  # (wakes a hand-over waiting for room now)
            ahead.get_nowait()
        worker.join()


def _blocks(seg: Segment, start: int = 0,
            check: IndexCheck | None = None) -> Iterator[list[bytes]]:
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except FileNotFoundError:
        raise SegmentError(seg.path, seg.first, "the sealed segment vanished while reading: "
                           "restore it from a backup") from None
    try:
        pending = b""
        d = zlib.decompressobj(wbits=31)
        started = False  # d has been fed the start of a member that has not ended yet
        pos = start
        while True:
            chunk = os.pread(fd, 1 << 20, pos)
            if not chunk:
                break
            pos += len(chunk)
            while chunk:
                started = True
                try:
                    data = d.decompress(chunk)
                except zlib.error as exc:
                    raise SegmentError(seg.path, seg.first, f"gzip data damaged before "
                                       f"compressed byte {pos}: {exc}") from None
                chunk = b""
                ended = d.eof
                if ended:  # the next member
                    chunk = d.unused_data
                    d = zlib.decompressobj(wbits=31)
                    started = False
                pending += data
                cut = pending.rfind(b"\n") + 1
                if cut:
                    whole = pending[: cut - 1]
                    if check is not None:
                        check.scan(whole)
                    yield whole.split(b"\n")
                    pending = pending[cut:]
                if ended and check is not None:  # (the member ends where its unused data starts)
                    check.member(pos - len(chunk), whole=not pending)
        if pending or started:
            raise SegmentError(seg.path, seg.first, "the gzip file is cut short")
    finally:
        os.close(fd)


def _compress(lines: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
    """Members of ~BLOCK bytes of whole lines, and for each (compressed offset, length,
    first byte of the raw block)."""
    out: list[bytes] = []
    blocks: list[tuple[int, int, int]] = []
    pos = raw = 0
    while raw < len(lines):
        end = lines.rfind(b"\n", raw, raw + BLOCK) + 1
        if end <= raw:
            end = lines.find(b"\n", raw + BLOCK) + 1 or len(lines)
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        member = c.compress(lines[raw:end]) + c.flush()
        out.append(member)
        blocks.append((pos, len(member), raw))
        pos += len(member)
        raw = end
    return b"".join(out), blocks


def _index(lines: bytes, blocks: list[tuple[int, int, int]]) -> dict[str, Any]:
    tasks: dict[str, list[int]] = {}
    merges: list[int] = []
    for n, (_, _, raw) in enumerate(blocks):
        end = blocks[n + 1][2] if n + 1 < len(blocks) else len(lines)
        block = lines[raw:end]
        for m in _TASK.finditer(block):
            task = orjson.loads(m[1])
            seen = tasks.setdefault(task, [])
            if not seen or seen[-1] != n:
                seen.append(n)
        if _MERGE in block:
            merges.append(n)
    return {"blocks": [[c, n] for c, n, _ in blocks], "tasks": tasks, "merges": merges}


def seal(directory: Path, data: bytes, first: int, last: int, *, sync: bool) -> Segment:
    """Write ``data`` (whole lines ``first``..``last``) as a sealed segment and its index."""
    packed = pack(directory, data, first, last, sync=sync)
    return install(packed, sync=sync)


@dataclass(frozen=True)
class Packed:
    """A segment compressed into a temp file, not yet in place (``install``)."""

    tmp: Path
    segment: Segment
    index: bytes


def write_new(path: Path, data: bytes, *, sync: bool) -> None:
    """Write ``data`` as the file ``path`` (0600, not a link), fsynced when ``sync``: a
    segment or an archived copy before it is renamed into place."""
    fd = fsutil.open_file(path, os.O_WRONLY | os.O_TRUNC, create=True)
    try:
        fsutil.write_paced(fd, data, sync=sync)
        if sync:
            osc.fsync(fd)
    finally:
        os.close(fd)


def pack(directory: Path, data: bytes, first: int, last: int, *, sync: bool,
         tmp: Path | None = None) -> Packed:
    """Compress ``data`` into a temp file beside the segments (a name of its own: two
    processes may pack the same lines at once), or into ``tmp`` (see ``packed_by_child``)."""
    folder = directory / DIRNAME
    folder.mkdir(mode=0o700, exist_ok=True)
    seg = Segment(folder / name(first, last), first, last)
    packed, blocks = _compress(data)
    index = orjson.dumps(_index(data, blocks))
    if tmp is None:
        tmp = folder / f".{seg.path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    write_new(tmp, packed, sync=sync)
    crash_point("segment.after_compress")
    return Packed(tmp, seg, index)


def child_pack_path(directory: Path, first: int, last: int, pid: int) -> Path:
    """Where a rotation's forked child packs lines ``first``..``last`` for its parent ``pid``
    to install (a temp name: swept like a helper's if nobody installs it)."""
    return directory / DIRNAME / f".{name(first, last)}.{pid}-child.tmp"


def pack_for_parent(directory: Path, data: bytes, first: int, last: int, *, sync: bool,
                    tmp: Path) -> None:
    """In a forked child: pack into ``tmp`` and leave the index beside it (``.idx``)."""
    packed = pack(directory, data, first, last, sync=sync, tmp=tmp)
    write_new(_child_index(tmp), packed.index, sync=False)


def packed_by_child(directory: Path, first: int, last: int, tmp: Path) -> Packed | None:
    """What ``pack_for_parent`` left at ``tmp``, ready to install; None when it is not there."""
    try:
        with open(_child_index(tmp), "rb") as f:
            index = f.read()
        if not tmp.is_file():
            return None
    except OSError:
        return None
    return Packed(tmp, Segment(directory / DIRNAME / name(first, last), first, last), index)


def _child_index(tmp: Path) -> Path:
    return tmp.with_name(tmp.name.removesuffix(".tmp") + ".idx.tmp")  # (swept as a temp file)


def discard_child_pack(tmp: Path) -> None:
    for path in (tmp, _child_index(tmp)):
        with contextlib.suppress(OSError):
            path.unlink()


def install(packed: Packed, *, sync: bool) -> Segment:
    """Rename a packed segment into place, then write its (derived) index."""
    seg = packed.segment
    folder = seg.path.parent
    osc.replace(str(packed.tmp), str(seg.path))
    if sync:
        fsutil.fsync_dir(folder)
    crash_point("segment.after_seal")
    # The index is derived: written after the segment, never trusted over it (a missing or
    # unreadable one means reading the whole segment).
    with contextlib.suppress(OSError):
        itmp = folder / f".{seg.index_path.name}.{os.getpid()}.tmp"
        ifd = fsutil.open_file(itmp, os.O_WRONLY | os.O_TRUNC, create=True)
        try:
            write_at(ifd, packed.index, 0)
        finally:
            os.close(ifd)
        os.replace(itmp, seg.index_path)
    return seg


def discard(packed: Packed) -> None:
    with contextlib.suppress(OSError):
        packed.tmp.unlink()


def _block_lines(seg: Segment, offset: int, length: int) -> list[bytes]:
    """The lines of the gzip member at ``offset`` (``length`` bytes, as the index says):
    SegmentError unless those bytes are exactly one member of whole lines."""
    with open(seg.path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    d = zlib.decompressobj(wbits=31)
    try:
        data = d.decompress(raw)
    except zlib.error as exc:
        raise SegmentError(seg.path, seg.first, f"gzip member at byte {offset} damaged: "
                           f"{exc}") from None
    if len(raw) != length or not d.eof or d.unused_data or not data.endswith(b"\n"):
        raise SegmentError(seg.path, seg.first, f"no gzip member of whole lines at byte "
                           f"{offset} ({length} bytes)")
    return data.split(b"\n")[:-1]


def _members(value: Any, count: int) -> bool:
    """Whether ``value`` is a list of member numbers below ``count`` (ints, not bools)."""
    return isinstance(value, list) and all(type(n) is int and 0 <= n < count for n in value)


def _indexed(seg: Segment) -> dict[str, Any] | None:
    """The segment's index when it is readable and fits the file, else None: the caller reads
    the whole segment. It fits when its members tile the file exactly (contiguous from byte 0,
    positive lengths summing to the file's size): an index left from before the segment was
    re-compressed, or edited by hand, must never make a read fail or raise (it is derived;
    ``audit verify`` compares it with the segment's contents, ``IndexCheck``)."""
    try:
        index = orjson.loads(seg.index_path.read_bytes())
        size = seg.path.stat().st_size
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(index, dict) or not isinstance(index.get("tasks"), dict):
        return None
    blocks = index.get("blocks")
    if not isinstance(blocks, list) or not blocks or not _members(index.get("merges"),
                                                                   len(blocks)):
        return None
    pos = 0
    for block in blocks:
        if (not isinstance(block, list) or len(block) != 2 or type(block[0]) is not int
                or type(block[1]) is not int or block[0] != pos or block[1] <= 0):
            return None
        pos += block[1]
    return index if pos == size else None


def task_lines(seg: Segment, task: str) -> Iterator[tuple[int, bytes]]:
    """(offset 0, line) of each line of ``seg`` that may be about ``task`` (the caller checks
    the seal and the task): through the index when it is readable and fits, else the whole
    segment (also when a member the index names does not read as one: the whole read then
    names real damage, or finds the lines a stale index placed wrongly)."""
    needle = b'"task":' + orjson.dumps(task)
    found = _through_index(seg, task, needle)
    lines: Iterator[bytes] = iter(found) if found is not None else (
        line for line in read_lines(seg) if needle in line or _MERGE in line)
    for line in lines:
        yield 0, line


def _through_index(seg: Segment, task: str, needle: bytes) -> list[bytes] | None:
    """The lines of the members the index names for ``task`` (and merges), or None when the
    index is missing, does not fit or names a member that does not read as one."""
    index = _indexed(seg)
    if index is None:
        return None
    blocks = index["blocks"]
    named = index["tasks"].get(task, [])
    if not _members(named, len(blocks)):
        return None
    found: list[bytes] = []
    try:
        for n in sorted(set(named) | set(index["merges"])):
            offset, length = blocks[n]
            found.extend(line for line in _block_lines(seg, offset, length)
                         if needle in line or _MERGE in line)
    except (OSError, SegmentError):
        return None
    return found


class IndexCheck:
    """The index a whole read of a segment implies (its gzip members; per task, and for merges,
    the members holding such lines), built from the bytes the read decompresses anyway
    (``read_blocks(check=)``). ``problem`` compares the segment's index file with it: an
    index that lists a task wrongly hides the task's events from ``explain`` (verify names it)."""

    def __init__(self) -> None:
        self.blocks: list[list[int]] = []
        self.tasks: dict[bytes, list[int]] = {}  # by the task's JSON text (decoded at the end)
        self.merges: list[int] = []
        self.whole = True  # every member ends at a line's end (as sealing writes them)

    def scan(self, data: bytes) -> None:
        """Whole lines of the member being read."""
        n = len(self.blocks)
        for m in _TASK.finditer(data):
            seen = self.tasks.setdefault(m[1], [])
            if not seen or seen[-1] != n:
                seen.append(n)
        if _MERGE in data and (not self.merges or self.merges[-1] != n):
            self.merges.append(n)

    def member(self, end: int, *, whole: bool) -> None:
        """The member being read ends at byte ``end``."""
        start = self.blocks[-1][0] + self.blocks[-1][1] if self.blocks else 0
        self.blocks.append([start, end - start])
        self.whole = self.whole and whole

    def problem(self, seg: Segment) -> str | None:
        """What is wrong with ``seg``'s index file (None: it matches, or there is none)."""
        try:
            why = self._differs(seg.index_path.read_bytes())
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = f"it cannot be read: {exc.strerror}"
        if why is None:
            return None
        harm = ("until it is gone `explain` and `audit --task` may miss that segment's events"
                if _indexed(seg) is not None else "readers ignore it")
        return (f"{seg.index_path} does not match its segment {seg.path.name} ({why}); {harm}. "
                "The index is derived data: delete it (the segment, which verifies, is then "
                "read whole)")

    def _differs(self, data: bytes) -> str | None:
        try:
            index = orjson.loads(data)
        except orjson.JSONDecodeError:
            return "it is not readable JSON"
        if not isinstance(index, dict) or set(index) != {"blocks", "tasks", "merges"}:
            return "it is not an index: the keys blocks, tasks and merges are expected"
        if not self.whole:
            return "the segment's gzip members do not end at line ends"
        if _canon(index["blocks"]) != _canon(self.blocks):
            return "the gzip members it names are not the file's: re-compressed or replaced?"
        tasks: dict[str, list[int]] = {}
        for text, members in self.tasks.items():
            with contextlib.suppress(orjson.JSONDecodeError):
                task = orjson.loads(text)
                tasks[task] = sorted({*tasks.get(task, ()), *members})
        listed = index["tasks"]
        if not isinstance(listed, dict):
            return "its task list is not an object"
        wrong = sorted(t for t in tasks.keys() | listed.keys()
                       if _canon(listed.get(t)) != _canon(tasks.get(t)))
        if wrong:
            shown = ", ".join(repr(t) for t in wrong[:3]) + (", ..." if len(wrong) > 3 else "")
            return f"the members it names differ for {len(wrong)} task(s): {shown}"
        if _canon(index["merges"]) != _canon(self.merges):
            return "the members it names for registries_merged events differ"
        return None


def _canon(value: Any) -> bytes:
    """JSON text to compare parsed values by (so that true is not 1)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def resume_point(seg: Segment, after: int) -> tuple[int, int, str] | None:
    """Where a read of the events after seq ``after`` (within ``seg``) can start: (byte offset
    of the gzip member holding seq ``after`` + 1, the seq before that member's first line, the
    hash that line links to), found by a binary search over the index's members (each probe
    decompresses one, ~1 ms). None when the index is unreadable or does not fit the file: the
    caller reads the segment from its start."""
    index = _indexed(seg)
    blocks = index.get("blocks") if index is not None else None
    if not isinstance(blocks, list) or not blocks or not seg.first <= after + 1 <= seg.last:
        return None

    def first_of(n: int) -> tuple[int, int, str] | None:
        try:
            offset, length = blocks[n]
            line = _block_lines(seg, int(offset), int(length))[0]
            event = orjson.loads(line)
            seq, prev = event["seq"], event["prev"]
        except (SegmentError, OSError, IndexError, KeyError, TypeError, ValueError):
            return None
        return (int(offset), seq - 1, prev) if type(seq) is int and type(prev) is str else None

    lo, hi = 0, len(blocks) - 1  # the last member whose first line is at most after + 1
    best = first_of(0)
    if best is None or best[1] != seg.first - 1:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        probe = first_of(mid)
        if probe is None:
            return None
        if probe[1] + 1 <= after + 1:
            lo, best = mid, probe
        else:
            hi = mid - 1
    return best


def last_link(seg: Segment) -> tuple[int, str]:
    """(seq, hash) of the segment's last line (reads the segment)."""
    last = b""
    for last in read_lines(seg):  # noqa: B007 - the last one is wanted
        pass
    try:
        digest = check_seal(last)
    except ChainError as exc:
        raise SegmentError(seg.path, seg.last, f"last line does not verify: {exc}") from None
    return seq_of(last) or 0, digest


def before_active(directory: Path, seq: int) -> bool:
    """Whether event ``seq`` lies before the active journal (in a sealed or archived segment):
    damage there is repaired by restoring the file, never by rewriting audit.jsonl (doctor)."""
    sealed_ = sealed(directory)
    if not sealed_ and not (directory / DIRNAME / "archived.json").exists():
        return False
    try:
        with open(directory / "audit.jsonl", "rb") as f:
            first = seq_of(f.read(64))
    except FileNotFoundError:
        first = None
    if first is None:  # an empty active journal: it starts after the sealed ones
        return True
    return seq < first
