"""A large snapshot is read a piece at a time into private anonymous memory while a thread
hashes the pieces already read (snapshot._read_large): it must load exactly what the plain
read loads, and reject exactly what it rejects, with the same message, whatever the file."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_corruption_corpus as corpus
from corpus_run import Base, Case, run_case
from fc_support import file_store, replay

from fleetclaims import Registry
from fleetclaims.store.file import anchor, snapshot
from fleetclaims.store.file.snapshot import SnapshotError, decode_snapshot, read_snapshot

pytestmark = pytest.mark.integration

base = corpus.base  # (the corpus's baseline registry, built once for this module too)


def _plain(path: Path) -> tuple[Any, str | None]:
    """What the plain read (the whole file as bytes, then decode_snapshot) makes of ``path``."""
    try:
        return decode_snapshot(path.read_bytes()), None
    except SnapshotError as exc:
        return None, str(exc)


def _same_load(path: Path) -> None:
    """read_snapshot(path) loads what the plain read loads, or fails with its message."""
    got, problem = read_snapshot(path)
    want, want_problem = _plain(path)
    assert problem == want_problem
    if want is None:
        assert got is None
        return
    assert got is not None
    assert (got.offset, got.size, got.state.seq, got.state.head, got.state.fence) == (
        want.offset, want.size, want.state.seq, want.state.head, want.state.fence)
    assert len(got.state.claims) == len(want.state.claims)
    assert dict(got.state.claims.raw_items()) == dict(want.state.claims.raw_items())
    assert snapshot.encode_snapshot(got.state, got.offset) == snapshot.encode_snapshot(
        want.state, want.offset)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every snapshot takes the large path, in pieces of an odd size."""
    monkeypatch.setattr(snapshot, "_PARALLEL_HASH_MIN", 1)
    monkeypatch.setattr(snapshot, "_READ_PIECE", 97)
    before = set(threading.enumerate())
    yield
    # The hasher never outlives a read. Compared as sets of threads, so an unrelated thread
    # ending meanwhile does not matter; one the test started may take a moment to finish.
    deadline = time.monotonic() + 2
    while (new := [t for t in threading.enumerate() if t not in before and t.is_alive()]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert new == []


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A checkpointed registry's snapshot (~20 KB: live, ended and queued entries)."""
    root = tmp_path_factory.mktemp("load") / "reg"
    reg = Registry(root, durability="process")
    for i in range(40):
        claim = reg.claim(f"task-{i:03}", owner=f"agent-{i % 3}", ttl=3600,
                          metadata={"i": i, "note": "x" * (i * 7 % 50)})
        if i % 4 == 0:
            reg.release(f"task-{i:03}", token=claim.token)
    file_store(reg).checkpoint()
    reg.close()
    return (root / "claims.json").read_bytes()


def test_a_large_snapshot_loads_as_the_plain_read(tmp_path: Path) -> None:
    """Over 1 MB (no setting patched): read into an mmap, the same state, re-encoded alike."""
    root = tmp_path / "reg"
    reg = Registry(root, durability="process")
    for i in range(900):
        reg.claim(f"big-{i:04}", owner="filler", ttl=3600, metadata={"pad": "p" * 1200})
    file_store(reg).checkpoint()
    reg.close()
    path = root / "claims.json"
    assert path.stat().st_size > snapshot._PARALLEL_HASH_MIN
    got, problem = read_snapshot(path)
    assert problem is None and got is not None
    assert isinstance(got.state.claims._data, mmap.mmap)  # type: ignore[attr-defined]
    _same_load(path)
    claim = got.state.claims.get("big-0450")
    assert claim is not None and claim.owner == "filler"
    assert got.state.claims.get("big-9999") is None


@pytest.mark.parametrize("tail", [81, 4096])
def test_every_damage_is_reported_as_by_the_plain_read(
        small_pieces: None, sample: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tail: int) -> None:
    """Truncated anywhere, a byte flipped anywhere (piece edges included), junk after, no
    checksum: the same verdict and message as the plain read."""
    monkeypatch.setattr(snapshot, "_TAIL", tail)
    path = tmp_path / "claims.json"
    n = len(sample)
    variants: list[bytes] = [sample, sample[:-1], sample + b"junk", sample + b"\n"]
    variants += [sample[:cut] for cut in (*range(0, n, 1009), *range(n - 90, n, 3))]
    edges = {p + d for p in range(0, n, 97 * 11) for d in (-1, 0, 1)}  # (pieces: 97 bytes)
    for at in sorted({*range(0, n, 499), *edges, *range(n - 90, n, 3)} & set(range(n))):
        variants.append(sample[:at] + bytes([sample[at] ^ 0x04]) + sample[at + 1 :])
    cut = sample.rindex(b',"checksum":"')
    variants += [sample[:cut] + b"}\n", sample[:cut] + b',"checksum":""}\n']
    for data in variants:
        path.write_bytes(data)
        _same_load(path)


def _readv_then(action: Callable[[int], None]) -> Callable[[int, Any], int]:
    """os.readv that calls ``action`` (with the call's number) before each read."""
    real, calls = os.readv, [0]

    def readv(fd: int, buffers: Any) -> int:
        calls[0] += 1
        action(calls[0])
        return real(fd, buffers)
    return readv


@pytest.mark.parametrize("change", ["truncated", "grown", "replaced-and-cut"])
def test_a_file_changed_while_read_is_read_again(
        small_pieces: None, sample: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        change: str) -> None:
    """Shorter or longer than its size said (someone else wrote it meanwhile): no crash, no
    half-hashed verdict; it is read again as any file and judged as the plain read would."""
    path = tmp_path / "claims.json"
    path.write_bytes(sample)

    def act(call: int) -> None:
        if call != 5:
            return
        if change == "truncated":
            os.truncate(path, 300)
        elif change == "grown":
            with open(path, "ab") as f:
                f.write(b"more")
        else:
            os.truncate(path, len(sample) - 10)
    monkeypatch.setattr(os, "readv", _readv_then(act))
    got, problem = read_snapshot(path)
    assert (got is None, problem) == (True, _plain(path)[1])
    assert problem is not None


def test_a_read_error_is_raised_as_before(small_pieces: None, sample: bytes, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO in the middle: OSError to the caller (as the plain read raised it), hasher joined."""
    path = tmp_path / "claims.json"
    path.write_bytes(sample)

    def act(call: int) -> None:
        if call == 7:
            raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(os, "readv", _readv_then(act))
    with pytest.raises(OSError) as info:
        read_snapshot(path)
    assert info.value.errno == errno.EIO


def test_without_a_thread_or_an_mmap_the_load_is_the_same(
        small_pieces: None, sample: bytes, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No new thread (interpreter shutdown): hashed after the reading; no memory for an mmap:
    the plain read. Either way the same state, and damage still found."""
    path = tmp_path / "claims.json"

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    def no_mmap(*args: Any, **kwargs: Any) -> mmap.mmap:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    for name, patch in (("start", no_thread), ("mmap", no_mmap)):
        with monkeypatch.context() as m:
            if name == "start":
                m.setattr(threading.Thread, "start", patch)
            else:
                m.setattr(mmap, "mmap", patch)
            for data in (sample, sample[:500] + b"!" + sample[501:]):
                path.write_bytes(data)
                _same_load(path)


SNAPSHOT_CASES = [c for c in corpus.CASES if "snapshot" in c.name or "claims.json" in c.name]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", SNAPSHOT_CASES, ids=[c.name for c in SNAPSHOT_CASES])
def test_corpus_case_through_the_large_path(small_pieces: None, case: Case, base: Base,
                                            tmp_path: Path) -> None:
    """The corruption corpus's snapshot cases, every snapshot read in pieces while hashed:
    the documented outcomes, unchanged."""
    d = tmp_path / "reg"
    shutil.copytree(base.root, d, symlinks=True)
    anchor.record(d, replay(base.lines), force=True)
    expect_quarantined = case.damage(d, base)
    journal = d / "audit.jsonl"
    run_case(case, base, d, journal.read_bytes() if journal.is_file() else None,
             expect_quarantined)
