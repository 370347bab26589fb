"""The data model: claims, owner identities, instants and liveness verdicts.

Everything here is plain, immutable data. Claims are stored in the snapshot and rebuilt from the
journal as dictionaries; ``Claim.from_dict`` / ``Claim.to_dict`` are the only translation, and
``ClaimTable`` converts lazily so that opening a registry of 100,000 claims does not build
100,000 objects when a command needs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from .queue import TaskTable

ACTIVE: Final = "active"
EXPIRED: Final = "expired"  # active but marked stale by a lease_expired event
RELEASED: Final = "released"
COMPLETED: Final = "completed"
ClaimState = Literal["active", "expired", "released", "completed"]

LIVE: Final = "live"
DEAD: Final = "dead"
UNKNOWN: Final = "unknown"
VerdictState = Literal["live", "dead", "unknown"]

DEFAULT_PHASE = "working"
GENESIS = "0" * 64
RETIRED_KEPT = 16  # former grants remembered per task, so a stale holder hears why


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a claimant process is: enough to decide later whether it is provably dead."""

    host: str
    machine: str = ""  # hash of the machine id; "" when unknown
    boot: str = ""  # boot id; "" when unknown
    pidns: str = ""  # PID namespace id; "" when unknown
    pid: int = 0
    start: int = -1  # process start time in clock ticks since boot; -1 when unknown

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "machine": self.machine,
            "boot": self.boot,
            "pidns": self.pidns,
            "pid": self.pid,
            "start": self.start,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Identity:
        return cls(
            host=str(data.get("host", "")),
            machine=str(data.get("machine", "")),
            boot=str(data.get("boot", "")),
            pidns=str(data.get("pidns", "")),
            pid=_int(data.get("pid", 0)),
            start=_int(data.get("start", -1)),
        )


@dataclass(frozen=True, slots=True)
class Now:
    """One reading of the clocks, taken by the caller and passed into every decision.

    ``boot`` is a clock that never steps (CLOCK_BOOTTIME on Linux) and ``boot_id`` names the boot
    it counts from, so a lease deadline kept on it survives wall-clock steps in both directions.
    """

    wall: float
    boot: float | None = None
    boot_id: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Liveness of a claim's owner process: dead only on proof."""

    state: VerdictState
    reasons: tuple[str, ...] = ()

    @property
    def dead(self) -> bool:
        return self.state == DEAD


UNKNOWN_VERDICT = Verdict(UNKNOWN, ("no identity recorded",))


@dataclass(frozen=True, slots=True)
class Retired:
    """A former grant of a task, kept so its holder learns why it lost the task."""

    token_hash: str
    fence: int
    owner: str
    cause: str  # released / completed / recovered / preempted / handed_off / superseded / forced
    by: str | None = None
    rule: str | None = None
    at: float | None = None
    expired_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_hash": self.token_hash,
            "fence": self.fence,
            "owner": self.owner,
            "cause": self.cause,
            "by": self.by,
            "rule": self.rule,
            "at": self.at,
            "expired_at": self.expired_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Retired:
        return cls(
            token_hash=str(data["token_hash"]),
            fence=_int(data["fence"]),
            owner=str(data["owner"]),
            cause=str(data["cause"]),
            by=_opt_str(data.get("by")),
            rule=_opt_str(data.get("rule")),
            at=_opt_float(data.get("at")),
            expired_at=_opt_float(data.get("expired_at")),
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim on a task, as recorded. ``token`` is set only on the object given to the claimant."""

    task: str
    owner: str
    fence: int
    state: ClaimState = ACTIVE
    phase: str = DEFAULT_PHASE
    token_hash: str = ""
    claimed_at: float = 0.0
    renewed_at: float = 0.0
    expires_at: float | None = None
    ttl: float | None = None
    boot_deadline: float | None = None  # expiry on the boot clock of ``deadline_boot``
    deadline_boot: str = ""
    priority: int = 100
    note: str | None = None
    metadata: dict[str, Any] | None = None
    result: Any = None
    identity: Identity | None = None
    stale_reason: str | None = None
    ended_at: float | None = None  # released / completed / expired-mark time
    seq: int = 0  # last journal seq that changed this claim
    eid: str = ""  # identity of that event (origin:seq), used when merging registries
    retired: tuple[Retired, ...] = ()
    token: str | None = field(default=None, compare=False, repr=False)  # a secret: never logged

    @property
    def live(self) -> bool:
        """Whether the claim is held (active or marked stale but not taken over or ended)."""
        return self.state in (ACTIVE, EXPIRED)

    def with_token(self, token: str | None) -> Claim:
        return self.evolve(token=token)

    def evolve(self, **changes: Any) -> Claim:
        """A copy with some fields changed: ``dataclasses.replace`` without its per-call
        introspection (it is on the write path of every operation, and on every line a
        process applies from other writers)."""
        obj = _copy_claim(self)
        for name, value in changes.items():
            _CLAIM_SETTERS[name](obj, value)
        return obj

    def to_dict(self, *, with_token: bool = False, compact: bool = False) -> dict[str, Any]:
        """The persisted form. The raw token is never part of it unless asked for output.
        ``compact`` leaves out members at their defaults (the snapshot's form: half the bytes)."""
        data: dict[str, Any] = {
            "task": self.task,
            "owner": self.owner,
            "fence": self.fence,
            "state": self.state,
            "phase": self.phase,
            "token_hash": self.token_hash,
            "claimed_at": self.claimed_at,
            "renewed_at": self.renewed_at,
            "expires_at": self.expires_at,
            "ttl": self.ttl,
            "boot_deadline": self.boot_deadline,
            "deadline_boot": self.deadline_boot,
            "priority": self.priority,
            "note": self.note,
            "metadata": self.metadata,
            "result": self.result,
            "identity": None if self.identity is None else self.identity.to_dict(),
            "stale_reason": self.stale_reason,
            "ended_at": self.ended_at,
            "seq": self.seq,
            "eid": self.eid,
            "retired": [r.to_dict() for r in self.retired],
        }
        if with_token and self.token is not None:
            data["token"] = self.token
        if compact:
            for key in _OPTIONAL:
                if data[key] is None:
                    del data[key]
            for key in _EMPTY:
                if not data[key]:
                    del data[key]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Claim:
        """Rebuild a claim from its persisted form; raises KeyError/TypeError/ValueError."""
        state = str(data.get("state", ACTIVE))
        if state not in (ACTIVE, EXPIRED, RELEASED, COMPLETED):
            raise ValueError(f"unknown claim state {state!r}")
        ident = data.get("identity")
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError("metadata must be an object")
        retired = data.get("retired") or []
        if not isinstance(retired, list):
            raise TypeError("retired must be a list")
        values = {
            "task": _str(data["task"]),
            "owner": _str(data["owner"]),
            "fence": _int(data["fence"]),
            "state": state,
            "phase": _str(data.get("phase", DEFAULT_PHASE)),
            "token_hash": _str(data.get("token_hash", "")),
            "claimed_at": _float(data.get("claimed_at", 0.0)),
            "renewed_at": _float(data.get("renewed_at", 0.0)),
            "expires_at": _opt_float(data.get("expires_at")),
            "ttl": _opt_float(data.get("ttl")),
            "boot_deadline": _opt_float(data.get("boot_deadline")),
            "deadline_boot": _str(data.get("deadline_boot") or ""),
            "priority": _int(data.get("priority", 100)),
            "note": _opt_str(data.get("note")),
            "metadata": metadata,
            "result": data.get("result"),
            "identity": None if ident is None else Identity.from_dict(_mapping(ident)),
            "stale_reason": _opt_str(data.get("stale_reason")),
            "ended_at": _opt_float(data.get("ended_at")),
            "seq": _int(data.get("seq", 0)),
            "eid": _str(data.get("eid") or ""),
            "retired": tuple(Retired.from_dict(_mapping(r)) for r in retired),
            "token": None,
        }
        # Not the frozen dataclass __init__ (4x slower): a cold `fleetclaims list` builds
        # every claim of the registry.
        return _new_claim(**values)


# Members to_dict(compact=True) drops when empty; from_dict supplies the same defaults.
_OPTIONAL = ("note", "metadata", "result", "identity", "stale_reason", "ended_at",
             "boot_deadline")
_EMPTY = ("retired", "deadline_boot", "eid")
# What ClaimTable.data_items() puts under each dict: the optional members, None.
LISTING_BASE: dict[str, Any] = dict.fromkeys((*_OPTIONAL, "expires_at"))
_CLAIM_DEFAULTS = {f.name: f.default for f in fields(Claim)}
_CLAIM_FIELDS = tuple(_CLAIM_DEFAULTS)
# Each slot's setter, for evolve(): a slot descriptor's __set__ writes a frozen instance.
_CLAIM_SETTERS = {name: getattr(Claim, name).__set__ for name in _CLAIM_FIELDS}


def _compile(source: str, env: dict[str, Any], name: str) -> Callable[..., Any]:
    exec(source, env)  # a fixed source built from the dataclass's field names
    made: Callable[..., Any] = env[name]
    return made


def _builder(cls: type[Any]) -> Callable[..., Any]:
    """A constructor of frozen slotted ``cls`` instances from trusted values (the apply path,
    run for every journal line a process reads), without the frozen dataclass __init__.

    That __init__ sets each field through object.__setattr__, and a slot descriptor's
    __set__ is a method call as well; a plain slotted twin class assigns its fields with
    plain attribute stores (3x faster), then becomes ``cls``. The twin has exactly the slots
    of ``cls`` in the same order, which is what makes the ``__class__`` assignment legal
    (Python checks the two layouts are the same); frozen-ness is only ``cls.__setattr__``,
    so the result is an ordinary, immutable ``cls`` instance."""
    names = [f.name for f in fields(cls)]
    if tuple(cls.__slots__) != tuple(names):  # pragma: no cover - guards the layout
        raise TypeError(f"{cls.__name__} must be a slotted dataclass")
    args = ", ".join(names)
    lines = ["class _Twin:", f"    __slots__ = {tuple(names)!r}",
             f"    def __init__(self, {args}):"]
    lines += [f"        self.{name} = {name}" for name in names]
    lines.append("        self.__class__ = cls")
    return _compile("\n".join(lines), {"cls": cls}, "_Twin")


# (task, owner, fence, state, phase, token_hash, claimed_at, renewed_at, expires_at, ttl,
#  boot_deadline, deadline_boot, priority, note, metadata, result, identity, stale_reason,
#  ended_at, seq, eid, retired, token) -> Claim
_new_claim: Callable[..., Claim] = _builder(Claim)
# (token_hash, fence, owner, cause, by, rule, at, expired_at) -> Retired
_new_retired: Callable[..., Retired] = _builder(Retired)
# _copy_claim(claim): a new Claim with every field copied.
_copy_claim: Callable[[Claim], Claim] = _compile(
    "def _copy_claim(src):\n    return _new_claim("
    + ", ".join(f"src.{name}" for name in _CLAIM_FIELDS) + ")\n",
    {"_new_claim": _new_claim}, "_copy_claim")


def claim_replacer(*names: str) -> Callable[..., Claim]:
    """``f(claim, v1, v2, ...)``: a copy of ``claim`` with the named fields set to v1, v2, ...
    (a ``dataclasses.replace`` for one fixed set of fields, compiled once)."""
    unknown = set(names) - set(_CLAIM_FIELDS)
    if unknown:  # pragma: no cover - a programming error
        raise TypeError(f"not Claim fields: {sorted(unknown)}")
    args = ", ".join(name if name in names else f"src.{name}" for name in _CLAIM_FIELDS)
    return _compile(f"def replace(src, {', '.join(names)}):\n    return _new_claim({args})\n",
                    {"_new_claim": _new_claim}, "replace")


def build_claim(**values: Any) -> Claim:
    """Construct a Claim from trusted, typed values; missing fields take their defaults."""
    return _new_claim(**{**_CLAIM_DEFAULTS, **values})


class ClaimTable:
    """task -> Claim, holding snapshot entries as raw dicts until they are first looked at."""

    __slots__ = ("_claims", "_raw")

    def __init__(self, raw: dict[str, Any] | None = None) -> None:
        self._claims: dict[str, Claim] = {}
        self._raw: dict[str, Any] = dict(raw) if raw else {}

    def get(self, task: str) -> Claim | None:
        claim = self._claims.get(task)
        if claim is None and task in self._raw:
            claim = Claim.from_dict(_mapping(self._raw.pop(task)))
            self._claims[task] = claim
        return claim

    def __setitem__(self, task: str, claim: Claim) -> None:
        self._raw.pop(task, None)
        self._claims[task] = claim

    def __contains__(self, task: object) -> bool:
        return task in self._claims or task in self._raw

    def __len__(self) -> int:
        return len(self._claims) + len(self._raw)

    def tasks(self) -> list[str]:
        return sorted([*self._claims, *self._raw])

    def values(self) -> Iterator[Claim]:
        for task in self.tasks():
            claim = self.get(task)
            if claim is not None:
                yield claim

    def materialize(self) -> None:
        """Convert every raw entry now (surfaces damage as an exception at a chosen moment)."""
        for task in list(self._raw):
            self.get(task)

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        """(task, persisted dict) pairs without building Claim objects for untouched entries."""
        yield from self._raw.items()
        for task, claim in self._claims.items():
            yield task, claim.to_dict(compact=True)

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(task, persisted dict) pairs for listings: each dict is new (the caller may change
        it) and has every optional member, None when unset; no Claim objects are built."""
        for task, data in self.raw_items():
            yield task, {**LISTING_BASE, **data}

    def copy(self) -> ClaimTable:
        clone = ClaimTable()
        clone._claims = dict(self._claims)
        clone._raw = dict(self._raw)
        return clone


def _task_table() -> TaskTable:
    from .queue import TaskTable  # queue builds on this module

    return TaskTable()


@dataclass
class State:
    """The registry state: the claim table and the work queue, plus the journal counters they
    were built from."""

    claims: ClaimTable = field(default_factory=ClaimTable)
    seq: int = 0
    fence: int = 0  # the last fence number granted; only grows
    head: str = GENESIS  # hash of the last journal line
    origin: str = ""  # this registry's identity, from its first event
    tasks: TaskTable = field(default_factory=_task_table)

    def copy(self) -> State:
        return State(self.claims.copy(), self.seq, self.fence, self.head, self.origin,
                     self.tasks.copy())


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError("expected a finite number")
    return result


def _opt_float(value: Any) -> float | None:
    return None if value is None else _float(value)
