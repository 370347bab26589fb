"""Shared helpers of the reliability suites: pure journal replay, state views, child processes.

Kept free of pytest fixtures so the stress scripts in ``stress/`` can import it too.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from fleetclaims import Claim, Registry
from fleetclaims.core import events as ev
from fleetclaims.core.state import State
from fleetclaims.store.file import segments
from fleetclaims.store.file.journal import apply_checked, parse_line
from fleetclaims.store.file.reader import iter_lines
from fleetclaims.store.file.store import FileStore

PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[1]
LONG = os.environ.get("FLEETCLAIMS_LONG", "") not in ("", "0")

# Events that record bookkeeping of the store rather than an operation of a client.
BOOKKEEPING = frozenset({ev.REGISTRY_CREATED, ev.JOURNAL_TAIL_REPAIRED, ev.REGISTRY_REBUILT})


def file_store(registry: Registry) -> FileStore:
    """The file store behind ``registry``, typed, for what only it has (checkpoint, offsets)."""
    store = registry.store
    assert isinstance(store, FileStore), store
    return store


def token_of(claim: Claim) -> str:
    """The token of a claim just granted, typed (a claim read back carries none)."""
    assert claim.token is not None, claim
    return claim.token


def journal_lines(directory: Path) -> tuple[list[bytes], bytes]:
    """The complete lines of ``audit.jsonl`` and the incomplete tail (b"" when none)."""
    path = directory / "audit.jsonl"
    if not path.exists():
        return [], b""
    fd = os.open(path, os.O_RDONLY)
    try:
        lines: list[bytes] = []
        tail = b""
        for _, line, complete in iter_lines(fd, 0):
            if complete:
                lines.append(line)
            else:
                tail = line
        return lines, tail
    finally:
        os.close(fd)


def replay(lines: list[bytes], path: str = "audit.jsonl") -> State:
    """Rebuild the state from journal lines with full chain checks (raises AuditCorrupt)."""
    state = State()
    offset = 0
    for line in lines:
        event = parse_line(line, seq=state.seq + 1, prev=state.head, offset=offset, path=path)
        apply_checked(state, event, offset, path)
        offset += len(line) + 1
    return state


def events_of(directory: Path) -> list[dict[str, Any]]:
    lines, _ = journal_lines(directory)
    return [orjson.loads(line) for line in lines]


def claims_view(state: State) -> dict[str, dict[str, Any]]:
    """Claims as comparable dicts, without the journal position fields (seq, eid), which a
    repair legitimately moves."""
    out = {}
    for claim in state.claims.values():
        data = claim.to_dict()
        data.pop("seq")
        data.pop("eid")
        out[claim.task] = data
    return out


def temp_files(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if ".tmp-" in p.name or p.name.endswith(".tmp")
    )


def quarantined(directory: Path) -> dict[str, bytes]:
    """Quarantined payloads (not the notes), by name."""
    qdir = directory / "quarantine"
    if not qdir.is_dir():
        return {}
    return {
        p.name: p.read_bytes() for p in sorted(qdir.iterdir()) if not p.name.endswith(".note.json")
    }


def run_python(code: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("FLEETCLAIMS_CRASH_AT", None)
    full_env.update(env or {})
    return subprocess.run(
        [PYTHON, "-c", code, *args], env=full_env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )


def cli_env(directory: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command line on the registry ``directory``: this process's, less
    every FLEETCLAIMS_ variable (the owner, a token, another registry), plus ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
    full.update(env or {}, FLEETCLAIMS_DIR=str(directory))
    return full


def cli(directory: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``fleetclaims ARGS`` on ``directory`` in a new process (see cli_env) to its end."""
    return subprocess.run([PYTHON, "-m", "fleetclaims", *args], capture_output=True, text=True,
                          env=cli_env(directory, env), timeout=timeout, check=False)


def append_raw(path: Path, data: bytes) -> None:
    """Write ``data`` where the journal's data ends (its first NUL byte, or EOF), as a writer
    that died mid-append would have left it: the journal is preallocated with zeros."""
    raw = path.read_bytes()
    end = raw.find(b"\0")
    end = len(raw) if end < 0 else end
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(data)


def strip_preallocation(path: Path) -> None:
    """Rewrite a journal without its preallocated zero space (a valid journal too)."""
    path.write_bytes(path.read_bytes().split(b"\0", 1)[0])


def run_workers(ctx: Any, target: Callable[..., None], tmp_path: Path, n: int,
                args: Callable[[int, str], tuple[Any, ...]],
                timeout: float) -> list[list[tuple[Any, ...]]]:
    """Run ``n`` worker processes of ``target`` at once (worker ``i`` gets ``args(i, log)``,
    ``log`` the file where it writes the operations it saw acknowledged, as a JSON list), wait
    for each to exit cleanly, and return each worker's acknowledged operations."""
    logs = [str(tmp_path / f"w{i}.json") for i in range(n)]
    procs = [ctx.Process(target=target, args=args(i, logs[i])) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"a worker exited with {p.exitcode}"
    return [[tuple(a) for a in json.loads(Path(log).read_text())] for log in logs]


def whole_journal(d: Path) -> list[bytes]:
    """Every line of the journal, sealed segments first (as ``zcat`` and ``cat`` show them),
    lines that a rotation cut short left in audit.jsonl too counted once."""
    lines: list[bytes] = []
    for seg in segments.sealed(d):
        lines += gzip.decompress(seg.path.read_bytes()).splitlines()
    last = json.loads(lines[-1])["seq"] if lines else 0
    for line in (d / "audit.jsonl").read_bytes().rstrip(b"\0").splitlines():
        if json.loads(line)["seq"] > last:
            lines.append(line)
    return lines


def open_one_chain(d: Path) -> Registry:
    """The registry at ``d`` opened after checking that its whole journal (segments, then the
    active journal) is one chain from seq 1 that verifies and replays to the registry's state;
    the caller closes it."""
    lines = whole_journal(d)
    seqs = [json.loads(line)["seq"] for line in lines]
    assert seqs == list(range(1, len(seqs) + 1))
    reg = Registry(d)
    report = reg.verify()
    assert report.ok and report.events == len(lines), report
    assert claims_view(reg.store.read()) == claims_view(replay(lines))
    return reg


def forge_journal(directory: Path, extra: int = 0) -> None:
    """Rewrite a registry's journal as a forger would: the first grant's owner changed to
    mallory and the whole chain re-sealed (``extra`` copies of the last line more at its end,
    numbered on), claims.json removed so no snapshot contradicts it."""
    from fleetclaims.core.chain import seal

    lines, _ = journal_lines(directory)
    for _ in range(extra):
        last = orjson.loads(lines[-1])
        last["seq"] += 1
        lines.append(orjson.dumps(last))
    out, prev = [], "0" * 64
    for i, line in enumerate(lines):
        event = orjson.loads(line)
        if i == 1:
            event["owner"] = "mallory"
        event["prev"] = prev
        del event["hash"]
        sealed, prev = seal(orjson.dumps(event))
        out.append(sealed if sealed.endswith(b"\n") else sealed + b"\n")
    (directory / "audit.jsonl").write_bytes(b"".join(out))
    (directory / "claims.json").unlink()
