"""Sealed history and foreign files that doctor must not adopt (a probe's findings).

Oracles: another registry's claims.json never gives its claims to this registry (doctor names it
and quarantines it); a sealed segment that does not chain into the journal (edited and re-sealed,
another registry's, swapped, missing) is sealed-history damage: doctor --fix refuses to rewrite
it and leaves audit.jsonl as it is; explain, audit --task and events fail with SegmentDamaged
(exit 5) rather than tell a shorter or different history; the advice given for it is what works
(restore the segment), never `doctor --fix`.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.core.errors import SegmentDamaged
from fleetclaims.store.file import preseal, segments, verify_par

pytestmark = pytest.mark.integration


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4_000)
    monkeypatch.setattr(segments, "BLOCK", 1_000)
    monkeypatch.setattr(preseal, "ENABLED", False)
    monkeypatch.setattr(verify_par, "PAR_MIN", 1 << 62)


def _sealed_registry(d: Path, n: int = 40) -> list[segments.Segment]:
    """A registry of n claims t-0..t-{n-1} by agent-a, with sealed segments and a few lines in
    audit.jsonl (closed: checkpointed and anchored)."""
    reg = Registry(d)
    for i in range(n):
        reg.claim(f"t-{i}", owner="agent-a")
    reg.close()
    size = segments.SEGMENT_BYTES
    segments.SEGMENT_BYTES = 1 << 30  # (no rotation at this close: lines stay active)
    try:
        reg = Registry(d)
        reg.claim("u-0", owner="agent-a")
        reg.close()
    finally:
        segments.SEGMENT_BYTES = size
    sealed = segments.sealed(d)
    assert len(sealed) >= 2 and (d / "audit.jsonl").stat().st_size > 0
    return sealed


def _lines(seg: segments.Segment) -> list[bytes]:
    return gzip.decompress(seg.path.read_bytes()).splitlines()


def _write(seg: segments.Segment, lines: list[bytes]) -> None:
    seg.path.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines)))
    seg.index_path.unlink(missing_ok=True)  # (derived: the file is read)


# --- 3: reads of a task or of events over missing or damaged sealed history --------------------


@pytest.mark.parametrize("damage", ["edited", "swapped", "wiped", "archived_json_gone"])
def test_task_reads_fail_on_damaged_sealed_history(tmp_path: Path, small: None,
                                                   damage: str) -> None:
    d = tmp_path / "r"
    sealed = _sealed_registry(d)
    if damage == "edited":  # one line changed, not re-sealed
        lines = [line.replace(b'"owner":"agent-a"', b'"owner":"mallory"')
                 if b'"t-3"' in line else line for line in _lines(sealed[0])]
        _write(sealed[0], lines)
    elif damage == "swapped":
        one, two = sealed[0].path.read_bytes(), sealed[1].path.read_bytes()
        sealed[0].path.write_bytes(two)
        sealed[1].path.write_bytes(one)
        for seg in sealed[:2]:
            seg.index_path.unlink()
    elif damage == "wiped":
        for seg in sealed:
            seg.path.unlink()
            seg.index_path.unlink()
    else:
        assert _cli(d, "audit", "archive", "--before", "0s").returncode == 0
        (d / "segments" / "archived.json").unlink()
    reg = Registry(d)
    with pytest.raises(SegmentDamaged):
        reg.explain("t-3")
    with pytest.raises(SegmentDamaged):
        reg.events(task="t-3")
    if damage in ("wiped", "archived_json_gone"):
        with pytest.raises(SegmentDamaged, match="missing"):
            reg.events(limit=2)
    reg.close()
    for args in (("explain", "t-3"), ("audit", "--task", "t-3")):
        done = _cli(d, *args)
        assert done.returncode == 5, (args, done.stdout, done.stderr)
        assert "never claimed" not in done.stdout


