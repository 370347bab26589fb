"""What the rules read, as Protocols: the clock, the process prober, and the claim and task
tables a ``State`` holds.

The core decides over these views only. ``state.py`` implements them in memory; a store may
implement them over its own storage (``store/postgres/tables.py`` does, over SQL) without the
core ever seeing how.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from .model import Claim, Identity, Key, Now, Task, Verdict


class Clock(Protocol):
    """A reading of the wall and boot clocks (``system.SystemClock``, ``testing.FakeClock``)."""

    def now(self) -> Now: ...


class Prober(Protocol):
    """Who this process is, and whether a recorded owner process is provably dead."""

    def verdict(self, identity: Identity | None) -> Verdict: ...

    def identity(self) -> Identity: ...

    def identity_of(self, pid: int) -> Identity: ...


class ClaimView(Protocol):
    """task -> Claim, as the rules and ``apply`` read and change it."""

    def get(self, task: str) -> Claim | None: ...

    def __setitem__(self, task: str, claim: Claim) -> None: ...

    def discard(self, task: str) -> None:
        """Remove ``task``'s record (only a recorded prune does: core/prune.py)."""
        ...

    def __contains__(self, task: object) -> bool: ...

    def __len__(self) -> int: ...

    def tasks(self) -> list[str]:
        """Every task with a claim record, sorted."""
        ...

    def values(self) -> Iterator[Claim]:
        """Every claim, in task order."""
        ...

    def materialize(self) -> None:
        """Convert every stored entry now (surfaces damage at a chosen moment)."""
        ...

    def raw_items(self) -> Iterator[tuple[str, Any]]:
        """(task, persisted dict) pairs, without building Claim objects where avoidable."""
        ...

    def data_items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(task, new persisted dict with every optional member) pairs, for listings."""
        ...

    def copy(self) -> ClaimView:
        """A detached in-memory copy."""
        ...


class TaskView(Protocol):
    """task -> Task (the work queue) plus its hand-out order, as the rules read it."""

    def get(self, task: str) -> Task | None: ...

    def put(self, record: Task, claims: ClaimView) -> None: ...

    def __contains__(self, task: object) -> bool: ...

    def __len__(self) -> int: ...

    def names(self) -> list[str]: ...

    def values(self) -> Iterator[Task]: ...

    def raw_items(self) -> Iterator[tuple[str, Any]]: ...

    def copy(self) -> TaskView: ...

    @property
    def indexed(self) -> bool:
        """Whether the ready index is built (then ``changed`` must be told of claim events)."""
        ...

    def drop_index(self) -> None: ...

    def candidates(self, claims: ClaimView, take_stale: bool,
                   labels: frozenset[str] = frozenset()) -> Iterator[tuple[Key, bool]]:
        """(key, held) of the tasks ``claim_next`` may hand out, in hand-out order."""
        ...

    def ready_keys(self, claims: ClaimView) -> list[Key]: ...

    def dependants(self, task: str, claims: ClaimView) -> list[str]: ...

    def changed(self, task: str, claims: ClaimView) -> None: ...
