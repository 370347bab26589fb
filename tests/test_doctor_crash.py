"""doctor --fix is crash-safe (#16): killed at any step, the registry is the old or the new one,
never one that lost the snapshot's claims; doctor --fix run twice after the kill converges.

Oracle: every claim the snapshot held is there with its state, no fence is handed out twice,
and the original journal bytes are kept (in place or in quarantine/).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fc_support import journal_lines, quarantined, run_python

from fleetclaims import Registry
from fleetclaims.store.file import doctor
from fleetclaims.store.file.faults import CRASH_POINTS

pytestmark = pytest.mark.slow

N = 8


def _damaged(d: Path) -> tuple[dict[str, str], bytes]:
    """A registry whose snapshot is at the head and whose journal is broken in the middle."""
    reg = Registry(d)
    for i in range(N):
        c = reg.claim(f"t{i}", owner="a")
        if i % 2:
            reg.complete(c.task, token=c.token or "")
    reg.close()  # (claims.json at the head)
    expected = _all(Registry(d))
    lines, _ = journal_lines(d)
    raw = bytearray((d / "audit.jsonl").read_bytes())
    at = sum(len(x) + 1 for x in lines[:4]) + 20  # inside line 5
    raw[at] ^= 0x01
    (d / "audit.jsonl").write_bytes(bytes(raw))
    return expected, bytes(raw)


def _all(reg: Registry) -> dict[str, str]:
    return {c.task: c.state for c in reg.claims(include_expired=True, include_completed=True,
                                                include_released=True)}


def _kept(d: Path, original: bytes) -> bool:
    journal = (d / "audit.jsonl").read_bytes() if (d / "audit.jsonl").exists() else b""
    return journal.startswith(original.rstrip(b"\0")) or original in quarantined(d).values()


DOCTOR_POINTS = [p for p in CRASH_POINTS if p.startswith(("doctor.", "snapshot."))]


@pytest.mark.parametrize("point", DOCTOR_POINTS)
def test_doctor_fix_killed_at_any_step_loses_no_claim(tmp_path: Path, point: str) -> None:
    """Killed at ``point`` during doctor --fix: two more runs converge on a healthy registry
    with every claim of the snapshot, the original bytes kept, and fences above the old."""
    d = tmp_path / "r"
    expected, original = _damaged(d)
    code = ("import sys\nfrom fleetclaims.store.file import doctor\n"
            "doctor.check(sys.argv[1], fix=True)")
    done = run_python(code, str(d), env={"FLEETCLAIMS_CRASH_AT": point})
    assert done.returncode in (0, -9), done.stderr
    first = doctor.check(d, fix=True)
    second = doctor.check(d, fix=True)
    assert second.ok, (first.to_dict(), second.to_dict())
    assert doctor.check(d).ok
    reg = Registry(d)
    assert _all(reg) == expected
    assert _kept(d, original)
    assert reg.claim("new", owner="b").fence == N + 1
    reg.close()


def test_every_doctor_step_has_a_crash_point() -> None:
    """The steps of a repair are named crash points (the test above kills at each)."""
    assert {"doctor.after_copies", "doctor.before_switch", "doctor.after_switch",
            "doctor.after_repair"} <= set(DOCTOR_POINTS)
    assert os.environ.get("FLEETCLAIMS_CRASH_AT") is None
