"""Path reservations through the Registry, on every store (file, memory, PostgreSQL): claims
with paths, conflicts naming holder and patterns, reserve/unreserve, lapse with stale claims,
recover and handoff carrying them, reopening a registry, and the audit events."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclaims import Registry, ValidationError
from fleetclaims.core.errors import NotHolder, PathConflict
from fleetclaims.testing import FakeClock

pytestmark = pytest.mark.integration


def test_claims_with_disjoint_paths_coexist_and_overlapping_ones_are_refused(
        registry: Registry) -> None:
    """Disjoint exclusive paths coexist; an overlap is a PathConflict naming the holder, its
    task and both patterns; shared beside shared is fine, shared beside exclusive is not."""
    a = registry.claim("lexer", owner="alice", paths=["src/parser/**"], shared_paths=["docs"])
    registry.claim("cli", owner="bob", paths=["src/cli"], shared_paths=["docs/*.md"])
    assert a.paths == ("src/parser",) and a.shared_paths == ("docs",)
    with pytest.raises(PathConflict) as caught:
        registry.claim("refactor", owner="carol", paths=["src/parser/*.py"])
    err = caught.value
    assert (err.holder, err.holder_task, err.mine) == ("alice", "lexer", "src/parser/*.py")
    assert err.theirs == "src/parser"
    assert err.code == "conflict"
    with pytest.raises(PathConflict):
        registry.claim("docs", owner="carol", paths=["docs/readme.md"])
    assert registry.get("refactor") is None and registry.get("docs") is None


def test_reserve_and_unreserve_change_a_held_claim(registry: Registry) -> None:
    """reserve adds patterns (refused on overlap, nothing changed), unreserve drops them and
    frees them for others; both need the token; the audit records both."""
    a = registry.claim("a", owner="alice", paths=["lib"])
    assert a.token is not None
    b = registry.claim("b", owner="bob")
    assert b.token is not None
    assert registry.reserve("b", token=b.token, paths=["src"]).paths == ("src",)
    with pytest.raises(PathConflict):
        registry.reserve("a", token=a.token, paths=["src/x.py"])
    with pytest.raises(NotHolder):
        registry.reserve("a", token=b.token, paths=["tests"])
    assert registry.unreserve("b", token=b.token, paths=["src/"]).paths == ()
    assert registry.reserve("a", token=a.token, paths=["src/x.py"]).paths == ("lib", "src/x.py")
    kinds = [e.type for e in registry.events(limit=10_000).events]
    assert "paths_reserved" in kinds and "paths_released" in kinds
    with pytest.raises(ValidationError):
        registry.reserve("a", token=a.token, paths=["../etc"])


def test_reservations_lapse_with_a_stale_or_ended_claim(registry: Registry,
                                                        clock: FakeClock) -> None:
    """A released claim's paths are free at once; an expired lease's are free after it ends."""
    a = registry.claim("a", owner="alice", ttl=10, paths=["src"])
    assert a.token is not None
    registry.release("a", token=a.token)
    registry.claim("b", owner="bob", ttl=10, paths=["src"])
    clock.advance(11)
    registry.claim("c", owner="carol", paths=["src/x"])


def test_recover_and_handoff_carry_reservations(registry: Registry, clock: FakeClock) -> None:
    """A handoff and a recovery keep the claim's paths; a recovery is refused when someone
    reserved them after they lapsed."""
    a = registry.claim("a", owner="alice", ttl=10, paths=["src"], process=False)
    assert a.token is not None
    moved = registry.handoff("a", token=a.token, to_owner="bob", ttl=10)
    assert moved.paths == ("src",)
    clock.advance(11)
    assert registry.recover("a", owner="carol", reason="bob left").paths == ("src",)
    clock.advance(700)  # carol's lease (default ttl) runs out too
    registry.claim("z", owner="dave", paths=["src/y"])
    with pytest.raises(PathConflict):
        registry.recover("a", owner="erin", reason="carol left")


def test_reservations_survive_reopening(make_registry: Callable[[], Registry]) -> None:
    """A registry opened again decides on the reservations it stored."""
    first = make_registry()
    first.claim("a", owner="alice", paths=["src"])
    again = make_registry()
    claim = again.get("a")
    assert claim is not None and claim.paths == ("src",)
    with pytest.raises(PathConflict):
        again.claim("b", owner="bob", paths=["src/a.py"])


def test_cli_paths_claim_next_reserve_unreserve(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI: claim --paths/--shared (JSON carries them), claim-next --paths passes over
    nothing but is refused on overlap (exit 3), reserve/unreserve --all, bad patterns exit 2."""
    from test_cli import run_cli

    d = str(tmp_path / "r")
    code, out, _ = run_cli(["--dir", d, "--json", "claim", "a", "--owner", "x", "--paths",
                            "src/", "lib", "--shared", "docs"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["paths"] == ["src", "lib"] and doc["shared_paths"] == ["docs"]
    assert run_cli(["--dir", d, "add", "q1"], capsys)[0] == 0
    code, _, _ = run_cli(["--dir", d, "claim-next", "--owner", "y", "--paths", "src/a.py"],
                           capsys)
    assert code == 3  # the only ready task's paths overlap: nothing claimed
    code, out, _ = run_cli(["--dir", d, "--json", "claim-next", "--owner", "y", "--paths",
                            "tests"], capsys)
    assert code == 0 and json.loads(out)["paths"] == ["tests"]
    token = doc["token"]
    code, out, _ = run_cli(["--dir", d, "--json", "reserve", "a", "tools", "--token", token],
                           capsys)
    assert code == 0 and json.loads(out)["paths"] == ["src", "lib", "tools"]
    code, out, _ = run_cli(["--dir", d, "--json", "unreserve", "a", "--all", "--token", token],
                           capsys)
    assert code == 0 and json.loads(out)["paths"] == [] and json.loads(out)["shared_paths"] == []
    assert run_cli(["--dir", d, "unreserve", "a", "--token", token], capsys)[0] == 2
    for bad in ("../x", "/etc/passwd", "a\\b", "[ab]"):
        assert run_cli(["--dir", d, "reserve", "a", bad, "--token", token], capsys)[0] == 2
    code, out, _ = run_cli(["--dir", d, "claims"], capsys)
    assert "[paths: tests]" in out


def test_claim_next_names_the_path_conflict_that_stopped_it(tmp_path: Path) -> None:
    """Every ready task refused for the paths asked for: it said "nothing ready (2 ready)",
    naming neither the holder nor the pattern; it raises that PathConflict."""
    reg = Registry(tmp_path / "r")
    reg.add("q1")
    reg.add("q2")
    reg.claim("other", owner="z", paths=["src"])
    with pytest.raises(PathConflict) as info:
        reg.claim_next(owner="a", paths=["src/x"])
    assert info.value.holder == "z"
    assert reg.claim_next(owner="a", paths=["docs"]).task == "q1"  # type: ignore[union-attr]


def test_unreserving_a_pattern_the_claim_does_not_hold_is_refused(registry: Registry) -> None:
    """A typo in unreserve (a pattern the claim does not reserve) is a ValidationError naming
    what it does reserve, and changes nothing (it said "unreserved" with exit 0 while the
    reservation stayed)."""
    a = registry.claim("a", owner="alice", paths=["src/parser"], shared_paths=["docs"])
    assert a.token is not None
    before = registry.events(limit=10_000).events
    with pytest.raises(ValidationError, match=r"does not reserve src/parsr.*src/parser, docs"):
        registry.unreserve("a", token=a.token, paths=["src/parsr", "docs"])
    kept = registry.get("a")
    assert kept is not None and (kept.paths, kept.shared_paths) == (("src/parser",), ("docs",))
    assert registry.events(limit=10_000).events == before
    assert registry.unreserve("a", token=a.token, paths=["docs"]).shared_paths == ()
