"""``apply``: the fast construction of claims from events builds ordinary, frozen Claim objects
equal to what the persisted form rebuilds, and still refuses every malformed value."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetclaims import Registry
from fleetclaims.core import events as ev
from fleetclaims.core.model import Claim, Identity, Retired
from fleetclaims.core.state import State
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration


def _journal(path: Path) -> list[dict[str, Any]]:
    data = (path / "audit.jsonl").read_bytes().rstrip(b"\0")
    return [orjson.loads(line) for line in data.splitlines()]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], State]:
    """A journal with every kind of claim event, and the writer's own state after it."""
    directory = tmp_path_factory.mktemp("apply") / "reg"
    clock = FakeClock(1_000.0)
    prober = FakeProber()
    reg = Registry(directory, clock=clock, prober=prober, durability="process")
    a = reg.claim("a", owner="alice", ttl=60, note="n", metadata={"k": [1, 2]}).token
    assert a is not None
    reg.renew("a", token=a, ttl=120)
    reg.transition("a", token=a, phase="testing", ttl=90)
    reg.release("a", token=a)
    b = reg.claim("b", owner="bob", ttl=30).token
    assert b is not None
    reg.complete("b", token=b, result={"ok": True})
    reg.reopen("b", reason="flaky", actor="carol")
    c = reg.claim("c", owner="carol", ttl=10, process=False)
    reg.claim("s", owner="sam", ttl=10, process=False)
    clock.advance(20)
    reg.sweep()
    reg.claim("c", owner="dave", ttl=10, take_stale=True)
    d = reg.claim("d", owner="erin", ttl=60).token
    assert d is not None
    reg.handoff("d", to_owner="frank", token=d)
    reg.claim("e", owner="gina", ttl=60)
    reg.release("e", force=True, reason="stuck", actor="admin")
    del c
    state = reg.store.read()
    live = State(seq=state.seq, head=state.head, fence=state.fence, origin=state.origin)
    for task in state.claims.tasks():
        found = state.claims.get(task)
        assert found is not None
        live.claims[task] = found
    reg.close()
    return _journal(directory), live


def test_replay_builds_plain_frozen_claims_equal_to_their_persisted_form(
    history: tuple[list[dict[str, Any]], State],
) -> None:
    events, live = history
    kinds = {e["type"] for e in events}
    assert {ev.CLAIM_CREATED, ev.LEASE_RENEWED, ev.PHASE_CHANGED, ev.CLAIM_RELEASED,
            ev.CLAIM_COMPLETED, ev.CLAIM_REOPENED, ev.CLAIM_HANDED_OFF,
            ev.CLAIM_RELEASED_FORCED, ev.LEASE_EXPIRED} <= kinds, kinds
    state = State()
    for event in events:
        ev.apply(state, copy.deepcopy(event))
    assert state.seq == live.seq and state.head == live.head and state.fence == live.fence
    assert state.claims.tasks() == live.claims.tasks()
    for task in state.claims.tasks():
        claim = state.claims.get(task)
        assert claim is not None
        assert type(claim) is Claim
        assert claim == live.claims.get(task)
        assert claim == Claim.from_dict(orjson.loads(orjson.dumps(claim.to_dict())))
        assert all(type(r) is Retired for r in claim.retired)
        assert claim.identity is None or type(claim.identity) is Identity
        with pytest.raises(dataclasses.FrozenInstanceError):
            claim.owner = "mallory"  # type: ignore[misc]
        assert pickle.loads(pickle.dumps(claim)) == claim
        assert dataclasses.replace(claim, phase="x").phase == "x"
        assert not hasattr(claim, "__dict__")
    assert state.claims.get("b") is not None and state.claims.get("b").retired  # type: ignore[union-attr]
    assert state.claims.get("d").owner == "frank"  # type: ignore[union-attr]


def test_evolve_is_a_checked_replace() -> None:
    """Claim.evolve changes the named fields only and refuses a name that is not a field."""
    claim = Claim("t", "o", 3).evolve(phase="review", seq=4)
    assert claim == Claim("t", "o", 3, phase="review", seq=4)
    assert type(claim) is Claim
    with pytest.raises(TypeError):
        Claim("t", "o", 3).evolve(nonsense=1)


def _created(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "seq": 2, "ts": 1000.5, "type": ev.CLAIM_CREATED, "task": "t", "actor": "o",
        "owner": "o", "fence": 1, "token_hash": "h" * 64, "phase": "working", "priority": 100,
        "note": None, "metadata": None,
        "identity": {"host": "h", "machine": "m", "boot": "b", "pidns": "p", "pid": 5,
                     "start": 7},
        "ttl": 60.0, "expires_at": 1060.5, "boot_deadline": 70.0, "deadline_boot": "b",
        "prev": "0" * 64, "hash": "1" * 64,
    }
    for key, value in changes.items():
        if value is _DROP:
            del event[key]
        else:
            event[key] = value
    return event


_DROP = object()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", True), ("seq", "2"), ("seq", 2.0),
        ("type", 5), ("type", "no_such_event"),
        ("ts", "1000"), ("ts", float("nan")), ("ts", float("inf")), ("ts", True),
        ("task", 5), ("task", _DROP), ("owner", None), ("owner", _DROP),
        ("fence", True), ("fence", "1"), ("fence", 1.0), ("fence", _DROP),
        ("token_hash", 1), ("token_hash", _DROP), ("phase", 3), ("priority", 1.5),
        ("priority", False), ("note", ["x"]), ("metadata", [1]), ("metadata", "m"),
        ("ttl", "60"), ("ttl", float("inf")), ("expires_at", float("nan")),
        ("boot_deadline", True), ("deadline_boot", 5), ("identity", [1]), ("identity", "x"),
        ("identity", {"host": "h", "pid": True, "start": 1}),
        ("identity", {"host": "h", "pid": 1, "start": "1"}),
        ("identity", {"host": "h", "pid": 1.5, "start": 1}),
        ("hash", 5),
    ],
)
def test_apply_refuses_malformed_values_and_changes_no_claim(field: str, value: Any) -> None:
    state = State()
    ev.apply(state, _created())  # warms the identity cache with an equal, valid identity
    before = state.claims.get("t")
    fence = state.fence
    changes: dict[str, Any] = {"seq": 3}
    changes[field] = value
    bad = _created(**changes)
    with pytest.raises((KeyError, TypeError, ValueError)):
        ev.apply(state, bad)
    assert state.claims.get("t") is before
    assert state.fence == fence


def test_apply_accepts_integral_numbers_as_floats() -> None:
    state = State()
    ev.apply(state, _created(ts=1000, ttl=60, expires_at=1060, boot_deadline=None))
    claim = state.claims.get("t")
    assert claim is not None
    assert claim.claimed_at == 1000.0 and type(claim.claimed_at) is float
    assert claim.ttl == 60.0 and type(claim.ttl) is float
    assert claim.boot_deadline is None


def test_identity_memo_does_not_merge_lookalike_values() -> None:
    """Two grants by one owner process share one Identity (the state's memo); a float pid
    equal to a remembered int one is still refused (only exact types take the memo)."""
    state = State()
    ev.apply(state, _created())
    ev.apply(state, _created(seq=3, task="u", fence=2, identity={"host": "h", "machine": "m",
                                                        "boot": "b", "pidns": "p", "pid": 5,
                                                        "start": 7}))
    first, second = state.claims.get("t"), state.claims.get("u")
    assert first is not None and second is not None
    assert first.identity is second.identity  # shared: the same owner process
    with pytest.raises(TypeError):
        ev.apply(state, _created(seq=4, task="v", fence=3, identity={
            "host": "h", "machine": "m", "boot": "b", "pidns": "p", "pid": 5.0, "start": 7}))
