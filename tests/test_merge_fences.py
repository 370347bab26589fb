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


@pytest.mark.parametrize("later", ["a", "b"])
def test_a_pair_merged_at_two_times_has_one_winner(tmp_path: Path, later: str) -> None:
    """The resolver reads no clock: A's 3 s lease and B's 10 min one, granted 0.2 s apart on
    parted copies, settle alike whether a side merges while A's lease runs or after it ended
    (it did not: the earlier merge kept ana, the later one bob, two live winners). ana's grant
    was live when bob's was made: she wins by the earlier claim time on both."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    a.claim("t", owner="ana", ttl=3)
    clock.advance(0.2)
    b.claim("t", owner="bob", ttl=600)
    for reg in (a, b):
        reg.close()
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    shutil.copytree(tmp_path / "b", tmp_path / "b-copy")
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    early, late = (b, a) if later == "a" else (a, b)
    early.merge(tmp_path / ("a-copy" if early is b else "b-copy"))
    clock.advance(4)  # ana's lease has ended
    late.merge(tmp_path / ("a-copy" if late is b else "b-copy"))
    got = {name: reg.get("t") for name, reg in (("a", a), ("b", b))}
    assert got["a"] is not None and got["b"] is not None
    assert (got["a"].owner, got["a"].fence) == (got["b"].owner, got["b"].fence) == ("ana", 2)
    # Both sides recorded ana's grant anew: merging them again is no conflict, and ana is not
    # superseded by herself (it was: a conflict "identical", her own token retired)
    again = early.merge(tmp_path / ("a" if early is b else "b"))
    assert again.conflicts == ()
    kept = early.get("t")
    assert kept is not None and kept.owner == "ana"
    assert kept.token_hash not in {r.token_hash for r in kept.retired}
    for reg in (a, b):
        reg.close()


def test_a_lease_ended_before_the_other_grant_is_stale_in_a_merge(tmp_path: Path) -> None:
    """Bob's grant came after ana's lease had ended (she did not renew): bob wins on both
    sides, by "not stale before stale", whenever they merge."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    a.claim("t", owner="ana", ttl=3)
    clock.advance(5)
    b.claim("t", owner="bob", ttl=600)
    plan = a.merge(tmp_path / "b")
    b.merge(tmp_path / "a")
    for reg in (a, b):
        got = reg.get("t")
        assert got is not None and got.owner == "bob"
    assert [c.rule for c in plan.conflicts] == ["not stale before stale"]
    for reg in (a, b):
        reg.close()


def test_a_release_of_a_grant_another_side_re_fenced_stays_released(tmp_path: Path) -> None:
    """A claims t; C claims it later apart and merges A: A's grant wins and is re-granted a
    higher fence there. A, not knowing, releases its grant; the two meet again. The release
    stands on both sides (C's re-fenced copy of that same grant won by "held before
    released": the task was held again, by a holder that had let it go, on every clone)."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    c = Registry(tmp_path / "c", clock=clock, prober=FakeProber())
    for i in range(3):  # (C's fence counter runs ahead: A's grant is re-fenced there)
        c.claim(f"pad{i}", owner="carl")
    token = a.claim("t", owner="ana", ttl=600).token
    assert token is not None
    clock.advance(0.2)
    c.claim("t", owner="carl", ttl=600)
    c.merge(tmp_path / "a")
    kept = c.get("t")
    assert kept is not None and kept.owner == "ana" and kept.live and kept.fence > 1
    assert a.release("t", token=token)
    a.merge(tmp_path / "c")
    c.merge(tmp_path / "a")
    for reg in (a, c):
        got = reg.get("t")
        assert got is not None and got.owner == "ana" and not got.live, got
        assert got.fence >= kept.fence  # (fences never go back)
    assert c.claim("t", owner="bob").fence > kept.fence  # free for the next holder
    assert a.merge(tmp_path / "c").conflicts == ()
