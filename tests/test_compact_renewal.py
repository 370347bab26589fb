"""Compact renewals (#15): a renewal that only extends the holder's lease is recorded as task,
ttl and boot_deadline; replaying it gives exactly the state the full form gives (the memory
store records the full form: it is the oracle), and readers still learn who renewed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fleetclaims import Registry
from fleetclaims.core import events as ev
from fleetclaims.testing import FakeClock, memory_registry

pytestmark = pytest.mark.unit


def _claims(reg: Registry) -> dict[str, Any]:
    state = reg.store.read()
    out: dict[str, Any] = {}
    for task in ("a", "b"):
        claim = state.claims.get(task)
        assert claim is not None
        # (tokens are random, event ids hash lines, the oracle has a fake prober: the rest
        # must be equal)
        out[task] = {f.name: getattr(claim, f.name) for f in dataclasses.fields(claim)
                     if f.name not in ("token_hash", "eid", "token", "retired", "identity")}
        out[task]["retired"] = [(r.fence, r.owner, r.cause, r.at, r.expired_at)
                                for r in claim.retired]
    return out


def _lines(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "audit.jsonl").read_text().splitlines()]


def _day(reg: Registry, clock: FakeClock) -> None:
    a = reg.claim("a", owner="alice", ttl=30)
    b = reg.claim("b", owner="bob", ttl=30)
    for i in range(5):
        clock.advance(1.37)
        reg.renew("a", token=a.token or "", ttl=30 + i)  # a new ttl each time: still compact
        reg.renew("b", token=b.token or "")  # the claim's own ttl
    reg.renew("a", token=a.token or "", ttl=None)
    reg.release("b", token=b.token or "")


def test_compact_renewals_replay_like_the_full_form(tmp_path: Path) -> None:
    clock, oracle_clock = FakeClock(), FakeClock()
    oracle = memory_registry(clock=oracle_clock)
    d = tmp_path / "r"
    reg = Registry(d, clock=clock)
    _day(reg, clock)
    _day(oracle, oracle_clock)
    assert _claims(reg) == _claims(oracle)
    reg.close()
    renewals = [e for e in _lines(d) if e["type"] == ev.LEASE_RENEWED]
    assert len(renewals) == 11
    assert all("owner" not in e and "expires_at" not in e for e in renewals)
    # A cold replay of the journal alone (no claims.json) gives the same claims.
    (d / "claims.json").unlink()
    cold = Registry(d, clock=clock)
    assert _claims(cold) == _claims(oracle)
    assert cold.verify().ok
    cold.close()


def test_a_renewal_that_changes_more_than_the_deadline_is_recorded_in_full(
        tmp_path: Path) -> None:
    clock = FakeClock()
    d = tmp_path / "r"
    reg = Registry(d, clock=clock)
    lease = reg.claim("a", owner="alice", ttl=30)
    state = reg.store.read()
    claim = state.claims.get("a")
    assert claim is not None and lease.token
    fields = {"type": ev.LEASE_RENEWED, "task": "a", "actor": "alice", "owner": "alice",
              "fence": claim.fence, "ttl": 30.0, "expires_at": round(100.0 + 30.0, 6),
              "boot_deadline": None, "deadline_boot": claim.deadline_boot}
    assert ev.compact_renewal(fields, 100.0, claim) != fields  # the plain case compacts
    for change in ({"actor": "admin"}, {"fence": claim.fence + 1}, {"expires_at": 131.0},
                   {"deadline_boot": "another-boot"}, {"ttl": None}, {"owner": "bob"},
                   {"note": "x"}):
        assert ev.compact_renewal({**fields, **change}, 100.0, claim) == {**fields, **change}
    assert ev.compact_renewal(fields, 100.0, None) == fields
    reg.close()


def test_explain_and_narration_name_the_holder(tmp_path: Path) -> None:
    d = tmp_path / "r"
    reg = Registry(d)
    lease = reg.claim("a", owner="alice", ttl=30)
    reg.renew("a", token=lease.token or "")
    x = reg.explain("a")
    assert any("alice renewed the lease" in step.text for step in x.steps), x.steps
    compact = next(e for e in reg.store.iter_events(0) if e["type"] == ev.LEASE_RENEWED)
    assert "owner" not in compact
    assert ev.narrate(compact) == "the holder renewed the lease on a (ttl 30.0s)"
    holders: dict[str, tuple[Any, Any]] = {}
    filled = [ev.fill_renewal(e, holders) for e in reg.store.iter_events(0)][-1]
    assert (filled["owner"], filled["fence"]) == ("alice", lease.fence)
    assert filled["expires_at"] == round(filled["ts"] + 30.0, 6)
    reg.close()

