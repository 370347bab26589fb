"""The corruption corpus's runner: one damaged registry, its documented outcome checked.

(tests/test_corruption_corpus.py holds the cases; this module checks each kind of outcome.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from fc_support import claims_view, quarantined, temp_files

import fleetclaims
from fleetclaims import (
    AuditCorrupt,
    FleetclaimsError,
    HistoryLost,
    RegistryCorrupt,
    TaskCompleted,
    UnsafeRegistry,
)
from fleetclaims.store.file import doctor


@dataclass
class Base:
    root: Path
    lines: list[bytes]
    offsets: list[int]  # offset of each line; offsets[len(lines)] is the journal size
    snapshot: bytes
    views: list[dict[str, Any]]  # claims view after k lines
    fences: list[int]

    @property
    def n(self) -> int:
        return len(self.lines)


@dataclass
class Case:
    name: str
    damage: Callable[[Path, Base], bytes | None]  # returns bytes expected in quarantine
    outcome: tuple[Any, ...]


def _journal(d: Path) -> Path:
    return d / "audit.jsonl"


def _expected_view(b: Base, which: Any) -> dict[str, Any]:
    return b.views[b.n] if which == "exact" else b.views[int(which)]


def _expected_fence(b: Base, which: Any) -> int:
    return b.fences[b.n] if which == "exact" else b.fences[int(which)]


def _state(d: Path) -> Any:
    reg = fleetclaims.Registry(d, lock_timeout=5)
    try:
        return reg.store.read()
    finally:
        reg.close()


def _view_without(state: Any, task: str = "after-damage") -> dict[str, Any]:
    view = claims_view(state)
    view.pop(task, None)
    return view


def _write(d: Path) -> None:
    reg = fleetclaims.Registry(d, lock_timeout=5)
    try:
        reg.claim("after-damage", owner="checker", ttl=60)
    finally:
        reg.close()


def _fix_and_check(d: Path, b: Base, after_fix: Any, original: bytes | None) -> None:
    before = doctor.check(d)
    assert not before.ok, before.to_dict()
    files = sorted(p.name for p in d.iterdir())
    fixed = doctor.check(d, fix=True)
    assert fixed.ok, fixed.to_dict()
    state = _state(d)
    view = _view_without(state)
    restored = {t for f in fixed.findings if f.kind == "completions_restored"
                for t in f.details["tasks"]}
    if after_fix != "exact" and "segment_kept" in fixed.kinds():
        # Lines after the damage that verify are kept (#16): each task is as the verified
        # prefix left it or as the whole undamaged journal did, never anything the bytes did
        # not hold; and the kept lines restore at least what the prefix alone did.
        whole, prefix = b.views[b.n], _expected_view(b, after_fix)
        for task in set(view) | set(whole):
            if task in restored:  # granted in the damaged bytes, its completion verified:
                # completed as the whole journal says (the grant's other details are lost)
                assert _named(view[task]) == _named(whole[task]), task
                continue
            assert view.get(task) in (prefix.get(task), whole.get(task)), task
        for task, chained in _completions(b).items():  # a completion the bytes still hold
            if original is not None and chained in original:  # chained as it was: completed
                assert view[task]["state"] == "completed", (task, view.get(task))
        assert sum(view.get(t) == whole.get(t) for t in whole) >= sum(
            prefix.get(t) == whole.get(t) for t in whole)
    else:
        assert view == _expected_view(b, after_fix)
    assert state.fence >= _expected_fence(b, after_fix)
    if original is not None:
        assert original in quarantined(d).values(), "the damaged journal is not in quarantine"
    _write(d)
    assert doctor.check(d).ok
    assert temp_files(d) == []
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok
    for task in restored:  # completed: refused to a new claim until reopened
        _assert_typed(lambda: reg.claim(task, owner="checker"), TaskCompleted)  # noqa: B023
    if restored:  # no fence handed out twice
        assert reg.get("after-damage").fence > max(b.fences)  # type: ignore[union-attr]
    reg.close()
    del files


def _completions(b: Base) -> dict[str, bytes]:
    """Each claim_completed line of the undamaged journal after the line it chains to (in a
    damaged journal that holds these bytes, the completion is in a segment that verifies), by
    task."""
    out = {}
    for i, line in enumerate(b.lines[1:], 1):
        event = orjson.loads(line)
        if event["type"] == "claim_completed":
            out[event["task"]] = b.lines[i - 1] + b"\n" + line + b"\n"
    return out


def _named(claim: dict[str, Any]) -> tuple[Any, ...]:
    """What a completion names of its claim."""
    return claim["owner"], claim["fence"], claim["state"], claim.get("result")


def _assert_typed(fn: Callable[[], Any], kind: type[BaseException]) -> BaseException:
    try:
        fn()
    except FleetclaimsError as exc:
        assert isinstance(exc, kind), f"expected {kind.__name__}, got {exc!r}"
        return exc
    raise AssertionError(f"expected {kind.__name__}, nothing raised")


def _check_empty(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    assert claims_view(_state(d)) == {}
    _write(d)
    assert set(claims_view(_state(d))) == {"after-damage"}


def _check_exact(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    which = "exact" if case.outcome[0] == "exact" else case.outcome[1]
    # readers first (they never repair), then a writer (which repairs), then readers again
    assert _view_without(_state(d)) == _expected_view(base, which)
    _write(d)
    state = _state(d)
    assert _view_without(state) == _expected_view(base, which)
    assert state.fence == _expected_fence(base, which) + 1
    if expect_quarantined is not None:
        assert expect_quarantined in quarantined(d).values(), list(quarantined(d))
    assert temp_files(d) == []
    report = doctor.check(d)
    assert report.ok, report.to_dict()
    reg = fleetclaims.Registry(d)
    assert reg.verify().ok and reg.verify().anchor_ok is True
    reg.close()


def _check_lost(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    # Lines the anchor recorded are gone: refused (typed, saying what was lost) until
    # doctor --fix names the loss in the journal; fences then go on above every fence
    # handed out, and the bytes that are left are kept.
    for op in (lambda: _state(d), lambda: _write(d)):
        _assert_typed(op, HistoryLost)
    assert _journal(d).read_bytes() == damaged_journal, "the damaged journal was rewritten"
    before = doctor.check(d)
    assert "history_lost" in before.kinds(), before.to_dict()
    fixed = doctor.check(d, fix=True)
    assert fixed.ok, fixed.to_dict()
    assert doctor.check(d, fix=True).ok  # run twice: converged
    assert _journal(d).read_bytes().startswith(damaged_journal or b"") or (
        damaged_journal in quarantined(d).values())  # (a foreign journal: kept aside)
    state = _state(d)
    assert _view_without(state) == _expected_view(base, case.outcome[1])
    assert state.fence >= max(base.fences)
    _write(d)
    assert _state(d).fence == max(base.fences) + 1  # no fence handed out twice
    assert doctor.check(d).ok


def _check_reset(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    # Nothing of this registry is left to restore: refused, doctor cannot fix it, and only
    # a deliberate `init --new-history` goes on, above every fence handed out.
    for op in (lambda: _state(d), lambda: _write(d)):
        _assert_typed(op, HistoryLost)
    assert not doctor.check(d, fix=True).ok
    if damaged_journal is not None:
        assert _journal(d).read_bytes() == damaged_journal  # untouched by the refusal
    from fleetclaims.cli import main

    assert main(["init", "--new-history", "--dir", str(d)]) == 0
    if damaged_journal is not None:
        assert damaged_journal in quarantined(d).values()
    assert claims_view(_state(d)) == {}
    _write(d)
    assert _state(d).fence == max(base.fences) + 1  # no fence handed out twice
    assert doctor.check(d).ok


def _check_audit(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    _, seq, offset, after_fix = case.outcome
    offset = base.offsets[base.n if offset == "end" else offset]  # given as a line index
    # Reads show the verified state and name the damage (#16); writes refuse.
    reg = fleetclaims.Registry(d, lock_timeout=5)
    reg.store.read()
    exc = reg.store.damage  # type: ignore[attr-defined]
    reg.close()
    assert isinstance(exc, AuditCorrupt) and (exc.seq, exc.offset) == (seq, offset), exc
    exc = _assert_typed(lambda: _write(d), AuditCorrupt)
    assert (exc.seq, exc.offset) == (seq, offset), str(exc)  # type: ignore[attr-defined]
    assert _journal(d).read_bytes() == damaged_journal, "the damaged journal was rewritten"
    reg = fleetclaims.Registry(d)
    verified = reg.verify()
    reg.close()
    if "rechained" in case.name:
        # The hash chain itself is intact (re-sealed by a hostile editor): `audit verify`
        # checks the chain only; the replay (store, doctor) rejects the event.
        assert verified.ok
        found = doctor.check(d)
        corrupt = [f for f in found.findings if f.kind == "journal_corrupt"]
        assert corrupt and corrupt[0].details["seq"] == seq, found.to_dict()
        assert corrupt[0].details["offset"] == offset
    else:
        assert not verified.ok and verified.seq == seq and verified.offset == offset, verified
    _fix_and_check(d, base, after_fix, damaged_journal)


def _check_corrupt(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    for op in (lambda: _state(d), lambda: _write(d)):
        _assert_typed(op, RegistryCorrupt)
    _fix_and_check(d, base, case.outcome[1], damaged_journal or None)
    if expect_quarantined is not None:
        assert expect_quarantined in quarantined(d).values()


def _check_verify_only(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    _, seq, offset = case.outcome
    offset = base.offsets[offset]
    # The snapshot covers the damage: the registry still reads and writes exactly...
    assert _view_without(_state(d)) == _expected_view(base, "exact")
    reg = fleetclaims.Registry(d)
    verified = reg.verify()
    reg.close()
    # ... and the audit check still reports the break, by seq and offset.
    assert not verified.ok and (verified.seq, verified.offset) == (seq, offset), verified
    _fix_and_check(d, base, "exact", damaged_journal)


def _check_lazy(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    # A forged checksum over a malformed claim: typed at first use, the entry kept; doctor
    # notices and rebuilds the snapshot from the journal.
    task = case.outcome[1]
    reg = fleetclaims.Registry(d)
    for _ in range(2):
        _assert_typed(lambda: reg.get(task), RegistryCorrupt)
    reg.close()
    # audit verify fails whenever the store would refuse to work (#16)
    from fleetclaims.cli import main

    assert main(["audit", "verify", "--dir", str(d)]) == 5
    _fix_and_check(d, base, "exact", None)
    assert expect_quarantined in quarantined(d).values()


def _check_unsafe(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
               expect_quarantined: bytes | None) -> None:
    for op in (lambda: _state(d), lambda: _write(d)):
        _assert_typed(op, UnsafeRegistry)
    report = doctor.check(d, fix=True)
    assert not report.ok and "unsafe_file" in report.kinds(), report.to_dict()


CHECKS: dict[str, Callable[..., None]] = {
    "empty": _check_empty,
    "exact": _check_exact,
    "prefix": _check_exact,
    "lost": _check_lost,
    "reset": _check_reset,
    "audit": _check_audit,
    "corrupt": _check_corrupt,
    "verify_only": _check_verify_only,
    "lazy": _check_lazy,
    "unsafe": _check_unsafe,
}


def run_case(case: Case, base: Base, d: Path, damaged_journal: bytes | None,
             expect_quarantined: bytes | None) -> None:
    """Check the documented outcome of ``case`` on the damaged registry ``d``."""
    CHECKS[case.outcome[0]](case, base, d, damaged_journal, expect_quarantined)
