"""Helpers for testing code that uses fleetclaims: a fake clock, a fake prober, and an
in-memory registry with the real rules and hash chain.

    from fleetclaims.testing import FakeClock, FakeProber, memory_registry
    clock = FakeClock()
    reg = memory_registry(clock=clock)
    c = reg.claim("t", owner="a", ttl=60)
    clock.advance(61)                    # the lease is now expired
    reg.claim("t", owner="b", take_stale=True)
"""

from __future__ import annotations

from dataclasses import replace

from .api import Registry
from .core.liveness import LocalFacts, Probe, decide_liveness
from .core.model import Identity, Now, Verdict
from .store.memory import MemoryStore

__all__ = ["FakeClock", "FakeProber", "memory_registry"]


class FakeClock:
    """A clock you move by hand. ``step_wall`` moves only the wall clock (an NTP step or a user
    changing the time); ``advance`` moves wall and boot clocks together (time passing)."""

    def __init__(self, wall: float = 1_800_000_000.0, boot: float = 1000.0,
                 boot_id: str = "fake-boot") -> None:
        self._now = Now(wall=wall, boot=boot, boot_id=boot_id)

    def now(self) -> Now:
        return self._now

    def advance(self, seconds: float) -> None:
        boot = None if self._now.boot is None else self._now.boot + seconds
        self._now = replace(self._now, wall=self._now.wall + seconds, boot=boot)

    def step_wall(self, seconds: float) -> None:
        self._now = replace(self._now, wall=self._now.wall + seconds)

    def reboot(self, boot_id: str, boot: float = 10.0) -> None:
        self._now = replace(self._now, boot=boot, boot_id=boot_id)


class FakeProber:
    """Pretends to be a process on a fake machine. Mark PIDs dead with ``kill(pid)``."""

    def __init__(self, host: str = "testhost", machine: str = "fake-machine",
                 boot: str = "fake-boot", pid: int = 4242, start: int = 1) -> None:
        self.facts = LocalFacts(host=host, machine=machine, boot=boot, pidns="pidns:1")
        self.pid = pid
        self.start = start
        self.dead: set[int] = set()
        self.zombies: set[int] = set()
        self.reused: dict[int, int] = {}

    def identity(self) -> Identity:
        return Identity(host=self.facts.host, machine=self.facts.machine, boot=self.facts.boot,
                        pidns=self.facts.pidns, pid=self.pid, start=self.start)

    def identity_of(self, pid: int) -> Identity:
        return replace(self.identity(), pid=pid, start=1)

    def as_pid(self, pid: int, start: int = 1) -> FakeProber:
        """Claims made after this call record ``pid`` as their owner process."""
        self.pid, self.start = pid, start
        return self

    def kill(self, pid: int) -> None:
        self.dead.add(pid)

    def verdict(self, identity: Identity | None) -> Verdict:
        probe = None
        if identity is not None:
            if identity.pid in self.dead:
                probe = Probe(exists=False)
            elif identity.pid in self.zombies:
                probe = Probe(exists=True, zombie=True, start=identity.start)
            else:
                probe = Probe(exists=True, start=self.reused.get(identity.pid, identity.start))
        return decide_liveness(identity, self.facts, probe)


def memory_registry(clock: FakeClock | None = None, prober: FakeProber | None = None) -> Registry:
    """A Registry on an in-memory store (nothing touches the disk)."""
    clock = clock or FakeClock()
    return Registry(store=MemoryStore(clock=clock), clock=clock, prober=prober or FakeProber())
