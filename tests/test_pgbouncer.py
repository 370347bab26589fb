"""The contract suite through PgBouncer in transaction pooling mode: the PostgreSQL store keeps
no session state across transactions (settings are SET LOCAL, locks are transaction locks,
nothing is prepared through a pooler), so every contract test passes when each transaction may
run on another server connection. Plus: many clients through a small pool, no setting leaks,
no prepared statement."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from pg_server import PgServer
from pgbouncer import PgBouncer, start_pgbouncer
from test_contract import *  # noqa: F403 - the contract tests, collected again here

from fleetclaims import Registry, StoreUnavailable
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration  # (the same type as test_contract's, which it replaces)


@pytest.fixture(scope="module")
def bouncer(pg_server: PgServer, postgres_url: str) -> Iterator[PgBouncer]:
    """PgBouncer (transaction pooling, 2 server connections) in front of the session's server."""
    try:
        bouncer = start_pgbouncer(pg_server, pool_size=2)
    except LookupError as exc:
        pytest.skip(str(exc))
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def make_registry(bouncer: PgBouncer, clock: FakeClock,
                  prober: FakeProber) -> Iterator[Callable[[], Registry]]:
    """The contract suite's registry factory, every handle connected through PgBouncer."""
    schema = "b_" + uuid.uuid4().hex[:12]
    made: list[Registry] = []

    def make() -> Registry:
        reg = Registry(bouncer.url("fleetclaims_test"), clock=clock, prober=prober,
                       schema=schema)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def test_many_handles_through_a_small_pool(bouncer: PgBouncer) -> None:
    """Twelve handles share two server connections: interleaved claims and releases all
    succeed, fences stay gap-free, the chain verifies."""
    url = bouncer.url("fleetclaims_test") + "?schema=b_" + uuid.uuid4().hex[:12]
    handles = [Registry(url) for _ in range(12)]
    fences = []
    for _round in range(3):
        claims = [reg.claim(f"t{i}", owner=f"o{i}") for i, reg in enumerate(handles)]
        fences += [c.fence for c in claims]
        for reg, c in zip(handles, claims, strict=True):
            assert reg.release(c.task, token=c.token)
    assert sorted(fences) == list(range(1, 37))
    assert handles[0].verify().ok
    for reg in handles:
        reg.close()


@pytest.mark.slow
def test_a_full_pool_gives_a_typed_error_within_the_budget(bouncer: PgBouncer) -> None:
    """Every server connection of the pool is held by an open transaction: a claim waits in
    PgBouncer's queue no longer than lock_timeout and fails with StoreUnavailable (nothing
    committed); once the pool frees up, it succeeds."""
    url = bouncer.url("fleetclaims_test")
    reg = Registry(url + "?schema=b_" + uuid.uuid4().hex[:12], lock_timeout=1)
    reg.claim("warm", owner="a")
    holders = [psycopg.connect(url, prepare_threshold=None) for _ in range(2)]
    try:
        for holder in holders:
            holder.execute("SELECT 1")  # BEGIN ...: the transaction keeps its server connection
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            reg.claim("t", owner="a")
        assert failed.value.committed is False and time.monotonic() - started < 2.5
    finally:
        for holder in holders:
            holder.close()
    assert reg.claim("t", owner="a").fence == 2
    reg.close()


def test_no_setting_leaks_into_other_sessions(bouncer: PgBouncer, postgres_url: str) -> None:
    """After fleetclaims' transactions, a plain client of the same pool sees the server's
    defaults: nothing fleetclaims set outlived its transaction."""
    url = bouncer.url("fleetclaims_test")
    reg = Registry(url + "?schema=b_" + uuid.uuid4().hex[:12], durability="process")
    for i in range(5):
        reg.claim(f"t{i}", owner="a")
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for _ in range(4):  # land on each server connection of the pool
            row = conn.execute("SELECT current_setting('synchronous_commit'), "
                               "current_setting('lock_timeout'), "
                               "current_setting('statement_timeout')").fetchone()
            assert row == ("on", "0", "0")
    reg.close()


def test_nothing_is_prepared_through_the_pooler(bouncer: PgBouncer) -> None:
    """Through PgBouncer (its cancel key is not the server process's pid) the store sends
    plain statements: a prepared one would be missing from the next server connection."""
    reg = Registry(bouncer.url("fleetclaims_test") + "?schema=b_" + uuid.uuid4().hex[:12])
    c = reg.claim("t", owner="a")
    for _ in range(3):  # past the third write, where a direct connection prepares
        reg.renew("t", token=c.token or "")
    store = reg.store
    assert store._q is store.sql  # type: ignore[attr-defined]
    assert store.query("SELECT count(*) FROM pg_prepared_statements "  # type: ignore[attr-defined]
                       "WHERE left(name, 3) = 'fc_'") == [(0,)]
    reg.release("t", token=c.token or "")
    reg.close()
