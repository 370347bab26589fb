"""What the MCP server knows of its client: the requests it read and has not answered yet,
which of them the client cancelled, and whether the client is still there.

A claim must never be made for nobody. So a waiting tool call (``claim``/``claim_next`` with
``wait``) stops waiting when its client cancels it (``notifications/cancelled``: no claim is
made after that, and no answer is sent, as MCP asks) or goes away (EOF on stdin, SIGINT,
SIGTERM: the wait ends as if its time ran out, and the refusal is answered). The SDK would
cancel the handler's task instead, which cannot stop a worker thread: the thread went on
waiting, claimed the task, and its answer was dropped. ``Wire`` (``mcp_stdio``) reads every
line and tells the ``Board``; the ``Tracker`` middleware hands each handler its ``Request``
(a context variable, which anyio copies into the worker thread running the tool).

At EOF the session ends only once every request read has been answered (``drain``): a
request followed at once by EOF is carried out and answered, never carried out unanswered.
"""

from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

#: the longest the session waits at EOF for the requests read to be answered (a wait stops
#: within a second; every other call takes milliseconds unless the registry is locked)
DRAIN_MAX = 30.0
#: the same after SIGINT or SIGTERM: the user wants the server gone
DRAIN_MAX_SIGNAL = 5.0


@dataclass
class Request:
    """One request in flight: ``stop`` is set when its client cancelled it (``cancelled``)
    or went away; ``unanswered``: its answer is dropped (a call stopped by its cancel)."""

    stop: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    unanswered: bool = False


#: the request the running handler serves (None outside one, e.g. a tool called in-process)
REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "fleetclaims_mcp_request", default=None)


def _key(ident: Any) -> tuple[str, Any]:
    return (type(ident).__name__, ident)  # 1 and "1" are two ids


class Board:
    """The requests read and not answered yet, shared by the wire's reader thread, the SDK's
    writer and the tools' worker threads."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._requests: dict[tuple[str, Any], Request] = {}
        self._pending: dict[tuple[str, Any], int] = {}  # (an id reused while in flight)
        self.closed = threading.Event()  # EOF or a signal: no more waiting
        self.signal: int | None = None

    def opened(self, ident: Any) -> None:
        """The request ``ident`` was read and goes to the SDK."""
        key = _key(ident)
        with self._changed:
            request = Request()
            if self.closed.is_set():
                request.stop.set()
            self._requests[key] = request
            self._pending[key] = self._pending.get(key, 0) + 1

    def find(self, ident: Any) -> Request | None:
        with self._changed:
            return self._requests.get(_key(ident))

    def cancel(self, ident: Any) -> None:
        """The client cancelled ``ident`` (ignored unless it is in flight, as MCP says)."""
        with self._changed:
            request = self._requests.get(_key(ident))
            if request is not None:
                request.cancelled = True
                request.stop.set()

    def close(self, signal: int | None = None) -> None:
        """The client is gone (EOF) or the server was told to stop: every wait stops."""
        with self._changed:
            if signal is not None and self.signal is None:
                self.signal = signal
            self.closed.set()
            for request in self._requests.values():
                request.stop.set()
            self._changed.notify_all()

    def answered(self, ident: Any) -> bool:
        """The SDK answers ``ident``; True when that answer is to be dropped."""
        key = _key(ident)
        with self._changed:
            request = self._requests.get(key)
            count = self._pending.get(key, 0) - 1
            if count > 0:
                self._pending[key] = count
            else:
                self._pending.pop(key, None)
                self._requests.pop(key, None)
            self._changed.notify_all()
            return request is not None and request.unanswered

    def drain(self) -> bool:
        """Wait until every request read was answered (at most DRAIN_MAX seconds, fewer after
        a signal); False when some were not."""
        deadline = time.monotonic() + (DRAIN_MAX if self.signal is None else DRAIN_MAX_SIGNAL)
        with self._changed:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True


class Tracker:
    """Server middleware (the SDK's ``Server.middleware``): the handler of a request runs
    with ``REQUEST`` set to that request's entry on the board."""

    def __init__(self, board: Board) -> None:
        self.board = board

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext,
                       ) -> HandlerResult:
        request = None if ctx.request_id is None else self.board.find(ctx.request_id)
        token = REQUEST.set(request)
        try:
            return await call_next(ctx)
        finally:
            REQUEST.reset(token)


__all__ = ["DRAIN_MAX", "REQUEST", "Board", "Request", "Tracker"]
