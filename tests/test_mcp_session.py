"""The MCP server and its client's comings and goings, over raw JSON-RPC on stdio: a claim is
never made for a client that cancelled the call or went away, every request read before EOF
is answered, SIGINT and SIGTERM stop the server with stdin still open, and a handler's
failure (an unknown prompt) is a JSON-RPC error, never a traceback."""

from __future__ import annotations

import json
import signal
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
    """RawClient that initializes the session and sends calls without waiting."""

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


def test_a_cancelled_wait_claims_nothing_and_is_not_answered(registry: Registry,
                                                             client: Client) -> None:
    held = registry.claim("busy", owner="agent-b", ttl=600)
    client.call(1, "claim", task="busy", wait=30)
    time.sleep(0.5)
    client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": 1, "reason": "user"}}).encode())
    time.sleep(1.5)  # (the wait notices within a second)
    registry.release("busy", token=held.token)
    time.sleep(1.0)
    answer = client.request("tools/call", {"name": "get", "arguments": {"task": "busy"}})
    assert _text(answer)["free"] is True  # and no answer to the cancelled call came first
    time.sleep(1.0)
    claim = registry.get("busy")
    assert claim is not None and claim.owner == "agent-b" and claim.state == "released"
    client.alive()


def test_a_cancel_after_the_claim_was_made_changes_nothing(registry: Registry,
                                                           client: Client) -> None:
    answer = client.request("tools/call", {"name": "claim", "arguments": {"task": "mine"}})
    assert _text(answer)["owner"] == "agent-a"
    client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": client.next_id}}).encode())
    answer = client.request("tools/call", {"name": "renew", "arguments": {"task": "mine"}})
    assert _text(answer)["fence"] == 1
    claim = registry.get("mine")
    assert claim is not None and claim.live and claim.owner == "agent-a"


def test_eof_stops_a_wait_at_once_and_claims_nothing_for_nobody(registry: Registry,
                                                                client: Client) -> None:
    held = registry.claim("busy", owner="agent-b", ttl=600)
    client.call(1, "claim", task="busy", wait=30)
    time.sleep(0.5)
    answers, err, took = client.finish(timeout=20)
    assert took < 5, f"the server waited {took:.1f} s after EOF"
    assert client.proc.returncode == 0, err
    assert [a["id"] for a in answers] == [1]
    assert tool_doc(answers[0])["error"] == "conflict"  # the wait's refusal, answered
    registry.release("busy", token=held.token)
    claim = registry.get("busy")
    assert claim is not None and claim.owner == "agent-b"


def test_requests_read_before_eof_are_carried_out_and_answered(registry: Registry,
                                                              client: Client) -> None:
    for i in range(1, 6):
        client.call(i, "claim", task=f"eof{i}")
    client.call(6, "claims")
    answers, err, _ = client.finish(timeout=20)
    assert client.proc.returncode == 0, err
    assert sorted(a["id"] for a in answers) == [1, 2, 3, 4, 5, 6]
    for answer in answers:
        assert answer["result"]["isError"] is False, answer
    assert sorted(c.task for c in registry.claims()) == [f"eof{i}" for i in range(1, 6)]


def test_a_call_followed_at_once_by_eof_is_answered(registry: Registry, tmp_path: Path) -> None:
    c = Client(tmp_path / "reg")
    lines = [{"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": INIT},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "claim", "arguments": {"task": "eof1"}}}]
    out, err = c.proc.communicate(b"".join(json.dumps(m).encode() + b"\n" for m in lines),
                                  timeout=30)
    assert c.proc.returncode == 0, err
    answers = {a["id"]: a for a in map(json.loads, out.splitlines())}
    assert set(answers) == {"init", 2}
    assert _text(answers[2])["task"] == "eof1"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("waiting", [False, True])
def test_a_signal_stops_the_server_with_stdin_open(registry: Registry, client: Client,
                                                   signum: int, waiting: bool) -> None:
    registry.claim("busy", owner="agent-b", ttl=600)
    answer = client.request("tools/call", {"name": "claim", "arguments": {"task": "mine"}})
    assert answer["result"]["isError"] is False
    if waiting:
        client.call(1, "claim", task="busy", wait=30)
        time.sleep(0.5)
    start = time.monotonic()
    client.proc.send_signal(signum)
    client.proc.wait(timeout=10)  # stdin stays open
    assert time.monotonic() - start < 5
    assert client.proc.returncode == 128 + signum
    mine = registry.get("mine")  # held claims are left to their lease
    assert mine is not None and mine.live and mine.owner == "agent-a"
    busy = registry.get("busy")
    assert busy is not None and busy.owner == "agent-b"


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
