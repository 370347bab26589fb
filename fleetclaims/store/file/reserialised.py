"""Re-serialised journals (#16): a journal converted to CRLF, re-indented or pretty-printed by a
JSON tool (``jq .``, an editor) fails every seal, yet holds the whole history. doctor --fix
recognises one (the file is a sequence of JSON objects whose seqs run 1, 2, ... and whose
recorded ``prev`` members chain their recorded ``hash`` members, and every event applies) and
recovers its content: lines whose canonical bytes still match their seal keep it (CRLF,
whitespace between lines); otherwise the seals are rebuilt (each event keeps its original hash
as ``ohash``) and a ``journal_break`` line says so. The original goes to quarantine/ first; the
recovered journal is switched in by one rename.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...core import events as ev
from ...core.chain import GENESIS, ChainError, check_seal, envelope, seal
from ...core.errors import AuditCorrupt
from ...core.state import State
from . import fsutil
from .journal import apply_checked
from .salvage import _write_journal, highest_fence
from .store import JOURNAL, SNAPSHOT

if TYPE_CHECKING:
    from .doctor import DoctorReport

MAX_BYTES = 256 << 20  # (read whole: a pretty-printed journal has no line structure to stream)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a duplicate member: an edit, not a re-serialisation")
    return out


def recognise(data: bytes) -> list[dict[str, Any]] | None:
    """The events of a re-serialised journal, or None when ``data`` is not one. A line in the
    store's own form whose seal fails was edited, not re-serialised: then None."""
    try:
        text = data.decode("utf-8")
        return _decode(text)
    except (UnicodeDecodeError, RecursionError, ValueError, TypeError, orjson.JSONEncodeError):
        return None


def _decode(text: str) -> list[dict[str, Any]] | None:
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates)
    events: list[dict[str, Any]] = []
    pos, end = 0, len(text)
    prev = GENESIS
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            break
        start = pos
        obj, pos = decoder.raw_decode(text, pos)
        if (not isinstance(obj, dict) or obj.get("seq") != len(events) + 1
                or obj.get("prev") != prev or not isinstance(obj.get("hash"), str)):
            return None
        if text[start:pos].encode() == orjson.dumps(obj) and _canonical(obj) is None:
            return None  # in the store's form, yet its seal fails: edited
        prev = obj["hash"]
        events.append(obj)
    return events or None


def _canonical(event: dict[str, Any]) -> bytes | None:
    """The event's line as the store wrote it, when its seal still verifies (the tool kept the
    members' order and values: CRLF, whitespace)."""
    try:
        line = orjson.dumps(event)
        check_seal(line)
    except (ChainError, TypeError, orjson.JSONEncodeError):
        return None
    return line


def repair(path: Path, report: DoctorReport) -> bool:
    """Recover a re-serialised journal in place (see the module docstring); False when the
    journal is not one (the ordinary salvage then runs)."""
    journal = path / JOURNAL
    if os.path.getsize(journal) > MAX_BYTES:
        return False
    data = journal.read_bytes().rstrip(b"\0")
    events = recognise(data)
    if events is None:
        return False
    state = State()
    lines: list[bytes] = []
    head, resealed, offset = GENESIS, 0, 0
    for event in events:
        line = _canonical(event) if resealed == 0 else None
        if line is None:
            fields = {k: v for k, v in event.items() if k not in ("seq", "ts", "prev", "hash")}
            fields.setdefault("ohash", event["hash"])
            body = envelope(event["seq"], event["ts"], fields, head)
            try:
                line, digest = seal(orjson.dumps(body))
            except (TypeError, orjson.JSONEncodeError):
                return False  # (a value the store never writes: not a re-serialisation)
            line = line.rstrip(b"\n")
            body["hash"] = digest
            event = body
            resealed += 1
        try:
            apply_checked(state, event, offset, JOURNAL)
        except AuditCorrupt:
            return False
        head = event["hash"]
        offset += len(line) + 1
        lines.append(line + b"\n")
    fd = fsutil.open_file(journal, os.O_RDONLY)
    try:
        original = fsutil.quarantine_copy(path, JOURNAL, fd, "doctor: re-serialised journal",
                                          extra={"events": len(events)}).name
        note = {"type": ev.JOURNAL_BREAK, "actor": "doctor", "resealed": bool(resealed),
                "reason": "the journal was re-serialised (CRLF, whitespace, key order: a JSON "
                "tool); its content is recovered" + (
                    f" and the seals of {resealed} lines were rebuilt (ohash keeps each "
                    "original hash)" if resealed else " with its original seals"),
                "quarantined": original, "kept": len(events),
                "fence_floor": max(state.fence, highest_fence(data))}
        body = envelope(state.seq + 1, time.time(), note, head)
        line, _ = seal(orjson.dumps(body))
        lines.append(line if line.endswith(b"\n") else line + b"\n")
        _write_journal(path, fd, 0, lines)
    finally:
        os.close(fd)
    if os.path.lexists(path / SNAPSHOT):  # anchored to the old bytes: rebuilt by the store
        fsutil.quarantine_file(path, path / SNAPSHOT, "doctor: journal re-serialised")
    report.add("reserialised", f"the journal was re-serialised by a tool; its {len(events)} "
               "events are recovered" + (f" ({resealed} seals rebuilt)" if resealed else ""),
               "warning", events=len(events), resealed=resealed).fixed = True
    return True
