"""The MCP server over raw JSON-RPC on stdio answers every request: malformed lines, non-JSON,
bytes that are not UTF-8, batches, messages that are not JSON-RPC, lone-surrogate escapes in
any string argument of any tool, argument-schema refusals; and the session goes on after
each (issue 18)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetclaims.agents.mcp_stdio import screen, surrogate_at

pytestmark = pytest.mark.integration


class RawClient:
    """A JSON-RPC client that writes raw bytes to the server and reads its answers."""

    def __init__(self, registry: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
        env["XDG_STATE_HOME"] = str(registry.parent / "state")  # (its token file: the test's)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetclaims", "mcp", "--dir", str(registry), "--owner",
             "agent-a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env)
        self.pending = b""
        self.next_id = 100

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 20.0) -> dict[str, Any]:
        """The next message from the server; fails when none comes within ``timeout``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            assert ready, "the server did not answer"
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            assert chunk, "the server closed stdout: " + self._stderr()
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message).encode())  # ensure_ascii: "\ud800" stays an escape
        answer = self.receive()
        assert answer["id"] == self.next_id, answer
        return answer

    def alive(self) -> None:
        """The session goes on: a plain request is still answered."""
        answer = self.request("tools/call", {"name": "get", "arguments": {"task": "t1"}})
        assert answer["result"]["isError"] is False, answer

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout and self.proc.stderr
        self.proc.stdin.close()
        self.proc.wait(timeout=20)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def _stderr(self) -> str:
        self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")[-2000:]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[RawClient]:
    c = RawClient(tmp_path / "reg")
    init = c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "raw", "version": "1"}})
    assert init["result"]["serverInfo"]["name"] == "fleetclaims"
    c.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    yield c
    if c.proc.poll() is None:
        c.close()
    else:
        c.proc.communicate()


def tool_doc(answer: dict[str, Any]) -> dict[str, Any]:
    """The documented JSON error document of a refused tool call."""
    result = answer["result"]
    assert result["isError"] is True, answer
    doc: dict[str, Any] = json.loads(result["content"][0]["text"])
    assert {"error", "message", "holder", "next_action"} <= set(doc), doc
    return doc


MALFORMED: list[tuple[bytes, int]] = [
    (b"{not json", -32700),
    (b"\xff\xfe\x00garbage", -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"tools/list"', -32700),
    (b"[" * 100_000 + b"]" * 100_000, -32700),
    (b"[1, 2]", -32600),
    (b"42", -32600),
    (b'"just a string"', -32600),
    (b'{"jsonrpc":"2.0","id":7}', -32600),
    (b'{"jsonrpc":"1.0","id":8,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"get","arguments":'
     b'{"task":"\\ud800"}}', -32700),
]


@pytest.mark.slow
def test_malformed_lines_get_json_rpc_errors(client: RawClient) -> None:
    """Each malformed or non-JSON line gets a parse error (-32700) or an invalid-request
    error (-32600), with the request's id when it has one, and the session goes on."""
    for raw, code in MALFORMED:
        client.send(raw)
        answer = client.receive()
        assert answer["error"]["code"] == code, (raw[:60], answer)
        if raw.startswith(b'{"jsonrpc":"2.0","id":7}'):
            assert answer["id"] == 7
        client.alive()
    client.send(b"")  # a blank line needs no answer
    client.alive()


def _tools(client: RawClient) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = client.request("tools/list")["result"]["tools"]
    return tools


def _takes_string(schema: dict[str, Any]) -> bool:
    options = schema.get("anyOf", [schema])
    return any(o.get("type") == "string" or o.get("items", {}).get("type") == "string"
               for o in options)


PLAUSIBLE = {"task": "t1", "reason": "r", "to_owner": "agent-b", "phase": "review"}


@pytest.mark.slow
def test_a_lone_surrogate_in_any_string_argument_is_answered(client: RawClient) -> None:
    """Every tool, every string argument holding a lone-surrogate escape: the call is
    answered with the documented JSON error document naming the argument (none is left
    unanswered), and the session goes on."""
    answered = 0
    for tool in _tools(client):
        props = tool["inputSchema"].get("properties", {})
        for name, schema in props.items():
            if not _takes_string(schema):
                continue
            arguments: dict[str, Any] = {k: v for k, v in PLAUSIBLE.items() if k in props}
            is_list = schema.get("type") == "array" or any(
                o.get("type") == "array" for o in schema.get("anyOf", []))
            arguments[name] = ["\ud800"] if is_list else "a\ud800b"
            doc = tool_doc(client.request("tools/call", {"name": tool["name"],
                                                         "arguments": arguments}))
            assert doc["error"] == "invalid" and name in doc["message"], doc
            answered += 1
    assert answered >= 21
    # In a tool name, or anywhere else in a request: an invalid-params error.
    answer = client.request("tools/call", {"name": "g\ud800", "arguments": {}})
    assert answer["error"]["code"] == -32602 and "params.name" in answer["error"]["message"]
    answer = client.request("ping", {"_meta": {"x": "\udfff"}})
    assert answer["error"]["code"] == -32602
    client.alive()


@pytest.mark.slow
def test_schema_refusals_are_the_documented_error_document(client: RawClient) -> None:
    """Arguments the tool's schema refuses (a string ttl, a missing task, an unknown tool)
    come back as the JSON error document with next_action, not the SDK's plain text."""
    cases = [("claim", {"task": "t1", "ttl": "abc"}, "ttl"),
             ("claim", {"ttl": 60}, "task"),
             ("claim", {"task": "t1", "ttl": 10**400}, "ttl"),
             ("claim", {"task": "x" * 500}, "task"),
             ("complete", {"task": "t1", "result": {"a": 1e308 * 10}}, "result"),
             ("no_such_tool", {}, "name")]
    for name, arguments, field in cases:
        line = json.dumps({"jsonrpc": "2.0", "id": 5000, "method": "tools/call",
                           "params": {"name": name, "arguments": arguments}})
        client.send(line.encode())
        doc = tool_doc(client.receive())
        assert doc["error"] == "invalid", doc
        assert field in doc["message"] and "nothing was written" in doc["message"], doc
        assert doc["next_action"]
    client.alive()


@pytest.mark.slow
def test_arguments_the_published_schema_refuses_are_refused(client: RawClient) -> None:
    """Every tool publishes additionalProperties: false and refuses an argument it does not
    take, naming it, the closest valid name and the valid ones (a misspelt filter is never
    dropped to return everything, a misspelt ttl never gives the default lease); a value of
    a JSON type the schema refuses is refused, never coerced (true is not a 1 s ttl, "5" not
    a priority); and nothing is written."""
    for tool in _tools(client):
        schema = tool["inputSchema"]
        assert schema["additionalProperties"] is False, tool["name"]
        arguments = {k: v for k, v in PLAUSIBLE.items() if k in schema.get("properties", {})}
        doc = tool_doc(client.request("tools/call", {"name": tool["name"], "arguments": {
            **arguments, "no_such_argument": 1}}))
        assert doc["error"] == "invalid" and doc["field"] == "no_such_argument", doc
        assert "is not an argument of " + tool["name"] in doc["message"], doc
        assert all(name in doc["message"] for name in schema.get("properties", {})), doc
    before = client.request("tools/call", {"name": "events", "arguments": {}})
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("events", {"type": ["claim_completed"]}, "type", "did you mean 'types'?"),
        ("claims", {"ownr": "nobody"}, "ownr", "did you mean 'owner'?"),
        ("claim", {"task": "t1", "tll": 5}, "tll", "did you mean 'ttl'?"),
        ("claim", {"task": "t1", "ttl": True}, "ttl", "must be a number, not true"),
        ("claim", {"task": "t1", "priority": "5"}, "priority", "must be an integer, not a string"),
        ("claim", {"task": "t1", "take_stale": "yes"}, "take_stale", "must be true or false"),
        ("claim", {"task": "t1", "priority": 5.5}, "priority", "must be an integer"),
        ("claim", {"task": "t1", "paths": ["src/**", 7]}, "paths[1]", "must be a string"),
        ("events", {"limit": "10"}, "limit", "must be an integer, not a string"),
        ("add_many", {"tasks": [{"id": "a"}, "b"]}, "tasks[1]", "must be an object"),
        ("transition", {"task": "t1", "phase": "review", "ttl": False}, "ttl", "not false"),
    ]
    for name, arguments, field, says in cases:
        doc = tool_doc(client.request("tools/call", {"name": name, "arguments": arguments}))
        assert doc["error"] == "invalid" and doc["field"] == field, (name, arguments, doc)
        assert says in doc["message"] and "nothing was written" in doc["message"], doc
        assert doc["next_action"]
    after = client.request("tools/call", {"name": "events", "arguments": {}})
    assert after["result"]["structuredContent"] == before["result"]["structuredContent"]
    # What the schema takes still works: a whole number as an integer, null for an option.
    answer = client.request("tools/call", {"name": "claim", "arguments": {
        "task": "t1", "ttl": 60, "priority": 5.0, "note": None, "paths": None}})
    assert answer["result"]["isError"] is False, answer
    client.alive()


@pytest.mark.slow
def test_deep_and_huge_arguments_are_answered(client: RawClient) -> None:
    """Metadata nested 5,000 deep, a 5 MB line: answered, and the session goes on."""
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    client.send(('{"jsonrpc":"2.0","id":61,"method":"tools/call","params":{"name":"complete",'
                 '"arguments":{"task":"t1","result":' + deep + "}}}").encode())
    assert client.receive()["id"] in (61, None)
    client.send(b'{"jsonrpc":"2.0","id":62,"method":"ping","params":{"x":"' + b"x" * 5_000_000
                + b'"}}')
    assert client.receive()["error"]["code"] == -32600
    client.alive()


@pytest.mark.slow
def test_a_request_with_an_id_the_sdk_does_not_take_is_answered(client: RawClient) -> None:
    """A request whose id is null, a float, true or an object is answered (Invalid Request;
    a number's id echoed, null as null), not taken for a notification and left unanswered
    forever."""
    for raw, echoed in (("null", None), ("2.0", 2.0), ("1.5", 1.5), ("true", None),
                        ("{}", None)):
        client.send(('{"jsonrpc":"2.0","id":' + raw + ',"method":"ping"}').encode())
        answer = client.receive()
        assert answer["id"] == echoed and answer["error"]["code"] == -32600, (raw, answer)
        assert "integer" in answer["error"]["message"]
    client.alive()


@pytest.mark.slow
def test_invalid_params_say_what_was_wrong(tmp_path: Path, client: RawClient) -> None:
    """A request before initialize, a tools/call without a name or with arguments that are
    not an object: -32602 with a message and data saying what was wrong (the SDK's own says
    only "Invalid request parameters"); the session goes on."""
    early = RawClient(tmp_path / "early")
    try:
        answer = early.request("tools/list")
        assert answer["error"]["code"] == -32602, answer
        assert "not initialized" in answer["error"]["message"], answer
        assert "initialize" in answer["error"]["data"]["reason"], answer
        assert early.request("ping")["result"] == {}  # ping needs no handshake
    finally:
        early.close()
    for params, field, says in (({"arguments": {}}, "params.name", "is required"),
                                ({"name": "claim", "arguments": [1]}, "params.arguments",
                                 "must be an object"),
                                ({"name": 7}, "params.name", "must be a string")):
        answer = client.request("tools/call", params)
        error = answer["error"]
        assert error["code"] == -32602 and f"{field} {says}" in error["message"], answer
        assert error["data"]["field"] == field, answer
    client.alive()


def test_screen_and_surrogate_paths() -> None:
    """The screen lets a valid message through untouched and names where a surrogate is."""
    ok = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    assert screen(ok, lambda f, r: {}) is None
    assert screen(b"   \n", lambda f, r: {}) == {}
    assert surrogate_at({"params": {"arguments": {"labels": ["ok", "\udc00"]}}}) == \
        "params.arguments.labels[1]"
    assert surrogate_at({"a": {"\ud800": 1}}) == "a.<key>"
    assert surrogate_at({"a": ["fine"]}) is None


STRAY_PRINT = """
import functools, os, sys
from fleetclaims.agents import mcp_server
from fleetclaims.cli import main

real = mcp_server.ClaimsServer.get

@functools.wraps(real)
def noisy(self, *args, **kwargs):
    print("stray output from a tool")  # a library's print, a child process's output
    os.system("echo stray output from a child")
    return real(self, *args, **kwargs)

mcp_server.ClaimsServer.get = noisy
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_stray_output_never_reaches_the_wire(tmp_path: Path) -> None:
    """Output a tool (or a process it starts) writes to stdout goes to stderr, so every
    line on the wire is still a JSON-RPC message and the session goes on."""
    c = RawClient(tmp_path / "reg")
    c.proc.kill()
    c.proc.communicate()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
    c.proc = subprocess.Popen(
        [sys.executable, "-c", STRAY_PRINT, "mcp", "--dir", str(tmp_path / "reg"), "--owner",
         "agent-a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env)
    c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "raw", "version": "1"}})
    c.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    c.alive()  # receive() parses each line as JSON: a stray line would fail here
    c.alive()
    _, err = c.proc.communicate(timeout=20)  # closes stdin: the server ends
    assert b"stray output from a tool" in err and b"stray output from a child" in err
