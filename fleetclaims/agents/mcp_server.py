"""``fleetclaims mcp``: the registry as an MCP server over stdio, for AI coding agents.

The owner is fixed when the server starts, so an agent cannot act as another by passing a
name. The server keeps the tokens of the claims it made (claim, recover) and uses them when a
tool is called without one: the agent never copies secrets around. It persists them (see
``mcp_keep``), so after a restart it resumes its claims, and it renews their leases while the
client is connected, for at most ``mcp_keep.KEEPALIVE_MAX`` seconds after the agent's last
call. Its claims record no owner process: MCP clients restart servers freely, and a restart
must not make the agent's work "owner dead"; the lease decides (a server gone for good stops
renewing, so its claims expire after their TTL).

Tool names are the Registry's method names (``get``, ``claims``, ``claim_next``); the older
names ``show``, ``list`` and ``next`` stay as aliases (ALIASES) for clients that use them.

Results are compact JSON. Errors come back as tool errors (``isError``) whose text is a JSON
object with the typed error's ``error`` code, ``message``, ``holder`` where there is one, and
``next_action`` phrased in terms of these tools (``mcp_errors``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from .._version import __version__
from .._wait import Stopped
from ..core.errors import FleetclaimsError, NotHolder, ValidationError
from . import brief
from .mcp_errors import TokenNeeded, error, internal
from .mcp_keep import KEEPALIVE_MAX, Keeper, TokenFile, resume
from .mcp_paths import TOOLS as PATH_TOOLS
from .mcp_paths import Paths, PathTools, SharedPaths
from .mcp_plan import TOOLS as PLANNING
from .mcp_plan import PlanningTools
from .mcp_schema import check, closed
from .mcp_session import REQUEST, Board, Request, Tracker
from .mcp_stdio import ExplainRefusals

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.model import Claim, Now

Task = Annotated[str, Field(max_length=200, description="The task id, e.g. 'issue-42'.")]
Token = Annotated[str | None, Field(
    description="The claim's token. Omit it: the server keeps the tokens of claims it made.")]
Ttl = Annotated[float | None, Field(
    ge=1, le=86400,
    description="Lease length in seconds from now; omit to keep the claim's current one.")]
LeaseTtl = Annotated[float, Field(
    ge=1, le=86400,
    description="Lease length in seconds; renew before it runs out (every ttl/3 is safe).")]

Wait = Annotated[float, Field(
    ge=0, le=600, description="Seconds to wait for the task to be free (woken by registry "
    "changes, not polling); 0 answers at once.")]
WAIT_SLICE = 2.0  # a waiting tool call lets go of the server's lock this often

READ = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def _summary(c: Claim, now: float | Now) -> dict[str, Any]:
    """A claim in few members: what an agent needs to act, never the token."""
    from .._reads import lease_left

    left = lease_left(c.expires_at, c.boot_deadline, c.deadline_boot, now)
    return {"task": c.task, "owner": c.owner, "fence": c.fence, "state": c.state,
            "phase": c.phase, "expires_in": None if left is None else round(left, 1),
            "note": c.note, "paths": list(c.paths), "shared_paths": list(c.shared_paths)}


def _ok(data: Any) -> CallToolResult:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    structured = data if isinstance(data, dict) else {"result": data}
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=structured)


def _cancelled(request: Request) -> CallToolResult:
    """The answer to a call its client cancelled before it did anything: never sent (MCP:
    no response to a cancelled request), only counted as answered (``Wire``)."""
    request.unanswered = True
    return error(FleetclaimsError("the call was cancelled by the client; nothing was done"))


class ClaimsServer(PlanningTools, PathTools):
    """The tools, bound to one registry and one owner; the tokens of claims made here."""

    def __init__(self, registry: Registry, owner: str, token_file: TokenFile | None = None,
                 keepalive: float = KEEPALIVE_MAX) -> None:
        from ..core import validate

        self.registry = registry
        self.owner = validate.owner(owner)
        self.token_file = token_file
        self.tokens: dict[str, str] = {}
        if token_file is not None:  # a restarted server resumes the claims it still holds
            self.tokens = resume(registry, self.owner, token_file.load())
            self._save()
        # Tools run in worker threads; one registry operation at a time keeps the handle and
        # the token table consistent (each operation takes well under a millisecond).
        self._lock = threading.Lock()
        self.keeper = Keeper(registry, self.tokens, self._lock, self.forget, keepalive)

    def _save(self) -> None:
        if self.token_file is not None:
            self.token_file.save(self.tokens)

    def keep(self, task: str, token: str) -> None:
        """Hold on to ``token`` for ``task`` (persisted at once)."""
        if self.tokens.get(task) != token:
            self.tokens[task] = token
            self._save()

    def forget(self, task: str) -> None:
        if self.tokens.pop(task, None) is not None:
            self._save()

    def call(self, op: Callable[[], Any]) -> CallToolResult:
        self.keeper.touched()
        with self._lock:
            try:
                return _ok(op())
            except FleetclaimsError as exc:
                return error(exc)
            except Stopped:
                raise  # (a wait told to stop: ``waiting`` decides the answer)
            except Exception as exc:  # the SDK would hide the reason behind plain text
                from .._open import typed_store_error

                typed = typed_store_error(exc)
                if typed is not None:  # a permission or database failure
                    return error(typed)
                if not isinstance(exc, OSError):
                    return internal(exc)
                text = json.dumps({"error": "error", "message": str(exc), "holder": None,
                                   "next_action": "Check the registry path and permissions "
                                   "(--dir), then retry."})
                return CallToolResult(content=[TextContent(type="text", text=text)],
                                      is_error=True)

    def damaged(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A read tool's ``doc`` with a ``damage`` member when the journal is damaged (the
        verified state is shown; the member says what and where, and what to run), as the
        command line's ``--json`` (#16); absent when healthy."""
        describe = getattr(self.registry.store, "damage_doc", None)
        damage = describe() if callable(describe) else None
        if damage is not None:
            doc["damage"] = damage
        return doc

    def token_for(self, task: str, token: str | None) -> str:
        if token:
            return token
        held = self.tokens.get(task)
        if held is None:
            c = self.registry.get(task)
            if c is not None and c.live and c.owner == self.owner:
                raise TokenNeeded(task, f"this server holds no token for it, though {self.owner}"
                                  " holds it in the registry (handed over?): pass its token",
                                  holder=self.owner, fence=c.fence,
                                  hint="Pass the token you were given.")
            raise NotHolder(task, f"this server ({self.owner}) holds no token for it",
                            hint="Claim it first, or pass the token explicitly.")
        return held

    def forget_if_lost(self, task: str, op: Callable[[], Any]) -> Any:
        """Run ``op``; drop the kept token when the registry says it no longer holds."""
        try:
            return op()
        except NotHolder:
            self.forget(task)
            raise

    def summary(self, c: Claim) -> dict[str, Any]:
        return _summary(c, self.registry.store.now())

    def granted(self, c: Claim) -> dict[str, Any]:
        if c.token:
            self.keep(c.task, c.token)
        return {**_summary(c, self.registry.store.now()), "token_held_by_server": True}

    # --- tools ---------------------------------------------------------------------------

    def claim(self, task: Task,
              ttl: LeaseTtl = 600,
              note: Annotated[str | None, Field(description="What you are doing, for "
                                                "others to read.")] = None,
              priority: Annotated[int, Field(description="Lower wins duplicates and "
                                             "preemption.")] = 100,
              take_stale: Annotated[bool, Field(description="Take the task over if its claim "
                                                "is stale (expired or owner dead).")] = False,
              wait: Wait = 0,
              paths: Paths = None,
              shared_paths: SharedPaths = None,
              ) -> CallToolResult:
        # With the token this server already holds for the task, a repeated claim (an agent
        # retrying after a lost reply) is idempotent instead of a conflict with itself.
        return self.waiting(wait, lambda w: self.granted(self.registry.claim(
            task, owner=self.owner, ttl=ttl, note=note, priority=priority,
            take_stale=take_stale, token=self.tokens.get(task), process=False, wait=w,
            paths=paths, shared_paths=shared_paths)))

    def claim_next(self,
                   ttl: LeaseTtl = 600,
                   labels: Annotated[list[str] | None, Field(
                       description="Only tasks carrying every one of these labels.")] = None,
                   take_stale: Annotated[bool, Field(description="A queued task whose claim "
                                                     "is stale counts as ready.")] = False,
                   wait: Wait = 0,
                   paths: Paths = None,
                   shared_paths: SharedPaths = None,
                   ) -> CallToolResult:
        def op(w: float | None) -> dict[str, Any]:
            c = self.registry.claim_next(owner=self.owner, labels=labels, ttl=ttl,
                                         take_stale=take_stale, process=False, wait=w,
                                         paths=paths, shared_paths=shared_paths)
            if c is None:
                return {"task": None, "claimed": False, "queue": self.registry.stats().queue,
                        "next_action": "Nothing is ready: call claim_next with wait=300 to "
                        "sleep until a task is, or see the ready tool."}
            queued = self.registry.task(c.task)
            text = {} if queued is None else {"title": queued.task.title,
                                              "description": queued.task.description}
            return {**self.granted(c), **text, "claimed": True}

        return self.waiting(wait, op, done=lambda r: bool(r.get("claimed")))

    def waiting(self, wait: float, op: Callable[[float | None], dict[str, Any]],
                done: Callable[[dict[str, Any]], bool] = lambda r: True) -> CallToolResult:
        """``op`` with ``wait`` seconds of waiting, in slices of WAIT_SLICE: the lock is let go
        between them, so the keeper renews the leases held meanwhile and other calls run.

        The wait stops when the client cancels the call (nothing is claimed after that and
        the answer is dropped) or goes away (EOF, a signal: the wait ends as if its time ran
        out, with the refusal met as the answer); see ``mcp_session``."""
        from .._wait import Stopped, continued, stoppable

        request = REQUEST.get()
        if request is not None and request.stop.is_set():
            if request.cancelled:
                return _cancelled(request)
            wait = 0  # the client is gone: no waiting, one try answered
        if not wait:
            return self.call(lambda: op(None))
        stop = request.stop if request is not None else threading.Event()
        deadline = time.monotonic() + wait
        first = True
        last: CallToolResult | None = None
        while True:
            left = deadline - time.monotonic()
            piece = max(0.0, min(WAIT_SLICE, left))
            try:
                with contextlib.nullcontext() if first else continued(), stoppable(stop):
                    result = self.call(lambda: op(piece))  # noqa: B023 - called here, at once
            except Stopped as exc:
                if request is not None and request.cancelled:
                    return _cancelled(request)
                if exc.refusal is not None:
                    return error(exc.refusal)
                return last if last is not None else self.call(lambda: op(None))
            first = False
            last = result
            if result.is_error:
                payload = json.loads(result.content[0].text)  # type: ignore[union-attr]
                if payload.get("error") not in ("conflict", "not_ready") or left <= WAIT_SLICE:
                    return result
            elif done(result.structured_content or {}) or left <= WAIT_SLICE:
                return result

    def ready(self, labels: Annotated[list[str] | None, Field(
            description="Only tasks carrying every one of these labels.")] = None,
              ) -> CallToolResult:
        def op() -> dict[str, Any]:
            tasks = self.registry.ready(labels=labels)
            return self.damaged({
                "ready": [{"task": t.task, "priority": t.priority, "labels": list(t.labels),
                           "note": t.note} for t in tasks[:50]],
                "count": len(tasks), "queue": self.registry.stats().queue})

        return self.call(op)

    def renew(self, task: Task, ttl: Ttl = None, token: Token = None) -> CallToolResult:
        def op() -> dict[str, Any]:
            tok = self.token_for(task, token)
            c = self.forget_if_lost(task, lambda: self.registry.renew(task, token=tok, ttl=ttl))
            self.keep(task, tok)  # an explicitly passed token is kept from now on
            return _summary(c, self.registry.store.now())

        return self.call(op)

    def release(self, task: Task, token: Token = None) -> CallToolResult:
        def op() -> dict[str, Any]:
            tok = self.token_for(task, token)
            done = self.forget_if_lost(task, lambda: self.registry.release(task, token=tok))
            self.forget(task)
            return {"task": task, "released": done}

        return self.call(op)

    def complete(self, task: Task,
                 result: Annotated[Any, Field(description="Any JSON recorded with the "
                                              "completion, e.g. {\"pr\": 17}.")] = None,
                 token: Token = None) -> CallToolResult:
        def op() -> dict[str, Any]:
            from ..core import validate

            validate.task(task)  # the arguments first: a bad result is refused as such,
            validate.json_value("result", result)  # not as a missing token
            tok = self.token_for(task, token)
            c = self.forget_if_lost(task, lambda: self.registry.complete(task, token=tok,
                                                                         result=result))
            self.forget(task)
            return _summary(c, self.registry.store.now())

        return self.call(op)

    def recover(self, task: Task,
                reason: Annotated[str, Field(description="Why you take it over, for the "
                                             "audit log.")],
                ttl: LeaseTtl = 600,
                note: Annotated[str | None, Field(description="What you will do.")] = None,
                ) -> CallToolResult:
        return self.call(lambda: self.granted(self.registry.recover(
            task, owner=self.owner, reason=reason, ttl=ttl, note=note, process=False)))

    def handoff(self, task: Task,
                to_owner: Annotated[str, Field(description="Who receives the claim.")],
                note: Annotated[str | None, Field(description="What they need to know.")] = None,
                ttl: Ttl = None, token: Token = None) -> CallToolResult:
        def op() -> dict[str, Any]:
            if to_owner == self.owner:  # (its new token would be dropped: the claim orphaned)
                raise ValidationError("to_owner", f"is this server's own owner ({self.owner}): "
                                      "the claim is yours already; hand it to another owner, "
                                      "or renew it", value=to_owner)
            tok = self.token_for(task, token)
            c = self.forget_if_lost(task, lambda: self.registry.handoff(
                task, token=tok, to_owner=to_owner, note=note, ttl=ttl))
            self.forget(task)
            # The new token belongs to the receiver: it is returned once, to be passed on.
            return {**_summary(c, self.registry.store.now()), "token_for_receiver": c.token}

        return self.call(op)

    def get(self, task: Task) -> CallToolResult:
        def op() -> dict[str, Any]:
            c = self.registry.get(task)
            if c is None:
                return self.damaged({"task": task, "claim": None, "free": True})
            stale = self.registry.is_stale(c) if c.live else None
            return self.damaged({**_summary(c, self.registry.store.now()), "stale": stale,
                                 "free": c.state == "released",
                                 "yours": c.live and c.owner == self.owner and task in self.tokens})

        return self.call(op)

    def claims(self,
               owner: Annotated[str | None, Field(description="Only this owner's claims.")] = None,
               include_finished: Annotated[bool, Field(description="Also completed and released "
                                                       "ones.")] = False) -> CallToolResult:
        def op() -> dict[str, Any]:
            now = self.registry.store.now()
            claims = self.registry.claims(owner=owner, include_expired=True,
                                          include_completed=include_finished,
                                          include_released=include_finished)
            return self.damaged({"claims": [{**_summary(c, now),
                                             "stale": self.registry.is_stale(c) if c.live
                                             else None} for c in claims]})

        return self.call(op)

    def events(self,
               after: Annotated[int, Field(ge=0, description="Cursor: the last seq already "
                                           "seen (0 for the start); pass next_cursor back.")] = 0,
               limit: Annotated[int, Field(ge=1, le=1000, description="At most this many "
                                           "events.")] = 50,
               task: Annotated[str | None, Field(description="Only this task's events.")] = None,
               types: Annotated[list[str] | None, Field(description="Only these event types, "
                                                        "e.g. ['claim_created'].")] = None,
               ) -> CallToolResult:
        def op() -> dict[str, Any]:
            page = self.registry.events(after=after, limit=limit, types=types, task=task)
            return self.damaged({"events": [e.data for e in page.events],
                                 "next_cursor": page.next_cursor, "more": page.more})

        return self.call(op)

    def explain(self, task: Task) -> CallToolResult:
        return self.call(lambda: self.damaged(self.registry.explain(task).to_dict()))

    def sweep(self, dry_run: Annotated[bool, Field(description="Only report what is "
                                                   "stale.")] = False) -> CallToolResult:
        def op() -> dict[str, Any]:
            report = self.registry.sweep(dry_run=dry_run, actor=self.owner)
            return {"dry_run": dry_run, "found": [
                {"task": i.task, "owner": i.owner, "fence": i.fence, "reason": i.reason}
                for i in report.found]}

        return self.call(op)

    def brief(self) -> CallToolResult:
        def op() -> dict[str, Any]:
            doc = brief.build(self.registry, self.owner, time.time(), tools=True)
            return self.damaged({"text": brief.render(doc), "brief": doc})

        return self.call(op)


TOOLS: dict[str, tuple[str, ToolAnnotations]] = {
    "claim": ("Claim a task for this server's owner under a lease of `ttl` seconds. Fails "
              "with a conflict naming the holder if anyone holds it. The server keeps the "
              "token; renew before the lease ends, then complete or release.", WRITE),
    "claim_next": ("Claim the best ready task of the work queue (lowest priority number, then "
             "oldest) for this server's owner, atomically: two agents never get the same "
             "one. Returns the task (the server keeps the token) or task=null when nothing "
             "is ready.", WRITE),
    "ready": ("The queued tasks that can be taken now, best first (at most 50), and the "
              "queue's counts by readiness.", READ),
    "renew": ("Extend your lease on a task you claimed (heartbeat), by `ttl` seconds or the "
              "claim's own ttl. Fails with lease_expired/not_holder if you lost it: then stop "
              "working on it.", WRITE),
    "release": ("Give up a task you hold without finishing it; others may claim it.", WRITE),
    "complete": ("Mark a task you hold as done, with an optional JSON `result`. Refused if "
                 "your lease ran out.", WRITE),
    "recover": ("Take over a stale claim (lease expired or owner process dead), recording "
                "`reason`. Refused while the holder is live.", WRITE),
    "handoff": ("Hand a task you hold to `to_owner`: a new fence and token; the result "
                "carries the new token once, to pass to the receiver.", WRITE),
    "get": ("One task's claim: owner, fence, state, phase, seconds until expiry, whether it "
             "is stale, free, or yours.", READ),
    "claims": ("Live claims (and stale ones), sorted by task; `include_finished` adds completed "
             "and released ones.", READ),
    "events": ("A page of the audit log, oldest first, after the cursor `after`; pass "
               "`next_cursor` back to continue while `more` is true.", READ),
    "explain": ("Who holds a task and why, from the audit log: each grant, conflict, "
                "take-over and hand-off.", READ),
    "sweep": ("Mark expired leases and claims of dead owners as stale (recorded as "
              "lease_expired); `dry_run` only reports.", WRITE),
    "brief": ("A short current picture: what you hold and must renew, what others hold, what "
              "is stale, and the tool calls to use. Call it at the start of a session.", READ),
    **{name: (text, WRITE) for name, text in PLANNING.items()},
    **{name: (text, WRITE) for name, text in PATH_TOOLS.items()},
}


#: older tool names, still served for the clients and prompts that use them -> the tool
ALIASES: dict[str, str] = {"show": "get", "list": "claims", "next": "claim_next"}

class _Server(MCPServer[Any]):
    """The SDK's server, whose argument-schema refusals (and unknown tools) come back as the
    documented JSON error document instead of the SDK's plain text. Arguments are checked
    against the tool's published inputSchema first (``mcp_schema``): the SDK would drop an
    unknown argument and coerce a value of another JSON type."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
        from pydantic import ValidationError as SchemaError

        from ..core.errors import ValidationError

        tool = self._tool_manager.get_tool(name)
        if tool is not None:  # (an unknown tool is the SDK's refusal, below)
            try:  # arguments the published schema refuses, before the SDK coerces them
                check(name, tool.parameters, arguments)
            except ValidationError as exc:
                return error(exc)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            return internal(exc.__cause__ or exc)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, SchemaError) and cause.errors():
                first = cause.errors()[0]
                field = ".".join(str(part) for part in first["loc"]) or "arguments"
                return error(ValidationError(field, first["msg"].rstrip(".")))
            if name not in TOOLS and name not in ALIASES:
                return error(ValidationError(
                    "name", "is not a tool of this server; the tools are "
                    + ", ".join(sorted(TOOLS)), value=name))
            return error(ValidationError("arguments", str(exc)))


def build(registry: Registry, owner: str, token_file: TokenFile | None = None,
          keepalive: float = KEEPALIVE_MAX, board: Board | None = None,
          ) -> tuple[MCPServer[Any], ClaimsServer]:
    """The MCP server for ``registry`` acting as ``owner``, and its tool object (whose tokens
    are kept in ``token_file`` when given); ``board``: the requests its wire reads."""
    from ..core.durations import format_duration

    tools = ClaimsServer(registry, owner, token_file, keepalive)
    server: MCPServer[Any] = _Server(
        name="fleetclaims", version=__version__, log_level="WARNING",
        instructions=(
            f"fleetclaims coordinates agents sharing one repository. You act as "
            f"{tools.owner!r}. Before working on a task, claim it; if the claim conflicts, "
            "someone else owns it: pick another. The server renews your leases while you work "
            f"(for {format_duration(keepalive)} after your last call); complete when done or "
            "release if you stop. If a call says you are not the holder, stop that work at "
            "once. Call brief for the current picture."))
    for name, (description, hints) in TOOLS.items():
        server.add_tool(getattr(tools, name), name=name, description=description,
                        annotations=hints, structured_output=False)
    for old, new in ALIASES.items():
        description, hints = TOOLS[new]
        server.add_tool(getattr(tools, new), name=old, annotations=hints,
                        description=f"Older name of `{new}` (prefer `{new}`). {description}",
                        structured_output=False)
    server._lowlevel_server.middleware.append(ExplainRefusals(  # -32602 says what
        prompts=lambda: [p.name for p in server._prompt_manager.list_prompts()]))
    if board is not None:  # each handler knows its request: a cancel stops its wait
        server._lowlevel_server.middleware.append(Tracker(board))
    for tool in server._tool_manager.list_tools():  # published as enforced: no other argument
        closed(tool.parameters)
    return server, tools


def serve(registry: Registry, owner: str, keepalive: float = KEEPALIVE_MAX) -> None:
    """Serve over stdio until the client closes the connection, with the tokens persisted and
    the leases renewed meanwhile (``mcp_keep``). The SDK's transport is fed through a filter
    that answers every line it cannot take itself (see ``mcp_stdio.Wire``). At EOF, and on
    SIGINT or SIGTERM, every wait stops and what was read is answered; then the server ends
    (raising KeyboardInterrupt after SIGINT, SystemExit(143) after SIGTERM, as the command
    line's other commands end). Held claims are left as they are: their leases decide."""
    import signal

    import anyio
    from mcp.server.stdio import stdio_server

    from ..core.errors import ValidationError
    from .mcp_stdio import Wire

    board = Board()
    server, tools = build(registry, owner, TokenFile(registry.location, owner), keepalive,
                          board=board)
    tools.keeper.start()

    def refuse(field: str, reason: str) -> dict[str, Any]:
        result = error(ValidationError(field, reason))
        return result.model_dump(mode="json", by_alias=True, exclude_unset=True)

    # The wire gets private copies of descriptors 0 and 1, which then point at /dev/null and
    # stderr (as the SDK's own transport does): a stray print or a child process can neither
    # read the client's requests nor write into the answers.
    wire_in, wire_out = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    wire = Wire(refuse, stdin=wire_in, stdout=wire_out, board=board)

    async def signals() -> None:
        # Handled on the event loop (not raised at a random point of a worker's registry
        # operation): the session ends as at EOF, whatever stdin does.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for signum in received:
                wire.stop(signum)
                return

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(signals)
            async with stdio_server(stdin=wire, stdout=wire) as (read, write):  # type: ignore[arg-type]
                low = server._lowlevel_server  # what MCPServer.run_stdio_async runs
                await low.run(read, write, low.create_initialization_options())
            tg.cancel_scope.cancel()

    try:
        anyio.run(run)
    finally:
        tools.keeper.stop()
        with contextlib.suppress(OSError):
            wire_out.flush()
    if board.signal == signal.SIGINT:
        raise KeyboardInterrupt
    if board.signal is not None:
        raise SystemExit(128 + board.signal)
