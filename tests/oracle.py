"""An audit oracle: replay a journal independently of the store and check its invariants."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetclaims.core import events as ev

GRANTS = {"claim_created", "claim_recovered", "claim_preempted", "claim_handed_off"}
ENDS = {"claim_released", "claim_released_forced", "claim_completed"}
# Events that stand for an acknowledged client operation (bookkeeping excluded).
OPERATIONS = GRANTS | ENDS | {"lease_renewed", "claim_rejected", "claim_reopened",
                              "phase_changed", "lease_expired"}


@dataclass
class OracleReport:
    events: list[dict[str, Any]]
    grants: int = 0
    holders: dict[str, tuple[str, int] | None] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)


def read_journal(directory: Path) -> list[dict[str, Any]]:
    # The data ends at the first NUL byte: the rest is preallocated space.
    lines = (directory / "audit.jsonl").read_bytes().split(b"\0", 1)[0].split(b"\n")
    assert lines[-1] == b"", "journal ends with an incomplete line"
    return [json.loads(line) for line in lines[:-1]]


def _filled(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events with a compact renewal's holder (owner, fence) filled in from the events
    before it (events.fill_renewal): it renews whoever holds the task."""
    holders: dict[str, tuple[Any, Any]] = {}
    return [ev.fill_renewal(e, holders) for e in events]


def check(events: list[dict[str, Any]]) -> OracleReport:
    """No two live holders of a task at any seq, fences strictly increasing, seq contiguous,
    each event's prev is the hash of the one before."""
    report = OracleReport(events)
    events = _filled(events)
    last_fence = 0
    prev = "0" * 64
    for index, e in enumerate(events, start=1):
        assert e["seq"] == index, f"seq gap or reorder at {index}: {e['seq']}"
        assert e["prev"] == prev, f"broken chain at seq {index}"
        prev = e["hash"]
        kind, task = e["type"], e.get("task", "")
        if e.get("imported"):
            continue
        if kind in GRANTS:
            holder = report.holders.get(task)
            if kind == "claim_created":
                assert holder is None, f"seq {index}: {task} granted to {e['owner']} while " \
                                       f"{holder} holds it"
            else:
                assert holder is not None and holder[1] == e["prev_fence"], (
                    f"seq {index}: {kind} of {task} does not name the current holder {holder}")
            assert e["fence"] > last_fence, f"seq {index}: fence {e['fence']} not increasing"
            last_fence = e["fence"]
            report.grants += 1
            report.holders[task] = (e["owner"], e["fence"])
        elif kind in ENDS or kind == "lease_expired":
            holder = report.holders.get(task)
            assert holder is not None and holder[1] == e["fence"], (
                f"seq {index}: {kind} of {task} fence {e['fence']} but holder is {holder}")
            if kind == "claim_completed":
                report.completed[task] = report.completed.get(task, 0) + 1
            if kind != "lease_expired":
                report.holders[task] = None
        elif kind == "lease_renewed":
            holder = report.holders.get(task)
            assert holder is not None and holder[1] == e["fence"], (
                f"seq {index}: renew of non-holder")
    return report


def operations(events: list[dict[str, Any]]) -> list[tuple[str, str, str, int]]:
    """(type, task, owner, fence) of every event that stands for a client operation (a
    coalesced refusal line stands for ``count`` refusals)."""
    return sorted(
        (e["type"], e["task"], e["owner"], e["fence"])
        for e in _filled(events)
        if e["type"] in OPERATIONS and not e.get("imported")
        for _ in range(e.get("count", 1))
    )
