"""doctor's work grows linearly with the registry (bench/doctor_bench.py measures the large
sizes; these are small enough for the unit suite)."""

from __future__ import annotations

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
