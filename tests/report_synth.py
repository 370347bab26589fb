"""Synthetic journals for the audit report's size and speed tests and bench/report_bench.py.

Building a million events through the Registry takes many minutes; the report takes event
dicts, so this simulates a realistic fleet directly: owners (agents) take tasks from a shared
queue, heartbeat while they work, sometimes try a task someone else holds (refused, retried,
given up), and end a holding by completing, releasing, handing off, dying (the lease expires
and a sweeper or a waiter acts), being force-released or preempted. Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import random
from typing import Any

T0 = 1_700_000_000.0
Action = tuple[float, int, str, str, str]  # time, tie-break, owner, action, task


class _Fleet:
    """The simulation: a time-ordered heap of each owner's next step. Each owner has one pick
    loop ("pick" -> "try" -> "end" -> "pick"); a holding received from someone else ends with
    "end+", which starts no second loop."""

    def __init__(self, tasks: int, owners: int, seed: int, renew_every: float,
                 mean_hold: float) -> None:
        self.rnd = random.Random(seed)
        self.names = [f"agent-{chr(97 + i)}" for i in range(owners)]
        self.tasks = [f"{('build', 'test', 'docs', 'lint', 'deploy')[i % 5]}/item-{i:05d}"
                      for i in range(tasks)]
        self.renew_every, self.mean_hold = renew_every, mean_hold
        self.out: list[dict[str, Any]] = [{"seq": 1, "ts": T0, "type": "registry_created",
                                           "actor": "fleetclaims", "origin": "synthetic"}]
        self.held: dict[str, tuple[str, int, float]] = {}  # task -> owner, fence, expires
        self.dying: set[str] = set()  # holders that died: no heartbeats, the lease lapses
        self.fence = self.cursor = 0
        self.heap: list[Action] = [(T0 + i, i, o, "pick", "") for i, o in enumerate(self.names)]
        self.tick = len(self.names)

    def emit(self, ts: float, kind: str, task: str, owner: str, **fields: Any) -> None:
        self.out.append({"seq": len(self.out) + 1, "ts": round(ts, 3), "type": kind,
                         "task": task, "actor": fields.pop("actor", owner), "owner": owner,
                         **fields})

    def later(self, ts: float, owner: str, action: str, task: str = "") -> None:
        self.tick += 1
        heapq.heappush(self.heap, (ts, self.tick, owner, action, task))

    def other(self, owner: str) -> str:
        return self.rnd.choice([o for o in self.names if o != owner] or self.names)

    def grant(self, ts: float, task: str, owner: str, kind: str, action: str,
              **fields: Any) -> None:
        self.fence += 1
        exp = ts + 3 * self.renew_every
        self.emit(ts, kind, task, owner, fence=self.fence, expires_at=exp, **fields)
        self.held[task] = (owner, self.fence, exp)
        self.later(ts + self.rnd.expovariate(1 / self.mean_hold), owner, action, task)
        self.later(ts + self.renew_every, owner, "renew", task)

    def step(self) -> None:
        ts, _, owner, action, task = heapq.heappop(self.heap)
        if action == "pick":
            others = sorted(t for t, (o, _, _) in self.held.items() if o != owner)
            if others and self.rnd.random() < 0.12:  # try a task someone else holds
                task = self.rnd.choice(others)
            else:
                task = self.tasks[self.cursor % len(self.tasks)]
                self.cursor += 1
            action = "try"
        if action.startswith("try"):
            self.attempt(ts, owner, task, int(action[3:] or 0))
        elif action == "renew":
            cur = self.held.get(task)
            if cur is not None and cur[0] == owner and task not in self.dying:
                exp = ts + 3 * self.renew_every
                self.held[task] = (owner, cur[1], exp)
                self.emit(ts, "lease_renewed", task, owner, fence=cur[1], expires_at=exp)
                self.later(ts + self.renew_every, owner, "renew", task)
        elif action == "expire":
            self.expire(ts, owner, task)
        else:
            self.end(ts, owner, task, action)

    def attempt(self, ts: float, owner: str, task: str, tries: int) -> None:
        cur = self.held.get(task)
        if cur is not None and cur[0] == owner:  # its own (the queue came round): next
            self.later(ts + 1, owner, "pick")
        elif cur is not None and cur[2] > ts:
            self.emit(ts, "claim_rejected", task, owner, holder=cur[0], fence=cur[1],
                      expires_at=cur[2], reason="held by a live lease")
            again = tries + 1 <= 3  # retried three times, then the owner moves on
            self.later(ts + self.rnd.uniform(5, 60), owner,
                       f"try{tries + 1}" if again else "pick", task if again else "")
        elif cur is not None:  # lapsed: take it over
            self.dying.discard(task)
            self.grant(ts, task, owner, "claim_recovered", "end", prev_owner=cur[0],
                       prev_fence=cur[1], reason="lease expired")
        else:
            self.grant(ts, task, owner, "claim_created", "end", phase="working", priority=100)

    def expire(self, ts: float, owner: str, task: str) -> None:
        cur = self.held.get(task)
        if cur is None or cur[0] != owner or task not in self.dying:
            return  # a waiter recovered it first
        self.dying.discard(task)
        del self.held[task]
        if self.rnd.random() < 0.5:
            self.emit(ts, "lease_expired", task, owner, fence=cur[1], actor="sweeper",
                      reason="lease expired", expires_at=cur[2])
        else:  # another agent takes the stale claim over at once
            self.grant(ts, task, self.other(owner), "claim_recovered", "end+", prev_owner=owner,
                       prev_fence=cur[1], reason="owner dead")

    def end(self, ts: float, owner: str, task: str, action: str) -> None:
        cur = self.held.get(task)
        if cur is None or cur[0] != owner or task in self.dying:
            return
        fate = self.rnd.random()
        _, f, exp = cur
        del self.held[task]
        if fate < 0.80:
            self.emit(ts, "claim_completed", task, owner, fence=f)
        elif fate < 0.88:
            self.emit(ts, "claim_released", task, owner, fence=f)
        elif fate < 0.92:  # the agent died: its lease lapses, a sweeper or a waiter acts
            self.held[task] = cur
            self.dying.add(task)
            self.later(exp + 1, owner, "expire", task)
            if action == "end":
                self.later(exp + 2, owner, "pick")
            return
        elif fate < 0.95:
            self.grant(ts, task, self.other(owner), "claim_handed_off", "end+", actor=owner,
                       prev_owner=owner, prev_fence=f)
        elif fate < 0.98:
            self.emit(ts, "claim_released_forced", task, owner, fence=f, actor="admin",
                      reason="stuck build")
        else:  # an urgent claim by another agent preempts it
            self.grant(ts, task, self.other(owner), "claim_preempted", "end+", prev_owner=owner,
                       prev_fence=f, rule="priority 1 < 100")
        if action == "end":
            self.later(ts + self.rnd.uniform(1, 20), owner, "pick")


def events(n: int, *, tasks: int = 20_000, owners: int = 4, seed: int = 1,
           renew_every: float = 15.0, mean_hold: float = 300.0) -> list[dict[str, Any]]:
    """``n`` events (or fewer if the fleet stops), journal-ordered."""
    fleet = _Fleet(tasks, owners, seed, renew_every, mean_hold)
    while len(fleet.out) < n and fleet.heap:
        fleet.step()
    return fleet.out[:n]
