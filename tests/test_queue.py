"""The work queue: readiness, dependencies, cycles, claim_next, on every store backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetclaims import (
    ClaimConflict,
    DependencyCycle,
    NotHolder,
    Registry,
    TaskCompleted,
    TaskNotReady,
    UnknownTask,
    ValidationError,
)
from fleetclaims.core import queue
from fleetclaims.testing import FakeClock, FakeProber, memory_registry

pytestmark = pytest.mark.integration


def _types(reg: Registry, after: int = 0) -> list[tuple[str, str | None]]:
    return [(e.type, e.task) for e in reg.events(after=after, limit=10_000).events]


def _status(reg: Registry) -> dict[str, str]:
    return {s.task.task: s.status for s in reg.tasks()}


# --- readiness, as a table ------------------------------------------------------------------


def test_readiness_table(registry: Registry, clock: FakeClock) -> None:
    reg = registry
    reg.add("free")
    reg.add("needs-done", depends_on=["done"])
    reg.add("needs-open", depends_on=["free"])
    reg.add("needs-unknown", depends_on=["never-added"])
    reg.add("needs-adhoc", depends_on=["adhoc"])
    reg.add("stopped")
    reg.block("stopped", reason="waiting for a design decision")
    reg.add("taken")
    reg.add("done")
    reg.add("blocked-and-pending", depends_on=["free"])
    reg.block("blocked-and-pending", reason="hold")
    c = reg.claim("done", owner="a")
    reg.complete("done", token=c.token or "")
    adhoc = reg.claim("adhoc", owner="a")  # never added: a dependency may still be ad hoc
    reg.complete("adhoc", token=adhoc.token or "")
    reg.claim("taken", owner="b", ttl=60)
    assert _status(reg) == {
        "free": "ready",
        "needs-done": "ready",
        "needs-open": "pending",
        "needs-unknown": "pending",
        "needs-adhoc": "ready",
        "stopped": "blocked",
        "taken": "held",
        "done": "completed",
        "blocked-and-pending": "blocked",
    }
    waits = {s.task.task: s.waits_for for s in reg.tasks(status=["pending"])}
    assert waits == {"needs-open": ("free",), "needs-unknown": ("never-added",)}
    assert reg.task("taken").holder == "b"  # type: ignore[union-attr]
    assert reg.task("adhoc") is None  # claimed without being added: not in the queue
    # An expired lease still holds the task (it is stale, not ready) until taken over.
    clock.advance(61)
    assert reg.task("taken").status == "held"  # type: ignore[union-attr]
    assert [t.task for t in reg.ready()] == ["free", "needs-adhoc", "needs-done"]
    # Reopening a dependency makes its dependants pending again.
    reg.reopen("done", reason="regression")
    assert reg.task("needs-done").status == "pending"  # type: ignore[union-attr]
    assert reg.task("done").status == "ready"  # type: ignore[union-attr]
    counts = reg.stats().queue
    assert counts == {"ready": 3, "held": 1, "pending": 3, "blocked": 2, "completed": 0}


def test_claiming_a_task_that_is_not_ready(registry: Registry) -> None:
    reg = registry
    reg.add("base")
    reg.add("top", depends_on=["base"])
    reg.add("frozen")
    reg.block("frozen", reason="flaky CI")
    seq = reg.stats().seq
    with pytest.raises(TaskNotReady) as pending:
        reg.claim("top", owner="a")
    assert pending.value.status == "pending" and pending.value.waits_for == ["base"]
    assert "base" in str(pending.value) and "fleetclaims claim-next" in str(pending.value)
    with pytest.raises(TaskNotReady) as blocked:
        reg.claim("frozen", owner="a")
    assert blocked.value.status == "blocked" and blocked.value.reason == "flaky CI"
    assert reg.get("top") is None and reg.get("frozen") is None
    # Refusals are logged, like every rejected claim, and change no claim.
    assert _types(reg, seq) == [("claim_rejected", "top"), ("claim_rejected", "frozen")]
    assert reg.stats().fence == 0
    reg.unblock("frozen")
    assert reg.claim("frozen", owner="a").fence == 1


def test_completing_records_became_ready_for_the_last_unmet_dependency(
        registry: Registry) -> None:
    reg = registry
    reg.add("a")
    reg.add("b")
    reg.add("needs-a", depends_on=["a"])
    reg.add("needs-ab", depends_on=["a", "b"])
    reg.add("needs-a-blocked", depends_on=["a"])
    reg.block("needs-a-blocked", reason="later")
    ca = reg.claim("a", owner="w")
    seq = reg.stats().seq
    reg.complete("a", token=ca.token or "")
    assert _types(reg, seq) == [("claim_completed", "a"), ("became_ready", "needs-a")]
    cb = reg.claim("b", owner="w")
    seq = reg.stats().seq
    reg.complete("b", token=cb.token or "")
    assert _types(reg, seq) == [("claim_completed", "b"), ("became_ready", "needs-ab")]
    seq = reg.stats().seq
    reg.unblock("needs-a-blocked", reason="now")
    assert _types(reg, seq) == [("task_unblocked", "needs-a-blocked"),
                                ("became_ready", "needs-a-blocked")]
    ready = reg.events(after=0, limit=1000, types=["became_ready"]).events
    assert [e.get("after") for e in ready] == ["a", "b", "unblock"]


# --- add, update, cycles --------------------------------------------------------------------


def test_add_is_idempotent_and_a_change_is_task_updated(registry: Registry) -> None:
    reg = registry
    first = reg.add("t", priority=5, depends_on=["x", "y"], labels=["py"], note="n")
    seq = reg.stats().seq
    again = reg.add("t", priority=5, depends_on=["y", "x", "y"], labels=["py"], note="n")
    assert again == first and reg.stats().seq == seq  # nothing written
    changed = reg.add("t", priority=1, depends_on=["x"], labels=["py"], note="n")
    assert changed.priority == 1 and changed.depends_on == ("x",)
    assert changed.added_at == first.added_at  # age (hand-out order) is kept
    [event] = reg.events(after=seq, limit=10).events
    assert event.type == "task_updated" and event.get("changed") == ["priority", "depends_on"]


def test_an_update_changes_only_the_fields_given(registry: Registry) -> None:
    """add on a queued task keeps what is not given: a new title does not reset the priority
    or drop the dependencies and labels (which made a pending task claimable)."""
    reg = registry
    reg.add("build")
    reg.add("release", priority=5, depends_on=["build"], labels=["ship"], title="Release",
            description="d", note="n")
    seq = reg.stats().seq
    t = reg.add("release", title="Release 1.0")
    assert (t.title, t.priority, t.depends_on, t.labels, t.description, t.note) == (
        "Release 1.0", 5, ("build",), ("ship",), "d", "n")
    [event] = reg.events(after=seq, limit=10).events
    assert event.type == "task_updated" and event.get("changed") == ["title"]
    assert _status(reg)["release"] == "pending"
    with pytest.raises(TaskNotReady):
        reg.claim("release", owner="x")
    seq = reg.stats().seq
    assert reg.add("release") == reg.task("release").task  # type: ignore[union-attr]
    assert reg.stats().seq == seq  # nothing given: nothing changes
    t = reg.add("release", depends_on=["tests"], labels=[], title="", priority=7)
    assert (t.title, t.priority, t.depends_on, t.labels, t.description) == (
        None, 7, ("tests",), (), "d")  # given sets replace; [] and "" clear
    assert reg.add("fresh").priority == 100  # a new task: the defaults
    reg.add_many([{"id": "release", "priority": 3}, {"id": "other", "labels": None}])
    t = reg.task("release").task  # type: ignore[union-attr]
    assert (t.priority, t.depends_on, t.description) == (3, ("tests",), "d")


@pytest.mark.parametrize("edges, new, expected", [
    ({}, ("a", ["a"]), ["a", "a"]),
    ({"b": ["a"]}, ("a", ["b"]), ["a", "b", "a"]),
    ({"b": ["c"], "c": ["a"]}, ("a", ["b"]), ["a", "b", "c", "a"]),
    ({"b": ["c", "x"], "c": ["d"], "d": ["a"]}, ("a", ["z", "b"]), ["a", "b", "c", "d", "a"]),
])
def test_dependency_cycles_are_refused_and_change_nothing(
        registry: Registry, edges: dict[str, list[str]], new: tuple[str, list[str]],
        expected: list[str]) -> None:
    reg = registry
    for task, deps in edges.items():
        reg.add(task, depends_on=deps)
    reg.add(new[0])
    seq = reg.stats().seq
    with pytest.raises(DependencyCycle) as add_err:
        reg.add(new[0], depends_on=new[1])
    assert add_err.value.cycle == expected
    with pytest.raises(DependencyCycle) as depend_err:
        reg.depend(new[0], on=new[1])
    assert depend_err.value.cycle == expected
    assert isinstance(depend_err.value, ValidationError)  # bad input: exit code 2
    assert reg.stats().seq == seq and reg.task(new[0]).task.depends_on == ()  # type: ignore


def test_depend_adds_edges_and_unknown_tasks_are_refused(registry: Registry) -> None:
    reg = registry
    reg.add("t", depends_on=["a"])
    assert reg.depend("t", on=["b", "a"]).depends_on == ("a", "b")
    for call in (lambda: reg.depend("nope", on=["a"]), lambda: reg.block("nope", reason="r"),
                 lambda: reg.unblock("nope")):
        with pytest.raises(UnknownTask, match="fleetclaims add nope"):
            call()
    with pytest.raises(ValidationError):
        reg.add("t", depends_on="a")  # a string, not a list: refused, not split into letters
    with pytest.raises(ValidationError):
        reg.add("t", labels=["bad label"])
    with pytest.raises(ValidationError):
        reg.block("t", reason="")
    assert reg.block("t", reason="r") is True and reg.block("t", reason="r") is False
    assert reg.unblock("t") is True and reg.unblock("t") is False


def test_depend_keeps_the_dependency_limit_of_add(registry: Registry) -> None:
    """depend could grow a task past the 256 dependencies add allows: the resulting set is
    checked, refused as invalid input, and nothing is written."""
    reg = registry
    reg.add("x", depends_on=[f"d{i}" for i in range(256)])
    seq = reg.stats().seq
    with pytest.raises(ValidationError, match="at most 256") as err:
        reg.depend("x", on=["d256", "d257"])
    assert err.value.field == "on"
    assert reg.stats().seq == seq
    assert len(reg.task("x").task.depends_on) == 256  # type: ignore[union-attr]
    assert len(reg.depend("x", on=["d0", "d255"]).depends_on) == 256  # already there: fine


# --- claim_next -----------------------------------------------------------------------------


def test_claim_next_order_labels_and_exhaustion(registry: Registry, clock: FakeClock) -> None:
    reg = registry
    reg.add("old-low", priority=200)
    clock.advance(1)
    reg.add("b-urgent", priority=1, labels=["py"])
    clock.advance(0.5)
    reg.add("a-urgent", priority=1, labels=["docs"])  # same priority, newer: after b
    clock.advance(1)
    reg.add("mid", priority=50, labels=["py", "slow"])
    reg.add("after-mid", depends_on=["mid"], priority=0)
    reg.add("tie-z", priority=300)  # same priority and instant: the id decides
    reg.add("tie-y", priority=300)
    order = [t.task for t in reg.ready()]
    assert order == ["b-urgent", "a-urgent", "mid", "old-low", "tie-y", "tie-z"]
    assert [t.task for t in reg.ready(labels=["py"])] == ["b-urgent", "mid"]
    assert reg.claim_next(owner="w", labels=["slow", "py"]).task == "mid"  # type: ignore
    got = []
    while (c := reg.claim_next(owner="w")) is not None:
        assert c.token and c.owner == "w"
        got.append((c.task, c.priority))
    assert got == [("b-urgent", 1), ("a-urgent", 1), ("old-low", 200), ("tie-y", 300),
                   ("tie-z", 300)]
    assert reg.claim_next(owner="w") is None
    mid = reg.get("mid")
    assert mid is not None and mid.state == "active"


def test_claim_next_takes_stale_claims_only_when_asked(
        registry: Registry, clock: FakeClock) -> None:
    reg = registry
    reg.add("t1")
    reg.add("t2")
    first = reg.claim_next(owner="w1", ttl=30)
    second = reg.claim_next(owner="w2", ttl=300)
    assert (first.task, second.task) == ("t1", "t2")  # type: ignore[union-attr]
    clock.advance(31)
    assert reg.claim_next(owner="w3") is None
    taken = reg.claim_next(owner="w3", take_stale=True)
    assert taken is not None and taken.task == "t1" and taken.fence == 3
    [event] = reg.events(after=0, limit=1000, types=["claim_recovered"]).events
    assert event.get("prev_owner") == "w1" and "lease expired" in event.get("reason")
    assert reg.claim_next(owner="w3", take_stale=True) is None  # t2's lease is live


def test_completed_task_in_queue_is_not_handed_out(registry: Registry) -> None:
    reg = registry
    reg.add("t")
    c = reg.claim_next(owner="w")
    assert c is not None
    reg.complete("t", token=c.token or "")
    assert reg.claim_next(owner="w") is None
    with pytest.raises(TaskCompleted):
        reg.claim("t", owner="x")


def test_queue_survives_reopen_and_checkpoint(tmp_path: object, clock: FakeClock,
                                              prober: FakeProber) -> None:
    from pathlib import Path

    from fleetclaims.store.file.store import FileStore

    directory = Path(str(tmp_path)) / "reg"
    reg = Registry(directory, clock=clock, prober=prober, durability="process")
    for i in range(50):
        reg.add(f"t{i:02d}", priority=i % 3, depends_on=[f"t{i - 1:02d}"] if i % 5 else [],
                labels=["even"] if i % 2 == 0 else [])
    reg.block("t10", reason="r")
    assert isinstance(reg.store, FileStore)
    reg.store.checkpoint()  # the tasks now live in claims.json, not only in the journal
    reg.add("late", depends_on=["t00"])
    before = [(s.task, s.status, s.waits_for) for s in reg.tasks()]
    reg.close()
    assert b'"tasks"' in (directory / "claims.json").read_bytes()
    again = Registry(directory, clock=clock, prober=prober)
    assert [(s.task, s.status, s.waits_for) for s in again.tasks()] == before
    again.close()


# --- the index against a brute-force oracle -------------------------------------------------

OPS = st.lists(
    st.tuples(
        # (add weighted up, so that several tasks are often ready at once and the order in
        # which claim_next hands them out is put to the test)
        st.sampled_from(["add", "add", "add", "claim_next", "complete", "release", "block",
                         "unblock", "reopen", "expire", "claim_next_stale", "depend"]),
        st.integers(0, 7), st.integers(0, 7), st.integers(0, 3)),
    min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_claim_next_matches_a_brute_force_scan(ops: list[tuple[str, int, int, int]]) -> None:
    """Whatever happened, claim_next hands out exactly what a scan of every task, readiness
    worked out from scratch, says is first in order."""
    clock = FakeClock()
    _against_brute_force(memory_registry(clock=clock), clock, ops)


@pytest.mark.postgres
@pytest.mark.parametrize("seed", range(4))
def test_postgres_claim_next_matches_a_brute_force_scan(postgres_url: str, seed: int) -> None:
    """The same on PostgreSQL, where the server picks the candidates (a query in hand-out
    order) instead of an index built in memory: long seeded runs of random operations (a few
    slow examples would stay too short under hypothesis to test the order)."""
    import random
    import uuid

    rng = random.Random(seed)
    kinds = ["add", "add", "add", "claim_next", "claim_next", "complete", "release", "block",
             "unblock", "reopen", "expire", "claim_next_stale", "depend"]
    ops = [(rng.choice(kinds), rng.randrange(8), rng.randrange(8), rng.randrange(4))
           for _ in range(120)]
    clock = FakeClock()
    reg = Registry(postgres_url, clock=clock, prober=FakeProber(),
                   schema="t_" + uuid.uuid4().hex[:12])
    try:
        handed = _against_brute_force(reg, clock, ops)
    finally:
        reg.close()
    assert handed >= 5  # the run did put claim_next to the test


def _against_brute_force(reg: Registry, clock: FakeClock,
                         ops: list[tuple[str, int, int, int]]) -> int:
    """Run ``ops``, checking every claim_next against the scan; returns how many tasks
    claim_next handed out."""
    handed = 0
    tokens: dict[str, str] = {}

    def expected(take_stale: bool) -> str | None:
        state = reg.store.read()
        best = None
        for record in state.tasks.values():
            st_ = queue.status(record, state.claims)
            ok = st_.status == "ready"
            if take_stale and st_.status == "held" and queue.not_ready(record, state.claims) \
                    is None:
                claim = state.claims.get(record.task)
                ok = claim is not None and reg.is_stale(claim) is not None
            if ok and (best is None or record.key < best.key):
                best = record
        return None if best is None else best.task

    for op, i, j, p in ops:
        a, b = f"t{i}", f"t{j}"
        try:
            if op == "add":
                reg.add(a, priority=p, depends_on=[b] if i != j and p > 1 else [])
            elif op == "depend" and i != j:
                reg.depend(a, on=[b])
            elif op in ("claim_next", "claim_next_stale"):
                stale = op == "claim_next_stale"
                want = expected(stale)
                got = reg.claim_next(owner=f"w{p}", ttl=10, take_stale=stale)
                assert (got.task if got else None) == want
                if got is not None:
                    handed += 1
                    tokens[got.task] = got.token or ""
            elif op == "complete" and a in tokens:
                reg.complete(a, token=tokens.pop(a))
            elif op == "release" and a in tokens:
                reg.release(a, token=tokens.pop(a))
            elif op == "block":
                reg.block(a, reason=f"r{p}")
            elif op == "unblock":
                reg.unblock(a)
            elif op == "reopen":
                reg.reopen(a, reason="again")
            elif op == "expire":
                clock.advance(6)
        except (UnknownTask, DependencyCycle, TaskCompleted, ClaimConflict):
            pass  # refused as documented (reopen of a held task is a conflict)
        except NotHolder:  # the lease ran out (clock moved) and someone took the task over
            tokens.pop(a, None)
    # And the index agrees with a rebuild from scratch at the end.
    state = reg.store.read()
    assert len(state.tasks) == len(list(state.tasks.values())) == len(dict(
        state.tasks.raw_items()))
    assert state.tasks.ready_keys(state.claims) == sorted(
        r.key for r in state.tasks.values()
        if queue.status(r, state.claims).status == "ready")
    return handed


def test_two_handles_share_one_queue(make_registry: Callable[[], Registry]) -> None:
    """Two handles on one registry see each other's queue changes (file and PostgreSQL read
    other writers' events; memory shares one store)."""
    one, two = make_registry(), make_registry()
    one.add("x")
    one.add("y", depends_on=["x"])
    got = two.claim_next(owner="w2")
    assert got is not None and got.task == "x"
    assert one.claim_next(owner="w1") is None  # x is held by w2, y waits for x
    two.complete("x", token=got.token or "")
    nxt = one.claim_next(owner="w1")
    assert nxt is not None and nxt.task == "y"


@pytest.mark.postgres
def test_postgres_schema_1_is_upgraded_to_the_queue_schema(postgres_url: str) -> None:
    """A registry created before the work queue (schema 1) gains the tasks table on first
    use, keeping its claims and journal."""
    import psycopg

    from fleetclaims.store.postgres.store import SCHEMA_VERSION

    schema = "t_upgrade_v1"
    old = Registry(postgres_url, schema=schema)
    old.claim("legacy", owner="a")
    old.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _downgrade_to_2(conn, schema)
        conn.execute(f"DROP TABLE {schema}.tasks")
        conn.execute(f"DELETE FROM {schema}.schema_version WHERE version > 1")
    reg = Registry(postgres_url, schema=schema)
    assert reg.get("legacy") is not None
    reg.add("new", depends_on=["legacy"])
    assert reg.task("new").status == "pending"  # type: ignore[union-attr]
    assert reg.store.schema_version() == SCHEMA_VERSION == 6  # type: ignore[attr-defined]
    assert reg.verify().ok
    reg.close()


def _downgrade_to_2(conn: Any, schema: str) -> None:
    """Undo schema 3 (what an earlier fleetclaims left behind)."""
    conn.execute(f"DROP TRIGGER task_done ON {schema}.claims")
    conn.execute(f"DROP TRIGGER task_undone ON {schema}.claims")
    conn.execute(f"DROP TRIGGER task_added ON {schema}.tasks")
    conn.execute(f"DROP FUNCTION {schema}.task_done()")
    conn.execute(f"DROP FUNCTION {schema}.task_added()")
    conn.execute(f"DROP INDEX {schema}.tasks_open")
    conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN done")
    conn.execute(f"DELETE FROM {schema}.schema_version WHERE version > 2")


@pytest.mark.postgres
def test_postgres_schema_2_is_upgraded_and_knows_which_tasks_are_done(
        postgres_url: str) -> None:
    """Schema 3 marks each queued task done when its claim is completed (the index claim_next
    walks covers open tasks only): the upgrade works it out for the tasks already there, and
    the claims table keeps it up to date from then on (completion, reopening, a task queued
    after its claim was completed)."""
    import psycopg

    schema = "t_upgrade_v2"
    reg = Registry(postgres_url, schema=schema)
    for name in ("a", "b", "c"):
        reg.add(name)
    done = reg.claim_next(owner="w")
    assert done is not None and done.task == "a"
    reg.complete("a", token=done.token or "")
    reg.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _downgrade_to_2(conn, schema)
    reg = Registry(postgres_url, schema=schema)
    nxt = reg.claim_next(owner="w")  # upgrades first: "a" is known to be done
    assert nxt is not None and nxt.task == "b"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        flags: dict[str, bool] = dict(
            conn.execute(f"SELECT task, done FROM {schema}.tasks").fetchall())
    assert flags == {"a": True, "b": False, "c": False}
    reg.complete("b", token=nxt.token or "")
    reg.reopen("a", reason="flaky")
    early = reg.claim("z", owner="w")
    reg.complete("z", token=early.token or "")
    reg.add("z")  # queued after its claim was completed: done from the start
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        flags = dict(
            conn.execute(f"SELECT task, done FROM {schema}.tasks").fetchall())
    assert flags == {"a": False, "b": True, "c": False, "z": True}
    assert [reg.claim_next(owner="w").task for _ in range(2)] == ["a", "c"]  # type: ignore[union-attr]
    assert reg.claim_next(owner="w") is None
    reg.close()


@pytest.mark.parametrize("record", [
    queue.Task("plain", added_at=5.0, seq=3, eid="e" * 64, changed_at=5.0),
    queue.Task("full", priority=7, depends_on=("a", "b"), labels=("gpu",), note="n",
               added_at=5.0, added_by="alice", blocked="waiting", blocked_by="bob", seq=9,
               eid="f" * 64, changed_at=8.5),
    queue.Task("odd", priority=0, added_at=0.0, changed_at=0.0),
    queue.Task("legacy", added_at=3.0, changed_at=3.0),
])
def test_compact_task_records_round_trip(record: queue.Task) -> None:
    """The snapshot's compact task record rebuilds exactly the same task, and leaves out what
    is at its default (a queue of 10,000 tasks is re-encoded at every checkpoint)."""
    compact = record.to_dict(compact=True)
    assert queue.Task.from_dict(compact) == record
    assert queue.Task.from_dict(record.to_dict()) == record
    assert len(compact) <= len(record.to_dict())
    if record.task == "plain":
        assert set(compact) == {"task", "added_at", "seq", "eid"}


def test_a_patch_and_a_repriced_grant_carry_every_field() -> None:
    """TaskPatch.over and rules.repriced build their results field by field (for speed): each
    agrees with dataclasses.replace on a record whose every field is set, for every patch
    field given, cleared or left out, so a field added to Task or Grant cannot be dropped."""
    import dataclasses

    from fleetclaims.core import rules
    from fleetclaims.core.model import Identity, Task
    from fleetclaims.core.reserve import Reservation

    current = Task(task="t", priority=3, depends_on=("a",), labels=("x",), note="n",
                   title="ti", description="d", added_at=5.0, added_by="me",
                   blocked="why", blocked_by="op", seq=9, eid="e9", changed_at=6.0)
    assert all(getattr(current, f.name) != f.default for f in dataclasses.fields(Task)
               if f.default is not dataclasses.MISSING)
    cases: list[dict[str, Any]] = [
        {}, {"priority": 0}, {"depends_on": ()}, {"labels": ("y", "z")}, {"note": ""},
        {"title": "new"}, {"description": ""},
        {"priority": 7, "note": "m", "title": "", "depends_on": ("b",)}]
    for patched in cases:
        patch = queue.TaskPatch(task="t", **patched)
        changes: dict[str, Any] = {k: (None if v == "" else v) for k, v in patched.items()}
        assert patch.over(current) == dataclasses.replace(current, **changes), patched
        fresh = dataclasses.replace(Task("t"), **changes)
        assert patch.over(None) == fresh, patched
    grant = rules.Grant(owner="o", token_hash="h", ttl=5.0, priority=4, note="n",
                        metadata={"k": 1}, identity=Identity("host", pid=12),
                        phase="review", paths=Reservation(("src/**",), ("docs/*",)))
    assert rules.repriced(grant, 9) == dataclasses.replace(grant, priority=9)
    assert rules.repriced(grant, 4) is grant
