"""The fencing guard and its git hooks, on real git repositories with real subprocesses."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.agents.hooks import CHAINED_SUFFIX, script

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_NOSYSTEM": "1"}
CLAIM_VARS = ("FLEETCLAIMS_TASK", "FLEETCLAIMS_TOKEN", "FLEETCLAIMS_FENCE", "FLEETCLAIMS_OWNER")


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLAIM_VARS}
    env.update(GIT_ENV, HOME=str(tmp_path / "home"))  # no user git config leaks in
    env.update(extra)
    return env


def fc(tmp_path: Path, *args: str, cwd: Path | str | None = None,
       **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], capture_output=True,
                          text=True, env=environ(tmp_path, **extra), cwd=cwd, timeout=60,
                          check=False)


def git(repo: Path, *args: str, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env,
                          timeout=60, check=check)


def claim_env(c_token: str, fence: int, task: str = "t1") -> dict[str, str]:
    return {"FLEETCLAIMS_TASK": task, "FLEETCLAIMS_TOKEN": c_token,
            "FLEETCLAIMS_FENCE": str(fence)}


def registry_bytes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    (tmp_path / "home").mkdir()
    git(path, "init", "-q", "-b", "main", env=environ(tmp_path))
    (path / "a.txt").write_text("one\n")
    git(path, "add", "a.txt", env=environ(tmp_path))
    git(path, "commit", "-qm", "first", env=environ(tmp_path))
    return path


def commit(repo: Path, tmp_path: Path, text: str,
           **extra: str) -> subprocess.CompletedProcess[str]:
    (repo / "a.txt").write_text(text)
    git(repo, "add", "a.txt", env=environ(tmp_path))
    return git(repo, "commit", "-qm", f"change {text.strip()}", env=environ(tmp_path, **extra),
               check=False)


def head(repo: Path, tmp_path: Path) -> str:
    return git(repo, "rev-parse", "HEAD", env=environ(tmp_path)).stdout.strip()


# --- guard ------------------------------------------------------------------------------------


def test_guard_silent_outside_a_claimed_run(tmp_path: Path) -> None:
    """Without FLEETCLAIMS_TASK the guard exits 0, prints nothing and creates no registry."""
    done = fc(tmp_path, "guard", "--dir", str(tmp_path / "never"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_guard_passes_the_holder_and_refuses_every_kind_of_loss(tmp_path: Path) -> None:
    """Live holder: 0. Recovered, handed off, completed, wrong fence, expired, half-set
    environment, no registry: refused with the reason. The guard never writes."""
    d = tmp_path / "reg"
    with Registry(d) as reg:
        a = reg.claim("t1", owner="agent-a", ttl=60, process=False)
        h = reg.claim("t2", owner="agent-a", ttl=60, process=False)
        x = reg.claim("t3", owner="agent-a", ttl=60, process=False)
        e = reg.claim("t4", owner="agent-a", ttl=1, process=False)
        assert a.token and h.token and x.token and e.token
        reg.handoff("t2", token=h.token, to_owner="agent-b")
        reg.complete("t3", token=x.token)
    before = registry_bytes(d)

    def guard(token: str, fence: int, task: str, *more: str) -> subprocess.CompletedProcess[str]:
        return fc(tmp_path, "guard", "--dir", str(d), *more, **claim_env(token, fence, task))

    assert guard(a.token, 1, "t1").returncode == 0
    doc = json.loads(guard(a.token, 1, "t1", "--json").stdout)
    assert doc["ok"] is True and doc["holder"] == "agent-a"

    wrong_fence = guard(a.token, 7, "t1")
    assert wrong_fence.returncode == 4 and "fence 1, not 7" in wrong_fence.stderr

    handed = guard(h.token, h.fence, "t2", "--hook", "pre-commit")
    assert handed.returncode == 4
    assert "commit refused" in handed.stderr and "handed it off to 'agent-b'" in handed.stderr

    done = guard(x.token, x.fence, "t3")
    assert done.returncode == 3 and "completed" in done.stderr

    time.sleep(1.1)  # t4's 1 s lease runs out
    expired = guard(e.token, e.fence, "t4", "--json")
    assert expired.returncode == 4 and json.loads(expired.stdout)["code"] == "lease_expired"

    half = fc(tmp_path, "guard", "--dir", str(d), FLEETCLAIMS_TASK="t1")
    assert half.returncode == 2 and "FLEETCLAIMS_TOKEN and FLEETCLAIMS_FENCE" in half.stderr

    nowhere = fc(tmp_path, "guard", "--dir", str(tmp_path / "none"), **claim_env(a.token, 1))
    assert nowhere.returncode != 0 and "no registry" in nowhere.stderr
    assert not (tmp_path / "none").exists()
    assert registry_bytes(d) == before  # read only: not a byte changed

    with Registry(d) as reg:
        reg.recover("t4", owner="agent-b", reason="agent-a went quiet")
    before = registry_bytes(d)
    taken = guard(e.token, e.fence, "t4")
    assert taken.returncode == 4 and "taken over by 'agent-b'" in taken.stderr
    assert "Stop working on it" in taken.stderr
    assert registry_bytes(d) == before


# --- hooks ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_commit_by_a_holder_whose_lease_was_recovered_is_refused(repo: Path,
                                                                 tmp_path: Path) -> None:
    """The issue's proof: commits pass while the claim is live (with a Claim trailer), are
    refused once someone else recovered it, and outside a claimed run nothing changes."""
    d = tmp_path / "reg"
    assert fc(tmp_path, "hooks", "install", cwd=repo).returncode == 0
    with Registry(d) as reg:
        c = reg.claim("t1", owner="agent-a", ttl=1, process=False)
    assert c.token
    env = {"FLEETCLAIMS_DIR": str(d), **claim_env(c.token, c.fence)}
    ok = commit(repo, tmp_path, "two\n", **env)
    assert ok.returncode == 0, ok.stderr
    message = git(repo, "log", "-1", "--format=%B", env=environ(tmp_path)).stdout
    assert "Claim: t1 fence 1" in message.splitlines()

    time.sleep(1.1)
    with Registry(d) as reg:
        reg.recover("t1", owner="agent-b", reason="agent-a stopped renewing")
    before = head(repo, tmp_path)
    refused = commit(repo, tmp_path, "three\n", **env)
    assert refused.returncode != 0
    assert "commit refused" in refused.stderr and "agent-b" in refused.stderr
    assert head(repo, tmp_path) == before

    plain = commit(repo, tmp_path, "four\n", FLEETCLAIMS_DIR=str(d))  # no claimed run
    assert plain.returncode == 0, plain.stderr
    assert "Claim:" not in git(repo, "log", "-1", "--format=%B", env=environ(tmp_path)).stdout


def test_run_then_commit_inside_it_gets_the_trailer(repo: Path, tmp_path: Path) -> None:
    """`fleetclaims run --dir D ... -- git commit` commits under the claim; hooks work with a
    PATH that has no fleetclaims on it (they call this installation by absolute path)."""
    assert fc(tmp_path, "hooks", "install", cwd=repo).returncode == 0
    (repo / "a.txt").write_text("run\n")
    git(repo, "add", "a.txt", env=environ(tmp_path))
    git_dir = os.path.dirname(shutil.which("git") or "/usr/bin/git")
    # --dir differs from FLEETCLAIMS_DIR (set by the autouse fixture): run passes its registry
    # on to the command, so the guard in the hook checks the right one.
    d = tmp_path / "run-registry"
    done = fc(tmp_path, "run", "t9", "--owner", "agent-a", "--dir", str(d), "--", "git", "commit",
              "-qm", "via run", cwd=repo, PATH=f"{git_dir}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    with Registry(d) as reg:
        claim = reg.get("t9")
    assert claim is not None and claim.state == "completed"
    message = git(repo, "log", "-1", "--format=%B", env=environ(tmp_path)).stdout
    assert f"Claim: t9 fence {claim.fence}" in message


def test_existing_hooks_are_chained_and_restored_exactly(repo: Path, tmp_path: Path) -> None:
    """A pre-commit hook already there still runs (after the guard) and gets its arguments;
    uninstall puts it back byte for byte with its mode; install twice changes nothing more."""
    hooks = repo / ".git" / "hooks"
    original = f"#!/bin/sh\necho ran >> {tmp_path / 'chained.log'}\n"
    (hooks / "pre-commit").write_text(original)
    (hooks / "pre-commit").chmod(0o750)
    done = fc(tmp_path, "hooks", "install", "--json", cwd=repo)
    assert done.returncode == 0, done.stderr
    actions = {h["hook"]: h["action"] for h in json.loads(done.stdout)["hooks"]}
    assert actions == {"pre-commit": "chained", "pre-push": "installed",
                       "prepare-commit-msg": "installed"}
    assert (hooks / ("pre-commit" + CHAINED_SUFFIX)).read_text() == original
    again = json.loads(fc(tmp_path, "hooks", "install", "--json", cwd=repo).stdout)
    assert {h["action"] for h in again["hooks"]} == {"updated"}
    assert (hooks / ("pre-commit" + CHAINED_SUFFIX)).read_text() == original

    assert commit(repo, tmp_path, "x\n").returncode == 0
    assert (tmp_path / "chained.log").read_text() == "ran\n"

    assert fc(tmp_path, "hooks", "uninstall", cwd=repo).returncode == 0
    assert (hooks / "pre-commit").read_text() == original
    assert stat.S_IMODE((hooks / "pre-commit").stat().st_mode) == 0o750
    assert not (hooks / "pre-push").exists() and not (hooks / "prepare-commit-msg").exists()
    assert not list(hooks.glob("*" + CHAINED_SUFFIX))


def test_a_hook_that_links_to_another_is_kept_and_restored(repo: Path, tmp_path: Path) -> None:
    """pre-push a symlink to the user's pre-commit: install chains it (still leading to the
    user's hook) and uninstall restores both exactly. It used to be taken for ours (the link
    led to our new pre-commit), overwritten, and deleted by uninstall."""
    hooks = repo / ".git" / "hooks"
    original = f"#!/bin/sh\necho ran >> {tmp_path / 'linked.log'}\n"
    (hooks / "pre-commit").write_text(original)
    (hooks / "pre-commit").chmod(0o755)
    (hooks / "pre-push").symlink_to("pre-commit")
    done = fc(tmp_path, "hooks", "install", "--json", cwd=repo)
    assert done.returncode == 0, done.stderr
    actions = {h["hook"]: h["action"] for h in json.loads(done.stdout)["hooks"]}
    assert actions["pre-commit"] == actions["pre-push"] == "chained", actions
    chained = hooks / ("pre-push" + CHAINED_SUFFIX)
    assert chained.is_symlink() and chained.read_text() == original  # (the user's hook)
    assert fc(tmp_path, "hooks", "uninstall", cwd=repo).returncode == 0
    assert (hooks / "pre-push").is_symlink()
    assert os.readlink(hooks / "pre-push") == "pre-commit"
    assert (hooks / "pre-commit").read_text() == original
    assert not list(hooks.glob("*" + CHAINED_SUFFIX))


def test_core_hooks_path_is_honoured(repo: Path, tmp_path: Path) -> None:
    """With core.hooksPath set, hooks go there and .git/hooks is left alone."""
    git(repo, "config", "core.hooksPath", "ci-hooks", env=environ(tmp_path))
    before = sorted(p.name for p in (repo / ".git" / "hooks").iterdir())
    assert fc(tmp_path, "hooks", "install", "--repo", str(repo)).returncode == 0
    assert (repo / "ci-hooks" / "pre-commit").read_text() == script("pre-commit")
    assert sorted(p.name for p in (repo / ".git" / "hooks").iterdir()) == before


def test_pre_push_refuses_and_chains_stdin(repo: Path, tmp_path: Path) -> None:
    """pre-push refuses a push under a lost claim; otherwise the chained hook gets the refs."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote), env=environ(tmp_path))
    git(repo, "remote", "add", "origin", str(remote), env=environ(tmp_path))
    hooks = repo / ".git" / "hooks"
    (hooks / "pre-push").write_text(f"#!/bin/sh\ncat > {tmp_path / 'refs.txt'}\n")
    (hooks / "pre-push").chmod(0o755)
    assert fc(tmp_path, "hooks", "install", "--no-trailer", cwd=repo).returncode == 0
    assert not (hooks / "prepare-commit-msg").exists()

    d = tmp_path / "reg"
    with Registry(d) as reg:
        c = reg.claim("t1", owner="agent-a", ttl=60, process=False)
        assert c.token
        reg.release("t1", token=c.token)
    env = environ(tmp_path, FLEETCLAIMS_DIR=str(d), **claim_env(c.token, c.fence))
    refused = git(repo, "push", "-q", "origin", "main", env=env, check=False)
    assert refused.returncode != 0 and "push refused" in refused.stderr
    assert not (tmp_path / "refs.txt").exists()

    pushed = git(repo, "push", "-q", "origin", "main", env=environ(tmp_path), check=False)
    assert pushed.returncode == 0, pushed.stderr
    assert "refs/heads/main" in (tmp_path / "refs.txt").read_text()


def test_install_refuses_rather_than_overwrite(repo: Path, tmp_path: Path) -> None:
    """A foreign hook plus a leftover chained file: refused, nothing changed."""
    hooks = repo / ".git" / "hooks"
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (hooks / ("pre-commit" + CHAINED_SUFFIX)).write_text("#!/bin/sh\nexit 1\n")
    before = {p.name: p.read_bytes() for p in hooks.iterdir()}
    done = fc(tmp_path, "hooks", "install", cwd=repo)
    assert done.returncode == 2 and "nothing was changed" in done.stderr
    assert {p.name: p.read_bytes() for p in hooks.iterdir()} == before


def test_hooks_outside_a_repository(tmp_path: Path) -> None:
    """hooks install outside git: a usage error that says so."""
    (tmp_path / "plain").mkdir()
    done = fc(tmp_path, "hooks", "install", cwd=tmp_path / "plain",
              GIT_CEILING_DIRECTORIES=str(tmp_path))
    assert done.returncode == 2 and "not inside a git repository" in done.stderr


def test_install_without_the_trailer_takes_an_earlier_trailer_hook_out(repo: Path,
                                                                        tmp_path: Path) -> None:
    """`hooks install --no-trailer` after a plain install removes the trailer hook it put
    there (commits used to go on getting the trailer); the guard hooks stay."""
    hooks = repo / ".git" / "hooks"
    assert fc(tmp_path, "hooks", "install", cwd=repo).returncode == 0
    assert (hooks / "prepare-commit-msg").exists()
    done = fc(tmp_path, "hooks", "install", "--no-trailer", cwd=repo)
    assert done.returncode == 0, done.stderr
    assert not (hooks / "prepare-commit-msg").exists()
    assert (hooks / "pre-commit").exists() and (hooks / "pre-push").exists()


def test_the_guard_outside_a_repository_says_so(tmp_path: Path) -> None:
    """`guard --hook pre-commit` outside any repository: one clear message, not git's usage
    text for diff (about 100 lines) and advice to run git fsck."""
    out = tmp_path / "nowhere"
    out.mkdir()
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "fleetclaims", "--dir", str(tmp_path / "r"),
                           "guard", "--hook", "pre-commit"], cwd=out, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "not inside a git repository" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) <= 3 and "fsck" not in done.stderr
