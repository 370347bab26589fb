"""An agent's working day through the command line, with real processes: the owner from the
environment, recover without a short-lived owner process, parked claims that cannot wedge,
`run` stopping the command's whole process group, `run --next`, `add --from FILE`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fc_support import cli, cli_env

from fleetclaims import Registry

pytestmark = pytest.mark.integration


def start(directory: Path, *args: str, env: dict[str, str] | None = None,
          ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fleetclaims", *args], text=True,
                            env=cli_env(directory, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@pytest.mark.slow
def test_cli_recover_records_no_owner_process(tmp_path: Path) -> None:
    """`recover` from the CLI leaves no owner process on the claim (the command exits at once):
    the recovered claim is not stale a moment later; with --pid it names that process."""
    d = tmp_path / "r"
    assert cli(d, "claim", "t", "--owner", "a", "--ttl", "1s").returncode == 0
    time.sleep(1.1)
    done = cli(d, "recover", "t", "--owner", "b", "--reason", "a's lease ran out")
    assert done.returncode == 0, done.stderr
    time.sleep(0.2)
    reg = Registry(d)
    claim = reg.get("t")
    assert claim is not None and claim.owner == "b" and claim.identity is None
    assert reg.is_stale(claim) is None
    assert cli(d, "claim", "t", "--owner", "c", "--take-stale").returncode == 3  # not stolen

    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as keeper:
        assert cli(d, "claim", "u", "--owner", "a", "--ttl", "1s").returncode == 0
        time.sleep(1.1)
        assert cli(d, "recover", "u", "--owner", "b", "--reason", "x", "--pid",
                   str(keeper.pid)).returncode == 0
        got = reg.get("u")
        assert got is not None and got.identity is not None and got.identity.pid == keeper.pid
        keeper.kill()


@pytest.mark.slow
def test_fleetclaims_owner_is_honoured_by_claim_next_and_run(tmp_path: Path) -> None:
    """FLEETCLAIMS_OWNER names the owner of `claim`, `next` and `run` when --owner is absent;
    without either, they refuse (exit 2) and say how to name one."""
    d = tmp_path / "r"
    env = {"FLEETCLAIMS_OWNER": "agent-env"}
    assert json.loads(cli(d, "claim", "t1", "--json", env=env).stdout)["owner"] == "agent-env"
    Registry(d).add("q1")
    assert json.loads(cli(d, "next", "--json", env=env).stdout)["owner"] == "agent-env"
    ran = cli(d, "run", "t2", "--", sys.executable, "-c",
              "import os; print(os.environ['FLEETCLAIMS_OWNER'])", env=env)
    assert ran.returncode == 0 and ran.stdout.strip() == "agent-env"
    assert Registry(d).get("t2").owner == "agent-env"  # type: ignore[union-attr]
    for args in (("claim", "t3"), ("next",), ("run", "t4", "--", "true")):
        refused = cli(d, *args)
        assert refused.returncode == 2 and "FLEETCLAIMS_OWNER" in refused.stderr, args


@pytest.mark.slow
def test_a_parked_claim_without_owner_process_ends_after_its_maximum(tmp_path: Path) -> None:
    """A claim parked from the CLI (no owner process) records a maximum park time (1 day by
    default, --max-park to choose); once past it, sweep marks it stale and says why, explain
    tells the liveness source, and another agent can take the task over."""
    d = tmp_path / "r"
    token = json.loads(cli(d, "claim", "t", "--owner", "a", "--json").stdout)["token"]
    parked = cli(d, "transition", "t", "--token", token, "--phase", "review", "--json")
    doc = json.loads(parked.stdout)
    assert doc["ttl"] is None and doc["expires_at"] - time.time() == pytest.approx(86400, abs=60)
    assert cli(d, "transition", "t", "--token", token, "--phase", "review", "--max-park",
               "1s").returncode == 0
    assert cli(d, "renew", "t", "--token", token).returncode == 0  # renew does not extend it
    time.sleep(1.2)
    swept = cli(d, "sweep")
    assert "stale: parked in review past its maximum park time (which ended 20" in swept.stdout
    why = cli(d, "explain", "t").stdout
    assert "parked; ends with at most 1s" in why
    assert cli(d, "claim", "t", "--owner", "b", "--take-stale").returncode == 0


@pytest.mark.slow
def test_a_parked_claim_with_owner_process_ends_with_it(tmp_path: Path) -> None:
    """Parked with an owner process (--pid), the claim is stale as soon as that process dies,
    long before any maximum, and sweep says the owner is dead."""
    d = tmp_path / "r"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as owner:
        token = json.loads(cli(d, "claim", "t", "--owner", "a", "--pid", str(owner.pid),
                               "--json").stdout)["token"]
        assert cli(d, "transition", "t", "--token", token, "--phase", "review",
                   "--max-park", "1h").returncode == 0
        assert "nothing stale" in cli(d, "sweep", "--dry-run").stdout
        owner.kill()
        owner.wait()
    swept = cli(d, "sweep").stdout
    assert "owner dead" in swept, swept
    assert f"owner process {owner.pid}" in cli(d, "explain", "t").stdout


GRANDCHILD = """
import os, sys, time
path = sys.argv[1]
with open(path + '.pid', 'w') as f:
    f.write(str(os.getpid()))
while True:
    with open(path, 'a') as f:
        f.write('x\\n')
    time.sleep(0.05)
"""


def _grandchild_cmd(tmp_path: Path, trap: bool = False) -> tuple[list[str], Path]:
    """`sh -c` starting a Python grandchild that keeps appending to a file (ignoring SIGTERM
    when ``trap``), and waiting for it: the shape of `sh -c "make test"` -> the compiler."""
    script = tmp_path / "grandchild.py"
    script.write_text(GRANDCHILD if not trap else
                      "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + GRANDCHILD)
    out = tmp_path / "writes.txt"
    return ["sh", "-c", f"{sys.executable} {script} {out} & wait"], out


def _gone_and_quiet(out: Path) -> None:
    """The grandchild is gone and the file it wrote stops growing."""
    pid = int(out.with_name(out.name + ".pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"grandchild {pid} outlived the run")
    size = out.stat().st_size
    time.sleep(0.5)
    assert out.stat().st_size == size


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not (path.exists() and path.stat().st_size > 0):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


@pytest.mark.slow
def test_run_stops_the_grandchild_when_the_lease_is_lost(tmp_path: Path) -> None:
    """Lease lost (an operator force-releases): run stops the command's whole process group,
    so the grandchild stops writing at once, and exits 4."""
    d = tmp_path / "r"
    cmd, out = _grandchild_cmd(tmp_path)
    proc = start(d, "run", "t", "--owner", "a", "--ttl", "3s", "--", *cmd)
    _wait_for(out)
    Registry(d).release("t", force=True, reason="operator took it back")
    assert proc.wait(30) == 4
    _gone_and_quiet(out)
    proc.communicate()


@pytest.mark.slow
def test_run_ctrl_c_stops_the_group(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to run) reaches the whole group: the grandchild stops, the claim is
    released."""
    d = tmp_path / "r"
    cmd, out = _grandchild_cmd(tmp_path)
    proc = start(d, "run", "t", "--owner", "a", "--", *cmd)
    _wait_for(out)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    _gone_and_quiet(out)
    proc.communicate()
    assert Registry(d).get("t").state == "released"  # type: ignore[union-attr]


@pytest.mark.slow
def test_run_ctrl_z_stops_the_group_and_a_lost_claim_is_not_resumed(tmp_path: Path) -> None:
    """Ctrl-Z (SIGTSTP to run) stops the command's group with it, so nothing is written while
    the claim is not renewed; resumed after another owner took the task over, the group does
    not go on working: it is stopped and run exits 4. (The command used to keep running in
    its own session while run was stopped.)"""
    d = tmp_path / "r"
    cmd, out = _grandchild_cmd(tmp_path)
    proc = start(d, "run", "t", "--owner", "a", "--ttl", "2s", "--", *cmd)
    try:
        _wait_for(out)
        proc.send_signal(signal.SIGTSTP)
        time.sleep(0.5)
        paused = out.stat().st_size
        time.sleep(3)  # (past the 2 s lease)
        assert out.stat().st_size == paused, "the command worked on while run was stopped"
        taken = Registry(d).recover("t", owner="b", reason="stale")
        assert taken.owner == "b"
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(30) == 4
        _gone_and_quiet(out)
        assert out.stat().st_size - paused < 200  # (at most what was in flight as it stopped)
    finally:
        if proc.poll() is None:  # (a failure must not leave run and its group behind)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.communicate()


@pytest.mark.slow
def test_run_timeout_kills_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    """--timeout stops the group; a grandchild that ignores SIGTERM gets SIGKILL after --grace;
    run exits 124 and releases the claim."""
    d = tmp_path / "r"
    cmd, out = _grandchild_cmd(tmp_path, trap=True)
    started = time.monotonic()
    proc = start(d, "run", "t", "--owner", "a", "--timeout", "2s", "--grace", "1s", "--", *cmd)
    assert proc.wait(30) == 124
    assert 3 <= time.monotonic() - started < 15  # timeout + grace (+ start-up)
    _gone_and_quiet(out)
    _, err = proc.communicate()
    assert "ran past --timeout" in err
    assert Registry(d).get("t").state == "released"  # type: ignore[union-attr]


@pytest.mark.slow
def test_run_leaves_nothing_running_when_the_command_exits(tmp_path: Path) -> None:
    """A command that exits 0 leaving a background grandchild: the claim completes and the
    grandchild is stopped with it."""
    d = tmp_path / "r"
    script = tmp_path / "grandchild.py"
    script.write_text(GRANDCHILD)
    out = tmp_path / "writes.txt"
    proc = start(d, "run", "t", "--owner", "a", "--", "sh", "-c",
                 f"{sys.executable} {script} {out} & sleep 1")
    assert proc.wait(30) == 0
    _gone_and_quiet(out)
    proc.communicate()
    assert Registry(d).get("t").state == "completed"  # type: ignore[union-attr]


@pytest.mark.slow
def test_run_next_runs_the_best_ready_task(tmp_path: Path) -> None:
    """`run --next --label L` claims the best ready task with that label and gives its id to
    the command; nothing ready: exit 3 and nothing is started; --wait waits for one."""
    d = tmp_path / "r"
    reg = Registry(d)
    reg.add("later", priority=50, labels=["docs"])
    reg.add("first", priority=10, labels=["docs"])
    reg.add("other", priority=1)
    env = {"FLEETCLAIMS_OWNER": "agent-a"}
    ran = cli(d, "run", "--next", "--label", "docs", "--", sys.executable, "-c",
              "import os; print(os.environ['FLEETCLAIMS_TASK'])", env=env)
    assert ran.returncode == 0 and ran.stdout.strip() == "first"
    assert reg.get("first").state == "completed"  # type: ignore[union-attr]
    marker = tmp_path / "started"
    none = cli(d, "run", "--next", "--label", "nope", "--", "touch", str(marker), env=env)
    assert none.returncode == 3 and not marker.exists()
    assert none.stderr.startswith("fleetclaims: nothing ready to run")
    none = cli(d, "--json", "run", "--next", "--label", "nope", "--", "true", env=env)
    assert json.loads(none.stdout)["message"] == none.stderr[len("fleetclaims: "):].strip()
    waiting = start(d, "run", "--next", "--label", "late", "--wait", "20s", "--", sys.executable,
                    "-c", "import os; print(os.environ['FLEETCLAIMS_TASK'])", env=env)
    time.sleep(1.0)
    reg.add("arrives", labels=["late"])
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and out.strip() == "arrives"
    assert cli(d, "run", "t", "--next", "--", "true", env=env).returncode == 2


@pytest.mark.slow
def test_add_from_file_is_one_transaction(tmp_path: Path) -> None:
    """`add --from` takes JSON Lines or one JSON list (id, title, description, labels, priority,
    depends_on), all in one transaction: a bad item adds nothing; titles and descriptions show
    in `tasks`, `get`, `next` and `brief`."""
    d = tmp_path / "r"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n{"id": "b", "depends_on": ["b"]}\n')
    refused = cli(d, "add", "--from", str(bad))
    assert refused.returncode == 2 and "b -> b" in refused.stderr
    assert not Registry(d).tasks()
    jsonl = tmp_path / "tasks.jsonl"
    lines = [{"id": f"task-{i}", "title": f"Task number {i}", "priority": i,
              "labels": ["batch"], "depends_on": [f"task-{i - 1}"] if i else []}
             for i in range(30)]
    jsonl.write_text("# thirty tasks\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    started = time.monotonic()
    done = cli(d, "add", "--from", str(jsonl), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"tasks": 30, "events": 30}
    assert time.monotonic() - started < 5  # one process, one transaction (30 adds took 7 s)
    reg = Registry(d)
    added = [e for e in reg.events(types=["task_added"], limit=100).events]
    assert len(added) == 30 and len({e.data["seq"] for e in added}) == 30
    assert json.loads(cli(d, "add", "--from", str(jsonl), "--json").stdout)["events"] == 0

    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"id": "doc", "title": "Write the docs",
                                   "description": "Cover the agent's day.\nIn order."}]))
    assert cli(d, "add", "--from", str(listed)).returncode == 0
    assert "Task number 0" in cli(d, "tasks").stdout
    shown = cli(d, "get", "doc").stdout
    assert "Write the docs" in shown and "Cover the agent's day." in shown
    assert "Write the docs" in cli(d, "brief", "--owner", "x").stdout
    got = cli(d, "next", "--owner", "x", "--label", "batch").stdout
    assert "task-0" in got and "Task number 0" in got
