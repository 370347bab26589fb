"""The store contract: every backend gives the same answers to the same operations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetclaims import (
    ClaimConflict,
    ClaimSuperseded,
    LeaseExpired,
    NotHolder,
    Registry,
    TaskCompleted,
    TaskNotReady,
    ValidationError,
)
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration


def types_of(reg: Registry) -> list[str]:
    return [e.type for e in reg.events(limit=10_000).events]


def test_claim_returns_token_and_fence(registry: Registry) -> None:
    """A claim carries a secret token, fence 1, and the lease deadline."""
    c = registry.claim("t1", owner="agent-a", ttl=60)
    assert c.token and len(c.token) >= 16
    assert c.fence == 1 and c.owner == "agent-a" and c.state == "active"
    assert c.expires_at is not None and c.expires_at - c.claimed_at == pytest.approx(60)
    stored = registry.get("t1")
    assert stored is not None and stored.token is None and stored.token_hash == c.token_hash


def test_second_claimant_gets_conflict_naming_holder(registry: Registry) -> None:
    """A live claim refuses every other claimant, naming holder, expiry and reason."""
    c = registry.claim("t1", owner="agent-a", ttl=60)
    with pytest.raises(ClaimConflict) as info:
        registry.claim("t1", owner="agent-b")
    err = info.value
    assert (err.holder, err.fence, err.expires_at, err.stale) == ("agent-a", 1, c.expires_at, False)
    assert "agent-a" in str(err) and "Wait" in str(err)
    assert types_of(registry)[-1] == "claim_rejected"


def test_same_owner_without_token_conflicts(registry: Registry) -> None:
    """The same owner name without its token is not the holder."""
    registry.claim("t1", owner="agent-a")
    with pytest.raises(ClaimConflict, match="same owner name"):
        registry.claim("t1", owner="agent-a")


def test_claim_with_same_token_is_idempotent(registry: Registry) -> None:
    """Retrying a claim with the same token returns the existing claim and writes nothing."""
    tok = "retry-token-0123456789"
    a = registry.claim("t1", owner="agent-a", token=tok)
    n = len(types_of(registry))
    b = registry.claim("t1", owner="agent-a", token=tok)
    assert (a.fence, a.token_hash) == (b.fence, b.token_hash)
    assert len(types_of(registry)) == n


def test_claim_retried_after_its_lease_ran_out_says_so(registry: Registry,
                                                       clock: FakeClock) -> None:
    """A retry with the same token that finds the grant's lease run out is LeaseExpired, as
    renew says (it reported the claim as held, with a negative time left)."""
    tok = "retry-token-0123456789"
    registry.claim("t1", owner="agent-a", token=tok, ttl=5)
    clock.advance(6)
    with pytest.raises(LeaseExpired):
        registry.claim("t1", owner="agent-a", token=tok, ttl=5)
    with pytest.raises(LeaseExpired):
        registry.renew("t1", token=tok)


def test_recover_of_an_unclaimed_queued_task_waits_for_readiness(registry: Registry) -> None:
    """Nothing to take over: recover is a plain claim, refused while the task waits for a
    dependency or is blocked (it bypassed both)."""
    registry.add("dep")
    registry.add("job", depends_on=["dep"])
    registry.add("held-back")
    registry.block("held-back", reason="not yet")
    for task in ("job", "held-back"):
        with pytest.raises(TaskNotReady):
            registry.recover(task, owner="b", reason="take it")
        assert registry.get(task) is None


def test_renew_extends_lease(registry: Registry, clock: FakeClock) -> None:
    """Renew moves the deadline forward from now."""
    c = registry.claim("t1", owner="a", ttl=60)
    clock.advance(30)
    r = registry.renew("t1", token=c.token or "", ttl=120)
    assert r.expires_at == pytest.approx(clock.now().wall + 120)
    assert r.fence == c.fence and r.token == c.token


def test_wrong_token_is_not_holder(registry: Registry) -> None:
    """A token that does not match gets NotHolder on every holder operation."""
    registry.claim("t1", owner="a")
    bad = "x" * 32
    for op in (lambda: registry.renew("t1", token=bad),
               lambda: registry.complete("t1", token=bad),
               lambda: registry.transition("t1", token=bad, phase="review"),
               lambda: registry.handoff("t1", token=bad, to_owner="b"),
               lambda: registry.release("t1", token=bad)):
        with pytest.raises(NotHolder):
            op()


def test_expired_lease_refuses_renew_and_complete(registry: Registry, clock: FakeClock) -> None:
    """Once the lease ran out, renew and complete raise LeaseExpired; recover is the way on."""
    c = registry.claim("t1", owner="a", ttl=10)
    clock.advance(11)
    with pytest.raises(LeaseExpired):
        registry.renew("t1", token=c.token or "")
    with pytest.raises(LeaseExpired) as info:
        registry.complete("t1", token=c.token or "")
    assert "recover" in str(info.value)
    r = registry.recover("t1", owner="a", reason="my lease lapsed while I was busy")
    assert r.fence == 2


def test_stale_claim_needs_take_stale(registry: Registry, clock: FakeClock) -> None:
    """An expired claim is taken over only with take_stale=True, recording the previous owner."""
    registry.claim("t1", owner="a", ttl=10)
    clock.advance(11)
    with pytest.raises(ClaimConflict) as info:
        registry.claim("t1", owner="b")
    assert info.value.stale and "recover" in str(info.value)
    b = registry.claim("t1", owner="b", take_stale=True)
    assert b.fence == 2 and b.owner == "b"
    last = registry.events(limit=1000).events[-1]
    assert last.type == "claim_recovered"
    assert last.get("prev_owner") == "a" and last.get("prev_fence") == 1
    assert last.get("reason") == "lease expired"


def test_fenced_out_holder_after_recovery(registry: Registry, clock: FakeClock) -> None:
    """A holder whose expired claim was recovered gets LeaseExpired naming the new holder."""
    a = registry.claim("t1", owner="a", ttl=10)
    clock.advance(11)
    registry.recover("t1", owner="b", reason="a is gone")
    for op in (lambda: registry.renew("t1", token=a.token or ""),
               lambda: registry.complete("t1", token=a.token or ""),
               lambda: registry.release("t1", token=a.token or "")):
        with pytest.raises(LeaseExpired) as info:
            op()
        assert info.value.taken_by == "b"


def test_recover_refuses_live_owner(registry: Registry) -> None:
    """recover never robs a live lease of a live owner."""
    registry.claim("t1", owner="a", ttl=600)
    with pytest.raises(ClaimConflict, match="never robbed"):
        registry.recover("t1", owner="b", reason="impatient")
    assert registry.get("t1").owner == "a"  # type: ignore[union-attr]


def test_dead_owner_makes_claim_stale(registry: Registry, prober: FakeProber) -> None:
    """An owner proven dead makes the claim stale before its lease ends."""
    prober.as_pid(5001)
    registry.claim("t1", owner="a", ttl=3600)
    prober.as_pid(5002)
    prober.kill(5001)
    c = registry.recover("t1", owner="b", reason="a crashed")
    assert c.owner == "b"
    ev = registry.events(limit=100).events[-1]
    assert "owner dead" in ev.get("reason") and "5001" in ev.get("reason")


def test_a_restarted_holder_renewing_is_its_new_owner_process(
        make_registry: Callable[[], Registry], prober: FakeProber) -> None:
    """README: an agent that kept its token carries on after a restart. Its renewal was
    acknowledged while the claim stayed bound to the dead process, so anyone could take it
    over at once. A renewal whose recorded owner process is proven dead re-binds it: to the
    renewing process (library default), or to none (process=False: the lease alone); a live
    owner process is kept."""
    old = make_registry()
    prober.as_pid(5001)
    token = old.claim("t1", owner="a", ttl=3600).token
    assert token is not None
    prober.as_pid(5002)
    helper = make_registry()
    helper.renew("t1", token=token)  # the owner process lives: kept
    assert helper.get("t1").identity.pid == 5001  # type: ignore[union-attr]
    prober.kill(5001)
    restarted = make_registry()  # (a new process: nothing seen before it renews)
    assert restarted.renew("t1", token=token).identity.pid == 5002  # type: ignore[union-attr]
    assert not restarted.is_stale(restarted.get("t1"))  # type: ignore[arg-type]
    with pytest.raises(ClaimConflict):
        restarted.claim("t1", owner="b", take_stale=True)
    prober.kill(5002)
    prober.as_pid(5003)
    moved = make_registry().transition("t1", token=token, phase="review", ttl=300)
    assert moved.identity.pid == 5003  # type: ignore[union-attr]  # (transition: as renew)
    prober.kill(5003)
    parked = make_registry().transition("t1", token=token, phase="wait", process=False)
    assert parked.identity is None and not restarted.is_stale(parked)
    restarted.renew("t1", token=token, process=False)
    assert restarted.get("t1").identity is None  # type: ignore[union-attr]
    assert not restarted.is_stale(restarted.get("t1"))  # type: ignore[arg-type]


def test_release_frees_task(registry: Registry) -> None:
    """Release returns True once, then False, and the task can be claimed again."""
    c = registry.claim("t1", owner="a")
    assert registry.release("t1", token=c.token) is True
    assert registry.release("t1", token=c.token) is False
    d = registry.claim("t1", owner="b")
    assert d.fence == 2


def test_release_of_expired_claim_returns_false(registry: Registry, clock: FakeClock) -> None:
    """Releasing one's own expired claim frees the task but reports nothing live was released."""
    c = registry.claim("t1", owner="a", ttl=5)
    clock.advance(6)
    assert registry.release("t1", token=c.token) is False
    assert registry.get("t1").state == "released"  # type: ignore[union-attr]


def test_force_release_is_recorded(registry: Registry) -> None:
    """A forced release needs a reason and is recorded with it; the holder then is NotHolder."""
    c = registry.claim("t1", owner="a")
    with pytest.raises(ValidationError):
        registry.release("t1", force=True)
    assert registry.release("t1", force=True, reason="workspace wiped", actor="ops") is True
    ev = registry.events(limit=100).events[-1]
    assert (ev.type, ev.get("reason"), ev.actor) == ("claim_released_forced", "workspace wiped",
                                                     "ops")
    with pytest.raises(NotHolder, match="force"):
        registry.renew("t1", token=c.token or "")


def test_complete_then_claim_refused_until_reopen(registry: Registry) -> None:
    """A completed task refuses claims with TaskCompleted until reopened."""
    c = registry.claim("t1", owner="a")
    done = registry.complete("t1", token=c.token or "", result={"pr": 7})
    assert done.state == "completed" and done.result == {"pr": 7}
    assert registry.complete("t1", token=c.token or "").state == "completed"  # idempotent retry
    again = registry.complete("t1", token=c.token or "", result={"pr": 7})
    assert again.result == {"pr": 7}  # the same call again: a retry
    with pytest.raises(ValidationError, match="another result"):  # not a retry: would be lost
        registry.complete("t1", token=c.token or "", result={"pr": 8})
    assert registry.get("t1").result == {"pr": 7}  # type: ignore[union-attr]
    with pytest.raises(TaskCompleted):
        registry.claim("t1", owner="b")
    assert registry.reopen("t1", reason="regression") is not None
    assert registry.claim("t1", owner="b").fence == 2


def test_transition_parks_and_keeps_token(registry: Registry, clock: FakeClock) -> None:
    """A phase change keeps the token; ttl None parks the claim with no expiry."""
    c = registry.claim("t1", owner="a", ttl=10)
    p = registry.transition("t1", token=c.token or "", phase="review")
    assert p.phase == "review" and p.expires_at is None and p.token == c.token
    clock.advance(10_000)
    assert registry.is_stale(registry.get("t1")) is None  # type: ignore[arg-type]
    back = registry.transition("t1", token=c.token or "", phase="working", ttl=60)
    assert back.expires_at is not None


def test_handoff_rotates_token_and_fence(registry: Registry) -> None:
    """A hand-off gives a new owner a new token and fence; the old token is refused."""
    c = registry.claim("t1", owner="a")
    h = registry.handoff("t1", token=c.token or "", to_owner="b", note="your turn")
    assert h.owner == "b" and h.fence == 2 and h.token != c.token
    with pytest.raises(NotHolder, match="handed it off"):
        registry.renew("t1", token=c.token or "")
    assert registry.renew("t1", token=h.token or "").owner == "b"


def test_fences_strictly_increase(registry: Registry, clock: FakeClock) -> None:
    """Every grant (claim, recover, hand-off, preempt) takes a new, larger fence."""
    fences = []
    for i in range(5):
        c = registry.claim(f"t{i}", owner="a", ttl=5)
        fences.append(c.fence)
    clock.advance(6)
    fences.append(registry.recover("t0", owner="b", reason="expired").fence)
    c = registry.claim("x", owner="a")
    fences.append(c.fence)
    fences.append(registry.handoff("x", token=c.token or "", to_owner="b").fence)
    fences.append(registry.claim("x", owner="c", priority=1, preempt=True).fence)
    assert fences == sorted(set(fences)) and len(fences) == 9


def test_preemption_by_priority(registry: Registry) -> None:
    """preempt=True takes a live claim only when it wins the order; the loser is told."""
    low = registry.claim("t1", owner="a", priority=100)
    with pytest.raises(ClaimConflict, match="preemption refused"):
        registry.claim("t1", owner="b", priority=200, preempt=True)
    hi = registry.claim("t1", owner="c", priority=10, preempt=True)
    assert hi.owner == "c"
    with pytest.raises(ClaimSuperseded) as info:
        registry.renew("t1", token=low.token or "")
    assert info.value.winner == "c" and info.value.rule == "lower priority number"
    assert types_of(registry)[-1] == "claim_preempted"


def test_claims_and_stats(registry: Registry, clock: FakeClock) -> None:
    """Listing and counting by state and owner."""
    a = registry.claim("t1", owner="a", ttl=10)
    registry.claim("t2", owner="b", ttl=1000)
    c = registry.claim("t3", owner="a", ttl=1000)
    registry.complete("t3", token=c.token or "")
    clock.advance(11)
    assert [x.task for x in registry.claims()] == ["t2"]
    assert [x.task for x in registry.claims(include_expired=True)] == ["t1", "t2"]
    assert [x.task for x in registry.claims(owner="a", include_completed=True)] == ["t3"]
    s = registry.stats()
    assert (s.active, s.expired, s.completed) == (1, 1, 1)
    assert s.per_owner["a"].expired == 1 and s.per_owner["a"].completed == 1
    assert a.fence == 1


def test_events_paging_and_filters(registry: Registry) -> None:
    """events() pages with a cursor and filters by type and task."""
    for i in range(25):
        c = registry.claim(f"t{i % 5}", owner="a")
        registry.release(c.task, token=c.token)
    seen: list[int] = []
    cursor = 0
    while True:
        page = registry.events(after=cursor, limit=7)
        seen.extend(e.seq for e in page.events)
        if not page.more:
            break
        cursor = page.next_cursor
    assert seen == list(range(1, 52))
    only = registry.events(limit=1000, types=["claim_created"], task="t3").events
    assert [e.task for e in only] == ["t3"] * 5


def test_bad_input_writes_nothing(registry: Registry) -> None:
    """Malformed ids, ttls and notes raise ValidationError and write nothing."""
    registry.claim("ok", owner="a")
    before = len(types_of(registry))
    bad_calls: list[Callable[[], object]] = [
        lambda: registry.claim("", owner="a"),
        lambda: registry.claim("a b", owner="a"),
        lambda: registry.claim("t" * 201, owner="a"),
        lambda: registry.claim("t", owner="a\u202eb"),
        lambda: registry.claim("t", owner="a", ttl=0.5),
        lambda: registry.claim("t", owner="a", ttl=86401),
        lambda: registry.claim("t", owner="a", ttl=float("nan")),
        lambda: registry.claim("t", owner="a", note="x" * 5000),
        lambda: registry.claim("t", owner="a", note="bell\x07"),
        lambda: registry.claim("t", owner="a", metadata={"k": float("inf")}),
        lambda: registry.claim("t", owner="a", metadata=[1, 2]),  # type: ignore[arg-type]
        lambda: registry.claim("t", owner="a", priority=True),
        lambda: registry.claim("t", owner="a", token="short"),
        lambda: registry.renew("ok", token=None),  # type: ignore[arg-type]
        lambda: registry.events(limit=0),
    ]
    for call in bad_calls:
        with pytest.raises(ValidationError):
            call()
    assert len(types_of(registry)) == before


def test_audit_chain_verifies(registry: Registry) -> None:
    """Every store keeps a hash chain that verifies end to end."""
    for i in range(10):
        c = registry.claim(f"t{i}", owner="a")
        registry.complete(c.task, token=c.token or "")
    report = registry.verify()
    assert report.ok and report.events == 21


def test_two_handles_see_each_other(make_registry: Callable[[], Registry]) -> None:
    """Two handles on one registry (as two processes would be) agree."""
    a, b = make_registry(), make_registry()
    c = a.claim("t1", owner="a")
    with pytest.raises(ClaimConflict):
        b.claim("t1", owner="b")
    assert b.release("t1", token=c.token) is True
    assert a.get("t1").state == "released"  # type: ignore[union-attr]


def test_wall_clock_steps_do_not_move_leases(registry: Registry, clock: FakeClock) -> None:
    """A ±2 h wall-clock step neither expires a live lease early nor keeps a dead one alive."""
    c = registry.claim("t1", owner="a", ttl=600)
    clock.step_wall(+7200)  # the wall jumps forward: the boot clock says the lease is live
    assert registry.renew("t1", token=c.token or "").owner == "a"
    clock.step_wall(-7200)
    clock.step_wall(-7200)  # the wall jumps back: the lease still runs out on time
    clock.advance(601)
    with pytest.raises(LeaseExpired):
        registry.renew("t1", token=c.token or "")


def test_sweep_marks_expired_and_dead(registry: Registry, clock: FakeClock,
                                      prober: FakeProber) -> None:
    """sweep records lease_expired for expired leases and dead owners, keeps live ones."""
    registry.claim("exp", owner="a", ttl=10)
    prober.as_pid(777)
    registry.claim("dead", owner="b", ttl=1000)
    prober.as_pid(4242)
    registry.claim("live", owner="c", ttl=1000)
    prober.kill(777)
    clock.advance(11)
    dry = registry.sweep(dry_run=True)
    assert sorted(i.task for i in dry.found) == ["dead", "exp"]
    assert "lease_expired" not in types_of(registry)
    report = registry.sweep()
    assert sorted(i.task for i in report.found) == ["dead", "exp"]
    assert types_of(registry).count("lease_expired") == 2
    assert registry.sweep().found == ()
    assert registry.get("dead").state == "expired"  # type: ignore[union-attr]
    assert registry.claim("dead", owner="d", take_stale=True).owner == "d"


def test_claims_data_matches_claims(make_registry: Callable[[], Registry],
                                    clock: FakeClock) -> None:
    """claims_data() (the listing without Claim objects) gives, in every store and for every
    kind of entry (as loaded, or touched since), what claims() gives as persisted dicts:
    every optional member present, new dicts the caller may change."""
    from fleetclaims.cli import _data_doc, claim_doc

    reg = make_registry()
    a = reg.claim("a-live", owner="alice", ttl=600, note="n", metadata={"k": 1})
    reg.claim("b-parked", owner="bob", ttl=60)
    done = reg.claim("c-done", owner="carol", ttl=60)
    assert done.token is not None and a.token is not None
    reg.complete("c-done", token=done.token, result={"ok": 1})
    gone = reg.claim("d-released", owner="dave", ttl=60)
    reg.release("d-released", token=gone.token)
    reg.claim("e-expired", owner="erin", ttl=5, process=False)
    reg.claim("f-other", owner="frank", ttl=600)
    clock.advance(10)
    checkpoint = getattr(reg.store, "checkpoint", None)
    if checkpoint is not None:
        checkpoint()
    for touch in (False, True):
        fresh = make_registry()  # entries as loaded (a file store: packed snapshot entries)
        if touch:
            fresh.renew("a-live", token=a.token)  # and one touched since
        now = clock.now().wall
        for kwargs in ({}, {"include_expired": True, "include_completed": True,
                            "include_released": True}, {"owner": "alice"}):
            data = fresh.claims_data(**kwargs)
            claims = fresh.claims(**kwargs)
            assert [d["task"] for d in data] == [c.task for c in claims], kwargs
            # (members at their empty defaults may be left out, as in the persisted form)
            empty = {"retired": [], "deadline_boot": "", "eid": "", "paths": [],
                     "shared_paths": []}
            assert [{**empty, **d} for d in data] == [c.to_dict() for c in claims]
            assert len({id(d) for d in data} | {id(d) for d in fresh.claims_data(**kwargs)}) \
                == 2 * len(data)
            assert [_data_doc(d, now) for d in data] == [claim_doc(c, now) for c in claims]
        assert {d["task"] for d in fresh.claims_data()} == {"a-live", "b-parked", "f-other"}
        fresh.close()


def test_a_holder_taken_over_for_a_dead_owner_is_told_when_it_ended(
        registry: Registry, prober: FakeProber, clock: FakeClock) -> None:
    """Taken over because its owner process died, the old holder was told its lease "expired
    at" the lease's end, still minutes ahead; it ended at the take-over."""
    prober.as_pid(5001)
    c = registry.claim("t1", owner="a", ttl=600)
    assert c.token is not None and c.expires_at is not None
    prober.as_pid(5002)
    prober.kill(5001)
    clock.advance(5)
    registry.recover("t1", owner="b", reason="a died")
    with pytest.raises(LeaseExpired) as info:
        registry.renew("t1", token=c.token)
    assert info.value.expired_at is not None and info.value.expired_at < c.expires_at
