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


def test_an_unusable_login_name_is_not_the_operators_problem(reg: Path) -> None:
    """release --force records the login name as the actor; one that is no owner name is
    replaced by "operator" (it was refused naming no variable)."""
    env = {"USER": BAD_OWNER}
    done = cli(reg, "release", "t1", "--force", "--reason", "r", "--json", env=env)
    assert done.returncode == 0, done.stderr
    events = [json.loads(x) for x in (reg / "audit.jsonl").read_bytes().rstrip(b"\0")
              .splitlines()]
    assert events[-1]["actor"] == "operator"
