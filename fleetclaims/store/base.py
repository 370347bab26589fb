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


Decide = Callable[[State, Now], Decision]


class Store(Protocol):
    """What the Registry needs from a backend. Both stores pass one contract suite."""

    location: str

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
