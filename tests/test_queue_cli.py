"""The work queue from the command line, and its place in the audit report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import cli, run_cli

from fleetclaims import Registry
from fleetclaims.core.queue import queue_times
from fleetclaims.review.report import render_html

pytestmark = pytest.mark.integration


def test_queue_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "r")

    def fc(*args: str) -> tuple[int, str, str]:
        return run_cli([*args, "--dir", d], capsys)

    assert fc("add", "docs", "--label", "docs", "--priority", "10")[1].startswith("added docs")
    assert fc("add", "docs", "--label", "docs", "--priority", "10")[1].startswith("unchanged")
    assert fc("add", "docs", "--label", "docs", "--priority", "5")[1].startswith("updated")
    assert fc("add", "release", "--after", "docs", "--after", "tests")[0] == 0
    assert fc("add", "tests")[0] == 0
    code, out, err = fc("depend", "docs", "--on", "release")
    assert code == 2 and "docs -> release -> docs" in err
    code, out, _ = fc("block", "tests", "--reason", "CI is down")
    assert code == 0 and "blocked tests" in out
    code, out, _ = fc("list", "--tasks")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["docs", "READY"]
    assert "waits for docs, tests" in out and "blocked: CI is down" in out
    assert lines[-1] == "queue: 1 ready, 0 held, 1 pending, 1 blocked, 0 completed"
    code, out, _ = fc("list", "--tasks", "--status", "pending", "--json")
    assert [t["task"] for t in json.loads(out)] == ["release"]
    assert json.loads(out)[0]["waits_for"] == ["docs", "tests"]
    code, out, err = fc("claim", "release", "--owner", "a", "--json")
    assert code == 3 and json.loads(out)["error"] == "not_ready"
    assert json.loads(out)["waits_for"] == ["docs", "tests"]
    assert [t["task"] for t in json.loads(fc("ready", "--json")[1])] == ["docs"]
    code, out, _ = fc("next", "--owner", "a", "--label", "docs", "--json")
    assert code == 0
    claim = json.loads(out)
    assert claim["task"] == "docs" and claim["priority"] == 5 and claim["token"]
    code, out, err = fc("next", "--owner", "b", "--json")
    assert code == 3 and json.loads(out) == {
        "task": None, "error": "nothing_ready",
        "message": "nothing ready (1 held, 1 pending, 1 blocked); nothing was claimed. Wait "
        "and retry (--wait DURATION), or see `fleetclaims tasks`.",
        "queue": {"ready": 0, "held": 1, "pending": 1, "blocked": 1, "completed": 0}}
    assert err == "fleetclaims: " + json.loads(out)["message"] + "\n"  # (as every error)
    assert fc("complete", "docs", "--token", claim["token"])[0] == 0
    code, out, _ = fc("unblock", "tests", "--json")
    assert json.loads(out) == {"task": "tests", "blocked": False, "changed": True,
                               "status": "ready"}
    code, out, _ = fc("stats", "--json")
    assert json.loads(out)["queue"] == {"ready": 1, "held": 0, "pending": 1, "blocked": 0,
                                        "completed": 1}
    code, out, err = fc("block", "ghost", "--reason", "x")
    assert code == 1 and "fleetclaims add ghost" in err


def test_add_on_a_queued_task_changes_only_the_options_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "r")

    def fc(*args: str) -> tuple[int, str, str]:
        return run_cli([*args, "--dir", d], capsys)

    assert fc("add", "build")[0] == 0
    assert fc("add", "release", "--after", "build", "--label", "ship", "--priority", "5",
              "--title", "Release")[0] == 0
    code, out, _ = fc("add", "release", "--title", "Release 1.0")
    assert code == 0 and out.startswith("updated release: priority 5, after build; pending")
    doc = json.loads(fc("get", "release", "--json")[1])["queue"]
    assert (doc["title"], doc["labels"], doc["depends_on"]) == ("Release 1.0", ["ship"],
                                                                ["build"])
    assert fc("claim", "release", "--owner", "x")[0] == 3  # still waits for build
    code, out, _ = fc("add", "release", "--no-after", "--no-labels", "--title", "", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["changed"] is True
    assert (doc["depends_on"], doc["labels"], doc["title"], doc["priority"]) == ([], [], None, 5)
    assert fc("add", "release", "--after", "a", "--no-after")[0] == 2


@pytest.mark.parametrize("argv, code", [
    (["add", "bad!"], 2), (["add", "t", "--label", "bad!"], 2),
    (["add", "t", "--priority", "1000001"], 2), (["add", "t", "--after", "t"], 2),
    (["add", "--from", "BATCH"], 2), (["block", "nosuch", "--reason", "r"], 1),
    (["unblock", "nosuch"], 1), (["depend", "nosuch", "--on", "x"], 1),
])
@pytest.mark.parametrize("empty_dir", [False, True])
def test_a_refused_queue_command_creates_no_registry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
        empty_dir: bool) -> None:
    """Refused (exit 1 or 2, "nothing was written") where no registry exists yet: no
    .gitignore, claims.lock or journal with a registry_created line is left there."""
    d = tmp_path / "r"
    if empty_dir:
        d.mkdir()
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"id": "a", "depends_on": ["b"]}\n{"id": "b", "depends_on": ["a"]}\n')
    argv = [str(batch) if a == "BATCH" else a for a in argv]
    got, _, err = run_cli([*argv, "--dir", str(d)], capsys)
    assert got == code and "nothing was written" in err
    assert (sorted(p.name for p in d.iterdir()) if d.exists() else None) == (
        [] if empty_dir else None)
    assert run_cli(["add", "t", "--dir", str(d)], capsys)[0] == 0  # the same place: made


@pytest.mark.parametrize("text, where", [
    ('{"id": "a"}\n{"id": "b"}\n{"id": "c"\n', "line 3, column 11"),
    ('# c\n\n{"id": "a"}\n{"id": "b"} trailing\n', "line 4, column 13"),
    ('{"id": "a"}\r\n\r\n{"id": }\r\n', "line 3, column 8"),
    ('\n\n[{"id": "a"},\n {"id": }]\n', "line 4, column 9"),
])
def test_add_from_names_the_line_of_a_json_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str) -> None:
    """A JSON error on a later line of the file was reported as line 1 (the line number of
    the one line decoded)."""
    f = tmp_path / "tasks.jsonl"
    f.write_bytes(text.encode())
    code, _, err = run_cli(["add", "--from", str(f), "--dir", str(tmp_path / "r")], capsys)
    assert code == 2 and f"({where}: " in err


def test_changes_are_recorded_as_fleetclaims_owner(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With FLEETCLAIMS_OWNER set, the queue changes and release --force recorded the actor
    "operator" (or $USER); --actor, where a command has it, still wins."""
    d = str(tmp_path / "r")
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"id": "e3"}\n')
    monkeypatch.setenv("FLEETCLAIMS_OWNER", "agent-q")
    monkeypatch.setenv("USER", "someone")
    for argv in (["add", "e1"], ["add", "e2"], ["add", "--from", str(batch)],
                 ["depend", "e2", "--on", "e1"], ["block", "e1", "--reason", "r"],
                 ["unblock", "e1"], ["claim", "c1"], ["release", "c1", "--force", "--reason", "x"],
                 ["claim", "c2"], ["release", "c2", "--force", "--reason", "x", "--actor", "ops"]):
        assert run_cli([*argv, "--dir", d], capsys)[0] == 0, argv
    actors = {(e.type, e.task): e.get("actor") for e in Registry(d).events(limit=100).events
              if e.type != "registry_created"}
    assert actors.pop(("claim_released_forced", "c2")) == "ops"
    assert set(actors.values()) == {"agent-q"}, actors
    monkeypatch.delenv("FLEETCLAIMS_OWNER")
    assert run_cli(["add", "e4", "--dir", d], capsys)[0] == 0
    assert Registry(d).task("e4").task.added_by == "operator"  # type: ignore[union-attr]


def test_next_in_a_real_process_exits_3_when_nothing_is_ready(tmp_path: Path) -> None:
    d = tmp_path / "r"
    assert cli(d, "add", "only").returncode == 0
    first = cli(d, "next", "--owner", "a")
    assert first.returncode == 0 and "claimed only for a" in first.stdout
    second = cli(d, "next", "--owner", "b")
    assert second.returncode == 3 and second.stdout == ""  # the message goes to stderr
    assert second.stderr.startswith("fleetclaims: nothing ready (1 held); nothing was claimed")


def test_queue_times_and_report(tmp_path: Path) -> None:
    from fleetclaims.testing import FakeClock

    clock = FakeClock()
    reg = Registry(tmp_path / "r", clock=clock)
    reg.add("base")
    reg.add("top", depends_on=["base"])
    clock.advance(10)
    base = reg.claim_next(owner="w")
    assert base is not None
    clock.advance(20)
    reg.complete("base", token=base.token or "")
    clock.advance(5)
    top = reg.claim_next(owner="w")
    assert top is not None
    clock.advance(7)
    reg.complete("top", token=top.token or "")
    events = [e.data for e in reg.events(after=0, limit=1000).events]
    times = queue_times(events)
    t0 = times["base"]["added"]
    assert t0 is not None
    rel = {t: {k: (v - t0 if v is not None else None) for k, v in row.items()}
           for t, row in times.items()}
    assert rel == {
        "base": {"added": 0, "ready": 0, "claimed": 10, "completed": 30},
        "top": {"added": 0, "ready": 30, "claimed": 35, "completed": 42},
    }
    html = render_html(events, title="t", generated_at=clock.now().wall)
    assert "<h2>Work queue</h2>" in html
    assert 'data-seconds="30.000"' in html and 'data-seconds="5.000"' in html
    reg.close()


def test_show_and_explain_tell_the_queue_story(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "r")
    for args in (["add", "base"], ["add", "top", "--after", "base"],
                 ["block", "top", "--reason", "needs review"]):
        assert run_cli([*args, "--dir", d], capsys)[0] == 0
    _, out, _ = run_cli(["show", "top", "--dir", d], capsys)
    assert out.strip() == "top is queued and has never been claimed: blocked: needs review"
    _, out, _ = run_cli(["show", "top", "--dir", d, "--json"], capsys)
    assert json.loads(out)["queue"]["status"] == "blocked"
    assert run_cli(["unblock", "top", "--dir", d], capsys)[0] == 0
    _, out, _ = run_cli(["show", "top", "--dir", d], capsys)
    assert out.strip().endswith("pending, waits for base")
    assert run_cli(["claim", "top", "--owner", "eager", "--dir", d], capsys)[0] == 3
    _, out, _ = run_cli(["explain", "top", "--dir", d], capsys)
    assert "because: it is in the work queue" in out
    assert "operator added it to the queue (priority 100, after base)" in out
    assert "operator blocked it: needs review" in out and "operator unblocked it" in out
    assert "eager was refused: not ready: waits for base" in out
    _, out, _ = run_cli(["next", "--owner", "w", "--dir", d, "--json"], capsys)
    token = json.loads(out)["token"]
    assert run_cli(["complete", "base", "--token", token, "--dir", d], capsys)[0] == 0
    _code, out, _ = run_cli(["explain", "top", "--dir", d], capsys)
    assert "it became ready (base was completed)" in out
