"""The snapshot's format 4 (packed claim entries a line, sorted, in a live and an ended section,
an identity table) holds exactly what format 1 held, and registries whose snapshot an earlier
version wrote in format 1, 2 or 3 still load."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from fc_support import file_store, journal_lines, replay, token_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetclaims import Registry
from fleetclaims.cli import main
from fleetclaims.core.state import State
from fleetclaims.store.file.snapshot import (
    SnapshotClaims,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
)
from fleetclaims.testing import FakeClock, FakeProber

pytestmark = pytest.mark.integration


def encode_format_1(state: State, offset: int) -> bytes:
    """The snapshot exactly as the previous version wrote it (format 1)."""
    body = orjson.dumps({"format": 1, "seq": state.seq, "offset": offset, "head": state.head,
                         "origin": state.origin, "fence": state.fence,
                         "claims": dict(state.claims.raw_items())})
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'


def encode_format_2(state: State, offset: int) -> bytes:
    """The snapshot as the previous version wrote it (format 2: one object, packed entries;
    identities left inline, which format 2 also reads)."""
    claims = {}
    for task, entry in state.claims.raw_items():
        packed = dict(entry)
        del packed["task"]
        claims[task] = packed
    body = orjson.dumps({"format": 2, "seq": state.seq, "offset": offset, "head": state.head,
                         "origin": state.origin, "fence": state.fence, "identities": [],
                         "claims": claims})
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'


def varied_registry(path: Path) -> tuple[Registry, FakeClock, FakeProber]:
    """Claims in every shape a record takes: other processes, no process, parked, renewed,
    another phase and priority, released (retired grants), completed with a result, metadata,
    a hand-off, an expiry mark."""
    clock, prober = FakeClock(), FakeProber()
    reg = Registry(path, clock=clock, prober=prober)
    for i in range(6):
        prober.as_pid(1000 + i % 3, start=7 + i % 3)
        reg.claim(f"plain-{i}", owner=f"agent-{i % 2}", ttl=600)
    reg.claim("no-process", owner="cli", ttl=60, process=False, note="from a shell")
    c = reg.claim("renewed", owner="a", ttl=30, priority=5, metadata={"k": [1, 2.5, None]})
    clock.advance(3)
    reg.renew("renewed", token=token_of(c), ttl=90)
    c = reg.claim("parked", owner="a")
    reg.transition("parked", token=token_of(c), phase="review")
    c = reg.claim("released", owner="a")
    reg.release("released", token=c.token)
    reg.release("released", token=reg.claim("released", owner="b").token)
    c = reg.claim("done", owner="b")
    reg.complete("done", token=token_of(c), result={"pr": 17})
    c = reg.claim("handed", owner="a")
    reg.handoff("handed", token=token_of(c), to_owner="b", note="yours")
    reg.claim("expiring", owner="c", ttl=1)
    clock.advance(5)
    reg.sweep()
    return reg, clock, prober


def materialized(state: State) -> dict[str, dict[str, Any]]:
    return {c.task: c.to_dict() for c in state.claims.values()}


def test_packed_snapshot_holds_exactly_what_the_journal_says(tmp_path: Path) -> None:
    reg, _, _ = varied_registry(tmp_path / "r")
    file_store(reg).checkpoint()
    data = (tmp_path / "r" / "claims.json").read_bytes()
    snap = decode_snapshot(data)
    assert orjson.loads(data)["format"] == 4
    lines, _ = journal_lines(tmp_path / "r")
    expected = replay(lines)
    # Raw (unconverted) entries read back as the persisted dicts of the claims...
    assert dict(snap.state.claims.raw_items()) == {
        c.task: c.to_dict(compact=True) for c in expected.claims.values()}
    # ...and as equal claims.
    assert materialized(snap.state) == materialized(expected)
    assert (snap.state.seq, snap.state.fence, snap.state.head) == (
        expected.seq, expected.fence, expected.head)
    # Three owner processes made the process-bound claims: three identities, not one a claim.
    assert len(orjson.loads(data)["identities"]) == 3


def test_checkpoint_of_a_loaded_snapshot_rewrites_it_identically(tmp_path: Path) -> None:
    """Untouched entries are written back as read, touched ones packed again: the same."""
    reg, _, _ = varied_registry(tmp_path / "r")
    file_store(reg).checkpoint()
    data = (tmp_path / "r" / "claims.json").read_bytes()
    snap = decode_snapshot(data)
    assert encode_snapshot(snap.state, snap.offset) == data
    snap.state.claims.get("renewed")  # converted to a Claim: packed again from it
    # (The converted entry moves to the end of the claims object, hence the parse.)
    assert orjson.loads(encode_snapshot(snap.state, snap.offset)) == orjson.loads(data) | {
        "checksum": orjson.loads(encode_snapshot(snap.state, snap.offset))["checksum"]}


def test_unused_identities_are_dropped(tmp_path: Path) -> None:
    clock, prober = FakeClock(), FakeProber()
    reg = Registry(tmp_path / "r", clock=clock, prober=prober)
    tokens = {}
    for pid in (10, 11, 12):
        prober.as_pid(pid)
        tokens[pid] = reg.claim(f"t{pid}", owner="a").token
    file_store(reg).checkpoint()
    assert len(orjson.loads((tmp_path / "r" / "claims.json").read_bytes())["identities"]) == 3
    reg.close()
    # A fresh process loads the packed table and takes t11 over as pid 13.
    reg2 = Registry(tmp_path / "r", clock=clock, prober=prober.as_pid(13))
    reg2.release("t11", token=tokens[11])
    reg2.claim("t11", owner="b")
    file_store(reg2).checkpoint()
    data = (tmp_path / "r" / "claims.json").read_bytes()
    pids = sorted(i["pid"] for i in orjson.loads(data)["identities"])
    assert pids == [10, 12, 13]
    state = decode_snapshot(data).state
    assert {t: state.claims.get(t).identity.pid for t in ("t10", "t11", "t12")} == {  # type: ignore[union-attr]
        "t10": 10, "t11": 13, "t12": 12}


def test_format_1_snapshot_of_an_earlier_version_still_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing user's registry: its snapshot in format 1 loads with the same claims and the
    same `list --json`, passes `audit verify`, and the next checkpoint writes format 2."""
    reg, clock, prober = varied_registry(tmp_path / "r")
    file_store(reg).checkpoint()
    state = reg.store.read()
    offset = file_store(reg)._offset
    reg.close()
    snap_path = tmp_path / "r" / "claims.json"
    packed = snap_path.read_bytes()
    assert main(["list", "--all", "--json", "--dir", str(tmp_path / "r")]) == 0
    listed_packed = json.loads(capsys.readouterr().out)

    old = encode_format_1(decode_snapshot(packed).state, offset)
    snap_path.write_bytes(old)
    os.chmod(snap_path, 0o600)
    loaded = Registry(tmp_path / "r", clock=clock, prober=prober)
    assert materialized(loaded.store.read()) == materialized(state)
    assert loaded.verify().ok and loaded.verify().anchor_ok
    loaded.close()
    assert main(["list", "--all", "--json", "--dir", str(tmp_path / "r")]) == 0
    listed_old = json.loads(capsys.readouterr().out)
    for doc in listed_old + listed_packed:
        doc.pop("expires_in")  # relative to the moment of listing
    assert listed_old == listed_packed and len(listed_old) == len(state.claims)
    assert not list((tmp_path / "r").glob("quarantine/*"))  # read, not treated as damage

    again = Registry(tmp_path / "r", clock=clock, prober=prober)
    file_store(again).checkpoint()
    rewritten = orjson.loads(snap_path.read_bytes())
    assert rewritten["format"] == 4  # format 4 again, with the packed original's content
    assert {k: v for k, v in rewritten.items() if k != "checksum"} == {
        k: v for k, v in orjson.loads(packed).items() if k != "checksum"}


def test_committed_example_is_format_1_and_reads() -> None:
    """.cache-example/ was written by the format-1 version: a fixture for the old reader."""
    root = Path(__file__).resolve().parent.parent / ".cache-example"
    data = (root / "claims.json").read_bytes()
    assert orjson.loads(data)["format"] == 1
    snap = decode_snapshot(data)
    lines, _ = journal_lines(root)
    assert materialized(snap.state) == materialized(replay(lines[: snap.state.seq]))


@pytest.mark.parametrize("claims, identities", [
    ({"t": {"task": "t", "owner": "a", "fence": 1}}, []),  # a format-1 entry in format 2
    ({"t": {"owner": "a", "fence": 1}}, {"not": "a list"}),
    ({"t": {"owner": "a", "fence": 1}}, [1, 2]),
    ({"t": ["not", "an", "object"]}, []),
])
def test_malformed_packed_snapshots_are_refused(claims: dict[str, Any], identities: Any) -> None:
    body = orjson.dumps({"format": 2, "seq": 0, "offset": 0, "head": "0" * 64, "origin": "",
                         "fence": 0, "identities": identities, "claims": claims})
    digest = hashlib.sha256(body).hexdigest().encode()
    with pytest.raises(SnapshotError):
        decode_snapshot(body[:-1] + b',"checksum":"' + digest + b'"}\n')


def test_identity_number_out_of_range_stays_damage() -> None:
    """A packed entry naming no identity in the table is reported at use, and a checkpoint
    never lets a later identity fill the hole."""
    from fleetclaims.core.errors import RegistryCorrupt

    table = SnapshotClaims({"t": {"owner": "a", "fence": 1, "identity": 3}})
    state = State(table, 1, 1, "0" * 64, "")
    with pytest.raises(RegistryCorrupt):
        state.claims.get("t")
    snap = decode_snapshot(encode_snapshot(state, 0))
    assert dict(snap.state.claims.raw_items())["t"]["identity"] == -1


def test_large_snapshot_checksum_and_parse_errors(tmp_path: Path) -> None:
    """Every byte of a snapshot is under its checksum (a flipped byte is refused); format 2
    snapshots above 1 MiB are hashed on a second thread while they are parsed and are checked
    just as strictly; format 4 parses its frame at load and each line at use, so invalid JSON
    under a forged checksum is refused at load in the frame and, in a line, at the first use
    of that claim and by doctor's check of every entry."""
    from fleetclaims.core.errors import RegistryCorrupt
    from fleetclaims.store.file import snapshot

    state = State()
    for i in range(4000):
        state.claims[f"task-{i:05d}"] = _claim(i)
    data = encode_snapshot(state, 0)
    assert len(decode_snapshot(data).state.claims) == 4000
    middle = len(data) // 2
    flipped = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]
    with pytest.raises(SnapshotError, match="checksum"):
        decode_snapshot(flipped)

    def forge(doc: bytes, at: int) -> bytes:
        body = doc[: doc.rindex(b',"checksum":"')] + b"}"
        broken = body[:at] + b"\x00" + body[at + 1 :]
        digest = hashlib.sha256(broken).hexdigest()
        return broken[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'

    old = encode_format_2(State(SnapshotClaims(dict(decode_snapshot(data).state.claims
                                                    .raw_items()))), 0)
    assert len(old) > snapshot._PARALLEL_HASH_MIN
    assert len(decode_snapshot(old).state.claims) == 4000
    with pytest.raises(SnapshotError, match="checksum"):
        decode_snapshot(old[:middle] + bytes([old[middle] ^ 0x01]) + old[middle + 1:])
    with pytest.raises(SnapshotError, match="not valid JSON"):
        decode_snapshot(forge(old, len(old) // 2))
    with pytest.raises(SnapshotError, match="not valid JSON"):
        decode_snapshot(forge(data, 20))  # in the header
    damaged = decode_snapshot(forge(data, middle)).state.claims
    task = data[data.rindex(b"\n", 0, middle) + 1 :].split(b'"')[1].decode()
    with pytest.raises(RegistryCorrupt, match=task):
        damaged.get(task)
    with pytest.raises(RegistryCorrupt):
        list(snapshot.claim_records(damaged))
    with pytest.raises(RegistryCorrupt):
        list(damaged.values())  # a listing: typed too, never a raw parse error
    assert damaged.get("task-00000") is not None  # the other entries stay readable


def _claim(i: int) -> Any:
    from fleetclaims.core.model import Claim

    return Claim(task=f"task-{i:05d}", owner="o", fence=i + 1, token_hash="h" * 64,
                 claimed_at=1.0 + i, renewed_at=1.0 + i, expires_at=100.0 + i, ttl=99.0,
                 eid="e" * 64, seq=i + 2, note="n" * 200)


def test_large_snapshot_loads_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter shutdown no thread starts: a large snapshot is then hashed inline."""
    import threading

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    state = State()
    for i in range(4000):
        state.claims[f"task-{i:05d}"] = _claim(i)
    data = encode_format_2(state, 0)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert len(decode_snapshot(data).state.claims) == 4000
    with pytest.raises(SnapshotError, match="checksum"):
        decode_snapshot(data[:100] + b"X" + data[101:])


def test_identity_clean_up_renumbers_only_the_identity_members() -> None:
    """When a checkpoint drops an identity no claim names any more, the other numbers are
    rewritten in place (claims whose metadata has an "identity" member of its own keep it),
    and the file is byte for byte what encoding every claim afresh writes."""
    from fleetclaims.core.model import Claim, Identity
    from fleetclaims.core.state import ClaimTable

    def claim(i: int, pid: int, metadata: Any = None) -> Claim:
        return Claim(task=f"t{i}", owner="o", fence=i + 1, token_hash="h" * 64,
                     claimed_at=1.0, renewed_at=1.0, expires_at=100.0, metadata=metadata,
                     identity=Identity(host="h", pid=pid, start=1))

    state = State()
    for i, pid in enumerate([10, 11, 12, 10, 12, 13]):
        state.claims[f"t{i}"] = claim(i, pid, {"identity": 1} if i % 2 else {"x": {"identity": 0}})
    loaded = decode_snapshot(encode_snapshot(state, 0)).state
    assert [i["pid"] for i in orjson.loads(encode_snapshot(loaded, 0))["identities"]] == [
        10, 11, 12, 13]
    loaded.claims["t1"] = claim(1, 12, {"identity": 1})  # pid 11 is named no more
    data = encode_snapshot(loaded, 0)
    assert [i["pid"] for i in orjson.loads(data)["identities"]] == [10, 12, 13]
    again = decode_snapshot(data).state
    assert [again.claims.get(f"t{i}").identity.pid  # type: ignore[union-attr]
            for i in range(6)] == [10, 12, 12, 10, 12, 13]
    assert [again.claims.get(f"t{i}").metadata for i in range(2)] == [  # type: ignore[union-attr]
        {"x": {"identity": 0}}, {"identity": 1}]
    fresh = State(ClaimTable(dict(again.claims.raw_items())))
    assert encode_snapshot(fresh, 0) == data


def _format_3(data: bytes) -> bytes:
    """A format-4 snapshot as the format-3 writer laid it out (the identity number first in
    each line instead of last): same content, older layout."""
    header = data.split(b"\n", 1)[0]
    doc = orjson.loads(data)
    sections = []
    for name in ("claims", "ended"):
        lines = []
        for task, entry in doc[name].items():
            if "identity" in entry:
                entry = {"identity": entry.pop("identity"), **entry}
            lines.append(orjson.dumps(task) + b":" + orjson.dumps(entry))
        sections.append(b",\n".join(sorted(lines)))
    head = orjson.loads(header[:-1] + b"}")
    head["format"] = 3
    head["bytes"] = {"claims": len(sections[0]), "ended": len(sections[1])}
    body = (orjson.dumps(head)[:-1] + b',\n"claims":{\n' + sections[0] + b'\n},\n"ended":{\n'
            + sections[1] + b"\n}}")
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"checksum":"' + digest.encode() + b'"}\n'


def test_format_3_snapshot_loads_and_is_rewritten_as_format_4(tmp_path: Path) -> None:
    """Format 3 (a few hours of 2026-12-01: identity numbers anywhere in a line) loads with the
    same claims, and its first checkpoint encodes every line afresh as format 4 (never a
    renumbering that would miss an identity number in the middle of a line)."""
    reg, clock, prober = varied_registry(tmp_path / "r")
    file_store(reg).checkpoint()
    state = reg.store.read()
    reg.close()
    snap_path = tmp_path / "r" / "claims.json"
    current = snap_path.read_bytes()
    snap_path.write_bytes(_format_3(current))
    loaded = Registry(tmp_path / "r", clock=clock, prober=prober)
    assert materialized(loaded.store.read()) == materialized(state)
    loaded.claim("fresh", owner="z")  # a change, then a checkpoint of the format-3 table
    file_store(loaded).checkpoint()
    doc = orjson.loads(snap_path.read_bytes())
    assert doc["format"] == 4 and len(doc["identities"]) == 3
    assert materialized(decode_snapshot(snap_path.read_bytes()).state) == materialized(
        loaded.store.read())
    loaded.close()



def test_a_task_with_no_line_is_searched_for_once(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """claim_next looks up the claim of every open task it walks, and most have none: the
    table remembers which tasks have no line in its (never changing) bytes instead of binary
    searching both sections on every lookup; a claim set afterwards is still found, a copy
    answers the same."""
    reg, _, _ = varied_registry(tmp_path / "r")
    reg.close()
    claims = decode_snapshot((tmp_path / "r" / "claims.json").read_bytes()).state.claims
    assert isinstance(claims, SnapshotClaims)
    from fleetclaims.store.file import snapshot_table

    searches: list[bytes] = []
    real = snapshot_table.find_line  # type: ignore[attr-defined]  # (as the table calls it)

    def counted(data: Any, section: Any, probe: bytes) -> Any:
        searches.append(probe)
        return real(data, section, probe)

    monkeypatch.setattr(snapshot_table, "find_line", counted)
    for _ in range(5):
        assert claims.get("open-task") is None and "open-task" not in claims
    assert len(searches) == 2  # (the live and the ended section, once)
    assert claims.get("done") is not None and claims.get("plain-0") is not None
    clone = claims.copy()
    before = len(searches)
    assert clone.get("open-task") is None and len(searches) == before
    claim = claims.get("done")
    assert claim is not None
    claims["open-task"] = claim.evolve(task="open-task")
    got = claims.get("open-task")
    assert got is not None and got.task == "open-task" and "open-task" in claims


def test_a_large_section_is_narrowed_by_a_sample_to_the_same_answer() -> None:
    """A large section is searched inside the window its sampled heads leave: for every name
    present, every name absent (before the first, between each pair, after the last) and names
    sharing more than the sampled head's bytes, the answer (line, or where it would go) is the
    plain binary search's."""
    from fleetclaims.store.file.snapshot_lines import (
        SAMPLE_HEAD,
        SAMPLE_MIN,
        SEP,
        find_line,
        narrow,
        sample,
    )

    long = "x" * (SAMPLE_HEAD + 7)  # names that agree beyond every sampled head
    names = sorted({f"t{i:05d}" for i in range(0, 3000, 2)}
                   | {f"{long}{i:04d}" for i in range(0, 600, 3)}
                   | {f"a.{i}" for i in range(40)},
                   key=lambda n: orjson.dumps(n))
    lines = [orjson.dumps(n) + b":" + orjson.dumps({"owner": "w" * (i % 50), "fence": i})
             for i, n in enumerate(names)]
    head = b'{"format":4,"claims":{\n'
    data = head + SEP.join(lines) + b"\n}}"
    section = (len(head), len(head) + len(SEP.join(lines)))
    assert section[1] - section[0] >= SAMPLE_MIN  # (large enough to be narrowed)
    samples = sample(data, section)
    assert len(samples[1]) > 10
    absent = ([f"t{i:05d}" for i in range(-1, 3002, 2)] + [f"{long}{i:04d}" for i in range(601)]
              + ["", "a", "a.", "zz", "0", long, long + "9999", long[:SAMPLE_HEAD]])
    for name in names + absent:
        probe = orjson.dumps(name) + b":"
        window = narrow(samples, section, probe)
        assert section[0] <= window[0] <= window[1] <= section[1]
        assert find_line(data, window, probe) == find_line(data, section, probe), name
    for name in names:
        ls, ce, found = find_line(data, narrow(samples, section, orjson.dumps(name) + b":"),
                                  orjson.dumps(name) + b":")
        assert found and orjson.loads(b"{" + data[ls:ce] + b"}")[name]["fence"] >= 0
    # Names the validator refuses but a journal could carry (a name starting with ':') cut
    # their sampled heads after the opening quote all the same.
    colons = sorted((f":{i:04d}" for i in range(3000)), key=lambda n: orjson.dumps(n))
    colon_data = SEP.join(orjson.dumps(n) + b':{"fence":1}' for n in colons)
    colon_section = (0, len(colon_data))
    colon_samples = sample(colon_data, colon_section)
    assert colon_samples[1]
    for name in [*colons[::7], ":", ":9999", ":0000x"]:
        probe = orjson.dumps(name) + b":"
        assert (find_line(colon_data, narrow(colon_samples, colon_section, probe), probe)
                == find_line(colon_data, colon_section, probe)), name
    # A sampled name with an escape could hold '":' inside it: that section is searched whole.
    odd = [orjson.dumps(f'q":{i:05d}') + b':{"fence":1}' for i in range(9000)]
    odd_data = SEP.join(odd)
    escaped = sample(odd_data, (0, len(odd_data)))
    assert escaped == ([], []) and narrow(escaped, (0, 9), b'"a":') == (0, 9)


def test_every_claim_of_a_large_snapshot_is_found_after_a_load(tmp_path: Path) -> None:
    """Through the table: a registry whose ended section is large enough to be narrowed
    finds every claim it holds, and none of the tasks it never claimed."""
    reg = Registry(tmp_path / "r", durability="process")
    done = [f"done-{i:04d}" for i in range(600)]
    for task in done:
        reg.complete(task, token=token_of(reg.claim(task, owner="w", ttl=3600)))
    reg.claim("held", owner="w", ttl=3600)
    reg.close()  # (at rest: claims.json holds the journal's head)
    claims = decode_snapshot((tmp_path / "r" / "claims.json").read_bytes()).state.claims
    assert isinstance(claims, SnapshotClaims)
    for task in done:
        claim = claims.get(task)
        assert claim is not None and claim.task == task and claim.state == "completed"
    assert claims.get("held") is not None
    for task in ("done-", "done-0600", "done-00000", "a", "zzz"):
        assert claims.get(task) is None
    assert claims._samples  # (the ended section was large enough to be narrowed)


_NAME = st.text(alphabet="ab0.:/#=,~-", min_size=1, max_size=70).map(lambda s: "a" + s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.sets(_NAME, min_size=1, max_size=400), probes=st.lists(_NAME, max_size=30),
       pad=st.integers(min_value=0, max_value=300), every=st.sampled_from([64, 256, 4096]))
def test_narrowing_agrees_with_the_plain_search(names: set[str], probes: list[str], pad: int,
                                                every: int) -> None:
    """Random task names of the allowed characters (long shared prefixes, names that are
    prefixes of others), lines of random lengths, samples at several spacings: the narrowed
    search answers as the plain one, for the names present and for random others."""
    from fleetclaims.store.file import snapshot_lines as sl

    ordered = sorted(names, key=lambda n: orjson.dumps(n))
    lines = [orjson.dumps(n) + b':{"owner":"' + b"w" * ((i * 37 + pad) % 300) + b'"}'
             for i, n in enumerate(ordered)]
    head = b"x" * pad + b'"claims":{\n'
    body = sl.SEP.join(lines)
    data = head + body + b"\n}"
    section = (len(head), len(head) + len(body))
    real = sl.SAMPLE_EVERY
    sl.SAMPLE_EVERY = every  # (denser samples exercise more window edges on small inputs)
    try:
        samples = sl.sample(data, section)
    finally:
        sl.SAMPLE_EVERY = real
    for name in ordered + probes:
        probe = orjson.dumps(name) + b":"
        got = sl.find_line(data, sl.narrow(samples, section, probe), probe)
        assert got == sl.find_line(data, section, probe), name


def test_a_fresh_handle_refuses_every_task_held_in_a_large_live_section(tmp_path: Path) -> None:
    """End to end, the lookup that keeps one live holder: 4,000 live claims (a live section
    well over the size that is narrowed by samples, in a claims.json large enough to be read
    into an mmap), a fresh handle loading them from claims.json refuses another owner's claim
    of each held task and shows its holder."""
    from fleetclaims import ClaimConflict

    reg = Registry(tmp_path / "r", durability="process")
    held = [f"area-{i % 7}/task.{i:05d}" for i in range(4000)]
    for task in held:
        reg.claim(task, owner="holder", ttl=3600)
    reg.close()
    fresh = Registry(tmp_path / "r", durability="process")
    try:
        for task in held:
            with pytest.raises(ClaimConflict):
                fresh.claim(task, owner="intruder", ttl=60)
            got = fresh.get(task)
            assert got is not None and got.owner == "holder"
    finally:
        fresh.close()
    # The table as loaded from the file, once the at-rest snapshot (written by a helper for a
    # large registry) covers every claim: the same lookups.
    deadline = time.monotonic() + 30
    while True:
        loaded, problem = read_snapshot(tmp_path / "r" / "claims.json")  # (as a handle reads)
        assert loaded is not None, problem
        claims = loaded.state.claims
        if len(claims) >= len(held) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert isinstance(claims, SnapshotClaims)
    assert (tmp_path / "r" / "claims.json").stat().st_size >= 1 << 20
    assert not isinstance(claims._data, bytes)  # (read into an mmap: find and slices on it)
    for task in held:
        got = claims.get(task)
        assert got is not None and got.owner == "holder" and got.live
    assert claims._live in claims._samples  # (the live section was narrowed, not searched whole)
