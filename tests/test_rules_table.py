"""The decision rules, called directly: a State, a request, a Now and a verdict in; the events
and the error out. One row per outcome (granted, conflict with its reason, not holder, expired,
stale takeover, fence increments), plus the check that every event a decision emits is declared
in the event schema with its fields."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from fleetclaims.core import events as ev
from fleetclaims.core import prune, queue_rules, reservations, rules
from fleetclaims.core.errors import (
    ClaimConflict,
    ClaimSuperseded,
    FleetclaimsError,
    LeaseExpired,
    NotHolder,
    PathConflict,
    TaskCompleted,
    TaskNotReady,
)
from fleetclaims.core.merge import plan_merge
from fleetclaims.core.model import (
    ACTIVE,
    COMPLETED,
    EXPIRED,
    RELEASED,
    UNKNOWN_VERDICT,
    Claim,
    Identity,
    Now,
    Retired,
    Task,
    Verdict,
)
from fleetclaims.core.reserve import Reservation
from fleetclaims.core.rules import Decision, Grant
from fleetclaims.core.state import State

pytestmark = pytest.mark.unit

NOW = Now(wall=1000.0, boot=500.0, boot_id="boot-1")
LIVE = Verdict("live", ("pid 4242 alive",))
DEAD = Verdict("dead", ("pid 4242 gone",))
IDENT = Identity("host", "m", "boot-1", "ns", 4242, 7)
FENCE = 7  # the registry's fence high-water in every table state


def held(owner: str = "alice", token: str = "ta", *, expires_at: float | None = 1060.0,
         state: str = ACTIVE, retired: tuple[Retired, ...] = (), fence: int = 5,
         priority: int = 100, phase: str = "working", stale_reason: str | None = None) -> Claim:
    """The claim on task "t" (wall-clock deadline only, so NOW decides by the wall)."""
    return Claim("t", owner, fence, state=state, phase=phase, token_hash=token,  # type: ignore[arg-type]
                 claimed_at=900.0, renewed_at=900.0, expires_at=expires_at,
                 ttl=None if expires_at is None else 60.0, priority=priority,
                 identity=IDENT, retired=retired, stale_reason=stale_reason,
                 ended_at=None if state in (ACTIVE, EXPIRED) else 950.0)


def state_of(*claims: Claim, tasks: tuple[Task, ...] = ()) -> State:
    st = State(fence=FENCE)
    for claim in claims:
        st.claims[claim.task] = claim
    for task in tasks:
        st.tasks.put(task, st.claims)
    return st


def grant(owner: str = "bob", token: str = "tb", ttl: float | None = 60.0,
          priority: int = 100) -> Grant:
    return Grant(owner=owner, token_hash=token, ttl=ttl, priority=priority, identity=IDENT)



def paths_grant(paths: list[str], shared: tuple[str, ...] | list[str] = ()) -> Grant:
    return replace(grant(), paths=Reservation.of(paths, list(shared)))


# Task "p", held by alice with reservations (an exclusive directory, shared docs).
PARSER = replace(held(), task="p", paths=("src/parser",), shared_paths=("docs/*.md",))

EXPIRED_LEASE = held(expires_at=990.0)  # ran out 10 s before NOW
RECOVERED_FROM_ALICE = held("carol", "tc", fence=6, retired=(
    Retired("ta", 5, "alice", "recovered", by="carol", rule="lease expired", at=995.0,
            expired_at=990.0),))
PREEMPTED_ALICE = held("carol", "tc", fence=6, retired=(
    Retired("ta", 5, "alice", "preempted", by="carol", rule="lower priority number",
            at=995.0),))
RELEASED_BY_ALICE = held(state=RELEASED, retired=(
    Retired("ta", 5, "alice", "released", at=950.0),))
COMPLETED_BY_ALICE = held(state=COMPLETED)


@dataclass(frozen=True)
class Row:
    """One table row: the state, the decision asked for, and what must come out."""

    id: str
    state: Callable[[], State]
    decide: Callable[[State], Decision]
    types: tuple[str, ...]  # the event types, in order
    error: type[FleetclaimsError] | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # expected in the first event
    error_attrs: dict[str, Any] = field(default_factory=dict)
    result: Any = "unchecked"


ROWS = [
    # --- claim --------------------------------------------------------------------------
    Row("claim free task: granted, next fence", lambda: state_of(),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"owner": "bob", "fence": FENCE + 1, "expires_at": 1060.0,
                                     "boot_deadline": 560.0, "deadline_boot": "boot-1"}),
    Row("claim after a release: granted, next fence", lambda: state_of(RELEASED_BY_ALICE),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"fence": FENCE + 1}),
    Row("claim held by a live lease: conflict", lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, LIVE),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        fields={"holder": "alice", "reason": "held by a live lease"},
        error_attrs={"holder": "alice", "fence": 5, "stale": False,
                     "reason": "held by a live lease"}),
    Row("claim by the holder's name without its token: conflict", lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant("alice", "other"), NOW, LIVE),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        error_attrs={"reason": "held by the same owner name under another token"}),
    Row("claim repeated with the same token: nothing", lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant("alice", "ta"), NOW, LIVE), ()),
    Row("claim of an expired lease without take_stale: stale conflict",
        lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, LIVE),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        error_attrs={"stale": True, "reason": "lease expired"}),
    Row("claim of an expired lease with take_stale: stale takeover, next fence",
        lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, LIVE, take_stale=True),
        (ev.CLAIM_RECOVERED,), fields={"owner": "bob", "fence": FENCE + 1, "prev_owner": "alice",
                                       "prev_fence": 5, "reason": "lease expired",
                                       "via": "claim"}),
    Row("claim of a dead owner's live lease with take_stale: takeover",
        lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, DEAD, take_stale=True),
        (ev.CLAIM_RECOVERED,), fields={"reason": "owner dead: pid 4242 gone"}),
    Row("claim of an unknown owner's live lease with take_stale: conflict (never robbed)",
        lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, UNKNOWN_VERDICT, take_stale=True),
        (ev.CLAIM_REJECTED,), ClaimConflict, error_attrs={"stale": False}),
    Row("claim of a claim marked expired: stale reason kept",
        lambda: state_of(held(state=EXPIRED, stale_reason="swept: lease expired")),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, LIVE),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        error_attrs={"stale": True, "reason": "swept: lease expired"}),
    Row("claim of a completed task: refused", lambda: state_of(COMPLETED_BY_ALICE),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_REJECTED,), TaskCompleted, fields={"reason": "task completed"}),
    Row("preempt with a better priority: granted, next fence", lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant(priority=1), NOW, LIVE, preempt=True),
        (ev.CLAIM_PREEMPTED,), fields={"fence": FENCE + 1, "prev_owner": "alice",
                                       "rule": "lower priority number"}),
    Row("preempt with a worse priority: refused by the resolver", lambda: state_of(held()),
        lambda s: rules.decide_claim(s, "t", grant(priority=500), NOW, LIVE, preempt=True),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        error_attrs={"reason": "preemption refused: the holder wins by lower priority number"}),
    Row("claim of a queued task waiting for a dependency: not ready",
        lambda: state_of(tasks=(Task("base"), Task("t", depends_on=("base",)))),
        lambda s: rules.decide_claim(s, "t", grant(), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_REJECTED,), TaskNotReady, fields={"reason": "not ready: waits for base"}),
    # --- renew --------------------------------------------------------------------------
    Row("renew by the holder: new deadline, same fence", lambda: state_of(held()),
        lambda s: rules.decide_renew(s, "t", "ta", 120.0, NOW),
        (ev.LEASE_RENEWED,), fields={"fence": 5, "ttl": 120.0, "expires_at": 1120.0}),
    Row("renew without a ttl keeps the claim's", lambda: state_of(held()),
        lambda s: rules.decide_renew(s, "t", "ta", None, NOW),
        (ev.LEASE_RENEWED,), fields={"ttl": 60.0, "expires_at": 1060.0}),
    Row("renew after the lease ran out: expired", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_renew(s, "t", "ta", 60.0, NOW), (), LeaseExpired,
        error_attrs={"owner": "alice", "fence": 5, "expired_at": 990.0, "taken_by": None}),
    Row("renew with another token: not holder", lambda: state_of(held()),
        lambda s: rules.decide_renew(s, "t", "nope", 60.0, NOW), (), NotHolder,
        error_attrs={"holder": "alice", "fence": 5}),
    Row("renew of an unclaimed task: not holder", lambda: state_of(),
        lambda s: rules.decide_renew(s, "t", "ta", 60.0, NOW), (), NotHolder,
        error_attrs={"holder": None}),
    Row("renew after a stale takeover: expired, taken by the new holder",
        lambda: state_of(RECOVERED_FROM_ALICE),
        lambda s: rules.decide_renew(s, "t", "ta", 60.0, NOW), (), LeaseExpired,
        error_attrs={"taken_by": "carol", "fence": 5}),
    Row("renew after a preemption: superseded", lambda: state_of(PREEMPTED_ALICE),
        lambda s: rules.decide_renew(s, "t", "ta", 60.0, NOW), (), ClaimSuperseded,
        error_attrs={"winner": "carol", "rule": "lower priority number"}),
    # --- release ------------------------------------------------------------------------
    Row("release by the holder", lambda: state_of(held()),
        lambda s: rules.decide_release(s, "t", "ta", NOW), (ev.CLAIM_RELEASED,),
        fields={"owner": "alice", "fence": 5}, result=True),
    Row("release after the lease ran out: recorded as expired", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_release(s, "t", "ta", NOW), (ev.CLAIM_RELEASED,),
        fields={"expired": True}, result=False),
    Row("release repeated: nothing", lambda: state_of(RELEASED_BY_ALICE),
        lambda s: rules.decide_release(s, "t", "ta", NOW), (), result=False),
    Row("release with another token: not holder", lambda: state_of(held()),
        lambda s: rules.decide_release(s, "t", "nope", NOW), (), NotHolder),
    Row("release after a stale takeover: expired", lambda: state_of(RECOVERED_FROM_ALICE),
        lambda s: rules.decide_release(s, "t", "ta", NOW), (), LeaseExpired),
    Row("release of an unclaimed task: nothing", lambda: state_of(),
        lambda s: rules.decide_release(s, "t", "ta", NOW), (), result=False),
    # --- complete -----------------------------------------------------------------------
    Row("complete by the holder", lambda: state_of(held()),
        lambda s: rules.decide_complete(s, "t", "ta", {"ok": True}, NOW),
        (ev.CLAIM_COMPLETED,), fields={"result": {"ok": True}, "fence": 5}),
    Row("complete repeated: nothing", lambda: state_of(COMPLETED_BY_ALICE),
        lambda s: rules.decide_complete(s, "t", "ta", None, NOW), ()),
    Row("complete by someone else: not holder", lambda: state_of(held()),
        lambda s: rules.decide_complete(s, "t", "nope", None, NOW), (), NotHolder),
    Row("complete after the lease ran out: expired", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_complete(s, "t", "ta", None, NOW), (), LeaseExpired),
    Row("complete makes a waiting dependant ready",
        lambda: state_of(held(), tasks=(Task("t"), Task("next", depends_on=("t",)))),
        lambda s: rules.decide_complete(s, "t", "ta", None, NOW),
        (ev.CLAIM_COMPLETED, ev.BECAME_READY)),
    # --- recover ------------------------------------------------------------------------
    Row("recover a live owner's lease: refused", lambda: state_of(held()),
        lambda s: rules.decide_recover(s, "t", grant(), "stuck", NOW, LIVE),
        (ev.CLAIM_REJECTED,), ClaimConflict,
        error_attrs={"stale": False, "reason": "the owner is not proven dead and its lease is "
                     "live; a live owner is never robbed"}),
    Row("recover an expired lease: taken over, next fence", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_recover(s, "t", grant(), "stuck", NOW, LIVE),
        (ev.CLAIM_RECOVERED,), fields={"fence": FENCE + 1, "prev_owner": "alice",
                                       "reason": "stuck (lease expired)", "via": "recover"}),
    Row("recover a dead owner's claim: taken over", lambda: state_of(held()),
        lambda s: rules.decide_recover(s, "t", grant(), "", NOW, DEAD),
        (ev.CLAIM_RECOVERED,), fields={"reason": "owner dead: pid 4242 gone"}),
    Row("recover an unclaimed task: a plain grant", lambda: state_of(),
        lambda s: rules.decide_recover(s, "t", grant(), "stuck", NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"fence": FENCE + 1, "reason": "stuck"}),
    Row("recover a completed task: refused", lambda: state_of(COMPLETED_BY_ALICE),
        lambda s: rules.decide_recover(s, "t", grant(), "stuck", NOW, DEAD), (), TaskCompleted),
    # --- handoff ------------------------------------------------------------------------
    Row("handoff by the holder: the new owner gets the next fence and the phase",
        lambda: state_of(held(phase="review")),
        lambda s: rules.decide_handoff(s, "t", "ta", grant("dave", "td", ttl=None), NOW),
        (ev.CLAIM_HANDED_OFF,), fields={"owner": "dave", "actor": "alice", "fence": FENCE + 1,
                                        "prev_owner": "alice", "prev_fence": 5,
                                        "phase": "review", "ttl": 60.0}),
    Row("handoff by someone else: not holder", lambda: state_of(held()),
        lambda s: rules.decide_handoff(s, "t", "nope", grant("dave", "td"), NOW), (),
        NotHolder),
    Row("handoff after the lease ran out: expired", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_handoff(s, "t", "ta", grant("dave", "td"), NOW), (),
        LeaseExpired),
    # --- transition ---------------------------------------------------------------------
    Row("transition by the holder to a parked phase: no expiry", lambda: state_of(held()),
        lambda s: rules.decide_transition(s, "t", "ta", "review", None, NOW),
        (ev.PHASE_CHANGED,), fields={"from_phase": "working", "phase": "review",
                                     "expires_at": None, "fence": 5}),
    Row("transition with a ttl: a new deadline", lambda: state_of(held()),
        lambda s: rules.decide_transition(s, "t", "ta", "testing", 30.0, NOW),
        (ev.PHASE_CHANGED,), fields={"expires_at": 1030.0}),
    Row("transition after the lease ran out: expired", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_transition(s, "t", "ta", "review", None, NOW), (), LeaseExpired),
    Row("transition by someone else: not holder", lambda: state_of(held()),
        lambda s: rules.decide_transition(s, "t", "nope", "review", None, NOW), (), NotHolder),
    # --- the rest of what a decision emits ----------------------------------------------
    Row("force release", lambda: state_of(held()),
        lambda s: rules.decide_force_release(s, "t", "operator", "workspace wiped"),
        (ev.CLAIM_RELEASED_FORCED,), fields={"actor": "operator", "owner": "alice"},
        result=True),
    Row("reopen a completed task", lambda: state_of(COMPLETED_BY_ALICE),
        lambda s: rules.decide_reopen(s, "t", "operator", "flaky"), (ev.CLAIM_REOPENED,),
        result=True),
    Row("sweep marks an expired lease stale", lambda: state_of(EXPIRED_LEASE),
        lambda s: rules.decide_sweep(s, NOW, lambda c: LIVE, "sweeper"), (ev.LEASE_EXPIRED,),
        fields={"reason": "lease expired", "actor": "sweeper"}),
    Row("prune: old released records go, old completed ones shrink, live ones stay",
        lambda: state_of(RELEASED_BY_ALICE, replace(COMPLETED_BY_ALICE, task="c"),
                         replace(held(), task="h")),
        lambda s: prune.decide_prune(s, 960.0, "op"), (ev.CLAIMS_PRUNED,),
        fields={"actor": "op", "before": 960.0, "released": 1, "completed": 1},
        result=prune.PruneReport(960.0, ("t",), ("c",))),
    Row("prune with nothing old enough: nothing recorded",
        lambda: state_of(RELEASED_BY_ALICE), lambda s: prune.decide_prune(s, 900.0, "op"),
        (), result=prune.PruneReport(900.0)),
    Row("add a task", lambda: state_of(),
        lambda s: queue_rules.decide_add(s, Task("q", labels=("py",)), "op"), (ev.TASK_ADDED,)),
    Row("update a task", lambda: state_of(tasks=(Task("q"),)),
        lambda s: queue_rules.decide_add(s, Task("q", priority=5), "op"), (ev.TASK_UPDATED,),
        fields={"changed": ["priority"]}),
    Row("block and unblock", lambda: state_of(tasks=(Task("q"),)),
        lambda s: queue_rules.decide_block(s, "q", "flaky CI", "op"), (ev.TASK_BLOCKED,)),
    Row("unblock makes it ready", lambda: state_of(tasks=(Task("q", blocked="x"),)),
        lambda s: queue_rules.decide_unblock(s, "q", "op", "fixed"),
        (ev.TASK_UNBLOCKED, ev.BECAME_READY)),
    Row("claim_next hands out the first ready task", lambda: state_of(
        tasks=(Task("b", priority=2), Task("a", priority=1))),
        lambda s: rules.decide_claim_next(s, grant(), NOW, lambda c: LIVE),
        (ev.CLAIM_CREATED,), fields={"task": "a", "priority": 1}, result="a"),
    # --- paths (#23): a grant's reservations against other live claims' ------------------
    Row("claim with paths on free paths: granted, the event carries them",
        lambda: state_of(PARSER),
        lambda s: rules.decide_claim(s, "t", paths_grant(["lib"], ["tests/**"]), NOW,
                                     UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"paths": ["lib"], "shared_paths": ["tests/**"]}),
    Row("claim with paths overlapping an exclusive reservation: path conflict",
        lambda: state_of(PARSER),
        lambda s: rules.decide_claim(s, "t", paths_grant(["src/**"]), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_REJECTED,), PathConflict, fields={"holder": "alice"},
        error_attrs={"holder": "alice", "holder_task": "p", "mine": "src/**",
                     "theirs": "src/parser"}),
    Row("shared paths beside another shared reservation: granted",
        lambda: state_of(PARSER),
        lambda s: rules.decide_claim(s, "t", paths_grant([], ["docs/*.md"]), NOW,
                                     UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"shared_paths": ["docs/*.md"]}),
    Row("shared paths overlapping an exclusive reservation: path conflict",
        lambda: state_of(PARSER),
        lambda s: rules.decide_claim(s, "t", paths_grant([], ["src/parser/lexer.py"]), NOW,
                                     UNKNOWN_VERDICT),
        (ev.CLAIM_REJECTED,), PathConflict, error_attrs={"theirs": "src/parser"}),
    Row("paths of a claim whose lease ran out lapse: granted",
        lambda: state_of(replace(PARSER, expires_at=990.0)),
        lambda s: rules.decide_claim(s, "t", paths_grant(["src"]), NOW, UNKNOWN_VERDICT),
        (ev.CLAIM_CREATED,), fields={"paths": ["src"]}),
    Row("reserve by the holder: paths_reserved with the whole set and the change",
        lambda: state_of(PARSER),
        lambda s: reservations.decide_reserve(s, "p", "ta", ["lib"], [], NOW),
        (ev.PATHS_RESERVED,), fields={"paths": ["src/parser", "lib"],
                                      "shared_paths": ["docs/*.md"], "changed": ["lib"]}),
    Row("reserve overlapping another claim's reservation: path conflict",
        lambda: state_of(PARSER, replace(held(), paths=("lib/x",))),
        lambda s: reservations.decide_reserve(s, "p", "ta", ["lib"], [], NOW),
        (ev.CLAIM_REJECTED,), PathConflict, error_attrs={"holder_task": "t"}),
    Row("reserve by another token: not holder", lambda: state_of(PARSER),
        lambda s: reservations.decide_reserve(s, "p", "tz", ["lib"], [], NOW), (), NotHolder),
    Row("unreserve one pattern: paths_released", lambda: state_of(PARSER),
        lambda s: reservations.decide_unreserve(s, "p", "ta", ["docs/*.md"], NOW),
        (ev.PATHS_RELEASED,), fields={"paths": ["src/parser"], "shared_paths": [],
                                      "changed": ["docs/*.md"]}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_rule(row: Row) -> None:
    """Each rule gives exactly the events and error of its row, with the fields that matter
    (fence numbers, reasons, holders)."""
    decision = row.decide(row.state())
    assert tuple(e["type"] for e in decision.events) == row.types
    if row.error is None:
        assert decision.error is None, decision.error
    else:
        assert type(decision.error) is row.error, decision.error
        for name, value in row.error_attrs.items():
            assert getattr(decision.error, name) == value, name
    if row.fields:
        first = decision.events[0]
        for name, value in row.fields.items():
            assert first[name] == value, name
    if row.result != "unchecked":
        assert decision.result == row.result


def _sealed(events: tuple[dict[str, Any], ...], state: State) -> Iterator[dict[str, Any]]:
    for fields in events:
        yield {"seq": state.seq + 1, "ts": NOW.wall, **fields, "prev": state.head,
               "hash": f"h{state.seq + 1}"}


@pytest.mark.parametrize("row", [r for r in ROWS if r.types], ids=[r.id for r in ROWS if r.types])
def test_decided_events_apply_and_fences_only_grow(row: Row) -> None:
    """What a rule decides applies cleanly to the state it was decided on; a grant moves the
    fence high-water to the granted fence, nothing else moves it."""
    state = row.state()
    decision = row.decide(state)
    before = state.fence
    for event in _sealed(decision.events, state):
        ev.apply(state, event)
        if event["type"] in ev.GRANTS:
            assert state.fence == event["fence"] == before + 1
            claim = state.claims.get(event["task"])
            assert claim is not None and claim.fence == event["fence"]
            assert claim.owner == event["owner"] and claim.state == ACTIVE
        else:
            assert state.fence == before


def _merge_events() -> tuple[dict[str, Any], ...]:
    """A merge of two registries that both granted "t": claim_superseded + registries_merged."""
    ours = state_of(held().evolve(eid="ours:5"))
    theirs = state_of(held("zed", "tz", fence=4, priority=200).evolve(eid="theirs:4"))
    theirs.tasks.put(Task("q", eid="theirs:9"), theirs.claims)  # the queue merges too
    theirs.origin = "them"
    plan = plan_merge(ours, [], theirs, [], NOW, source="../other", actor="merger")
    return plan.events


def test_every_decided_event_is_declared_in_the_schema_with_its_fields() -> None:
    """Every event type a decision (or a merge) can emit is in core.events.SCHEMA, carries
    every field the schema requires, and no field the schema does not declare."""
    emitted: list[dict[str, Any]] = [e for row in ROWS for e in row.decide(row.state()).events]
    merged = _merge_events()
    assert "tasks" in merged[0] and "queue_cycles" in merged[0]
    emitted += merged
    seen = set()
    for event in emitted:
        kind = event["type"]
        assert kind in ev.SCHEMA, kind
        spec = ev.SCHEMA[kind]
        keys = set(event) - {"type"}
        assert set(spec.fields) <= keys, (kind, set(spec.fields) - keys)
        assert keys <= {*spec.fields, *spec.optional}, (kind, keys - {*spec.fields,
                                                                      *spec.optional})
        assert "?" not in spec.narrate({k: "x" for k in keys}), kind
        seen.add(kind)
    # every type a decision can emit was emitted by some row above
    # (remote_lease is recorded by fleetclaims.sync, not decided by a rule: test_remote_claims)
    decided = ev.ALL_TYPES - {ev.REGISTRY_CREATED, ev.REGISTRY_REBUILT, ev.JOURNAL_TAIL_REPAIRED,
                              ev.REMOTE_LEASE, ev.JOURNAL_BREAK}
    assert decided <= seen, decided - seen


def test_event_names_are_declared_once() -> None:
    """The schema is the one list of event types: the names the module exports are exactly
    its keys, and each narration names only fields of its type."""
    exported = {v for k, v in vars(ev).items() if k.isupper() and isinstance(v, str)
                and v in ev.SCHEMA}
    assert exported == set(ev.SCHEMA) == ev.ALL_TYPES
    for spec in ev.SCHEMA.values():
        sample = dict.fromkeys((*spec.fields, *spec.optional), "x")
        assert "?" not in spec.narrate(sample), spec.name


def test_every_journaled_event_matches_the_schema() -> None:
    """What a store journals (its own registry_created included) has exactly the fields the
    schema declares, beyond the envelope."""
    from fleetclaims.testing import memory_registry

    reg = memory_registry()
    token = reg.claim("t", owner="alice", ttl=60).token
    assert token is not None
    reg.renew("t", token=token)
    reg.transition("t", token=token, phase="review")
    reg.complete("t", token=token)
    journal = list(reg.store.iter_events())
    assert journal[0]["type"] == ev.REGISTRY_CREATED
    for event in journal:
        spec = ev.SCHEMA[event["type"]]
        keys = set(event) - set(ev.ENVELOPE)
        assert set(spec.fields) <= keys <= {*spec.fields, *spec.optional}, event["type"]
