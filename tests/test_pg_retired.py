"""Schema 5: a claim's retired grants live in the ``retired`` ring, not in its row. The claims
read back are the ones the journal replays to, whoever reads them (the writer's cached copy,
a fresh handle, the whole table); older schemas are upgraded in place; the grants stay the
last 16 however often the ring wraps, and a stale token is still told why."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest
from pg_server import back_to

from fleetclaims import NotHolder, Registry
from fleetclaims.core import events as ev
from fleetclaims.core.model import RETIRED_KEPT, Claim, Retired
from fleetclaims.core.state import State
from fleetclaims.store.postgres.journal import appended
from fleetclaims.store.postgres.schema import RING
from fleetclaims.store.postgres.store import SCHEMA_VERSION

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _replayed(reg: Registry) -> dict[str, Claim]:
    state = State()
    for event in reg.store.iter_events(0):
        ev.apply(state, event)
    return {c.task: c for c in state.claims.values()}


def _stored(reg: Registry) -> dict[str, Claim]:
    return {c.task: c for c in reg.store.read().claims.values()}


def _rows(url: str, schema: str, task: str) -> tuple[Any, ...]:
    """(inline grants in the row's data, rn, rlen, the ring's rows for the task)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT data ? 'retired', rn, rlen FROM \"{schema}\".claims WHERE task = %s",
            (task,)).fetchone()
        ring = conn.execute(f'SELECT count(*) FROM "{schema}".retired WHERE task = %s',
                            (task,)).fetchone()
    assert row is not None and ring is not None
    return (*row, ring[0])


def _churn(reg: Registry, task: str, cycles: int, owner: str = "a") -> None:
    for _ in range(cycles):
        reg.release(task, token=reg.claim(task, owner=owner).token or "")


def test_appended_counts_the_new_grants() -> None:
    """The grants a write sends: the new ones at the end; a list that is not the old one
    plus some (a merge's union) is written from where it stops being one."""
    g = [Retired(f"h{i}", i, "o", "released") for i in range(20)]
    assert appended((), ()) == 0
    assert appended((g[0],), (g[0],)) == 0
    assert appended((), (g[0], g[1])) == 2
    assert appended((g[0], g[1]), (g[0], g[1], g[2])) == 1
    assert appended(tuple(g[:16]), tuple(g[1:17])) == 1  # the oldest dropped past 16
    assert appended(tuple(g[:16]), tuple(g[3:19])) == 3
    assert appended((g[0], g[1]), (g[1],)) == 0  # shrunk: nothing new to write
    assert appended((g[0], g[1]), (g[1], g[0])) == 1  # g1 stays, g0 is written after it
    assert appended((g[0], g[1]), (g[2], g[0])) == 2
    assert RING >= RETIRED_KEPT


def test_grants_leave_the_row_and_read_back_whole(postgres_url: str) -> None:
    """Past several wraps of the ring, the claim row holds no grant, the ring holds one row
    per slot used, and the writer's copy, a fresh handle's row, the whole table and the
    replayed journal all agree (the last 16 grants, oldest first); a stale token is told why."""
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"{postgres_url}?schema={schema}"
    with Registry(url) as reg, Registry(url) as other:
        first = reg.claim("busy", owner="a")
        reg.release("busy", token=first.token or "")
        _churn(reg, "busy", 2 * RING + 3)
        _churn(other, "busy", 5, owner="b")  # the writer's cache is stale now
        reg.claim("quiet", owner="a", ttl=600)
        _churn(reg, "busy", 1)
        inline, rn, rlen, ring = _rows(postgres_url, schema, "busy")
        assert not inline and rn == 2 * RING + 10 and rlen == RETIRED_KEPT and ring == RING
        assert _rows(postgres_url, schema, "quiet") == (False, 0, 0, 0)
        replayed = _replayed(reg)
        assert len(replayed["busy"].retired) == RETIRED_KEPT
        assert reg.get("busy") == replayed["busy"] == other.get("busy")
        with Registry(url) as fresh:
            assert fresh.get("busy") == replayed["busy"]
            assert _stored(fresh) == replayed
        # a stale token is told why, by the writer and by a handle whose copy is old
        late = reg.claim("busy", owner="c")
        reg.release("busy", token=late.token or "")
        reg.claim("busy", owner="d")
        for handle in (reg, other):
            with pytest.raises(NotHolder, match=rf"fence {late.fence}.* was released"):
                handle.renew("busy", token=late.token or "")
        forced = other.claim("forced", owner="b")
        reg.release("forced", force=True, reason="stuck")
        with pytest.raises(NotHolder, match=r"by force .*stuck"):
            other.renew("forced", token=forced.token or "")
        assert reg.verify().ok and _stored(reg) == _replayed(reg)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_older_schema_is_upgraded_in_place(postgres_url: str, version: int) -> None:
    """A registry made by schema 3 (rows compressed out of line past 2 kB), 4 (rows inline,
    grants inside them) or 5 (no writer protocol) is upgraded on first use: its claims and
    history kept exactly, the grants moved to the ring, rows without them from then on."""
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"{postgres_url}?schema={schema}"
    old = Registry(url)
    held = old.claim("kept", owner="a", ttl=600)
    _churn(old, "busy", 20)  # 16 grants kept: the old row well past 2 kB
    before = _stored(old)
    old.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        back_to(conn, schema, version)
        length = conn.execute(
            f"SELECT octet_length(data::text) FROM \"{schema}\".claims WHERE task = 'busy'"
        ).fetchone()
    assert length is not None and (length[0] > 2048) == (version < 5)
    reg = Registry(url)
    assert reg.get("kept") == replace(held, token=None)
    assert _stored(reg) == before
    assert reg.store.schema_version() == SCHEMA_VERSION == 6  # type: ignore[attr-defined]
    # (moved into the ring: the 16 kept; made by schema 5: all 20 ever retired, 16 kept)
    ring = 16 if version < 5 else 20
    assert _rows(postgres_url, schema, "busy") == (False, ring, 16, ring)
    reg.renew("kept", token=held.token or "")
    _churn(reg, "busy", 1, owner="b")
    assert _rows(postgres_url, schema, "busy") == (False, ring + 1, 16, ring + 1)
    assert _stored(reg) == _replayed(reg)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                               (f'"{schema}".claims',)).fetchone()
    assert options is not None and "toast_tuple_target=8160" in options[0]
    assert reg.verify().ok
    reg.close()


def test_an_older_writer_cannot_put_grants_back_inline(postgres_url: str) -> None:
    """A process of the previous fleetclaims still running after the upgrade writes with its
    old statements: a claim without grants is accepted as it is (the ring stays right), a
    grant written inline is refused (it would hide from the ring); none of it reaches the
    registry's claims."""
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"{postgres_url}?schema={schema}"
    with Registry(url) as reg:
        _churn(reg, "busy", 3)
        before = reg.get("busy")
        assert before is not None and len(before.retired) == 3
        grant = orjson.dumps(before.retired[-1].to_dict()).decode()
        s = f'"{schema}"'
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.CheckViolation, match="grants_in_ring"):
                conn.execute(f"UPDATE {s}.claims SET data = data || jsonb_build_object("
                             "'retired', jsonb_build_array(%s::jsonb)) WHERE task = 'busy'",
                             (grant,))
            conn.execute(f"UPDATE {s}.claims SET data = data || '{{\"note\": \"old\"}}' "
                         "WHERE task = 'busy'")
        with Registry(url) as fresh:
            seen = fresh.get("busy")
            assert seen is not None and seen.retired == before.retired and seen.note == "old"


def test_grants_past_the_ring_stay_inline_until_the_next_write(postgres_url: str) -> None:
    """A row holding more grants than the ring has slots (never made by the core; hand-made
    or merged from elsewhere) is read with them all, and the next write, which keeps the
    last 16, puts those in the ring."""
    schema = "t_" + uuid.uuid4().hex[:12]
    url = f"{postgres_url}?schema={schema}"
    many = [Retired(f"{i:064x}", i, "old", "released", at=float(i)) for i in range(RING + 8)]
    with Registry(url) as reg:
        _churn(reg, "busy", 2)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".claims SET rn = 0, rlen = 0, data = data || '
                         "jsonb_build_object('retired', %s::jsonb) WHERE task = 'busy'",
                         (orjson.dumps([r.to_dict() for r in many]).decode(),))
        with Registry(url) as fresh:
            seen = fresh.get("busy")
            assert seen is not None and list(seen.retired) == many
            _churn(fresh, "busy", 1, owner="b")
            after = fresh.get("busy")
            assert after is not None and len(after.retired) == RETIRED_KEPT
            assert list(after.retired[:-1]) == many[-(RETIRED_KEPT - 1):]
        assert _rows(postgres_url, schema, "busy")[:3] == (False, RETIRED_KEPT, RETIRED_KEPT)
        with Registry(url) as again:
            assert again.get("busy") == after
