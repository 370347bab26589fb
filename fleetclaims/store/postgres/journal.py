"""The PostgreSQL registry's journal as rows: the audit, claim and task rows written for
events, the chain check of ``verify``, and the bulk copy of a migrated journal."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import psycopg

from ...core.chain import ChainError
from ...core.errors import RegistryCorrupt, ValidationError
from ...core.events import with_token
from ...core.model import GENESIS, Retired
from ...core.state import State
from ..base import VerifyReport
from ..file.journal import apply_checked, check_link, parse_line
from .schema import RING
from .tables import PgClaimView, PgTaskView, Rows


def audit_row(event: dict[str, Any], digest: str, line: str) -> tuple[Any, ...]:
    """The audit table's row for a sealed event (the line verbatim, and columns to filter)."""
    def text(key: str) -> str | None:
        value = event.get(key)
        return value if isinstance(value, str) else None

    fence = event.get("fence")
    return (
        int(event["seq"]), float(event["ts"]), str(event["type"]), text("task"), text("owner"),
        text("actor"), fence if isinstance(fence, int) and not isinstance(fence, bool) else None,
        digest, line,
    )


def claim_object(where: str, task: str, data: str) -> dict[str, Any]:
    """A claim row's JSON, which must be an object."""
    loaded = orjson.loads(data)
    if not isinstance(loaded, dict):
        raise RegistryCorrupt(where, f"claim row {task!r} is not an object")
    return loaded


def claim_row(table: PgClaimView, task: str, *, numbered: bool = False) -> tuple[Any, ...]:
    """The parameters of ``Queries.claim_upsert``: indexed columns, the claim's JSON in the
    compact form the file store's snapshot uses (members at their defaults left out; read back
    the same) without its retired grants, how many grants it retired since the row the
    transaction read (k), how many it keeps (rlen) and those k as a JSON array. ``numbered``:
    the JSON without its fence, seq and eid, which the server adds (``Queries.numbered``)."""
    claim = table.get(task)
    assert claim is not None
    kept = claim.retired
    before = table.before(task)
    old = () if before is None else before.retired
    if len(kept) > RING:  # (never made by the core: kept inline, as before schema 5)
        data = claim.to_dict(compact=True)
        k = rlen = 0
        fresh = "[]"
    else:
        # to_dict of a private copy without the grants: building 16 dicts to drop them was
        # half of this function's time (inside the head lock); the copy is ours alone, so
        # setting a member of the frozen instance right after making it is safe
        bare = with_token(claim, None)
        object.__setattr__(bare, "retired", ())
        data = bare.to_dict(compact=True)
        # A grant retired in an earlier version was written then: ones that did not fit the
        # old row's ring (inline) are written again.
        k = appended(old, kept) if len(old) <= RING else len(kept)
        rlen = len(kept)
        fresh = orjson.dumps([r.to_dict() for r in kept[rlen - k:]]).decode() if k else "[]"
    if numbered:
        for key in ("fence", "seq", "eid"):
            data.pop(key, None)
    return (task, claim.owner, claim.state, claim.fence, claim.expires_at, claim.seq,
            orjson.dumps(data).decode(), k, rlen, fresh)


def appended(old: tuple[Retired, ...], new: tuple[Retired, ...]) -> int:
    """How many grants at the end of ``new`` are not in ``old``: the fewest k with ``new`` the
    last len(new) of old + new[-k:] (what the core's apply makes: one more grant, the oldest
    dropped past RETIRED_KEPT; anything else, e.g. a merge's union, is k = len(new))."""
    n = len(new)
    for k in range(n):
        if (old + new[n - k:])[-n:] == new:
            return k
    return n


def task_rows(tasks: PgTaskView) -> list[tuple[Any, ...]]:
    rows = []
    for name in sorted(tasks.dirty):
        record = tasks.get(name)
        assert record is not None
        rows.append((name, record.seq, orjson.dumps(record.to_dict()).decode()))
    return rows


def verify_chain(lines: Iterator[tuple[int, str]], head_row: tuple[int, str] | None,
                 progress: Callable[[int, int], None] | None) -> VerifyReport:
    """Check (seq, line) pairs as ``audit verify`` checks audit.jsonl; ``head_row`` is the
    (seq, hash) the head row names."""
    total = head_row[0] if head_row else 0
    seq = 0
    prev = GENESIS
    offset = 0
    for found, text in lines:
        line = text.encode()
        expected = seq + 1
        try:
            if found != expected:
                raise ChainError(f"expected seq {expected}, found {found}")
            digest = check_link(line, expected, prev)
        except (ChainError, orjson.JSONDecodeError) as exc:
            return VerifyReport(False, seq, offset, prev, str(exc), expected, offset, None)
        seq = expected
        prev = digest
        offset += len(line) + 1
        if progress is not None and seq % 65536 == 0:
            progress(seq, max(total, seq))
    if progress is not None:
        progress(seq, seq)
    anchor_ok = head_row is not None and head_row == (seq, prev)
    error = None
    if not anchor_ok:
        error = (f"head row: the head row says seq {head_row[0] if head_row else None} but "
                 f"the journal ends at seq {seq}")
    return VerifyReport(True, seq, offset, prev, error, None, None, anchor_ok)


def copy_lines(conn: psycopg.Connection[Any], copy_sql: str, state: State,
               lines: Iterable[bytes], where: str) -> None:
    """COPY already-sealed lines into the audit table, checking the chain and applying each
    event to ``state`` (whose views collect the claim and task rows to write)."""
    offset = 0
    with conn.cursor().copy(copy_sql) as copy:
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\n") else raw
            event = parse_line(line, seq=state.seq + 1, prev=state.head, offset=offset,
                               path=where)
            apply_checked(state, event, offset, where)
            copy.write_row(audit_row(event, state.head, line.decode()))
            offset += len(line) + 1


def import_journal(conn: psycopg.Connection[Any], rows: Rows, lines: Iterable[bytes],
                   location: str) -> int:
    """Store already-sealed lines (verbatim) into an empty registry, in one transaction, with
    the claim and task rows they leave and the head; returns the last seq."""
    sql = rows.sql
    with conn.transaction():
        row = conn.execute(sql.head_lock).fetchone()
        count = conn.execute(sql.audit_count).fetchone()
        if row is None or int(row[0]) != 0 or (count and int(count[0]) != 0):
            raise ValidationError(
                "target", f"{location} already holds a registry; migrate into an empty schema")
        table = PgClaimView(rows, complete=True)
        tasks = PgTaskView(rows, complete=True)
        state = State(table, tasks=tasks)
        copy_lines(conn, sql.audit_copy, state, lines, f"{location} (import)")
        upserts = [claim_row(table, task) for task in sorted(table.dirty)]
        if upserts:
            conn.cursor().executemany(sql.claim_upsert, upserts)
        if tasks.dirty:
            conn.cursor().executemany(sql.task_upsert, task_rows(tasks))
        conn.execute(sql.head_update, (state.seq, state.head, state.fence, state.origin))
    return state.seq
