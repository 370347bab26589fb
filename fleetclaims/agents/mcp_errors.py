"""The MCP server's refusals: a typed error as the tool error (``isError``) whose text is the
JSON error document (``error``, ``message``, ``holder``, ``next_action``), with its advice in
terms of the server's tools (the library's hints speak of the command line)."""

from __future__ import annotations

import json

from mcp.types import CallToolResult, TextContent

from .._version import __version__
from ..core.errors import (
    AuditCorrupt,
    ClaimConflict,
    FleetclaimsError,
    NotHolder,
    PathConflict,
    RegistryCorrupt,
    TaskCompleted,
    TaskNotReady,
    UnknownTask,
)


class TokenNeeded(NotHolder):
    """A tool needs the token of a claim the registry says this server's owner holds, and the
    server has none (a claim handed to this owner, or made elsewhere under its name); its
    code is still ``not_holder``, its ``holder`` that owner."""


def next_action(exc: FleetclaimsError) -> str:
    """The error's advice in terms of this server's tools (the library's speaks of the CLI)."""
    task = getattr(exc, "task", "TASK")
    if isinstance(exc, PathConflict):
        return (f"{exc.holder} reserved {exc.theirs!r} for {exc.holder_task!r}, which overlaps "
                f"{exc.mine!r}: do not touch those files. Claim with other paths, or wait for "
                "that claim to end.")
    if isinstance(exc, ClaimConflict):
        if exc.stale:
            return f"The claim is stale ({exc.reason}): call recover with task={task!r} and a " \
                   "reason to take it over."
        return (f"Do not work on {task!r}: {exc.holder} holds it. Pick another task (call "
                "brief or claims), or call get later to see whether it was released.")
    if isinstance(exc, TaskCompleted):
        return (f"{task!r} is done (completed by {exc.owner}): pick another task (call "
                "claim_next, or brief to see what is ready). Only a human can reopen it.")
    if isinstance(exc, TaskNotReady):
        if exc.status == "blocked":
            return (f"{task!r} is blocked: take another task (call claim_next, or ready to see "
                    f"them); call unblock with task={task!r} only if you know the reason no "
                    "longer holds.")
        waits = ", ".join(map(repr, exc.waits_for))
        return (f"{task!r} waits for {waits}: take a ready task (call claim_next, or ready to "
                f"see them), or call claim with task={task!r} and wait=300 to sleep until it "
                "is ready.")
    if isinstance(exc, UnknownTask):
        return (f"{task!r} is not in the work queue: check its spelling (call brief or "
                f"ready), or call add with task={task!r} to put it there first.")
    if isinstance(exc, TokenNeeded):
        return (f"The registry says you ({exc.holder}) hold {task!r} (fence {exc.fence}), but "
                "this server has no token for it: if it was handed to you, call the tool again "
                "with token= the token_for_receiver you were given (for reserve or unreserve, "
                f"call renew with task={task!r} and that token first); the server keeps it "
                "from then on. Without the token, do not work on it: ask whoever gave it to you.")
    if isinstance(exc, NotHolder):
        return (f"Stop working on {task!r} and do not commit that work; call get or explain to "
                "see who holds it, and claim it again only if it is free.")
    if exc.code == "invalid":
        return "Fix the argument and call the tool again; nothing was written."
    if exc.code in ("busy", "unavailable"):
        return "Retry in a few seconds."
    if isinstance(exc, RegistryCorrupt):
        reads = " The read tools (get, claims, events, brief) still show the verified state." \
            if isinstance(exc, AuditCorrupt) else ""
        return ("Nothing was written. The registry is damaged and no tool of this server "
                "repairs it: stop writing and tell a human, quoting this message (from the "
                f"command line, doctor and audit verify inspect and repair it).{reads}")
    if exc.hint and "`" in exc.hint:  # the library's advice is a command for a human to run
        return f"Tell a human, who can act on it from the command line: {exc.hint}"
    return exc.hint or "Tell a human, quoting this message."


def error(exc: FleetclaimsError) -> CallToolResult:
    doc = exc.to_dict()
    doc["message"] = exc.message  # the CLI hint lives in next_action instead
    doc.setdefault("holder", None)
    doc["next_action"] = next_action(exc)
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def internal(exc: BaseException) -> CallToolResult:
    """A bug, told as the JSON error document (code ``internal``)."""
    text = json.dumps({"error": "internal", "message": f"internal error (a bug in fleetclaims "
                       f"{__version__}): {type(exc).__name__}", "holder": None,
                       "next_action": "Tell a human: this is a bug in fleetclaims; the call "
                       "may be retried."})
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


__all__ = ["TokenNeeded", "error", "internal", "next_action"]
