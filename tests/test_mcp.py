"""The MCP server, driven by the SDK's own client over stdio against real server processes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from fleetclaims import Registry

pytestmark = pytest.mark.integration

TOOLS = {"claim", "renew", "release", "complete", "recover", "handoff", "get", "claims",
         "events", "explain", "sweep", "brief", "claim_next", "ready", "add", "add_many",
         "depend", "block", "unblock", "transition", "reserve", "unreserve",
         "show", "list", "next"}  # the last three: older names, kept as aliases


@asynccontextmanager
async def server(registry: Path, owner: str | None, *args: str,
                 env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    """A `python -m fleetclaims mcp` process and an initialized client session on it."""
    argv = ["-m", "fleetclaims", "mcp", "--dir", str(registry), *args]
    if owner is not None:
        argv += ["--owner", owner]
    # The server keeps its tokens in the user state directory: here, beside the registry.
    state = {"XDG_STATE_HOME": str(registry.parent / "state")}
    params = StdioServerParameters(command=sys.executable, args=argv,
                                   env={"PYTHONPATH": os.pathsep.join(sys.path), **state,
                                        **(env or {})})
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def doc(result: CallToolResult) -> Any:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return json.loads(block.text)


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, doc(result)
    return doc(result)


async def error(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    data: dict[str, Any] = doc(result)
    return data


@pytest.mark.slow
def test_two_agents_claim_conflict_renew_complete(tmp_path: Path) -> None:
    """Owner A claims, renews and completes with tokens kept by its server; B conflicts."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            listed = await a.list_tools()
            tools = {t.name: t for t in listed.tools}
            assert set(tools) == TOOLS
            claim_schema = tools["claim"].input_schema
            assert claim_schema["required"] == ["task"]
            assert "description" in claim_schema["properties"]["task"]
            assert "owner" not in claim_schema["properties"]  # fixed per server
            assert all(t.description for t in listed.tools)

            got = await call(a, "claim", task="issue-42", ttl=60, note="parser")
            assert got["owner"] == "agent-a" and got["fence"] == 1
            assert "token" not in got and got["token_held_by_server"] is True
            again = await call(a, "claim", task="issue-42", ttl=60)  # a retry: same grant
            assert again["fence"] == 1

            err = await error(b, "claim", task="issue-42")
            assert err["error"] == "conflict" and err["holder"] == "agent-a"
            assert err["fence"] == 1
            assert "Pick another task" in err["next_action"]

            renewed = await call(a, "renew", task="issue-42", ttl=120)
            assert renewed["expires_in"] > 100
            # B cannot renew or complete A's claim: its server holds no token for it.
            err = await error(b, "complete", task="issue-42")
            assert err["error"] == "not_holder" and "Stop working" in err["next_action"]

            done = await call(a, "complete", task="issue-42", result={"pr": 17})
            assert done["state"] == "completed"
            shown = await call(b, "show", task="issue-42")
            assert shown["state"] == "completed" and shown["owner"] == "agent-a"
            got = await call(b, "get", task="issue-42")  # the canonical name of show
            assert (got["state"], got["owner"], got["fence"]) == ("completed", "agent-a", 1)
            finished = await call(b, "claims", include_finished=True)
            older = await call(b, "list", include_finished=True)  # the alias answers the same
            assert [c["task"] for c in finished["claims"]] == ["issue-42"]
            assert [c["task"] for c in older["claims"]] == ["issue-42"]
            err = await error(b, "claim", task="issue-42")
            assert err["error"] == "completed"

            page = await call(b, "events", after=0, limit=2)
            assert len(page["events"]) == 2 and page["more"] is True
            rest = await call(b, "events", after=page["next_cursor"])
            types = [e["type"] for e in page["events"] + rest["events"]]
            assert types == ["registry_created", "claim_created", "claim_rejected",
                             "lease_renewed", "claim_completed", "claim_rejected"]
            assert rest["more"] is False

    anyio.run(scenario)
    with Registry(reg_dir) as reg:  # what the servers did is in the registry itself
        c = reg.get("issue-42")
        assert c is not None and c.state == "completed" and c.result == {"pr": 17}


@pytest.mark.slow
def test_recover_handoff_explain_sweep_and_bad_input(tmp_path: Path) -> None:
    """A stale claim is recovered, handed off with its token, explained; bad input is a typed
    tool error and writes nothing."""
    reg_dir = tmp_path / "reg"
    with Registry(reg_dir) as reg:
        reg.claim("t-old", owner="ghost", ttl=1, process=False)

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            await anyio.sleep(1.2)  # the shortest lease there is: 1 s
            err = await error(a, "claim", task="t-old")
            assert err["error"] == "conflict" and err["stale"] is True
            assert "call recover" in err["next_action"]
            swept = await call(a, "sweep", dry_run=True)
            assert [f["task"] for f in swept["found"]] == ["t-old"]
            got = await call(a, "recover", task="t-old", reason="ghost is gone")
            assert got["owner"] == "agent-a" and got["fence"] == 2

            err = await error(a, "handoff", task="t-old", to_owner="agent-a")  # (to itself)
            assert err["error"] == "invalid" and "to_owner" in err["message"], err
            assert (await call(a, "renew", task="t-old"))["fence"] == 2  # (still its own)

            moved = await call(a, "handoff", task="t-old", to_owner="agent-b")
            assert moved["owner"] == "agent-b" and moved["fence"] == 3
            token = moved["token_for_receiver"]
            err = await error(a, "renew", task="t-old")  # A's server dropped its old token
            assert err["error"] == "not_holder"
            # B adopts the passed token, then renews and releases without it.
            await call(b, "renew", task="t-old", token=token)
            assert (await call(b, "release", task="t-old"))["released"] is True

            why = await call(b, "explain", task="t-old")
            assert why["task"] == "t-old" and len(why["steps"]) >= 4

            before = await call(a, "events")
            err = await error(a, "claim", task="bad task!")
            assert err["error"] == "invalid" and "nothing was written" in err["next_action"]
            bad = await a.call_tool("claim", {"task": "x", "ttl": -5})
            assert bad.is_error  # schema-level rejection, before the registry is touched
            after = await call(a, "events")
            assert after["next_cursor"] == before["next_cursor"]

            text = (await call(a, "brief"))["text"]
            assert "You (agent-a) hold nothing." in text

    anyio.run(scenario)


def test_owner_is_required(tmp_path: Path) -> None:
    """Without --owner or FLEETCLAIMS_OWNER the server does not start (exit 2, says why)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "FLEETCLAIMS_OWNER"}
    done = subprocess.run([sys.executable, "-m", "fleetclaims", "mcp", "--dir",
                           str(tmp_path / "r")], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert done.returncode == 2 and "FLEETCLAIMS_OWNER" in done.stderr


@pytest.mark.slow
def test_owner_from_environment(tmp_path: Path) -> None:
    """FLEETCLAIMS_OWNER names the owner when --owner is absent."""

    async def scenario() -> None:
        async with server(tmp_path / "reg", None, env={"FLEETCLAIMS_OWNER": "agent-env"}) as s:
            assert (await call(s, "claim", task="t1"))["owner"] == "agent-env"

    anyio.run(scenario)


@pytest.mark.slow
def test_readme_client_configuration_works(tmp_path: Path) -> None:
    """The README's mcpServers snippet, with its paths pointed here, starts a working server."""
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Using fleetclaims from AI agents", 1)[1]
    snippet = section.split("```json\n", 1)[1].split("```", 1)[0]
    entry = json.loads(snippet)["mcpServers"]["fleetclaims"]
    assert Path(entry["command"]).name == "fleetclaims"
    args = list(entry["args"])
    args[args.index("--dir") + 1] = str(tmp_path / "reg")
    script = Path(sys.executable).parent / "fleetclaims"  # this installation's entry point
    params = StdioServerParameters(command=str(script), args=args)

    async def scenario() -> None:
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                got = await call(session, "claim", task="from-readme")
                assert got["owner"] == args[args.index("--owner") + 1]

    anyio.run(scenario)


@pytest.mark.slow
def test_two_agents_share_the_work_queue(tmp_path: Path) -> None:
    """`next` hands each agent a different ready task, never one waiting for another; the
    token stays with the server that claimed, so `complete` needs no token."""
    reg_dir = tmp_path / "reg"
    reg = Registry(reg_dir)
    reg.add("base", priority=1)
    reg.add("other", priority=2, labels=["docs"])
    reg.add("top", depends_on=["base"])
    reg.close()

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            ready = await call(a, "ready")
            assert [t["task"] for t in ready["ready"]] == ["base", "other"]
            assert ready["queue"]["pending"] == 1
            got_a = await call(a, "next", ttl=60)
            got_b = await call(b, "claim_next", ttl=60)  # `next` is its older name
            assert (got_a["task"], got_b["task"]) == ("base", "other")
            assert "token" not in got_a and got_a["claimed"] is True
            none = await call(b, "next")
            assert none["task"] is None and none["queue"]["pending"] == 1
            await call(a, "complete", task="base")
            top = await call(b, "next", ttl=60)
            assert top["task"] == "top" and top["owner"] == "agent-b"
            brief = await call(b, "brief")
            assert "Work queue" in brief["text"] and brief["brief"]["queue"]["held"] == 2

    anyio.run(scenario)


def _speaks_of_tools(next_action: str) -> bool:
    """A next_action an agent on the server can follow: tool calls, never shell commands."""
    return "`" not in next_action and "fleetclaims " not in next_action


@pytest.mark.slow
def test_next_action_names_tools_and_a_receiver_is_told_to_pass_its_token(
        tmp_path: Path) -> None:
    """not_ready (pending, blocked), unknown_task and completed refusals advise tool calls,
    not shell commands; the receiver of a handoff calling renew without the token is told
    the registry says it holds the claim and to pass the token_for_receiver it was given
    (not "stop working"), and passing it works."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            refusals = [await error(a, "depend", task="nosuch", on=["x"])]
            await call(a, "add", task="q1")
            await call(a, "add", task="q2", depends_on=["q1"])
            refusals.append(await error(a, "claim", task="q2"))
            await call(a, "block", task="q1", reason="waiting for a decision")
            refusals.append(await error(a, "claim", task="q1"))
            await call(a, "claim", task="t1")
            await call(a, "complete", task="t1")
            refusals.append(await error(a, "claim", task="t1"))
            unknown, pending, blocked, completed = refusals
            assert unknown["error"] == "unknown_task" and "call add" in unknown["next_action"]
            assert pending["status"] == "pending" and "claim_next" in pending["next_action"]
            assert blocked["status"] == "blocked" and "call unblock" in blocked["next_action"]
            assert completed["error"] == "completed" and "claim_next" in completed["next_action"]
            for refusal in refusals:
                assert _speaks_of_tools(refusal["next_action"]), refusal

            await call(a, "claim", task="t2")
            moved = await call(a, "handoff", task="t2", to_owner="agent-b")
            err = await error(b, "renew", task="t2")
            assert err["error"] == "not_holder" and err["holder"] == "agent-b", err
            assert "token_for_receiver" in err["next_action"], err
            assert "Stop working" not in err["next_action"], err
            await call(b, "renew", task="t2", token=moved["token_for_receiver"])
            assert (await call(b, "complete", task="t2"))["state"] == "completed"
            err = await error(b, "renew", task="t9")  # never held: stop, as before
            assert err["holder"] is None and "Stop working" in err["next_action"], err

    anyio.run(scenario)


def test_next_action_of_every_refusal_speaks_of_tools() -> None:
    """Each typed error's next_action on the server is phrased as tool calls (or, for damage
    no tool repairs, as telling a human), never as a shell command to run."""
    from fleetclaims.agents.mcp_errors import next_action
    from fleetclaims.core import errors as e

    refusals: list[e.FleetclaimsError] = [
        e.TaskNotReady("q2", status="pending", waits_for=["q1"]),
        e.TaskNotReady("q1", status="blocked", waits_for=[], reason="r"),
        e.UnknownTask("nosuch"),
        e.TaskCompleted("t1", owner="agent-a", fence=3, completed_at=None),
        e.AuditCorrupt("audit.jsonl", seq=7, offset=120, reason="hash mismatch"),
        e.SegmentDamaged("segments/x.jsonl.gz", seq=7, offset=0, reason="missing"),
        e.RegistryCorrupt("claims.json", "not JSON"),
        e.HistoryLost("reg", "the journal ends early", anchor="a", origin="o", seq=9, fence=2),
    ]
    for exc in refusals:
        text = next_action(exc)
        assert _speaks_of_tools(text), (exc.code, text)
    assert "call add" in next_action(e.UnknownTask("nosuch"))
    assert "get, claims" in next_action(refusals[4])  # the reads still work
