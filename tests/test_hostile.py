"""Hostile input and files: fuzzed library arguments and parser input raise only the documented
typed errors; symlinks, FIFOs and hard links planted at every path the store opens are refused
without touching their targets; unsafe directories are refused; tokens never leak."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fc_support import append_raw, replay
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fleetclaims
from fleetclaims import AuditCorrupt, FleetclaimsError, UnsafeRegistry
from fleetclaims.core.chain import token_hash
from fleetclaims.core.errors import RegistryCorrupt
from fleetclaims.store.file.journal import parse_line
from fleetclaims.store.file.snapshot import SnapshotError, decode_snapshot
from fleetclaims.store.file.store import FileStore

pytestmark = pytest.mark.integration

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(),
                      st.integers(min_value=2**63 - 2, max_value=2**80), st.floats(allow_nan=True),
                      st.text(max_size=20))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)
anything = st.one_of(json_any, st.binary(max_size=20), st.tuples(st.integers()),
                     st.just(object()), st.just(math.inf), st.integers(min_value=2**63),
                     st.text(alphabet=st.characters(), max_size=300))
ident = st.one_of(st.text(max_size=250), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}",
                                                       fullmatch=True), anything)


def _token(claim: fleetclaims.Claim) -> str:
    assert claim.token is not None
    return claim.token


def _checkpoint(reg: fleetclaims.Registry) -> None:
    """Write the file store's snapshot now (these tests attack the files it writes)."""
    assert isinstance(reg.store, FileStore)
    reg.store.checkpoint()


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> fleetclaims.Registry:
    registry = fleetclaims.Registry(tmp_path_factory.mktemp("hostile") / "reg")
    # Created now (its first write records registry_created), so that a test counting the
    # events it writes counts the same whichever tests ran before it (-m "not slow" skips
    # the fuzzers that used to create it).
    registry.sweep()
    return registry


def _typed(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except FleetclaimsError:
        return None
    # anything else propagates and fails the property


@pytest.mark.slow
@FUZZ
@given(task=ident, owner=ident, ttl=st.one_of(anything, st.floats(1, 90000)), note=anything,
       priority=anything, metadata=st.one_of(json_any, anything), take_stale=st.booleans())
def test_fuzz_claim(reg: fleetclaims.Registry, task: Any, owner: Any, ttl: Any, note: Any,
                    priority: Any, metadata: Any, take_stale: bool) -> None:
    """claim with arbitrary arguments: a claim or a typed error, nothing else."""
    _typed(reg.claim, task, owner=owner, ttl=ttl, note=note, priority=priority,
           metadata=metadata, take_stale=take_stale)


@pytest.mark.slow
@FUZZ
@given(task=ident, token=st.one_of(st.text(max_size=300), anything), ttl=anything,
       result=st.one_of(json_any, anything), phase=ident, to_owner=ident, reason=anything)
def test_fuzz_holder_operations(reg: fleetclaims.Registry, task: Any, token: Any, ttl: Any,
                                result: Any, phase: Any, to_owner: Any, reason: Any) -> None:
    """renew/release/complete/transition/handoff/recover/reopen/get/events with junk."""
    _typed(reg.renew, task, token=token, ttl=ttl)
    _typed(reg.release, task, token=token)
    _typed(reg.release, task, force=True, reason=reason, actor=to_owner)
    _typed(reg.complete, task, token=token, result=result)
    _typed(reg.transition, task, token=token, phase=phase, ttl=ttl)
    _typed(reg.handoff, task, token=token, to_owner=to_owner, note=reason)
    _typed(reg.recover, task, owner=to_owner, reason=reason, ttl=ttl)
    _typed(reg.reopen, task, reason=reason)
    _typed(reg.get, task)
    _typed(reg.claims, owner=to_owner)
    _typed(reg.events, after=ttl, limit=result, task=task, owner=to_owner)


@pytest.mark.slow
@FUZZ
@given(metadata=json_any, result=json_any)
def test_fuzz_round_trip_of_stored_values(reg: fleetclaims.Registry, metadata: Any,
                                          result: Any) -> None:
    """Whatever metadata/result is accepted is stored and read back by a fresh handle."""
    try:
        c = reg.claim("roundtrip", owner="fuzz", ttl=60, metadata={"m": metadata})
    except FleetclaimsError:
        return
    try:
        reg.complete("roundtrip", token=_token(c), result=result)
    except FleetclaimsError:
        reg.release("roundtrip", token=_token(c))
    fresh = fleetclaims.Registry(reg.location)
    assert fresh.get("roundtrip") is not None
    reg.reopen("roundtrip", reason="again")


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 2**200, [2**70], {"deep": 2**65}])
def test_integers_beyond_64_bits(reg: fleetclaims.Registry, value: Any) -> None:
    """Numbers JSON allows but the journal encoder cannot store: a ValidationError, nothing
    written, and the handle keeps working."""
    before = reg.store.read().seq
    with pytest.raises(fleetclaims.ValidationError):
        reg.claim("bigint", owner="fuzz", ttl=60, metadata={"n": value})
    with pytest.raises(fleetclaims.ValidationError):
        c = reg.claim("bigint-2", owner="fuzz", ttl=60)
        try:
            reg.complete("bigint-2", token=_token(c), result=value)
        finally:
            reg.release("bigint-2", token=_token(c))
    assert reg.store.read().seq == before + 2  # the plain claim and its release only
    assert reg.verify().ok


@pytest.mark.slow
@FUZZ
@given(data=st.binary(max_size=2000))
def test_fuzz_decode_snapshot_bytes(data: bytes) -> None:
    """Random bytes: SnapshotError, never anything else."""
    with contextlib.suppress(SnapshotError):
        decode_snapshot(data)


def _checksummed(body: bytes) -> bytes:
    import hashlib

    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'


@pytest.mark.slow
@FUZZ
@given(obj=st.dictionaries(st.sampled_from(["format", "seq", "offset", "head", "origin", "fence",
                                            "claims", "x"]), json_any, max_size=8),
       claims=st.dictionaries(st.text(max_size=5), json_any, max_size=3))
def test_fuzz_decode_snapshot_structured(obj: dict[str, Any], claims: dict[str, Any]) -> None:
    """Structurally plausible snapshots with a valid checksum: SnapshotError, or a snapshot
    whose claims read back or raise RegistryCorrupt — never a raw TypeError."""
    import orjson

    obj.setdefault("format", 1)
    obj.setdefault("head", "0" * 64)
    obj["claims"] = claims
    try:
        body = orjson.dumps(obj)
    except TypeError:
        return
    try:
        snap = decode_snapshot(_checksummed(body))
    except SnapshotError:
        return
    for task in snap.state.claims.tasks():
        with contextlib.suppress(RegistryCorrupt):
            snap.state.claims.get(task)


@pytest.mark.slow
@FUZZ
@given(line=st.binary(max_size=600), seq=st.integers(0, 10), prev=st.text(max_size=64))
def test_fuzz_parse_line(line: bytes, seq: int, prev: str) -> None:
    """Random lines: AuditCorrupt with seq and offset, never anything else."""
    try:
        parse_line(line, seq=seq, prev=prev, offset=7, path="audit.jsonl")
    except AuditCorrupt as exc:
        assert exc.seq == seq and exc.offset == 7


@pytest.mark.slow
@FUZZ
@given(fields=st.dictionaries(st.sampled_from(["type", "task", "owner", "fence", "token_hash",
                                               "expires_at", "ttl", "identity", "metadata",
                                               "claims", "origin", "phase", "priority"]),
                              json_any, max_size=10))
def test_fuzz_sealed_events_replay(fields: dict[str, Any]) -> None:
    """Correctly sealed lines with junk fields: replay raises AuditCorrupt or applies."""
    import orjson

    from fleetclaims.core.chain import envelope, seal

    try:
        body = orjson.dumps(envelope(1, 1.0, fields, "0" * 64))
    except TypeError:
        return
    line, _ = seal(body)
    with contextlib.suppress(AuditCorrupt):
        replay([line.rstrip(b"\n")])


# --- planted files ----------------------------------------------------------------------------

PATHS = ["audit.jsonl", "claims.json", "claims.lock"]


def _existing(tmp_path: Path) -> Path:
    d = tmp_path / "reg"
    r = fleetclaims.Registry(d)
    r.claim("t", owner="o", ttl=600)
    _checkpoint(r)
    r.close()
    return d


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("plant", ["symlink", "fifo", "hardlink"])
def test_planted_file(tmp_path: Path, name: str, plant: str) -> None:
    """A symlink, FIFO or hard link at a registry file: UnsafeRegistry for readers and writers,
    and the target is never written."""
    d = _existing(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    target = d / name
    target.unlink()
    if plant == "symlink":
        target.symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(target)
    else:
        os.link(victim, target)
    ops: list[Callable[[fleetclaims.Registry], object]] = [
        lambda r: r.claims(), lambda r: r.claim("x", owner="o", ttl=60)]
    for op in ops:
        r = fleetclaims.Registry(d, lock_timeout=2)
        with pytest.raises(UnsafeRegistry):
            op(r)
        r.close()
    assert victim.read_bytes() == b"precious\n"


def test_snapshot_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    """A symlinked claims.json is refused for reading; a checkpoint never writes through it."""
    d = _existing(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (d / "claims.json").unlink()
    (d / "claims.json").symlink_to(victim)
    with pytest.raises(UnsafeRegistry):
        fleetclaims.Registry(d).claims()
    assert victim.read_bytes() == b"precious\n"


@pytest.mark.parametrize("plant", ["symlink", "file", "fifo"])
def test_planted_quarantine(tmp_path: Path, plant: str) -> None:
    """quarantine/ replaced by a symlink, file or FIFO: repairs refuse instead of writing there."""
    d = _existing(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    q = d / "quarantine"
    if plant == "symlink":
        q.symlink_to(elsewhere)
    elif plant == "file":
        q.write_bytes(b"")
    else:
        os.mkfifo(q)
    append_raw(d / "audit.jsonl", b'{"seq":3,"torn')
    with pytest.raises(UnsafeRegistry):
        fleetclaims.Registry(d).claim("x", owner="o", ttl=60)
    assert list(elsewhere.iterdir()) == []
    assert (d / "audit.jsonl").read_bytes().split(b"\0", 1)[0].endswith(
        b'{"seq":3,"torn')  # nothing cut off


def test_registry_directory_symlink(tmp_path: Path) -> None:
    """The registry directory itself is a symlink: refused."""
    real = _existing(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeRegistry, match="symbolic link"):
        fleetclaims.Registry(link).claims()


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o720])
def test_group_or_world_writable_directory(tmp_path: Path, mode: int) -> None:
    """A directory others can write to is refused, with the chmod that fixes it."""
    d = _existing(tmp_path)
    os.chmod(d, mode)
    with pytest.raises(UnsafeRegistry, match="chmod 700"):
        fleetclaims.Registry(d).claim("x", owner="o", ttl=60)
    os.chmod(d, 0o700)
    fleetclaims.Registry(d).claim("x", owner="o", ttl=60)


def _nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("what", ["directory", "audit.jsonl", "claims.lock", "claims.json"])
def test_owned_by_another_user(tmp_path: Path, what: str) -> None:
    """A directory or file owned by someone else (nobody) is refused."""
    d = _existing(tmp_path)
    target = d if what == "directory" else d / what
    os.chown(target, _nobody(), -1)
    with pytest.raises(UnsafeRegistry, match="owned by uid"):
        r = fleetclaims.Registry(d)
        r.claims()
        r.claim("x", owner="o", ttl=60)


# --- secrets ----------------------------------------------------------------------------------

SECRET = "SeCrEt-token-value_0123456789abcdef"


def test_tokens_never_leak(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Neither a chosen nor a generated token appears on disk, in the journal, in logs or in
    error messages; only its hash is stored."""
    caplog.set_level(logging.DEBUG)
    d = tmp_path / "reg"
    reg = fleetclaims.Registry(d)
    mine = reg.claim("secret-task", owner="agent", ttl=60, token=SECRET)
    generated = reg.claim("other-task", owner="agent", ttl=60)
    tokens = [SECRET, _token(generated)]
    errors: list[str] = []
    for attempt in (
        lambda: reg.claim("secret-task", owner="thief", ttl=60, token=SECRET + "x"),
        lambda: reg.renew("other-task", token=SECRET),
        lambda: reg.complete("secret-task", token=_token(generated)),
        lambda: reg.release("other-task", token=SECRET + "\x00bad"),
        lambda: reg.renew("secret-task", token="short"),
        lambda: reg.handoff("other-task", token=SECRET, to_owner="x"),
    ):
        try:
            attempt()
        except FleetclaimsError as exc:
            errors.append(str(exc))
            errors.append(repr(exc.to_dict()))
    assert errors
    reg.renew("secret-task", token=mine.token)  # type: ignore[arg-type]
    # Damage the snapshot so that repair paths (quarantine, notes, logs) run too.
    _checkpoint(reg)
    snap = d / "claims.json"
    snap.write_bytes(snap.read_bytes()[:-10])
    fleetclaims.Registry(d).claim("after", owner="agent", ttl=60)
    blobs = [p.read_bytes() for p in d.rglob("*") if p.is_file()]
    for token in tokens:
        assert token_hash(token).encode() in b"".join(blobs) or token == SECRET + "x"
        for blob in blobs:
            assert token.encode() not in blob
        for message in errors:
            assert token not in message
        assert token not in caplog.text


def test_directory_permissions_on_creation(tmp_path: Path) -> None:
    """A new registry is private: directory 0700, files 0600, a .gitignore of '*'."""
    d = tmp_path / "reg"
    r = fleetclaims.Registry(d)
    r.claim("t", owner="o", ttl=60)
    _checkpoint(r)
    assert (os.stat(d).st_mode & 0o777) == 0o700
    for name in ("audit.jsonl", "claims.json", "claims.lock"):
        assert (os.stat(d / name).st_mode & 0o777) == 0o600, name
    assert "*" in (d / ".gitignore").read_text().splitlines()


def test_the_metadata_limit_counts_the_bytes_sent(tmp_path: Path) -> None:
    """16 KiB of compact JSON is accepted and one byte more refused: the size was counted
    with ", " and ": " separators, ~2 bytes a member the user never sent (12 KB refused)."""
    from fleetclaims.core.validate import JSON_MAX

    reg = fleetclaims.Registry(tmp_path / "r")
    exact = {"a": "x" * (JSON_MAX - 8)}  # {"a":"…"} is 8 bytes of syntax
    reg.claim("m1", owner="o", metadata=exact)
    many = {"a": [0] * 6000}  # 12,007 bytes compact
    reg.claim("m2", owner="o", metadata=many)
    with pytest.raises(fleetclaims.ValidationError):
        reg.claim("m3", owner="o", metadata={"a": "x" * (JSON_MAX - 7)})
    assert reg.get("m3") is None
