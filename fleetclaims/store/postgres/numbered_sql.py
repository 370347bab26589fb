"""The statements of writes numbered on the server (schema 6): the advisory lock keys and the
one statement that numbers, seals and writes an event (``numbered.py``, ``guessed.py``)."""

from __future__ import annotations

import hashlib


def lock_key(name: str) -> int:
    """A transaction advisory lock's key for ``name`` (64 bits of its SHA-256, signed)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def numbered_write(s: str, retired_put: str, guarded: bool = False) -> str:
    """One event of one task written with the numbers the server gives it (schema 6; see
    ``numbered.py``). The head row is locked here, in the commit's message, and its latest
    version read; the line is the client's event bytes with the numbers filled in: ``{"seq":``
    seq ``m1`` [fence ``m2``, a grant only] ``,"prev":"`` previous hash ``"}``, sealed with
    its SHA-256 exactly as ``core.chain.seal`` does. The claim row takes the same seq, the
    line's hash as its event id and, for a grant, the fence. Answers (seq, fence, prev, hash).

    Parameters (``numbered.params``): grant (0/1), m1, m2, then the audit row's ts, type,
    task, owner, actor and (not a grant) fence, then the claim row's ``claim_put`` values but
    seq and fence, its fence (not a grant) and its new retired grants.

    ``guarded``: the event was decided over this process's copy of the task's rows and an
    estimate of the server's clock, without a first round trip (``guessed.py``); it is
    written only if the claim row is still that copy (its seq and event id, or no row), the
    task is not in the work queue and the server's clock is within a tolerance of the
    estimate (parameters after m2: seq, event id, task, whether no row was expected, whether
    the task row is not to be checked, task, and the window of the server's clock).
    Otherwise nothing is written and no row is answered."""
    guard = ("AND coalesce((SELECT c.seq = %s AND c.data->>'eid' = %s "
             f"FROM {s}.claims c WHERE c.task = %s), %s) "
             f"AND (%s OR NOT EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.task = %s)) "
             "AND extract(epoch FROM clock_timestamp()) BETWEEN %s AND %s " if guarded else "")
    # The head row's UPDATE computes the seal from the row's latest version (under READ
    # COMMITTED an UPDATE that waited for another writer re-evaluates its SET on the version
    # that writer committed), keeping the previous hash in ``prev`` to answer it: one access
    # of the head row, no SELECT ... FOR UPDATE before it.
    def body(seq: str, fence: str, prev: str, p: str) -> str:
        return (f"'{{\"seq\":' || {seq}::text || {p}.m1 || CASE WHEN {p}.g = 1 "
                f"THEN {fence}::text || {p}.m2 ELSE '' END || ',\"prev\":\"' || {prev}")

    return (
        "WITH p AS (SELECT %s::integer AS g, %s::text AS m1, %s::text AS m2), "
        f"h AS (UPDATE {s}.head SET seq = seq + 1, fence = fence + p.g, "
        "prev = head, head = encode(sha256(convert_to("
        + body("(seq + 1)", "(fence + 1)", "head", "p")
        + " || '\"}', 'UTF8')), 'hex'), updated_at = now() FROM p WHERE id = 1 "
        + guard + "RETURNING seq, fence, prev, head AS hash, p.g, p.m1, p.m2), "
        "l AS (SELECT h.seq, h.fence, h.prev, h.hash, h.g, "
        + body("h.seq", "h.fence", "h.prev", "h")
        + " || '\",\"hash\":\"' || h.hash || '\"}' AS line FROM h), "
        f"a AS (INSERT INTO {s}.audit (seq, ts, type, task, owner, actor, fence, hash, line) "
        "SELECT l.seq, %s, %s, %s, %s, %s, CASE WHEN l.g = 1 THEN l.fence ELSE %s END, "
        "l.hash, l.line FROM l), "
        f"u AS (INSERT INTO {s}.claims AS c (task, owner, state, fence, expires_at, seq, data, "
        "rn, rlen) SELECT %s, %s, %s, f.fence, %s, l.seq, (left(%s::text, -1) || "
        "',\"fence\":' || f.fence::text || ',\"seq\":' || l.seq::text || ',\"eid\":\"' "
        "|| l.hash || '\"}')::jsonb, %s, %s FROM l, "
        "LATERAL (SELECT CASE WHEN l.g = 1 THEN l.fence ELSE %s END AS fence) f "
        "ON CONFLICT (task) DO UPDATE SET owner = EXCLUDED.owner, state = EXCLUDED.state, "
        "fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at, seq = EXCLUDED.seq, "
        "data = EXCLUDED.data, rn = c.rn + EXCLUDED.rn, rlen = EXCLUDED.rlen "
        f"RETURNING c.task, c.rn), r AS ({retired_put}) "
        "SELECT l.seq, l.fence, l.prev, l.hash FROM l"
    )
