"""Schema 6: writes numbered by the server in the message that commits (``numbered.py``) and
writes in one round trip over the process's own copy of a task (``guessed.py``).

What must hold: the lines are sealed byte for byte as the core seals them; several processes
writing the same tasks at once keep one holder per task, fences that only go up, a chain that
verifies, claim rows equal to the journal's replay, and every acknowledged result in the
journal as acknowledged; a stale copy or a clock far from the estimate is refused by the server
and decided again; a writer that has not declared the protocol cannot move the head; a guessed
write caught by a frozen backend is found out within the budget and granted once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
import uuid
from collections import Counter
from typing import Any

import orjson
import psycopg
import pytest
from fc_support import replay

from fleetclaims import ClaimConflict, NotHolder, Registry, StoreUnavailable
from fleetclaims.core import events as ev
from fleetclaims.core.chain import envelope, seal
from fleetclaims.core.model import Claim
from fleetclaims.store.postgres import numbered
from fleetclaims.store.postgres.store import PostgresStore

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

WARM = 4  # writes after which a connection's statements are prepared and guesses are sent


def _url(postgres_url: str) -> str:
    return f"{postgres_url}?schema=t_{uuid.uuid4().hex[:12]}"


def _store(reg: Registry) -> PostgresStore:
    assert isinstance(reg.store, PostgresStore)
    return reg.store


def _paths(reg: Registry) -> Counter[str]:
    """Counts, for ``reg``'s store, of guesses sent (``sent``), writes made in one round trip
    (``guessed``), guesses the server refused (``refused``) and writes numbered after reading
    (``numbered``)."""
    store = _store(reg)
    counts: Counter[str] = Counter()
    guessed, numbered_write = store._attempt_guessed, store._write_numbered

    def attempt(*args: Any) -> Any:
        counts["sent"] += 1
        done = guessed(*args)
        counts["guessed" if done is not None else "refused"] += 1
        return done

    def write(*args: Any) -> Any:
        counts["numbered"] += 1
        return numbered_write(*args)

    store._attempt_guessed = attempt  # type: ignore[method-assign,assignment]
    store._write_numbered = write  # type: ignore[method-assign,assignment]
    return counts


def _replayed(reg: Registry) -> dict[str, Claim]:
    """The claims a replay of the journal gives, with every line's chain checked."""
    state = replay([line[:-1] for line in _store(reg).raw_lines()])
    return {c.task: c for c in state.claims.values()}


def _stored(reg: Registry) -> dict[str, Claim]:
    return {c.task: c for c in Registry(reg.location).store.read().claims.values()}


def _sealed(fields: dict[str, Any], seq: int = 41, prev: str = "a" * 64) -> tuple[dict[str, Any],
                                                                                 str]:
    event = envelope(seq, 1764700000.25, fields, prev)
    line, digest = seal(orjson.dumps(event))
    event["hash"] = digest
    return event, line[:-1].decode()


GRANT = {"type": ev.CLAIM_CREATED, "task": "t/ü", "actor": "a", "owner": "a", "fence": 7,
         "token_hash": "b" * 64, "phase": "working", "priority": 100, "note": 'say "fence":7',
         "expires_at": 1764700060.25, "ttl": 60.0}


def test_a_template_seals_as_the_core_does_at_any_numbers() -> None:
    """The parts of a grant and of a release, put back at the guessed numbers, are the line
    the core sealed; at other numbers they are the line the core would seal there."""
    release = {"type": ev.CLAIM_RELEASED, "task": "t", "actor": "a", "owner": "a",
               "fence": 7}
    for fields in (GRANT, release):
        event, line = _sealed(fields)
        tpl = numbered.template(event, line)
        assert tpl is not None and tpl.grant == (fields is GRANT)
        assert seal(tpl.body(41, 7, "a" * 64))[0][:-1].decode() == line
        moved = dict(fields, fence=12) if tpl.grant else fields
        _, other_line = _sealed(moved, seq=90, prev="c" * 64)
        assert seal(tpl.body(90, 12, "c" * 64))[0][:-1].decode() == other_line
        assert tpl.matches(other_line) and tpl.matches(line)
        assert not tpl.matches(other_line.replace('"owner":"a"', '"owner":"b"'))


def test_a_grant_with_a_member_named_fence_elsewhere_is_not_cut() -> None:
    """Metadata holding a member named "fence" makes the new fence ambiguous in the bytes:
    such a grant is written the other way (None), never cut at the wrong place; so are events
    of other kinds and a grant above a fence floor."""
    event, line = _sealed(dict(GRANT, metadata={"fence": 7}))
    assert numbered.template(event, line) is None
    event, line = _sealed({"type": ev.CLAIM_REOPENED, "task": "t", "actor": "a",
                           "owner": "a", "fence": 7})
    assert numbered.template(event, line) is None  # (not an event numbered on the server)
    event, line = _sealed(dict(GRANT, fence_floor=6))
    assert numbered.template(event, line) is None


def test_writes_go_in_one_round_trip_and_match_the_journal(postgres_url: str) -> None:
    """After the connection is warm, a claim, a renewal and a release each go in one round
    trip; what each returns is the journal's line (seq, event id, fence), and the rows equal
    the replay."""
    reg = Registry(_url(postgres_url))
    for i in range(WARM):
        reg.release(f"w{i}", token=reg.claim(f"w{i}", owner="a").token or "")
    counts = _paths(reg)
    claim = reg.claim("t", owner="a", ttl=60, metadata={"k": ["ü", 1.5]})
    renewed = reg.renew("t", token=claim.token or "")
    assert reg.release("t", token=claim.token or "")
    assert counts == Counter(sent=3, guessed=3)
    lines = {e["seq"]: e for e in reg.store.iter_events(0)}
    for got in (claim, renewed):
        assert lines[got.seq]["hash"] == got.eid and lines[got.seq]["fence"] == got.fence
    assert claim.fence == max(e.get("fence", 0) for e in lines.values()
                              if e["type"] in ev.GRANTS)
    assert _stored(reg) == _replayed(reg) and reg.verify().ok
    reg.close()


def test_a_stale_copy_is_refused_and_decided_again(postgres_url: str) -> None:
    """A's copy of the task says it is free; B took it meanwhile. The server refuses A's
    guess (nothing written) and A's claim is decided again over the row: a conflict."""
    url = _url(postgres_url)
    a, b = Registry(url), Registry(url)
    for _ in range(WARM):
        a.release("t", token=a.claim("t", owner="a").token or "")
    held = b.claim("t", owner="b")
    counts = _paths(a)
    with pytest.raises(ClaimConflict):
        a.claim("t", owner="a")
    assert counts["refused"] == 1 and counts["guessed"] == 0
    grants = [e for e in a.store.iter_events(0) if e["type"] == "claim_created"]
    assert grants[-1]["token_hash"] == held.token_hash
    b.release("t", token=held.token or "")
    again = a.claim("t", owner="a")  # (its copy is the row now: no refusal)
    assert again.fence == held.fence + 1 and counts["refused"] == 1
    assert _stored(a) == _replayed(a) and a.verify().ok
    a.close()
    b.close()


def test_a_task_in_the_work_queue_is_claimed_without_a_guess(postgres_url: str) -> None:
    """A claim looks at the task's queue row, which a guess cannot see: once the process has
    read that the task is queued, its claims go the two-round-trip way at once instead of
    sending a guess the server would refuse (its releases, which do not look, still go in one)."""
    reg = Registry(_url(postgres_url))
    for _ in range(WARM):
        reg.release("w", token=reg.claim("w", owner="a").token or "")
    reg.add("q")
    reg.release("q", token=reg.claim("q", owner="a").token or "")
    counts = _paths(reg)
    for _ in range(3):
        reg.release("q", token=reg.claim("q", owner="a").token or "")
    assert counts == Counter(sent=3, guessed=3, numbered=3), counts
    assert reg.verify().ok
    reg.close()


def test_a_clock_estimate_off_the_server_is_refused(postgres_url: str) -> None:
    """The estimate of the server's clock is an hour off (as if the server's clock jumped):
    the server refuses the guess and the claim is decided at the server's time."""
    reg = Registry(_url(postgres_url))
    for _ in range(WARM):
        reg.release("t", token=reg.claim("t", owner="a").token or "")
    store = _store(reg)
    counts = _paths(reg)
    store._wall -= 3600
    claim = reg.claim("t", owner="a", ttl=60)
    server_now = store.now().wall
    assert counts["refused"] == 1 and abs(claim.claimed_at - server_now) < 5
    assert reg.verify().ok
    reg.close()


def test_a_writer_without_the_protocol_cannot_move_the_head(postgres_url: str) -> None:
    """A process of an older fleetclaims (it takes no task locks) still running after the
    upgrade: its head update is refused, naming the fix; with the protocol declared the same
    update passes."""
    url = _url(postgres_url)
    reg = Registry(url)
    reg.claim("t", owner="a")
    schema = _store(reg).schema
    reg.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error, match="restart it with the upgraded fleetclaims"):
            conn.execute(f'UPDATE "{schema}".head SET seq = seq WHERE id = 1')
        with conn.transaction():
            conn.execute("SELECT set_config('fleetclaims.writer', '6', true)")
            conn.execute(f'UPDATE "{schema}".head SET seq = seq WHERE id = 1')


def _worker(url: str, index: int, seconds: float, out: Any) -> None:
    reg = Registry(url, lock_timeout=30)
    counts = _paths(reg)
    rng = random.Random(index)
    acked: list[tuple[Any, ...]] = []
    own = f"own-{index}"
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        task = rng.choice(["s0", "s1", "s2", own, own])
        try:
            claim = reg.claim(task, owner=f"w{index}", ttl=30)
        except ClaimConflict:
            continue
        acked.append(("claim_created", task, claim.seq, claim.eid, claim.fence,
                      claim.token_hash))
        if rng.random() < 0.5:
            renewed = reg.renew(task, token=claim.token or "")
            acked.append(("lease_renewed", task, renewed.seq, renewed.eid, renewed.fence,
                          claim.token_hash))
        if index == 0 and n % 7 == 0:  # writes that lock the head row first, in between
            reg.add(f"q{n}")
            got = reg.claim_next(owner="w0")
            if got is not None:
                reg.complete(got.task, token=got.token or "")
        if task == own and rng.random() < 0.2:
            done = reg.complete(task, token=claim.token or "")
            acked.append(("claim_completed", task, done.seq, done.eid, done.fence,
                          claim.token_hash))
            own = f"own-{index}-{n}"
        else:
            assert reg.release(task, token=claim.token or "")
            acked.append(("claim_released", task, None, None, claim.fence, claim.token_hash))
    out.put((acked, dict(counts)))
    reg.close()


@pytest.mark.slow
def test_concurrent_writers_keep_the_rules_and_the_chain(postgres_url: str) -> None:
    """Four processes claim, renew, release and complete three shared tasks and their own for
    a few seconds (one also adding and completing queue tasks, which lock the head row
    first). Oracle: the chain verifies; seq has no gaps; each grant's fence is one above the
    highest before it; no task is granted while held; every acknowledged result is in the
    journal as returned; the rows equal the replay; guesses were written and some refused."""
    url = _url(postgres_url)
    with Registry(url) as reg:
        reg.claim("boot", owner="x")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, i, 3.0, out)) for i in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    reg = Registry(url)
    assert reg.verify().ok
    events = list(reg.store.iter_events(0))
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    high, holder = 0, dict[str, Any]()
    for e in events:
        if e["type"] in ev.GRANTS:
            assert e["fence"] == high + 1, e
            assert holder.get(e["task"]) is None or e["type"] != "claim_created", e
            high = e["fence"]
            holder[e["task"]] = e["token_hash"]
        elif e["type"] in (ev.CLAIM_RELEASED, ev.CLAIM_COMPLETED):
            assert holder.get(e["task"]) is not None, e
            holder[e["task"]] = None
    by_seq = {e["seq"]: e for e in events}
    ended = Counter((e["type"], e["task"], e["fence"]) for e in events
                    if e["type"] in (ev.CLAIM_RELEASED, ev.CLAIM_COMPLETED))
    totals: Counter[str] = Counter()
    for acked, counts in results:
        totals.update(counts)
        for kind, task, seq, eid, fence, token_hash in acked:
            if seq is None:
                assert ended[(kind, task, fence)] == 1, (kind, task, fence)
                continue
            line = by_seq[seq]
            assert (line["type"], line["task"], line["hash"], line.get("fence")) == (
                kind, task, eid, fence)
            if kind == "claim_created":
                assert line["token_hash"] == token_hash
    assert totals["guessed"] > 50 and totals["refused"] > 0, totals
    assert _stored(reg) == _replayed(reg)
    reg.close()


@contextlib.contextmanager
def _frozen(pid: int) -> Any:
    try:
        os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_guess_caught_by_a_frozen_backend_is_found_out_within_the_budget(
        postgres_url: str) -> None:
    """The server process of a warm connection is SIGSTOPped as a guess is sent: the call
    finds out (on a new connection) that nothing was written and that nothing can be any
    more, and claims there, within the budget; the frozen backend, resumed, writes nothing."""
    budget = 2.0
    reg = Registry(_url(postgres_url), lock_timeout=budget)
    for _ in range(WARM):
        reg.release("w", token=reg.claim("w", owner="a").token or "")
    counts = _paths(reg)
    conn = _store(reg)._conn
    assert conn is not None
    started = time.monotonic()
    with _frozen(conn.info.backend_pid):
        try:
            claim = reg.claim("t", owner="a")
        except StoreUnavailable as exc:  # (allowed: a definite refusal, within the budget)
            assert exc.committed is False
            claim = None
        elapsed = time.monotonic() - started
    print(f"frozen backend: {'claimed' if claim else 'refused'} after {elapsed:.2f}s")
    assert elapsed < budget + 1.5 and counts["sent"] == 1
    time.sleep(0.5)  # the resumed backend reads the stale message: its clock guard refuses it
    grants = [e for e in reg.store.iter_events(0) if e["type"] == "claim_created"
              and e["task"] == "t"]
    assert [g["token_hash"] for g in grants] == ([claim.token_hash] if claim else [])
    with pytest.raises((ClaimConflict, NotHolder)) if claim else contextlib.nullcontext():
        reg.claim("t", owner="b")
    assert reg.verify().ok
    reg.close()


@pytest.mark.slow
def test_a_guess_caught_by_a_frozen_server_is_bounded_and_never_doubled() -> None:
    """Every process of the server SIGSTOPped while a warm connection sends a guess: the call
    gives StoreUnavailable within the budget (plus libpq's 2 s connect minimum), committed
    False or unknown (None: nothing tells a guess never begun from one frozen mid-commit);
    resumed, the guess's clock window has passed, so it writes nothing, and the claim retried
    with the same token is granted once."""
    from pg_server import start_server
    from test_pg_faults import _tree

    budget = 2.0
    server = start_server()
    try:
        reg = Registry(server.create_database("frozen_guess"), lock_timeout=budget)
        for _ in range(WARM):
            reg.release("w", token=reg.claim("w", owner="a").token or "")
        postmaster = server.postmaster_pid()
        assert postmaster is not None
        pids = _tree(postmaster)
        counts = _paths(reg)
        started = time.monotonic()
        try:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            with pytest.raises(StoreUnavailable) as failed:
                reg.claim("t", owner="a", token="the-token-of-this-claim")
            elapsed = time.monotonic() - started
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert counts["sent"] == 1 and failed.value.committed in (False, None)
        assert elapsed < budget + 2 + 1.5
        time.sleep(0.5)
        claim = reg.claim("t", owner="a", token="the-token-of-this-claim")
        grants = [e for e in reg.store.iter_events(0) if e["type"] == "claim_created"
                  and e["task"] == "t"]
        assert [g["token_hash"] for g in grants] == [claim.token_hash] and reg.verify().ok
        reg.close()
    finally:
        server.destroy()
