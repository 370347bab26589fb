"""The claim table of a loaded snapshot, and the packed form of its entries.

Format 4 of ``claims.json`` writes one claim a line, live claims and ended ones in two sections,
each sorted by the task's JSON-encoded name::

    {"format":4,"seq":..,"offset":..,"head":..,"origin":..,"fence":..,"identities":[..],
    "claims":{
    "issue-42":{"owner":"agent-a","fence":1,"phase":"working","expires_at":..,..},
    "issue-43":{..}
    },
    "ended":{
    "issue-7":{"owner":"agent-b","fence":3,"state":"completed",..}
    },"checksum":".."}

(plain JSON: ``jq .claims`` shows who holds what). A process keeps the file's bytes and finds an
entry by binary search over its lines, so loading 100,000 claims builds no object per claim,
and only the entries a process touches become ``Claim`` objects. A checkpoint copies the runs
of lines nobody changed and encodes only the changed entries (``encode_sections``); the table
then re-bases on the bytes it wrote, so ended claims leave the hot state again.

Formats 1 and 2 (one JSON object, entries as dicts) are still read: their entries stay dicts
until used. Format 3 is format 4 with the identity number anywhere in a line (read as is,
re-encoded whole by the first checkpoint).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ...core.errors import RegistryCorrupt
from ...core.model import DEFAULT_PHASE, LISTING_BASE, Claim
from ...core.ports import ClaimView
from ...core.state import ClaimTable
from .snapshot_lines import (
    SAMPLE_MIN,
    SEP,
    Samples,
    Section,
    find_line,
    narrow,
    parse_line,
    sample,
    section_lines,
)

# A packed entry leaves out its task (the key), state "active", priority 100, and renewed_at
# when it equals claimed_at; it names its owner process by its index in "identities".
_PACK_DEFAULTS: dict[str, Any] = {"state": "active", "priority": 100}
# (phase: snapshots written before #15 leave out "working")
_UNPACK_BASE: dict[str, Any] = {"task": None, "phase": DEFAULT_PHASE, **_PACK_DEFAULTS}
_PACKED_LISTING_BASE = {**_UNPACK_BASE, **LISTING_BASE}
# A line's identity number: its last member (see _line); nothing nested can end a line so.
_IDENTITY_REF = re.compile(rb',"identity":(-?\d+)\}(?=,\n|\Z)')
_LIVE_STATES = ("active", "expired")

if TYPE_CHECKING:
    from .snapshot_lines import Buffer
_SEPS = re.compile(SEP)  # (an mmap has no count(): as quick as bytes.count, ~55 ms in 40 MB)


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (1 == 1.0 == True in Python; a packed file must not blur them)."""
    return type(a) is type(b) and a == b


def unpack(task: str, entry: dict[str, Any], identities: list[Any],
           base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A packed entry as its persisted dict (Claim.to_dict(compact=True)), with ``base``'s
    members under it (else the packed defaults after its own, so that packing it again gives
    the same line). Never raises: a damaged entry stays damaged (e.g. an identity number out
    of range) for Claim.from_dict to report."""
    if base is None:
        full = {"task": task, **entry}
        for name, default in _UNPACK_BASE.items():
            full.setdefault(name, default)
    else:
        full = base.copy()  # (quicker than a {**base, **entry} display; "task" leads base)
        full.update(entry)
    full["task"] = task
    if "renewed_at" not in entry and "claimed_at" in entry:
        full["renewed_at"] = entry["claimed_at"]
    at = entry.get("identity")
    if type(at) is int and 0 <= at < len(identities):
        full["identity"] = identities[at]
    retired = entry.get("retired")
    if type(retired) is list and retired and type(retired[-1]) is str:
        full["retired"] = [*retired[:-1], _own_grant(full, retired[-1])]
    return full


def _own_grant(entry: dict[str, Any], cause: Any) -> dict[str, Any]:
    """The former grant an ended claim retired itself as (Retired.to_dict's members): what a
    packed entry writes as just its cause, the last of its "retired"."""
    return {"token_hash": entry.get("token_hash", ""), "fence": entry.get("fence"),
            "owner": entry.get("owner"), "cause": cause, "by": None, "rule": None,
            "at": entry.get("ended_at"), "expired_at": entry.get("expires_at")}


class Packer:
    """Packs persisted claim dicts, numbering owner identities in one table. ``adopt`` starts
    from a loaded table, so the numbers its unchanged lines use stay valid."""

    def __init__(self) -> None:
        self.identities: list[Any] = []
        self._index: dict[bytes, int] = {}
        self.used: Counter[int] = Counter()

    def adopt(self, identities: list[Any]) -> None:
        for ident in identities:
            self._index.setdefault(orjson.dumps(ident), len(self.identities))
            self.identities.append(ident)

    def number(self, ident: Any) -> int:
        """The number of identity ``ident`` in this table (appended when new)."""
        key = orjson.dumps(ident)
        at = self._index.get(key)
        if at is None:
            at = self._index[key] = len(self.identities)
            self.identities.append(ident)
        self.used[at] += 1
        return at

    def line(self, task: str, entry: dict[str, Any]) -> tuple[bytes, bool]:
        """(the section line of ``entry``, whether it belongs to the live section)."""
        live = entry.get("state", "active") in _LIVE_STATES
        packed = strip(entry)
        ident = packed.pop("identity", None)
        if isinstance(ident, dict):
            ident = self.number(ident)
        return _line(task, packed, ident), live


def strip(entry: dict[str, Any]) -> dict[str, Any]:
    """A persisted claim dict packed, but for its identity number (an identity is left as it
    is; a number no table resolved, damage, becomes -1: kept unusable, so that no identity
    appended later can make it name a process it did not name)."""
    packed = dict(entry)
    packed.pop("task", None)
    for name, default in _PACK_DEFAULTS.items():
        if name in packed and _same(packed[name], default):
            del packed[name]
    renewed = packed.get("renewed_at")
    if renewed is not None and _same(renewed, packed.get("claimed_at")):
        del packed["renewed_at"]
    retired = packed.get("retired")
    if packed.get("state") == "released" and type(retired) is list and retired:
        # A released claim's last former grant is itself, retired when it ended (~230 bytes
        # of copies): written as its cause only when it is exactly that.
        last = retired[-1]
        if type(last) is dict and last.get("cause") in ("released", "completed"):
            own = _own_grant(packed, last["cause"])
            if len(last) == len(own) and all(_same(last.get(k), v) for k, v in own.items()):
                packed["retired"] = [*retired[:-1], last["cause"]]
    if type(packed.get("identity")) is int:
        packed["identity"] = -1
    return packed


def _line(task: str, packed: dict[str, Any], ident: Any) -> bytes:
    """``"task":{packed...,"identity":N}`` (the identity number last: see encode_all)."""
    body = orjson.dumps(packed)
    if ident is None:
        return orjson.dumps(task) + b":" + body
    member = b'"identity":' + str(int(ident)).encode() + b"}"
    return orjson.dumps(task) + b":" + body[:-1] + (b"," if len(body) > 2 else b"") + member


def _malformed(task: str, exc: Exception) -> RegistryCorrupt:
    return RegistryCorrupt(
        "claims.json", f"the snapshot's record of task {task!r} is malformed ({exc})",
        hint="Run `fleetclaims doctor --fix`: it quarantines the snapshot and rebuilds it from "
        "the journal.",
    )


NOWHERE_MAX = 1 << 17  # tasks remembered as having no line in a snapshot table's data


class SnapshotClaims(ClaimTable):
    """The claim table of a loaded snapshot. Entries are converted lazily (a cold start does not
    build every claim), so a malformed entry in a snapshot whose checksum was forged surfaces at
    first use: as RegistryCorrupt, never as a raw TypeError, and without losing the entry.

    Layers, first match wins: ``_claims`` (set since the load: what a checkpoint encodes),
    ``_gone`` (removed by a prune), ``_raw`` (format 1/2 entries as read: packed dicts without
    "task", or persisted dicts), ``_hot`` (decoded copies of unchanged lines), and the lines
    of ``_data`` (formats 3/4), found by binary search."""

    __slots__ = ("_count", "_data", "_ended", "_gone", "_hot", "_identities", "_live",
                 "_nowhere", "_refs", "_rewrite", "_samples")

    def __init__(self, raw: dict[str, Any] | None = None) -> None:
        super().__init__(raw)
        self._identities: list[Any] = []
        self._data: Buffer = b""
        self._live: Section = (0, 0)
        self._ended: Section = (0, 0)
        self._gone: set[str] = set()
        self._hot: dict[str, Claim] = {}
        self._count = -1  # lines in _data (counted when first asked)
        self._refs: Counter[int] | None = None  # identity numbers the lines of _data use
        self._rewrite = False  # lines of an older layout: the next checkpoint encodes all
        # Tasks with no line in _data (which never changes under a table): a lookup of a task
        # that has no claim, as claim_next makes of every open task it walks, was two binary
        # searches each time (16% of a work-queue cycle's CPU).
        self._nowhere: set[str] = set()
        self._samples: dict[Section, Samples] = {}  # of the large sections, once searched

    @classmethod
    def over(cls, data: Buffer, live: Section, ended: Section,
             identities: list[Any]) -> SnapshotClaims:
        table = cls()
        table._data, table._live, table._ended = data, live, ended
        table._identities = identities
        return table

    # --- lookups -------------------------------------------------------------------------------

    def _locate(self, task: str) -> tuple[Section, int, int] | None:
        """(section, line start, content end) of ``task``'s line in _data, or None."""
        if not self._data or task in self._nowhere:
            return None
        probe = orjson.dumps(task) + b":"
        for section in (self._live, self._ended):
            ls, ce, found = self._find(section, probe)
            if found:
                return section, ls, ce
        if len(self._nowhere) >= NOWHERE_MAX:
            self._nowhere.clear()
        self._nowhere.add(task)
        return None

    def _find(self, section: Section, probe: bytes) -> tuple[int, int, bool]:
        """``find_line`` in ``section`` of _data, narrowed first when the section is large."""
        if section[1] - section[0] >= SAMPLE_MIN:
            samples = self._samples.get(section)
            if samples is None:
                samples = self._samples[section] = sample(self._data, section)
            return find_line(self._data, narrow(samples, section, probe), probe)
        return find_line(self._data, section, probe)

    def _decode(self, task: str) -> Claim | None:
        """``task``'s claim from _data (not kept), or None when it has no line there."""
        at = self._locate(task)
        if at is None:
            return None
        _, ls, ce = at
        try:
            key, entry = parse_line(self._data[ls:ce])
            if key != task or type(entry) is not dict or "task" in entry:
                raise ValueError("the line does not hold this task's packed entry")
            return Claim.from_dict(unpack(task, entry, self._identities))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _malformed(task, exc) from None

    def _peek(self, task: str) -> Claim | None:
        """``task``'s claim without keeping a converted copy (listings of every claim)."""
        claim = self._claims.get(task) or self._hot.get(task)
        if claim is not None or task in self._gone:
            return claim
        if task in self._raw:
            return self.get(task)
        return self._decode(task)

    def get(self, task: str) -> Claim | None:
        claim = self._claims.get(task)
        if claim is not None:
            return claim
        if task in self._gone:
            return None
        raw = self._raw.get(task)
        if raw is not None:
            if "task" not in raw:
                self._raw[task] = unpack(task, raw, self._identities)
            try:
                return super().get(task)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._raw[task] = raw
                raise _malformed(task, exc) from None
        claim = self._hot.get(task)
        if claim is None and self._data:
            claim = self._decode(task)
            if claim is not None:
                self._hot[task] = claim
        return claim

    def __setitem__(self, task: str, claim: Claim) -> None:
        self._raw.pop(task, None)
        self._hot.pop(task, None)
        self._gone.discard(task)
        self._claims[task] = claim

    def discard(self, task: str) -> None:
        self._claims.pop(task, None)
        self._raw.pop(task, None)
        self._hot.pop(task, None)
        if self._locate(task) is not None:
            self._gone.add(task)

    def __contains__(self, task: object) -> bool:
        if not isinstance(task, str):
            return False
        if task in self._claims or task in self._raw:
            return True
        return task not in self._gone and (task in self._hot or self._locate(task) is not None)

    def _base_tasks(self) -> list[str]:
        names = []
        for section in (self._live, self._ended):
            for line in section_lines(self._data, section):
                try:
                    names.append(parse_line(line)[0])
                except ValueError as exc:
                    raise _malformed(line[:80].decode(errors="replace"), exc) from None
        return names

    def __len__(self) -> int:
        if not self._data:
            return len(self._claims) + len(self._raw)
        if self._count < 0:
            self._count = sum(len(_SEPS.findall(self._data, *s)) + 1
                              for s in (self._live, self._ended) if s[1] > s[0])
        shadowed = sum(1 for t in self._claims if self._locate(t) is not None)
        return self._count - len(self._gone) - shadowed + len(self._claims) + len(self._raw)

    def tasks(self) -> list[str]:
        names = set(self._claims) | set(self._raw)
        if self._data:
            names.update(t for t in self._base_tasks() if t not in self._gone)
        return sorted(names)

    def values(self) -> Iterator[Claim]:
        """Every claim in task order, each line parsed once; the claims converted from lines
        are not kept (a listing or a sweep of 100,000 claims leaves memory as it found it)."""
        for task in list(self._raw):  # (format 1/2 entries: converted as get does)
            self.get(task)
        found = list(self._claims.items())
        for task, entry, _ in self._entries():
            try:
                found.append((task, self._hot.get(task) or Claim.from_dict(
                    unpack(task, entry, self._identities))))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise _malformed(task, exc) from None
        found.sort(key=lambda tc: tc[0])
        for _, claim in found:
            yield claim

    def materialize(self) -> None:
        for _ in self.converted():
            pass

    def _entries(self) -> Iterator[tuple[str, dict[str, Any], bool]]:
        """(task, entry, packed) of every entry not shadowed by a change: _raw's, then the
        lines of _data (packed)."""
        for task, raw in self._raw.items():
            yield task, raw, "task" not in raw
        if self._data:
            skip = self._gone.union(self._claims)
            for section in (self._live, self._ended):
                for line in section_lines(self._data, section):
                    try:
                        task, entry = parse_line(line)
                    except ValueError as exc:
                        raise _malformed(line[:80].decode(errors="replace"), exc) from None
                    if task not in skip and type(entry) is dict:
                        yield task, entry, True

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        identities = self._identities
        for task, entry, packed in self._entries():
            yield task, unpack(task, entry, identities) if packed else entry
        for task, claim in self._claims.items():
            yield task, claim.to_dict(compact=True)

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        # One new dict per entry, unpacked straight onto the listing base (a cold `list
        # --json` does this for every claim of the registry).
        identities = self._identities
        for task, entry, packed in self._entries():
            yield task, (unpack(task, entry, identities, _PACKED_LISTING_BASE) if packed
                         else {**LISTING_BASE, **entry})
        for task, claim in self._claims.items():
            yield task, claim.to_dict()

    def converted(self) -> Iterator[tuple[str, Claim]]:
        """(task, Claim) for every entry, each built afresh and not kept: a check of every
        entry (doctor) need not hold the whole registry as objects. Raises RegistryCorrupt
        for a malformed entry or a section out of order (a lookup would miss entries)."""
        for section in (self._live, self._ended):
            last = b""
            for line in section_lines(self._data, section):
                if line <= last:
                    raise RegistryCorrupt(
                        "claims.json", "the snapshot's claim lines are not in order",
                        hint="Run `fleetclaims doctor --fix`: it quarantines the snapshot and "
                        "rebuilds it from the journal.")
                last = line
        try:
            for task, raw in self.raw_items():
                current = task
                yield task, Claim.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _malformed(locals().get("current", "?"), exc) from None

    def copy(self) -> SnapshotClaims:
        clone = SnapshotClaims.over(self._data, self._live, self._ended, self._identities)
        clone._claims = dict(self._claims)
        clone._raw = dict(self._raw)
        clone._hot = dict(self._hot)
        clone._gone = set(self._gone)
        clone._nowhere = set(self._nowhere)
        clone._samples = self._samples  # (of the same bytes: shared)
        clone._count, clone._refs, clone._rewrite = self._count, self._refs, self._rewrite
        return clone

    # --- encoding ------------------------------------------------------------------------------

    def changed(self) -> int:
        """How many entries are held beside _data (decoded, changed since it was written)."""
        return len(self._claims) + len(self._raw)

    def incremental(self) -> bool:
        """Whether a checkpoint can copy this table's unchanged lines as they are."""
        return bool(self._data) and not self._raw and not self._rewrite

    def refs(self) -> Counter[int]:
        """How many lines of _data name each identity number."""
        if self._refs is None:
            refs: Counter[int] = Counter()
            for start, end in (self._live, self._ended):
                found = Counter(_IDENTITY_REF.findall(self._data, start, end))
                refs.update({int(n): k for n, k in found.items()})
            self._refs = refs
        return self._refs

    def rebased(self, data: bytes, live: Section, ended: Section, identities: list[Any],
                refs: Counter[int] | None) -> SnapshotClaims:
        """A new table over ``data`` (what a checkpoint of this table just encoded): the
        changes are in it, so they leave memory; live claims stay converted (hot). This table
        is left as it was (another thread may be reading it)."""
        table = SnapshotClaims.over(data, live, ended, identities)
        table._hot = {t: c for t, c in (*self._hot.items(), *self._claims.items()) if c.live}
        table._refs = refs
        return table

    def marks(self) -> tuple[dict[str, Claim], frozenset[str]]:
        """What a checkpoint taken now encodes beyond the lines of _data (see ``adopted``)."""
        return dict(self._claims), frozenset(self._gone)

    def adopted(self, data: bytes, live: Section, ended: Section, identities: list[Any],
                marks: tuple[dict[str, Claim], frozenset[str]]) -> SnapshotClaims:
        """A new table over ``data``, a checkpoint of this table taken when ``marks()`` gave
        ``marks`` (by a forked child, say), keeping only the changes made since: an entry set
        since is another object than the one marked; a removal since is of a task the
        checkpoint still holds. A plain ClaimTable (no _raw) adopts as one whose entries all
        changed. This table is left as it was."""
        claims, gone = marks
        table = SnapshotClaims.over(data, live, ended, identities)
        table._claims = {t: c for t, c in self._claims.items() if claims.get(t) is not c}
        table._gone = {t for t in self._gone if t not in gone}
        # (an entry set before the mark and removed since: no line of the old _data to hide,
        # so no removal was noted, but the new data holds it)
        table._gone.update(t for t in claims if t not in self._claims and t not in self._gone)
        hot = {t: c for t, c in self._hot.items() if c.live}
        hot.update((t, c) for t, c in self._claims.items() if c.live and t not in table._claims)
        table._hot = hot
        return table


Pieces = list[bytes | memoryview]  # a section's bytes, in order, to join once


def _runs(data: Buffer, section: Section, cuts: list[tuple[int, int]],
          inserts: list[tuple[int, bytes]]) -> Pieces:
    """The pieces of a section after removing the lines at ``cuts`` ((start, content end))
    and adding ``inserts`` ((position, line), position a line start or the section end):
    unchanged runs of lines are views of ``data`` (copied once, when the file is joined),
    with SEP between the pieces."""
    start, end = section
    view = memoryview(data)
    ops = sorted([(pos, 0, line, 0) for pos, line in inserts] +
                 [(ls, 1, b"", ce) for ls, ce in cuts], key=lambda o: (o[0], o[1], o[2]))
    pieces: Pieces = []
    cursor = start
    for pos, kind, line, ce in ops:
        if pos > cursor:
            pieces += [view[cursor : pos - len(SEP) if pos < end else end], SEP]
            cursor = pos
        if kind == 0:
            pieces += [line, SEP]
        else:
            cursor = ce + len(SEP) if ce < end else end
    if cursor < end:
        pieces += [view[cursor:end], SEP]
    return pieces[:-1]


def encode_sections(table: SnapshotClaims, packer: Packer) -> tuple[Pieces, Pieces, Counter[int]]:
    """(live section, ended section, identity references) of ``table`` by copying its
    unchanged lines and encoding only its changed entries (``table.incremental()``)."""
    data = table._data
    packer.adopt(table._identities)
    refs = Counter(table.refs())
    cuts: dict[Section, list[tuple[int, int]]] = {table._live: [], table._ended: []}
    inserts: dict[bool, list[tuple[bytes, bytes]]] = {True: [], False: []}
    for task in sorted({*table._claims, *table._gone}):
        at = table._locate(task)
        if at is not None:
            section, ls, ce = at
            cuts[section].append((ls, ce))
            try:
                old = parse_line(data[ls:ce])[1]
                ident = old.get("identity") if isinstance(old, dict) else None
            except ValueError:
                ident = None
            if type(ident) is int:
                refs[ident] -= 1
        claim = table._claims.get(task)
        if claim is not None:
            line, live = packer.line(task, claim.to_dict(compact=True))
            inserts[live].append((orjson.dumps(task) + b":", line))
    refs.update(packer.used)
    out = []
    for section, live in ((table._live, True), (table._ended, False)):
        placed = [(table._find(section, probe)[0], line) for probe, line in inserts[live]]
        out.append(_runs(data, section, cuts[section], placed))
    return out[0], out[1], +refs


def renumber(live: Pieces, ended: Pieces, identities: list[Any]
             ) -> tuple[Pieces, Pieces, Counter[int], list[Any]]:
    """The sections with the identities no line names dropped, the others numbered in the
    order of their JSON text, and numbers no table resolves (damage) made -1: one pass of
    substitution over the lines' last members, no line parsed."""
    joined = [b"".join(live), b"".join(ended)]
    used: set[int] = set()
    for section in joined:
        used.update(int(n) for n in set(_IDENTITY_REF.findall(section)))
    kept = sorted((i for i in used if 0 <= i < len(identities)),
                  key=lambda i: orjson.dumps(identities[i]))
    new = {str(old).encode(): str(at).encode() for at, old in enumerate(kept)}
    refs: Counter[int] = Counter()

    def sub(match: re.Match[bytes]) -> bytes:
        at = new.get(match.group(1), b"-1")
        refs[int(at)] += 1
        return b',"identity":' + at + b"}"

    out = [_IDENTITY_REF.sub(sub, section) for section in joined]
    return [out[0]], [out[1]], +refs, [identities[i] for i in kept]


def encode_all(table: ClaimView, packer: Packer) -> tuple[Pieces, Pieces, Counter[int]]:
    """(live section, ended section, identity references) of a claim table, every entry
    packed afresh (format 1/2 loads, fresh tables, and identity clean-ups), each entry read
    once. The identities are numbered in the order of their JSON text, so the numbers are a
    function of the content alone, whatever order the entries come in."""
    pending: dict[bool, list[tuple[str, dict[str, Any], Any]]] = {True: [], False: []}
    found: dict[bytes, Any] = {}
    for task, entry in table.raw_items():
        if type(entry) is not dict:
            continue
        packed = strip(entry)
        ident = packed.pop("identity", None)
        if isinstance(ident, dict):
            key = orjson.dumps(ident)
            found.setdefault(key, ident)
            ident = key
        pending[entry.get("state", "active") in _LIVE_STATES].append((task, packed, ident))
    for key in sorted(found):
        packer.number(found[key])
    packer.used.clear()
    number = {key: i for i, key in enumerate(sorted(found))}
    sections: list[Pieces] = []
    for live in (True, False):
        lines = []
        for task, packed, ident in pending[live]:
            if type(ident) is bytes:
                ident = number[ident]
                packer.used[ident] += 1
            lines.append(_line(task, packed, ident))
        lines.sort()
        sections.append([SEP.join(lines)])
    return sections[0], sections[1], Counter(packer.used)
