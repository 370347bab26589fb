"""The PostgreSQL store: operations, concurrency, migration, failures, schema isolation.

Every test runs on the session's throwaway server (``postgres_url``) in a schema of its own,
except the restart tests, which start (and kill) a server of their own.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fc_support import run_workers
from oracle import check, operations
from pg_server import PgServer, serve, start_server

from fleetclaims import (
    AuditCorrupt,
    ClaimConflict,
    Identity,
    LeaseExpired,
    NotHolder,
    Registry,
    RegistryBusy,
    StoreUnavailable,
    TaskCompleted,
    ValidationError,
    Verdict,
)
from fleetclaims.core import events as ev
from fleetclaims.core.liveness import LocalFacts, decide_liveness
from fleetclaims.core.state import State
from fleetclaims.review.migrate import copy_registry
from fleetclaims.store.file import faults
from fleetclaims.store.postgres import connection as pgc
from fleetclaims.store.postgres.store import SCHEMA_VERSION, PostgresStore, parse_location

pytestmark = [pytest.mark.integration, pytest.mark.postgres]
CTX = multiprocessing.get_context("spawn")


def _schema() -> str:
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture
def pg(postgres_url: str) -> str:
    """A URL naming a fresh schema of its own."""
    return f"{postgres_url}?schema={_schema()}"


@pytest.fixture
def own_server() -> Iterator[PgServer]:
    server = start_server()
    try:
        yield server
    finally:
        server.destroy()


class HostProber:
    """Poses as a process on machine ``host``: owners on other hosts are "unknown"."""

    def __init__(self, host: str) -> None:
        self.facts = LocalFacts(host=host, machine=f"machine-{host}", boot=f"boot-{host}",
                                pidns="pidns:1")

    def identity(self) -> Identity:
        return Identity(host=self.facts.host, machine=self.facts.machine, boot=self.facts.boot,
                        pidns=self.facts.pidns, pid=os.getpid(), start=1)

    def verdict(self, identity: Identity | None) -> Verdict:
        return decide_liveness(identity, self.facts, None)

    def identity_of(self, pid: int) -> Identity:
        return replace(self.identity(), pid=pid)


def _events(reg: Registry) -> list[dict[str, Any]]:
    return list(reg.store.iter_events(0))


def _replay(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    state = State()
    for event in events:
        ev.apply(state, event)
    return {c.task: c.to_dict() for c in state.claims.values()}


def _claims(reg: Registry) -> dict[str, dict[str, Any]]:
    return {c.task: c.to_dict() for c in reg.store.read().claims.values()}


# --- operations ------------------------------------------------------------------------------


def test_claim_conflict_renew_release_complete(pg: str) -> None:
    """The basic life of a claim on PostgreSQL, recorded in a verifiable journal."""
    with Registry(pg) as a, Registry(pg) as b:
        c = a.claim("t1", owner="alice", ttl=60, note="n", metadata={"k": [1, 2.5]})
        with pytest.raises(ClaimConflict) as conflict:
            b.claim("t1", owner="bob")
        assert conflict.value.holder == "alice" and conflict.value.fence == c.fence
        renewed = a.renew("t1", token=c.token or "", ttl=120)
        assert renewed.expires_at is not None and c.expires_at is not None
        assert renewed.expires_at > c.expires_at
        assert a.release("t1", token=c.token or "") is True
        c2 = b.claim("t1", owner="bob")
        assert c2.fence > c.fence
        done = b.complete("t1", token=c2.token or "", result={"ok": True})
        assert done.state == "completed" and done.result == {"ok": True}
        with pytest.raises(TaskCompleted):
            a.claim("t1", owner="alice")
        assert a.get("t1") == done.with_token(None)
        assert [x.task for x in a.claims(include_completed=True)] == ["t1"]
        report = a.verify()
        assert report.ok and report.anchor_ok and report.events == a.stats().seq
        kinds = [e["type"] for e in _events(a)]
        assert kinds[0] == "registry_created" and "claim_rejected" in kinds
        assert _replay(_events(a)) == _claims(a)


@pytest.mark.slow
def test_recover_after_expiry_fences_the_old_holder(pg: str) -> None:
    """An expired lease is recovered with a higher fence; the old holder is told so."""
    with Registry(pg, prober=HostProber("h1")) as a, Registry(pg, prober=HostProber("h2")) as b:
        c = a.claim("job", owner="alice", ttl=1)
        with pytest.raises(ClaimConflict):
            b.recover("job", owner="bob", reason="too early")  # live lease: never robbed
        time.sleep(1.2)
        with pytest.raises(ClaimConflict) as stale:
            b.claim("job", owner="bob")
        assert stale.value.stale
        r = b.recover("job", owner="bob", reason="alice's lease ran out")
        assert r.fence > c.fence and r.owner == "bob"
        with pytest.raises(LeaseExpired) as lost:
            a.renew("job", token=c.token or "")
        assert lost.value.taken_by == "bob"
        with pytest.raises(NotHolder):
            a.complete("job", token=c.token or "")
        assert a.verify().ok


def test_lease_time_is_the_servers_clock(pg: str) -> None:
    """Claims are stamped with the database server's time, whatever the client's clock."""
    with Registry(pg) as reg:
        before = reg.store.now().wall
        c = reg.claim("t", owner="a", ttl=30)
        after = reg.store.now().wall
        assert before <= c.claimed_at <= after
        assert c.expires_at == pytest.approx(c.claimed_at + 30, abs=1e-5)
        assert c.deadline_boot == "" and c.boot_deadline is None


def test_durability_maps_to_synchronous_commit(pg: str) -> None:
    """A writer alone: full -> synchronous_commit on; process -> off (with other writers about,
    full commits the write asynchronously and flushes behind it: the next tests), with this
    operation's timeouts, each set for the transaction (SET LOCAL), so the session keeps the
    server's defaults between transactions (PgBouncer-safe)."""
    for durability, expected in (("full", "on"), ("process", "off")):
        reg = Registry(pg, durability=durability)  # type: ignore[arg-type]
        store = reg.store
        assert isinstance(store, PostgresStore)
        seen: list[tuple[str, str, str]] = []

        def look(point: str, store: PostgresStore = store, seen: list[Any] = seen) -> None:
            if point == "pg.after_lock":
                conn = store._connection()
                seen.append(conn.execute(
                    "SELECT current_setting('synchronous_commit'), "
                    "current_setting('lock_timeout'), "
                    "current_setting('statement_timeout')").fetchone())

        faults.set_crash_hook(look)
        try:
            reg.claim(f"t-{durability}", owner="a")
        finally:
            faults.set_crash_hook(None)
        assert seen and seen[0][0] == expected and seen[0][1] != "0"
        assert seen[0][2] != "0"
        after = store._connection().execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        ).fetchone()
        assert after == ("0", "0")  # nothing outlived the transaction
        reg.close()


@pytest.fixture(scope="module")
def lazy_wal_server() -> Iterator[PgServer]:
    """A server whose WAL writer flushes asynchronous commits only every 10 s and that runs
    no autovacuum: WAL inserted and not yet flushed stays so while a test looks."""
    yield from serve(options="-c wal_writer_delay=10s -c autovacuum=off")


def _unflushed(conn: psycopg.Connection[Any]) -> int:
    """Bytes of WAL inserted and not yet flushed (a page header's worth is not a record: at
    a page boundary the insert position points past the next page's header)."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - pg_current_wal_flush_lsn()"
                       ).fetchone()
    assert row is not None
    return max(0, int(row[0]) - 40)


@pytest.mark.parametrize("crowded", [False, True], ids=["alone", "crowded"])
@pytest.mark.parametrize("op", ["claim", "renew", "release", "claim_next"])
def test_full_durability_returns_only_once_the_wal_is_flushed(
        lazy_wal_server: PgServer, op: str, crowded: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With durability="full" a call returns only once the WAL is flushed past its write:
    alone, the write commits synchronously; while another writer is about, the head lock is
    not held across the flush (the write commits asynchronously and a synchronous transaction
    behind it, in the same message, waits for the flush). Nothing a call wrote is left
    unflushed when it returns (with the flush left out, this server's WAL writer would leave
    the write unflushed for seconds)."""
    url = f"{lazy_wal_server.url()}?schema=flush_{uuid.uuid4().hex[:8]}"
    reg = Registry(url, durability="full")
    other = Registry(url, durability="full")
    sent: list[list[str]] = []
    run = pgc.Batch.run

    def record(batch: pgc.Batch) -> list[list[tuple[Any, ...]]]:
        sent.append(list(batch._parts))
        return run(batch)

    monkeypatch.setattr(pgc.Batch, "run", record)
    claim = reg.claim("t", owner="a")
    reg.add("q")
    reg.renew("t", token=claim.token or "")  # (alone from here on, unless crowded)
    watcher = psycopg.connect(lazy_wal_server.url(), autocommit=True)
    sent.clear()
    try:
        for _ in range(3):
            if crowded:
                other.release("o", token=other.claim("o", owner="z").token)
            if op == "claim":
                reg.release("t", token=claim.token)
                if crowded:
                    other.release("o", token=other.claim("o", owner="z").token)
                claim = reg.claim("t", owner="a")
            elif op == "renew":
                claim = reg.renew("t", token=claim.token or "")
            elif op == "release":
                reg.release("t", token=claim.token)
                assert _unflushed(watcher) == 0
                if crowded:
                    other.release("o", token=other.claim("o", owner="z").token)
                claim = reg.claim("t", owner="a")
            else:
                got = reg.claim_next(owner="b")
                assert got is not None and got.task == "q"
                assert _unflushed(watcher) == 0
                reg.release("q", token=got.token)
            assert _unflushed(watcher) == 0
        writes = [parts for parts in sent if "COMMIT" in parts]
        flushed_after = [parts for parts in writes if "BEGIN" in parts[parts.index("COMMIT"):]]
        assert writes and (len(flushed_after) > 0) == crowded
    finally:
        watcher.close()
        reg.close()
        other.close()


def test_a_role_denied_the_flush_commits_synchronously(lazy_wal_server: PgServer) -> None:
    """Where the flush cannot run (pg_logical_emit_message revoked from the role), the first
    write still returns its claim, found and made durable as after a lost COMMIT answer, and
    later writes commit synchronously themselves: flushed on return either way."""
    url = lazy_wal_server.create_database(f"deny_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("CREATE ROLE denied_flush LOGIN")
        admin.execute("GRANT CREATE ON DATABASE " + url.rsplit("/", 1)[1] + " TO denied_flush")
        for signature in ("boolean, text, text", "boolean, text, bytea"):
            admin.execute(f"REVOKE EXECUTE ON FUNCTION pg_logical_emit_message({signature}) "
                          "FROM PUBLIC")
    reg = Registry(url.replace("postgres@", "denied_flush@"), durability="full")
    other = Registry(url.replace("postgres@", "denied_flush@"), durability="full")
    watcher = psycopg.connect(lazy_wal_server.url(), autocommit=True)
    try:
        reg.claim("warm", owner="a")
        # Another writer about: the write flushes behind it. (A write made in one round trip
        # learns that others are about from its own answer, so the second one flushes.)
        for task in ("t", "t2"):
            other.claim(f"o-{task}", owner="z")
            first = reg.claim(task, owner="a")
            assert first.token and _unflushed(watcher) == 0
            grants = [e for e in reg.store.iter_events(0) if e["type"] == "claim_created"
                      and e["task"] == task]
            assert [g["token_hash"] for g in grants] == [first.token_hash]  # granted once
        assert reg.store._flush_after is False  # type: ignore[attr-defined]  # (fell back)
        other.claim("p", owner="z")
        second = reg.claim("u", owner="a")
        assert second.token and _unflushed(watcher) == 0
        assert reg.verify().ok
    finally:
        watcher.close()
        reg.close()
        other.close()


def test_closed_handles_leave_no_watchdog_threads(pg: str) -> None:
    """Each handle's watchdog thread (which bounds waits) ends when the handle is closed."""
    import threading

    Registry(pg).close()
    # Compared as sets of thread objects, not counts: a thread an earlier test left
    # (a closer finishing its work) may end meanwhile, and must not hide a leak.
    before = set(threading.enumerate())
    for i in range(10):
        reg = Registry(pg)
        reg.claim(f"t{i}", owner="a")
        reg.close()

    def started_here() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before and t.is_alive()]

    deadline = time.monotonic() + 2
    while started_here() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started_here() == []


@pytest.mark.slow
def test_lock_timeout_gives_registry_busy(pg: str) -> None:
    """A writer stuck holding the journal head makes others wait lock_timeout, then Busy."""
    reg = Registry(pg, lock_timeout=1)
    reg.claim("t", owner="a")
    conninfo, schema, _ = parse_location(pg)
    with psycopg.connect(conninfo) as blocker:
        blocker.execute(f'SELECT * FROM "{schema}".head FOR UPDATE')
        started = time.monotonic()
        with pytest.raises(RegistryBusy):
            reg.claim("u", owner="b")
        assert 0.9 <= time.monotonic() - started < 5
        blocker.rollback()
    assert reg.claim("u", owner="b").fence == 2
    assert reg.verify().ok
    reg.close()


def test_journal_is_append_only_and_tampering_is_detected(pg: str) -> None:
    """The audit table refuses UPDATE/DELETE; an edit forced past that fails verify at its seq."""
    with Registry(pg) as reg:
        for i in range(3):
            reg.claim(f"t{i}", owner="a")
        conninfo, schema, _ = parse_location(pg)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.RaiseException):
                conn.execute(f'DELETE FROM "{schema}".audit WHERE seq = 2')
            conn.execute(f'ALTER TABLE "{schema}".audit DISABLE TRIGGER audit_append_only')
            conn.execute(f"UPDATE \"{schema}\".audit SET line = replace(line, '\"a\"', '\"z\"') "
                         "WHERE seq = 3")
        report = reg.verify()
        assert not report.ok and report.seq == 3 and report.offset is not None
        assert report.offset > 0
        # Reads check each row's seal as the file store does: the forged owner is not shown
        # as history (explain said "held by z"), and a row that is not JSON is no exit 70.
        for read in (lambda: reg.explain("t1"), lambda: reg.events(limit=100)):
            with pytest.raises(AuditCorrupt, match="does not verify") as info:
                read()
            assert info.value.seq == 3
            # (doctor refuses a database: its advice was to run doctor --fix)
            assert "doctor --fix" not in str(info.value) and "registry file" not in str(
                info.value)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"UPDATE \"{schema}\".audit SET line = '{{x' WHERE seq = 3")
        with pytest.raises(AuditCorrupt, match="does not verify"):
            reg.events(limit=100)
    # A damaged source is refused before anything is written to the target (it used to
    # leave the damaged copy behind while saying nothing was written).
    target = Path(tempfile.mkdtemp()) / "copy"
    with pytest.raises(AuditCorrupt, match="source does not verify"):
        copy_registry(pg, target)
    assert not (target / "audit.jsonl").exists()


def test_migrating_from_an_empty_schema_is_refused(pg: str, tmp_path: Path) -> None:
    """A mistyped (so empty) schema as the source: refused, nothing copied; it used to "copy
    0 events" and leave a target that failed verify."""
    with pytest.raises(ValidationError, match="holds no registry"):
        copy_registry(pg, tmp_path / "copy")
    assert not (tmp_path / "copy" / "audit.jsonl").exists()


# --- schemas ---------------------------------------------------------------------------------


def test_schemas_are_isolated_and_migrations_versioned(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two registries in one database (two schemas) never see each other's claims or seqs."""
    s1, s2 = _schema(), _schema()
    r1 = Registry(postgres_url, schema=s1)
    monkeypatch.setenv("FLEETCLAIMS_PG_SCHEMA", s2)
    r2 = Registry(postgres_url)
    assert r2.store.schema == s2  # type: ignore[attr-defined]
    assert f"schema={s2}" in r2.location
    r1.claim("shared", owner="one")
    r1.claim("only-one", owner="one")
    r2.claim("shared", owner="two")
    assert [c.owner for c in r1.claims()] == ["one", "one"]
    assert [c.task for c in r2.claims()] == ["shared"] and r2.get("only-one") is None
    assert r1.stats().seq == 3 and r2.stats().seq == 2
    # URL ?schema= names the same registry as schema=; the explicit argument wins over both.
    r3 = Registry(f"{postgres_url}?schema={s1}")
    assert r3.get("only-one") is not None
    store = PostgresStore(f"{postgres_url}?schema={s2}", schema=s1)
    assert store.schema == s1
    assert store.migrate_schema() == SCHEMA_VERSION == store.schema_version()  # idempotent
    store.close()
    for reg in (r1, r2, r3):
        assert reg.verify().ok
        reg.close()


def test_statements_are_prepared_on_a_direct_connection(pg: str) -> None:
    """Connected straight to the server, the write transaction's statements are prepared
    once per session before its third write (named by the hash of their text); values of
    every kind survive the literals they are sent as."""
    reg = Registry(pg)
    note = "O'Brien \\ \\' '' \\x41 \\n ünï ☃ %s %(x)s $1"
    c = reg.claim("quoted", owner="owner-a", note=note, ttl=1.5,
                  metadata={"k": "v'\\", "n": -1.5e-300})
    assert reg.store._q is reg.store.sql  # type: ignore[attr-defined]  # (not after one write)
    reg.renew("quoted", token=c.token or "")
    reg.renew("quoted", token=c.token or "")  # the third write: prepared before it
    other = Registry(pg)
    seen = other.get("quoted")
    assert seen is not None and seen.note == note
    assert seen.metadata == {"k": "v'\\", "n": -1.5e-300} and seen.fence == c.fence
    store = reg.store
    names = [row[0] for row in store.query(  # type: ignore[attr-defined]
        "SELECT name FROM pg_prepared_statements ORDER BY name")]
    # (the write transaction's 8 statements, a numbered write's 3 and the flush)
    assert len(names) == 12 and all(n.startswith("fc_") for n in names)
    assert store._q is store._fast  # type: ignore[attr-defined]
    reg.release(c.task, token=c.token or "")
    reg.close()
    other.close()


def test_literals_read_back_as_sent(postgres_url: str) -> None:
    """Every value the store sends as an SQL literal reads back the same, whatever the
    server's standard_conforming_strings (strings with a backslash go as E'' literals)."""
    values: list[Any] = ["", "plain", "it's", "back\\slash", "\\'", "''", "ünï ☃ 𝄞", "%s",
                         0, -1, 2**62, 1.5, -2.5e-300, 1e300, True, False, None]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for conforming in ("on", "off"):
            conn.execute(f"SET standard_conforming_strings = {conforming}")
            for value in values:
                batch = pgc.Batch(conn)
                batch.add("SELECT %s, pg_typeof(%s)::text", (value, value))
                got, _ = batch.run()[0][0]
                expected = None if value is None else (
                    ("t" if value else "f") if isinstance(value, bool) else
                    value if isinstance(value, str) else None)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    assert float(got) == value
                else:
                    assert got == expected, (conforming, value)
        with pytest.raises(psycopg.DataError):
            pgc.literal("nul\x00")


# --- concurrency -----------------------------------------------------------------------------


def _hammer(url: str, name: str, ops: int, start: Any) -> None:
    reg = Registry(url, prober=HostProber(name), lock_timeout=30)
    start.wait()
    for i in range(ops):
        c = reg.claim(f"{name}-{i % 3}", owner=name, ttl=60)
        reg.release(c.task, token=c.token or "")
    reg.close()


def _tail(url: str, seconds: float, out: str, start: Any) -> None:
    """Follow the journal by cursor like `audit --follow` and record what it saw."""
    store = PostgresStore(url)
    start.wait()
    cursor, seen, gaps = 0, 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for event in store.iter_events(cursor):
            if event["seq"] != cursor + 1:
                gaps.append((cursor, event["seq"]))
            cursor = event["seq"]
            seen += 1
    store.close()
    Path(out).write_text(json.dumps({"cursor": cursor, "seen": seen, "gaps": gaps}))


@pytest.mark.slow
def test_seq_gap_free_for_readers_and_fences_increase(pg: str, tmp_path: Path) -> None:
    """4 writer processes and a follower: the follower never sees a gap in seq, and every
    grant's fence is higher than all before it, across clients."""
    Registry(pg).stats()
    n, ops = 4, 40
    start = CTX.Barrier(n + 1)
    writers = [CTX.Process(target=_hammer, args=(pg, f"w{i}", ops, start)) for i in range(n)]
    tail = CTX.Process(target=_tail, args=(pg, 4.0, str(tmp_path / "tail.json"), start))
    for p in [*writers, tail]:
        p.start()
    for p in [*writers, tail]:
        p.join(60)
        assert p.exitcode == 0
    seen = json.loads((tmp_path / "tail.json").read_text())
    assert seen["gaps"] == []
    with Registry(pg) as reg:
        events = _events(reg)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert len(events) == 1 + 2 * n * ops
        fences = [e["fence"] for e in events if e["type"] in ev.GRANTS]
        assert fences == sorted(set(fences)) and len(fences) == n * ops
        check(events)
        assert reg.verify().ok


def _oracle_worker(url: str, name: str, ops: int, seed: int, log: str, start: Any) -> None:
    """Random claims, renews, releases, completes, reopens and recovers on a few tasks, with
    1-second leases so that some run out; every acknowledged operation is logged."""
    rng = random.Random(seed)
    reg = Registry(url, prober=HostProber(name), lock_timeout=30)
    acks: list[tuple[str, str, str, int]] = []
    held: dict[str, tuple[str, int]] = {}
    start.wait()
    for _ in range(ops):
        if rng.random() < 0.08:
            time.sleep(rng.uniform(0.2, 0.6))  # long enough, now and then, for leases to lapse
        task = f"task-{rng.randrange(3)}"
        recovering = False
        try:
            if task in held:
                token, fence = held[task]
                action = rng.choice(["renew", "renew", "release", "complete"])
                if action == "renew":
                    reg.renew(task, token=token)
                    acks.append(("lease_renewed", task, name, fence))
                    continue
                del held[task]
                if action == "release":
                    # False when our lease had lapsed: still recorded (marked expired).
                    reg.release(task, token=token)
                    acks.append(("claim_released", task, name, fence))
                else:
                    reg.complete(task, token=token)
                    acks.append(("claim_completed", task, name, fence))
                    if reg.reopen(task, reason="again", actor=name) is not None:
                        acks.append(("claim_reopened", task, name, fence))
            elif rng.random() < 0.3:
                recovering = True
                c = reg.recover(task, owner=name, reason="oracle", ttl=1)
                held[task] = (c.token or "", c.fence)
                acks.append(("claim_recovered", task, name, c.fence))  # a grant either way
            else:
                c = reg.claim(task, owner=name, ttl=1)
                held[task] = (c.token or "", c.fence)
                acks.append(("claim_created", task, name, c.fence))
        except (ClaimConflict, TaskCompleted) as exc:
            # A claim refused is recorded (claim_rejected); recover of a completed task is not.
            if not (recovering and isinstance(exc, TaskCompleted)):
                acks.append(("claim_rejected", task, name, exc.fence))
        except NotHolder:
            held.pop(task, None)  # our lease lapsed and someone recovered it: no event
    reg.close()
    Path(log).write_text(json.dumps(acks))


@pytest.mark.slow
def test_multiprocess_oracle_as_different_hosts(pg: str, tmp_path: Path) -> None:
    """4 processes posing as 4 hosts x 100 operations on 3 tasks: no overlapping live holders,
    contiguous seq, strictly increasing fences, exactly one audit record per acknowledged
    operation, and the claims table equal to a replay of the journal."""
    Registry(pg).stats()
    n, ops = 4, 100
    start = CTX.Barrier(n)
    acked = sorted(a for w in run_workers(
        CTX, _oracle_worker, tmp_path, n,
        lambda i, log: (pg, f"host{i}", ops, 1000 + i, log, start), 90) for a in w)
    with Registry(pg) as reg:
        events = _events(reg)
        report = check(events)
        recorded = [tuple(x) for x in operations(events)]
        # A recover of a released task is recorded as claim_created; the recover of a lapsed
        # lease is claim_recovered: both are grants, compare them as such.
        def norm(rows: list[Any]) -> list[Any]:
            return sorted(("grant", *r[1:]) if r[0] in ev.GRANTS else r for r in rows)
        assert norm(recorded) == norm(list(acked))
        assert report.grants == sum(1 for a in acked if a[0] in ev.GRANTS)
        hosts = {e["identity"]["host"] for e in events if e["type"] in ev.GRANTS}
        assert hosts <= {f"host{i}" for i in range(n)}
        assert _replay(events) == _claims(reg)
        assert reg.verify().ok


# --- migration -------------------------------------------------------------------------------


def _busy_registry(directory: Path) -> Registry:
    reg = Registry(directory)
    for i in range(12):
        c = reg.claim(f"t{i}", owner=f"o{i % 3}", ttl=600, metadata={"i": i, "x": 0.1})
        if i % 3 == 0:
            reg.release(c.task, token=c.token or "")
        elif i % 3 == 1:
            reg.complete(c.task, token=c.token or "", result=[i])
    return reg


def test_migrate_dir_to_postgres_and_back(pg: str, tmp_path: Path) -> None:
    """dir -> PostgreSQL -> dir keeps every line, seq, hash and fence; both sides verify, claims
    are equal, and work continues on PostgreSQL with fences above the migrated ones."""
    src = tmp_path / "src"
    reg = _busy_registry(src)
    original = (src / "audit.jsonl").read_bytes().split(b"\0", 1)[0]  # without preallocation
    src_claims, src_stats = _claims(reg), reg.stats()
    reg.close()

    report = copy_registry(src, pg)
    assert report.events == src_stats.seq
    with Registry(pg) as dst:
        assert dst.verify().ok and dst.verify().head == report.head
        assert dst.verify().bytes == len(original)
        assert _claims(dst) == src_claims
        assert b"".join(dst.store.raw_lines()) == original  # type: ignore[attr-defined]
        assert dst.stats().fence == src_stats.fence
        with pytest.raises(ValidationError, match="already holds a registry"):
            copy_registry(src, pg)
        c = dst.claim("new-on-pg", owner="p")
        assert c.fence == src_stats.fence + 1
        pg_claims = _claims(dst)

    back = tmp_path / "back"
    copy_registry(pg, back)
    journal = (back / "audit.jsonl").read_bytes()
    assert journal.startswith(original)
    with Registry(back) as again:
        assert again.verify().ok
        assert _claims(again) == pg_claims
        assert again.claim("after", owner="q").fence == c.fence + 1


# --- failures --------------------------------------------------------------------------------


@pytest.mark.slow
def test_server_restart_between_operations_is_retried(own_server: PgServer) -> None:
    """A server crash and restart between operations: the next operation reconnects and
    succeeds, nothing is lost."""
    url = own_server.create_database("r1")
    with Registry(url, lock_timeout=10) as reg:
        c = reg.claim("t", owner="a")
        own_server.crash()
        own_server.start()
        assert reg.renew("t", token=c.token or "").fence == c.fence
        assert reg.verify().ok and reg.stats().seq == 3


@pytest.mark.slow
def test_server_down_gives_store_unavailable_not_committed(own_server: PgServer) -> None:
    """With the server gone an operation fails with StoreUnavailable(committed=False) within
    lock_timeout; after a restart the registry is exactly as before."""
    url = own_server.create_database("r2")
    with Registry(url, lock_timeout=1.5) as reg:
        reg.claim("t", owner="a")
        before = _claims(reg)
        own_server.kill9()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as down:
            reg.claim("u", owner="b")
        assert down.value.committed is False
        assert time.monotonic() - started < 6
        with pytest.raises(StoreUnavailable):
            reg.get("t")
        own_server.start()
        assert _claims(reg) == before and reg.verify().ok


@pytest.mark.slow
def test_server_crash_mid_operation(own_server: PgServer) -> None:
    """The server crashes as the writes and COMMIT are sent. Restarted at once: the store
    finds nothing of it, retries on the new server and commits exactly once. Left down for
    longer than the budget of the check (the one case no client can decide): committed=None,
    and after the restart nothing of it is there."""
    url = own_server.create_database("r3")
    reg = Registry(url, lock_timeout=8)
    reg.claim("warm", owner="a")

    def crash_and_restart(point: str) -> None:
        if point == "pg.before_commit":
            faults.set_crash_hook(None)
            own_server.crash()
            own_server.start()

    faults.set_crash_hook(crash_and_restart)
    try:
        c = reg.claim("t", owner="a")
    finally:
        faults.set_crash_hook(None)
    grants = [e for e in _events(reg) if e["type"] == "claim_created" and e["task"] == "t"]
    assert [g["token_hash"] for g in grants] == [c.token_hash]
    assert reg.verify().ok

    reg.close()
    reg = Registry(url, lock_timeout=1.5)
    reg.stats()
    before = _claims(reg)

    def crash(point: str) -> None:
        if point == "pg.before_commit":
            faults.set_crash_hook(None)
            own_server.crash()

    faults.set_crash_hook(crash)
    try:
        with pytest.raises(StoreUnavailable) as lost:
            reg.claim("u", owner="b")
    finally:
        faults.set_crash_hook(None)
    assert lost.value.committed is None
    own_server.start()
    assert _claims(reg) == before and reg.get("u") is None and reg.verify().ok
    reg.close()


def test_lost_answer_to_a_commit_that_committed_is_success(pg: str) -> None:
    """The connection drops right after the server committed: the store finds its own audit
    line behind the head lock and reports success, without a second write."""
    reg = Registry(pg)
    reg.stats()
    store = reg.store
    assert isinstance(store, PostgresStore)

    def lose_answer(point: str) -> None:
        if point == "pg.commit_answer":
            faults.set_crash_hook(None)
            store._require_conn().close()
            raise psycopg.OperationalError("simulated: server closed the connection")

    faults.set_crash_hook(lose_answer)
    try:
        c = reg.claim("t", owner="a")
    finally:
        faults.set_crash_hook(None)
    grants = [e for e in _events(reg) if e["type"] == "claim_created"]
    assert [g["token_hash"] for g in grants] == [c.token_hash]
    assert reg.get("t") == c.with_token(None) and reg.verify().ok
    reg.close()


def test_merge_into_postgres_carries_the_work_queue(pg: str, tmp_path: Path) -> None:
    """A laptop's file registry merged into the team's PostgreSQL registry: its queued tasks
    (with their blocks and dependencies) arrive, and reloading from the server shows them."""
    laptop = Registry(tmp_path / "laptop")
    laptop.add("lint")
    laptop.add("ship", depends_on=["lint"], priority=5)
    laptop.block("lint", reason="flaky runner")
    team = Registry(pg)
    team.add("docs")
    plan = team.merge(tmp_path / "laptop")
    assert set(plan.tasks_changed) == {"lint", "ship"}
    fresh = Registry(pg)
    assert {s.task.task: s.status for s in fresh.tasks()} == {
        "docs": "ready", "lint": "blocked", "ship": "pending"}
    assert fresh.task("ship").task.depends_on == ("lint",)  # type: ignore[union-attr]
    assert team.merge(tmp_path / "laptop").events == ()


@pytest.mark.slow
def test_claim_next_pages_through_refused_candidates(pg: str) -> None:
    """On PostgreSQL claim_next reads its candidates a page at a time (16, then 64, ...): with
    take_stale, a hundred held tasks whose claims are live come first and are each refused; the
    ready task after them (three pages on) is handed out, and so is a task labelled for the
    asker."""
    reg = Registry(pg)
    for i in range(100):
        reg.add(f"held-{i:03d}", priority=1)
    for i in range(100):
        assert reg.claim_next(owner=f"w{i}", ttl=600) is not None
    reg.add("zz-last", priority=1)  # same priority, added later: after every held task
    reg.add("labelled", priority=1, labels=["gpu"])
    got = reg.claim_next(owner="late", take_stale=True, labels=["gpu"])
    assert got is not None and got.task == "labelled"
    got = reg.claim_next(owner="late", take_stale=True)
    assert got is not None and got.task == "zz-last"
    assert reg.claim_next(owner="late", take_stale=True) is None
