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


# --- paths that are refused, and what is (not) created (issue 18) -----------------------------


@pytest.mark.parametrize("path", ["", "   ", "a\x00b", "~nosuchuser-fc/x", "a\udcffb", 5, b"x"])
def test_unusable_registry_paths_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             path: object) -> None:
    """An empty path (an unset shell variable), a NUL, an unknown user's home, a path that is
    not valid text, or not a path at all: ValidationError, and the current directory is not
    made a registry."""
    import fleetclaims

    monkeypatch.chdir(tmp_path)
    with pytest.raises(fleetclaims.ValidationError):
        fleetclaims.Registry(path).claim("t", owner="a")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("env, path", [
    ("postgresql:/u:secret@127.0.0.1:5432/claims", None),  # one slash
    ("u:secret@127.0.0.1:5432/claims", None),  # no scheme
    (None, "postgresql:/u:secret@127.0.0.1:5432/claims"),
    (None, "postgres:claims"),
])
def test_a_mistyped_postgresql_url_never_becomes_a_local_registry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None,
        path: str | None) -> None:
    """A typo in FLEETCLAIMS_URL (or --dir) made a file registry in the current directory,
    named after the URL, password and all: two machines each held the same task. Refused,
    typed, without the password in the message, and nothing is created."""
    import fleetclaims

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLEETCLAIMS_DIR", raising=False)
    if env is None:
        monkeypatch.delenv("FLEETCLAIMS_URL", raising=False)
    else:
        monkeypatch.setenv("FLEETCLAIMS_URL", env)
    with pytest.raises(fleetclaims.ValidationError) as caught:
        fleetclaims.Registry(path).claim("t", owner="a")
    assert "secret" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_only_a_write_creates_a_registry(tmp_path: Path) -> None:
    """create=False, a read command and merge never create anything where there is no
    registry (no stray claims.lock); a write to a directory that does not exist creates it,
    with its .gitignore."""
    import fleetclaims
    from fleetclaims.cli import main

    missing, plain = tmp_path / "missing", tmp_path / "plain"
    plain.mkdir()
    for where in (missing, plain):
        with pytest.raises(fleetclaims.RegistryNotFound):
            fleetclaims.Registry(where, create=False)
        assert main(["claims", "--dir", str(where)]) == 2
    reg = fleetclaims.Registry(tmp_path / "reg")
    for other in (missing, plain, str(plain)):
        with pytest.raises(fleetclaims.RegistryNotFound):
            reg.merge(other)
    assert not missing.exists() and list(plain.iterdir()) == []
    reg.claim("t", owner="a")
    assert (tmp_path / "reg" / ".gitignore").read_text().strip().endswith("*")
    assert fleetclaims.Registry(tmp_path / "reg", create=False).get("t") is not None


@pytest.mark.parametrize("path", [
    "/Users/a/Library/CloudStorage/GoogleDrive-a@b.c/My Drive/repo",
    "/Users/a/Library/CloudStorage/OneDrive-Contoso/repo",
    "/Users/a/Library/Mobile Documents/com~apple~CloudDocs/repo",
    "/home/a/dropbox/repo", "/home/a/DROPBOX/repo", "/home/a/Dropbox (Personal)/repo",
    "/home/a/OneDrive - Contoso/repo", "/home/a/SynologyDrive/repo",
    "/home/a/Synology Drive/repo", "/home/a/Google Drive/repo", "/home/a/iCloud Drive/repo",
])
def test_cloud_folders_are_detected(path: str) -> None:
    """Every listed cloud-sync folder is detected, in any letter case."""
    from fleetclaims.system import cloud_folder

    assert cloud_folder(Path(path)) is not None


def test_syncthing_folder_and_the_override(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory under a Syncthing root (.stfolder) is refused, with the override named;
    allow_unsafe_fs=True (or FLEETCLAIMS_ALLOW_UNSAFE_FS=1) allows it; a plain directory and
    a folder merely named like a word inside a name (my-dropboxes) are not refused."""
    import fleetclaims
    from fleetclaims.system import cloud_folder

    monkeypatch.delenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", raising=False)
    assert cloud_folder(tmp_path / "my-dropboxes" / "x") is None
    synced = tmp_path / "sync"
    (synced / ".stfolder").mkdir(parents=True)
    with pytest.raises(fleetclaims.UnsafeRegistry) as info:
        fleetclaims.Registry(synced / "repo" / "reg").claim("t", owner="a")
    assert "Syncthing" in str(info.value) and "FLEETCLAIMS_ALLOW_UNSAFE_FS=1" in str(info.value)
    fleetclaims.Registry(synced / "repo" / "reg", allow_unsafe_fs=True).claim("t", owner="a")
    monkeypatch.setenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", "1")
    assert fleetclaims.Registry(synced / "repo" / "reg").get("t") is not None


def test_the_cli_honours_the_unsafe_fs_variable_and_a_refusal_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's --allow-unsafe-fs default (False) overrode FLEETCLAIMS_ALLOW_UNSAFE_FS=1, and
    the refused claim had already created the directory and its .gitignore."""
    from fleetclaims.cli import main

    reg = tmp_path / "Dropbox" / "reg"
    monkeypatch.delenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", raising=False)
    assert main(["--dir", str(reg), "claim", "t", "--owner", "a"]) == 1
    assert not (tmp_path / "Dropbox").exists()
    monkeypatch.setenv("FLEETCLAIMS_ALLOW_UNSAFE_FS", "1")
    assert main(["--dir", str(reg), "claim", "t", "--owner", "a"]) == 0
    capsys.readouterr()


def test_lock_timeout_from_the_environment_is_typed(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """FLEETCLAIMS_LOCK_TIMEOUT that is not a number of seconds from 0 to 86400 is a
    ValidationError naming the variable; a good one is used."""
    import fleetclaims

    for bad in ("abc", "nan", "-1", "inf", "1e9"):
        monkeypatch.setenv("FLEETCLAIMS_LOCK_TIMEOUT", bad)
        with pytest.raises(fleetclaims.ValidationError, match="FLEETCLAIMS_LOCK_TIMEOUT"):
            fleetclaims.Registry(tmp_path / "reg")
    monkeypatch.setenv("FLEETCLAIMS_LOCK_TIMEOUT", " 2.5 ")
    reg = fleetclaims.Registry(tmp_path / "reg")
    assert reg.store.lock_timeout == 2.5  # type: ignore[attr-defined]


def test_postgresql_urls_are_checked_before_anything_is_sent() -> None:
    """A URL libpq would refuse is a ValidationError (was a raw psycopg.ProgrammingError, also
    from merge), without the password; the Unix-socket form (no host, ?host=/dir) is kept
    whole (its "//" was dropped, and libpq refused what was left)."""
    pytest.importorskip("psycopg")
    import fleetclaims
    from fleetclaims.store.postgres.schema import parse_location

    conninfo, _, shown = parse_location("postgresql:///claims?host=/run/pg&port=5433&user=u")
    assert conninfo.startswith("postgresql:///claims?") and shown.startswith("postgresql:///")
    assert parse_location("postgresql://")[2] == "postgresql://?schema=fleetclaims"
    for bad in ("postgresql://u:secret@h/db?foo=bar", "postgresql://u:secret@h/db?no_such=1"):
        with pytest.raises(fleetclaims.ValidationError) as caught:
            fleetclaims.Registry(bad).claim("t", owner="a")
        assert "secret" not in str(caught.value)


def test_a_psycopg_that_cannot_load_is_a_missing_dependency(tmp_path: Path) -> None:
    """psycopg installed but unusable (no libpq, a PSYCOPG_IMPL not there) was exit 70,
    'internal error (a bug)'; it is MissingDependency (exit 1) saying what to install."""
    import importlib.util
    import os
    import sys

    pytest.importorskip("psycopg")
    if importlib.util.find_spec("psycopg_c") is not None:
        pytest.skip("psycopg's C implementation is installed here")
    env = dict(os.environ, PSYCOPG_IMPL="c")
    r = subprocess.run([sys.executable, "-m", "fleetclaims", "--dir",
                        "postgresql://u@127.0.0.1:1/db", "--json", "claims"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 1, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["error"] == "missing_dependency" and "cannot load" in doc["message"]
