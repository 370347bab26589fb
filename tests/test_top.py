"""`fleetclaims top`: the screen as a pure function of the model, the model kept from a real
registry, the live view under a pseudo-terminal (redraw on appends, keys, NO_COLOR) and the
plain-text snapshot when not on a terminal."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.errors import ClaimConflict
from fleetclaims.review import top
from fleetclaims.testing import FakeClock

pytestmark = pytest.mark.integration

NOW = 1_700_000_000.0
SGR_COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-9](;[0-9]+)*m")


def model() -> top.Model:
    m = top.Model("/repo/.cache/fleetclaims", seq=42)
    m.held = [
        top.Held("build/x", "agent-a", "working", NOW - 100, NOW + 200, 300.0, False,
                 ("ci",), ("agent-b", "agent-c")),
        top.Held("docs", "agent-b", "review", NOW - 50, None, None, False, ("docs",)),
        top.Held("lint", "agent-c", "working", NOW - 500, NOW - 30, 60.0, True),
    ]
    m.recent.extend([(NOW - 5, "claim_rejected", "agent-c", "build/x",
                      "agent-c was refused build/x: held by a live lease"),
                     (NOW - 1, "claim_completed", "agent-d", "old", "agent-d completed old")])
    m.labels = {"build/x": ("ci",), "docs": ("docs",)}
    return m


def test_render_shows_held_tasks_time_left_and_waiters() -> None:
    """Each held task shows owner, phase, time left with a bar, and who waits for it; stale
    claims first and flagged, parked ones say so; recent events are narrated."""
    lines = top.render(model(), NOW, width=100, height=30)
    text = "\n".join(lines)
    assert "3 held · 1 stale · 2 waiting · filter: all" in lines[1]
    rows = [line for line in lines if line.startswith(("build/x", "docs", "lint"))]
    assert [r.split()[0] for r in rows] == ["lint", "build/x", "docs"]  # stale first
    lint, build, docs = rows
    assert "-30s" in lint and "stale" in lint
    assert "agent-a" in build and "working" in build and "3m 20s" in build
    assert "████████" in build and "░░░░" in build  # 200 s of 300: two thirds of the bar
    assert "agent-b, agent-c" in build
    assert "parked" in docs and "review" in docs
    assert "agent-c was refused build/x" in text and "keys: o owner" in text
    assert all(len(line) <= 100 for line in lines)
    assert not SGR_COLOUR.search(text)
    coloured = "\n".join(top.render(model(), NOW, width=100, height=30, colour=True))
    assert SGR_COLOUR.search(coloured) and "\x1b[31;1m-30s" in coloured


def test_filter_keys_cycle_owners_and_labels() -> None:
    """`o` steps through the owners, `l` through the labels, `c` clears; the rows and the
    recent events follow the filter."""
    m = model()
    m.cycle("o")
    assert m.owner == "agent-a"
    lines = top.render(m, NOW, width=100, height=30)
    assert "owner=agent-a" in lines[1]
    rows = [r for r in lines if r.startswith(("build/x", "docs", "lint"))]
    assert len(rows) == 1 and rows[0].startswith("build/x")
    for expected in ("agent-b", "agent-c", "agent-d", None):
        m.cycle("o")
        assert m.owner == expected
    m.cycle("l")
    assert m.label == "ci"
    rows = [r for r in top.render(m, NOW) if r.startswith(("build/x", "docs", "lint"))]
    assert [r.split()[0] for r in rows] == ["build/x"]
    m.cycle("c")
    assert m.owner is None and m.label is None


def test_snapshot_is_plain_text_and_lists_everything() -> None:
    """Off a terminal: no key help, every held task, no escape codes even with colour asked."""
    m = model()
    m.held = m.held * 20
    lines = top.render(m, NOW, width=80, height=10, tty=False)
    assert sum(line.startswith("build/x") for line in lines) == 20
    assert "keys:" not in "\n".join(lines) and "\x1b" not in "\n".join(lines)


def test_watcher_follows_a_real_registry(tmp_path: Path) -> None:
    """The model comes from the registry: held claims with labels, refused owners as waiters
    until the task is granted again, heartbeats left out of the recent events."""
    reg = Registry(tmp_path / "reg")
    reg.add("build/x", labels=["ci"])
    a = reg.claim("build/x", owner="agent-a", ttl=60)
    with pytest.raises(ClaimConflict):
        reg.claim("build/x", owner="agent-b", ttl=60)
    assert a.token is not None
    reg.renew("build/x", token=a.token)
    w = top.Watcher(reg, "here")
    assert w.poll() is True and w.poll() is False
    (held,) = w.model.held
    assert (held.task, held.owner, held.labels, held.waiters) == ("build/x", "agent-a",
                                                                  ("ci",), ("agent-b",))
    kinds = [r[1] for r in w.model.recent]
    assert "lease_renewed" not in kinds and kinds[-1] == "claim_rejected"
    reg.release("build/x", token=a.token)
    reg.claim("build/x", owner="agent-b", ttl=60)
    assert w.poll() is True
    (held,) = w.model.held
    assert (held.owner, held.waiters) == ("agent-b", ())
    reg.close()


def test_watcher_starts_near_the_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long journal is not replayed at start: only the last HISTORY events are read."""
    monkeypatch.setattr(top, "HISTORY", 3)
    reg = Registry(tmp_path / "reg")
    for i in range(8):
        reg.claim(f"t{i}", owner="agent-a", ttl=60)
    w = top.Watcher(reg, "here")
    w.poll()
    assert [r[3] for r in w.model.recent] == ["t5", "t6", "t7"] and w.model.seq == 9
    assert len(w.model.held) == 8  # the claims themselves come from the registry's state
    reg.close()


def _spawn_top(path: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[bytes],
                                                                        int]:
    """``fleetclaims top`` on the slave side of a new pseudo-terminal; returns the process and
    the master's descriptor."""
    master, slave = os.openpty()
    try:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 110, 0, 0))
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetclaims", "top", "--dir", str(path), *extra],
            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    finally:
        os.close(slave)
    return proc, master


class Screen:
    """Everything the child wrote to the terminal so far."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data = fd, b""

    def wait_for(self, needle: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while needle.encode() not in self.data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} not shown; got {self.data[-1500:]!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.data += os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    raise AssertionError(f"{needle!r} not shown before exit") from None
        return self.data.decode("utf-8", "replace")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(TERM="xterm-256color", **extra)
    return env


@pytest.mark.parametrize("no_color", [False, True])
@pytest.mark.slow
def test_live_view_under_a_pseudo_terminal(tmp_path: Path, no_color: bool) -> None:
    """On a terminal: the alternate screen, the held task, a redraw when another process
    appends to the journal, `o` filters by owner, `q` quits and restores the screen; with
    NO_COLOR the same view has no colour codes."""
    path = tmp_path / "reg"
    reg = Registry(path)
    reg.claim("build/x", owner="agent-a", ttl=300)
    proc, master = _spawn_top(path, _env(**({"NO_COLOR": "1"} if no_color else {})))
    screen = Screen(master)
    try:
        screen.wait_for("build/x")
        reg.claim("docs/new", owner="agent-b", ttl=300)  # an append: drawn without a key
        screen.wait_for("docs/new")
        os.write(master, b"o")
        screen.wait_for("owner=agent-a")
        os.write(master, b"q")
        assert proc.wait(timeout=10) == 0
        try:
            while select.select([master], [], [], 0.2)[0]:
                screen.data += os.read(master, 65536)
        except OSError:
            pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
        reg.close()
    out = screen.data.decode("utf-8", "replace")
    assert out.count("\x1b[?1049h") == 1 and out.rstrip().endswith("\x1b[?1049l")
    assert bool(SGR_COLOUR.search(out)) is not no_color
    assert "2 held" in out and "1 held · 0 stale · 0 waiting · filter: owner=agent-a" in out


def test_plain_snapshot_when_not_a_terminal(tmp_path: Path) -> None:
    """Piped: one plain-text snapshot (no escape codes, no key help) and exit 0 at once."""
    path = tmp_path / "reg"
    reg = Registry(path)
    reg.claim("build/x", owner="agent-a", ttl=300)
    reg.close()
    done = subprocess.run([sys.executable, "-m", "fleetclaims", "top", "--dir", str(path)],
                          capture_output=True, encoding="utf-8", timeout=60, env=_env(),
                          stdin=subprocess.DEVNULL, check=False)  # not the locale's: tests
    # elsewhere switch this process's locale to C
    assert done.returncode == 0, done.stderr
    assert "build/x" in done.stdout and "agent-a" in done.stdout and "1 held" in done.stdout
    assert "\x1b" not in done.stdout and "keys:" not in done.stdout


def test_json_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`top --json` is the same view as one JSON document."""
    import json

    from fleetclaims.cli import main

    reg = Registry(tmp_path / "reg")
    reg.claim("build/x", owner="agent-a", ttl=300)
    with pytest.raises(ClaimConflict):
        reg.claim("build/x", owner="agent-b", ttl=300)
    reg.close()
    assert main(["--dir", str(tmp_path / "reg"), "top", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(h["task"], h["owner"], h["waiters"]) for h in doc["held"]] == [
        ("build/x", "agent-a", ["agent-b"])]
    assert doc["seq"] == 3 and doc["recent"][-1]["type"] == "claim_rejected"


def test_top_does_not_slow_other_commands() -> None:
    """The live view's terminal modules are imported by `top` alone."""
    code = ("import sys; from fleetclaims.cli import main; main(['--version']); "
            "print(sorted(m for m in ('termios', 'tty', 'fleetclaims.review.top') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, encoding="utf-8",
                          timeout=60, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_time_left_is_told_by_the_clock_that_decides_expiry(file_registry: Registry,
                                                             clock: FakeClock) -> None:
    """After a wall-clock step of an hour, a live lease is neither stale nor shown with the
    wall clock's time left: the boot clock that decides expiry tells it (_reads.lease_left)."""
    file_registry.claim("t", owner="a", ttl=90)
    clock.advance(30)
    clock.step_wall(3600)
    watcher = top.Watcher(file_registry, "reg")
    watcher.poll()
    (held,) = watcher.model.held
    assert not held.stale and held.left(watcher.now()) == 60
    row = next(r for r in top.render(watcher.model, watcher.now()) if r.startswith("t "))
    assert "1m" in row and "stale" not in row, row


def test_a_default_registry_created_while_top_runs_appears(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """top on a default registry that no write has created yet shows it empty, and shows its
    claims as soon as a write creates it (without a restart)."""
    import argparse

    from fleetclaims.cli.args import reader

    where = tmp_path / "not-yet"
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(where))
    reg = reader(argparse.Namespace(dir=None, durability="full", allow_unsafe_fs=False))
    watcher = top.Watcher(reg, str(reg.location))
    assert not watcher.poll() and watcher.model.held == []
    writer = Registry(where)
    writer.claim("t1", owner="a")
    assert watcher.poll()
    assert [h.task for h in watcher.model.held] == ["t1"]
    writer.claim("t2", owner="b")
    assert watcher.poll()
    assert [h.task for h in watcher.model.held] == ["t1", "t2"]
    writer.close()
    watcher.reg.close()
