"""The command line, in-process and through real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetclaims import Registry, ValidationError
from fleetclaims.cli import all_commands, main

pytestmark = pytest.mark.integration


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def cli(directory: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("FLEETCLAIMS_TOKEN", None)
    full_env.update(env or {})
    full_env["FLEETCLAIMS_DIR"] = str(directory)
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout, check=False)


def test_claim_conflict_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """claim prints a token; a second claim exits 3 with holder and advice; --json is one doc."""
    d = str(tmp_path / "r")
    code, out, _ = run_cli(["claim", "t1", "--owner", "agent-a", "--dir", d, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["owner"] == "agent-a" and doc["fence"] == 1 and doc["token"]
    code, out, err = run_cli(["--dir", d, "claim", "t1", "--owner", "agent-b"], capsys)
    assert code == 3
    assert "agent-a" in err and "Wait for the holder" in err
    code, out, err = run_cli(["claim", "t1", "--owner", "agent-b", "--dir", d, "--json"], capsys)
    assert code == 3 and json.loads(out)["error"] == "conflict"
    assert json.loads(out)["holder"] == "agent-a"


def test_token_lifecycle(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """renew/transition/complete with the token (flag or env); wrong token exits 4."""
    d = str(tmp_path / "r")
    _, out, _ = run_cli(["claim", "t1", "--owner", "a", "--dir", d, "--json", "--ttl", "90s"],
                        capsys)
    token = json.loads(out)["token"]
    assert json.loads(out)["ttl"] == 90
    assert run_cli(["renew", "t1", "--token", token, "--ttl", "2h", "--dir", d], capsys)[0] == 0
    assert run_cli(["renew", "t1", "--token", "x" * 20, "--dir", d], capsys)[0] == 4
    monkeypatch.setenv("FLEETCLAIMS_TOKEN", token)
    assert run_cli(["transition", "t1", "--phase", "review", "--dir", d], capsys)[0] == 0
    code, out, _ = run_cli(["complete", "t1", "--result", '{"pr": 3}', "--dir", d, "--json"],
                           capsys)
    assert code == 0 and json.loads(out)["result"] == {"pr": 3}
    code, _, err = run_cli(["claim", "t1", "--owner", "b", "--dir", d], capsys)
    assert code == 3 and "reopen" in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad arguments exit 2 with a message saying what to do."""
    d = str(tmp_path / "r")
    assert run_cli(["claim", "t1", "--dir", d], capsys)[0] == 2  # --owner missing
    code, _, err = run_cli(["claim", "bad task", "--owner", "a", "--dir", d], capsys)
    assert code == 2 and "invalid task" in err
    code, _, err = run_cli(["claim", "t", "--owner", "a", "--ttl", "soon", "--dir", d], capsys)
    assert code == 2 and "90s" in err
    assert run_cli(["renew", "t", "--dir", d], capsys)[0] == 2  # no token anywhere


def test_list_show_stats_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Human tables with relative times; JSON documents with the same data."""
    d = str(tmp_path / "r")
    run_cli(["claim", "alpha", "--owner", "a", "--dir", d, "--note", "first"], capsys)
    run_cli(["claim", "beta", "--owner", "b", "--dir", d, "--ttl", "1h"], capsys)
    code, out, _ = run_cli(["list", "--dir", d], capsys)
    assert code == 0 and "TASK" in out and "expires in 59m" in out and "first" in out
    assert "\x1b[" not in out  # no colour when not a TTY
    _, out, _ = run_cli(["list", "--dir", d, "--json"], capsys)
    assert [c["task"] for c in json.loads(out)] == ["alpha", "beta"]
    _, out, _ = run_cli(["show", "alpha", "--dir", d], capsys)
    assert "owner" in out and "a" in out and "lease" not in out.split("\n")[0]
    _, out, _ = run_cli(["stats", "--dir", d, "--json"], capsys)
    assert json.loads(out)["active"] == 2
    _, out, _ = run_cli(["events", "--dir", d, "--json", "--limit", "2"], capsys)
    page = json.loads(out)
    assert [e["seq"] for e in page["events"]] == [1, 2] and page["more"] is True


def test_audit_verify_detects_tampering(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """audit verify: ok on a clean log; a tampered byte, a deleted line and a truncated file are
    reported by seq and offset with exit 5 (truncation mid-line is a repairable torn tail)."""
    d = tmp_path / "r"
    reg = Registry(d)
    for i in range(5):
        c = reg.claim(f"t{i}", owner="a")
        reg.complete(c.task, token=c.token or "")
    reg.close()
    assert run_cli(["audit", "verify", "--dir", str(d)], capsys)[0] == 0
    journal = d / "audit.jsonl"
    clean = journal.read_bytes().rstrip(b"\0")  # the data, without the preallocated space
    lines = clean.split(b"\n")
    # a tampered byte in line 4
    tampered = bytearray(clean)
    pos = len(b"\n".join(lines[:3])) + 40
    tampered[pos] = ord("X") if tampered[pos] != ord("X") else ord("Y")
    journal.write_bytes(bytes(tampered))
    code, out, _ = run_cli(["audit", "verify", "--dir", str(d), "--json"], capsys)
    doc = json.loads(out)
    assert code == 5 and doc["ok"] is False and doc["seq"] == 4
    assert doc["offset"] == len(b"\n".join(lines[:3])) + 1
    # a deleted line
    journal.write_bytes(b"\n".join(lines[:5] + lines[6:]))
    code, out, _ = run_cli(["audit", "verify", "--dir", str(d), "--json"], capsys)
    assert code == 5 and json.loads(out)["seq"] == 6
    # a torn tail (a writer died mid-append): the verified prefix is fine, the torn tail is
    # reported, not damage
    journal.write_bytes(clean + b'{"seq":12,"ts":1.0,"type":"claim_cre')
    code, out, _ = run_cli(["audit", "verify", "--dir", str(d), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["torn_tail_bytes"] > 0 and doc["events"] == 11
    # a truncated file (an acknowledged line cut mid-line): the chain verifies, but the
    # registry's anchor recorded that line: the store refuses (history lost), so verify fails
    (d / "claims.json").unlink()
    journal.write_bytes(clean[: len(clean) - 30])
    code, out, _ = run_cli(["audit", "verify", "--dir", str(d), "--json"], capsys)
    doc = json.loads(out)
    assert code == 5 and doc["torn_tail_bytes"] > 0 and "lost" in doc["refused"], doc


def test_audit_filters_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """audit filters by task, owner and type; export writes CSV and JSONL."""
    d = str(tmp_path / "r")
    reg = Registry(d)
    a = reg.claim("t1", owner="alice")
    reg.claim("t2", owner="bob")
    reg.complete("t1", token=a.token or "")
    code, out, _ = run_cli(["audit", "--dir", d, "--owner", "alice", "--json"], capsys)
    events = json.loads(out)["events"]  # one document (only --follow streams line by line)
    assert code == 0 and [e["type"] for e in events] == ["claim_created", "claim_completed"]
    _, out, _ = run_cli(["audit", "--dir", d, "--type", "claim_created", "--since", "1h"], capsys)
    assert "t1" in out and "t2" in out and "claim_completed" not in out
    _, out, _ = run_cli(["audit", "export", "--format", "csv", "--dir", d], capsys)
    assert out.splitlines()[0].startswith("seq,")
    assert len(out.strip().splitlines()) == 5  # header + 4 events
    _, out, _ = run_cli(["audit", "export", "--format", "jsonl", "--dir", d], capsys)
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2, 3, 4]


def test_explain_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """explain tells the story from the log; sweep marks a dead owner's claim stale."""
    d = str(tmp_path / "r")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    run_cli(["claim", "t1", "--owner", "ghost", "--pid", str(child.pid), "--dir", d], capsys)
    child.wait()
    code, out, _ = run_cli(["sweep", "--dry-run", "--dir", d], capsys)
    assert code == 0 and "would mark t1" in out and "no longer exists" in out
    code, out, _ = run_cli(["sweep", "--dir", d], capsys)
    assert "marked t1" in out
    run_cli(["claim", "t1", "--owner", "b", "--take-stale", "--dir", d], capsys)
    code, out, _ = run_cli(["explain", "t1", "--dir", d], capsys)
    assert code == 0 and "held by b" in out and "took it over from ghost" in out


@pytest.mark.slow
def test_help_has_examples() -> None:
    """Every subcommand's --help shows an example."""
    for name in all_commands():
        proc = subprocess.run([sys.executable, "-m", "fleetclaims", name, "--help"],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and "example" in proc.stdout, name


@pytest.mark.slow
def test_subprocess_version_and_exit_codes(tmp_path: Path) -> None:
    """The installed entry point: --version, and exit codes across real processes."""
    d = tmp_path / "r"
    assert cli(d, "--version").stdout.startswith("fleetclaims ")
    first = cli(d, "claim", "t", "--owner", "a", "--json")
    assert first.returncode == 0
    token = json.loads(first.stdout)["token"]
    assert cli(d, "claim", "t", "--owner", "b").returncode == 3
    assert cli(d, "release", "t", "--token", "y" * 24).returncode == 4
    assert cli(d, "release", "t", env={"FLEETCLAIMS_TOKEN": token}).returncode == 0
    (d / "audit.jsonl").write_bytes(b"garbage\n" + (d / "audit.jsonl").read_bytes())
    damaged = cli(d, "list")  # (#16) reads show the verified state and name the damage
    assert damaged.returncode == 0 and "doctor" in damaged.stderr, damaged
    write = cli(d, "claim", "u", "--owner", "b")  # writes refuse
    assert write.returncode == 5 and "doctor" in write.stderr


def test_run_success_completes(tmp_path: Path) -> None:
    """run: the command sees the claim in its environment; exit 0 completes the task."""
    d = tmp_path / "r"
    proc = cli(d, "run", "t", "--owner", "a", "--", sys.executable, "-c",
               "import os; print(os.environ['FLEETCLAIMS_TASK'], os.environ['FLEETCLAIMS_FENCE'],"
               " len(os.environ['FLEETCLAIMS_TOKEN']))")
    assert proc.returncode == 0
    assert proc.stdout.split()[:2] == ["t", "1"]
    assert Registry(d).get("t").state == "completed"  # type: ignore[union-attr]


def test_run_failure_releases_and_passes_code(tmp_path: Path) -> None:
    """run: a failing command's exit code passes through and the claim is released."""
    d = tmp_path / "r"
    proc = cli(d, "run", "t", "--owner", "a", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert proc.returncode == 7
    assert Registry(d).get("t").state == "released"  # type: ignore[union-attr]


def test_run_forwards_sigterm(tmp_path: Path) -> None:
    """run: SIGTERM to fleetclaims reaches the command; the claim is released."""
    d = tmp_path / "r"
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
              "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "fleetclaims", "run", "t", "--owner", "a",
                             "--", sys.executable, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 42
    proc.stdout.close()
    proc.stderr.close()  # type: ignore[union-attr]
    assert Registry(d).get("t").state == "released"  # type: ignore[union-attr]


def test_run_interrupted_with_sigint(tmp_path: Path) -> None:
    """run: Ctrl-C (SIGINT) is forwarded; the command's own exit status is returned."""
    d = tmp_path / "r"
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    script = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-m", "fleetclaims", "run", "t", "--owner", "a",
                             "--", sys.executable, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    code = proc.wait(30)
    proc.stdout.close()
    proc.stderr.close()  # type: ignore[union-attr]
    assert code == 128 + signal.SIGINT  # the command died of SIGINT; run reports it as a shell does
    assert Registry(d).get("t").state == "released"  # type: ignore[union-attr]


@pytest.mark.slow
def test_run_lease_lost(tmp_path: Path) -> None:
    """run: when the lease is lost (force-released by an operator), run says so loudly, stops
    the command and exits 4."""
    d = tmp_path / "r"
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    script = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-m", "fleetclaims", "run", "t", "--owner", "a",
                             "--ttl", "3s", "--", sys.executable, "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    Registry(d).release("t", force=True, reason="operator took it back")
    started = time.monotonic()
    code = proc.wait(30)
    assert code == 4 and time.monotonic() - started < 10
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    assert "LEASE LOST" in err and "operator took it back" in err


def test_audit_follow_streams_new_events(tmp_path: Path) -> None:
    """audit --follow --json prints one object per line as events are committed."""
    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("first", owner="a")
    env = dict(os.environ, FLEETCLAIMS_DIR=str(d))
    proc = subprocess.Popen([sys.executable, "-m", "fleetclaims", "audit", "--follow", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        seen = [json.loads(proc.stdout.readline())["type"] for _ in range(2)]
        assert seen == ["registry_created", "claim_created"]
        reg.claim("second", owner="b")
        later = json.loads(proc.stdout.readline())
        assert (later["type"], later["task"]) == ("claim_created", "second")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def test_colour_only_on_tty_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    """Colour codes appear on a terminal, never in pipes or with NO_COLOR set."""
    import io

    from fleetclaims.cli import Out

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert "\x1b[" in Out(False, Terminal()).paint("x", "31")
    assert "\x1b[" not in Out(False, io.StringIO()).paint("x", "31")
    assert "\x1b[" not in Out(True, Terminal()).paint("x", "31")
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in Out(False, Terminal()).paint("x", "31")


def test_json_sweep_and_claim_repr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sweep --json lists what it found (as data); a Claim's repr never shows its token."""
    d = str(tmp_path / "r")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    run_cli(["claim", "t1", "--owner", "ghost", "--pid", str(child.pid), "--dir", d], capsys)
    child.wait()
    for extra in (["--dry-run"], []):
        code, out, _ = run_cli(["sweep", "--dir", d, "--json", *extra], capsys)
        found = json.loads(out)["found"]
        assert code == 0 and found[0]["task"] == "t1" and "no longer exists" in found[0]["reason"]
    c = Registry(tmp_path / "r2").claim("t", owner="a")
    assert c.token and c.token not in repr(c)


def test_mistyped_locations_are_refused(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A missing merge source or migrate source, or an unknown URL scheme, is a usage error
    that creates nothing; migrating into a registry that exists is one too."""
    d = str(tmp_path / "r")
    Registry(d).claim("t", owner="a")
    missing = tmp_path / "missing"
    assert run_cli(["merge", str(missing), "--dir", d], capsys)[0] == 2
    assert run_cli(["migrate", "--from", str(missing), "--to", str(tmp_path / "x")], capsys)[0] == 2
    assert not missing.exists() and not (tmp_path / "x").exists()
    code, _, err = run_cli(["list", "--dir", "mysql://db/x"], capsys)
    assert code == 2 and "postgresql://" in err
    other = tmp_path / "other"
    Registry(other).claim("u", owner="b")
    code, _, err = run_cli(["migrate", "--from", d, "--to", str(other)], capsys)
    assert code == 2 and "already holds a registry" in err


def test_list_marks_claims_of_dead_owners(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """list shows a claim whose owner process is gone as STALE, before any sweep."""
    d = str(tmp_path / "r")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    run_cli(["claim", "t1", "--owner", "ghost", "--pid", str(child.pid), "--dir", d], capsys)
    run_cli(["claim", "t2", "--owner", "alive", "--dir", d], capsys)
    child.wait()
    code, out, _ = run_cli(["list", "--dir", d], capsys)
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert code == 0 and "STALE: owner dead" in rows["t1"] and "STALE" not in rows["t2"]


@pytest.mark.slow
def test_console_exit_flushes_everything_and_keeps_exit_codes(tmp_path: Path) -> None:
    """`python -m fleetclaims` (like the console script) skips interpreter teardown: a large
    --json document still arrives whole through a pipe, errors still reach stderr with their
    exit code, and atexit handlers (logging's flush, a file's close) still run."""
    reg = Registry(tmp_path / "r", durability="process")
    for i in range(3000):
        reg.claim(f"task-{i}", owner="a", ttl=600, process=False)
    reg.close()
    proc = cli(tmp_path / "r", "list", "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)) == 3000
    proc = cli(tmp_path / "r", "claim", "task-7", "--owner", "b")
    assert proc.returncode == 3 and "task-7" in proc.stderr and "held by" in proc.stderr
    code = ("import atexit, sys; from fleetclaims.cli import console; f = open(sys.argv[1], 'w'); "
            "f.write('buffered'); atexit.register(f.close); "
            "sys.argv[1:] = ['stats']; console.run()")
    note = tmp_path / "log.txt"
    proc = subprocess.run([sys.executable, "-c", code, str(note)], capture_output=True,
                          text=True, env={**os.environ, "FLEETCLAIMS_DIR": str(tmp_path / "r")},
                          timeout=60, check=False)
    assert proc.returncode == 0 and "active 3000" in proc.stdout
    assert note.read_text() == "buffered"


@pytest.mark.parametrize(("argv", "collect"), [
    (["list", "--json"], False),
    (["--dir", "x", "claim", "t", "--owner", "o"], False),
    (["audit", "verify"], False),
    (["run", "--task", "t", "--", "sleep", "1"], True),
    (["mcp", "--owner", "o"], True),
    (["top"], True),
    (["show", "t"], False),  # an alias is known as its command
    (["audit", "--follow"], True),
    (["events", "-f"], True),
    ([], True),
    (["--help"], True),
])
def test_console_keeps_the_usual_collector_only_for_long_commands(
        argv: list[str], collect: bool) -> None:
    from fleetclaims.cli.console import needs_collector

    assert needs_collector(argv) is collect


def test_console_runs_short_commands_with_a_rare_cyclic_collector(tmp_path: Path) -> None:
    code = ("import atexit, gc, sys; from fleetclaims.cli import console; "
            "usual = gc.get_threshold()[0]; "
            "atexit.register(lambda: print('gc', gc.isenabled(), gc.get_threshold()[0] == usual)); "
            "sys.argv[1:] = sys.argv[2:]; console.run()")
    env = {**os.environ, "FLEETCLAIMS_DIR": str(tmp_path / "r")}
    for argv, usual in ((["stats"], False), (["audit", "--follow", "--help"], True)):
        proc = subprocess.run([sys.executable, "-c", code, "-", *argv], capture_output=True,
                              text=True, env=env, timeout=60, check=False)
        assert f"gc True {usual}" in proc.stdout, proc.stdout + proc.stderr


def test_unknown_event_type_is_refused_with_a_suggestion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt --type is an error naming the closest type, not a filter matching nothing."""
    d = str(tmp_path / "r")
    run_cli(["claim", "t1", "--owner", "a", "--dir", d], capsys)
    for command in (["events"], ["audit"], ["audit", "export"]):
        code, out, _ = run_cli([*command, "--type", "claim_creatd", "--dir", d, "--json"],
                               capsys)
        assert code == 2, command
        doc = json.loads(out)
        assert doc["error"] == "invalid" and doc["field"] == "type"
        assert "did you mean claim_created?" in doc["message"]
    code, out, _ = run_cli(["events", "--type", "claim_created", "--dir", d, "--json"], capsys)
    assert code == 0 and [e["type"] for e in json.loads(out)["events"]] == ["claim_created"]
    reg = Registry(d)
    with pytest.raises(ValidationError, match="not an event type"):
        reg.events(types=["nope"])
    with pytest.raises(ValidationError, match="list of event types"):
        reg.events(types="claim_created")
    with pytest.raises(ValidationError, match="list of event types"):
        reg.events(types=[["claim_created"]])  # type: ignore[list-item]


def test_usage_errors_under_json_are_json_documents(capsys: pytest.CaptureFixture[str]) -> None:
    """With --json, a usage error (a missing argument, a bad duration) is also a JSON document
    on stdout, and the human message still goes to stderr; without --json stdout stays empty."""
    code, out, err = run_cli(["claim", "--json"], capsys)
    assert code == 2
    doc = json.loads(out)
    assert doc["error"] == "usage" and "required" in doc["message"]
    assert "fleetclaims claim --help" in doc["hint"] and "required" in err
    code, out, _ = run_cli(["claim", "t", "--owner", "o", "--ttl", "abc", "--json"], capsys)
    assert code == 2 and "ttl" in json.loads(out)["message"]
    code, out, err = run_cli(["claim"], capsys)
    assert code == 2 and out == "" and "required" in err


def test_output_files_are_private_whatever_the_umask(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """audit export -o and audit report --html write 0600 files even under umask 000, also
    over an existing file that was world-readable."""
    d = str(tmp_path / "r")
    Registry(d).claim("t", owner="a")
    (tmp_path / "old.csv").write_text("x")
    (tmp_path / "old.csv").chmod(0o666)
    old = os.umask(0)
    try:
        for argv in (["audit", "export", "-o", str(tmp_path / "e.jsonl")],
                     ["audit", "export", "--format", "csv", "-o", str(tmp_path / "old.csv")],
                     ["audit", "report", "--html", str(tmp_path / "r.html")]):
            assert run_cli([*argv, "--dir", d], capsys)[0] == 0
    finally:
        os.umask(old)
    for name in ("e.jsonl", "old.csv", "r.html"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    assert "claim_created" in (tmp_path / "e.jsonl").read_text()


def test_expires_in_is_told_by_the_clock_that_decides(tmp_path: Path) -> None:
    """After the wall clock jumps forward an hour, a lease that is live by the boot clock
    is listed (claims --expired --json, get, the MCP summary) with the time it really has
    left, never a negative expires_in."""
    from fleetclaims.agents.mcp_server import _summary
    from fleetclaims.cli.output import claim_doc, data_doc
    from fleetclaims.testing import FakeClock, memory_registry

    clock = FakeClock()
    reg = memory_registry(clock=clock)
    reg.claim("t", owner="a", ttl=600, process=False)
    clock.advance(100)
    clock.step_wall(3600)
    now = reg.store.now()
    [claim] = reg.claims(include_expired=True)
    assert claim.live and reg.is_stale(claim) is None
    [data] = reg.claims_data(include_expired=True)
    for left in (data_doc(data, now)["expires_in"], claim_doc(claim, now)["expires_in"],
                 _summary(claim, now)["expires_in"]):
        assert left == pytest.approx(500, abs=0.1)


def test_unreadable_registry_file_is_access_denied(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Registry.verify() and `audit verify --json` on a registry whose claims.json cannot be
    read: AccessDenied naming the file, no traceback (as root, which reads any file, the
    refusal is simulated at the open)."""
    import fleetclaims

    d = tmp_path / "r"
    reg = Registry(d)
    reg.claim("t", owner="a")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()
    (d / "claims.json").chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        real_open = os.open

        def refusing(path: object, *args: object, **kwargs: object) -> int:
            if str(path).endswith("claims.json"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(fleetclaims.AccessDenied, match=r"claims\.json"):
        Registry(d).verify()
    code, out, err = run_cli(["audit", "verify", "--dir", str(d), "--json"], capsys)
    assert json.loads(out)["error"] == "access_denied" and "Traceback" not in err
    assert code == 1


def test_audit_names_the_holder_of_a_compact_renewal(tmp_path: Path) -> None:
    """`audit` (the table for people) names a compact renewal's holder from its grant above it,
    and a page that starts after the grant says "the holder", never "None renewed the lease
    (fence None ...)"."""
    import subprocess
    import sys

    d = tmp_path / "r"
    reg = Registry(d)
    c = reg.claim("t", owner="alice", ttl=600)
    reg.renew("t", token=c.token or "")
    reg.renew("t", token=c.token or "")
    reg.close()

    def audit(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "fleetclaims", "--dir", str(d), "audit",
                               *extra], capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    whole = audit()
    assert whole.count("alice renewed the lease (fence 1") == 2, whole
    later = audit("--after", "2")
    assert "None" not in later and later.count("the holder renewed the lease") == 2, later




def test_an_ambiguous_claim_tells_the_token_to_retry_with(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server went away with the outcome unknown (it had committed): the CLI minted no
    token the caller could see, and a plain retry conflicted with its own claim. The error
    names the token (--json: retry_token) and a retry with it returns the claim."""
    from fleetclaims import api
    from fleetclaims.cli import main
    from fleetclaims.core.errors import StoreUnavailable

    d = tmp_path / "r"
    real = api.Registry.claim

    def lost_answer(self: Any, task: str, **kw: Any) -> Any:
        real(self, task, **kw)  # committed...
        raise StoreUnavailable("postgresql://db", "connection lost", committed=None)

    monkeypatch.setattr(api.Registry, "claim", lost_answer)
    assert main(["--dir", str(d), "--json", "claim", "t", "--owner", "a"]) == 1
    doc = json.loads(capsys.readouterr().out)
    minted = doc["retry_token"]
    assert minted in doc["message"] and doc["committed"] is None
    monkeypatch.setattr(api.Registry, "claim", real)
    assert main(["--dir", str(d), "--json", "claim", "t", "--owner", "a"]) == 3  # a plain retry
    capsys.readouterr()
    assert main(["--dir", str(d), "--json", "claim", "t", "--owner", "a", "--token",
                 minted]) == 0
    assert json.loads(capsys.readouterr().out)["fence"] == 1


@pytest.mark.parametrize("args", [["audit", "archive", "--before", "0s", "--to", ""],
                                  ["audit", "verify", "--with", " "]])
def test_an_empty_archive_directory_is_refused(tmp_path: Path, args: list[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`--to "$UNSET"` archived the sealed history into the current directory."""
    d = tmp_path / "r"
    Registry(d).claim("t", owner="a")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["--dir", str(d), *args]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("args", [["audit", "report", "--html", "/dev/full"],
                                  ["audit", "export", "-o", "/dev/full"]])
def test_a_report_file_that_cannot_be_written_is_named(
        tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A named file that could not be written was reported as standard output, with advice
    about lost tokens, for a command that only read."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    d = tmp_path / "r"
    Registry(d).claim("t", owner="a")
    assert main(["--dir", str(d), *args]) == 2
    err = capsys.readouterr().err
    assert "/dev/full could not be written" in err and "standard output" not in err
