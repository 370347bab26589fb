"""Retention (#15): ``audit archive --before AGE [--to DIR]`` moves old sealed segments out and
records an anchor; ``audit verify`` proves the rest of the chain goes on from it and
``audit verify --with DIR`` checks the archive. Killed at each step, nothing is lost: every
event is in the archive, in segments/ or in audit.jsonl, and the next archive finishes."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fc_support import run_python

import fleetclaims
from fleetclaims.cli.output import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE
from fleetclaims.core.errors import ArchiveMismatch, AuditCorrupt, ValidationError
from fleetclaims.store.file import archive, doctor, preseal, segments
from fleetclaims.store.file.faults import CRASH_POINTS

pytestmark = pytest.mark.unit


def _build(d: Path, n: int = 200) -> None:
    reg = fleetclaims.Registry(d, durability="process")
    for i in range(n):
        c = reg.claim(f"t{i % 40}", owner=f"a{i % 3}", ttl=60)
        if c.token:
            reg.renew(c.task, token=c.token)
            reg.release(c.task, token=c.token)
    reg.close()


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 16_000)
    monkeypatch.setattr(segments, "BLOCK", 2_000)
    monkeypatch.setattr(preseal, "ENABLED", False)  # (rotations inline: deterministic files)


def all_seqs(d: Path, archived: Path) -> list[int]:
    """Every event's seq, from the archive, segments/ and audit.jsonl (each counted once)."""
    seqs: set[int] = set()
    for folder in (archived, d / "segments"):
        for p in sorted(folder.glob("audit-*.jsonl.gz")) if folder.exists() else []:
            seqs.update(json.loads(line)["seq"] for line in gzip.decompress(
                p.read_bytes()).splitlines())
    for line in (d / "audit.jsonl").read_bytes().rstrip(b"\0").splitlines():
        seqs.add(json.loads(line)["seq"])
    return sorted(seqs)


@pytest.mark.slow
def test_archive_moves_old_segments_and_verify_goes_on_from_the_anchor(
        tmp_path: Path, small: None) -> None:
    d, out = tmp_path / "r", tmp_path / "cold"
    _build(d)
    sealed = segments.sealed(d)
    reg = fleetclaims.Registry(d)
    full = [e for e in reg.store.iter_events(0)]
    done = archive.archive_registry(reg.store, 0, out)
    assert done["archived"] == [s.path.name for s in sealed] and done["seq"] == sealed[-1].last
    assert segments.sealed(d) == [] and sorted(p.name for p in out.iterdir()) == sorted(
        s.path.name for s in sealed)
    report = reg.verify()
    assert report.ok and report.events == len(full) - done["seq"], report
    assert archive.verify_with(d, out)["archived_events"] == done["seq"]
    assert [e["seq"] for e in reg.store.iter_events(0)] == [e["seq"] for e in full
                                                           if e["seq"] > done["seq"]]
    archived_task = next(e["task"] for e in full if e["seq"] <= done["seq"] and "task" in e
                         and all(x.get("task") != e["task"] for x in full
                                 if x["seq"] > done["seq"]))
    why = reg.explain(archived_task)  # (named by archived events only)
    assert why.state == "archived" and f"1..{done['seq']} were archived" in why.why, why
    reg.claim("after", owner="o", ttl=60)  # writes go on (and rotate again)
    reg.close()
    # doctor reads an archived registry from the anchor and claims.json, as the store does
    found = doctor.check(d)
    assert found.ok and [f for f in found.findings if f.severity != "info"] == [], found
    assert doctor.check(d, fix=True).ok
    # A replay from the first event needs the archive: named, nothing changed.
    (d / "claims.json").rename(tmp_path / "claims.json")
    with pytest.raises(AuditCorrupt, match="archived"):
        fleetclaims.Registry(d).claim("refused", owner="o", ttl=60)
    for p in out.glob("*.gz"):  # put back: the replay reads them
        shutil.copy(p, d / "segments" / p.name)
    assert fleetclaims.Registry(d).get("after") is not None


def _cli(d: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetclaims", "--dir", str(d), *args],
                          capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_cli_archive_and_a_mismatching_archive(tmp_path: Path) -> None:
    d, out = tmp_path / "r", tmp_path / "cold"
    proc = run_python("import sys\nfrom fleetclaims.store.file import preseal, segments\n"
                      "segments.SEGMENT_BYTES = 16000\npreseal.ENABLED = False\n"
                      "sys.path.insert(0, sys.argv[2])\n"
                      "from test_archive import _build\n_build(__import__('pathlib').Path("
                      "sys.argv[1]))\n", str(d), str(Path(__file__).parent))
    assert proc.returncode == 0, proc.stderr
    assert _cli(d, "audit", "archive").returncode != EXIT_OK  # --before is required
    assert len(segments.sealed(d)) > 2
    done = _cli(d, "audit", "archive", "--before", "0s", "--to", str(out))
    assert done.returncode == EXIT_OK and "archived" in done.stdout, done.stderr
    ok = _cli(d, "audit", "verify", "--with", str(out))
    assert ok.returncode == EXIT_OK and "archive" in ok.stdout, ok.stdout + ok.stderr
    victim = sorted(out.glob("*.gz"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    bad = _cli(d, "audit", "verify", "--with", str(out))
    assert bad.returncode == EXIT_DAMAGED and victim.name in bad.stderr, bad.stderr
    victim.unlink()
    bad = _cli(d, "audit", "verify", "--with", str(out))
    assert bad.returncode == EXIT_DAMAGED and "missing" in bad.stderr, bad.stderr
    assert _cli(d, "audit", "verify").returncode == EXIT_OK  # the registry itself is fine


@pytest.mark.slow
def test_an_archive_dir_that_is_not_the_anchors_is_refused(tmp_path: Path, small: None) -> None:
    d, e, out = tmp_path / "r", tmp_path / "other", tmp_path / "cold"
    _build(d)
    _build(e)
    reg = fleetclaims.Registry(d)
    archive.archive_registry(reg.store, 0, out)
    reg.close()
    for p in segments.sealed(e):  # another registry's segments of the same names
        target = out / p.path.name
        if target.exists():
            shutil.copy(p.path, target)
    with pytest.raises(ArchiveMismatch, match="not the file that was archived"):
        archive.verify_with(d, out)
    with pytest.raises(ArchiveMismatch, match="missing"):
        archive.verify_with(d, tmp_path / "nowhere")


CHILD = r"""
import sys
from pathlib import Path
import fleetclaims
from fleetclaims.store.file import archive
reg = fleetclaims.Registry(sys.argv[1])
archive.archive_registry(reg.store, 0, Path(sys.argv[2]))
print("DONE", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith("archive.")])
def test_killed_while_archiving(tmp_path: Path, small: None, point: str) -> None:
    d, out = tmp_path / "r", tmp_path / "cold"
    _build(d)
    before = all_seqs(d, out)
    proc = run_python(CHILD, str(d), str(out), env={"FLEETCLAIMS_CRASH_AT": point})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert all_seqs(d, out) == before == list(range(1, before[-1] + 1))
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok
    reg.claim("after", owner="o", ttl=60)
    reg.close()
    proc = run_python(CHILD, str(d), str(out))  # the next archive finishes the job
    assert proc.returncode == 0, proc.stderr
    assert segments.sealed(d) == [] or all(s.last > archive.read_anchor(d).seq  # type: ignore[union-attr]
                                           for s in segments.sealed(d))
    assert fleetclaims.Registry(d).verify().ok
    assert archive.verify_with(d, out)["seq"] > 0


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
            and p.name != "claims.lock"}


def test_archiving_onto_the_segments_themselves_is_refused(tmp_path: Path, small: None) -> None:
    """``--to`` naming the registry's own segments/ folder (or a link to it, or a file there
    that is the segment itself) once 'copied' each segment onto itself and then removed it as
    archived: the sealed history was gone, exit 0."""
    d = tmp_path / "r"
    _build(d)
    sealed = segments.sealed(d)
    (tmp_path / "link").symlink_to(d / "segments")
    linked = tmp_path / "hardlinked"
    linked.mkdir()
    os.link(sealed[0].path, linked / sealed[0].path.name)  # (the same file under another name)
    before = _files(d)
    reg = fleetclaims.Registry(d)
    for to, why in ((d / "segments", "own segments/"), (d / "segments" / "old", "own segments/"),
                    (tmp_path / "link", "own segments/"), (d, "registry folder itself"),
                    (linked, "itself")):
        with pytest.raises(ValidationError, match=why):
            archive.archive_registry(reg.store, 0, to)
        assert _files(d) == before, to
    reg.close()
    shown = _cli(d, "audit", "archive", "--before", "0s", "--to", str(d / "segments"))
    assert shown.returncode == EXIT_USAGE and "segments" in shown.stderr, shown.stderr
    assert _files(d) == before and not (d / "segments" / archive.ANCHOR).exists()
    assert _cli(d, "audit", "verify").returncode == EXIT_OK


def test_two_registries_archived_to_one_folder(tmp_path: Path, small: None) -> None:
    """Segment files of two registries share names: the second archive to the same folder
    replaced the first's files (its events then gone everywhere). Now refused, naming the
    file, before anything changed; a file there with the very same bytes counts as the copy."""
    d, e, out = tmp_path / "r", tmp_path / "e", tmp_path / "cold"
    _build(d)
    _build(e)
    clash = segments.sealed(e)[0].path.name
    assert (d / "segments" / clash).read_bytes() != (e / "segments" / clash).read_bytes()
    reg = fleetclaims.Registry(d)
    done = archive.archive_registry(reg.store, 0, out)
    reg.close()
    archived = _files(out)
    before = _files(e)
    reg = fleetclaims.Registry(e)
    with pytest.raises(ValidationError, match=f"{clash} already exists.*folder of its own"):
        archive.archive_registry(reg.store, 0, out)
    reg.close()
    assert _files(out) == archived and _files(e) == before
    shown = _cli(e, "audit", "archive", "--before", "0s", "--to", str(out))
    assert shown.returncode == EXIT_USAGE and clash in shown.stderr, shown.stderr
    assert _files(out) == archived and _files(e) == before
    assert archive.verify_with(d, out)["seq"] == done["seq"]
    # The same bytes already there (a copy made before): taken as the copy.
    other = tmp_path / "cold-e"
    other.mkdir()
    shutil.copy(e / "segments" / clash, other / clash)
    reg = fleetclaims.Registry(e)
    assert archive.archive_registry(reg.store, 0, other)["archived"]
    reg.close()
    assert archive.verify_with(e, other)["seq"] > 0 and segments.sealed(e) == []


def test_verify_with_a_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    """`audit verify --with DIR` where DIR does not exist (a typo) said ok when nothing had
    been archived yet; it is a usage error naming --with."""
    d = tmp_path / "r"
    fleetclaims.Registry(d).claim("t", owner="a")
    done = _cli(d, "audit", "verify", "--with", str(tmp_path / "nope"))
    assert done.returncode == EXIT_USAGE and "--with" in done.stderr, done.stderr
    (tmp_path / "cold").mkdir()
    assert _cli(d, "audit", "verify", "--with", str(tmp_path / "cold")).returncode == EXIT_OK
