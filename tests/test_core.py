"""The pure core: layering, rule tables, clocks, the hash chain, hold() and merge()."""

from __future__ import annotations

import ast
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetclaims import ClaimSuperseded, LeaseExpired, Registry
from fleetclaims.core import rules
from fleetclaims.core.chain import ChainError, seal, unseal
from fleetclaims.core.durations import parse_duration, parse_instant
from fleetclaims.core.errors import ValidationError
from fleetclaims.core.model import Claim, Now
from fleetclaims.testing import FakeClock, FakeProber, memory_registry

pytestmark = pytest.mark.integration

PACKAGE = Path(__file__).resolve().parent.parent / "fleetclaims"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_core_imports_only_the_standard_library() -> None:
    """core/ has no I/O dependencies: every absolute import is a stdlib module."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in (PACKAGE / "core").glob("*.py"):
        foreign = _imports(path) - stdlib
        assert not foreign, f"{path.name} imports {foreign}"


def _core_graph() -> dict[str, set[str]]:
    """core module -> the core modules it imports (anywhere in it, functions included)."""
    names = {p.stem for p in (PACKAGE / "core").glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in (PACKAGE / "core").glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module
                            else [a.name for a in node.names])
        graph[path.stem] = deps & names - {path.stem}
    return graph


def test_core_has_no_import_circle() -> None:
    """The core's modules import each other in one direction only (model <- state <- events
    <- queue <- rules ...): no circle, not even through an import inside a function."""
    graph = _core_graph()
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, "import circle: " + " -> ".join((*path, node))
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, (*path, node))
        done.add(node)

    for name in sorted(graph):
        visit(name, ())


def _changed_name(node: ast.AST) -> str | None:
    """The name a statement part changes in place (``name[k] = v``, ``name.clear()`` ...)."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
        target = node.value
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("clear", "update", "setdefault", "pop", "append", "add")):
        target = node.func.value
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def test_core_has_no_exec_and_no_module_level_cache() -> None:
    """core/ builds nothing with exec/eval/compile, and no function run after import changes
    a container bound at module level (a cache): memos belong to the State."""
    for path in (PACKAGE / "core").glob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {n.func.id for n in ast.walk(tree)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not calls & {"exec", "eval", "compile"}, path.name
        module_dicts = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Name)
                        and isinstance(n.value, (ast.Dict, ast.List, ast.Set, ast.DictComp))}
        functions = [f for f in ast.walk(tree)
                     if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        # A function only module-level code calls runs once, at import (a declaration such
        # as events._declare); one that other functions call may run on every operation.
        called = {n.func.id for f in functions for n in ast.walk(f)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for func in functions:
            if func.name not in called and func.name.startswith("_"):
                continue
            for node in ast.walk(func):
                changed = _changed_name(node)
                assert changed not in module_dicts, (
                    f"{path.name}: module-level {changed} is changed in {func.name}")


@pytest.mark.slow
def test_only_system_touches_psutil_and_sockets() -> None:
    """psutil, socket and /proc are reached only through fleetclaims/system.py."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "system.py":
            continue
        imports = _imports(path)
        assert not imports & {"psutil", "socket"}, path
        assert "/proc/" not in path.read_text() or path.parent.name == "tests", path


LEASE = Claim(task="t", owner="a", fence=1, expires_at=1000.0, boot_deadline=50.0,
              deadline_boot="boot-1")


@pytest.mark.parametrize(
    ("now", "expired"),
    [
        (Now(wall=999.0, boot=49.0, boot_id="boot-1"), False),
        (Now(wall=1001.0, boot=51.0, boot_id="boot-1"), True),
        (Now(wall=999.0 + 7200, boot=49.0, boot_id="boot-1"), False),  # wall stepped forward
        (Now(wall=1001.0 - 7200, boot=51.0, boot_id="boot-1"), True),  # wall stepped back
        (Now(wall=1001.0, boot=5.0, boot_id="boot-2"), True),  # another boot: wall decides
        (Now(wall=999.0, boot=None, boot_id=""), False),  # no boot clock: wall decides
        (Now(wall=1000.0, boot=None, boot_id=""), True),
    ],
)
def test_lease_expiry_table(now: Now, expired: bool) -> None:
    """Expiry uses the boot clock of the boot that set the deadline, else the wall clock."""
    assert rules.lease_expired(LEASE, now) is expired


def test_parked_lease_never_expires() -> None:
    """A parked claim (no expiry) is never expired, whatever the clocks say."""
    parked = Claim(task="t", owner="a", fence=1, expires_at=None)
    assert not rules.lease_expired(parked, Now(wall=1e12, boot=1e9, boot_id="x"))


def test_chain_seal_and_unseal() -> None:
    """A sealed line verifies; any change to it does not."""
    line, digest = seal(b'{"seq":1,"prev":"' + b"0" * 64 + b'"}')
    body, again = unseal(line[:-1])
    assert again == digest and body.endswith(b"}")
    for i in range(len(line) - 1):
        damaged = bytearray(line[:-1])
        damaged[i] ^= 0x01
        with pytest.raises(ChainError):
            unseal(bytes(damaged))


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("2h", 7200),
                                               ("1h30m", 5400), ("250ms", 0.25), ("45", 45)])
def test_durations(text: str, seconds: float) -> None:
    """Durations as people write them."""
    assert parse_duration(text) == pytest.approx(seconds)


def test_bad_durations_and_instants() -> None:
    """Unparseable durations and times are validation errors."""
    for bad in ("", "soon", "10x", "m10"):
        with pytest.raises(ValidationError):
            parse_duration(bad)
    assert parse_instant("10m", 1000.0) == 400.0
    assert parse_instant("2026-11-30T00:00:00Z", 0) == pytest.approx(1795996800.0)
    with pytest.raises(ValidationError):
        parse_instant("yesterday-ish", 0)


@pytest.mark.slow
def test_hold_renews_in_background_and_releases() -> None:
    """hold() renews at a third of the TTL while the block runs and releases on exit."""
    clock = FakeClock()
    r = memory_registry(clock)
    # Real time drives the heartbeat thread; the fake clock only dates the events.
    def renewals() -> int:
        return [e.type for e in r.events(limit=100).events].count("lease_renewed")

    with r.hold("t", owner="a", ttl=1.5) as lease:
        deadline = time.monotonic() + 20  # generous: a loaded CI machine delays threads
        while renewals() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.fence == 1 and not lease.lost.is_set()
    kinds = [e.type for e in r.events(limit=100).events]
    assert kinds.count("lease_renewed") >= 2 and kinds[-1] == "claim_released"


def test_hold_sets_lost_when_preempted() -> None:
    """When the lease is taken away, lease.lost is set and the reason is kept."""
    r = memory_registry(FakeClock())
    with r.hold("t", owner="a", ttl=1.0) as lease:
        r.claim("t", owner="boss", priority=1, preempt=True)
        assert lease.lost.wait(5)
        assert isinstance(lease.lost_reason, ClaimSuperseded)
        with pytest.raises(ClaimSuperseded):
            lease.check()
    assert r.get("t").owner == "boss"  # type: ignore[union-attr]


def test_hold_check_after_a_pause_past_the_ttl() -> None:
    """A process paused past its lease (SIGSTOP, a laptop asleep) while another owner took the
    task over: lease.check() right after it resumes raises LeaseExpired and sets lost, before
    the next heartbeat; it used to pass with the stale fence."""
    clock = FakeClock()
    r = memory_registry(clock)
    with r.hold("t", owner="a", ttl=60) as lease:
        clock.advance(120)  # (paused: no heartbeat ran)
        r.recover("t", owner="thief", reason="stale")
        with pytest.raises(LeaseExpired):
            lease.check()
        assert lease.lost.is_set()
    assert r.get("t").owner == "thief"  # type: ignore[union-attr]


def test_hold_is_lost_when_its_lease_runs_out_while_the_store_is_away(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Renewals failing with StoreUnavailable (a server down) were retried for ever: `run`
    kept its command going 20 s past the lease, until the server answered again. Once the
    lease's deadline passes by this process's clock, the lease is lost (LeaseExpired)."""
    from fleetclaims.core.errors import StoreUnavailable

    clock = FakeClock()
    r = memory_registry(clock)
    with r.hold("t", owner="a", ttl=1.0) as lease:
        def away(*args: object, **kw: object) -> None:
            raise StoreUnavailable("postgresql://db", "server closed the connection")

        monkeypatch.setattr(r, "renew", away)
        time.sleep(0.5)  # (beats that fail while the lease lasts: transient)
        assert not lease.lost.is_set()
        clock.advance(2)
        assert lease.lost.wait(5)
        assert isinstance(lease.lost_reason, LeaseExpired)
        assert "could not be renewed" in str(lease.lost_reason)
        monkeypatch.undo()


def test_hold_complete() -> None:
    """lease.complete() completes the task instead of releasing it."""
    r = memory_registry(FakeClock())
    with r.hold("t", owner="a", ttl=60) as lease:
        lease.complete({"ok": True})
    assert r.get("t").state == "completed"  # type: ignore[union-attr]


def test_hold_complete_after_expiry_refused() -> None:
    """Completing after the lease expired raises LeaseExpired (no silent success)."""
    clock = FakeClock()
    r = memory_registry(clock)
    lease = r.hold("t", owner="a", ttl=600)
    clock.advance(601)
    with pytest.raises(LeaseExpired):
        lease.complete()
    lease.stop()


# --- merge ---------------------------------------------------------------------------------------


def _table(reg: Registry) -> list[tuple[object, ...]]:
    return sorted((c.task, c.owner, c.fence, c.state, c.token_hash, c.phase)
                  for c in reg.claims(include_expired=True, include_completed=True,
                                      include_released=True))


def test_merge_is_symmetric_and_idempotent(tmp_path: Path) -> None:
    """Merging A into B and B into A gives the same claims; merging twice changes nothing;
    the loser of a duplicate hears ClaimSuperseded naming the winner and the rule."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    a.claim("shared", owner="alice", priority=50)
    x = a.claim("only-a", owner="alice")
    a.complete("only-a", token=x.token or "")
    clock.advance(1)
    bob = b.claim("shared", owner="bob", priority=100)
    b.claim("only-b", owner="bob")
    plan = a.merge(tmp_path / "b")
    assert [(c.task, c.winner, c.rule) for c in plan.conflicts] == [
        ("shared", "alice", "lower priority number")]
    n = len(a.events(limit=10_000).events)
    assert a.merge(tmp_path / "b").events == ()
    assert len(a.events(limit=10_000).events) == n
    b.merge(tmp_path / "a")
    assert _table(a) == _table(b)
    assert a.merge(tmp_path / "b").events == () and b.merge(tmp_path / "a").events == ()
    with pytest.raises(ClaimSuperseded) as info:
        b.renew("shared", token=bob.token or "")
    assert info.value.winner == "alice"
    assert a.verify().ok and b.verify().ok
    # the journals hold each other's events exactly once (by identity)
    ids_a = [e.get("ohash") for e in a.events(limit=10_000).events if e.get("imported")]
    assert len(ids_a) == len(set(ids_a))
    story = a.explain("shared")
    assert story.holder == "alice"
    assert any("superseded" in s.text for s in story.steps)


def test_merge_of_a_copy_that_diverged(tmp_path: Path) -> None:
    """A registry copied to a laptop and worked on apart merges back: shared history is not
    duplicated, and for each task the side that saw the other's latest event wins, with no
    conflict, whichever way the merge goes."""
    import shutil

    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    c = a.claim("t", owner="alice")
    a.close()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    assert b.merge(tmp_path / "a").events == ()  # identical copies: nothing new
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    a.complete("t", token=c.token or "")
    b.claim("u", owner="bob")
    plan = a.merge(tmp_path / "b")
    assert plan.imported == 1 and plan.conflicts == () and plan.changed == ("u",)
    b.merge(tmp_path / "a")
    assert _table(a) == _table(b)
    assert a.get("t").state == "completed" and b.get("t").state == "completed"  # type: ignore[union-attr]
    with pytest.raises(ValidationError):
        a.merge(tmp_path / "a")


def test_merge_while_another_writer_runs(tmp_path: Path) -> None:
    """A merge is one transaction: run beside a writer thread on the same registry, the
    journal stays one valid chain, every write and every merged claim is there."""
    clock = FakeClock()
    a = Registry(tmp_path / "a", clock=clock, prober=FakeProber())
    b = Registry(tmp_path / "b", clock=clock, prober=FakeProber())
    for i in range(20):
        b.claim(f"from-b-{i}", owner="bob")
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(100):
                c = a.claim(f"w{i}", owner="w")
                a.release(c.task, token=c.token)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    plan = a.merge(tmp_path / "b")
    t.join()
    assert not errors and plan.imported >= 20
    assert a.verify().ok
    assert {f"from-b-{i}" for i in range(20)} <= {c.task for c in a.claims()}
    assert sum(1 for e in a.events(limit=10_000).events if e.type == "claim_released") == 100
