"""Values taken from the environment are checked like arguments, and a bad one is refused
naming the variable (there is no argument to fix), never an internal error (exit 70).

Oracle: the exit status is the README table's for ValidationError (2), or the guard's refusal;
stderr (and the --json document) names the variable; nothing is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fc_support import cli

pytestmark = pytest.mark.integration

BAD_OWNER = "a b"


@pytest.fixture
def reg(tmp_path: Path) -> Path:
    d = tmp_path / "r"
    assert cli(d, "claim", "t1", "--owner", "a").returncode == 0
    return d


@pytest.mark.parametrize(("args", "env", "name"), [
    (["claim", "t2"], {"FLEETCLAIMS_OWNER": BAD_OWNER}, "FLEETCLAIMS_OWNER"),
    (["add", "q1"], {"FLEETCLAIMS_OWNER": BAD_OWNER}, "FLEETCLAIMS_OWNER"),
    (["brief", "--json"], {"FLEETCLAIMS_OWNER": "\udcff"}, "FLEETCLAIMS_OWNER"),
    (["renew", "t1"], {"FLEETCLAIMS_TOKEN": "short"}, "FLEETCLAIMS_TOKEN"),
    (["claims"], {"FLEETCLAIMS_DIR": "mysql://x"}, "FLEETCLAIMS_DIR"),
    (["claims"], {"FLEETCLAIMS_URL": "postgresql://h:99999/db"}, "FLEETCLAIMS_URL"),
])
def test_a_bad_environment_value_is_refused_naming_it(reg: Path, args: list[str],
                                                      env: dict[str, str], name: str) -> None:
    before = (reg / "audit.jsonl").read_bytes()
    if name == "FLEETCLAIMS_DIR":  # (cli() sets FLEETCLAIMS_DIR itself: run without it)
        import subprocess
        import sys

        full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
        done = subprocess.run([sys.executable, "-m", "fleetclaims", "--json", *args],
                              capture_output=True, text=True, env={**full, **env}, check=False)
    else:
        done = cli(reg, "--json", *args, env=env)
    assert done.returncode == 2, done.stderr
    assert name in done.stderr and "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    assert doc["error"] == "invalid" and doc["field"] == name
    assert (reg / "audit.jsonl").read_bytes() == before


@pytest.mark.parametrize(("env", "said"), [
    ({"FLEETCLAIMS_TASK": "\udcff", "FLEETCLAIMS_FENCE": "1",
      "FLEETCLAIMS_TOKEN": "a" * 24}, "FLEETCLAIMS_TASK"),
    ({"FLEETCLAIMS_TASK": "t1", "FLEETCLAIMS_FENCE": "9" * 20,
      "FLEETCLAIMS_TOKEN": "a" * 24}, "FLEETCLAIMS_FENCE"),
])
def test_the_guard_refuses_a_bad_run_environment_without_an_internal_error(
        reg: Path, env: dict[str, str], said: str) -> None:
    done = cli(reg, "guard", "--json", env=env)
    assert done.returncode == 2, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["code"] == "invalid" and said in doc["reason"]
    assert doc["error"] == "invalid"  # (as every --json refusal names its code)


def test_an_unusable_login_name_is_not_the_operators_problem(reg: Path) -> None:
    """release --force records the login name as the actor; one that is no owner name is
    replaced by "operator" (it was refused naming no variable)."""
    env = {"USER": BAD_OWNER}
    done = cli(reg, "release", "t1", "--force", "--reason", "r", "--json", env=env)
    assert done.returncode == 0, done.stderr
    events = [json.loads(x) for x in (reg / "audit.jsonl").read_bytes().rstrip(b"\0")
              .splitlines()]
    assert events[-1]["actor"] == "operator"


def _bare_env(**extra: str) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
    return {**full, "FLEETCLAIMS_ANCHOR_DIR": os.environ.get("FLEETCLAIMS_ANCHOR_DIR", ""),
            **extra}


@pytest.mark.parametrize("where", ["claims.json", "claims.json/sub"])
def test_a_registry_path_from_the_environment_that_no_write_could_make_is_refused(
        reg: Path, where: str) -> None:
    """FLEETCLAIMS_DIR naming a file (the registry's claims.json: a natural slip), or a path
    under one, read as an empty registry (exit 0, "t1 has never been claimed" while t1 was
    held); it is refused as --dir is (RegistryNotFound, exit 2). The first run (nothing there
    yet, under a directory) still reads as empty."""
    import subprocess
    import sys

    for args in (["claims", "--json"], ["get", "t1"]):
        done = subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                              text=True, env=_bare_env(FLEETCLAIMS_DIR=str(reg / where)),
                              check=False)
        assert done.returncode == 2 and "no registry at" in done.stderr, done
    fresh = reg.parent / "not-yet"
    done = subprocess.run([sys.executable, "-m", "fleetclaims", "claims", "--json"],
                          capture_output=True, text=True,
                          env=_bare_env(FLEETCLAIMS_DIR=str(fresh)), check=False)
    assert done.returncode == 0 and json.loads(done.stdout) == [] and not fresh.exists()


def test_a_symbolic_link_loop_is_a_typed_refusal(tmp_path: Path) -> None:
    """--dir (or FLEETCLAIMS_DIR, or Registry(path)) naming a symlink loop: a ValidationError
    naming it, exit 2 (a write was an internal error, exit 70; MCP answered "internal")."""
    from fleetclaims import Registry, ValidationError

    (tmp_path / "l2").symlink_to("l1")
    (tmp_path / "l1").symlink_to("l2")
    loop = tmp_path / "l1"
    for args in (["claim", "t1", "--owner", "a"], ["add", "q1"], ["claims"]):
        done = cli(loop, "--dir", str(loop), "--json", *args)
        assert done.returncode == 2 and "symbolic link loop" in done.stderr, done
        assert json.loads(done.stdout)["error"] == "invalid"
    with pytest.raises(ValidationError, match="symbolic link loop"):
        Registry(loop).claim("t1", owner="a")
    assert sorted(os.listdir(tmp_path)) == ["l1", "l2"]


@pytest.mark.parametrize("args", [
    ["complete", "t1", "--token", "a" * 24],
    ["release", "t1", "--token", "a" * 24],
    ["renew", "t1", "--token", "a" * 24],
    ["reopen", "t1", "--reason", "typo"],
    ["claim-next", "--owner", "a"],
    ["unreserve", "t1", "src", "--token", "a" * 24],
])
def test_a_command_on_what_a_registry_records_creates_none(tmp_path: Path,
                                                           args: list[str]) -> None:
    """A mistyped --dir: a command that acts on an existing claim or task (refused, or with
    nothing to do) leaves nothing there (it created the registry's files, and removing them
    then read as lost history)."""
    typo = tmp_path / "typo"
    done = cli(typo, "--dir", str(typo), *args)
    assert "Traceback" not in done.stderr
    assert not typo.exists(), (done.returncode, done.stderr, os.listdir(typo))
    # The path stays usable: a first claim there is a first run, not lost history.
    assert cli(typo, "--dir", str(typo), "claim", "t1", "--owner", "a").returncode == 0


def test_an_empty_claim_token_is_refused(tmp_path: Path) -> None:
    """`claim --token ""` (an unset shell variable) made a random token, so the retry it was
    meant for conflicted with its own claim (exit 3); it is a usage error, nothing claimed."""
    d = tmp_path / "r"
    done = cli(d, "claim", "t1", "--owner", "a", "--token", "")
    assert done.returncode == 2 and "token" in done.stderr, done.stderr
    assert not d.exists()


def test_a_cut_off_json_result_is_refused_not_kept_as_text(tmp_path: Path) -> None:
    """--result '{"pr": 17' (a cut-off object) was stored as the string; it is refused and
    the claim stays held; plain text is still kept as text."""
    d = tmp_path / "r"
    claimed = cli(d, "claim", "t1", "--owner", "a", "--json")
    token = json.loads(claimed.stdout)["token"]
    done = cli(d, "complete", "t1", "--token", token, "--result", '{"pr": 17')
    assert done.returncode == 2 and "JSON" in done.stderr, done.stderr
    held = json.loads(cli(d, "get", "t1", "--json").stdout)
    assert held["state"] == "active"
    assert cli(d, "complete", "t1", "--token", token, "--result", "merged as 1f3e").returncode == 0
    assert json.loads(cli(d, "get", "t1", "--json").stdout)["result"] == "merged as 1f3e"


@pytest.mark.parametrize("under", ["x", "x/y"])
def test_a_write_under_a_file_says_a_parent_is_a_file(tmp_path: Path, under: str) -> None:
    """--dir FILE/x for a write: UnsafeRegistry "a parent of the registry path is a file" (it
    was DurabilityError "Not a directory ... fix the cause (disk space, permissions,
    hardware)")."""
    f = tmp_path / "afile"
    f.write_text("x")
    target = f / under
    for args in (["claim", "z", "--owner", "o"], ["add", "q1"]):
        done = cli(target, "--dir", str(target), "--json", *args)
        assert done.returncode == 1, done.stderr
        assert "a parent of the registry path is a file" in done.stderr
        assert json.loads(done.stdout)["error"] == "unsafe"
    assert f.read_text() == "x"


@pytest.mark.parametrize(("args", "env"), [
    (["claim", "t1", "--owner", "a", "--ttl", "\u0661\u0662m"], {}),
    (["claim", "t1", "--owner", "a", "--priority", "\uff11"], {}),
    (["claims"], {"FLEETCLAIMS_LOCK_TIMEOUT": "\u0661\u0660"}),
])
def test_numbers_are_ascii_digits(tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    """Arabic-Indic or fullwidth digits (int() and float() take them) were accepted as a
    duration, a priority or the lock timeout: refused, exit 2."""
    d = tmp_path / "r"
    assert cli(d, "claim", "t0", "--owner", "a").returncode == 0
    done = cli(d, *args, env=env)
    assert done.returncode == 2, done.stderr
    assert cli(d, "get", "t1").stdout.startswith("t1 has never been claimed")


def test_an_interrupted_json_wait_answers_a_json_document(tmp_path: Path) -> None:
    """`--json claim --wait` stopped by Ctrl-C printed nothing on stdout (exit 130): a script
    reading stdout got no answer. It now gets {"error": "interrupted", ...}; nothing claimed."""
    import signal
    import subprocess
    import sys
    import time

    from fc_support import cli_env

    d = tmp_path / "r"
    assert cli(d, "claim", "t1", "--owner", "a").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "fleetclaims", "--json", "claim", "t1",
                             "--owner", "b", "--wait", "30s"], env=cli_env(d),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["error"] == "interrupted" and "claims nothing" in doc["message"]
    assert json.loads(cli(d, "get", "t1", "--json").stdout)["owner"] == "a"


def test_run_of_a_command_that_cannot_start_answers_json(tmp_path: Path) -> None:
    """`--json run T -- /nonexistent` printed nothing on stdout (exit 127); it answers one
    document like run's other outcomes, and the claim is released."""
    d = tmp_path / "r"
    done = cli(d, "--json", "run", "t9", "--owner", "a", "--", str(tmp_path / "nope"))
    assert done.returncode == 127, done.stderr
    doc = json.loads(done.stdout)
    assert doc["outcome"] == "not_started" and doc["exit_code"] == 127 and doc["task"] == "t9"
    assert json.loads(cli(d, "get", "t9", "--json").stdout)["state"] == "released"
