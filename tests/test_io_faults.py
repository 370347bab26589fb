"""I/O faults: every OS call on the write path failing (EIO, ENOSPC, EACCES, EROFS, EINTR, a
short write) on its 1st..Nth use gives a typed error, leaves the state as it was, acknowledges
nothing that is not durable, never retries after a failed fsync, and a fresh Registry works."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fc_support import (
    BOOKKEEPING,
    append_raw,
    claims_view,
    events_of,
    file_store,
    journal_lines,
    replay,
    temp_files,
)

import fleetclaims
import fleetclaims.store.file.store as sf
from fleetclaims import DurabilityError, FleetclaimsError
from fleetclaims.core import events as ev
from fleetclaims.store.file import faults, rest

pytestmark = pytest.mark.integration

CALLS = ("write", "fsync", "fdatasync", "replace", "ftruncate", "open")
ERRNOS = {
    "EIO": errno.EIO,
    "ENOSPC": errno.ENOSPC,
    "EACCES": errno.EACCES,
    "EROFS": errno.EROFS,
    "EINTR": errno.EINTR,
}
NTH = range(1, 7)
SCENARIOS = ("plain", "torn", "badsnap", "new")


def _write(fd: int, data: bytes, offset: int | None) -> int:
    return os.write(fd, data) if offset is None else os.pwrite(fd, data, offset)


def _short_write(fd: int, data: bytes, offset: int | None = None) -> int:
    return _write(fd, data[: max(1, len(data) // 2)], offset)


def _half_then_fail(fd: int, data: bytes, offset: int | None = None) -> int:
    """Part of the line reaches the file, then the device fails."""
    _write(fd, data[: len(data) // 2], offset)
    raise OSError(errno.EIO, "injected EIO after a partial write")


def _error(kind: str, call: str) -> BaseException | Callable[..., Any]:
    if kind == "short":
        return _short_write
    if kind == "partial":
        return _half_then_fail
    return OSError(ERRNOS[kind], f"injected {kind} on {call}")


@pytest.fixture(autouse=True)
def _small_checkpoints(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sf, "CHECKPOINT_MIN_TAIL", 1200)
    monkeypatch.setattr(sf, "CHECKPOINT_DIVISOR", 1000)
    # The faults armed here count every process-wide call: an idle keeper settling (trimming
    # the padding) during a slow step would take the fault meant for the operation under test.
    monkeypatch.setattr(rest, "IDLE", 3600.0)
    rest._settle_all()  # handles an earlier test left open: at rest now, so their keepers sleep
    yield
    faults.disarm()


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Prepared registries, copied for each case."""
    root = tmp_path_factory.mktemp("baselines")
    out = {}
    for name in SCENARIOS:
        d = root / name / "reg"
        d.parent.mkdir(parents=True)
        if name != "new":
            reg = fleetclaims.Registry(d)
            for i in range(4):
                c = reg.claim(f"base-{i}", owner="base", ttl=3600)
                if i % 2:
                    reg.release(f"base-{i}", token=c.token)
            file_store(reg).checkpoint()
            reg.close()
        if name == "torn":
            append_raw(d / "audit.jsonl", b'{"seq":99,"ts":1.0,"type":"claim_cr')
        if name == "badsnap":
            data = bytearray((d / "claims.json").read_bytes())
            data[len(data) // 2] ^= 0x01
            (d / "claims.json").write_bytes(bytes(data))
        out[name] = d.parent
    return out


def _copy(baselines: dict[str, Path], scenario: str, tmp_path: Path) -> Path:
    target = tmp_path / uuid.uuid4().hex
    shutil.copytree(baselines[scenario], target)
    return target / "reg"


def _ops(reg: fleetclaims.Registry) -> Iterator[tuple[str, Callable[[], Any]]]:
    tokens: dict[str, str] = {}

    def claim(task: str) -> Callable[[], Any]:
        def run() -> Any:
            c = reg.claim(task, owner="io", ttl=3600)
            tokens[task] = c.token  # type: ignore[assignment]
            return c
        return run

    def with_token(method: Callable[..., Any], task: str) -> Callable[[], Any]:
        return lambda: method(task, token=tokens[task])  # the token of the claim run made

    for i in range(4):
        task = f"io-{i}"
        yield "claim", claim(task)
        yield "renew", with_token(reg.renew, task)
        if i % 2:
            yield "release", with_token(reg.release, task)
        else:
            yield "complete", with_token(reg.complete, task)


def run_case(directory: Path, call: str, nth: int, error: Any,
             also: tuple[str, int, Any] | None = None) -> dict[str, Any]:
    """Run the op sequence with the fault armed; check the guarantees; return what happened."""
    reg = fleetclaims.Registry(directory)
    faults.arm_os_fault(call, nth, error)
    if also is not None:
        # arm_os_fault resets only its own call's counter, so two faults can be armed at once.
        faults.arm_os_fault(*also)
    acked_state: dict[str, Any] | None = None
    acked_seqs: list[int] = []
    failure: BaseException | None = None
    try:
        for _, op in _ops(reg):
            op()
            state = reg.store.read()
            acked_state = claims_view(state)
            acked_seqs.append(state.seq)
    except FleetclaimsError as exc:
        failure = exc
    except BaseException as exc:  # anything untyped is a defect
        faults.disarm()
        raise AssertionError(f"untyped {type(exc).__name__} from {call}#{nth}: {exc!r}") from exc
    faults.disarm()
    if isinstance(failure, DurabilityError):
        # No retry-and-continue: the handle refuses further writes, whatever the cause.
        with pytest.raises(DurabilityError):
            reg.claim("after-failure", owner="io", ttl=60)
        assert "NOT acknowledged" in str(failure)
    reg.close()

    # A fresh handle sees every acknowledged op, and nothing else from the client...
    fresh = fleetclaims.Registry(directory)
    state = fresh.store.read()
    lines, _ = journal_lines(directory)
    assert claims_view(replay(lines)) == claims_view(state)
    holders: dict[str, tuple[Any, Any]] = {}  # (a compact renewal names its holder so)
    client = [e for e in (ev.fill_renewal(e, holders) for e in events_of(directory))
              if e["type"] not in BOOKKEEPING and e.get("owner") == "io"]
    client_seqs = [e["seq"] for e in client]
    undo_failed = failure is not None and "undoing it" in str(failure)
    if undo_failed:
        # The failed append could not be cut back: its line may survive, unacknowledged.
        assert client_seqs[: len(acked_seqs)] == acked_seqs and len(client_seqs) <= len(
            acked_seqs) + 1
    else:
        assert client_seqs == acked_seqs, (call, nth, failure)
    if acked_state is not None:
        view = claims_view(state)
        for task, data in acked_state.items():
            if task.startswith("io-") and not undo_failed:
                assert view.get(task) == data, (call, nth, task)
    # ... and works: it can write, and the next writer leaves no temp files behind.
    fresh.claim("after-fault", owner="fresh", ttl=60)
    file_store(fresh).checkpoint()
    assert temp_files(directory) == []
    report = fresh.verify()
    assert report.ok and report.anchor_ok is True, report
    fresh.close()
    return {"failure": failure, "acked": len(acked_seqs)}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("call", CALLS)
def test_each_call_fails_on_each_use(scenario: str, call: str, tmp_path: Path,
                                     baselines: dict[str, Path]) -> None:
    """Every call x every error x its 1st..6th use: typed error, state kept, fresh handle works."""
    seen = 0
    for kind in (*ERRNOS, "short", "partial"):
        if kind in ("short", "partial") and call != "write":
            continue
        for nth in NTH:
            outcome = run_case(_copy(baselines, scenario, tmp_path), call, nth, _error(kind, call))
            seen += outcome["failure"] is not None
    if call in ("write", "fdatasync"):
        assert seen > 0, f"{call} never failed visibly in {scenario}"


@pytest.mark.parametrize("first", ["write", "fdatasync"])
def test_failed_undo_is_reported_and_poisons(first: str, tmp_path: Path,
                                             baselines: dict[str, Path]) -> None:
    """The append fails and cutting it back fails too: a typed error that says so, and the
    handle refuses writes; a fresh handle sees at most that one unacknowledged line."""
    error = OSError(errno.EIO, "injected") if first == "fdatasync" else _half_then_fail
    out = run_case(_copy(baselines, "plain", tmp_path), first, 2, error,
                   also=("ftruncate", 1, OSError(errno.EIO, "injected")))
    assert isinstance(out["failure"], DurabilityError)
    assert "undoing it" in str(out["failure"])


def test_fdatasync_failure_is_not_retried(tmp_path: Path, baselines: dict[str, Path]) -> None:
    """After a failed fdatasync the same handle never calls write or fdatasync again."""
    directory = _copy(baselines, "plain", tmp_path)
    reg = fleetclaims.Registry(directory)
    reg.claim("warm", owner="io", ttl=60)
    calls: list[str] = []
    real_write, real_sync = faults.osc.write, faults.osc.fdatasync

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            calls.append(name)
            return real(*args)
        return wrapper

    faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected"))
    with pytest.raises(DurabilityError):
        reg.claim("lost", owner="io", ttl=60)
    faults.disarm()
    faults.osc.write = counting("write", real_write)  # type: ignore[method-assign]
    faults.osc.fdatasync = counting("fdatasync", real_sync)  # type: ignore[method-assign]
    try:
        for _ in range(3):
            with pytest.raises(DurabilityError):
                reg.claim("again", owner="io", ttl=60)
    finally:
        del faults.osc.write, faults.osc.fdatasync
    assert calls == []
    assert fleetclaims.Registry(directory).get("lost") is None


def test_checkpoint_failures_keep_the_operation(tmp_path: Path, baselines: dict[str, Path]) -> None:
    """A failing snapshot write is best effort: the op (already durable) is acknowledged, the
    temp file is removed, the old snapshot stays valid."""
    directory = _copy(baselines, "plain", tmp_path)
    before = (directory / "claims.json").read_bytes()
    reg = fleetclaims.Registry(directory)
    faults.arm_os_fault("replace", 1, OSError(errno.EROFS, "injected"))
    file_store(reg).checkpoint()
    faults.disarm()
    assert isinstance(file_store(reg).last_checkpoint_error, OSError)
    assert (directory / "claims.json").read_bytes() == before
    assert temp_files(directory) == []
    reg.claim("still-fine", owner="io", ttl=60)
    assert fleetclaims.Registry(directory).get("still-fine") is not None


# --- a real full disk -------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                               str(path)], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10, check=False)


@pytest.mark.timeout(120)
def test_real_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tmpfs of 96 KiB fills up: the failing op raises DurabilityError, every acknowledged op
    survives, and after space is freed a fresh Registry carries on."""
    monkeypatch.setattr(sf, "CHECKPOINT_MIN_TAIL", 8 * 1024)
    with _tmpfs(tmp_path / "mnt", "96k") as mnt:
        directory = mnt / "reg"
        reg = fleetclaims.Registry(directory)
        acked: dict[str, int] = {}
        failure: BaseException | None = None
        for i in range(2000):
            try:
                c = reg.claim(f"fill-{i:04d}", owner="filler", ttl=3600,
                              note="x" * 1500)
            except FleetclaimsError as exc:
                failure = exc
                break
            acked[c.task] = c.fence
        assert isinstance(failure, DurabilityError), failure
        assert failure.errno == errno.ENOSPC
        assert acked, "nothing fitted at all"
        reg.close()
        # Every acknowledged claim is there, nothing else from the client.
        reader = fleetclaims.Registry(directory)
        state = reader.store.read()
        found = {c.task: c.fence for c in state.claims.values() if c.owner == "filler"}
        assert found == acked
        assert reader.verify().ok
        reader.close()
        # Make room (grow the filesystem) and carry on with a fresh handle.
        grown = subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)],
                               capture_output=True, timeout=10, check=False)
        assert grown.returncode == 0, grown.stderr
        again = fleetclaims.Registry(directory)
        again.claim("after-space", owner="filler", ttl=60)
        file_store(again).checkpoint()
        assert again.verify().ok
        assert temp_files(directory) == []
        again.close()


def test_event_types_of_failure_free_run(tmp_path: Path, baselines: dict[str, Path]) -> None:
    """Control: without faults the op sequence writes exactly one event per op."""
    directory = _copy(baselines, "plain", tmp_path)
    out = run_case(directory, "write", 10_000, OSError(errno.EIO, "never"))
    assert out["failure"] is None and out["acked"] == 12
    kinds = [e["type"] for e in events_of(directory) if e.get("owner") == "io"]
    assert kinds.count(ev.CLAIM_CREATED) == 4


def test_an_armed_fault_is_taken_only_by_the_thread_that_armed_it(tmp_path: Path) -> None:
    """A handle an earlier test left open settles in a background thread; its fdatasync once
    took the fault armed for the operation under test, which then did not fail (CI flake in
    test_cut_back_never_strands_a_snapshot_ahead_of_the_journal). Another thread's calls
    neither fail nor count; the arming thread's first call fails."""
    import threading

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected"))
        outcome: list[BaseException | None] = []

        def other() -> None:
            try:
                faults.osc.fdatasync(fd)
                outcome.append(None)
            except BaseException as exc:  # (reported to the test thread)
                outcome.append(exc)

        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert outcome == [None]
        with pytest.raises(OSError, match="injected"):
            faults.osc.fdatasync(fd)
        faults.osc.fdatasync(fd)  # (the 2nd use: not armed)
    finally:
        faults.disarm()
        os.close(fd)


def _leave_as_garbage(directory: Path) -> None:
    """A handle that wrote (unsettled: its close owes an fdatasync and a checkpoint), left
    unreachable in a reference cycle, as a traceback holds one: only the garbage collector
    finalizes it."""
    left = fleetclaims.Registry(directory)
    left.claim("t", owner="a", ttl=600)
    cycle: list[object] = [left]
    cycle.append(cycle)


def test_an_armed_fault_is_not_taken_by_a_handle_left_as_garbage(tmp_path: Path) -> None:
    """A handle an earlier test left unreachable (held in a reference cycle, e.g. by a
    traceback) is finalized by the garbage collector on whatever thread allocates next: its
    close settles the files with an fdatasync, which took the fault armed for the operation
    under test (the same CI flake, on the arming thread). Arming collects such garbage first."""
    import gc

    reg = fleetclaims.Registry(tmp_path / "used")
    gc.disable()  # (so only the arming can collect it)
    try:
        _leave_as_garbage(tmp_path / "left")
        reg.claim("warm", owner="a", ttl=600)
        faults.arm_os_fault("fdatasync", 1, OSError(errno.EIO, "injected"))
        gc.collect()  # a collection during the test: the old handle must not take the fault
        with pytest.raises(DurabilityError):
            reg.claim("x", owner="a", ttl=600)
    finally:
        gc.enable()
        faults.disarm()
        reg.close()


def test_a_crash_hook_is_not_reached_by_a_handle_left_as_garbage(tmp_path: Path) -> None:
    """The same for crash points: a handle left in a reference cycle, finalized during a test,
    settles on its way out and passes the snapshot's crash points, reaching the test's hook
    (which may kill or fail the operation under test). Installing a hook collects first."""
    import gc

    reached: list[str] = []
    gc.disable()  # (so only the installing can collect it)
    try:
        _leave_as_garbage(tmp_path / "left")
        faults.set_crash_hook(reached.append)
        gc.collect()  # a collection during the test
        assert reached == []
    finally:
        gc.enable()
        faults.disarm()
