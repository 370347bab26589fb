"""Path reservations through the MCP server (SDK client over stdio): claim with paths, a
conflict naming the other claim and both patterns with advice in tool terms, reserve and
unreserve with the token the server keeps."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from test_mcp import call, error, server

pytestmark = pytest.mark.slow  # two server processes


def test_two_agents_reserve_paths_over_mcp(tmp_path: Path) -> None:
    """A's claim reserves src/parser; B's overlapping claim and reserve are refused naming A,
    its task and the patterns; B's disjoint ones pass; once A unreserves, B may reserve."""
    reg_dir = tmp_path / "reg"

    async def scenario() -> None:
        async with server(reg_dir, "agent-a") as a, server(reg_dir, "agent-b") as b:
            got = await call(a, "claim", task="lexer", paths=["src/parser/**"],
                             shared_paths=["docs"])
            assert got["paths"] == ["src/parser"] and got["shared_paths"] == ["docs"]
            err = await error(b, "claim", task="refactor", paths=["src/parser/lexer.py"])
            assert err["error"] == "conflict" and err["holder"] == "agent-a"
            assert (err["holder_task"], err["mine"], err["theirs"]) == (
                "lexer", "src/parser/lexer.py", "src/parser")
            assert "do not touch those files" in err["next_action"]
            assert (await call(b, "claim", task="cli", paths=["src/cli"]))["paths"] == ["src/cli"]
            err = await error(b, "reserve", task="cli", paths=["src/parser/x.py"])
            assert err["error"] == "conflict" and err["holder_task"] == "lexer"
            bad = await error(b, "reserve", task="cli", paths=["../etc/passwd"])
            assert bad["error"] == "invalid"
            assert (await call(a, "unreserve", task="lexer"))["paths"] == []
            got = await call(b, "reserve", task="cli", paths=["src/parser/x.py"])
            assert got["paths"] == ["src/cli", "src/parser/x.py"]

    anyio.run(scenario)
