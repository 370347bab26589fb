"""The MCP server and its client's comings and goings, over raw JSON-RPC on stdio: a claim is
never made for a client that cancelled the call or went away, every request read before EOF
is answered, SIGINT and SIGTERM stop the server with stdin still open, and a handler's
failure (an unknown prompt) is a JSON-RPC error, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_mcp_stdio import RawClient, tool_doc

from fleetclaims import Registry

pytestmark = pytest.mark.integration

INIT = {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}


class Client(RawClient):
    """RawClient with its token file in the test's directory."""

    def __init__(self, registry: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
        env["XDG_STATE_HOME"] = str(registry.parent / "state")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetclaims", "mcp", "--dir", str(registry), "--owner",
             "agent-a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env)
        self.pending = b""
        self.next_id = 100

    def start(self) -> Client:
        assert self.request("initialize", INIT)["result"]["serverInfo"]["name"] == "fleetclaims"
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        return self

    def call(self, ident: int, name: str, **arguments: Any) -> None:
        """Send a tools/call without waiting for its answer."""
        self.send(json.dumps({"jsonrpc": "2.0", "id": ident, "method": "tools/call",
                              "params": {"name": name, "arguments": arguments}}).encode())

    def finish(self, timeout: float) -> tuple[list[dict[str, Any]], str, float]:
        """Close stdin; the answers still to come, stderr, and how long the server took."""
        assert self.proc.stdin is not None and self.proc.stdout and self.proc.stderr
        start = time.monotonic()
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)
        took = time.monotonic() - start
        lines = (self.pending + self.proc.stdout.read()).splitlines()
        err = self.proc.stderr.read().decode(errors="replace")
        return [json.loads(line) for line in lines if line], err, took


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "reg")
    yield reg
    reg.close()


@pytest.fixture
def client(registry: Registry, tmp_path: Path) -> Iterator[Client]:
    c = Client(tmp_path / "reg").start()
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait()
    for stream in (c.proc.stdin, c.proc.stdout, c.proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def _text(answer: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(answer["result"]["content"][0]["text"])
    return doc


def test_an_unknown_prompt_is_invalid_params_without_a_traceback(client: Client) -> None:
    answer = client.request("prompts/get", {"name": "x" * 100_000})
    assert answer["error"]["code"] == -32602, answer
    assert "is not a prompt of this server" in answer["error"]["message"]
    assert len(answer["error"]["message"]) < 300
    others: list[tuple[str, dict[str, Any]]] = [  # other handlers that could raise
        ("resources/read", {"uri": "file:///nope"}),
        ("completion/complete", {"ref": {"type": "ref/prompt", "name": "x"},
                                 "argument": {"name": "a", "value": ""}}),
        ("logging/setLevel", {"level": "debug"})]
    for method, params in others:
        answer = client.request(method, params)
        assert answer.get("error", {}).get("code", -32602) != 0, answer
    _, err, _ = client.finish(timeout=20)
    assert "Traceback" not in err and "raised" not in err, err


def test_long_unknown_keys_are_shortened_and_nan_is_not_a_number(client: Client) -> None:
    answer = client.request("tools/call", {"name": "add_many", "arguments": {
        "tasks": [{"id": "a", "k" * 500_000: 1}]}})
    assert tool_doc(answer)["error"] == "invalid"
    assert len(json.dumps(answer)) < 2000
    client.send(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"claim",'
                b'"arguments":{"task":"n1","ttl":NaN}}}')
    doc = tool_doc(client.receive())
    assert "finite number" in doc["message"], doc
