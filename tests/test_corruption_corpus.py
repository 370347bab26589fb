"""Corruption corpus: damaged registries and journals, generated in code from one baseline.

Each case: no crash, no hang (per-test timeout), the documented outcome (a typed error naming
seq and offset, or an automatic repair with the damaged bytes in quarantine), and wherever the
journal allows, the exact pre-damage state — directly, or after ``doctor --fix``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from corpus_run import Base, Case, run_case
from fc_support import (
    append_raw,
    claims_view,
    file_store,
    journal_lines,
    replay,
    strip_preallocation,
    token_of,
)

import fleetclaims
from fleetclaims import (
    Registry,
)
from fleetclaims.core.chain import seal
from fleetclaims.store.file import anchor
from fleetclaims.store.file.lock import RegistryLock
from fleetclaims.store.file.snapshot import encode_snapshot

pytestmark = pytest.mark.integration

SNAP_AT = 8  # the baseline snapshot covers the first SNAP_AT events


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("corpus-base") / "reg"
    reg = fleetclaims.Registry(root)
    tokens: dict[int, str] = {}
    for i in range(4):  # 1 + 4 claims + 3 renews = 8 events, then the snapshot
        tokens[i] = token_of(reg.claim(f"task-{i}", owner=f"agent-{i % 2}", ttl=3600,
                                       metadata={"i": i, "tags": ["a", "b"]}, note=f"note {i}"))
        if i:
            reg.renew(f"task-{i}", token=tokens[i])
    file_store(reg).checkpoint()
    behind = (root / "claims.json").read_bytes()  # a snapshot behind the head, as a crash leaves
    reg.release("task-1", token=tokens[1])
    reg.complete("task-2", token=tokens[2], result={"ok": True})
    reg.claim("task-1", owner="agent-9", ttl=3600)
    reg.renew("task-3", token=tokens[3])
    reg.close()
    (root / "claims.json").write_bytes(behind)
    # The corpus damages a journal without preallocated space, so that "after the end" means
    # after the last line; the preallocated form has cases of its own below.
    strip_preallocation(root / "audit.jsonl")
    lines, tail = journal_lines(root)
    assert tail == b"" and len(lines) == 12
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    views, fences = [], []
    for k in range(len(lines) + 1):
        state = replay(lines[:k])
        views.append(claims_view(state))
        fences.append(state.fence)
    snapshot = (root / "claims.json").read_bytes()
    assert orjson.loads(snapshot)["seq"] == SNAP_AT
    return Base(root, lines, offsets, snapshot, views, fences)


# --- damage helpers ----------------------------------------------------------------------------


def _journal(d: Path) -> Path:
    return d / "audit.jsonl"


def _snap(d: Path) -> Path:
    return d / "claims.json"


def _write_lines(d: Path, lines: list[bytes]) -> bytes:
    data = b"".join(line + b"\n" for line in lines)
    _journal(d).write_bytes(data)
    return data


def _reseal_line(line: bytes, edit: Callable[[bytes], bytes]) -> bytes:
    body = line[: line.rindex(b',"hash":"')] + b"}"
    return seal(edit(body))[0].rstrip(b"\n")


def _rechain(lines: list[bytes], k: int, edit: Callable[[bytes], bytes]) -> list[bytes]:
    """Edit line k's body and re-seal it and every later line so the hash chain holds."""
    out = list(lines[:k])
    prev = orjson.loads(out[-1])["hash"] if out else "0" * 64
    for i, line in enumerate(lines[k:]):
        obj_body = line[: line.rindex(b',"prev":"')]
        body = obj_body + b',"prev":"' + prev.encode() + b'"}'
        if i == 0:
            body = edit(body)
        sealed, prev = seal(body)
        out.append(sealed.rstrip(b"\n"))
    return out


def _reseal_snapshot(d: Path, edit: Callable[[bytes], bytes]) -> bytes:
    """Edit the snapshot's JSON text and give it a valid checksum again."""
    import hashlib

    raw = _snap(d).read_bytes().rstrip(b"\n")
    body = raw[: raw.rindex(b',"checksum":"')] + b"}"
    body = edit(body)
    digest = hashlib.sha256(body).hexdigest()
    data = body[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'
    _snap(d).write_bytes(data)
    return data


def _crashed_after(d: Path, b: Base, k: int) -> None:
    """The mirrors as a writer killed while appending line k leaves them: the anchor and the
    fence mark in claims.lock record at most the last durable line (they lag, never lead)."""
    state = replay(b.lines[:k])
    anchor.record(d, state, force=True)
    lock = RegistryLock(d / "claims.lock", 0)
    lock.open()
    try:
        lock.mark_fence(state.fence, force=True)
    finally:
        lock.close()


def _flip(data: bytes, at: int, mask: int = 0x01) -> bytes:
    buf = bytearray(data)
    buf[at] ^= mask
    return bytes(buf)


# --- the corpus -------------------------------------------------------------------------------
# outcome: ("exact",) | ("prefix", k) | ("audit", seq, offset, after_fix) | ("corrupt", after_fix)
#          | ("unsafe",) | ("verify_only", seq, offset) | ("empty",) | ("lost", k) | ("reset",)
# after_fix: "exact" or an int k (the state after the first k lines).


def _case(name: str, outcome: tuple[Any, ...]) -> Callable[[Callable[..., Any]], Case]:
    def wrap(fn: Callable[[Path, Base], bytes | None]) -> Case:
        return Case(name, fn, outcome)
    return wrap


CASES: list[Case] = []


def case(name: str, *outcome: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[[Path, Base], bytes | None]) -> Callable[..., Any]:
        CASES.append(Case(name, fn, outcome))
        return fn
    return wrap


@case("journal-empty-no-snapshot", "lost", 0)
def _(d: Path, b: Base) -> None:
    _journal(d).write_bytes(b"")
    _snap(d).unlink()


@case("journal-empty-snapshot-kept", "corrupt", SNAP_AT)
def _(d: Path, b: Base) -> bytes:
    _journal(d).write_bytes(b"")
    return b.snapshot


@case("journal-missing-snapshot-kept", "corrupt", SNAP_AT)
def _(d: Path, b: Base) -> bytes:
    _journal(d).unlink()
    return b.snapshot


@case("snapshot-empty", "exact")
def _(d: Path, b: Base) -> bytes:
    _snap(d).write_bytes(b"")
    return b""


for _cut_name, _cut in {"1-byte": lambda n: 1, "half": lambda n: n // 2,
                        "in-checksum": lambda n: n - 20, "before-checksum": lambda n: n - 80,
                        "last-2-bytes": lambda n: n - 3}.items():
    def _make(cut: Callable[[int], int]) -> Callable[[Path, Base], bytes]:
        def damage(d: Path, b: Base) -> bytes:
            data = b.snapshot[: cut(len(b.snapshot))]
            _snap(d).write_bytes(data)
            return data
        return damage
    CASES.append(Case(f"snapshot-truncated-{_cut_name}", _make(_cut), ("exact",)))


@case("snapshot-without-final-newline", "exact")
def _(d: Path, b: Base) -> None:
    _snap(d).write_bytes(b.snapshot.rstrip(b"\n"))  # still valid: nothing to quarantine


@case("snapshot-flipped-byte", "exact")
def _(d: Path, b: Base) -> bytes:
    data = _flip(b.snapshot, len(b.snapshot) // 3)
    _snap(d).write_bytes(data)
    return data


@case("snapshot-junk-after", "exact")
def _(d: Path, b: Base) -> bytes:
    data = b.snapshot + b"junk\n"
    _snap(d).write_bytes(data)
    return data


@case("snapshot-invalid-utf8", "exact")
def _(d: Path, b: Base) -> bytes:
    at = b.snapshot.index(b"agent-1")
    data = b.snapshot[:at] + b"\xff\xfe" + b.snapshot[at + 2 :]
    _snap(d).write_bytes(data)
    return data


@case("snapshot-huge-number-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    return _reseal_snapshot(d, lambda body: body.replace(b'"fence":', b'"fence":1' + b"0" * 40
                                                         + b",\"x\":", 1))


@case("snapshot-nan-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    return _reseal_snapshot(d, lambda body: body.replace(b'"seq":', b'"nan":NaN,"seq":', 1))


@case("snapshot-deep-nesting-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    deep = b"[" * 5000 + b"]" * 5000
    return _reseal_snapshot(d, lambda body: body.replace(b'"seq":', b'"deep":' + deep + b',"seq":',
                                                         1))


@case("snapshot-wrong-types-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    return _reseal_snapshot(d, lambda body: body.replace(b'"seq":8', b'"seq":"8"', 1))


def _relength(body: bytes) -> bytes:
    """A format-3 body with its header's section lengths made true again (what a forger who
    knows the format does after editing a claim line)."""
    head_end = body.index(b"\n")
    live = body.index(b'"claims":{\n') + len(b'"claims":{\n')
    live_end = body.index(b'\n},\n"ended":{\n', live)
    ended = live_end + len(b'\n},\n"ended":{\n')
    ended_end = body.rindex(b"\n}")
    header = re.sub(rb'"bytes":\{[^}]*\}', b'"bytes":{"claims":%d,"ended":%d}'
                    % (live_end - live, ended_end - ended), body[:head_end])
    return header + body[head_end:]


@case("snapshot-claim-wrong-types-resealed", "lazy", "task-0")
def _(d: Path, b: Base) -> bytes:
    return _reseal_snapshot(d, lambda body: _relength(
        body.replace(b'"fence":1,', b'"fence":"one",', 1)))


@case("snapshot-claim-line-resized-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    # A claim line edited without the header's section lengths: the frame is refused at load.
    return _reseal_snapshot(d, lambda body: body.replace(b'"fence":1,', b'"fence":1 ,', 1))


@case("snapshot-duplicate-keys-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    # A second "seq" that points elsewhere: orjson keeps the last, the anchor check catches it.
    return _reseal_snapshot(d, lambda body: body[:-1] + b',"seq":3}')


@case("snapshot-wrong-format-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    # Whatever format the current version writes, as long as it is the first member.
    return _reseal_snapshot(d, lambda body: re.sub(rb'^\{"format":\d+', b'{"format":99', body))


@case("snapshot-offset-off-boundary-resealed", "exact")
def _(d: Path, b: Base) -> bytes:
    off = b.offsets[SNAP_AT]
    return _reseal_snapshot(d, lambda body: body.replace(f'"offset":{off}'.encode(),
                                                         f'"offset":{off - 3}'.encode(), 1))


@case("snapshot-from-another-registry", "exact")
def _(d: Path, b: Base) -> bytes:
    other = replay(b.lines[:SNAP_AT])
    other.head = "f" * 64
    data = encode_snapshot(other, b.offsets[SNAP_AT])
    _snap(d).write_bytes(data)
    return data


@case("journal-truncated-in-first-line", "corrupt", SNAP_AT)
def _(d: Path, b: Base) -> bytes:
    _journal(d).write_bytes(b.lines[0][:40])
    return b.lines[0][:40]


@case("journal-truncated-at-line-before-snapshot", "corrupt", SNAP_AT)
def _(d: Path, b: Base) -> None:
    _write_lines(d, b.lines[:5])


for _k, _at in ((11, 1), (11, -10), (11, -70), (11, None), (10, 30)):
    def _make_torn(k: int, cut: int | None) -> Callable[[Path, Base], bytes]:
        def damage(d: Path, b: Base) -> bytes:
            tail = b.lines[k] if cut is None else b.lines[k][:cut]
            _journal(d).write_bytes(b"".join(x + b"\n" for x in b.lines[:k]) + tail)
            _crashed_after(d, b, k)
            return tail
        return damage
    CASES.append(Case(f"journal-torn-line{_k}-cut{_at}", _make_torn(_k, _at), ("prefix", _k)))


@case("journal-last-line-dropped-cleanly", "lost", 11)
def _(d: Path, b: Base) -> None:
    _write_lines(d, b.lines[:11])


@case("journal-cut-tail-no-snapshot", "lost", 9)
def _(d: Path, b: Base) -> None:
    """Cut tail without a snapshot: the anchor knows what was lost."""
    _write_lines(d, b.lines[:9])
    _snap(d).unlink()


def _foreign_journal(d: Path) -> bytes:
    other = d.parent / "other"
    reg = Registry(other)
    for i in range(3):
        reg.claim(f"foreign-{i}", owner="x")
    reg.close()
    data = _journal(other).read_bytes().rstrip(b"\0")
    _journal(d).write_bytes(data)
    return data


@case("journal-foreign-snapshot-kept", "lost", SNAP_AT)
def _(d: Path, b: Base) -> bytes:
    """Another registry's journal over ours, our snapshot kept: refused (not adopted, our
    snapshot not quarantined as unanchored); doctor --fix restores our snapshot's claims."""
    return _foreign_journal(d)


@case("journal-foreign-no-snapshot", "reset")
def _(d: Path, b: Base) -> bytes:
    """Another registry's journal and no snapshot of ours: nothing to restore."""
    _snap(d).unlink()
    return _foreign_journal(d)


@case("folder-wiped-outside-a-repository", "reset")
def _(d: Path, b: Base) -> None:
    """The registry folder removed (git clean, rm -r): its anchor outside remembers it."""
    shutil.rmtree(d)


@case("snapshot-forged-fence-at-head", "exact")
def _(d: Path, b: Base) -> bytes:
    """A snapshot at the journal's end with fence 0 (checksum right): the fence mark in
    claims.lock exposes it; rebuilt from the journal, the next fence is the old top + 1."""
    state = replay(b.lines)
    state.fence = 0
    data = encode_snapshot(state, b.offsets[b.n])
    _snap(d).write_bytes(data)
    return data


@case("journal-forged-grant-appended-rechained", "audit", 13, "end", "exact")
def _(d: Path, b: Base) -> None:
    """A re-sealed, correctly chained claim_created reusing fence 1 appended at the end: the
    chain verifies; applying it fails (a grant is the high-water + 1)."""
    forged = orjson.loads(b.lines[1])  # fence 1
    last = orjson.loads(b.lines[-1])
    forged.update(seq=last["seq"] + 1, task="forged", prev=last["hash"])
    del forged["hash"]
    line, _ = seal(orjson.dumps(forged))
    with open(_journal(d), "ab") as f:
        f.write(line if line.endswith(b"\n") else line + b"\n")


@case("journal-junk-before", "audit", 1, 0, SNAP_AT)
def _(d: Path, b: Base) -> None:
    _journal(d).write_bytes(b"garbage before\n" + b"".join(x + b"\n" for x in b.lines))


@case("journal-junk-after-with-newline", "audit", 13, "end", "exact")
def _(d: Path, b: Base) -> None:
    with open(_journal(d), "ab") as f:
        f.write(b"some junk\n")


@case("journal-junk-after-no-newline", "exact")
def _(d: Path, b: Base) -> bytes:
    with open(_journal(d), "ab") as f:
        f.write(b"some junk")
    return b"some junk"


@case("journal-trailing-nul-run", "exact")
def _(d: Path, b: Base) -> None:
    # Zeros after the last line are unused (preallocated) space: nothing is damaged or kept.
    with open(_journal(d), "ab") as f:
        f.write(b"\0" * 4096)


@case("journal-preallocated-torn-tail", "exact")
def _(d: Path, b: Base) -> bytes:
    # A writer died mid-append into the preallocated (zero) space.
    with open(_journal(d), "ab") as f:
        f.write(b"\0" * 8192)
    append_raw(_journal(d), b'{"seq":13,"ts":1.0,"type":"lease_re')
    return b'{"seq":13,"ts":1.0,"type":"lease_re'


@case("journal-data-after-preallocated-space", "audit", 13, "end", "exact")
def _(d: Path, b: Base) -> None:
    # Lines beyond a run of zeros would be silently ignored: refused as damage instead.
    with open(_journal(d), "ab") as f:
        f.write(b"\0" * 8192 + b"some junk\n")


@case("journal-nul-run-after-snapshot", "audit", 10, 9, 9)
def _(d: Path, b: Base) -> None:
    data = bytearray(_journal(d).read_bytes())
    at = b.offsets[9] + 20
    data[at : at + 16] = b"\0" * 16
    _journal(d).write_bytes(bytes(data))


@case("journal-nul-run-before-snapshot", "verify_only", 4, 3)
def _(d: Path, b: Base) -> None:
    data = bytearray(_journal(d).read_bytes())
    at = b.offsets[3] + 20
    data[at : at + 16] = b"\0" * 16
    _journal(d).write_bytes(bytes(data))


@case("journal-flipped-byte-mid", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    _journal(d).write_bytes(_flip(_journal(d).read_bytes(), b.offsets[10] + 50))


@case("journal-grant-damaged-completion-kept", "audit", 5, 4, 4)
def _(d: Path, b: Base) -> None:
    # task-2's grant (line 4) damaged, its completion (line 9) verifies among the lines after:
    # task-2 stays completed after doctor --fix (#16)
    _snap(d).unlink()
    _journal(d).write_bytes(_flip(_journal(d).read_bytes(), b.offsets[4] + 20))


@case("journal-grant-unreadable-completion-kept", "audit", 5, 4, 4)
def _(d: Path, b: Base) -> None:
    # the same with the grant's bytes unreadable (no fence in them): the completion's fence
    # still counts for the high-water
    _snap(d).unlink()
    data = bytearray(_journal(d).read_bytes())
    data[b.offsets[4] : b.offsets[5] - 1] = b"x" * (b.offsets[5] - 1 - b.offsets[4])
    _journal(d).write_bytes(bytes(data))


@case("journal-invalid-utf8", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    data = _journal(d).read_bytes()
    at = data.index(b"agent-9")
    _journal(d).write_bytes(data[:at] + b"\xc3\x28" + data[at + 2 :])


@case("journal-deleted-line", "audit", 10, 9, 9)
def _(d: Path, b: Base) -> None:
    _write_lines(d, b.lines[:9] + b.lines[10:])


@case("journal-reordered-lines", "audit", 10, 9, 9)
def _(d: Path, b: Base) -> None:
    _write_lines(d, [*b.lines[:9], b.lines[10], b.lines[9], b.lines[11]])


@case("journal-wrong-types-rechained", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    _write_lines(d, _rechain(b.lines, 10, lambda body: body.replace(b'"fence":', b'"fence":"x",'
                                                                    b'"f2":', 1)))


@case("journal-huge-number-rechained", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    _write_lines(d, _rechain(b.lines, 10, lambda body: body.replace(
        b'"fence":', b'"fence":' + b"9" * 40 + b',"f2":', 1)))


@case("journal-nan-rechained", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    _write_lines(d, _rechain(b.lines, 10, lambda body: body.replace(b'"ts":', b'"ts":NaN,"t2":',
                                                                    1)))


@case("journal-deep-nesting-rechained", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    deep = b"[" * 3000 + b"]" * 3000
    _write_lines(d, _rechain(b.lines, 10, lambda body: body.replace(b'"ts":', b'"deep":' + deep
                                                                    + b',"ts":', 1)))


@case("journal-duplicate-key-edited", "audit", 11, 10, 10)
def _(d: Path, b: Base) -> None:
    lines = list(b.lines)
    lines[10] = lines[10].replace(b'"type":', b'"type":"claim_created","type":', 1)
    _write_lines(d, lines)


@case("journal-all-garbage", "audit", 1, 0, SNAP_AT)
def _(d: Path, b: Base) -> None:
    _journal(d).write_bytes(bytes(range(256)) * 8 + b"\n" + b"x" * 300 + b"\n")


@case("journal-crlf", "audit", 1, 0, "exact")
def _(d: Path, b: Base) -> None:
    """Converted to CRLF: every seal fails; doctor --fix recovers it all, seals unchanged."""
    _journal(d).write_bytes(b"".join(x + b"\r\n" for x in b.lines))


@case("journal-pretty-printed", "audit", 1, 0, "exact")
def _(d: Path, b: Base) -> None:
    """Pretty-printed with sorted keys by a JSON tool: recovered, seals rebuilt, noted."""
    import json

    _journal(d).write_bytes("".join(
        json.dumps(json.loads(x), indent=2, sort_keys=True) + "\n" for x in b.lines).encode())


@case("journal-reindented", "audit", 1, 0, "exact")
def _(d: Path, b: Base) -> None:
    """Whitespace added between members (key order kept): recovered, seals rebuilt."""
    import json

    _journal(d).write_bytes("".join(
        json.dumps(json.loads(x), separators=(", ", ": ")) + "\n" for x in b.lines).encode())


@case("snapshot-ahead-of-journal", "corrupt", SNAP_AT)
def _(d: Path, b: Base) -> None:
    _write_lines(d, b.lines[:SNAP_AT - 2])


def _plant(kind: str, target: Path) -> None:
    target.unlink() if target.exists() and not target.is_dir() else None
    if kind == "dir":
        target.mkdir()
    else:
        os.mkfifo(target)


for _name in ("audit.jsonl", "claims.json", "claims.lock"):
    for _kind in ("dir", "fifo"):
        def _make_plant(name: str, kind: str) -> Callable[[Path, Base], None]:
            def damage(d: Path, b: Base) -> None:
                _plant(kind, d / name)
            return damage
        CASES.append(Case(f"{_kind}-instead-of-{_name}", _make_plant(_name, _kind), ("unsafe",)))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(case: Case, base: Base, tmp_path: Path) -> None:
    """One damaged registry: the documented outcome, quarantine, and the state recovered."""
    d = tmp_path / "reg"
    shutil.copytree(base.root, d, symlinks=True)
    # The registry lived here: its anchor (outside the folder) records the undamaged head.
    anchor.record(d, replay(base.lines), force=True)
    expect_quarantined = case.damage(d, base)
    damaged_journal = _journal(d).read_bytes() if _journal(d).is_file() else None
    run_case(case, base, d, damaged_journal, expect_quarantined)


def test_corpus_size() -> None:
    """The issue asks for at least 25 damaged registries and journals."""
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)
