"""The work queue through merges and repairs. Merging registries merges their work queues too:
tasks added or changed on one side arrive on the other, concurrent changes are settled the same
way whichever side merges into which, and dependency loops the two sides close between them are
reported. doctor --fix re-records the queue of a snapshot that is ahead of a damaged journal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetclaims import Registry, RegistryCorrupt
from fleetclaims.cli import main
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration


def _queue(reg: Registry) -> list[tuple[object, ...]]:
    return [(s.task.task, s.task.priority, s.task.depends_on, s.task.labels, s.task.note,
             s.task.blocked, s.status) for s in reg.tasks()]


def _pair(tmp_path: Path, clock: FakeClock) -> tuple[Registry, Registry]:
    """Two copies of one registry that then part (a laptop taken offline)."""
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    a.add("shared", priority=50, labels=["ci"])
    a.add("base")
    a.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    return (Registry(tmp_path / "a", clock=clock, prober=FakeProber()),
            Registry(tmp_path / "b", clock=clock, prober=FakeProber()))


def test_tasks_added_and_changed_apart_arrive_both_ways(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = _pair(tmp_path, clock)
    clock.advance(1)
    a.add("only-a", depends_on=["base"], note="from a")
    b.add("only-b", priority=10, labels=["gpu"])
    b.block("base", reason="waiting for the vendor")
    clock.advance(1)
    plan = a.merge(tmp_path / "b")
    assert set(plan.tasks_changed) == {"only-b", "base"}
    assert plan.task_conflicts == () and plan.cycles == ()
    assert a.task("only-b").task.priority == 10  # type: ignore[union-attr]
    assert a.task("base").task.blocked == "waiting for the vendor"  # type: ignore[union-attr]
    assert a.task("only-a").status == "pending"  # type: ignore[union-attr]
    b.merge(tmp_path / "a")
    assert _queue(a) == _queue(b)
    # idempotent both ways, and the merged queue survives a reload from disk
    assert a.merge(tmp_path / "b").events == () and b.merge(tmp_path / "a").events == ()
    a.close()
    assert _queue(Registry(tmp_path / "a", clock=clock, prober=FakeProber())) == _queue(b)
    # claim_next hands out from the merged queue: only-b (priority 10) first
    nxt = b.claim_next(owner="w")
    assert nxt is not None and nxt.task == "only-b"


def test_the_side_that_saw_the_other_wins_without_conflict(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = _pair(tmp_path, clock)
    clock.advance(1)
    b.add("shared", priority=5, labels=["ci"], note="urgent now")
    a.merge(tmp_path / "b")  # a takes b's change
    clock.advance(1)
    a.add("shared", priority=7, labels=["ci"], note="less urgent")  # and changes it again
    plan = b.merge(tmp_path / "a")  # b has not seen a's newer change: it takes it, no conflict
    assert plan.task_conflicts == () and plan.tasks_changed == ("shared",)
    assert b.task("shared").task.priority == 7  # type: ignore[union-attr]
    plan = a.merge(tmp_path / "b")
    assert plan.tasks_changed == ()
    assert _queue(a) == _queue(b)


@pytest.mark.parametrize("first", ["a", "b"])
def test_concurrent_changes_keep_the_later_one_whichever_way(tmp_path: Path, first: str) -> None:
    clock = FakeClock()
    a, b = _pair(tmp_path, clock)
    clock.advance(1)
    a.add("shared", priority=20, labels=["ci"], note="a's view")
    clock.advance(1)
    b.add("shared", priority=30, labels=["ci", "slow"], note="b's view, later")
    one, other = (a, b) if first == "a" else (b, a)
    plan = one.merge(tmp_path / ("b" if first == "a" else "a"))
    assert plan.task_conflicts == ("shared",)
    other.merge(tmp_path / first)
    for reg in (a, b):
        record = reg.task("shared").task  # type: ignore[union-attr]
        assert (record.priority, record.labels, record.note) == (30, ("ci", "slow"),
                                                                 "b's view, later")
    assert _queue(a) == _queue(b)


@pytest.mark.parametrize("first", ["a", "b"])
def test_concurrent_changes_at_the_same_instant_agree(tmp_path: Path, first: str) -> None:
    """Changes stamped with the same time are settled by their event identities: both sides
    keep the same record."""
    clock = FakeClock()
    a, b = _pair(tmp_path, clock)
    a.add("shared", priority=20, note="a")
    b.add("shared", priority=30, note="b")
    one, other = (a, b) if first == "a" else (b, a)
    one.merge(tmp_path / ("b" if first == "a" else "a"))
    other.merge(tmp_path / first)
    assert _queue(a) == _queue(b)
    assert a.task("shared").task.eid == b.task("shared").task.eid  # type: ignore[union-attr]


def test_a_dependency_loop_closed_by_the_merge_is_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    a, b = _pair(tmp_path, clock)
    a.add("x", depends_on=["y"])
    b.add("y", depends_on=["x"])
    a.close()
    code = main(["merge", str(tmp_path / "b"), "--dir", str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert code == 0
    assert "dependency loop" in out and ("x -> y -> x" in out or "y -> x -> y" in out)
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    assert a.task("x").status == "pending" and a.task("y").status == "pending"  # type: ignore[union-attr]
    assert {t.task for t in a.ready()} == {"shared", "base"}
    # Changing one side's dependencies breaks the loop.
    a.add("y", depends_on=[])  # (an update keeps what it does not give)
    assert a.task("y").status == "ready"  # type: ignore[union-attr]


def test_registries_without_a_queue_merge_as_before(tmp_path: Path) -> None:
    """No queue on either side: the merge event keeps its earlier shape (no task members)."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    b.claim("t", owner="bob")
    plan = a.merge(tmp_path / "b")
    summary = next(e for e in plan.events if e["type"] == "registries_merged")
    assert "tasks" not in summary and plan.tasks_changed == ()


def test_doctor_restores_the_queue_of_a_snapshot_ahead_of_the_journal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """doctor --fix re-records the claims of a snapshot that is ahead of a damaged journal;
    the snapshot's work queue (tasks, dependencies, blocks) is re-recorded with them."""
    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("early", owner="o")
    reg.add("lint")
    reg.add("ship", depends_on=["lint"], priority=5, labels=["release"])
    reg.block("lint", reason="flaky runner")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()
    journal = d / "audit.jsonl"
    data = journal.read_bytes().rstrip(b"\0")
    journal.write_bytes(b"".join(line + b"\n" for line in data.splitlines()[:2]))
    with pytest.raises(RegistryCorrupt):
        Registry(d).tasks()
    assert main(["doctor", "--fix", "--dir", str(d)]) == 0
    capsys.readouterr()
    fixed = Registry(d)
    assert {s.task.task: s.status for s in fixed.tasks()} == {"lint": "blocked",
                                                             "ship": "pending"}
    ship = fixed.task("ship").task  # type: ignore[union-attr]
    assert (ship.depends_on, ship.labels, ship.priority) == (("lint",), ("release",), 5)
    assert fixed.verify().ok
    fixed.unblock("lint")
    nxt = fixed.claim_next(owner="w")
    assert nxt is not None and nxt.task == "lint"
