"""A sealed segment's index (``segments/*.idx.json``) is derived data, never trusted over the
segment: one that does not fit its segment (wrong types or ranges, members that do not tile the
file, a segment re-compressed since) is not used, and ``audit verify`` compares every index
with what its segment holds and names one that differs (a hand-edited index hid a task's
events from ``explain`` and ``audit --task`` while verify said ok)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fleetclaims
from fleetclaims.cli.output import EXIT_DAMAGED, EXIT_OK
from fleetclaims.store.file import preseal, segments, verify_par

pytestmark = pytest.mark.unit


@pytest.fixture(params=["inline", "prefetch"])
def small(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Small segments and blocks; segments read inline, or decompressed ahead by the helper
    thread and verified by worker processes (verify_par)."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 16_000)
    monkeypatch.setattr(segments, "BLOCK", 2_000)
    monkeypatch.setattr(segments, "PREFETCH_MIN", 1 << 40 if request.param == "inline" else 0)
    monkeypatch.setattr(preseal, "ENABLED", False)
    monkeypatch.setattr(verify_par, "PAR_MIN", 1 << 62 if request.param == "inline" else 0)


def _build(d: Path) -> list[dict[str, Any]]:
    """A registry of several sealed segments; its events."""
    reg = fleetclaims.Registry(d, durability="process")
    for i in range(200):
        c = reg.claim(f"t{i % 40}", owner=f"a{i % 3}", ttl=60)
        if c.token:
            reg.renew(c.task, token=c.token)
            reg.release(c.task, token=c.token)
    events = list(reg.store.iter_events(0))
    reg.close()
    assert len(segments.sealed(d)) >= 3
    return events


def _task_in_last_member(seg: segments.Segment) -> str:
    """A task whose lines in ``seg`` are all in its last gzip member (of several)."""
    index = json.loads(seg.index_path.read_bytes())
    last = len(index["blocks"]) - 1
    assert last >= 2
    return str(next(t for t, members in index["tasks"].items() if members == [last]))


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetclaims", "--dir", str(d), *args],
                          capture_output=True, text=True, check=False)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
            and p.name != "claims.lock"}


def test_verify_names_an_index_that_hides_a_task(tmp_path: Path, small: None) -> None:
    d = tmp_path / "r"
    events = _build(d)
    reg = fleetclaims.Registry(d)
    healthy = reg.verify()
    assert healthy.ok and healthy.index_problems == (), healthy  # (no false alarm)
    seg = segments.sealed(d)[1]
    index = json.loads(seg.index_path.read_bytes())
    task = next(iter(index["tasks"]))
    del index["tasks"][task]  # (the probe's edit: explain then said "never claimed")
    seg.index_path.write_text(json.dumps(index))
    before = _files(d)
    report = reg.verify()
    assert report.ok and report.events == healthy.events, report  # the chain itself is fine
    assert len(report.index_problems) == 1, report
    problem = report.index_problems[0]
    assert str(seg.index_path) in problem and repr(task) in problem and "delete it" in problem
    reg.close()
    shown = _cli(d, "audit", "verify")
    assert shown.returncode == EXIT_DAMAGED, shown.stdout + shown.stderr
    assert "STALE INDEX" in shown.stdout and str(seg.index_path) in shown.stdout, shown.stdout
    doc = json.loads(_cli(d, "--json", "audit", "verify").stdout)
    assert doc["ok"] is False and doc["index_problems"] == [problem], doc
    assert _files(d) == before  # verify changes nothing
    seg.index_path.unlink()  # what the message says to do
    reg = fleetclaims.Registry(d)
    assert reg.verify().index_problems == ()
    assert list(reg.store.task_events(task)) == [  # type: ignore[attr-defined]
        e for e in events if e.get("task") == task]
    reg.close()
    assert _cli(d, "audit", "verify").returncode == EXIT_OK


def _bad_indexes(index: dict[str, Any], task: str, size: int) -> dict[str, Any]:
    blocks = index["blocks"]
    gap = [list(b) for b in blocks]
    gap[-1][0] += 1  # the last member one byte late: a byte between members
    moved = [list(b) for b in blocks]
    moved[-2][1] += 1  # tiles the file, but the last member starts a byte into it
    moved[-1][0] += 1
    moved[-1][1] -= 1
    return {
        "negative length": {"blocks": [[0, -5]], "tasks": {task: [0]}, "merges": []},
        "task member out of range": {"blocks": [[0, 100]], "tasks": {task: [7]}, "merges": []},
        "wrong types": {"blocks": "x", "tasks": {task: "y"}},
        "bool member": {**index, "tasks": {**index["tasks"], task: [True]}},
        "members not contiguous": {**index, "blocks": gap},
        "a member boundary moved": {**index, "blocks": moved},
        "short of the file": {**index, "blocks": blocks[:-1]},
        # tiles the file, but is not one member: the task's later members were never read
        "one member for the file": {"blocks": [[0, size]], "tasks": {task: [0]}, "merges": []},
    }


@pytest.mark.parametrize("case", ["negative length", "task member out of range", "wrong types",
                                  "bool member", "members not contiguous",
                                  "a member boundary moved", "short of the file",
                                  "one member for the file"])
def test_an_index_that_does_not_fit_its_segment_is_not_used(tmp_path: Path, small: None,
                                                             case: str) -> None:
    d = tmp_path / "r"
    events = _build(d)
    seg = segments.sealed(d)[0]
    task = _task_in_last_member(seg)
    index = json.loads(seg.index_path.read_bytes())
    bad = _bad_indexes(index, task, seg.path.stat().st_size)[case]
    seg.index_path.write_text(json.dumps(bad))
    full = [e for e in events if e.get("task") == task]
    reg = fleetclaims.Registry(d)
    assert list(reg.store.task_events(task)) == full  # type: ignore[attr-defined]
    seqs = [e["seq"] for e in events]
    for after in (0, seg.first, (seg.first + seg.last) // 2, seg.last - 1):
        page = reg.events(after=after, limit=5)  # (paging finds its member through the index)
        assert [e.seq for e in page.events] == seqs[after:after + 5], (case, after)
    report = reg.verify()
    assert report.ok and len(report.index_problems) == 1, report
    assert str(seg.index_path) in report.index_problems[0]
    reg.close()
    if case == "negative length":  # the probe's internal error (exit 70)
        shown = _cli(d, "explain", task)
        assert shown.returncode == EXIT_OK and f"seq {full[0]['seq']}" in shown.stdout, (
            shown.stdout + shown.stderr)


def test_a_recompressed_segment_is_read_whole(tmp_path: Path, small: None) -> None:
    """``zcat | gzip -1`` (a backup tool, say): the same lines in other gzip members, its index
    left from before. explain said "gzip member at byte 0 damaged" while verify said ok."""
    d = tmp_path / "r"
    events = _build(d)
    seg = segments.sealed(d)[0]
    task = _task_in_last_member(seg)
    seg.path.write_bytes(gzip.compress(gzip.decompress(seg.path.read_bytes()), compresslevel=1))
    reg = fleetclaims.Registry(d)
    full = [e for e in events if e.get("task") == task]
    assert list(reg.store.task_events(task)) == full  # type: ignore[attr-defined]
    assert len(reg.explain(task).steps) == len(full)
    report = reg.verify()
    assert report.ok and len(report.index_problems) == 1, report
    assert "re-compressed" in report.index_problems[0]
    reg.close()
    shown = _cli(d, "explain", task)
    assert shown.returncode == EXIT_OK, shown.stdout + shown.stderr
