"""An in-memory store with the file store's semantics (hash chain included), for tests."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from ..core import events as ev
from ..core.chain import envelope, seal
from ..core.model import Now
from ..core.rules import Decision
from ..core.state import State
from ..system import Clock, fork_safe_mutex
from .base import Capabilities, Decide, VerifyReport
from .file.journal import parse_line


class MemoryStore:
    capabilities = Capabilities("memory")

    def __init__(self, *, clock: Clock, location: str = "memory:") -> None:
        self.location = location
        self.clock = clock
        self.lines: list[bytes] = []
        self._state = State()
        self._mutex = fork_safe_mutex(self)

    def now(self) -> Now:
        return self.clock.now()

    def transact(self, decide: Decide) -> tuple[Decision, State]:
        with self._mutex:
            if self._state.seq == 0:
                self._append([{"type": ev.REGISTRY_CREATED, "origin": secrets.token_hex(8),
                               "actor": "fleetclaims"}], self.clock.now().wall)
            now = self.clock.now()
            decision = decide(self._state, now)
            if decision.events:
                self._append(list(decision.events), now.wall)
            return decision, self._state

    def _append(self, events: list[dict[str, Any]], ts: float) -> None:
        for fields in events:
            obj = envelope(self._state.seq + 1, ts, fields, self._state.head)
            line, digest = seal(orjson.dumps(obj))
            obj["hash"] = digest
            self.lines.append(line)
            ev.apply(self._state, obj)

    def read(self) -> State:
        return self._state

    def iter_events(self, after: int = 0) -> Iterator[dict[str, Any]]:
        with self._mutex:
            lines = self.lines[after:]
        for line in lines:
            yield orjson.loads(line)

    def verify(self, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        state = State()
        offset = 0
        for line in self.lines:
            event = parse_line(line[:-1], seq=state.seq + 1, prev=state.head, offset=offset,
                               path=self.location)
            ev.apply(state, event)
            offset += len(line)
        return VerifyReport(True, len(self.lines), offset, state.head)

    def import_events(self, lines: list[bytes]) -> None:
        with self._mutex:
            self.lines = [line if line.endswith(b"\n") else line + b"\n" for line in lines]
            self._state = State()
            for line in self.lines:
                event = orjson.loads(line)
                ev.apply(self._state, event)

    def close(self) -> None:
        pass
