"""Offline merges never take a fence back (README guarantee 5).

Two copies part; on one the holder releases and another owner is granted a higher fence, on
the other the holder only renews. The resolver keeps the earlier claim, whose fence was below
the one the other side handed out: the kept holder had fence 1, the superseded one fence 2.
Oracle: the kept claim's fence is above every fence either side handed out for the task (and
the registry's high-water), the same both ways, merging again changes nothing, the winner's
renewal returns the new fence, and the replay of each journal is its state.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fc_support import claims_view, replay, whole_journal

from fleetclaims import ClaimSuperseded, Registry
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.unit


def _parted(tmp_path: Path, clock: FakeClock) -> tuple[Registry, Registry, str]:
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    token = a.claim("c", owner="a", ttl=3600).token
    assert token is not None
    a.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    return (Registry(tmp_path / "a", clock=clock, prober=FakeProber()),
            Registry(tmp_path / "b", clock=clock, prober=FakeProber()), token)


@pytest.mark.parametrize("first", ["a", "b"])
@pytest.mark.parametrize("then", ["release", "handoff"])
def test_a_merge_never_takes_a_fence_back(tmp_path: Path, first: str, then: str) -> None:
    clock = FakeClock()
    a, b, token = _parted(tmp_path, clock)
    clock.advance(1)
    if then == "release":
        a.release("c", token=token)
        other = a.claim("c", owner="b", ttl=3600)
    else:
        other = a.handoff("c", token=token, to_owner="a2")
    assert other.fence == 2 and other.token
    b.renew("c", token=token)  # the holder only renews on its copy
    clock.advance(1)
    here, there = (a, b) if first == "a" else (b, a)
    plan = here.merge(tmp_path / ("b" if first == "a" else "a"))
    kept = here.get("c")
    assert kept is not None and kept.fence == 3 and kept.owner == "a", kept
    assert [(c.winner_fence, c.loser_fence) for c in plan.conflicts] == [(3, 2)]
    there.merge(tmp_path / first)
    mirrored = there.get("c")
    assert mirrored is not None and (mirrored.fence, mirrored.eid) == (kept.fence, kept.eid)
    assert here.merge(tmp_path / ("b" if first == "a" else "a")).events == ()
    assert there.merge(tmp_path / first).events == ()
    # A later renewal on one side is newer than the re-granted record: it arrives as such.
    clock.advance(1)
    there.renew("c", token=token, ttl=7200)
    here.merge(tmp_path / ("a" if there is a else "b"))
    assert here.get("c").ttl == 7200 and here.get("c").fence == 3  # type: ignore[union-attr]
    assert here.renew("c", token=token).fence == 3
    with pytest.raises(ClaimSuperseded):
        here.renew("c", token=other.token)
    assert here.claim("d", owner="z").fence == 4  # (the high-water is above it too)
    for reg, name in ((a, "a"), (b, "b")):
        reg.close()
        state = Registry(tmp_path / name, clock=clock, prober=FakeProber()).store.read()
        assert claims_view(replay(whole_journal(tmp_path / name))) == claims_view(state)
