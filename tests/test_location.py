"""Where the registry lives: explicit path, environment, git main worktree, user state dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclaims.location import SUBDIR, git_main_worktree, resolve

pytestmark = pytest.mark.integration


def _git(*args: str, cwd: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)


def test_all_worktrees_share_the_main_worktree_registry(tmp_path: Path) -> None:
    """A linked worktree (git worktree add) resolves to the main working tree's .cache."""
    main = tmp_path / "repo"
    main.mkdir()
    _git("init", "-q", cwd=main)
    (main / "f").write_text("x")
    _git("add", "f", cwd=main)
    _git("commit", "-q", "-m", "init", cwd=main)
    _git("worktree", "add", "-q", str(tmp_path / "wt"), cwd=main)
    (main / "sub" / "dir").mkdir(parents=True)
    assert git_main_worktree(main / "sub" / "dir") == main
    assert git_main_worktree(tmp_path / "wt") == main.resolve()


def test_environment_and_explicit_paths_win(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit path wins over FLEETCLAIMS_URL, which wins over FLEETCLAIMS_DIR."""
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(tmp_path / "env"))
    assert resolve() == str(tmp_path / "env")
    monkeypatch.setenv("FLEETCLAIMS_URL", "postgresql://u@h/db")
    assert resolve() == "postgresql://u@h/db"
    assert resolve(tmp_path / "explicit") == str(tmp_path / "explicit")


def test_inside_a_repository_and_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a repository: <main worktree>/.cache/fleetclaims; outside: the state dir."""
    monkeypatch.delenv("FLEETCLAIMS_DIR", raising=False)
    monkeypatch.delenv("FLEETCLAIMS_URL", raising=False)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert resolve(cwd=repo) == str(repo / SUBDIR)
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert git_main_worktree(outside) is None  # pytest's tmp_path is outside any repository
    assert resolve(cwd=outside).startswith(str(tmp_path / "state"))
