"""An agent's day over MCP, with the official MCP client over stdio against real server
processes: a server restart in the middle of a claim, leases renewed while the agent thinks,
the planning tools, waiting for work, JSON refusals, and no silently chosen registry."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from test_mcp import call, doc, error, server

from fleetclaims import Registry

pytestmark = pytest.mark.integration


def token_files(reg_dir: Path) -> list[Path]:
    """The server's token files (its user state directory is beside the registry in tests)."""
    return sorted((reg_dir.parent / "state" / "fleetclaims" / "mcp-tokens").glob("*.json"))


@pytest.mark.slow
def test_a_restarted_server_resumes_its_claim(tmp_path: Path) -> None:
    """The server is restarted in the middle of a claim (as MCP clients do): the new one has the
    token (persisted 0600 in a 0700 directory), renews and completes without the agent passing
    it; meanwhile the claim was neither owner-dead nor taken over."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a:
            got = await call(a, "claim", task="issue-7", ttl=60, note="half done")
            assert got["fence"] == 1
        files = token_files(reg_dir)
        assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
        assert "issue-7" in files[0].read_text()
        with Registry(reg_dir) as reg:  # between the two servers
            claim = reg.get("issue-7")
            assert claim is not None and claim.identity is None  # the lease decides
            assert reg.is_stale(claim) is None
        async with server(reg_dir, "agent-b") as b:
            err = await error(b, "claim", task="issue-7", take_stale=True)
            assert err["error"] == "conflict" and err["holder"] == "agent-a"
        async with server(reg_dir, "agent-a") as again:
            mine = await call(again, "get", task="issue-7")
            assert mine["yours"] is True
            renewed = await call(again, "renew", task="issue-7")
            assert renewed["fence"] == 1
            done = await call(again, "complete", task="issue-7", result={"pr": 3})
            assert done["state"] == "completed"
        assert "issue-7" not in token_files(reg_dir)[0].read_text()  # forgotten once done

    anyio.run(scenario)


@pytest.mark.slow
def test_tokens_are_kept_per_registry_and_owner(tmp_path: Path) -> None:
    """Another owner on the same registry, or the same owner on another registry, does not get
    the token: its renew is refused as not the holder."""
    reg_dir, other_dir = tmp_path / "reg", tmp_path / "other"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a:
            await call(a, "claim", task="t", ttl=60)
        async with server(reg_dir, "agent-b") as b:
            assert (await error(b, "renew", task="t"))["error"] == "not_holder"
        async with server(other_dir, "agent-a") as elsewhere:
            assert (await error(elsewhere, "renew", task="t"))["error"] == "not_holder"

    anyio.run(scenario)


@pytest.mark.slow
def test_the_server_renews_leases_while_the_agent_thinks(tmp_path: Path) -> None:
    """A 2-second lease stays live for 4 s without any call (the server renews it at ttl/3);
    with --keepalive 1s it runs out once the agent has been quiet longer than that."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a:
            await call(a, "claim", task="long-thought", ttl=2)
            await anyio.sleep(4)
            got = await call(a, "get", task="long-thought")
            assert got["state"] == "active" and got["stale"] is None and got["expires_in"] > 0
        async with server(reg_dir, "agent-b", "--keepalive", "1s") as b:
            await call(b, "claim", task="forgotten", ttl=2)
            await anyio.sleep(4.5)
        with Registry(reg_dir) as reg:
            claim = reg.get("forgotten")
            assert claim is not None and reg.is_stale(claim) == "lease expired"

    anyio.run(scenario)


@pytest.mark.slow
def test_planning_tools_and_parking(tmp_path: Path) -> None:
    """add (title, description), add_many, depend, block, unblock and transition are tools; the
    queue events name the server's owner; a parked claim records its maximum park time."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "planner") as p:
            added = await call(p, "add", task="docs", title="Write the docs",
                               description="The agent's day, in order.", labels=["docs"])
            assert added["status"] == "ready" and added["title"] == "Write the docs"
            many = await call(p, "add_many", tasks=[{"id": "build"}, {"id": "ship",
                                                                     "depends_on": ["build"]}])
            assert many["events"] == 2 and many["queue"]["pending"] == 1
            assert (await call(p, "depend", task="docs", on=["build"]))["depends_on"] == ["build"]
            kept = await call(p, "add", task="docs", title="Write the user guide")
            assert (kept["depends_on"], kept["labels"]) == (["build"], ["docs"])  # kept
            assert (await call(p, "block", task="build", reason="CI down"))["changed"] is True
            assert (await call(p, "unblock", task="build"))["status"] == "ready"
            got = await call(p, "claim_next", ttl=60)
            assert got["task"] == "build"
            parked = await call(p, "transition", task="build", phase="review")
            assert parked["phase"] == "review" and parked["expires_in"] > 86000
            err = await error(p, "add_many", tasks=[{"id": "x", "colour": "red"}])
            assert err["error"] == "invalid" and "colour" in err["message"]
            assert "next_action" in err
        with Registry(reg_dir) as reg:
            kinds = {e.data["type"]: e.data.get("actor") for e in reg.events(limit=100).events}
            assert kinds["task_added"] == kinds["task_blocked"] == "planner"
            assert reg.task("docs").task.description == "The agent's day, in order."  # type: ignore[union-attr]

    anyio.run(scenario)


@pytest.mark.slow
def test_waiting_for_work_over_mcp(tmp_path: Path) -> None:
    """claim_next(wait=) returns the task another agent adds meanwhile; claim(wait=) the task
    another agent releases, after several wait slices that record one refusal in all."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            results: dict[str, object] = {}

            async def wait_next() -> None:
                results["next"] = await call(b, "claim_next", ttl=60, wait=20)

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_next)
                await anyio.sleep(1.0)
                await call(a, "add", task="fresh", title="Fresh work")
            got = results["next"]
            assert isinstance(got, dict) and got["task"] == "fresh"
            assert got["title"] == "Fresh work"

            await call(a, "claim", task="shared", ttl=60)

            async def wait_claim() -> None:
                results["claim"] = await call(b, "claim", task="shared", ttl=60, wait=20)

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_claim)
                await anyio.sleep(5.0)  # longer than a wait slice: the wait goes on quietly
                await call(a, "release", task="shared")
            claimed = results["claim"]
            assert isinstance(claimed, dict) and claimed["owner"] == "agent-b"
        with Registry(reg_dir) as reg:
            refusals = reg.events(types=["claim_rejected"], task="shared").events
            assert len(refusals) == 1

    anyio.run(scenario)


@pytest.mark.slow
def test_every_refusal_is_the_json_error_document(tmp_path: Path) -> None:
    """Schema refusals (a negative ttl, a wrong type, a missing argument, an unknown tool) come
    back as the documented JSON error with next_action, not the SDK's plain text."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a:
            for tool, args in (("claim", {"task": "x", "ttl": -5}),
                               ("claim", {"task": 5}),
                               ("block", {"task": "x"}),
                               ("claim_next", {"wait": 10_000}),
                               ("no_such_tool", {})):
                result = await a.call_tool(tool, args)
                assert result.is_error, (tool, args)
                body = doc(result)
                assert body["error"] == "invalid" and body["next_action"], (tool, args, body)

    anyio.run(scenario)


@pytest.mark.slow
def test_brief_speaks_in_tool_calls(tmp_path: Path) -> None:
    """The brief an MCP agent gets names tool calls it can make, not shell commands."""
    reg_dir = tmp_path / "reg"
    with Registry(reg_dir) as reg:
        reg.add("docs", title="Write the docs")

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a:
            text = (await call(a, "brief"))["text"]
            assert "Tool calls:" in text and "claim_next(" in text and "complete(task=" in text
            assert "fleetclaims " not in text.replace("fleetclaims brief", "")
            assert "docs (priority 100): Write the docs" in text

    anyio.run(scenario)


@pytest.mark.slow
def test_the_server_refuses_a_registry_chosen_silently(tmp_path: Path) -> None:
    """Started outside a git repository without --dir or FLEETCLAIMS_DIR (as MCP clients start
    servers: no environment, maybe in /), the server refuses (exit 2) and says what to pass;
    inside a repository it serves the repository's registry."""
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    done = subprocess.run([sys.executable, "-m", "fleetclaims", "mcp", "--owner", "a"],
                          cwd=outside, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert done.returncode == 2 and "--dir" in done.stderr and "FLEETCLAIMS_DIR" in done.stderr
    assert not (tmp_path / "state" / "fleetclaims" / "registry").exists()

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    started = time.monotonic()
    served = subprocess.run([sys.executable, "-m", "fleetclaims", "mcp", "--owner", "a"],
                            cwd=repo, env=env, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert served.returncode == 0, served.stderr  # stdin closed at once: a clean end
    assert time.monotonic() - started < 30


def test_two_servers_of_one_owner_keep_each_others_tokens(tmp_path: Path) -> None:
    """Two MCP servers of the same owner on one registry (two client windows, or a restart
    while the old one lives): each one's saved tokens survive the other's saves, and a token
    given up is taken out by the one that held it only. The file used to be overwritten whole
    by each, so a restarted server lost the other's claims."""
    from fleetclaims.agents.mcp_keep import TokenFile

    first = TokenFile("/reg", "agent-y", tmp_path)
    second = TokenFile("/reg", "agent-y", tmp_path)
    first.save({"ta": "token-a"})
    second.save({"tb": "token-b"})
    assert TokenFile("/reg", "agent-y", tmp_path).load() == {"ta": "token-a", "tb": "token-b"}
    first.save({})  # (first completed ta)
    assert TokenFile("/reg", "agent-y", tmp_path).load() == {"tb": "token-b"}
    second.save({"tb": "token-b", "tc": "token-c"})
    assert TokenFile("/reg", "agent-y", tmp_path).load() == {"tb": "token-b", "tc": "token-c"}


def test_a_damaged_token_file_is_kept_aside_not_overwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A token file cut short was read as empty and then overwritten by the next save: the
    agent's tokens were gone with no copy. It is set aside (named on stderr) and a new file
    written beside it."""
    from fleetclaims.agents.mcp_keep import TokenFile

    keep = TokenFile("/reg", "agent-y", tmp_path)
    keep.save({"k1": "token-k1", "k2": "token-k2"})
    whole = keep.path.read_bytes()
    keep.path.write_bytes(whole[: len(whole) // 2])
    fresh = TokenFile("/reg", "agent-y", tmp_path)
    assert fresh.load() == {}
    fresh.save({"k3": "token-k3"})
    aside = [p for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == whole[: len(whole) // 2]
    assert str(aside[0]) in capsys.readouterr().err
    assert TokenFile("/reg", "agent-y", tmp_path).load() == {"k3": "token-k3"}
