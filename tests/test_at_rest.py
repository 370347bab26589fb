"""The registry at rest (#15): plain files after close, idle and a crash; refusals coalesced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fleetclaims
from fleetclaims import ClaimConflict, Registry
from fleetclaims.store.file import rest
from fleetclaims.testing import FakeClock

pytestmark = pytest.mark.integration


def _plain(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert b"\0" not in data and data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_close_leaves_plain_jsonl_and_claims_json_at_head(tmp_path: Path) -> None:
    """After busy writes and close(): no NUL padding, claims.json exists and is at the head."""
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(30):
        reg.claim(f"t{i}", owner="a", ttl=60)
    assert b"\0" in (d / "audit.jsonl").read_bytes()  # busy: padded ahead
    reg.close()
    events = _plain(d / "audit.jsonl")
    snap = json.loads((d / "claims.json").read_bytes())
    assert snap["seq"] == events[-1]["seq"]
    entry = snap["claims"]["t3"]  # what a person reads with jq: owner, phase, expiry, fence
    assert (entry["owner"], entry["phase"], entry["fence"]) == ("a", "working", 4)
    assert entry["expires_at"] > 0


@pytest.mark.slow
def test_idle_process_settles_within_a_second(tmp_path: Path) -> None:
    """A long-lived handle that stops writing trims its padding and checkpoints by itself."""
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(20):
        reg.claim(f"t{i}", owner="a", ttl=60)
    deadline = time.monotonic() + 5

    def at_rest() -> bool:
        data = (d / "audit.jsonl").read_bytes()
        snap = d / "claims.json"
        return b"\0" not in data and snap.exists() and json.loads(snap.read_bytes())[
            "seq"] == json.loads(data.splitlines()[-1])["seq"]

    while not at_rest() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert at_rest()
    reg.claim("later", owner="a", ttl=60)  # and it keeps working afterwards
    reg.close()
    assert _plain(d / "audit.jsonl")[-1]["task"] == "later"


def test_next_opener_trims_what_a_killed_writer_left(tmp_path: Path) -> None:
    """A writer killed while padded leaves NULs; the next writer removes them (under the lock)."""
    d = tmp_path / "r"
    code = (f"import os, fleetclaims\nr = fleetclaims.Registry({str(d)!r})\n"
            "for i in range(20): r.claim(f't{i}', owner='a', ttl=60)\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (d / "audit.jsonl").read_bytes().endswith(b"\0")
    reg = Registry(d)
    reg.claim("next", owner="b", ttl=60)
    assert b"\0" not in (d / "audit.jsonl").read_bytes()
    reg.close()
    assert len(_plain(d / "audit.jsonl")) == 22


def test_trim_spares_padding_another_live_writer_uses(tmp_path: Path) -> None:
    """Padding shared by a live handle is left alone; the last one to settle removes it."""
    d = tmp_path / "r"
    busy, quiet = Registry(d), Registry(d)
    for i in range(10):
        busy.claim(f"t{i}", owner="a", ttl=60)
    quiet.claim("q", owner="b", ttl=60)
    quiet.close()
    assert (d / "audit.jsonl").read_bytes().endswith(b"\0")
    busy.close()
    assert len(_plain(d / "audit.jsonl")) == 12


@pytest.mark.slow
def test_cli_command_leaves_the_registry_at_rest(tmp_path: Path) -> None:
    """A CLI claim on a fresh registry leaves claims.json and a plain log."""
    d = tmp_path / "r"
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    for task in ("a", "b"):
        subprocess.run([sys.executable, "-m", "fleetclaims", "claim", task, "--owner", "o"],
                       env=env, check=True, capture_output=True, timeout=60)
    events = _plain(d / "audit.jsonl")
    time.sleep(rest.IDLE)
    assert json.loads((d / "claims.json").read_bytes())["seq"] == events[-1]["seq"]


def test_repeated_refusals_coalesce_into_one_line(tmp_path: Path) -> None:
    """100 refusals of one requester by one holder: two lines, the second with count/first/last;
    'who asked for X while Y held it' is still answered."""
    clock = FakeClock()
    d = tmp_path / "r"
    reg = Registry(d, clock=clock)
    reg.claim("x", owner="holder", ttl=3600)
    for _ in range(100):
        clock.advance(0.1)
        with pytest.raises(ClaimConflict):
            reg.claim("x", owner="poller", ttl=60)
    reg.close()
    refusals = [e for e in _plain(d / "audit.jsonl") if e["type"] == "claim_rejected"]
    assert len(refusals) == 2
    assert refusals[0]["owner"] == "poller" and refusals[0]["holder"] == "holder"
    assert refusals[1]["count"] == 99 and refusals[1]["last"] > refusals[1]["first"]
    # the review counts what the lines stand for
    from fleetclaims.review import facts

    events = _plain(d / "audit.jsonl")
    poller = [o for o in facts.owner_summary(events) if o.owner == "poller"]
    assert poller and poller[0].rejected == 100
    assert [w.refusals for w in facts.waits(events) if w.task == "x"] == [100]


@pytest.mark.slow
def test_four_pollers_for_a_minute_add_under_100kb(tmp_path: Path) -> None:
    """Scaled time: 4 pollers refused every 10 ms for 60 s add < 100 KB to the journal."""
    clock = FakeClock()
    d = tmp_path / "r"
    reg = Registry(d, clock=clock)
    reg.claim("x", owner="holder", ttl=3600)
    before = (d / "audit.jsonl").stat().st_size
    pollers = [Registry(d, clock=clock) for _ in range(4)]
    for _ in range(6000):
        clock.advance(0.01)
        for i, p in enumerate(pollers):
            with pytest.raises(ClaimConflict):
                p.claim("x", owner=f"p{i}", ttl=60)
    for p in pollers:
        p.close()
    reg.close()
    assert len(_plain(d / "audit.jsonl")) and (d / "audit.jsonl").stat().st_size - before < 100_000
    assert fleetclaims.Registry(d).verify().ok


@pytest.mark.slow
def test_an_hour_of_renewals_stays_under_a_megabyte(tmp_path: Path) -> None:
    """Scaled time: a holder renewing every second for an hour adds < 1 MB."""
    clock = FakeClock()
    d = tmp_path / "r"
    reg = Registry(d, clock=clock)
    lease = reg.claim("x", owner="holder", ttl=3600)
    reg.close()
    reg = Registry(d, clock=clock)
    before = (d / "audit.jsonl").stat().st_size
    for _ in range(3600):
        clock.advance(1)
        reg.renew("x", token=lease.token or "", ttl=60)
    reg.close()
    assert (d / "audit.jsonl").stat().st_size - before < 1_000_000
    assert fleetclaims.Registry(d).verify().ok


@pytest.mark.parametrize("chunk", [40, 1 << 20])
def test_task_events_match_the_full_read(tmp_path: Path, chunk: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """explain's quick path (a bytes search over chunks of whole lines, tiny chunks too) yields
    exactly the events the full read yields for a task, not a task named in metadata."""
    from fleetclaims.store.file import reader

    monkeypatch.setattr(reader, "CHUNK", chunk)
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(5):
        c = reg.claim(f"t{i}", owner="a", ttl=60, metadata={"task": "t1"})
        reg.complete(c.task, token=c.token or "")
    reg.reopen("t1", reason="again", actor="a")
    reg.claim("t1", owner="b", ttl=60)
    store = reg.store
    full = [e for e in store.iter_events(0) if e.get("task") == "t1"]
    assert list(store.task_events("t1")) == full and len(full) == 4  # type: ignore[attr-defined]
    assert reg.explain("t1").holder == "b"
    reg.close()


def test_task_events_refuse_a_tampered_line(tmp_path: Path) -> None:
    """A line of the task whose seal fails is AuditCorrupt, not silently explained."""
    from fleetclaims import AuditCorrupt

    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("t1", owner="a", ttl=60)
    reg.close()
    path = d / "audit.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"owner":"a"', b'"owner":"z"'))
    with pytest.raises(AuditCorrupt):
        list(Registry(d).store.task_events("t1"))  # type: ignore[attr-defined]


def test_a_checkpoint_that_keeps_failing_is_told_once(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A snapshot that cannot be written (a full disk) is logged once, not at every operation
    that retries it; a different failure is told again."""
    import errno
    import logging

    from fleetclaims.store.file import store as file_store_module

    reg = Registry(tmp_path / "r")
    reg.claim("t", owner="a")

    def full(*args: object, **kwargs: object) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_store_module, "write_snapshot", full)
    store = reg.store
    with caplog.at_level(logging.WARNING, logger="fleetclaims"):
        for _ in range(3):
            store.checkpoint()  # type: ignore[attr-defined]
        assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1

        def other(*args: object, **kwargs: object) -> bool:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(file_store_module, "write_snapshot", other)
        store.checkpoint()  # type: ignore[attr-defined]
        assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 2
    monkeypatch.undo()
    reg.close()
