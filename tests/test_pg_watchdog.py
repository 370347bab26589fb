"""The PostgreSQL store's watchdog (connection.Watchdog), without a server: operations run
back to back must not wake its thread (issue #19: every arm woke it, a thread switch per
operation), and it must still cut a connection off whether it was idle or sleeping armed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from fleetclaims.store.postgres.connection import Watchdog

pytestmark = pytest.mark.unit


class _PgConn:
    def __init__(self, fd: int) -> None:
        self.socket = fd


class _Conn:
    """What the watchdog touches of a connection: the socket behind ``pgconn``."""

    def __init__(self, fd: int) -> None:
        self.pgconn = _PgConn(fd)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _count_notifies(dog: Watchdog) -> list[int]:
    count = [0]
    cond = dog._cond
    notify = cond.notify

    def counting(n: int = 1) -> None:
        count[0] += 1
        notify(n)

    cond.notify = counting  # type: ignore[method-assign]
    return count


def _wait_fired(dog: Watchdog, within: float) -> bool:
    deadline = time.monotonic() + within
    while not dog.fired and time.monotonic() < deadline:
        time.sleep(0.005)
    return dog.fired


def test_back_to_back_operations_do_not_wake_the_thread(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    dog = Watchdog()
    conn = cast(Any, _Conn(pair[0].fileno()))
    try:
        dog.arm(conn, time.monotonic() + 10)
        time.sleep(0.05)  # the thread runs and sleeps towards the deadline
        dog.disarm()
        count = _count_notifies(dog)
        for _ in range(50):
            dog.arm(conn, time.monotonic() + 10)
            dog.disarm()
        # (a tick that falls between a disarm and the next arm idles the thread: one wake)
        assert count[0] <= 1
        assert not dog.fired
    finally:
        dog.stop()


@pytest.mark.parametrize("idle_first", [False, True])
def test_still_cuts_off_an_overdue_call(
    pair: tuple[socket.socket, socket.socket], idle_first: bool
) -> None:
    dog = Watchdog()
    conn = cast(Any, _Conn(pair[0].fileno()))
    try:
        dog.arm(conn, time.monotonic() + 10)
        dog.disarm()
        if idle_first:  # past a tick: the thread waits without a timeout, arm must wake it
            time.sleep(Watchdog.TICK * 2)
        dog.arm(conn, time.monotonic() + 0.05)
        assert _wait_fired(dog, Watchdog.TICK + 2.0)
        assert pair[0].recv(1) == b""  # shut down: a read blocked on it returns
    finally:
        dog.stop()
