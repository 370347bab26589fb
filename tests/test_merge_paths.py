"""Path reservations granted on two registries apart meet in a merge (or a git sync): each
side refused an overlapping reservation of a live claim, but apart both could grant one. The
merge settles each such pair like duplicate claims (stale at the other's grant loses, then the
resolver order); the loser keeps its claim without the overlapping patterns.

Oracle: after merging both ways, both sides hold the same records, exactly one claim reserves
the contested files, a third party's overlapping claim is refused on both sides naming the
winner, the merge names what the loser lost, and merging again changes nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetclaims import PathConflict, Registry
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.unit


def _apart(tmp_path: Path, clock: FakeClock, ana: dict[str, object], bob: dict[str, object],
           gap: float = 0.2) -> tuple[Registry, Registry]:
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    a.claim("lexer", owner="ana", ttl=600, **ana)  # type: ignore[arg-type]
    clock.advance(gap)
    b.claim("refactor", owner="bob", ttl=600, **bob)  # type: ignore[arg-type]
    return a, b


def _view(reg: Registry) -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return {c.task: (c.owner, c.paths, c.shared_paths) for c in reg.claims()}


@pytest.mark.parametrize("first", ["a", "b"])
def test_overlapping_reservations_granted_apart_are_settled_alike(tmp_path: Path,
                                                                  first: str) -> None:
    clock = FakeClock()
    a, b = _apart(tmp_path, clock, {"paths": ["src/parser"]}, {"paths": ["src/parser/*.py",
                                                                          "src/cli"]})
    here, there = (a, b) if first == "a" else (b, a)
    plan = here.merge(tmp_path / ("b" if first == "a" else "a"))
    [found] = plan.path_conflicts
    assert (found.winner_task, found.loser_task, found.dropped) == (
        "lexer", "refactor", ("src/parser/*.py",))
    assert found.rule == "earlier claim time"
    there.merge(tmp_path / first)
    assert _view(a) == _view(b) == {
        "lexer": ("ana", ("src/parser",), ()),
        "refactor": ("bob", ("src/cli",), ()),  # keeps what did not overlap
    }
    assert a.merge(tmp_path / "b").events == () and b.merge(tmp_path / "a").events == ()
    for reg in (a, b):
        with pytest.raises(PathConflict) as info:
            reg.claim("other", owner="carl", paths=["src/parser/lexer.py"])
        assert info.value.holder == "ana"
        with pytest.raises(PathConflict) as info:
            reg.claim("cli2", owner="carl", paths=["src/cli/x.py"])
        assert info.value.holder == "bob"
    for reg in (a, b):
        reg.close()


def test_a_reservation_whose_lease_had_ended_is_not_settled(tmp_path: Path) -> None:
    """ana's lease had ended when bob reserved: her reservation had lapsed, nothing to take."""
    clock = FakeClock()
    a, b = _apart(tmp_path, clock, {"paths": ["src"]}, {"paths": ["src/x"]}, gap=700)
    before = (_view(a), _view(b))
    assert a.merge(tmp_path / "b").path_conflicts == ()
    assert b.merge(tmp_path / "a").path_conflicts == ()
    assert _view(a) == _view(b) == {**before[0], **before[1]}


def test_shared_reservations_do_not_conflict_but_shared_against_exclusive_does(
        tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = _apart(tmp_path, clock, {"shared_paths": ["docs"]}, {"shared_paths": ["docs/a.md"]})
    assert a.merge(tmp_path / "b").path_conflicts == ()
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "b")
    a, b = _apart(tmp_path, clock, {"shared_paths": ["docs"]}, {"paths": ["docs/a.md"]})
    [found] = b.merge(tmp_path / "a").path_conflicts
    # bob's exclusive pattern loses to ana's earlier shared one
    assert (found.winner_task, found.loser_task, found.dropped) == ("lexer", "refactor",
                                                                    ("docs/a.md",))


def test_the_cli_merge_names_what_the_loser_lost(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fleetclaims.cli import main

    clock = FakeClock()
    for tag in ("human", "json"):
        a, b = _apart(tmp_path / tag, clock, {"paths": ["src/parser"]},
                      {"paths": ["src/parser/*.py"]})
        a.close()
        b.close()
    assert main(["--dir", str(tmp_path / "human" / "b"), "merge",
                 str(tmp_path / "human" / "a")]) == 0
    out = capsys.readouterr().out
    assert "refactor: bob no longer reserves src/parser/*.py" in out and "'lexer'" in out
    assert main(["--dir", str(tmp_path / "json" / "a"), "merge", str(tmp_path / "json" / "b"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path_conflicts"][0]["dropped"] == ["src/parser/*.py"]
