"""The stdio wire of ``fleetclaims mcp``: every line the client sends gets an answer.

The SDK's stdio transport decodes undecodable bytes to U+FFFD and drops a line that is not a
JSON-RPC message without answering it, and a request holding a lone surrogate (``"\\ud800"``)
is never answered at all: the client waits forever. ``Wire`` stands in for both ends of the
SDK's transport (its ``stdin``/``stdout`` parameters) and screens each line first: what the
SDK cannot take is answered here, with a JSON-RPC error (-32700 parse error, -32600 invalid
request, -32602 invalid params) or, for a tool call, the server's documented JSON error
document; the session goes on. A request the SDK refuses itself with -32602 gets a message
and ``data`` saying what was wrong (``ExplainRefusals``, a middleware of the SDK's server).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from .mcp_session import Board

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

#: the longest line read (a tool call is a few kilobytes; metadata is capped at 16 KiB)
LINE_MAX = 4 * 1024 * 1024
#: the deepest JSON-RPC message accepted: the envelope plus 16 levels of metadata, with room
NESTING_MAX = 64

#: lines read ahead of the SDK (a cancel or EOF must be seen while a tool call runs)
READ_AHEAD = 64

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32602, -32603

#: what to answer a tool call refused before the SDK saw it: a field and a reason in,
#: the tool result (a JSON-RPC ``result`` member) out
ToolRefusal = Callable[[str, str], dict[str, Any]]


class Wire:
    """Both ends of the stdio wire (see the module's docstring). A reader thread of its own
    reads ahead (at most READ_AHEAD lines) so that a cancel or EOF is seen while a tool call
    runs, and tells the ``board`` (``mcp_session``); a cancel is handled here, not passed on
    (the SDK would cancel the handler's task, which cannot stop its worker thread)."""

    def __init__(self, refuse_tool: ToolRefusal, stdin: BinaryIO | None = None,
                 stdout: BinaryIO | None = None, board: Board | None = None) -> None:
        self._refuse_tool = refuse_tool
        self._in = stdin if stdin is not None else sys.stdin.buffer
        self._out = stdout if stdout is not None else sys.stdout.buffer
        self._lock = threading.Lock()  # the SDK's writer and this screen both answer
        self.board = board if board is not None else Board()
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: the end
        self._room = threading.Semaphore(READ_AHEAD)
        self._reader: threading.Thread | None = None

    # --- the SDK's stdin: lines it can take ---------------------------------------------------

    def __aiter__(self) -> Wire:
        return self

    async def __anext__(self) -> str:
        import anyio

        if self._reader is None:  # a daemon: it never holds up the process's exit
            self._reader = threading.Thread(target=self._read, name="fleetclaims-mcp-stdin",
                                            daemon=True)
            self._reader.start()
        line = await anyio.to_thread.run_sync(self._lines.get, abandon_on_cancel=True)
        if line is None:
            # EOF or a signal: every wait has stopped (board.close); what was read is
            # answered before the session ends (the SDK cancels what is still running).
            self._lines.put(None)  # (asked again, the end again)
            await anyio.to_thread.run_sync(self.board.drain, abandon_on_cancel=True)
            raise StopAsyncIteration
        self._room.release()
        return line

    def stop(self, signal: int) -> None:
        """A signal: stop every wait and end the session as at EOF (stdin may stay open)."""
        self.board.close(signal)
        self._lines.put(None)

    def _read(self) -> None:
        try:
            while not self.board.closed.is_set():
                self._room.acquire()
                line = self._next_line()
                if line is None:
                    break
                if line:
                    self._lines.put(line)
                else:
                    self._room.release()
        except (OSError, ValueError):  # stdin unreadable (or closed under us): the end
            pass
        self.board.close()
        self._lines.put(None)

    def _next_line(self) -> str | None:
        """The next line for the SDK; "" when this one was answered here; None at the end."""
        raw = self._in.readline(LINE_MAX + 1)
        if not raw:
            return None
        if len(raw) > LINE_MAX and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # drop the rest of the line
                raw = self._in.readline(LINE_MAX)
            self._send(rpc_error(None, INVALID_REQUEST,
                                 f"Invalid Request: a line longer than {LINE_MAX} bytes"))
            return ""
        reply = screen(raw, self._refuse_tool)
        if reply is None:
            text = raw.decode("utf-8")
            return "" if self._track(json.loads(text)) else text
        if reply:
            self._send(reply)
        return ""

    def _track(self, message: dict[str, Any]) -> bool:
        """Tell the board of a request read or cancelled; True when the line is consumed
        here (a cancel)."""
        if "method" not in message:
            return False  # a response to the server: nothing to track
        if "id" in message:
            self.board.opened(message["id"])
            return False
        if message["method"] == "notifications/cancelled":
            params = message.get("params")
            ident = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(ident, (str, int)) and not isinstance(ident, bool):
                self.board.cancel(ident)
            return True
        return False

    # --- the SDK's stdout ---------------------------------------------------------------------

    async def write(self, text: str) -> None:
        import anyio

        if self._answers(text):
            await anyio.to_thread.run_sync(self._write, text)

    async def flush(self) -> None:
        return None  # every write is flushed

    def _answers(self, text: str) -> bool:
        """Tell the board that the SDK answers a request; False when the answer is dropped
        (a call its client cancelled, stopped before it did anything)."""
        try:
            message = json.loads(text)
        except ValueError:
            return True
        if isinstance(message, dict) and "method" not in message and "id" in message \
                and ("result" in message or "error" in message):
            return not self.board.answered(message["id"])
        return True

    def _write(self, text: str) -> None:
        # backslashreplace: a lone surrogate becomes the JSON escape it came from, never a
        # UnicodeEncodeError that would stop the writer (and every later answer).
        data = text.encode("utf-8", "backslashreplace")
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def _send(self, message: dict[str, Any]) -> None:
        self._write(json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n")


class ExplainRefusals:
    """Server middleware (the SDK's ``Server.middleware``): the SDK refuses a request before
    any handler runs with -32602 "Invalid request parameters" and empty data, whatever was
    wrong. This says what: a request before ``initialize`` ("the session is not
    initialized"), or the parameter the method's schema refuses (``params.name`` is required,
    ``params.arguments`` must be an object), in the message and in ``data``."""

    def __init__(self, prompts: Callable[[], list[str]] = list) -> None:
        self.initialized = False  # one stdio connection per server process
        self.prompts = prompts  # the names prompts/get knows

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext,
                       ) -> HandlerResult:
        from mcp.shared.exceptions import MCPError
        from pydantic import ValidationError

        try:
            result = await call_next(ctx)
        except ValidationError as exc:  # the method's params, before its handler
            first = exc.errors()[0] if exc.errors() else None
            field = "params" if first is None else ".".join(str(p) for p in first["loc"])
            reason = "are malformed" if first is None else _REASONS.get(
                first["type"], "is malformed: " + first["msg"].lower().rstrip("."))
            if field == "params.arguments" and reason == _REASONS["dict_type"]:
                reason += " (the tool's arguments by name)"
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid params: {field} {reason}",
                           data={"field": field, "reason": reason}) from None
        except MCPError as exc:
            if exc.error.code != INVALID_PARAMS or exc.error.data or self.initialized:
                raise
            reason = (f"the session is not initialized: send initialize (then "
                      f"notifications/initialized) before {ctx.method}")
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid params: {reason}",
                           data={"method": ctx.method, "reason": reason}) from None
        except Exception as exc:  # the SDK would log a traceback and answer code 0
            raise self._refusal(ctx, exc) from None
        if ctx.method in ("initialize", "notifications/initialized"):
            self.initialized = True
        return result


    def _refusal(self, ctx: ServerRequestContext[Any, Any], exc: Exception) -> Exception:
        """A handler's exception as a JSON-RPC error: an unknown prompt (or another value the
        SDK refuses with ValueError) -32602 saying what is known, anything else -32603."""
        from mcp.shared.exceptions import MCPError

        from .mcp_schema import shorten

        params = ctx.params or {}
        if ctx.method == "prompts/get":
            known = self.prompts()
            name = shorten(str(params.get("name")), 64)
            reason = (f"{name!r} is not a prompt of this server; it has "
                      + (", ".join(map(repr, known)) if known else "none (see prompts/list)"))
            return MCPError(code=INVALID_PARAMS, message=f"Invalid params: params.name: {reason}",
                            data={"field": "params.name", "reason": reason, "prompts": known})
        if isinstance(exc, (ValueError, LookupError)):
            reason = shorten(str(exc), 200)
            return MCPError(code=INVALID_PARAMS, message=f"Invalid params: {reason}",
                            data={"method": ctx.method, "reason": reason})
        return MCPError(code=INTERNAL_ERROR, message=f"Internal error: {type(exc).__name__} "
                        f"in {ctx.method} (a bug in fleetclaims or the MCP SDK)",
                        data={"method": ctx.method})


#: what a pydantic error type means for a request parameter
_REASONS = {"missing": "is required", "dict_type": "must be an object",
            "model_type": "must be an object", "string_type": "must be a string",
            "int_type": "must be an integer", "bool_type": "must be true or false",
            "list_type": "must be a list", "extra_forbidden": "is not a parameter of this method"}


def rpc_error(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def screen(raw: bytes, refuse_tool: ToolRefusal) -> dict[str, Any] | None:
    """None when the SDK can take the line ``raw``; else the reply to send ({}: none)."""
    from ..core.validate import SURROGATE_REASON, json_nesting_exceeds

    stripped = raw.strip()
    if not stripped:
        return {}
    try:
        text = stripped.decode("utf-8")
    except UnicodeDecodeError as exc:
        return rpc_error(None, PARSE_ERROR, f"Parse error: the line is not UTF-8 ({exc.reason} "
                         f"at byte {exc.start})")
    if json_nesting_exceeds(text, NESTING_MAX):
        return rpc_error(None, PARSE_ERROR, f"Parse error: nested deeper than {NESTING_MAX}")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return rpc_error(None, PARSE_ERROR, f"Parse error: {exc}")
    if not isinstance(message, dict):
        return rpc_error(None, INVALID_REQUEST, "Invalid Request: a message is one JSON object "
                         "(batches are not supported)")
    ident = message.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        if "method" in message and "id" in message:
            # A request with an id the SDK does not take (null, 1.5, 2.0, true, {}) would be
            # read as a notification and never answered: refused, its id echoed when it is a
            # number (null is echoed as null, as JSON-RPC answers what it cannot identify).
            echo = ident if isinstance(ident, float) and not isinstance(ident, bool) else None
            null = ", not null (MCP forbids it; a notification has no id)" if ident is None \
                else ""
            return rpc_error(echo, INVALID_REQUEST, "Invalid Request: the id must be a string "
                             f"or an integer{null}; send the request again with one")
        ident = None
    where = surrogate_at(message)
    if where is not None:
        if ident is None:
            # A notification or a response: JSON-RPC answers neither; nothing was done.
            return {} if "id" not in message else rpc_error(
                None, INVALID_REQUEST, f"Invalid Request: {where} {SURROGATE_REASON}")
        if message.get("method") == "tools/call" and where.startswith("params.arguments."):
            field = where[len("params.arguments."):]
            return {"jsonrpc": "2.0", "id": ident, "result": refuse_tool(field, SURROGATE_REASON)}
        return rpc_error(ident, INVALID_PARAMS, f"Invalid params: {where} {SURROGATE_REASON}")
    from mcp.types import jsonrpc_message_adapter

    try:
        jsonrpc_message_adapter.validate_json(text, by_name=False)
    except Exception:  # pydantic's ValidationError, or whatever else refuses the message
        return rpc_error(ident, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, "
                         "notification or response")
    return None


def surrogate_at(message: Any) -> str | None:
    """Where (a dotted path) ``message`` holds a lone surrogate, in a key or a string; None
    when it holds none. Iterative: the nesting was bounded by the caller anyway."""
    stack: list[tuple[str, Any]] = [("", message)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return path or "message"
        elif isinstance(item, dict):
            for key, value in item.items():
                here = f"{path}.{key}" if path else str(key)
                if any("\ud800" <= ch <= "\udfff" for ch in key):
                    return (f"{path}.<key>" if path else "<key>")
                stack.append((here, value))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", value) for i, value in enumerate(item))
    return None


__all__ = ["ExplainRefusals", "Wire", "rpc_error", "screen", "surrogate_at"]
