"""Six real worker processes drain a 200-task dependency graph with claim_next; an oracle
replays the journal: every task completed exactly once, never before its dependencies, and
no two holders of a task at once."""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from pathlib import Path

import pytest
from fc_support import run_workers
from oracle import check, read_journal

from fleetclaims import Registry

pytestmark = pytest.mark.integration

CTX = multiprocessing.get_context("fork")
TASKS = 200
WORKERS = 6


def _graph(seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    graph: dict[str, list[str]] = {}
    for i in range(TASKS):
        # Edges only to earlier tasks: a DAG, with long chains and wide fans.
        deps = rng.sample(range(i), k=min(i, rng.choice([0, 0, 1, 1, 2, 3])))
        graph[f"t{i:03d}"] = [f"t{j:03d}" for j in deps]
    return graph


def _worker(directory: str, name: str, log: str,
            start: multiprocessing.synchronize.Barrier) -> None:
    reg = Registry(directory, durability="process")
    rng = random.Random(name)
    done: list[tuple[str, int]] = []
    start.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        claim = reg.claim_next(owner=name, ttl=300)
        if claim is None:
            if reg.stats().queue.get("completed") == TASKS:
                break
            time.sleep(0.002)  # everything left waits for work in progress elsewhere
            continue
        if rng.random() < 0.3:
            time.sleep(rng.random() / 500)  # the "work"
        reg.complete(claim.task, token=claim.token or "")
        done.append((claim.task, claim.fence))
    Path(log).write_text(json.dumps(done))


def test_six_workers_drain_a_dependency_graph(tmp_path: Path) -> None:
    directory = tmp_path / "reg"
    graph = _graph(7)
    reg = Registry(directory, durability="process")
    # Added in a shuffled order: a dependency may be added after its dependant.
    names = list(graph)
    random.Random(3).shuffle(names)
    for name in names:
        reg.add(name, depends_on=graph[name], priority=random.Random(name).randrange(3))
    barrier = CTX.Barrier(WORKERS)
    per_worker = run_workers(CTX, _worker, tmp_path, WORKERS,
                             lambda i, log: (str(directory), f"w{i}", log, barrier), 150)
    acked = [a for w in per_worker for a in w]
    assert sorted(t for t, _ in acked) == sorted(graph)  # each task done once, by one worker
    assert sum(1 for w in per_worker if w) > 1, "the work was not shared"

    events = read_journal(directory)
    report = check(events)  # no overlapping holders, fences increasing, chain intact
    assert report.completed == dict.fromkeys(graph, 1)
    completed_at = {e["task"]: e["seq"] for e in events if e["type"] == "claim_completed"}
    claimed_at = {e["task"]: e["seq"] for e in events if e["type"] == "claim_created"}
    assert set(claimed_at) == set(graph)
    for task, deps in graph.items():
        for dep in deps:
            assert completed_at[dep] < claimed_at[task], f"{task} claimed before {dep} was done"
    # Every dependant whose last dependency completed was announced, exactly once.
    announced = [e["task"] for e in events if e["type"] == "became_ready"]
    assert sorted(announced) == sorted(t for t, deps in graph.items() if deps)
    assert not [e for e in events if e["type"] == "claim_rejected"]
    final = Registry(directory)
    assert final.stats().queue == {"ready": 0, "held": 0, "pending": 0, "blocked": 0,
                                   "completed": TASKS}
    assert final.verify().ok
