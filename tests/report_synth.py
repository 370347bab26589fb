"""Synthetic journals for the audit report's size and speed tests and bench/report_bench.py.

Building a million events through the Registry takes many minutes; the report takes event
dicts, so this simulates a realistic fleet directly: owners (agents) take tasks from a shared
queue, heartbeat while they work, sometimes try a task someone else holds (refused, retried,
given up), and end a holding by completing, releasing, handing off, losing the lease (a waiter
then recovers it), being preempted or force-released. Deterministic for a seed."""

from __future__ import annotations

import heapq
import random
from typing import Any

T0 = 1_700_000_000.0


def events(n: int, *, tasks: int = 20_000, owners: int = 4, seed: int = 1,
           renew_every: float = 15.0, mean_hold: float = 300.0) -> list[dict[str, Any]]:
    """About ``n`` events (stops at the first step past ``n``), journal-ordered."""
    rnd = random.Random(seed)
    names = [f"agent-{chr(97 + i)}" for i in range(owners)]
    task_names = [f"{('build', 'test', 'docs', 'lint', 'deploy')[i % 5]}/item-{i:05d}"
                  for i in range(tasks)]
    out: list[dict[str, Any]] = [{"seq": 1, "ts": T0, "type": "registry_created",
                                  "actor": "fleetclaims", "origin": "synthetic"}]
    held: dict[str, tuple[str, int, float]] = {}  # task -> owner, fence, expires
    dying: set[str] = set()  # holders that died: no more heartbeats, the lease will lapse
    fence = 0
    cursor = 0
    heap: list[tuple[float, int, str, str, str]] = [(T0 + i, i, o, "pick", "")
                                                   for i, o in enumerate(names)]
    tick = len(names)

    def emit(ts: float, kind: str, task: str, owner: str, **fields: Any) -> None:
        out.append({"seq": len(out) + 1, "ts": round(ts, 3), "type": kind, "task": task,
                    "actor": fields.pop("actor", owner), "owner": owner, **fields})

    def later(ts: float, owner: str, action: str, task: str) -> None:
        nonlocal tick
        tick += 1
        heapq.heappush(heap, (ts, tick, owner, action, task))

    while len(out) < n and heap:
        ts, _, owner, action, task = heapq.heappop(heap)
        if action == "pick":
            others = [t for t, (o, _, _) in held.items() if o != owner]
            if others and rnd.random() < 0.12:  # try a task someone else holds
                task = rnd.choice(sorted(others))
            else:
                task = task_names[cursor % tasks]
                cursor += 1
            action = "try"
        if action.startswith("try"):
            cur = held.get(task)
            if cur is not None and cur[0] == owner:  # its own (the queue came round): next
                later(ts + 1, owner, "pick", "")
                continue
            if cur is not None and cur[2] > ts:
                emit(ts, "claim_rejected", task, owner, holder=cur[0], fence=cur[1],
                     expires_at=cur[2], reason="held by a live lease")
                tries = int(action[3:] or 0) + 1
                later(ts + rnd.uniform(5, 60), owner, "pick" if tries > 3 else f"try{tries}",
                      "" if tries > 3 else task)
                continue
            fence += 1
            exp = ts + 3 * renew_every
            if cur is not None and cur[0] != owner:  # lapsed: take it over
                dying.discard(task)
                emit(ts, "claim_recovered", task, owner, fence=fence, prev_owner=cur[0],
                     prev_fence=cur[1], expires_at=exp, reason="lease expired")
            else:
                emit(ts, "claim_created", task, owner, fence=fence, expires_at=exp,
                     phase="working", priority=100)
            held[task] = (owner, fence, exp)
            later(ts + rnd.expovariate(1 / mean_hold), owner, "end", task)
            later(ts + renew_every, owner, "renew", task)
        elif action == "renew":
            cur = held.get(task)
            if cur is None or cur[0] != owner or task in dying:
                continue
            exp = ts + 3 * renew_every
            held[task] = (owner, cur[1], exp)
            emit(ts, "lease_renewed", task, owner, fence=cur[1], expires_at=exp)
            later(ts + renew_every, owner, "renew", task)
        elif action == "expire":
            cur = held.get(task)
            if cur is None or cur[0] != owner or task not in dying:
                continue  # a waiter recovered it first
            dying.discard(task)
            del held[task]
            if rnd.random() < 0.5:
                emit(ts, "lease_expired", task, owner, fence=cur[1], actor="sweeper",
                     reason="lease expired", expires_at=cur[2])
            else:  # another agent takes the stale claim over at once
                by = rnd.choice([o for o in names if o != owner] or names)
                fence += 1
                emit(ts, "claim_recovered", task, by, fence=fence, prev_owner=owner,
                     prev_fence=cur[1], expires_at=ts + 3 * renew_every, reason="owner dead")
                held[task] = (by, fence, ts + 3 * renew_every)
                later(ts + rnd.expovariate(1 / mean_hold), by, "end+", task)
                later(ts + renew_every, by, "renew", task)
        elif action.startswith("end"):  # "end+": a holding received from someone else,
            # which ends without starting another pick (each owner has one pick loop)
            cur = held.get(task)
            if cur is None or cur[0] != owner or task in dying:
                continue
            fate = rnd.random()
            _, f, exp = cur
            del held[task]
            if fate < 0.80:
                emit(ts, "claim_completed", task, owner, fence=f)
            elif fate < 0.88:
                emit(ts, "claim_released", task, owner, fence=f)
            elif fate < 0.92:  # the agent died: its lease lapses, a sweeper or a waiter acts
                held[task] = cur
                dying.add(task)
                later(exp + 1, owner, "expire", task)
                if action == "end":
                    later(exp + 2, owner, "pick", "")
                continue
            elif fate < 0.95:
                to = rnd.choice([o for o in names if o != owner] or names)
                fence += 1
                emit(ts, "claim_handed_off", task, to, fence=fence, actor=owner,
                     prev_owner=owner, prev_fence=f, expires_at=ts + 3 * renew_every)
                held[task] = (to, fence, ts + 3 * renew_every)
                later(ts + rnd.expovariate(1 / mean_hold), to, "end+", task)
                later(ts + renew_every, to, "renew", task)
            elif fate < 0.98:
                emit(ts, "claim_released_forced", task, owner, fence=f, actor="admin",
                     reason="stuck build")
            else:  # an urgent claim by another agent preempts it
                by = rnd.choice([o for o in names if o != owner] or names)
                fence += 1
                emit(ts, "claim_preempted", task, by, fence=fence, prev_owner=owner,
                     prev_fence=f, expires_at=ts + 3 * renew_every, rule="priority 1 < 100")
                held[task] = (by, fence, ts + 3 * renew_every)
                later(ts + rnd.expovariate(1 / mean_hold), by, "end+", task)
                later(ts + renew_every, by, "renew", task)
            if action == "end":
                later(ts + rnd.uniform(1, 20), owner, "pick", "")
    return out
