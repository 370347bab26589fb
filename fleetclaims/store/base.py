"""The store contract: one transaction, reads, and the journal as a stream of events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.model import Now
from ..core.rules import Decision
from ..core.state import State


@dataclass(frozen=True, slots=True)
class Event:
    """One committed journal event. ``data`` is the whole recorded object."""

    seq: int
    ts: float
    type: str
    task: str | None
    owner: str | None
    actor: str | None
    fence: int | None
    data: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(
            seq=int(data["seq"]),
            ts=float(data["ts"]),
            type=str(data["type"]),
            task=data.get("task"),
            owner=data.get("owner"),
            actor=data.get("actor"),
            fence=data.get("fence"),
            data=data,
        )

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


@dataclass(frozen=True, slots=True)
class EventPage:
    events: list[Event]
    next_cursor: int  # pass as ``after`` to get the next page
    more: bool  # whether more events after the cursor may match


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    events: int
    bytes: int
    head: str
    error: str | None = None
    seq: int | None = None
    offset: int | None = None
    anchor_ok: bool | None = None  # snapshot anchored in the journal (None: no snapshot)
    torn_tail: int = 0  # bytes of an incomplete last line (ignored by readers)
    sealed: bool = False  # the damage is in sealed history: restored from a copy, not repaired
    # sealed segments' (derived) indexes that do not match their segment, each named with what
    # to do (file stores): reads through them may miss events, the chain itself is fine
    index_problems: tuple[str, ...] = ()


Decide = Callable[[State, Now], Decision]

# Capability names a store may declare (see ``Capabilities``).
LOCAL_DIRECTORY = "local_directory"  # ``location`` is a directory: FLEETCLAIMS_DIR finds it
SHARED = "shared"  # several machines use the registry at once
SERVER_CLOCK = "server_clock"  # leases run on the store's clock (``now()``), not the caller's
SCHEMA_MIGRATIONS = "schema_migrations"  # ``migrate_schema()`` creates or upgrades the schema


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store is and offers, so callers ask it instead of checking its class."""

    kind: str  # "file", "postgres", "memory"
    features: frozenset[str] = frozenset()

    def __contains__(self, name: object) -> bool:
        return name in self.features


class Store(Protocol):
    """What the Registry needs from a backend. Both stores pass one contract suite."""

    location: str
    capabilities: Capabilities

    def now(self) -> Now:
        """The time decisions are made on: the store's clock (PostgreSQL: the server's) or
        the one it was given."""
        ...

    def transact(self, decide: Decide) -> tuple[Decision, State]:
        """Under the registry's write serialisation: read current state and the time, decide,
        append the decision's events durably, and return the decision and the state after it."""
        ...

    def read(self) -> State:
        """The latest committed state (no write lock)."""
        ...

    def iter_events(self, after: int = 0) -> Iterator[dict[str, Any]]:
        """Committed events with seq > after, in seq order."""
        ...

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport: ...

    def import_events(self, lines: list[bytes]) -> None:
        """Append already-sealed journal lines verbatim (migration); the store must be empty."""
        ...

    def close(self) -> None: ...
