"""doctor's work grows linearly with the registry (bench/doctor_bench.py measures the large
sizes; these are small enough for the unit suite)."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from fleetclaims import Registry
from fleetclaims.core.model import Claim
from fleetclaims.store.file import doctor
from fleetclaims.store.file.reader import JournalReader
from fleetclaims.store.file.store import FileStore
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration


def _registry(path: Path, claims: int) -> None:
    """``claims`` live claims, each renewed once, and a snapshot half-way (so doctor compares
    the snapshot with the replay at its seq)."""
    reg = Registry(path, durability="process", clock=FakeClock(), prober=FakeProber())
    leases = [reg.claim(f"task-{i:05d}", owner=f"agent-{i % 7}") for i in range(claims)]
    store = reg.store
    assert isinstance(store, FileStore)
    store.checkpoint()
    for lease in leases:
        assert lease.token is not None
        reg.renew(lease.task, token=lease.token)
    reg.close()


def _doctor_work(path: Path, monkeypatch: pytest.MonkeyPatch, fix: bool) -> tuple[int, int, int]:
    """(claim records converted, journal lines read, peak bytes allocated) of one doctor run."""
    counts = {"to_dict": 0, "lines": 0}
    to_dict = Claim.to_dict
    events = JournalReader.events

    def counting_to_dict(self: Claim, *args: Any, **kwargs: Any) -> dict[str, Any]:
        counts["to_dict"] += 1
        return to_dict(self, *args, **kwargs)

    def counting_events(self: JournalReader) -> Any:
        for item in events(self):
            counts["lines"] += 1
            yield item

    with monkeypatch.context() as m:
        m.setattr(Claim, "to_dict", counting_to_dict)
        m.setattr(JournalReader, "events", counting_events)
        tracemalloc.start()
        try:
            report = doctor.check(path, fix=fix)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert report.ok, report.to_dict()
    return counts["to_dict"], counts["lines"], peak


@pytest.mark.parametrize("fix", [False, True])
def test_doctor_work_is_linear_in_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fix: bool
) -> None:
    """4x the claims costs doctor (check and --fix) at most ~4x the conversions, lines and
    memory: it keeps no copy of the claims per journal line (that was quadratic)."""
    n = 60
    _registry(tmp_path / "small", n)
    _registry(tmp_path / "large", 4 * n)
    small = _doctor_work(tmp_path / "small", monkeypatch, fix)
    large = _doctor_work(tmp_path / "large", monkeypatch, fix)
    converted, lines, peak = (b / max(a, 1) for a, b in zip(small, large, strict=True))
    assert small[1] > 2 * n  # the journal was read through the one reader
    assert converted <= 5, (small, large)
    assert lines <= 5, (small, large)
    assert peak <= 6, (small, large)


def _ahead_of_a_damaged_journal(path: Path) -> None:
    """7 claims and 4 queued tasks in the snapshot; the journal cut back to its first 2 lines."""
    reg = Registry(path, clock=FakeClock(), prober=FakeProber())
    for i in range(7):
        reg.claim(f"task-{i}", owner=f"agent-{i % 2}")
    for i in range(4):
        reg.add(f"queued-{i}", priority=i)
    store = reg.store
    assert isinstance(store, FileStore)
    store.checkpoint()
    reg.close()
    journal = path / "audit.jsonl"
    lines = journal.read_bytes().rstrip(b"\0").splitlines()
    journal.write_bytes(b"".join(line + b"\n" for line in lines[:2]))


def _rebuilt_events(path: Path) -> int:
    lines = (path / "audit.jsonl").read_bytes().rstrip(b"\0").splitlines()
    return sum(b'"type":"registry_rebuilt"' in line for line in lines)


def _records(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    reg = Registry(path)
    try:
        assert reg.verify().ok
        claims = {c.task: {k: v for k, v in c.to_dict().items() if k != "seq"}
                  for c in reg.claims()}
        tasks = {s.task.task: (s.task.priority, s.status) for s in reg.tasks()}
        return claims, tasks
    finally:
        reg.close()


def test_a_snapshot_ahead_is_re_recorded_in_parts_that_add_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor --fix re-records a snapshot ahead of the journal in events of at most
    RECORDS_PER_EVENT records (a replay never parses one line holding every claim), and the
    parts restore the same claims and queue as one event does."""
    from fleetclaims.store.file import salvage

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _ahead_of_a_damaged_journal(whole)
    shutil.copytree(whole, parts)
    assert "snapshot_ahead" in doctor.check(whole).kinds()
    assert doctor.check(whole, fix=True).ok
    monkeypatch.setattr(salvage, "RECORDS_PER_EVENT", 3)
    assert doctor.check(parts, fix=True).ok
    assert _rebuilt_events(whole) == 1
    assert _rebuilt_events(parts) == 3  # 7 claims (and 4 tasks), 3 a part
    assert _records(parts) == _records(whole)
    claims, tasks = _records(parts)
    assert sorted(claims) == [f"task-{i}" for i in range(7)]
    assert sorted(tasks) == [f"queued-{i}" for i in range(4)]
    assert doctor.check(parts).ok
