"""The snapshot (``claims.json``): its codec and the files it is written through.

A snapshot is a checkpoint of the journal at ``seq``: the state, plus the journal ``offset`` and
``head`` it was taken at, closed by a SHA-256 checksum of its own bytes. It is written by temp
file + fsync + ``os.replace`` + directory fsync (``write_snapshot``), so a reader sees the old one
or the new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...core.errors import FleetclaimsError, UnsafeRegistry
from ...core.model import Claim
from ...core.ports import ClaimView
from ...core.state import ClaimTable, State, TaskTable
from ...system import pid_exists
from . import fsutil
from .faults import crash_point, osc
from .journal import line_before
from .lock import swapping
from .snapshot_lines import Section
from .snapshot_table import (
    Packer,
    SnapshotClaims,
    encode_all,
    encode_sections,
    renumber,
)

if TYPE_CHECKING:
    from .snapshot_lines import Buffer

__all__ = ["Snapshot", "SnapshotClaims", "SnapshotError", "adoptable", "claim_records",
           "decode_snapshot",
           "encode_snapshot", "read_snapshot", "write_snapshot"]

# 1, 2 (still read): one JSON object. 3 (still read; written for a few hours of 2026-12-01): a
# claim a line (snapshot_table.py), its identity number anywhere in it. 4: the same, the
# identity number always a line's last member (what lets a checkpoint renumber without parsing)
SNAPSHOT_FORMAT = 4
_LINE_FORMATS = (3, 4)
TMP_PREFIX = "claims.json.tmp-"
_CHECKSUM_MARK = b',"checksum":"'
_CHECKSUM_SUFFIX = len(_CHECKSUM_MARK) + 64 + 2
_PARALLEL_HASH_MIN = 1 << 20  # below this, starting a thread costs more than it saves
_READ_PIECE = 1 << 20  # a large snapshot is read (and hashed behind the reading) in these
_TAIL = 1 << 12  # left to decode_snapshot to hash: the body ends in it, just before the checksum
# The frame of formats 3 and 4 around its two sections of lines (see snapshot_table.py).
_CLAIMS_OPEN = b',\n"claims":{\n'
_ENDED_OPEN = b'\n},\n"ended":{\n'
_SECTION_CLOSE = b"\n}"
_TASKS_OPEN = b',\n"tasks":'

#: seconds a checkpoint written without the registry lock waits for a rotation's switch
SWAP_WAIT = 5.0


@dataclass
class Snapshot:
    state: State
    offset: int
    size: int


class SnapshotError(ValueError):
    pass


def encode_snapshot(state: State, offset: int) -> bytes:
    """The snapshot of ``state`` at journal ``offset`` (format 4). Lines of a loaded snapshot
    that nothing changed are copied, not re-encoded; afterwards the state's claim table holds
    the bytes written (same content), so what changed since leaves memory."""
    table = state.claims
    packer = Packer()
    sections = None
    identities = packer.identities
    if (isinstance(table, SnapshotClaims) and table.incremental()
            and all(-1 <= n < len(table._identities) for n in table.refs())):
        # (a line naming no identity of its table, damage, is packed afresh below: as -1)
        sections = encode_sections(table, packer)
        refs = sections[2]
        if any(refs[i] <= 0 for i in range(len(identities))):
            # An identity no claim names any more: drop it, renumber the others.
            live, ended, refs, identities = renumber(sections[0], sections[1], identities)
            sections = (live, ended, refs)
    if sections is None:
        sections = encode_all(table, packer)
    live, ended, refs = sections
    del sections
    live_len, ended_len = sum(map(len, live)), sum(map(len, ended))
    header = orjson.dumps({"format": SNAPSHOT_FORMAT, "seq": state.seq, "offset": offset,
                           "head": state.head, "origin": state.origin, "fence": state.fence,
                           "identities": identities,
                           "bytes": {"claims": live_len, "ended": ended_len}})
    tail = _SECTION_CLOSE
    if len(state.tasks):  # the work queue; absent from registries that never used it
        tail += _TASKS_OPEN + orjson.dumps(dict(state.tasks.raw_items()))
    pieces = [header[:-1], _CLAIMS_OPEN, *live, _ENDED_OPEN, *ended, tail]
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    digest.update(b"}")
    data = b"".join([*pieces, _CHECKSUM_MARK, digest.hexdigest().encode(), b'"}\n'])
    del pieces, live, ended  # (views of the old bytes: released before they are dropped)
    at = len(header) - 1 + len(_CLAIMS_OPEN)
    live_at = (at, at + live_len)
    at = live_at[1] + len(_ENDED_OPEN)
    ended_at = (at, at + ended_len)
    # A new table in place of the old one, in one assignment: the old table is not changed
    # (a thread reading it meanwhile sees it whole), and what changed leaves memory.
    if isinstance(table, SnapshotClaims):
        state.claims = table.rebased(data, live_at, ended_at, identities, refs)
    elif isinstance(table, ClaimTable):
        fresh = SnapshotClaims()
        fresh._claims = dict(table.loaded())
        state.claims = fresh.rebased(data, live_at, ended_at, identities, refs)
    return data


def adoptable(data: bytes, seq: int) -> tuple[Section, Section, list[Any]] | None:
    """(live section, ended section, identities) of ``data``, a format-4 snapshot at ``seq``
    that a forked child of this process just wrote (its size and checksum already compared
    with what the child reported), or None when it is not one."""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    if end < _CHECKSUM_SUFFIX + 2 or not data.startswith(b'{"format":4,'):
        return None
    # (Its work queue is not parsed: the parent keeps its own, and parsing ~1.5 MB of tasks
    # at 10,000 open tasks held the GIL against the writer's operations on this thread.)
    obj = _frame(data, end - _CHECKSUM_SUFFIX, tasks=False)
    if isinstance(obj, SnapshotError) or obj.get("seq") != seq:
        return None
    identities = obj.get("identities")
    if not isinstance(identities, list):
        return None
    return obj["_live"], obj["_ended"], identities


def decode_snapshot(data: Buffer, hashed: tuple[Any, int] | None = None) -> Snapshot:
    """Parse and check a snapshot; raises SnapshotError saying what is wrong. ``hashed``: a
    sha256 already fed the first n bytes of ``data`` (see _read_large)."""
    # No slice of the whole file is ever copied: on a cold start each fresh copy of a 6 MB
    # snapshot costs ~5 ms of page faults (bench/run.py coldstart).
    # (No endswith/startswith: a large snapshot is read into an mmap.mmap, which has neither.)
    end = len(data) - 1 if data[-1:] == b"\n" else len(data)
    if end < _CHECKSUM_SUFFIX + 2:
        raise SnapshotError("file is empty or truncated")
    cut = end - _CHECKSUM_SUFFIX
    if data[cut : cut + len(_CHECKSUM_MARK)] != _CHECKSUM_MARK or data[end - 2 : end] != b'"}':
        raise SnapshotError("no checksum at the end (truncated or edited)")
    digest, done = hashed if hashed is not None and hashed[1] <= cut else (hashlib.sha256(), 0)
    rest = memoryview(data)[done:cut]  # (the body, but for what ``hashed`` has seen)
    obj: Any
    if data[:12] in (b'{"format":3,', b'{"format":4,'):
        digest.update(rest)  # (only its header and frame are parsed: nothing to overlap)
        obj = _frame(data, cut)
    else:
        obj = _parse_whole(data, rest, digest)
    del rest
    digest.update(b"}")
    if digest.hexdigest().encode() != data[cut + len(_CHECKSUM_MARK) : end - 2]:
        raise SnapshotError("checksum does not match the contents")
    if isinstance(obj, SnapshotError):
        raise obj
    if not isinstance(obj, dict) or obj.get("format") not in (1, 2, *_LINE_FORMATS):
        found = obj.get("format") if isinstance(obj, dict) else obj
        raise SnapshotError(f"unknown format {found!r}")
    return _checked(obj, data)


def _parse_whole(data: Buffer, body: memoryview, digest: Any) -> Any:
    """Format 1/2: the whole file is the body plus one last member (the checksum), so it
    parses to the body's object plus a "checksum" key nobody reads. hashlib releases the GIL
    over large inputs and orjson holds it, so a large snapshot is hashed on another thread
    while it is parsed."""
    hasher = None
    if len(body) >= _PARALLEL_HASH_MIN:
        hasher = threading.Thread(target=digest.update, args=(body,), daemon=True)
        try:
            hasher.start()
        except RuntimeError:  # no new threads (interpreter shutdown): hash here instead
            hasher = None
    if hasher is None:
        digest.update(body)
    try:
        return orjson.loads(data if isinstance(data, bytes) else memoryview(data))
    except orjson.JSONDecodeError as exc:
        return SnapshotError(f"not valid JSON: {exc}")
    finally:
        if hasher is not None:
            hasher.join()


def _frame(data: Buffer, cut: int, *, tasks: bool = True) -> dict[str, Any] | SnapshotError:
    """The header of a format-3 snapshot, with its sections located ("_live", "_ended") and
    its work queue parsed (unless not ``tasks``: then only located); the claim lines are not
    parsed (they are looked up in place)."""
    nl = data.find(b"\n", 0, cut)
    if nl < 1 or data[nl - 1 : nl] != b",":
        return SnapshotError("a claim-a-line snapshot without its header line")
    try:
        obj = orjson.loads(data[: nl - 1] + b"}")
    except orjson.JSONDecodeError as exc:
        return SnapshotError(f"not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return SnapshotError("the header is not an object")
    # The header gives the byte length of each section (no scan of the lines to find them).
    sizes = obj.get("bytes")
    live_len = sizes.get("claims") if isinstance(sizes, dict) else None
    ended_len = sizes.get("ended") if isinstance(sizes, dict) else None
    if type(live_len) is not int or type(ended_len) is not int or min(live_len, ended_len) < 0:
        return SnapshotError("a claim-a-line snapshot without the byte lengths of its sections")
    start = nl - 1 + len(_CLAIMS_OPEN)
    live_end = start + live_len
    ended_start = live_end + len(_ENDED_OPEN)
    ended_end = ended_start + ended_len
    if (data[nl - 1 : start] != _CLAIMS_OPEN or data[live_end:ended_start] != _ENDED_OPEN
            or data[ended_end : ended_end + len(_SECTION_CLOSE)] != _SECTION_CLOSE
            or ended_end + len(_SECTION_CLOSE) > cut):
        return SnapshotError("the claim sections are not where the header says")
    after = ended_end + len(_SECTION_CLOSE)
    obj["claims"], obj["_live"], obj["_ended"] = {}, (start, live_end), (ended_start, ended_end)
    if after < cut:
        if data[after : after + len(_TASKS_OPEN)] != _TASKS_OPEN:
            return SnapshotError("unexpected members after the claim sections")
        if not tasks:
            return obj
        try:
            obj["tasks"] = orjson.loads(data[after + len(_TASKS_OPEN) : cut])
        except orjson.JSONDecodeError as exc:
            return SnapshotError(f"not valid JSON: {exc}")
    return obj


def _checked(obj: dict[str, Any], data: Buffer) -> Snapshot:
    """The snapshot of a parsed (format 1/2) or framed (3/4) object, its members checked."""
    packed = obj["format"] != 1
    seq, offset, fence = obj.get("seq"), obj.get("offset"), obj.get("fence")
    head, origin, claims = obj.get("head"), obj.get("origin"), obj.get("claims")
    for name, value in (("seq", seq), ("offset", offset), ("fence", fence)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SnapshotError(f"{name} is not a non-negative integer")
    if not isinstance(head, str) or len(head) != 64:
        raise SnapshotError("head is not a hash")
    if not isinstance(origin, str) or not isinstance(claims, dict):
        raise SnapshotError("origin or claims have the wrong type")
    identities = obj.get("identities", []) if packed else []
    if not isinstance(identities, list) or not all(isinstance(i, dict) for i in identities):
        raise SnapshotError("identities is not a list of objects")
    # A packed entry never names its task; a format-1 entry names its own. (The quick test of
    # every entry first: a cold command loads 10,000 of them.)
    if not (all(type(e) is dict and "task" not in e for e in claims.values()) if packed
            else all(type(e) is dict and e.get("task") == t for t, e in claims.items())):
        for task, entry in claims.items():
            if not isinstance(entry, dict) or (
                "task" in entry if packed else entry.get("task") != task
            ):
                raise SnapshotError(f"claim entry {task!r} is malformed")
    tasks = obj.get("tasks", {})
    if not isinstance(tasks, dict):
        raise SnapshotError("tasks has the wrong type")
    for task, entry in tasks.items():
        if not isinstance(entry, dict) or entry.get("task") != task:
            raise SnapshotError(f"task entry {task!r} is malformed")
    if obj["format"] in _LINE_FORMATS:
        if "_live" not in obj:
            raise SnapshotError("a claim-a-line snapshot that is not laid out a claim a line "
                                "(reformatted?)")
        table = SnapshotClaims.over(data, obj["_live"], obj["_ended"], identities)
        table._rewrite = obj["format"] != SNAPSHOT_FORMAT  # (3: re-encoded once, as 4)
    else:
        table = SnapshotClaims(claims)
        table._identities = identities
    state = State(table, seq, fence, head, origin,  # type: ignore[arg-type]
                  TaskTable(tasks))
    return Snapshot(state, offset, len(data))  # type: ignore[arg-type]


def claim_records(table: ClaimView) -> Iterator[tuple[str, Claim]]:
    """(task, Claim) for every entry of ``table``; a snapshot's are built afresh and not kept
    (see SnapshotClaims.converted)."""
    if isinstance(table, SnapshotClaims):
        return table.converted()
    return ((c.task, c) for c in table.values())


# --- the files -------------------------------------------------------------------------------


def snapshot_seq(path: Path) -> int:
    """The seq of the snapshot at ``path`` from its first bytes (``{"format":1,"seq":N,``);
    -1 when absent or unreadable."""
    return snapshot_position(path)[0]


def snapshot_position(path: Path) -> tuple[int, int]:
    """(seq, offset) of the snapshot at ``path`` from its first bytes
    (``{"format":4,"seq":N,"offset":M,``), unverified; -1 for what is absent or unreadable.
    For scheduling only (whether a checkpoint is still owed): never for state."""
    try:
        fd = os.open(path, os.O_RDONLY | fsutil.O_NOFOLLOW | fsutil.O_CLOEXEC | fsutil.O_NONBLOCK)
    except OSError:
        return -1, -1
    try:
        head = os.pread(fd, 96, 0)
    except OSError:
        return -1, -1
    finally:
        os.close(fd)
    return _header_int(head, b'"seq":'), _header_int(head, b'"offset":')


def _header_int(head: bytes, marker: bytes) -> int:
    at = head.find(marker)
    if at < 0:
        return -1
    digits = head[at + len(marker) :].split(b",", 1)[0]
    return int(digits) if digits.isdigit() else -1


def read_snapshot(path: Path) -> tuple[Snapshot | None, str | None]:
    """The snapshot at ``path``, or (None, what is wrong with it); (None, None) when absent.
    An unsafe file (symlink, FIFO, hard link) raises UnsafeRegistry."""
    try:
        fd = fsutil.open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    except UnsafeRegistry:
        raise
    data: Buffer
    try:
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = 0
        loaded = _read_large(fd, size) if size >= _PARALLEL_HASH_MIN else None
        if loaded is None:
            data, hashed = fsutil.read_all(fd), None
        else:
            data, hashed = loaded
    finally:
        os.close(fd)
    try:
        return decode_snapshot(data, hashed), None
    except SnapshotError as exc:
        return None, str(exc)


def _read_large(fd: int, size: int) -> tuple[Buffer, tuple[Any, int]] | None:
    """The ``size`` bytes of the file open at ``fd``, with a sha256 of all but their last
    _TAIL bytes; None when the file is not ``size`` bytes long (then read it as any file: the
    descriptor is back at its start).

    A fresh process loading 100,000 claims (40 MB) spent ~40 ms reading them into a new bytes
    object (page faults of its 10,000 pages, mostly) and then ~31 ms hashing them. Read a piece
    at a time into memory taken beforehand, while a thread hashes the pieces already read
    (hashlib releases the GIL), both take ~45 ms. A bytes object cannot be filled piece by
    piece and a bytearray is zeroed first (the same page faults again); an anonymous private
    mmap is neither. It is the process's own memory, not a mapping of the file: a file
    truncated meanwhile gives a short read here, never SIGBUS. Huge pages (MADV_HUGEPAGE) were
    measured and not asked for: ~13 ms of reading instead of ~40 back to back, but slower than
    small pages on a VM whose free memory goes back to the host when idle (bench/README.md).
    Nothing read here is trusted before decode_snapshot has compared the checksum."""
    import mmap  # (here: a small registry's fresh process does not pay for importing it)

    try:
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    except (OSError, ValueError, OverflowError):  # (no room for it in one piece)
        return None
    view = memoryview(buf)
    limit = max(size - _TAIL, 0)
    digest = hashlib.sha256()
    starts = range(0, limit, _READ_PIECE)
    ready = threading.Semaphore(0)  # released once for each piece read in full
    stopped: list[bool] = []  # set before a last release when the reading stops short
    done = [0]  # pieces hashed

    def hash_behind() -> None:
        for at in starts:
            ready.acquire()
            if stopped:
                return
            digest.update(view[at : min(at + _READ_PIECE, limit)])
            done[0] += 1

    hasher = threading.Thread(target=hash_behind, daemon=True, name="fleetclaims-snapshot-hash")
    try:
        hasher.start()
        started = True
    except RuntimeError:  # no new threads (interpreter shutdown): hashed after the reading
        started = False
    whole = False
    try:
        at = released = 0
        while at < size:
            n = os.readv(fd, [view[at : min(at + _READ_PIECE, size)]])
            if n <= 0:
                break
            at += n
            while released < len(starts) and min(starts[released] + _READ_PIECE, limit) <= at:
                released += 1
                ready.release()
        whole = at == size and not os.read(fd, 1)  # (neither shorter nor longer than said)
    finally:
        if not whole:
            stopped.append(True)
            ready.release()
        if started:
            hasher.join()
    if not whole:
        os.lseek(fd, 0, os.SEEK_SET)
        return None
    if done[0] != len(starts):  # (no thread, or it failed: never a checksum of half a file)
        digest = hashlib.sha256(view[:limit])
    return buf, (digest, limit)


def anchor_problem(fd: int, snapshot: Snapshot) -> str | None:
    """Why ``snapshot`` is not a checkpoint of the journal open at ``fd``, or None: its offset
    must end the journal line whose seq and hash are the snapshot's seq and head."""
    size = os.fstat(fd).st_size
    if snapshot.offset > size:
        return f"snapshot offset {snapshot.offset} is past the journal end ({size} bytes)"
    if snapshot.offset == 0:
        return None if snapshot.state.seq == 0 else "snapshot at offset 0 claims events"
    found = line_before(fd, snapshot.offset)
    if found is None:
        return "snapshot offset is not at a line boundary of the journal"
    _, line = found
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "the journal line at the snapshot offset is damaged"
    if not isinstance(event, dict) or event.get("hash") != snapshot.state.head or event.get(
        "seq"
    ) != snapshot.state.seq:
        return "the snapshot's head does not match the journal at its offset"
    return None


def write_snapshot(directory: Path, target: Path, data: bytes, *, sync: bool,
                   unless_seq: int | None = None,
                   unless: Callable[[], bool] | None = None,
                   guard: Path | None = None) -> bool:
    """Write ``data`` to ``target`` by temp file + fsync + rename + directory fsync.

    ``unless_seq``: give up (False) when the snapshot already there has at least this seq (a
    checkpoint written outside the lock may race another process's, and must never replace a
    newer one); ``unless``: give up when it says so just before the rename (the journal it
    was taken of was replaced meanwhile: a rotation); ``guard``: the registry directory of a
    writer without the registry lock, whose check and rename hold its flock (lock.swapping:
    a rotation cannot replace claims.json and the journal in between; False when a stopped
    process held it too long). Raises OSError (or FleetclaimsError) after removing the temp
    file."""
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = fsutil.open_file(tmp, os.O_WRONLY | os.O_EXCL, create=True)
        try:
            # A large one is flushed even where durability does not ask for it: renamed over
            # claims.json with its blocks not yet allocated, ext4 (auto_da_alloc) allocates
            # and starts writing them inside the rename, under the directory's lock (~17 ms
            # for 40 MB, the rotation's rename being made under the registry lock too).
            flush = sync or len(data) >= fsutil.PACE
            fsutil.write_paced(fd, data, sync=flush,
                               halfway=lambda: crash_point("snapshot.during_write"))
            if sync:
                osc.fsync(fd)
            elif flush:
                osc.fdatasync(fd)
        finally:
            os.close(fd)
        crash_point("snapshot.after_fsync")
        with swapping(guard, SWAP_WAIT) if guard is not None else contextlib.nullcontext(
                True) as held:
            if not held or (unless_seq is not None and snapshot_seq(target) >= unless_seq) or (
                    unless is not None and unless()):
                os.unlink(tmp)
                return False
            crash_point("snapshot.before_rename")
            replaced = fsutil.replace_over(tmp, target)
        try:
            crash_point("snapshot.after_rename")
            if sync:
                fsutil.fsync_dir(directory)
        finally:
            if replaced >= 0:
                os.close(replaced)
    except (OSError, FleetclaimsError):
        # (Not on any exception: a simulated crash must leave the temp file, as a real one.)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def sweep_temp_files(directory: Path) -> None:
    """Remove temp snapshots left by writers that died mid-checkpoint: redundant copies of
    journal state, safe to remove. A temp file of a live process (named by its PID) may be
    a checkpoint in progress, written outside the lock, and is left alone."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            if not entry.name.startswith(TMP_PREFIX) or not entry.is_file(follow_symlinks=False):
                continue
            pid = entry.name[len(TMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and pid_exists(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
