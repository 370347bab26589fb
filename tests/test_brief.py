"""fleetclaims brief: the current picture for an agent's context, as data and as text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.agents.brief import SHOWN, build, render
from fleetclaims.testing import FakeClock

pytestmark = pytest.mark.integration


def test_sections_renew_and_stale(file_registry: Registry, clock: FakeClock) -> None:
    """Mine (with RENEW NOW once under a third of the TTL is left), others', stale ones."""
    reg = file_registry
    reg.claim("mine-soon", owner="agent-a", ttl=90, process=False)
    clock.advance(65)  # 25 s of 90 left: under a third, renew now
    reg.claim("mine-fresh", owner="agent-a", ttl=600, note="parser", process=False)
    reg.claim("theirs", owner="agent-b", ttl=600, process=False)
    reg.claim("old", owner="agent-c", ttl=30, process=False)
    clock.advance(31)  # old's lease runs out; mine-soon's too (it becomes stale, still mine)
    reg.claim("late", owner="agent-b", ttl=600, process=False)
    doc = build(reg, "agent-a", clock.now().wall)

    mine = {e["task"]: e for e in doc["mine"]}
    assert set(mine) == {"mine-soon", "mine-fresh"}
    assert mine["mine-soon"]["stale"] == "lease expired"
    assert mine["mine-fresh"]["renew_now"] is False
    assert [e["task"] for e in doc["held_by_others"]] == ["late", "theirs"]
    assert [(e["task"], e["owner"]) for e in doc["stale"]] == [("old", "agent-c")]
    assert doc["commands"]["recover"] == "fleetclaims recover TASK --owner agent-a --reason '...'"

    text = render(doc)
    assert "You (agent-a) hold 2" in text
    assert 'mine-fresh (fence 2, working) expires in 9m' in text and '"parser"' in text
    assert "mine-soon (fence 1, working) STALE: lease expired" in text
    assert "Held by others - do not work on these:\n  late agent-b" in text
    assert "Stale - may be taken over with recover:\n  old agent-c" in text
    assert "fleetclaims claim TASK --owner agent-a --ttl 10m" in text


def test_renew_now_flag(file_registry: Registry, clock: FakeClock) -> None:
    """A lease with less than a third of its TTL left is flagged, in data and text."""
    file_registry.claim("t", owner="a", ttl=90, process=False)
    clock.advance(70)
    doc = build(file_registry, "a", clock.now().wall)
    assert doc["mine"][0]["renew_now"] is True and doc["mine"][0]["expires_in"] == 20
    assert "expires in 20s - RENEW NOW" in render(doc)


def test_long_lists_are_capped(file_registry: Registry, clock: FakeClock) -> None:
    """Each section lists at most SHOWN entries and counts the rest."""
    for i in range(SHOWN + 3):
        file_registry.claim(f"t{i:02d}", owner="b", ttl=600, process=False)
    text = render(build(file_registry, None, clock.now().wall))
    assert "... and 3 more (fleetclaims claims)" in text
    assert text.count(" b (fence ") == SHOWN
    assert "You (" not in text  # no owner given: no personal section


def run_brief(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "FLEETCLAIMS_OWNER"}
    full.update(env, FLEETCLAIMS_DIR=str(tmp_path / "reg"))
    return subprocess.run([sys.executable, "-m", "fleetclaims", "brief", *args],
                          capture_output=True, text=True, env=full, timeout=60, check=False)


@pytest.mark.slow
def test_cli_text_json_and_owner_from_environment(tmp_path: Path) -> None:
    """The command prints the text, or one JSON document with --json; FLEETCLAIMS_OWNER
    (exported by `fleetclaims run`) names the owner when --owner is absent."""
    empty = run_brief(tmp_path)
    assert empty.returncode == 0 and "No live claims: every task is free." in empty.stdout
    with Registry(tmp_path / "reg") as reg:
        reg.claim("issue-42", owner="agent-a", ttl=600, process=False)
    by_env = run_brief(tmp_path, FLEETCLAIMS_OWNER="agent-a")
    assert "You (agent-a) hold 1" in by_env.stdout and "issue-42 (fence 1" in by_env.stdout
    doc = json.loads(run_brief(tmp_path, "--owner", "agent-b", "--json").stdout)
    assert doc["owner"] == "agent-b" and doc["mine"] == []
    assert [e["task"] for e in doc["held_by_others"]] == ["issue-42"]


def test_time_left_is_told_by_the_clock_that_decides_expiry(file_registry: Registry,
                                                             clock: FakeClock) -> None:
    """A wall-clock step of an hour (NTP, a user) neither makes a live lease look over in the
    brief nor hides the time it has left: the boot clock that decides expiry tells it."""
    file_registry.claim("t", owner="a", ttl=90)
    clock.advance(30)
    clock.step_wall(3600)
    doc = build(file_registry, "a", clock.now().wall)
    entry = doc["mine"][0]
    assert entry["stale"] is None and entry["expires_in"] == 60
    clock.step_wall(-7200)  # (and back, to an hour before: not a longer lease either)
    assert build(file_registry, "a", clock.now().wall)["mine"][0]["expires_in"] == 60
