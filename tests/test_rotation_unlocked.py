"""A rotation writes no snapshot under the lock (#21): the snapshot at the sealed head is
written by a forked child, and a later operation switches the journal, carrying over the lines
appended meanwhile; an unlocked checkpoint of the old journal taken by another handle does not
land after the switch.

Oracles: which process encoded the rotation's snapshot; the whole journal (segments, then the
active journal) is one chain from seq 1 that replays to each handle's state; claims.json after
the other handle's stale checkpoint is still the rotation's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fc_support import claims_view, replay, whole_journal

import fleetclaims
from fleetclaims.store.file import preseal, rest, rotation, segments, snapshot
from fleetclaims.store.file.snapshot import encode_snapshot

pytestmark = pytest.mark.integration


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 16_000)
    monkeypatch.setattr(segments, "BLOCK", 2_000)
    monkeypatch.setattr(preseal, "ENABLED", False)
    monkeypatch.delenv("FLEETCLAIMS_NO_FORK", raising=False)
    encodes: list[int] = []
    real = encode_snapshot

    def counted(state: Any, offset: int) -> bytes:
        encodes.append(os.getpid())  # (a child's append stays in the child)
        return real(state, offset)

    monkeypatch.setattr(rotation, "encode_snapshot", counted)
    return encodes


def _rotating(reg: fleetclaims.Registry) -> bool:
    """Whether ``reg``'s rotation is under way: its child packs the lines and writes the
    snapshot; the segment is installed and the journal switched once it is done."""
    return rotation._PENDING.get(reg.store) is not None  # type: ignore[call-overload]


def _first_seq(d: Path) -> int:
    return int(json.loads((d / "audit.jsonl").read_bytes().split(b"\n", 1)[0])["seq"])


def test_the_rotation_snapshot_is_written_by_a_child(tmp_path: Path, small: list[int]) -> None:
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    n = 0
    while not _rotating(reg):
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
    assert small == []  # the writer encoded nothing under the lock
    assert _first_seq(d) == 1  # not switched yet: the child writes the snapshot
    assert not segments.sealed(d)  # nor sealed: the child packs the lines too
    deadline = time.monotonic() + 20
    while _first_seq(d) == 1 and time.monotonic() < deadline:
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
        time.sleep(0.01)
    # Switched: the segment is in place, the new journal starts right after the sealed head,
    # claims.json is there.
    sealed = segments.sealed(d)[-1]
    assert _first_seq(d) == sealed.last + 1
    snap = snapshot.read_snapshot(d / "claims.json")[0]
    assert snap is not None and snap.offset == 0 and snap.state.seq == sealed.last
    assert not [p for p in os.listdir(d) if p.startswith(rotation.SIDE_PREFIX)]
    assert small == []
    lines = whole_journal(d)
    assert [json.loads(x)["seq"] for x in lines] == list(range(1, len(lines) + 1))
    fresh = fleetclaims.Registry(d)
    assert fresh.verify().ok
    assert claims_view(fresh.store.read()) == claims_view(replay(lines))
    assert claims_view(reg.store.read()) == claims_view(replay(lines))
    fresh.close()
    reg.close()


def test_a_stale_unlocked_checkpoint_does_not_land_after_a_switch(
        tmp_path: Path, small: list[int]) -> None:
    d = tmp_path / "r"
    a = fleetclaims.Registry(d, durability="process")
    b = fleetclaims.Registry(d, durability="process")
    a.claim("a0", owner="a", ttl=60)
    n = 0
    while not _rotating(b):
        n += 1
        b.claim(f"b{n}", owner="b", ttl=60)
    a.claim("a1", owner="a", ttl=60)  # A's state is past the sealed head, in the old journal
    deadline = time.monotonic() + 20
    while _first_seq(d) == 1 and time.monotonic() < deadline:
        n += 1
        b.claim(f"b{n}", owner="b", ttl=60)
        time.sleep(0.01)
    assert _first_seq(d) > 1
    before = (d / "claims.json").read_bytes()
    store = a.store
    assert store._offset > store._snap_offset  # type: ignore[attr-defined]
    store._checkpoint(unlocked=True)  # type: ignore[attr-defined]  # of the old journal
    assert (d / "claims.json").read_bytes() == before
    fresh = fleetclaims.Registry(d)
    assert fresh.verify().ok and fresh.get("a1") is not None
    lines = whole_journal(d)
    assert claims_view(fresh.store.read()) == claims_view(replay(lines))
    assert claims_view(a.store.read()) == claims_view(replay(lines))
    for reg in (fresh, a, b):
        reg.close()


def test_no_fork_rotates_under_the_lock_as_before(tmp_path: Path, small: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCLAIMS_NO_FORK", "1")
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    n = 0
    while not segments.sealed(d):
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
    assert small == [os.getpid()]
    assert _first_seq(d) == segments.sealed(d)[-1].last + 1 or (
        (d / "audit.jsonl").read_bytes().rstrip(b"\0") == b"")
    assert rest.fork_safe() is not None
    reg.close()


@pytest.mark.slow
def test_a_large_remainder_is_sealed_by_a_helper_too(tmp_path: Path, small: list[int],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines written while a helper sealed the bulk are sealed by a second helper when
    they are many (RESEAL_MIN), not by the writer under the lock; only what follows the
    second is sealed by the writer; the rotation finishes."""
    monkeypatch.setattr(preseal, "ENABLED", True)
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 64_000)
    monkeypatch.setattr(rotation, "RESEAL_MIN", 1000)
    inline: list[int] = []
    real = segments.seal

    def counted(directory: Path, data: bytes, first: int, last: int, **kw: Any) -> Any:
        inline.append(first)
        return real(directory, data, first, last, **kw)

    monkeypatch.setattr(segments, "seal", counted)
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    reg.claim("x0", owner="o", ttl=60)
    n = 0
    deadline = time.monotonic() + 60
    while _first_seq(d) == 1 and time.monotonic() < deadline:
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
        time.sleep(0.005)
    sealed = segments.sealed(d)
    assert _first_seq(d) == sealed[-1].last + 1 and len(sealed) >= 2, sealed
    assert sealed[0].first == 1 and sealed[0].first not in inline  # the bulk: a helper
    assert sealed[1].first not in inline, (sealed, inline)  # the remainder: a second one
    lines = whole_journal(d)
    assert [json.loads(x)["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert claims_view(reg.store.read()) == claims_view(replay(lines))
    reg.close()


@pytest.mark.slow
def test_the_idle_keeper_finishes_a_rotation(tmp_path: Path, small: list[int],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that stops right after sealing has its rotation finished at rest (the idle
    keeper's settle, which does not wait), without another operation."""
    d = tmp_path / "r"
    reg = fleetclaims.Registry(d, durability="process")
    n = 0
    while not _rotating(reg):
        n += 1
        reg.claim(f"x{n}", owner="o", ttl=60)
    assert _first_seq(d) == 1
    deadline = time.monotonic() + 20
    while _first_seq(d) == 1 and time.monotonic() < deadline:
        time.sleep(0.2)  # (the keeper settles IDLE s after the last write)
    assert _first_seq(d) == segments.sealed(d)[-1].last + 1
    lines = whole_journal(d)
    assert [json.loads(x)["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert claims_view(reg.store.read()) == claims_view(replay(lines))
    reg.close()


_ROTATOR = r"""
import os, sys, time
from pathlib import Path
os.environ.pop("FLEETCLAIMS_NO_FORK", None)
from fleetclaims.store.file import preseal, rotation, segments
segments.SEGMENT_BYTES = 16_000
segments.BLOCK = 2_000
preseal.ENABLED = False
import fleetclaims
d, flags = Path(sys.argv[1]), Path(sys.argv[2])
reg = fleetclaims.Registry(d, durability="process")
n = 0
while rotation._PENDING.get(reg.store) is None:  # sealed; its child writes the snapshot
    n += 1
    reg.claim(f"b{n}", owner="b", ttl=60)
(flags / "ready").touch()
while not (flags / "go").exists():
    time.sleep(0.005)
first = lambda: int((d / "audit.jsonl").read_bytes().split(b'"seq":', 1)[1].split(b",", 1)[0])
deadline = time.monotonic() + 30
while first() == 1 and time.monotonic() < deadline:
    n += 1
    reg.claim(f"b{n}", owner="b", ttl=60)
    time.sleep(0.01)
segments.SEGMENT_BYTES = 1 << 30  # the new journal grows past the old one's offsets
while (d / "audit.jsonl").stat().st_size < 60_000:
    n += 1
    reg.claim(f"b{n}", owner="b", ttl=60)
(flags / "done").touch()
os._exit(0)  # (killed: nothing of its own left at rest over what it found)
"""


def test_a_rotation_cannot_switch_between_an_unlocked_checkpoints_check_and_rename(
        tmp_path: Path) -> None:
    """The race the directory flock closes (lock.swapping): another process's rotation replaced
    claims.json and the journal after this checkpoint checked that its journal was still the
    active one and before it renamed, so a snapshot of the old journal landed on the new one
    and the next writer quarantined it (registry_rebuilt). Here the checkpoint stops between
    its check and its rename while the other process rotates: the rotation waits for the
    rename (or leaves the switch for its next operation), and every file at rest fits."""
    import subprocess
    import sys

    from fleetclaims.store.file import faults

    d, flags = tmp_path / "r", tmp_path / "flags"
    flags.mkdir()
    a = fleetclaims.Registry(d, durability="process")
    a.claim("a0", owner="a", ttl=60)
    rotator = subprocess.Popen([sys.executable, "-c", _ROTATOR, str(d), str(flags)])
    try:
        deadline = time.monotonic() + 30
        while not (flags / "ready").exists() and time.monotonic() < deadline:
            assert rotator.poll() is None
            time.sleep(0.01)
        a.claim("a1", owner="a", ttl=60)  # A's state: past the sealed head, in the old journal
        store = a.store
        assert store._offset > store._snap_offset  # type: ignore[attr-defined]

        def hook(name: str) -> None:
            if name == "snapshot.before_rename":
                (flags / "go").touch()
                until = time.monotonic() + 4  # (the rotation finishes meanwhile, unless held)
                while not (flags / "done").exists() and time.monotonic() < until:
                    time.sleep(0.01)

        faults.set_crash_hook(hook)
        try:
            store._checkpoint(unlocked=True)  # type: ignore[attr-defined]
        finally:
            faults.set_crash_hook(None)
        assert (flags / "go").exists()  # (it did stop between its check and its rename)
        assert rotator.wait(timeout=60) == 0
    finally:
        if rotator.poll() is None:
            rotator.kill()
    assert _first_seq(d) > 1  # switched
    fresh = fleetclaims.Registry(d)
    fresh.claim("after", owner="c", ttl=60)  # a writer loads what is at rest
    assert fresh.verify().ok and fresh.get("a1") is not None
    lines = whole_journal(d)
    assert b"registry_rebuilt" not in b"".join(lines)
    assert claims_view(fresh.store.read()) == claims_view(replay(lines))
    assert fresh.store.damage is None  # type: ignore[attr-defined]
    assert not (d / "quarantine").exists(), os.listdir(d / "quarantine")
    fresh.close()
    a.close()
