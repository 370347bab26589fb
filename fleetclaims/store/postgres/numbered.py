"""Writes numbered in the commit's message (schema 6): the head row locked only by the message
that commits, not across a hop through the client.

A claim, renewal, phase change, release or completion of one task decides over that task's
rows alone (and the clock). Its first round trip locks the task (a transaction advisory lock,
``Queries.peek``) instead of the head row, so the decision is exact for that task however the
head moves meanwhile. The core decides and seals as always, at the head as last seen; this
module then cuts the sealed event into the parts that do not depend on the head (``Template``):
``{"seq":`` seq ``m1`` [new fence ``m2``] ``,"prev":"`` hash ``"}``. The second round trip
(``Queries.numbered``) locks the head row, fills in the numbers it holds and seals the line
with SHA-256 on the server, in the message that commits, so the head row is held for that
statement and the COMMIT only.

The rules stay in the core: the server's only contribution is the next seq, the next fence
(the high-water + 1, as ``core.events.apply`` demands of a grant) and the previous hash. The
client rebuilds the line from the same parts and the numbers the server answers, checks that
its own seal equals the server's (``settle``), and brings its claim and state to those
numbers, so the caller gets exactly what the file store would have given at that head.
Anything else (several events, a task the guess did not foresee, the work queue, a
reservation of paths, a prune, a fence floor, a registry's first event) is written the other
way: the head row locked in the first round trip (``PostgresStore._attempt``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson

from ...core import events as ev
from ...core.chain import seal
from ...core.errors import RegistryCorrupt
from ...core.model import Claim
from ...core.rules import Decision
from ...core.state import State
from .numbered_sql import lock_key
from .schema import Queries
from .tables import PgClaimView, Rows

#: what may be numbered on the server: events about one task's claim alone
KINDS = frozenset({ev.CLAIM_CREATED, ev.LEASE_RENEWED, ev.PHASE_CHANGED, ev.CLAIM_RELEASED,
                   ev.CLAIM_COMPLETED, ev.CLAIM_RECOVERED, ev.CLAIM_HANDED_OFF})
MAX_LOCKS = 8  # tasks one numbered write may lock (more: the head-row way)


@dataclasses.dataclass(frozen=True, slots=True)
class Template:
    """A sealed event's bytes without its seq, previous hash and (a grant) new fence."""

    task: str
    grant: bool
    m1: str
    m2: str

    def body(self, seq: int, fence: int, prev: str) -> bytes:
        """The event's bytes at these numbers, before sealing."""
        middle = self.m1 + (f"{fence}{self.m2}" if self.grant else "")
        return f'{{"seq":{seq}{middle},"prev":"{prev}"}}'.encode()

    def matches(self, line: str) -> bool:
        """Whether ``line`` (a sealed line from the audit table) is this event, at whatever
        numbers: how a lost COMMIT answer is resolved."""
        if not line.startswith('{"seq":'):
            return False
        rest = line[7:].lstrip("0123456789")
        if not rest.startswith(self.m1):
            return False
        rest = rest[len(self.m1):]
        if self.grant:
            rest = rest.lstrip("0123456789")
            if not rest.startswith(self.m2):
                return False
            rest = rest[len(self.m2):]
        return rest.startswith(',"prev":"')


class Watch:
    """The ``Rows`` of a numbered write's views: a row read beyond those fetched with the task
    locks (``strayed``) means the decision looked at more than its locked tasks, so it is
    made again the head-row way."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows
        self.sql: Queries = rows.sql
        self.schema = rows.schema
        self.strayed = False

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        self.strayed = True
        return self._rows.query(sql, params)

    def fetch_claim(self, task: str) -> Claim | None:
        self.strayed = True
        return self._rows.fetch_claim(task)


def found(tpl: Template, rows: list[tuple[Any, ...]], fence: int
          ) -> tuple[int, int, str, str] | None:
    """Among a task's audit rows (seq, line) committed after the guess, the one this event
    became, as (seq, fence, prev, hash); ``fence``: the head's, for an event that is not a
    grant."""
    for seq, line in rows:
        if tpl.matches(str(line)):
            event = orjson.loads(str(line))
            return (int(seq), int(event["fence"]) if tpl.grant else fence, str(event["prev"]),
                    str(event["hash"]))
    return None


def task_keys(prefix: str, names: Iterable[str], memo: dict[str, int]) -> list[int]:
    """The advisory lock keys of ``names``, sorted (every writer takes them in one order);
    ``memo`` keeps the keys of tasks seen before."""
    keys = set()
    for name in names:
        key = memo.get(name)
        if key is None:
            if len(memo) >= 10_000:
                memo.clear()
            key = memo[name] = lock_key(prefix + name)
        keys.add(key)
    return sorted(keys)


def template(event: dict[str, Any], line: str) -> Template | None:
    """``event`` (sealed at the guessed head; ``line``: its sealed line) cut into a Template;
    None when it cannot be numbered on the server."""
    kind = event.get("type")
    task = event.get("task")
    if (kind not in KINDS or not isinstance(task, str) or "fence_floor" in event
            or "ohash" in event or "imported" in event):
        return None
    start = f'{{"seq":{event["seq"]}'
    end = f',"prev":"{event["prev"]}","hash":"{event["hash"]}"}}'
    if not line.startswith(start) or not line.endswith(end):
        return None
    middle = line[len(start):len(line) - len(end)]
    if kind not in ev.GRANTS:
        return Template(task, False, middle, "")
    # The new fence is the value of the one member named "fence": inside a JSON string every
    # quote is escaped, so '"fence":' there is that member (or one of the same name nested
    # in metadata: then there are two, and the write goes the other way).
    fence = event.get("fence")
    at = middle.find('"fence":')
    if type(fence) is not int or at < 0 or middle.find('"fence":', at + 1) >= 0:
        return None
    cut = at + len('"fence":')
    digits = str(fence)
    if not middle.startswith(digits, cut) or middle[cut + len(digits):cut + len(digits) + 1] \
            not in (",", "}"):
        return None
    return Template(task, True, middle[:cut], middle[cut + len(digits):])


def params(tpl: Template, row: tuple[Any, ...], claim: tuple[Any, ...]) -> tuple[Any, ...]:
    """``Queries.numbered``'s parameters from the template, the event's audit row (as
    ``journal.audit_row`` makes it) and its claim row (``journal.claim_row``)."""
    _seq, ts, kind, task, owner, actor, fence, _hash, _line = row
    c_task, c_owner, c_state, c_fence, expires, _c_seq, data, k, rlen, fresh = claim
    g = 1 if tpl.grant else 0
    return (g, tpl.m1, tpl.m2, ts, kind, task, owner, actor, fence,
            c_task, c_owner, c_state, expires, data, k, rlen, c_fence, fresh)


def settle(where: str, tpl: Template, event: dict[str, Any], state: State, table: PgClaimView,
           numbers: tuple[int, int, str, str]) -> dict[str, Any]:
    """After the commit: bring ``event`` (sealed at the guessed head), the claim it made and
    ``state`` to the numbers the server gave it, ``numbers`` = (seq, fence, prev, hash).
    The line is rebuilt from the template and sealed here; a seal other than the server's
    means the two did not hash the same bytes (never expected: RegistryCorrupt)."""
    seq, fence, prev, digest = numbers
    if (seq, prev) == (event["seq"], event["prev"]) and (
            not tpl.grant or fence == event["fence"]):
        line, mine = b"", event["hash"]  # at the guessed numbers: sealed already
    else:
        line, mine = seal(tpl.body(seq, fence, prev))
    if mine != digest:
        raise RegistryCorrupt(where, f"the server sealed seq {seq} as {digest}, this client "
                              f"makes {mine} of the same parts (the line as stored: "
                              f"{line[:-1].decode()!r}); write with the head row locked "
                              "(FLEETCLAIMS_PG_NUMBERED=0) and report this")
    if digest != event["hash"]:
        event = dict(event)
        event.update(seq=seq, prev=prev, hash=digest)
        claim = table.get(tpl.task)
        assert claim is not None
        changes: dict[str, Any] = {"seq": seq, "eid": digest}
        if tpl.grant:
            event["fence"] = fence
            changes["fence"] = fence
        table[tpl.task] = _evolve(claim, changes)
    state.seq, state.head, state.fence = seq, digest, fence
    return event


def _evolve(claim: Claim, changes: dict[str, Any]) -> Claim:
    return claim.evolve(**changes)  # (the token, a field of its own, is kept)


def renumbered(decision: Decision, event: dict[str, Any]) -> Decision:
    """The decision with its one event's fields at the server's numbers (the caller may
    read the fence of a grant from it)."""
    (fields,) = decision.events
    if fields.get("fence") == event.get("fence"):
        return decision
    return dataclasses.replace(decision, events=({**fields, "fence": event["fence"]},))
