"""The command line against PostgreSQL: migrate both ways, db migrate, FLEETCLAIMS_URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.cli import main

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_migrate_dir_to_postgres_and_back(tmp_path: Path, postgres_url: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """migrate copies claims and the whole audit history, preserving seq, hashes and fences;
    audit verify passes on both sides."""
    src = tmp_path / "src"
    reg = Registry(src)
    a = reg.claim("t1", owner="alice")
    reg.claim("t2", owner="bob")
    reg.complete("t1", token=a.token or "")
    url = postgres_url + ("&" if "?" in postgres_url else "?") + "schema=cli_migrate"
    assert main(["migrate", "--from", str(src), "--to", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["events"] == 4 and report["verified"] is True
    assert main(["audit", "verify", "--dir", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["head"] == reg.verify().head
    back = tmp_path / "back"
    assert main(["migrate", "--from", url, "--to", str(back)]) == 0
    capsys.readouterr()
    data = (src / "audit.jsonl").read_bytes().split(b"\0", 1)[0]  # without preallocated space
    assert (back / "audit.jsonl").read_bytes().split(b"\0", 1)[0] == data
    pg = Registry(url)
    assert [(c.task, c.owner, c.fence, c.state) for c in
            pg.claims(include_completed=True)] == [("t1", "alice", 1, "completed"),
                                                  ("t2", "bob", 2, "active")]
    assert pg.claim("t3", owner="carol").fence == 3  # fences keep growing after the move


def test_db_migrate_and_env_url(postgres_url: str, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """db migrate reports the schema version; FLEETCLAIMS_URL selects the registry."""
    url = postgres_url + ("&" if "?" in postgres_url else "?") + "schema=cli_env"
    assert main(["db", "migrate", "--dir", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_version"] >= 1
    monkeypatch.setenv("FLEETCLAIMS_URL", url)
    monkeypatch.delenv("FLEETCLAIMS_DIR", raising=False)
    assert main(["claim", "shared-task", "--owner", "laptop-1", "--json"]) == 0
    capsys.readouterr()
    assert main(["claim", "shared-task", "--owner", "laptop-2"]) == 3
    assert "laptop-1" in capsys.readouterr().err


def test_migrate_and_init_never_print_the_password(tmp_path: Path, postgres_url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """migrate --from URL and init printed the URL with its password (the server here trusts
    local connections, so the password is never checked, only shown)."""
    with_pw = postgres_url.replace("@", ":s3cret-pw@", 1)
    url = with_pw + ("&" if "?" in with_pw else "?") + "schema=cli_pw"
    assert main(["--dir", url, "init"]) == 0
    assert main(["--dir", url, "--json", "init"]) == 0
    Registry(url).claim("t", owner="a")
    assert main(["migrate", "--from", url, "--to", str(tmp_path / "copy")]) == 0
    assert main(["--json", "migrate", "--from", url, "--to", str(tmp_path / "copy2")]) == 0
    out, err = capsys.readouterr()
    assert "s3cret-pw" not in out + err and "cli_pw" in out
