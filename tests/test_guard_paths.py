"""The guard's path check in a real repository: two agents in two worktrees reserve disjoint and
overlapping paths; commits (edits, renames, deletions) and pushes touching the other agent's
reserved files are refused, their own and unreserved ones pass, and the requirePaths setting
refuses unreserved ones too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]

GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "t@example.com",
           "GIT_CONFIG_NOSYSTEM": "1"}
CLAIM_VARS = ("FLEETCLAIMS_TASK", "FLEETCLAIMS_TOKEN", "FLEETCLAIMS_FENCE", "FLEETCLAIMS_OWNER")


class Agent:
    """One agent: its name, its worktree, and the shared registry."""

    def __init__(self, name: str, tree: Path, tmp: Path) -> None:
        self.name, self.tree, self.tmp = name, tree, tmp

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CLAIM_VARS}
        env.update(GIT_ENV, HOME=str(self.tmp / "home"), FLEETCLAIMS_OWNER=self.name,
                   FLEETCLAIMS_DIR=str(self.tmp / "registry"))
        return env

    def fc(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetclaims", *args], cwd=self.tree,
                              env=self.env(), capture_output=True, text=True, timeout=60,
                              check=False)

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=self.tree, env=self.env(),
                              capture_output=True, text=True, timeout=60, check=check)

    def write(self, rel: str, text: str) -> None:
        path = self.tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.git("add", rel)

    def commit(self, message: str) -> subprocess.CompletedProcess[str]:
        return self.git("commit", "-qm", message, check=False)

    def reset(self) -> None:
        """Drop whatever is staged (after a refused commit)."""
        self.git("reset", "-q", "--hard", "HEAD")


@pytest.fixture
def agents(tmp_path: Path) -> tuple[Agent, Agent, Path]:
    (tmp_path / "home").mkdir()
    main = tmp_path / "main"
    main.mkdir()
    admin = Agent("admin", main, tmp_path)
    admin.git("init", "-q", "-b", "main")
    for rel in ("src/parser/lexer.py", "src/cli/main.py", "docs/guide.md"):
        admin.write(rel, "v1\n")
    admin.git("commit", "-qm", "first")
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True, env=admin.env())
    admin.git("remote", "add", "origin", str(remote))
    admin.git("push", "-q", "origin", "main")
    assert admin.fc("hooks", "install", "--no-trailer").returncode == 0
    trees = []
    for name in ("a", "b"):
        admin.git("worktree", "add", "-q", "-b", f"agent-{name}", str(tmp_path / f"wt-{name}"))
        trees.append(Agent(f"agent-{name}", tmp_path / f"wt-{name}", tmp_path))
    return trees[0], trees[1], remote


def test_two_agents_in_two_worktrees(agents: tuple[Agent, Agent, Path]) -> None:
    """Disjoint reservations coexist, an overlapping claim is refused naming the holder; the
    pre-commit hook refuses the other agent's reserved file (edit, rename out of it, rename
    into it, deletion) naming file, holder and task, and passes one's own and free paths."""
    a, b, _ = agents
    assert a.fc("claim", "lexer", "--paths", "src/parser/**").returncode == 0
    assert b.fc("claim", "cli", "--paths", "src/cli", "--shared", "docs").returncode == 0
    refused = b.fc("claim", "refactor", "--paths", "src/parser/*.py")
    assert refused.returncode == 3
    assert "agent-a" in refused.stderr and "'lexer'" in refused.stderr

    b.write("src/parser/lexer.py", "b's change\n")
    done = b.commit("b edits the lexer")
    assert done.returncode != 0
    for word in ("src/parser/lexer.py", "agent-a", "'lexer'", "commit refused"):
        assert word in done.stderr, (word, done.stderr)
    b.reset()
    b.git("mv", "src/parser/lexer.py", "src/lexer.py")
    assert b.commit("b moves the lexer out").returncode != 0
    b.reset()
    b.git("mv", "docs/guide.md", "src/parser/guide.md")
    assert b.commit("b moves a file into the parser").returncode != 0
    b.reset()
    b.git("rm", "-q", "src/parser/lexer.py")
    assert b.commit("b deletes the lexer").returncode != 0
    b.reset()

    b.write("src/cli/main.py", "b's cli\n")
    b.write("README.md", "nobody reserved this\n")
    assert b.commit("b edits its own and free paths").returncode == 0
    a.write("src/parser/lexer.py", "a's change\n")
    assert a.commit("a edits its own reservation").returncode == 0


def test_require_paths_and_release(agents: tuple[Agent, Agent, Path]) -> None:
    """With fleetclaims.requirePaths a path none of the committer's claims reserved is
    refused until reserved; a released claim's paths are anyone's again."""
    a, b, _ = agents
    claimed = a.fc("claim", "lexer", "--paths", "src/parser", "--json")
    assert claimed.returncode == 0
    token = __import__("json").loads(claimed.stdout)["token"]
    b.git("config", "fleetclaims.requirePaths", "true")
    assert b.fc("claim", "docs-task").returncode == 0
    b.write("docs/guide.md", "b's docs\n")
    done = b.commit("unreserved")
    assert done.returncode != 0 and "not reserved by your" in done.stderr
    b.reset()
    # reserve needs the claim's token: take it from a --json claim of another task
    got = b.fc("claim", "docs2", "--json")
    b_token = __import__("json").loads(got.stdout)["token"]
    assert b.fc("reserve", "docs2", "docs", "--token", b_token).returncode == 0
    b.write("docs/guide.md", "b's docs\n")
    assert b.commit("reserved now").returncode == 0
    assert a.fc("release", "lexer", "--token", token).returncode == 0
    assert b.fc("reserve", "docs2", "src/parser", "--token", b_token).returncode == 0
    b.write("src/parser/lexer.py", "b's lexer\n")
    assert b.commit("the lexer is b's now").returncode == 0


def test_pre_push_refuses_commits_touching_reserved_paths(
        agents: tuple[Agent, Agent, Path]) -> None:
    """A commit that skipped the pre-commit hook is caught at push: refused while another
    claim reserves the file, pushed once the reservation is gone."""
    a, b, _ = agents
    claimed = a.fc("claim", "lexer", "--paths", "src/parser", "--json")
    token = __import__("json").loads(claimed.stdout)["token"]
    b.write("src/parser/lexer.py", "sneaky\n")
    b.git("commit", "-qm", "no hook", "--no-verify")
    pushed = b.git("push", "-q", "origin", "agent-b", check=False)
    assert pushed.returncode != 0
    assert "push refused" in pushed.stderr and "agent-a" in pushed.stderr
    # (the commit is made: the advice is about the pushed commits, not the index)
    assert "git revert" in pushed.stderr and "restore --staged" not in pushed.stderr
    assert a.fc("release", "lexer", "--token", token).returncode == 0
    pushed = b.git("push", "-q", "origin", "agent-b", check=False)
    assert pushed.returncode == 0, pushed.stderr


def test_pre_push_sees_what_a_merge_commit_changed_itself(
        agents: tuple[Agent, Agent, Path]) -> None:
    """An edit made while merging (the merge commit's own change, committed with --no-verify)
    is caught at push; a plain merge of someone's branch that changes no reserved file
    itself passes. `git log --name-only` listed no files for a merge commit."""
    a, b, _ = agents
    a.fc("claim", "lexer", "--paths", "src/parser")
    b.git("checkout", "-q", "-b", "side")
    b.write("docs/guide.md", "v2\n")
    b.commit("docs")
    b.git("checkout", "-q", "agent-b")
    b.write("docs/other.md", "x\n")
    b.commit("other")
    b.git("merge", "-q", "--no-ff", "--no-commit", "side")
    b.write("src/parser/lexer.py", "edited while merging\n")
    b.git("commit", "-qm", "merge side", "--no-verify")
    pushed = b.git("push", "-q", "origin", "agent-b", check=False)
    assert pushed.returncode != 0 and "src/parser/lexer.py" in pushed.stderr, pushed.stderr
    b.git("reset", "-q", "--hard", "HEAD~1")
    b.git("merge", "-q", "--no-ff", "-m", "merge side", "side")
    pushed = b.git("push", "-q", "origin", "agent-b", check=False)
    assert pushed.returncode == 0, pushed.stderr


def test_pre_push_to_a_url_checks_only_what_is_new_there(
        agents: tuple[Agent, Agent, Path]) -> None:
    """A push by URL (no remote-tracking branches for it) sends only the new commits: a branch
    that adds an unreserved file passes even though older, already-pushed commits touched a
    reserved one. `--remotes=<url>` matched nothing, so the whole history was checked."""
    a, b, remote = agents
    a.fc("claim", "lexer", "--paths", "src/parser")
    b.write("NOTES.md", "x\n")
    b.commit("notes")
    pushed = b.git("push", "-q", str(remote), "agent-b", check=False)
    assert pushed.returncode == 0, pushed.stderr


def test_reservations_are_refused_on_a_remote_lease(agents: tuple[Agent, Agent, Path]) -> None:
    """`claim --remote --paths` is refused (exit 2, nothing claimed) rather than granted with
    the reservation silently dropped, which let an overlapping claim through."""
    a, b, _ = agents
    refused = a.fc("claim", "t", "--remote", "origin", "--paths", "src")
    assert refused.returncode == 2 and "remote" in refused.stderr, refused.stderr
    assert b.fc("claim", "u", "--paths", "src/parser").returncode == 0


def test_the_guard_fails_closed_on_a_damaged_journal(tmp_path: Path) -> None:
    """A damaged journal line before a reservation: the verified state shows no reservation,
    and a change touching the reserved files passed (exit 0). The guard now refuses every
    change while the registry is damaged, saying what to run."""
    from fleetclaims import Registry
    from fleetclaims.agents import guard_paths

    d = tmp_path / "r"
    reg = Registry(d, durability="process")
    reg.claim("first", owner="zed")
    reg.store.checkpoint()  # type: ignore[attr-defined]  # (the damage must follow the snapshot)
    early = (d / "claims.json").read_bytes()
    reg.claim("second", owner="zed")
    reg.claim("lx", owner="ana", paths=["src/parser"])
    reg.close()
    (d / "claims.json").write_bytes(early)  # (as a writer killed before its checkpoint left it)
    path = d / "audit.jsonl"
    data = bytearray(path.read_bytes())
    at = data.index(b'"task":"second"')
    data[at + 9] = ord("X")
    path.write_bytes(bytes(data))
    damaged = Registry(d)
    assert damaged.get("lx") is None  # (what the damage hides)
    found = guard_paths.check(damaged, ["src/parser/lexer.py"], {})
    assert not found.ok and found.code == "audit_corrupt" and "doctor" in found.next_action
