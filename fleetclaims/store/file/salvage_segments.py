"""doctor --fix keeps what verifies after damage in the middle of the journal (#16).

The lines after a break that carry a valid seal, each chained to the one before, are a
segment: they are kept (re-sealed after the repaired journal's head, each keeping its original
hash as ``ohash``, its identity) behind a ``journal_break`` line that records the seq range and
byte range of the damage, the reason and the quarantined original. Only what the damaged bytes
themselves held is lost. A kept line that cannot be applied without the damaged ones (a renewal
of a claim granted in them) is not guessed at: it stays in the quarantined original and its
claim is named lost. A kept grant above the high-water records its floor (the damaged bytes
held the grants in between), so fences continue exactly where they were.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from ...core import events as ev
from ...core.chain import ChainError, unseal
from ...core.state import State
from .reader import iter_lines


class Keeper(Protocol):
    state: State

    def add(self, fields: dict[str, Any]) -> None: ...

    def keep(self, event: dict[str, Any]) -> bool: ...


def _sealed(line: bytes) -> dict[str, Any] | None:
    try:
        unseal(line)
        event = orjson.loads(line)
    except (ChainError, orjson.JSONDecodeError, ValueError):
        return None
    if not isinstance(event, dict) or type(event.get("seq")) is not int:
        return None
    if not isinstance(event.get("hash"), str) or not isinstance(event.get("ts"), float):
        return None
    return event


def _lines(fd: int, start: int) -> Iterator[tuple[int, bytes]]:
    for offset, line, _ in iter_lines(fd, start):
        yield offset, line


def keep_segments(fd: int, start: int, break_seq: int, reason: str, quarantined: str | None,
                  lines: Keeper, highest_fence: Any) -> dict[str, Any]:
    """Keep every verified segment after ``start`` (the end of the verified prefix); returns
    counts (kept, unapplied, breaks) and what the damaged lines held, as far as it reads."""
    counts: dict[str, Any] = {"kept": 0, "unapplied": 0, "breaks": 0}
    damaged: list[dict[str, Any]] = []
    counts["damaged"] = damaged
    damage_from, damage_seq, damaged_top = start, break_seq, 0
    in_damage = True
    prev_hash: str | None = None
    prev_seq = -1
    for offset, line in _lines(fd, start):
        event = _sealed(line)
        linked = (event is not None and event.get("prev") == prev_hash
                  and event["seq"] == prev_seq + 1)
        if event is None or not (linked or in_damage):
            if not in_damage:
                in_damage, damage_from, damage_seq = True, offset, prev_seq + 1
            damaged_top = max(damaged_top, highest_fence(line))
            held = _what_it_held(line)
            if held is not None:
                damaged.append(held)
            prev_hash = None
            continue
        if in_damage:
            in_damage = False
            counts["breaks"] += 1
            lines.add({
                "type": ev.JOURNAL_BREAK, "actor": "doctor",
                "reason": f"damaged journal lines: {reason}; the lines after them verify "
                "among themselves and are kept (re-sealed; ohash is each line's original hash)",
                "from_seq": damage_seq, "to_seq": event["seq"] - 1,
                "offset": damage_from, "end": offset, "quarantined": quarantined,
                "fence_floor": max(lines.state.fence, damaged_top), "resealed": True})
        prev_hash, prev_seq = event["hash"], event["seq"]
        if lines.keep(event):
            counts["kept"] += 1
        else:
            counts["unapplied"] += 1
    return counts


def damaged_range(fd: int, offset: int, seq: int) -> dict[str, Any]:
    """Where the damage a read stopped at (seq ``seq``, at byte ``offset``) ends, for a reviewer
    (``--json``'s ``damage``, #16): the seq range and byte range [offset, end) up to the next
    sealed line of a later seq (where doctor --fix resumes the chain); ``to_seq`` None when the
    damage runs to the end. Also what the damaged lines held, as far as they read (at most 20).
    Reads the lines after ``offset`` once; nothing is applied."""
    held: list[dict[str, Any]] = []
    end = to_seq = None
    last = offset
    for at, line in _lines(fd, offset):
        event = _sealed(line)
        if event is not None and event["seq"] > seq:
            end, to_seq = at, event["seq"] - 1
            break
        last = at + len(line) + 1
        found = _what_it_held(line)
        if found is not None and len(held) < 20:
            held.append(found)
    return {"from_seq": seq, "to_seq": to_seq, "offset": offset,
            "end": last if end is None else end, "held": held}


def _what_it_held(line: bytes) -> dict[str, Any] | None:
    """The task, type, owner and fence a damaged line names, when it still parses (a flipped
    byte in a value): to name what was lost; never applied."""
    try:
        event = orjson.loads(line)
    except (orjson.JSONDecodeError, ValueError):
        event = None
    if isinstance(event, dict) and isinstance(event.get("task"), str):
        return {k: event.get(k) for k in ("task", "type", "owner", "fence", "seq")}
    # Unparsable (the damage hit the syntax): read the members a person would look for.
    found = {k.decode(): v.decode("utf-8", "replace") for k, v in _MEMBER.findall(line)}
    if "task" not in found:
        return None
    return {k: found.get(k) for k in ("task", "type", "owner", "fence", "seq")}


_MEMBER = re.compile(rb'"(task|type|owner|fence|seq)"\s*:\s*"?([^",}]{1,200})')
