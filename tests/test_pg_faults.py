"""Bounded waits and no ambiguous commits on PostgreSQL: a frozen backend, a frozen server and
a network that stops forwarding each give a typed error within the lock_timeout budget; a
server killed at any point of a transaction, or an answer lost after COMMIT, still returns
the caller's result exactly once (never ``committed=None``)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import PgServer, start_server
from tcp_proxy import TcpProxy

from fleetclaims import Registry, StoreUnavailable
from fleetclaims.store.file import faults
from fleetclaims.store.postgres.store import PG_CRASH_POINTS, PostgresStore
from fleetclaims.testing import FakeClock

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

BUDGET = 2.0
SLACK = 1.5  # the watchdog's grace and the time to raise, on a loaded machine


@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    """A server of this module's own, to freeze, kill and restart."""
    server = start_server()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def proxy(pg_server: PgServer) -> Iterator[TcpProxy]:
    proxy = TcpProxy(pg_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def _via(proxy: TcpProxy, url: str) -> str:
    return url.replace(f":{proxy.target_port}/", f":{proxy.port}/", 1)


def _schema_url(pg_server: PgServer, name: str) -> str:
    import uuid

    return f"{pg_server.url()}?schema={name}_{uuid.uuid4().hex[:8]}"


def _store(reg: Registry) -> PostgresStore:
    assert isinstance(reg.store, PostgresStore)
    return reg.store


def _count(reg: Registry, kind: str, task: str) -> int:
    return sum(1 for e in reg.store.iter_events(0) if e["type"] == kind and e["task"] == task)


def _tree(pid: int) -> list[int]:
    """``pid`` and its child processes (the server's backends)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry.name))
    return [pid, *children]


@contextlib.contextmanager
def _frozen(pids: list[int]) -> Iterator[None]:
    try:
        for pid in pids:
            # A backend may exit between listing and stopping it (it has nothing to freeze);
            # the stopping is inside the try so that whatever was stopped is resumed however
            # this ends (a server left stopped fails every later test of the module).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _typed_within_budget(call: Callable[[], Any]) -> StoreUnavailable:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as failed:
        call()
    assert time.monotonic() - started < BUDGET + SLACK
    return failed.value


# --- bounded waits ---------------------------------------------------------------------------


def test_frozen_backend_gives_a_typed_error_within_the_budget(pg_server: PgServer) -> None:
    """The server process serving our session is SIGSTOPped: a claim fails with
    StoreUnavailable(committed=False) within lock_timeout, and works once it is resumed."""
    reg = Registry(_schema_url(pg_server, "frozen"), lock_timeout=BUDGET)
    reg.claim("warm", owner="a")
    conn = _store(reg)._conn
    assert conn is not None
    with _frozen([conn.info.backend_pid]):
        error = _typed_within_budget(lambda: reg.claim("t", owner="a"))
    assert error.committed is False and "did not answer" in str(error)
    assert reg.claim("t", owner="a").fence == 2 and _count(reg, "claim_created", "t") == 1
    reg.close()


def test_frozen_server_gives_a_typed_error_within_the_budget(own_server: PgServer) -> None:
    """Every process of the server SIGSTOPped: opening a registry and reading fail with
    StoreUnavailable within lock_timeout (the connect times out); resumed, it works."""
    url = _schema_url(own_server, "frozen")
    Registry(url).claim("warm", owner="a")
    pid = own_server.postmaster_pid()
    assert pid is not None
    with _frozen(_tree(pid)):
        fresh = Registry(url, lock_timeout=BUDGET)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failed:
            fresh.claim("t", owner="b")
        assert failed.value.committed is False
        # (libpq counts the connect timeout in whole seconds, 2 at least)
        assert time.monotonic() - started < BUDGET + 2 + SLACK
    assert fresh.claim("t", owner="b").fence == 2


def test_dropped_network_gives_a_typed_error_within_the_budget(
        pg_server: PgServer, proxy: TcpProxy) -> None:
    """The network stops forwarding (a local proxy stalls): a write and a read each fail with
    StoreUnavailable within lock_timeout; nothing was written; forwarding again, it works."""
    reg = Registry(_via(proxy, _schema_url(pg_server, "net")), lock_timeout=BUDGET)
    reg.claim("warm", owner="a")
    proxy.stall(new=True)
    written = _typed_within_budget(lambda: reg.claim("t", owner="a"))
    assert written.committed is False and "the change was not committed" in str(written)
    read = _typed_within_budget(lambda: reg.get("warm"))
    # (a read had no change to commit: its message says so rather than "not committed")
    assert read.committed is False and "nothing was written" in str(read)
    assert "not committed" not in str(read) and "Check that the server" in str(read)
    proxy.resume()
    assert reg.claim("t", owner="a").fence == 2 and _count(reg, "claim_created", "t") == 1
    reg.close()


# --- no ambiguous commits --------------------------------------------------------------------


def _stall_at(proxy: TcpProxy, point: str, **how: bool) -> Callable[[str], None]:
    def hook(name: str) -> None:
        if name == point:
            faults.set_crash_hook(None)
            proxy.stall(**how)

    return hook


@pytest.mark.parametrize("answers_only", [False, True], ids=["commit-lost", "answer-lost"])
def test_network_lost_during_commit_returns_the_claim(
        pg_server: PgServer, proxy: TcpProxy, answers_only: bool) -> None:
    """The network stops as COMMIT is sent: either the COMMIT never arrives (the server ends
    the idle session, the store finds nothing and claims again) or it commits and only the
    answer is lost (the store finds its own line). Either way the caller gets its claim,
    granted exactly once."""
    reg = Registry(_via(proxy, _schema_url(pg_server, "commit")), lock_timeout=BUDGET)
    reg.claim("warm", owner="a")
    faults.set_crash_hook(_stall_at(proxy, "pg.before_commit", answers_only=answers_only))
    try:
        claim = reg.claim("t", owner="a")
    finally:
        faults.set_crash_hook(None)
    grants = [e for e in reg.store.iter_events(0) if e["type"] == "claim_created"
              and e["task"] == "t"]
    assert [g["token_hash"] for g in grants] == [claim.token_hash]
    assert reg.get("t") == claim.with_token(None) and reg.verify().ok
    reg.close()


def _kill_and_restart(server: PgServer, point: str, lose_answer: bool,
                      restarts: list[threading.Timer]) -> Callable[[str], None]:
    """A crash hook: at ``point`` the server dies at once; it comes back 0.3 s later (as a
    supervisor restarts it) while the store is already trying to find out what happened."""
    def hook(name: str) -> None:
        if name != point:
            return
        faults.set_crash_hook(None)
        server.crash()
        restart = threading.Timer(0.3, server.start)
        restarts.append(restart)
        restart.start()
        if lose_answer:
            raise psycopg.OperationalError("simulated: the answer to COMMIT was lost")

    return hook


def _killed_at(server: PgServer, point: str, call: Callable[[], Any]) -> Any:
    """``call()`` with the server killed at ``point`` (and the answer lost at the last one);
    the server is up again before this returns."""
    restarts: list[threading.Timer] = []
    faults.set_crash_hook(_kill_and_restart(server, point, point == "pg.commit_answer",
                                            restarts))
    try:
        return call()
    finally:
        faults.set_crash_hook(None)
        for restart in restarts:
            restart.join()


Op = Callable[[Registry, FakeClock], tuple[str, str, Callable[[], Any]]]


def _claim(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    return "claim_created", "t", lambda: reg.claim("t", owner="a")


def _renew(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    c = reg.claim("t", owner="a")
    return "lease_renewed", "t", lambda: reg.renew("t", token=c.token or "")


def _release(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    c = reg.claim("t", owner="a")
    return "claim_released", "t", lambda: reg.release("t", token=c.token)


def _complete(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    c = reg.claim("t", owner="a")
    return "claim_completed", "t", lambda: reg.complete("t", token=c.token or "")


def _recover(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    reg.claim("t", owner="a", ttl=5)
    clock.advance(10)
    return "claim_recovered", "t", lambda: reg.recover("t", owner="b", reason="expired")


def _handoff(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    c = reg.claim("t", owner="a")
    return "claim_handed_off", "t", lambda: reg.handoff("t", token=c.token or "", to_owner="b")


def _claim_next(reg: Registry, clock: FakeClock) -> tuple[str, str, Callable[[], Any]]:
    reg.add("t")
    return "claim_created", "t", lambda: reg.claim_next(owner="a")


OPS: dict[str, Op] = {"claim": _claim, "renew": _renew, "release": _release,
                      "complete": _complete, "recover": _recover, "handoff": _handoff,
                      "claim_next": _claim_next}


# Crowded (another writer wrote just before) matters once the writes are sent.
_POINTS = [pytest.param(point, crowded, id=f"{point}-{'crowded' if crowded else 'alone'}")
           for point in PG_CRASH_POINTS for crowded in (False, True)
           if not crowded or point != "pg.after_lock"]


@pytest.mark.parametrize(("point", "crowded"), _POINTS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_server_killed_at_each_point_returns_the_result_once(
        own_server: PgServer, op: str, point: str, crowded: bool) -> None:
    """The server is killed (and restarted by its supervisor) at each point of a transaction
    of each holder operation; at the last point the answer to the COMMIT is lost too. The call
    returns its result, its event is recorded exactly once, the chain verifies. Crowded,
    another writer wrote just before: the write commits asynchronously and the flush behind it
    is what the kill or the lost answer interrupts."""
    clock = FakeClock()
    url = _schema_url(own_server, op)
    reg = Registry(url, lock_timeout=10, clock=clock)
    kind, task, call = OPS[op](reg, clock)
    if crowded:
        other = Registry(url, lock_timeout=10, clock=clock)
        other.claim("elsewhere", owner="z")
        other.close()
    before = _count(reg, kind, task)
    result = _killed_at(own_server, point, call)
    assert result is not None and result is not False
    assert _count(reg, kind, task) == before + 1
    assert reg.verify().ok
    reg.close()


_GUESSED_OPS = ("claim", "renew", "release")  # (completing looks up dependants: the head row first)


@pytest.mark.parametrize("crowded", [False, True], ids=["alone", "crowded"])
@pytest.mark.parametrize("point", ["pg.before_commit", "pg.commit_answer"])
@pytest.mark.parametrize("op", _GUESSED_OPS)
def test_server_killed_during_a_one_round_trip_write_returns_the_result_once(
        own_server: PgServer, op: str, point: str, crowded: bool) -> None:
    """The same on a warm connection, where a claim, renewal or release of the
    process's own task is sent in one round trip (guessed.py): killed before the message is
    sent, or as its answer comes (lost too), the call finds out, returns its result, and the
    event is recorded exactly once."""
    clock = FakeClock()
    url = _schema_url(own_server, f"guess_{op}")
    reg = Registry(url, lock_timeout=10, clock=clock)
    for _ in range(4):  # (the connection's statements prepared: guesses are sent from now)
        reg.release("warm", token=reg.claim("warm", owner="a").token or "")
    kind, task, call = OPS[op](reg, clock)
    if crowded:
        other = Registry(url, lock_timeout=10, clock=clock)
        other.claim("elsewhere", owner="z")
        other.close()
    store = _store(reg)
    sent: list[int] = []
    guess = store._attempt_guessed

    def counted(*args: Any) -> Any:
        sent.append(1)
        return guess(*args)

    store._attempt_guessed = counted  # type: ignore[method-assign,assignment]
    before = _count(reg, kind, task)
    result = _killed_at(own_server, point, call)
    assert sent and result is not None and result is not False
    assert _count(reg, kind, task) == before + 1
    assert reg.verify().ok
    reg.close()
