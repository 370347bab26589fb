"""Pruning ended claim records (#15) and the compact state they leave (#21): a recorded
command removes old released records and shrinks old completed ones; a completed task stays
refused until reopened; every store applies it identically; a fresh process reads the result
from claims.json (format 4) as a replay of the journal would build it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from fc_support import file_store, journal_lines, replay, run_python, token_of

import fleetclaims
from fleetclaims import Registry, TaskCompleted
from fleetclaims.cli import main
from fleetclaims.core import events as ev
from fleetclaims.core.state import State
from fleetclaims.testing import FakeClock, FakeProber, memory_registry

pytestmark = pytest.mark.integration

DAY = 86400.0


def history(reg: Registry, clock: FakeClock) -> None:
    """Old ended claims (released, completed, reopened), recent ones, and live ones."""
    for i in range(3):
        reg.release(f"old-rel-{i}", token=token_of(reg.claim(f"old-rel-{i}", owner="a")))
        reg.complete(f"old-done-{i}", token=token_of(reg.claim(f"old-done-{i}", owner="b")),
                     result={"i": i})
    reg.complete("reopened", token=token_of(reg.claim("reopened", owner="a")))
    reg.reopen("reopened", reason="not done after all")
    reg.claim("old-live", owner="c", ttl=DAY)
    clock.advance(100 * DAY)
    reg.release("new-rel", token=token_of(reg.claim("new-rel", owner="a")))
    reg.complete("new-done", token=token_of(reg.claim("new-done", owner="b")))
    reg.claim("new-live", owner="c")


def materialized(state: State) -> dict[str, dict[str, Any]]:
    return {c.task: c.to_dict() for c in state.claims.values()}


def check_pruned(reg: Registry) -> None:
    for i in range(3):
        assert reg.get(f"old-rel-{i}") is None
        done = reg.get(f"old-done-{i}")
        assert done is not None and done.state == "completed" and done.owner == "b"
        with pytest.raises(TaskCompleted):
            reg.claim(f"old-done-{i}", owner="z")
    assert reg.get("reopened") is None  # a reopened task's record is a released one
    assert reg.get("old-live") is not None and reg.get("old-live").live  # type: ignore[union-attr]
    for task in ("new-rel", "new-done", "new-live"):
        assert reg.get(task) is not None


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_prune_removes_old_ended_records_and_keeps_completed_tasks_refused(
    tmp_path: Path, kind: str
) -> None:
    """Released records older than the age go, completed ones shrink and stay refused until
    reopened, live and recent ones stay; one claims_pruned event records it; dry runs and
    prunes with nothing to do record nothing."""
    clock = FakeClock()
    reg = (memory_registry(clock) if kind == "memory"
           else Registry(tmp_path / "r", clock=clock, prober=FakeProber()))
    history(reg, clock)
    seq = reg.stats().seq
    plan = reg.prune("30d", dry_run=True)
    assert (plan.released, plan.completed) == (
        ("old-rel-0", "old-rel-1", "old-rel-2", "reopened"),
        ("old-done-0", "old-done-1", "old-done-2"))
    assert reg.stats().seq == seq and reg.get("old-rel-0") is not None  # changed nothing
    report = reg.prune("30d", actor="ops")
    assert report == plan
    pruned = [e.data for e in reg.events(types=[ev.CLAIMS_PRUNED]).events]
    assert [(e["actor"], e["released"], e["completed"]) for e in pruned] == [("ops", 4, 3)]
    check_pruned(reg)
    # A second prune finds nothing: not recorded.
    assert reg.prune("30d").count == 0
    assert len(reg.events(types=[ev.CLAIMS_PRUNED]).events) == 1
    # Reopening a pruned completion frees the task.
    assert reg.reopen("old-done-0", reason="again").state == "released"  # type: ignore[union-attr]
    assert reg.claim("old-done-0", owner="z").owner == "z"
    if kind == "file":
        reg.close()
        again = Registry(tmp_path / "r", clock=clock, prober=FakeProber())
        lines, _ = journal_lines(tmp_path / "r")
        assert materialized(again.store.read()) == materialized(replay(lines))
        assert again.get("old-done-1") is not None and again.get("old-rel-1") is None
        assert again.verify().ok


def test_prune_applies_identically_on_every_store(
    make_registry: Any, clock: FakeClock
) -> None:
    """The contract: on each store (PostgreSQL too) a prune removes and shrinks the same
    records, and another handle (a fresh load of the store) sees exactly that."""
    reg = make_registry()
    history(reg, clock)
    report = reg.prune("30d")
    assert report.count == 7
    check_pruned(reg)
    other = make_registry()
    check_pruned(other)
    assert materialized(other.store.read()) == materialized(reg.store.read())
    assert other.verify().ok


def test_prune_refuses_bad_ages(tmp_path: Path) -> None:
    """A negative, infinite or malformed age is refused before anything is written."""
    reg = memory_registry()
    for bad in (-1, float("inf"), float("nan"), "soon", True, None):
        with pytest.raises(fleetclaims.ValidationError):
            reg.prune(bad)  # type: ignore[arg-type]
    assert reg.stats().seq == 0


def test_snapshot_after_prune_is_compact_and_plain_json(tmp_path: Path) -> None:
    """claims.json after a prune: jq-readable JSON, live claims under .claims, a completed
    task's compact record under .ended, the pruned released ones absent."""
    clock = FakeClock()
    reg = Registry(tmp_path / "r", clock=clock, prober=FakeProber())
    history(reg, clock)
    reg.prune("30d")
    file_store(reg).checkpoint()
    doc = json.loads((tmp_path / "r" / "claims.json").read_bytes())
    assert doc["format"] == 4 and doc["seq"] == reg.stats().seq
    assert set(doc["claims"]) == {"old-live", "new-live"}
    assert {"owner", "phase", "fence", "expires_at"} <= set(doc["claims"]["old-live"])
    assert "old-rel-0" not in doc["ended"] and "reopened" not in doc["ended"]
    compact = doc["ended"]["old-done-0"]
    assert compact["state"] == "completed" and compact["owner"] == "b"
    assert "token_hash" in compact and not compact["token_hash"] and "result" not in compact


def test_cli_prune(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fleetclaims prune --ended-before AGE [--dry-run] [--json]`."""
    d = str(tmp_path / "r")
    reg = Registry(d)
    reg.release("a", token=token_of(reg.claim("a", owner="x")))
    reg.complete("b", token=token_of(reg.claim("b", owner="x")))
    reg.close()
    assert main(["prune", "--ended-before", "0s", "--dry-run", "--dir", d]) == 0
    assert "would prune the records of 1 released and 1 completed" in capsys.readouterr().out
    assert main(["prune", "--ended-before", "0s", "--json", "--dir", d]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["released"] == ["a"] and out["completed"] == ["b"] and not out["dry_run"]
    assert main(["claim", "b", "--owner", "y", "--dir", d]) != 0  # still refused
    assert main(["prune", "--ended-before", "ninety", "--dir", d]) == 2


def test_incremental_checkpoint_writes_what_a_full_one_writes(tmp_path: Path) -> None:
    """A checkpoint that copies unchanged lines writes the same bytes as one that encodes
    every claim afresh, after claims, renewals, releases, completions and a prune; lookups
    find every entry, also of names JSON escapes (quotes, backslashes, non-ASCII), which sort
    differently encoded than as text."""
    from fleetclaims.core.model import Claim
    from fleetclaims.core.state import ClaimTable
    from fleetclaims.store.file.snapshot import decode_snapshot, encode_snapshot

    clock = FakeClock()
    reg = Registry(tmp_path / "r", clock=clock, prober=FakeProber())
    names = ["a", "a.b", "a-b", "A", "z", "a/b", "a:b", "9"]
    tokens = {n: token_of(reg.claim(n, owner="o", ttl=600)) for n in names}
    file_store(reg).checkpoint()
    reg.release("a", token=tokens["a"])
    reg.complete("a.b", token=tokens["a.b"])
    reg.renew("z", token=tokens["z"], ttl=900)
    reg.claim("new", owner="p")
    clock.advance(10 * DAY)
    reg.prune("1d")
    state = file_store(reg).read()
    odd = ['q"uote', "back\\slash", "\u00e9-accent", "\u2603", "tab\there", "a\"b"]
    for i, name in enumerate(odd):  # (a merge or an old version may hold any string)
        state.claims[name] = Claim(task=name, owner="o", fence=100 + i, token_hash="h" * 64)
    incremental = encode_snapshot(state, 0)
    fresh = State(ClaimTable(dict(state.claims.raw_items())), state.seq, state.fence,
                  state.head, state.origin)
    assert encode_snapshot(fresh, 0) == incremental
    loaded = decode_snapshot(incremental).state
    assert materialized(loaded) == materialized(state)
    for n in [*names, *odd, "new", "missing", 'q"', "a\\"]:
        assert (loaded.claims.get(n) is None) == (state.claims.get(n) is None), n
        assert (n in loaded.claims) == (state.claims.get(n) is not None), n
    assert len(loaded.claims) == len(state.claims) == len(names) + len(odd)  # +new -a
    assert orjson.loads(incremental)["ended"].keys() == {"a.b"}
    # Changes to a loaded table, then a checkpoint of it: again what a full encode writes.
    loaded.claims['q"uote'] = loaded.claims.get('q"uote').evolve(state="released")  # type: ignore[union-attr]
    loaded.claims.discard("A")
    again = encode_snapshot(loaded, 0)
    fresh = State(ClaimTable(dict(loaded.claims.raw_items())), loaded.seq, loaded.fence,
                  loaded.head, loaded.origin)
    assert encode_snapshot(fresh, 0) == again
    assert set(orjson.loads(again)["ended"]) == {"a.b", 'q"uote'}
    assert "A" not in orjson.loads(again)["claims"]


CHILD_SETUP = r"""
import sys, fleetclaims
reg = fleetclaims.Registry(sys.argv[1], durability="process")
for i in range(40):
    c = reg.claim("done-%d" % i, owner="a")
    reg.complete("done-%d" % i, token=c.token)
    c = reg.claim("rel-%d" % i, owner="a")
    reg.release("rel-%d" % i, token=c.token)
    reg.claim("live-%d" % i, owner="a", ttl=3600)
reg.close()
print("SETUP", reg.stats().seq, flush=True)
"""

CHILD_PRUNE = r"""
import sys, fleetclaims
import fleetclaims.store.file.store as sf
sf.CHECKPOINT_MIN_TAIL = 1
reg = fleetclaims.Registry(sys.argv[1])
report = reg.prune(0)
print("PRUNED", report.count, flush=True)
reg.store.checkpoint()
reg.close()
print("DONE", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", ["journal.after_write", "journal.after_sync",
                                   "prune.after_sync", "snapshot.during_write",
                                   "snapshot.after_fsync", "snapshot.after_rename"])
def test_prune_killed_at_each_step(tmp_path: Path, point: str) -> None:
    """kill -9 at each step of a prune and the checkpoint after it: no acknowledged change is
    lost, the chain verifies, the state equals a replay of the journal, completed tasks stay
    refused, live claims stay held; an acknowledged prune is in effect."""
    d = tmp_path / "r"
    setup = run_python(CHILD_SETUP, str(d))
    assert setup.returncode == 0, setup.stderr
    run = run_python(CHILD_PRUNE, str(d), env={"FLEETCLAIMS_CRASH_AT": point})
    assert "DONE" not in run.stdout, (point, run.stdout, run.stderr)  # it was killed
    acknowledged = "PRUNED" in run.stdout
    reader = Registry(d)
    assert reader.verify().ok
    lines, _ = journal_lines(d)
    expected = replay(lines)
    assert materialized(reader.store.read()) == materialized(expected)
    pruned = [json.loads(x) for x in lines if b'"claims_pruned"' in x]
    assert len(pruned) <= 1 and (pruned or not acknowledged)
    reader.close()
    writer = Registry(d)  # the next writer repairs whatever the crash left
    for i in range(40):
        with pytest.raises(TaskCompleted):
            writer.claim(f"done-{i}", owner="z")
        live = writer.get(f"live-{i}")
        assert live is not None and live.live and live.owner == "a"
        assert (writer.get(f"rel-{i}") is None) == bool(pruned)
    assert writer.verify().ok
    lines, _ = journal_lines(d)
    assert materialized(writer.store.read()) == materialized(replay(lines))
    writer.close()
