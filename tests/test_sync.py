"""``sync``: registries of several clones meet through their git remote (a bare repository,
``file://``, a git daemon): published as sealed lines, merged with the one deterministic merge;
offline changes nothing; a rewritten fleetclaims ref is detected."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gitremote import git, git_daemon, registry_dir, remote_with_clones

from fleetclaims import Registry
from fleetclaims.cli import main
from fleetclaims.core.errors import HistoryLost, RemoteRewritten, RemoteUnavailable
from fleetclaims.sync.history import JOURNAL_NS

pytestmark = pytest.mark.integration


def _events(reg: Registry) -> list[dict[str, Any]]:
    return list(reg.store.iter_events(0))


def _owner(reg: Registry, task: str) -> str | None:
    claim = reg.get(task)
    return None if claim is None else claim.owner


def test_two_clones_that_claimed_apart_agree_on_one_winner(tmp_path: Path) -> None:
    """Two clones claim one task apart; after syncing both show the same winner, each
    explains it by the merge, and a later grant's fence is above every fence either saw."""
    _, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    ra.claim("t1", owner="alice", ttl=600, priority=5)
    rb.claim("t1", owner="bob", ttl=600)
    rb.claim("t2", owner="bob", ttl=600)
    first = ra.sync("origin")
    assert first.published and not first.merged
    report = rb.sync("origin")
    assert [c.winner for c in report.conflicts] == ["alice"]
    ra.sync("origin")
    assert rb.sync("origin").published is None  # converged: nothing new either way
    for reg in (ra, rb):
        assert _owner(reg, "t1") == "alice" and _owner(reg, "t2") == "bob"
        assert "merge" in reg.explain("t1").why
    top = max(ra.store.read().fence, rb.store.read().fence)
    assert ra.claim("t3", owner="alice").fence > top


@pytest.mark.slow
def test_four_clones_converge(tmp_path: Path) -> None:
    """Four clones each claim the same task apart; two rounds of sync leave all four with the
    same holder and the same claim records."""
    _, clones = remote_with_clones(tmp_path, 4)
    regs = [Registry(registry_dir(c)) for c in clones]
    for i, reg in enumerate(regs):
        reg.claim("shared", owner=f"agent-{i}", ttl=600, priority=50 + (i * 7) % 4)
        reg.claim(f"own-{i}", owner=f"agent-{i}", ttl=600)
    for _round in range(2):
        for reg in regs:
            reg.sync("origin")
    views = [{c.task: (c.owner, c.fence, c.state) for c in reg.claims()} for reg in regs]
    assert all(v == views[0] for v in views) and len(views[0]) == 5
    assert views[0]["shared"][0] == "agent-0"  # lowest priority number wins


def test_offline_sync_changes_nothing_and_converges_later(tmp_path: Path) -> None:
    """With the remote unreachable, sync raises RemoteUnavailable and writes nothing; once it
    is back, syncing converges and fences are never reused."""
    bare, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    rb.claim("t", owner="bob", ttl=600)
    rb.sync("origin")
    hidden = bare.with_name("gone.git")
    bare.rename(hidden)  # offline
    ra.claim("t", owner="alice", ttl=600)
    before = _events(ra)
    with pytest.raises(RemoteUnavailable) as info:
        ra.sync("origin")
    assert info.value.code == "remote_unavailable"
    assert _events(ra) == before
    hidden.rename(bare)
    ra.sync("origin")
    rb.sync("origin")
    assert _owner(ra, "t") == _owner(rb, "t") == "bob"  # the earlier claim
    fences = {e["fence"] for reg in (ra, rb) for e in _events(reg)
              if e.get("type") == "claim_created" and not e.get("imported")}
    assert min(ra.claim("n", owner="x").fence, rb.claim("m", owner="y").fence) > max(fences)


@pytest.mark.slow
def test_git_clean_brings_the_history_back_from_the_remote(tmp_path: Path) -> None:
    """`git clean -fdx` removes a clone's registry; the next sync takes its own journal back
    from the remote byte for byte (same origin, seq, hashes and fences), the holder's token
    still works; a new clone takes the same claims by merging."""
    _, (a, b, c) = remote_with_clones(tmp_path, 3)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    token = ra.claim("t", owner="alice", ttl=600).token
    assert token is not None
    rb.claim("u", owner="bob", ttl=600)
    for reg in (ra, rb, ra):
        reg.sync("origin")
    published, origin, fence = _events(ra), ra.store.read().origin, ra.store.read().fence
    ra.close()
    git("clean", "-q", "-fdx", cwd=a)
    assert not os.path.exists(registry_dir(a))
    fresh = Registry(registry_dir(a))
    with pytest.raises(HistoryLost, match="fleetclaims sync` brings its history back"):
        fresh.claims()  # (any other command first: refused, and it says what works)
    report = fresh.sync("origin")
    assert report.restored == len(published) and report.published is None
    assert fresh.store.read().origin == origin and _events(fresh) == published
    assert _owner(fresh, "t") == "alice" and _owner(fresh, "u") == "bob"
    assert fresh.renew("t", token=token).owner == "alice"
    assert fresh.claim("v", owner="alice").fence == fence + 1
    other = Registry(registry_dir(c))
    assert other.sync("origin").restored == 0
    assert _owner(other, "t") == "alice" and _owner(other, "u") == "bob"


@pytest.mark.slow
def test_git_daemon_remote(tmp_path: Path) -> None:
    """A remote served by `git daemon` on 127.0.0.1 (git:// URLs) works like a path."""
    served = tmp_path / "srv"
    served.mkdir()
    with git_daemon(served) as url:
        remote_with_clones(served, 0)
        _, clones = remote_with_clones(tmp_path, 0)
        a, b = tmp_path / "a", tmp_path / "b"
        for clone in (a, b):
            git("clone", "-q", f"{url}/remote.git", str(clone), cwd=tmp_path)
        del clones
        ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
        ra.claim("t", owner="alice", ttl=600)
        ra.sync()  # the branch's remote: origin, the daemon
        rb.sync()
        assert _owner(rb, "t") == "alice"
        refs = git("ls-remote", f"{url}/remote.git", JOURNAL_NS + "*", cwd=a)
        assert len(refs.splitlines()) == 2


def _rewrite(bare: Path, ref: str) -> None:
    """Point ``ref`` in the bare remote at an unrelated commit (a force-push)."""
    tree = git("mktree", cwd=bare)
    commit = git("commit-tree", tree, "-m", "rewritten", cwd=bare)
    git("update-ref", ref, commit, cwd=bare)


def _seen_by_both(tmp_path: Path) -> tuple[Path, Registry, Registry, str]:
    """A remote and two clones: the first published a claim, the second synced it; the bare
    remote, both registries and the first one's journal ref."""
    bare, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    ra.claim("t", owner="alice", ttl=600)
    ra.sync("origin")
    rb.sync("origin")
    return bare, ra, rb, JOURNAL_NS + ra.store.read().origin


def _commit_changed_journal(bare: Path, ref: str, change: Callable[[str], str]) -> None:
    """Commit on top of ``ref`` a tree whose first journal chunk is ``change`` of the old one
    (a push that extends the ref but alters its lines)."""
    old = git("rev-parse", ref, cwd=bare)
    entries = git("ls-tree", old, cwd=bare).splitlines()
    blob = next(e for e in entries if "journal-" in e).split()[2]
    data = change(git("cat-file", "blob", blob, cwd=bare) + "\n")
    new_blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=bare, input=data,
                              capture_output=True, text=True, check=True).stdout.strip()
    tree = subprocess.run(["git", "mktree"], cwd=bare, capture_output=True, text=True,
                          check=True, input="\n".join(e.replace(blob, new_blob)
                                                      for e in entries) + "\n").stdout.strip()
    git("update-ref", ref, git("commit-tree", tree, "-p", old, "-m", "changed", cwd=bare),
        cwd=bare)


@pytest.mark.parametrize("how", ["force-pushed", "deleted"])
@pytest.mark.slow
def test_rewritten_ref_is_detected_and_nothing_is_lost(tmp_path: Path, how: str) -> None:
    """A fleetclaims ref force-pushed or deleted on the remote: the next sync of a clone that
    saw it raises RemoteRewritten and changes nothing; --accept-rewritten goes on."""
    bare, ra, rb, ref = _seen_by_both(tmp_path)
    if how == "deleted":
        git("update-ref", "-d", ref, cwd=bare)
    else:
        _rewrite(bare, ref)
    for reg in (ra, rb):  # the publisher and the clone that only saw it
        before = _events(reg)
        with pytest.raises(RemoteRewritten) as info:
            reg.sync("origin")
        assert info.value.ref == ref and how.split("-")[0] in str(info.value)
        assert _events(reg) == before
    ra.sync("origin", accept_rewritten=True)  # published whole again
    rb.sync("origin")
    assert _owner(rb, "t") == "alice"


def test_tampered_history_does_not_verify(tmp_path: Path) -> None:
    """A published journal whose bytes were changed (and re-committed on top) is refused:
    every new history is checked line by line against its seals before any is merged, so a
    sound one published beside it is not merged either."""
    bare, (a, b, c) = remote_with_clones(tmp_path, 3)
    ra, rb, rc = (Registry(registry_dir(x)) for x in (a, b, c))
    ra.claim("t", owner="alice", ttl=600)
    rc.claim("u", owner="carol", ttl=600)
    ra.sync("origin")
    rc.sync("origin")
    # the history merged last (in origin order) is the damaged one
    ref = JOURNAL_NS + max(ra.store.read().origin, rc.store.read().origin)
    _commit_changed_journal(bare, ref, lambda text: text.replace('"owner":"', '"owner":"x'))
    before = _events(rb)
    with pytest.raises(RemoteRewritten, match="does not verify"):
        rb.sync("origin")
    assert _events(rb) == before


def test_cli_sync_reports_and_exits_by_the_table(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`fleetclaims sync REMOTE --json` prints what it merged and published; offline it exits
    1 with the typed error."""
    bare, (a, b) = remote_with_clones(tmp_path, 2)
    Registry(registry_dir(a)).claim("t", owner="alice", ttl=600)
    assert main(["sync", str(bare), "--dir", registry_dir(a), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["published"] and doc["remote"] == str(bare)
    Registry(registry_dir(b)).claim("u", owner="bob", ttl=600)
    assert main(["sync", str(bare), "--dir", registry_dir(b)]) == 0
    assert "1 registries merged" in capsys.readouterr().out
    assert main(["sync", str(tmp_path / "nowhere.git"), "--dir", registry_dir(b), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "remote_unavailable"
    # after `--` a remote is still the remote (only `run` takes what follows as a command)
    assert main(["--dir", registry_dir(b), "sync", "--", "nosuchremote"]) == 1
    said = capsys.readouterr().err
    assert "'nosuchremote'" in said and "does not appear to be a git repository" in said, said


def test_sync_outside_a_repository_is_a_typed_refusal(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry outside any git repository cannot sync: GitFailed saying so, nothing
    written; an in-memory registry is refused as not a file registry."""
    from fleetclaims.core.errors import GitFailed, ValidationError
    from fleetclaims.testing import memory_registry

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    reg = Registry(str(tmp_path / "reg"))
    reg.claim("t", owner="a")
    before = _events(reg)
    with pytest.raises(GitFailed, match="not inside a git repository"):
        reg.sync("origin")
    assert _events(reg) == before
    with pytest.raises(ValidationError):
        memory_registry().sync("origin")


@pytest.mark.slow
def test_a_remote_that_stops_answering_is_unavailable(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A git:// remote that accepts the connection and never answers: RemoteUnavailable
    after the network budget, nothing changed (no hang, no GitFailed)."""
    import socket

    import fleetclaims.sync.gitrefs as gitrefs

    monkeypatch.setattr(gitrefs, "NETWORK_TIMEOUT", 1.0)
    _, (a,) = remote_with_clones(tmp_path, 1)
    reg = Registry(registry_dir(a))
    reg.claim("t", owner="alice")
    before = _events(reg)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"git://127.0.0.1:{silent.getsockname()[1]}/remote.git"
        with pytest.raises(RemoteUnavailable, match="no answer within 1 s"):
            reg.sync(url)
    assert _events(reg) == before


def test_a_copied_registry_never_pushes_over_its_twin(tmp_path: Path) -> None:
    """One registry copied into a second clone (the same origin in two folders): the copy's
    sync is refused (RemoteRewritten naming the copy) instead of pushing its history over the
    original's, which hid the original's events and kept two holders of one task forever."""
    import shutil

    bare, (a, b) = remote_with_clones(tmp_path, 2)
    ra = Registry(registry_dir(a))
    ra.claim("setup", owner="ana", ttl=600)
    ra.sync("origin")
    shutil.rmtree(registry_dir(b), ignore_errors=True)
    shutil.copytree(registry_dir(a), registry_dir(b))
    rb = Registry(registry_dir(b))
    ra.claim("x", owner="ana", ttl=600)
    ra.sync("origin")
    ref = JOURNAL_NS + ra.store.read().origin
    published = git("rev-parse", ref, cwd=bare)
    rb.claim("x", owner="bob", ttl=600)
    with pytest.raises(RemoteRewritten, match="another copy"):
        rb.sync("origin")
    assert git("rev-parse", ref, cwd=bare) == published  # (not pushed over)
    assert ra.sync("origin").published is None  # (the original goes on undisturbed)


def test_a_fleetclaims_ref_with_lines_that_are_not_json_is_refused_typed(tmp_path: Path) -> None:
    """A commit pushed on top of a seen journal ref whose journal is not JSON lines: the next
    sync says the ref was rewritten (exit 5), not an internal error (JSONDecodeError)."""
    bare, _, rb, ref = _seen_by_both(tmp_path)
    _commit_changed_journal(bare, ref, lambda text: "junk\n" * 9)
    before = _events(rb)
    with pytest.raises(RemoteRewritten):
        rb.sync("origin")
    assert _events(rb) == before


def test_a_remote_that_refuses_the_push_says_so(tmp_path: Path) -> None:
    """A remote whose hook declines every push: sync and a remote lease report the refusal
    (RemoteUnavailable naming it), not a rewritten ref or a holder named '?'."""
    bare, (a,) = remote_with_clones(tmp_path, 1)
    hook = bare / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'no pushes today' >&2\nexit 1\n")
    hook.chmod(0o755)
    reg = Registry(registry_dir(a))
    reg.claim("t", owner="alice", ttl=600)
    with pytest.raises(RemoteUnavailable, match="refused the push"):
        reg.sync("origin")
    with pytest.raises(RemoteUnavailable, match="refused the push"):
        reg.claim("b", owner="alice", ttl=600, remote="origin")


def test_two_syncs_of_one_registry_at_once_both_succeed(tmp_path: Path) -> None:
    """Agents in worktrees of one clone share its registry, and may sync at the same moment
    while another clone publishes: both succeed, one after the other (they raced on the refs
    of what was seen: a false RemoteRewritten, or `cannot lock ref` told as the network)."""
    import sys

    _, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    ra.claim("a0", owner="ana")
    ra.sync("origin")
    rb.sync("origin")
    env = {**os.environ, "FLEETCLAIMS_DIR": registry_dir(a)}
    for i in range(6):
        rb.claim(f"b{i}", owner="bob")
        rb.sync("origin")
        ra.claim(f"a{i + 1}", owner="ana")
        procs = [subprocess.Popen([sys.executable, "-m", "fleetclaims", "sync", "origin"],
                                  cwd=a, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        answers = [proc.communicate(timeout=120) for proc in procs]
        for proc, (out, err) in zip(procs, answers, strict=True):
            assert proc.returncode == 0, f"round {i}: {out}{err}"
    rb.sync("origin")
    for reg in (ra, rb):
        assert {f"b{i}" for i in range(6)} | {f"a{i}" for i in range(7)} <= {
            c.task for c in reg.claims()}


def test_a_remote_urls_password_is_never_shown(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A URL with a password (an unreachable one here): the message, the --json answer and
    the journal name the remote with ``***`` for the password (git's own part redacts it)."""
    from fleetclaims.core.errors import shown_remote

    assert shown_remote("https://ana:s3cret@host/x.git") == "https://ana:***@host/x.git"
    assert shown_remote("https://ana@host/x.git") == "https://ana@host/x.git"
    assert shown_remote("origin") == "origin"
    assert shown_remote("/srv/git/x.git") == "/srv/git/x.git"
    _, (a,) = remote_with_clones(tmp_path, 1)
    Registry(registry_dir(a)).claim("t", owner="ana")
    url = "http://user:s3cretpw@127.0.0.1:1/x.git"
    for extra in ([], ["--json"]):
        code = main(["--dir", registry_dir(a), "sync", url, *extra])
        captured = capsys.readouterr()
        assert code == 1
        assert "s3cretpw" not in captured.out + captured.err
        assert "user:***@127.0.0.1" in captured.out + captured.err
    reg = Registry(registry_dir(a))
    with pytest.raises(RemoteUnavailable) as info:
        reg.claim("u", owner="ana", remote=url)
    assert "s3cretpw" not in str(info.value)
    assert info.value.remote == "http://user:***@127.0.0.1:1/x.git"
    assert not any("s3cretpw" in json.dumps(e) for e in reg.store.iter_events(0))


@pytest.mark.parametrize("kind", ["commit", "blob"])
def test_a_ref_that_holds_no_journal_is_refused_and_can_be_passed_over(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A ref under refs/fleetclaims/journal/ that is no clone's history (a project commit or a
    blob pushed there by mistake): a sync refuses it typed (RemoteRewritten, exit 5, naming
    the ref and what to do; a blob was `git ls-tree failed`, exit 1), and the advised
    `--accept-rewritten` goes on without merging it, naming it (it repeated the refusal)."""
    bare, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    ra.claim("ta", owner="ana")
    ra.sync("origin")
    junk = (git("rev-parse", "HEAD", cwd=bare) if kind == "commit" else subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=bare, input=b"hello\n",
        capture_output=True, check=True).stdout.decode().strip())
    ref = JOURNAL_NS + "0123456789abcdef"
    git("update-ref", ref, junk, cwd=bare)
    rb.claim("tb", owner="bob")
    with pytest.raises(RemoteRewritten) as info:
        rb.sync("origin")
    assert info.value.ref == ref and "git push REMOTE :REF" in str(info.value)
    assert rb.get("ta") is None  # nothing merged
    assert main(["--dir", registry_dir(b), "sync", "origin"]) == 5
    capsys.readouterr()
    assert main(["--dir", registry_dir(b), "sync", "origin", "--accept-rewritten"]) == 0
    out = capsys.readouterr().out
    assert f"not merged (accepted): {ref}" in out
    assert _owner(rb, "ta") == "ana"
    report = ra.sync("origin", accept_rewritten=True)
    assert report.skipped and report.skipped[0].startswith(ref)
    assert _owner(ra, "tb") == "bob"


def test_an_edited_copy_of_this_registrys_own_ref_is_noticed_and_healed(
        tmp_path: Path) -> None:
    """Someone pushes onto B's own ref a commit whose journal has an edited line but the same
    meta.json: the other clones refuse it; B, whose history it is, says so too (it said
    nothing new to publish, forever), and `--accept-rewritten` publishes B's journal again, so
    the others sync once more."""
    bare, (a, b) = remote_with_clones(tmp_path, 2)
    ra, rb = Registry(registry_dir(a)), Registry(registry_dir(b))
    rb.claim("tb", owner="bob")
    rb.sync("origin")
    ra.sync("origin")
    rb.sync("origin")
    ref = JOURNAL_NS + rb.store.read().origin
    tip = git("rev-parse", ref, cwd=bare)
    chunk = git("show", f"{tip}:journal-00000000.jsonl", cwd=bare) + "\n"
    meta = git("show", f"{tip}:meta.json", cwd=bare) + "\n"

    def blob(text: str) -> str:
        return subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=bare,
                              input=text.encode(), capture_output=True,
                              check=True).stdout.decode().strip()

    tree = subprocess.run(
        ["git", "mktree"], cwd=bare, capture_output=True, check=True,
        input=(f"100644 blob {blob(chunk.replace('bob', 'eve'))}\tjournal-00000000.jsonl\n"
               f"100644 blob {blob(meta)}\tmeta.json\n").encode()).stdout.decode().strip()
    git("update-ref", ref, git("commit-tree", tree, "-p", tip, "-m", "tampered", cwd=bare),
        cwd=bare)
    with pytest.raises(RemoteRewritten):
        ra.sync("origin")
    with pytest.raises(RemoteRewritten, match="changed on the remote"):
        rb.sync("origin")
    healed = rb.sync("origin", accept_rewritten=True)
    assert healed.published
    ra.sync("origin")  # verifies B's journal again: nothing rewritten since A saw B's
    assert _owner(ra, "tb") == "bob"
    assert rb.sync("origin").published is None


def test_a_repository_without_the_default_remote_is_told_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No remote given and no origin (nor a branch remote): a usage error saying which remotes
    there are and what to do (it was RemoteUnavailable "Check the network", exit 1)."""
    from fleetclaims.core.errors import ValidationError

    repo = tmp_path / "solo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    reg = Registry(registry_dir(repo))
    reg.claim("t", owner="ana")
    with pytest.raises(ValidationError, match="no remote named origin"):
        reg.sync()
    assert main(["--dir", registry_dir(repo), "sync"]) == 2
    assert "git remote add origin" in capsys.readouterr().err
