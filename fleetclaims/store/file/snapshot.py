"""The snapshot (``claims.json``): its codec and the files it is written through.

A snapshot is a checkpoint of the journal at ``seq``: the state, plus the journal ``offset`` and
``head`` it was taken at, closed by a SHA-256 checksum of its own bytes. It is written by temp
file + fsync + ``os.replace`` + directory fsync (``write_snapshot``), so a reader sees the old one
or the new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...core.errors import FleetclaimsError, RegistryCorrupt, UnsafeRegistry
from ...core.model import DEFAULT_PHASE, LISTING_BASE, Claim
from ...core.ports import ClaimView
from ...core.state import ClaimTable, State, TaskTable
from ...system import pid_exists
from . import fsutil
from .faults import crash_point, osc
from .journal import line_before

SNAPSHOT_FORMAT = 2  # 1 (still read): claims as persisted dicts; 2: packed (_Packer)
TMP_PREFIX = "claims.json.tmp-"
_CHECKSUM_MARK = b',"checksum":"'
_CHECKSUM_SUFFIX = len(_CHECKSUM_MARK) + 64 + 2
_PARALLEL_HASH_MIN = 1 << 20  # below this, starting a thread costs more than it saves

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
#   - leaves out state "active", priority 100, and renewed_at when it equals claimed_at (the
#     values of almost every live claim); the phase stays, so that `jq .claims claims.json`
#     shows a person owner, phase, expiry and fence of every claim (#15);
#   - names its owner process identity by its index in the snapshot's "identities" list: the
#     identities of the processes that made the claims, usually a handful for any number of
#     claims.
# _unpack restores the format-1 dict exactly (member order aside).
_PACK_DEFAULTS: dict[str, Any] = {"state": "active", "priority": 100}


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


# (phase: snapshots written before #15 leave out "working")
_UNPACK_BASE: dict[str, Any] = {"task": None, "phase": DEFAULT_PHASE, **_PACK_DEFAULTS}
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


def _malformed(task: str, exc: Exception) -> RegistryCorrupt:
    return RegistryCorrupt(
        "claims.json", f"the snapshot's record of task {task!r} is malformed ({exc})",
        hint="Run `fleetclaims doctor --fix`: it quarantines the snapshot and rebuilds it from "
        "the journal.",
    )


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
            raise _malformed(task, exc) from None

    def converted(self) -> Iterator[tuple[str, Claim]]:
        """(task, Claim) for every entry, each built afresh and not kept: a check of every
        entry (doctor) need not hold the whole registry as objects. Raises RegistryCorrupt
        for a malformed entry, as ``get`` does."""
        for task, raw in self.raw_items():
            try:
                yield task, Claim.from_dict(raw)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise _malformed(task, exc) from None

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
    try:
        fd = os.open(path, os.O_RDONLY | fsutil.O_NOFOLLOW | fsutil.O_CLOEXEC | fsutil.O_NONBLOCK)
    except OSError:
        return -1
    try:
        head = os.pread(fd, 64, 0)
    except OSError:
        return -1
    finally:
        os.close(fd)
    marker = b'"seq":'
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
    try:
        data = fsutil.read_all(fd)
    finally:
        os.close(fd)
    try:
        return decode_snapshot(data), None
    except SnapshotError as exc:
        return None, str(exc)


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
                   unless_seq: int | None = None) -> bool:
    """Write ``data`` to ``target`` by temp file + fsync + rename + directory fsync.

    ``unless_seq``: give up (False) when the snapshot already there has at least this seq (a
    checkpoint written outside the lock may race another process's, and must never replace a
    newer one). Raises OSError (or FleetclaimsError) after removing the temp file."""
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = fsutil.open_file(tmp, os.O_WRONLY | os.O_EXCL, create=True)
        try:
            half = len(data) // 2
            view = memoryview(data)
            pos = 0
            while pos < len(data):
                n = osc.write(fd, bytes(view[pos : pos + (1 << 20)]))
                if n <= 0:
                    raise OSError(errno.EIO, "short write")
                pos += n
                if pos >= half:
                    crash_point("snapshot.during_write")
            if sync:
                osc.fsync(fd)
        finally:
            os.close(fd)
        crash_point("snapshot.after_fsync")
        if unless_seq is not None and snapshot_seq(target) >= unless_seq:
            os.unlink(tmp)
            return False
        osc.replace(str(tmp), str(target))
        crash_point("snapshot.after_rename")
        if sync:
            fsutil.fsync_dir(directory)
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
