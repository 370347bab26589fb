"""Reading the journal and the snapshot: parsing, chain checks, verification.

Used by the file store, ``audit verify``, ``doctor`` and ``merge``; pure functions over bytes
plus a streaming reader over a file descriptor.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from ...core import events as ev
from ...core.chain import ChainError, check_seal
from ...core.errors import AuditCorrupt, RegistryCorrupt
from ...core.model import DEFAULT_PHASE, GENESIS, LISTING_BASE, Claim, ClaimTable, State
from ...core.queue import TaskTable
from ..base import VerifyReport

CHUNK = 1 << 20
SNAPSHOT_FORMAT = 2  # 1 (still read): claims as persisted dicts; 2: packed (_Packer)
_CHECKSUM_MARK = b',"checksum":"'
_CHECKSUM_SUFFIX = len(_CHECKSUM_MARK) + 64 + 2
_PARALLEL_HASH_MIN = 1 << 20  # below this, starting a thread costs more than it saves


def parse_line(line: bytes, *, seq: int, prev: str, offset: int, path: str) -> dict[str, Any]:
    """Check one complete line (no newline) against the chain and return the event."""
    try:
        check_seal(line)
        event = orjson.loads(line)
    except (ChainError, orjson.JSONDecodeError) as exc:
        raise AuditCorrupt(path, seq=seq, offset=offset, reason=str(exc)) from None
    if not isinstance(event, dict):
        raise AuditCorrupt(path, seq=seq, offset=offset, reason="line is not a JSON object")
    if event.get("seq") != seq:
        raise AuditCorrupt(
            path, seq=seq, offset=offset,
            reason=f"expected seq {seq}, found {event.get('seq')!r} (lines missing or reordered)",
        )
    if event.get("prev") != prev:
        raise AuditCorrupt(
            path, seq=seq, offset=offset,
            reason="prev hash does not match the line before (lines missing, reordered or edited)",
        )
    if not isinstance(event.get("type"), str) or not isinstance(event.get("ts"), (int, float)):
        raise AuditCorrupt(path, seq=seq, offset=offset, reason="event lacks a type or timestamp")
    return event


def apply_checked(state: State, event: dict[str, Any], offset: int, path: str) -> None:
    try:
        ev.apply(state, event)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AuditCorrupt(
            path, seq=int(event.get("seq", state.seq + 1)), offset=offset,
            reason=f"event cannot be applied: {exc!r}",
        ) from None


def iter_lines(
    fd: int, start: int, end: int | None = None, *, chunk_size: int = CHUNK
) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, line without newline, complete) for each line from ``start`` (to ``end``).

    The journal is preallocated with zero bytes (so an append rewrites allocated blocks and its
    fdatasync needs no metadata commit); the first NUL byte is the end of the data."""
    pos = start
    pending = b""
    pending_at = start
    want = chunk_size
    while end is None or pos < end:
        if end is not None:
            want = min(want, end - pos)
        chunk = os.pread(fd, want, pos)
        # Start small (a writer catching up reads a few lines, and the preallocated zeros
        # after them cost a copy too), then grow to CHUNK for long replays.
        want = min(want * 8, CHUNK)
        if not chunk:
            break
        nul = chunk.find(b"\0")
        if nul >= 0:
            chunk = chunk[:nul]
            end = pos + nul  # stop here: the rest is unused space
        pos += len(chunk)
        data = pending + chunk if pending else chunk
        base = pending_at
        cut = 0
        while True:
            nl = data.find(b"\n", cut)
            if nl < 0:
                break
            yield base + cut, data[cut:nl], True
            cut = nl + 1
        pending = data[cut:]
        pending_at = base + cut
    if pending:
        yield pending_at, pending, False


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


def line_before(fd: int, offset: int) -> tuple[int, bytes] | None:
    """The complete line that ends at ``offset`` (its offset and bytes), or None at 0."""
    if offset <= 0:
        return None
    back = 4096
    while True:
        start = max(0, offset - back)
        data = os.pread(fd, offset - start, start)
        if len(data) != offset - start or not data.endswith(b"\n"):
            return None
        nl = data.rfind(b"\n", 0, len(data) - 1)
        if nl >= 0:
            return start + nl + 1, data[nl + 1 : -1]
        if start == 0:
            return 0, data[:-1]
        back *= 4


def seq_of(line: bytes) -> int | None:
    """The seq of a line cheaply (it is the first member), or None."""
    if not line.startswith(b'{"seq":'):
        return None
    end = line.find(b",", 7)
    try:
        return int(line[7:end])
    except ValueError:
        return None


def find_offset(fd: int, after_seq: int, lo: int, hi: int, lo_seq: int) -> int:
    """Byte offset of the first line with seq > after_seq, by binary search in [lo, hi).

    ``lo`` is a line start whose line has seq ``lo_seq + 1``; lines are in seq order.
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
        nxt = os.pread(fd, 256, start)
        seq = seq_of(nxt)
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


# --- snapshot --------------------------------------------------------------------------------


@dataclass
class Snapshot:
    state: State
    offset: int
    size: int


class SnapshotError(ValueError):
    pass


def encode_snapshot(state: State, offset: int) -> bytes:
    packer = _Packer()
    table = state.claims
    if isinstance(table, SnapshotClaims):
        # Entries nobody touched since the load are written back as they were read (their
        # identity numbers stay valid: the loaded identity table comes first in the new one),
        # so a checkpoint costs no per-claim Python work for them.
        packer.adopt(table._identities)
        claims = {}
        for task, entry in table._raw.items():
            claims[task] = (packer.pack(task, entry) if "task" in entry
                            else packer.keep(task, entry))
        for task, claim in table._claims.items():
            claims[task] = packer.pack(task, claim.to_dict(compact=True))
    else:
        claims = {task: packer.pack(task, entry) for task, entry in table.raw_items()}
    identities = packer.finish(claims)
    doc: dict[str, object] = {
        "format": SNAPSHOT_FORMAT,
        "seq": state.seq,
        "offset": offset,
        "head": state.head,
        "origin": state.origin,
        "fence": state.fence,
        "identities": identities,
        "claims": claims,
    }
    if len(state.tasks):  # the work queue; absent from registries that never used it
        doc["tasks"] = dict(state.tasks.raw_items())
    body = orjson.dumps(doc)
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + _CHECKSUM_MARK + digest.encode() + b'"}\n'


# Format 2 stores each claim as its persisted dict (Claim.to_dict(compact=True), which format 1
# stored as is) made leaner, because a cold command parses the whole snapshot: at 10,000 claims
# format 1 was 6.4 MB, ~30 ms of orjson.loads and ~4 ms of checksum. A packed entry
#   - has no "task" member (it is the entry's key);
#   - leaves out state "active", phase "working", priority 100, and renewed_at when it equals
#     claimed_at (the values of almost every live claim);
#   - names its owner process identity by its index in the snapshot's "identities" list: the
#     identities of the processes that made the claims, usually a handful for any number of
#     claims.
# _unpack restores the format-1 dict exactly (member order aside).
_PACK_DEFAULTS: dict[str, Any] = {"state": "active", "phase": DEFAULT_PHASE, "priority": 100}


class _Packer:
    def __init__(self) -> None:
        self.identities: list[Any] = []
        self._index: dict[bytes, int] = {}
        self._adopted = 0

    def adopt(self, identities: list[Any]) -> None:
        for ident in identities:
            self._index.setdefault(orjson.dumps(ident), len(self.identities))
            self.identities.append(ident)
        self._adopted = len(self.identities)

    def keep(self, task: str, entry: dict[str, Any]) -> dict[str, Any]:
        """A packed entry as loaded, whose identity number refers to the adopted table."""
        at = entry.get("identity")
        if isinstance(at, dict):  # not packed after all (a hand-made file): pack it properly
            return self.pack(task, _unpack(task, entry, []))
        if type(at) is int and not 0 <= at < self._adopted:
            # Damaged: keep it unusable (-1 is never an index), so that new identities appended
            # to the table can never make it name a process it did not name.
            return {**entry, "identity": -1}
        return entry

    def pack(self, task: str, entry: dict[str, Any]) -> dict[str, Any]:
        packed = dict(entry)  # (a copy, then a few deletions: a checkpoint packs every
        packed.pop("task", None)  # claim changed since the load)
        for name, default in _PACK_DEFAULTS.items():
            if name in packed and _same(packed[name], default):
                del packed[name]
        renewed = packed.get("renewed_at")
        if renewed is not None and _same(renewed, packed.get("claimed_at")):
            del packed["renewed_at"]
        ident = packed.get("identity")
        if ident is not None:
            key = orjson.dumps(ident)
            at = self._index.get(key)
            if at is None:
                at = self._index[key] = len(self.identities)
                self.identities.append(ident)
            packed["identity"] = at
        return packed

    def finish(self, claims: dict[str, dict[str, Any]]) -> list[Any]:
        """The identity table to write: adopted identities no claim names any more are dropped
        (a registry used by many short-lived processes would otherwise keep all of them)."""
        if not self._adopted:
            return self.identities
        used = {at for e in claims.values() if type(at := e.get("identity")) is int}
        if all(i in used for i in range(self._adopted)):
            return self.identities
        remap = {old: new for new, old in enumerate(i for i in range(len(self.identities))
                                                    if i in used)}
        for task, entry in claims.items():
            at = entry.get("identity")
            if type(at) is int and remap.get(at, at) != at:
                claims[task] = {**entry, "identity": remap[at]}  # never edit a loaded entry
        return [self.identities[i] for i in sorted(remap)]


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (1 == 1.0 == True in Python; a packed file must not blur them)."""
    return type(a) is type(b) and a == b


_UNPACK_BASE: dict[str, Any] = {"task": None, **_PACK_DEFAULTS}
_PACKED_LISTING_BASE = {**_UNPACK_BASE, **LISTING_BASE}


def _unpack(task: str, entry: dict[str, Any], identities: list[Any],
            base: dict[str, Any] = _UNPACK_BASE) -> dict[str, Any]:
    """A format-2 entry as its format-1 (persisted) dict, with ``base``'s members under it.
    Never raises: a damaged entry stays damaged (e.g. an identity number out of range) for
    Claim.from_dict to report."""
    full = base.copy()  # (quicker than a {**base, **entry} display; "task" leads base)
    full.update(entry)
    full["task"] = task
    if "renewed_at" not in entry and "claimed_at" in entry:
        full["renewed_at"] = entry["claimed_at"]
    at = entry.get("identity")
    if type(at) is int and 0 <= at < len(identities):
        full["identity"] = identities[at]
    return full


def decode_snapshot(data: bytes) -> Snapshot:
    """Parse and check a snapshot; raises SnapshotError saying what is wrong."""
    # No slice of the whole file is ever copied: on a cold start each fresh copy of a 6 MB
    # snapshot costs ~5 ms of page faults (bench/run.py coldstart).
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    if end < _CHECKSUM_SUFFIX + 2:
        raise SnapshotError("file is empty or truncated")
    cut = end - _CHECKSUM_SUFFIX
    if data[cut : cut + len(_CHECKSUM_MARK)] != _CHECKSUM_MARK or data[end - 2 : end] != b'"}':
        raise SnapshotError("no checksum at the end (truncated or edited)")
    # The checksum covers the body: the file up to the checksum member, with the object closed.
    # hashlib releases the GIL over large inputs and orjson holds it, so a large snapshot is
    # hashed on another thread while it is parsed (a cold command on 10,000 claims: ~3 ms).
    digest = hashlib.sha256()
    body = memoryview(data)[:cut]
    hasher = None
    if cut >= _PARALLEL_HASH_MIN:
        hasher = threading.Thread(target=digest.update, args=(body,), daemon=True)
        try:
            hasher.start()
        except RuntimeError:  # no new threads (interpreter shutdown): hash here instead
            hasher = None
    if hasher is None:
        digest.update(body)
    try:
        # The whole file is the body plus one last member (the checksum, 64 hex digits), so
        # it parses to the body's object plus a "checksum" key nobody reads.
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        obj = exc
    finally:
        if hasher is not None:
            hasher.join()
    digest.update(b"}")
    if digest.hexdigest().encode() != data[cut + len(_CHECKSUM_MARK) : end - 2]:
        raise SnapshotError("checksum does not match the contents")
    if isinstance(obj, orjson.JSONDecodeError):
        raise SnapshotError(f"not valid JSON: {obj}")
    # Format 1 is what earlier versions wrote: still read, and rewritten as format 2 by the
    # next checkpoint.
    if not isinstance(obj, dict) or obj.get("format") not in (1, SNAPSHOT_FORMAT):
        found = obj.get("format") if isinstance(obj, dict) else obj
        raise SnapshotError(f"unknown format {found!r}")
    packed = obj["format"] == SNAPSHOT_FORMAT
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
    table = SnapshotClaims(claims)
    table._identities = identities
    state = State(table, seq, fence, head, origin,  # type: ignore[arg-type]
                  TaskTable(tasks))
    return Snapshot(state, offset, len(data))  # type: ignore[arg-type]


class SnapshotClaims(ClaimTable):
    """The claim table of a loaded snapshot. Entries are converted lazily (a cold start does not
    build every claim), so a malformed entry in a snapshot whose checksum was forged surfaces at
    first use: as RegistryCorrupt, never as a raw TypeError, and without losing the entry.

    ``_raw`` holds entries as read: packed (format 2, no "task" member) or persisted dicts
    (format 1); ``_identities`` is the identity table packed entries refer to."""

    __slots__ = ("_identities",)

    def __init__(self, raw: dict[str, Any] | None = None) -> None:
        super().__init__(raw)
        self._identities: list[Any] = []

    def get(self, task: str) -> Claim | None:
        raw = self._raw.get(task)
        if raw is not None and "task" not in raw:
            self._raw[task] = _unpack(task, raw, self._identities)
        try:
            return super().get(task)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if raw is not None:
                self._raw[task] = raw
            raise RegistryCorrupt(
                "claims.json", f"the snapshot's record of task {task!r} is malformed ({exc})",
                hint="Run `fleetclaims doctor --fix`: it quarantines the snapshot and rebuilds it "
                "from the journal.",
            ) from None

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        identities = self._identities
        for task, raw in self._raw.items():
            yield task, raw if "task" in raw else _unpack(task, raw, identities)
        for task, claim in self._claims.items():
            yield task, claim.to_dict(compact=True)

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        # One new dict per entry, unpacked straight onto the listing base (a cold `list
        # --json` does this for every claim of the registry).
        identities = self._identities
        for task, raw in self._raw.items():
            if "task" in raw:
                yield task, {**LISTING_BASE, **raw}
            else:
                yield task, _unpack(task, raw, identities, _PACKED_LISTING_BASE)
        for task, claim in self._claims.items():
            yield task, claim.to_dict()

    def copy(self) -> SnapshotClaims:
        clone = SnapshotClaims()
        clone._claims = dict(self._claims)
        clone._raw = dict(self._raw)
        clone._identities = self._identities
        return clone


# --- verification ----------------------------------------------------------------------------


def check_link(line: bytes, seq: int, prev: str) -> str:
    """Check that ``line`` is sealed, is number ``seq`` and follows ``prev``; return its hash.

    Raises ChainError (or orjson.JSONDecodeError). Used by every store's verify: only a line
    that fails the cheap byte checks is parsed."""
    digest = check_seal(line)
    if seq_of(line) != seq:
        event = orjson.loads(line)
        found = event.get("seq") if isinstance(event, dict) else None
        raise ChainError(f"expected seq {seq}, found {found!r}")
    # prev sits right before the hash member; a bytes check avoids a full parse.
    if line[-(75 + 74) : -75] != b',"prev":"' + prev.encode() + b'"':
        event = orjson.loads(line)
        if not isinstance(event, dict) or event.get("prev") != prev:
            raise ChainError("prev hash does not match the line before")
    return digest


def verify_fd(
    fd: int,
    path: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    anchor: tuple[int, int, str] | None = None,
) -> VerifyReport:
    """Check every line of a journal: hash, seq continuity and prev links; and that the snapshot
    anchor (seq, offset, head) names a line boundary of this chain."""
    size = os.fstat(fd).st_size
    seq = 0
    prev = GENESIS
    anchor_ok: bool | None = None if anchor is None else False
    count = 0
    torn = 0
    pos = 0
    while True:
        for offset, line, complete in iter_lines(fd, pos):
            if not complete:
                torn = len(line)
                break
            expected = seq + 1
            try:
                digest = check_link(line, expected, prev)
            except (ChainError, orjson.JSONDecodeError) as exc:
                return VerifyReport(False, count, offset, prev, str(exc), expected, offset,
                                    anchor_ok)
            seq = expected
            prev = digest
            count += 1
            pos = offset + len(line) + 1
            if anchor is not None and seq == anchor[0]:
                anchor_ok = pos == anchor[1] and digest == anchor[2]
            if progress is not None and count % 65536 == 0:
                progress(offset, size)
        # The data ends at the first NUL byte; everything after it must be unused (zero) space.
        # A non-zero byte right at the end means a writer appended meanwhile: go on reading.
        junk = first_nonzero(fd, pos + torn)
        if junk is None:
            break
        if junk == pos + torn:
            torn = 0
            continue
        return VerifyReport(False, count, pos, prev,
                            f"data found at byte {junk} after unused (zero) space at byte "
                            f"{pos + torn}: lines lost or the file was damaged",
                            seq + 1, pos, anchor_ok)
    return VerifyReport(True, count, pos, prev, None, None, None, anchor_ok, torn)
