"""The data model: claims, owner identities, instants, liveness verdicts and queued tasks.

Everything here is plain, immutable data: frozen dataclasses and the checks that rebuild them
from their persisted form (``from_dict`` / ``to_dict`` are the only translation). The tables
that hold them are in ``state.py``; the fast constructors ``apply`` uses on the hot path are
walled into ``_fastbuild.py`` (tested equivalent to the constructors here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

ACTIVE: Final = "active"
EXPIRED: Final = "expired"  # active but marked stale by a lease_expired event
RELEASED: Final = "released"
COMPLETED: Final = "completed"
ClaimState = Literal["active", "expired", "released", "completed"]
_CLAIM_STATES: dict[str, ClaimState] = {s: s for s in (ACTIVE, EXPIRED, RELEASED, COMPLETED)}

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
    # Path patterns reserved with the claim (normalised, see core/paths.py): exclusive ones
    # conflict with any overlapping reservation of another live claim, shared ones only with
    # an exclusive one. They lapse with the claim.
    paths: tuple[str, ...] = ()
    shared_paths: tuple[str, ...] = ()
    token: str | None = field(default=None, compare=False, repr=False)  # a secret: never logged

    @property
    def live(self) -> bool:
        """Whether the claim is held (active or marked stale but not taken over or ended)."""
        return self.state in (ACTIVE, EXPIRED)

    def with_token(self, token: str | None) -> Claim:
        return self.evolve(token=token)

    def evolve(self, **changes: Any) -> Claim:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

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
            "paths": list(self.paths),
            "shared_paths": list(self.shared_paths),
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
        state = data.get("state", ACTIVE)
        if state not in _CLAIM_STATES:
            raise ValueError(f"unknown claim state {state!r}")
        ident = data.get("identity")
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError("metadata must be an object")
        retired = data.get("retired") or []
        if not isinstance(retired, list):
            raise TypeError("retired must be a list")
        return cls(
            task=_str(data["task"]),
            owner=_str(data["owner"]),
            fence=_int(data["fence"]),
            state=_CLAIM_STATES[state],
            phase=_str(data.get("phase", DEFAULT_PHASE)),
            token_hash=_str(data.get("token_hash", "")),
            claimed_at=_float(data.get("claimed_at", 0.0)),
            renewed_at=_float(data.get("renewed_at", 0.0)),
            expires_at=_opt_float(data.get("expires_at")),
            ttl=_opt_float(data.get("ttl")),
            boot_deadline=_opt_float(data.get("boot_deadline")),
            deadline_boot=_str(data.get("deadline_boot") or ""),
            priority=_int(data.get("priority", 100)),
            note=_opt_str(data.get("note")),
            metadata=metadata,
            result=data.get("result"),
            identity=None if ident is None else Identity.from_dict(_mapping(ident)),
            stale_reason=_opt_str(data.get("stale_reason")),
            ended_at=_opt_float(data.get("ended_at")),
            seq=_int(data.get("seq", 0)),
            eid=_str(data.get("eid") or ""),
            retired=tuple(Retired.from_dict(_mapping(r)) for r in retired),
            paths=_names(data.get("paths") or ()),  # absent before #23
            shared_paths=_names(data.get("shared_paths") or ()),
        )


# Members to_dict(compact=True) drops when empty; from_dict supplies the same defaults.
_OPTIONAL = ("note", "metadata", "result", "identity", "stale_reason", "ended_at",
             "boot_deadline")
_EMPTY = ("retired", "deadline_boot", "eid", "paths", "shared_paths")
# What ClaimTable.data_items() puts under each dict: the optional members, None.
LISTING_BASE: dict[str, Any] = dict.fromkeys((*_OPTIONAL, "expires_at"))




# --- the work queue's records ----------------------------------------------------------------

READY: Final = "ready"
PENDING: Final = "pending"
BLOCKED: Final = "blocked"
HELD: Final = "held"
DONE: Final = "completed"
Readiness = Literal["ready", "pending", "blocked", "held", "completed"]
READINESS_ORDER: Final = (READY, HELD, PENDING, BLOCKED, DONE)

Key = tuple[int, float, str]  # hand-out order: priority number, then age, then id


@dataclass(frozen=True, slots=True)
class Task:
    """A task in the work queue, as recorded (readiness is derived, see ``status``)."""

    task: str
    priority: int = 100
    depends_on: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    note: str | None = None
    title: str | None = None  # a one-line summary people and agents read in listings
    description: str | None = None  # what to do, as long as it needs (shown by show/next)
    added_at: float = 0.0
    added_by: str = ""
    blocked: str | None = None  # the reason, while blocked
    blocked_by: str | None = None
    seq: int = 0  # last journal seq that changed this record
    # The identity of the event that last changed this record (the hash it was first sealed
    # with) and its time: what a merge of two registries compares (see core/merge.py).
    eid: str = ""
    changed_at: float = 0.0

    @property
    def key(self) -> Key:
        return (self.priority, self.added_at, self.task)

    def same_spec(self, other: Task) -> bool:
        """Whether ``add`` with ``other``'s input would change nothing."""
        return (self.priority, self.depends_on, self.labels, self.note, self.title,
                self.description) == (other.priority, other.depends_on, other.labels,
                                      other.note, other.title, other.description)

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """The persisted form. ``compact`` (the snapshot's) leaves out members at the defaults
        from_dict supplies, and ``changed_at`` when it is ``added_at``: at 10,000 queued
        tasks, a third of the bytes a checkpoint writes and a cold start parses."""
        data: dict[str, Any] = {
            "task": self.task,
            "priority": self.priority,
            "depends_on": list(self.depends_on),
            "labels": list(self.labels),
            "note": self.note,
            "title": self.title,
            "description": self.description,
            "added_at": self.added_at,
            "added_by": self.added_by,
            "blocked": self.blocked,
            "blocked_by": self.blocked_by,
            "seq": self.seq,
            "eid": self.eid,
            "changed_at": self.changed_at,
        }
        if compact:
            for key, default in _TASK_DEFAULTS:
                if data[key] == default and type(data[key]) is type(default):
                    del data[key]
            if data["changed_at"] == self.added_at:
                del data["changed_at"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Rebuild a task from its persisted form; raises KeyError/TypeError/ValueError."""
        return cls(
            task=_str(data["task"]),
            priority=_int(data.get("priority", 100)),
            depends_on=_names(data.get("depends_on") or ()),
            labels=_names(data.get("labels") or ()),
            note=_opt_str(data.get("note")),
            title=_opt_str(data.get("title")),
            description=_opt_str(data.get("description")),
            added_at=_float(data.get("added_at", 0.0)),
            added_by=_str(data.get("added_by") or ""),
            blocked=_opt_str(data.get("blocked")),
            blocked_by=_opt_str(data.get("blocked_by")),
            seq=_int(data.get("seq", 0)),
            eid=_str(data.get("eid") or ""),
            changed_at=_float(data.get("changed_at", data.get("added_at", 0.0))),
        )


# (member, default) pairs that Task.to_dict(compact=True) leaves out; from_dict supplies them.
_TASK_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("priority", 100), ("depends_on", []), ("labels", []), ("note", None), ("title", None),
    ("description", None), ("added_by", ""),
    ("blocked", None), ("blocked_by", None), ("eid", ""),
)


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """A task with its readiness now: what ``fleetclaims ready`` and ``list --tasks`` show."""

    task: Task
    status: Readiness
    waits_for: tuple[str, ...] = ()  # unmet dependencies (pending)
    holder: str | None = None  # owner of the live claim (held)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise TypeError("expected a list of names")
    return tuple(_str(v) for v in value)


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

