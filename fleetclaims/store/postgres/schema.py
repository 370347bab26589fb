"""The PostgreSQL registry's schema: its DDL by version, the upgrades that apply it, and the
statements the store and its tables run (all in one schema per registry; several registries
can share a database under different schema names).

Tables:

- ``head``: one row (seq, head hash, last fence, origin). Every write transaction locks it
  ``FOR UPDATE`` first. That single lock serialises writers, so seq numbers are handed out
  gap-free and transactions commit in seq order: a reader that sees seq N sees every seq < N,
  which makes seq a safe event cursor (a SQL sequence would not be: it can be skipped while a
  writer is still in flight).
- ``audit``: one row per journal event holding the exact sealed line text (so the hash chain
  verifies byte for byte like the file store's ``audit.jsonl`` and a migration keeps every hash)
  plus seq/ts/type/task/owner/actor/fence/hash columns for filtering.
- ``claims``: the current record of each task (``Claim.to_dict`` as jsonb plus indexed
  columns), updated in the same transaction as the audit rows. Since schema 5 without its
  retired grants: those are rows of ``retired`` (below), and ``rn``/``rlen`` say which.
- ``retired``: a task's former grants (what a stale holder is told), a ring of RING slots per
  task: grant number ``ord`` of the task sits in slot ``ord mod RING``; a claim row's grants
  are ords ``rn - rlen + 1 .. rn``. A release appends one small row instead of rewriting a
  claim row that carried up to 16 of them (2-4 kB of JSON on every claim and release).
- ``tasks``: the work queue (``Task.to_dict`` as jsonb, a done flag kept by triggers).
- ``schema_version``: the migrations applied (``migrate()``).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...core.errors import AccessDenied, SchemaMismatch, StoreUnavailable, ValidationError
from ...core.model import GENESIS
from .numbered_sql import lock_key, numbered_write

SCHEMA_VERSION = 6
#: what this fleetclaims declares, per transaction, to schema 6's head guard (see _v6)
WRITER_PROTOCOL = "6"
DEFAULT_SCHEMA = "fleetclaims"
SCHEMA_ENV = "FLEETCLAIMS_PG_SCHEMA"

#: slots of the ``retired`` ring per task: the most grants a claim row keeps there (the core
#: keeps RETIRED_KEPT = 16); a claim with more (only malformed or hand-made data) keeps them
#: inline in its ``data`` as before schema 5, with ``rlen`` 0.
RING = 32

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

# A task's place in hand-out order (queue.Key: priority, added_at, then the id by code point;
# COLLATE "C" is byte order, the same as code point order in UTF-8). The same expressions in
# the index and in the query, so the server walks the index.
_TASK_KEY = ("((data->>'priority')::bigint), ((data->>'added_at')::float8), "
             '(task COLLATE "C")')


def _v1(s: str) -> list[str]:
    """Schema 1: the head row, the journal and the claims."""
    return [
        f"""CREATE TABLE {s}.head (
            id smallint PRIMARY KEY CHECK (id = 1),
            seq bigint NOT NULL CHECK (seq >= 0),
            head text NOT NULL,
            fence bigint NOT NULL CHECK (fence >= 0),
            origin text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now())""",
        f"INSERT INTO {s}.head (id, seq, head, fence, origin) "
        f"VALUES (1, 0, '{GENESIS}', 0, '')",
        f"""CREATE TABLE {s}.audit (
            seq bigint PRIMARY KEY CHECK (seq > 0),
            ts double precision NOT NULL,
            type text NOT NULL,
            task text,
            owner text,
            actor text,
            fence bigint,
            hash text NOT NULL,
            line text NOT NULL)""",
        f"CREATE INDEX audit_task ON {s}.audit (task, seq)",
        f"CREATE INDEX audit_owner ON {s}.audit (owner, seq)",
        f"""CREATE TABLE {s}.claims (
            task text PRIMARY KEY,
            owner text NOT NULL,
            state text NOT NULL,
            fence bigint NOT NULL,
            expires_at double precision,
            seq bigint NOT NULL,
            data jsonb NOT NULL)""",
        f"CREATE INDEX claims_owner ON {s}.claims (owner)",
        f"CREATE INDEX claims_state ON {s}.claims (state, expires_at)",
        f"""CREATE FUNCTION {s}.head_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.seq < OLD.seq OR NEW.fence < OLD.fence THEN
                RAISE EXCEPTION 'fleetclaims: seq and fence never go back (% -> %, % -> %)',
                    OLD.seq, NEW.seq, OLD.fence, NEW.fence;
            END IF;
            RETURN NEW;
        END $$""",
        f"CREATE TRIGGER head_guard BEFORE UPDATE ON {s}.head "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.head_guard()",
        f"""CREATE FUNCTION {s}.audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'fleetclaims: the audit journal is append-only';
        END $$""",
        f"CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {s}.audit "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.audit_append_only()",
        f"COMMENT ON TABLE {s}.audit IS 'fleetclaims journal: one sealed, hash-chained "
        "line per event; seq is gap-free and commits in order'",

    ]


def _v2(s: str) -> list[str]:
    """Schema 2: the work queue."""
    return [
        f"""CREATE TABLE {s}.tasks (
            task text PRIMARY KEY,
            seq bigint NOT NULL,
            data jsonb NOT NULL)""",
        # completing a task looks up its dependants without loading the whole queue
        f"CREATE INDEX tasks_depends_on ON {s}.tasks USING gin ((data->'depends_on'))",

    ]


def _v3(s: str) -> list[str]:
    """Schema 3: claim_next walks the open tasks in hand-out order instead of sorting them all."""
    return [
        f"ALTER TABLE {s}.tasks ADD COLUMN done boolean NOT NULL DEFAULT false",
        f"UPDATE {s}.tasks t SET done = EXISTS (SELECT 1 FROM {s}.claims c "
        "WHERE c.task = t.task AND c.state = 'completed')",
        f"CREATE INDEX tasks_open ON {s}.tasks ({_TASK_KEY}) WHERE NOT done",
        # A task is done when its claim is completed: kept by the claims table itself, so
        # no writer (of any version of this schema) can forget it.
        f"""CREATE FUNCTION {s}.task_done() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE {s}.tasks SET done = (NEW.state = 'completed')
             WHERE task = NEW.task AND done IS DISTINCT FROM (NEW.state = 'completed');
            RETURN NULL;
        END $$""",
        # (fired only when a claim becomes or stops being completed: claim and release,
        # the operations most often run, pay nothing)
        f"CREATE TRIGGER task_done AFTER INSERT ON {s}.claims FOR EACH ROW "
        f"WHEN (NEW.state = 'completed') EXECUTE FUNCTION {s}.task_done()",
        f"CREATE TRIGGER task_undone AFTER UPDATE OF state ON {s}.claims FOR EACH ROW "
        "WHEN (OLD.state IS DISTINCT FROM NEW.state AND "
        "(OLD.state = 'completed' OR NEW.state = 'completed')) "
        f"EXECUTE FUNCTION {s}.task_done()",
        f"""CREATE FUNCTION {s}.task_added() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.done := EXISTS (SELECT 1 FROM {s}.claims c
                                 WHERE c.task = NEW.task AND c.state = 'completed');
            RETURN NEW;
        END $$""",
        f"CREATE TRIGGER task_added BEFORE INSERT ON {s}.tasks "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.task_added()",

    ]


def _v4(s: str) -> list[str]:
    """Schema 4: a claim row stays whole in its page. A claim's ``data`` (with its retired
    grants: 2-4 kB of JSON) crossed the 2 kB point where PostgreSQL compresses a row and moves
    it to the TOAST table, on every claim and release (a third of the server's time per
    operation, and most of its WAL). Rows up to a page are now kept inline and uncompressed;
    bigger ones (large metadata or results) are still compressed and moved out. No row is
    rewritten: the setting applies to the next version of each row."""
    return [f"ALTER TABLE {s}.claims SET (toast_tuple_target = 8160)"]


def _v5(s: str) -> list[str]:
    """Schema 5: a claim's retired grants leave its row for the ``retired`` ring (see the
    module's docstring). Measured: WAL per operation 5.8 -> 2.2 kB, the server's CPU -10 to
    -16%; the client no longer writes (or the server parses) 16 grants on every write.
    Existing rows move in place; the new table gets the privileges the claims table has, so
    a role that could write claims still can. Running it again over its own result changes
    nothing (IF NOT EXISTS; no row has inline grants left to move)."""
    # A row keeps grants inline only when they do not fit the ring. Enforced, because a
    # process of an older fleetclaims that was running when the schema was upgraded still
    # writes with its old statements (it checks the version on connecting): its claims are
    # fine as they are, but a grant it wrote inline would hide from the ring's reader and
    # writer; with this its release fails loudly instead (check violation).
    inline_only_past_ring = (
        f"CASE WHEN jsonb_typeof(data->'retired') = 'array' "
        f"THEN jsonb_array_length(data->'retired') > {RING} ELSE true END")
    grants = _retired_of(s, "c")
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.retired (
            task text NOT NULL,
            slot smallint NOT NULL,
            ord bigint NOT NULL,
            data jsonb NOT NULL,
            PRIMARY KEY (task, slot))""",
        # No statement of fleetclaims looks claims up by owner or state; every write fed both
        # indexes, and with only the primary key left a claim's new version can stay in its
        # page without any index entry (a HOT update)
        f"DROP INDEX IF EXISTS {s}.claims_owner",
        f"DROP INDEX IF EXISTS {s}.claims_state",
        f"ALTER TABLE {s}.claims ADD COLUMN IF NOT EXISTS rn bigint NOT NULL DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS rlen integer NOT NULL DEFAULT 0",
        f"INSERT INTO {s}.retired (task, slot, ord, data) "
        f"SELECT c.task, mod(e.i, {RING}), e.i, e.v FROM {s}.claims c, "
        f"jsonb_array_elements({grants}) WITH ORDINALITY e(v, i) "
        f"WHERE jsonb_array_length({grants}) <= {RING}",
        f"UPDATE {s}.claims c SET rn = jsonb_array_length({grants}), "
        f"rlen = jsonb_array_length({grants}), data = c.data - 'retired' "
        f"WHERE jsonb_typeof(c.data->'retired') = 'array' "
        f"AND jsonb_array_length({grants}) <= {RING}",
        f"ALTER TABLE {s}.claims DROP CONSTRAINT IF EXISTS grants_in_ring, "
        f"ADD CONSTRAINT grants_in_ring CHECK ({inline_only_past_ring})",
        f"""DO $$
        DECLARE g record;
        BEGIN
            FOR g IN SELECT DISTINCT a.privilege_type AS what, a.grantee AS who
                       FROM pg_class c, aclexplode(c.relacl) a
                      WHERE c.oid = '{s}.claims'::regclass AND a.grantee <> c.relowner LOOP
                EXECUTE format('GRANT %s ON {s}.retired TO %s', g.what,
                    CASE WHEN g.who = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.who))
                    END);
            END LOOP;
        END $$""",
    ]


def _v6(s: str) -> list[str]:
    """Schema 6: writers numbered in the commit's message. A claim, renewal, release or
    completion of one task no longer locks the head row in its first round trip: it locks
    its task (a transaction advisory lock) and takes the writers' lock shared; the head row
    is locked, and the line's seq, fence and seal computed on the server, only in the message
    that commits (``store/postgres/numbered.py``). Every other write takes the writers' lock
    exclusively, as before. A process of an older fleetclaims still running after the
    upgrade takes neither lock, so it could decide over a task row a numbered writer is about
    to change: the head guard now refuses a head update from any transaction that has not
    declared this protocol (``fleetclaims.writer``, SET LOCAL with the transaction's other
    settings), and that process's writes fail loudly until it is restarted upgraded."""
    return [
        # the hash the last numbered write chained to (what its statement answers)
        f"ALTER TABLE {s}.head ADD COLUMN IF NOT EXISTS prev text",
        f"""CREATE OR REPLACE FUNCTION {s}.head_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.seq < OLD.seq OR NEW.fence < OLD.fence THEN
                RAISE EXCEPTION 'fleetclaims: seq and fence never go back (% -> %, % -> %)',
                    OLD.seq, NEW.seq, OLD.fence, NEW.fence;
            END IF;
            IF current_setting('fleetclaims.writer', true) IS DISTINCT FROM '{WRITER_PROTOCOL}'
            THEN
                RAISE EXCEPTION 'fleetclaims: this registry (schema 6) takes writes only from '
                    'fleetclaims that takes its task locks; this process is older: restart '
                    'it with the upgraded fleetclaims'
                    USING ERRCODE = '55000';
            END IF;
            RETURN NEW;
        END $$""",
    ]


def _retired_of(s: str, alias: str) -> str:
    """A claim row's inline grants as a JSON array (empty when absent or not an array)."""
    return (f"(CASE WHEN jsonb_typeof({alias}.data->'retired') = 'array' "
            f"THEN {alias}.data->'retired' ELSE '[]'::jsonb END)")


def _full_claim(s: str) -> str:
    """A claim row's JSON as Claim.to_dict has it: the row's data with its grants from the
    ``retired`` ring put back (ords rn - rlen + 1 .. rn, oldest first)."""
    return (
        "CASE WHEN c.rlen = 0 THEN c.data::text ELSE (c.data || jsonb_build_object("
        f"'retired', (SELECT jsonb_agg(r.data ORDER BY r.ord) FROM {s}.retired r "
        "WHERE r.task = c.task AND r.ord > c.rn - c.rlen AND r.ord <= c.rn)))::text END"
    )


def migrations(s: str) -> dict[int, list[str]]:
    """Schema changes by version; ``s`` is the quoted schema name. Append, never edit."""
    return {1: _v1(s), 2: _v2(s), 3: _v3(s), 4: _v4(s), 5: _v5(s), 6: _v6(s)}


def parse_location(url: str, schema: str | None = None) -> tuple[str, str, str]:
    """(libpq conninfo, schema, display location) for a ``postgresql://`` URL.

    The schema comes from the argument, else the URL's ``?schema=``, else ``FLEETCLAIMS_PG_SCHEMA``,
    else ``fleetclaims``. The display location has no password and names the schema, so it can
    be passed back to ``Registry`` (the password then comes from PGPASSWORD or ~/.pgpass).
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a malformed port or IPv6 host raises here: refused, typed)
    except ValueError as exc:
        raise ValidationError("url", f"is not a valid PostgreSQL URL ({exc}); the form is "
                              "postgresql://user@host:port/database") from None  # (no echo:
        # the URL may hold a password)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    chosen = schema or (from_url[-1] if from_url else None) or os.environ.get(SCHEMA_ENV) or (
        DEFAULT_SCHEMA
    )
    if not _SCHEMA_RE.match(chosen):
        field = ("schema" if schema else "schema (the URL's ?schema=)" if from_url
                 else f"{SCHEMA_ENV} (from the environment)")
        raise ValidationError(
            field, "must be 1-63 characters of a-z, 0-9 and _, not starting with a digit",
            value=chosen,
        )
    # (not urlunsplit: it drops the "//" of a URL without a host, the Unix-socket form
    # postgresql:///db?host=/run/postgresql, which libpq then refused)
    # (percent-encoded as libpq decodes it: urlencode's default writes a space as "+", which
    # libpq passes on as a plus, so options=-c%20name%3Dvalue broke)
    query_text = urlencode(rest, quote_via=quote)
    conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}" + (
        f"?{query_text}" if query_text else "")
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:  # refused before anything is sent
        reason = str(exc).strip().replace(url, "<url>").replace(conninfo, "<url>")
        raise ValidationError("url", f"is not a valid PostgreSQL URL ({reason}); the form is "
                              "postgresql://user@host:port/database") from None
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = userinfo.split(":", 1)[0] + "@" + hostport
    shown = (f"{parts.scheme}://{netloc}{parts.path}?"
             f"{urlencode([*rest, ('schema', chosen)], quote_via=quote)}")
    return conninfo, chosen, shown




class Queries:
    """The statements the store and its tables run, for one schema (``s``: its quoted name)."""

    def __init__(self, s: str) -> None:
        self.head = f"SELECT seq, head, fence, origin FROM {s}.head WHERE id = 1"
        # The row's JSON only when it differs from the copy the caller has (same seq and eid).
        self.claim = (
            f"SELECT CASE WHEN c.seq = %s AND c.data->>'eid' = %s THEN NULL "
            f"ELSE {_full_claim(s)} END FROM {s}.claims c WHERE c.task = %s"
        )
        self.claims = f"SELECT c.task, {_full_claim(s)} FROM {s}.claims c ORDER BY c.task"
        self.task = f"SELECT data::text FROM {s}.tasks WHERE task = %s"
        self.tasks = f"SELECT task, data::text FROM {s}.tasks ORDER BY task"
        self.dependants = f"SELECT task FROM {s}.tasks WHERE data->'depends_on' ? %s"
        self.candidates = _candidates(s)
        self.task_upsert = (
            f"INSERT INTO {s}.tasks (task, seq, data) VALUES (%s, %s, %s::jsonb) "
            "ON CONFLICT (task) DO UPDATE SET seq = EXCLUDED.seq, data = EXCLUDED.data"
        )
        self.audit_insert = (
            f"INSERT INTO {s}.audit (seq, ts, type, task, owner, actor, fence, hash, line) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self.audit_copy = (
            f"COPY {s}.audit (seq, ts, type, task, owner, actor, fence, hash, line) FROM STDIN"
        )
        self.audit_count = f"SELECT count(*) FROM {s}.audit"
        # A claim row and the grants it retired since the version the transaction read
        # (journal.claim_row: ``k`` of them, as a JSON array, newest last): the row's ``rn``
        # grows by k on the server (the ords are numbered there, from the row as it stands
        # under the head lock) and the grants go to their slots of the ring.
        claim_put = (
            f"INSERT INTO {s}.claims AS c (task, owner, state, fence, expires_at, seq, data, "
            "rn, rlen) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s) ON CONFLICT (task) "
            "DO UPDATE SET owner = EXCLUDED.owner, state = EXCLUDED.state, "
            "fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at, seq = EXCLUDED.seq, "
            "data = EXCLUDED.data, rn = c.rn + EXCLUDED.rn, rlen = EXCLUDED.rlen "
            "RETURNING c.task, c.rn"
        )
        retired_put = (
            f"INSERT INTO {s}.retired (task, slot, ord, data) "
            f"SELECT u.task, mod(u.rn - n.k + e.i, {RING}), u.rn - n.k + e.i, e.v "
            "FROM u, (SELECT %s::jsonb AS a) g, jsonb_array_length(g.a) n(k), "
            "jsonb_array_elements(g.a) WITH ORDINALITY e(v, i) ON CONFLICT (task, slot) "
            "DO UPDATE SET ord = EXCLUDED.ord, data = EXCLUDED.data"
        )
        self.claim_upsert = f"WITH u AS ({claim_put}) {retired_put}"
        self.head_update = (
            f"UPDATE {s}.head SET seq = %s, head = %s, fence = %s, origin = %s, "
            "updated_at = now() WHERE id = 1"
        )
        self.lines = f"SELECT seq, line FROM {s}.audit WHERE seq > %s ORDER BY seq LIMIT %s"
        self.line_at = f"SELECT line FROM {s}.audit WHERE seq = %s"
        self.task_lines = (f"SELECT seq, line FROM {s}.audit WHERE task = %s AND seq > %s "
                           "ORDER BY seq")
        self.version = f"SELECT max(version) FROM {s}.schema_version"
        self.server_time = "SELECT extract(epoch FROM clock_timestamp())::float8"
        self.settings = (
            "SELECT set_config('synchronous_commit', %s, true), "
            "set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
            "set_config('idle_in_transaction_session_timeout', %s, true), "
            f"set_config('fleetclaims.writer', '{WRITER_PROTOCOL}', true)"
        )
        # The writers' lock (a transaction advisory lock of this schema): taken shared by a
        # write numbered in its commit (one task's claim, renewal, release, completion: it
        # holds its task's lock, task_key), exclusively by every other write, which so runs
        # alone as before schema 6. Always before the head row: no lock cycle.
        writers = lock_key(f"fleetclaims-writers:{s}")
        self.task_prefix = f"fleetclaims-task:{s}:"
        # Full durability without holding the head lock across the WAL flush: the write
        # transaction commits with synchronous_commit off (its locks go as soon as its commit
        # record is in the WAL buffers), and this transaction, sent in the same message right
        # behind it, commits with it on. The server flushes at COMMIT only a transaction that
        # has an xid and wrote WAL: txid_current() takes one, and a logical message (a WAL
        # record no table sees, allowed to every role) writes; its COMMIT then returns once
        # the WAL is flushed past the write's commit record too. Concurrent writers' flushes
        # share one fsync, as the file store's group commit shares one fdatasync (README,
        # PostgreSQL; bench/README.md).
        self.flush = ("SELECT set_config('synchronous_commit', 'on', true), txid_current(), "
                      "pg_logical_emit_message(false, 'fleetclaims', 'flush')")
        self.commit_mode = "SELECT set_config('synchronous_commit', %s, true)"
        # This transaction's settings, then the head row locked, in one statement: the
        # settings are a subquery joined below the row lock (FOR UPDATE locks the rows the
        # join returns), so lock_timeout is in force when the lock is waited for.
        # (the writers' lock in the target list: evaluated after the settings' subquery and
        # below the row lock, so lock_timeout is in force for both)
        self.lock = (
            f"SELECT h.seq, h.head, h.fence, h.origin, pg_advisory_xact_lock({writers}), "
            f"extract(epoch FROM clock_timestamp())::float8 FROM ({self.settings}) l, "
            f"{s}.head h WHERE h.id = 1 FOR UPDATE OF h"
        )
        # A numbered write's first round trip: its settings, the writers' lock shared and its
        # tasks' locks (the keys sorted: every writer takes them in one order), the head as it
        # stands (not locked: only a guess of the numbers), then the server's clock.
        self.peek = (
            f"SELECT h.seq, h.head, h.fence, h.origin, pg_advisory_xact_lock_shared({writers}), "
            "(SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) k), "
            f"extract(epoch FROM clock_timestamp())::float8 FROM ({self.settings}) l, "
            f"{s}.head h WHERE h.id = 1"
        )
        self.head_lock = (
            f"SELECT seq, head, fence, origin, extract(epoch FROM clock_timestamp())::float8, "
            f"set_config('fleetclaims.writer', '{WRITER_PROTOCOL}', true), "
            f"pg_advisory_xact_lock({writers}) FROM {s}.head WHERE id = 1 FOR UPDATE"
        )
        # The usual write (one audit row, one claim row, the head) as one statement.
        self.write1 = (
            f"WITH a AS ({self.audit_insert}), u AS ({claim_put}), r AS ({retired_put}) "
            f"{self.head_update}"
        )
        self.numbered = numbered_write(s, retired_put)
        self.guessed = numbered_write(s, retired_put, guarded=True)

    def prepared(self) -> tuple[str, Queries]:
        """(PREPARE statements, a copy of these queries that EXECUTEs them) for the statements
        of a write transaction, on a connection that is its own server session (not through
        a pooler: see connection.direct). Each name is the hash of its statement's text (which
        names the schema), so one name always means one statement."""
        fast = copy.copy(self)
        prepares = []
        for attr, types in _PREPARED.items():
            sql = getattr(self, attr)
            name = "fc_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
            numbered = sql
            for n in range(1, len(types) + 1):
                numbered = numbered.replace("%s", f"${n}", 1)
            signature = f"({', '.join(types)})" if types else ""
            prepares.append(f"PREPARE {name} {signature} AS {numbered}")
            args = f"({', '.join(['%s'] * len(types))})" if types else ""
            setattr(fast, attr, f"EXECUTE {name}{args}")
        return "; ".join(prepares), fast


# The statements of a write transaction run as prepared statements on a direct connection
# (parsed and planned once per session: most of the server's time per operation otherwise),
# with their parameter types.
_SETTINGS = ("text", "text", "text", "text")
_AUDIT = ("bigint", "float8", "text", "text", "text", "text", "bigint", "text", "text")
_CLAIM = ("text", "text", "text", "bigint", "float8", "bigint", "text", "integer", "integer",
          "text")
_HEAD = ("bigint", "text", "bigint", "text")
_NUMBERED = ("integer", "text", "text", "float8", "text", "text", "text", "text", "bigint",
             "text", "text", "text", "float8", "text", "integer", "integer", "bigint", "text")
_PREPARED: dict[str, tuple[str, ...]] = {
    "lock": _SETTINGS,
    "peek": ("bigint[]", *_SETTINGS),
    "claim": ("bigint", "text", "text"),
    "task": ("text",),
    "audit_insert": _AUDIT,
    "claim_upsert": _CLAIM,
    "task_upsert": ("text", "bigint", "text"),
    "head_update": _HEAD,
    "write1": (*_AUDIT, *_CLAIM, *_HEAD),
    "numbered": _NUMBERED,
    "guessed": (*_NUMBERED[:3], "bigint", "text", "text", "boolean", "boolean", "text", "float8",
                "float8", *_NUMBERED[3:]),
    "flush": (),
}


def _candidates(s: str) -> str:
    """claim_next's candidates (TaskView.candidates): the open tasks (not done) after the last
    key seen, in hand-out order, a page at a time: the server walks the index tasks_open and
    stops at the page's end. For each, whether a live claim holds it and whether it is
    otherwise ready (not blocked, every dependency completed, the labels asked for); the
    caller skips the rest but pages on from the last task walked."""
    inner = _TASK_KEY
    outer = _TASK_KEY.replace("data->", "t.data->").replace("(task ", "(t.task ")
    return (
        "SELECT t.task, t.data::text, coalesce(c.state IN ('active', 'expired'), false), "
        "jsonb_typeof(t.data->'blocked') IS DISTINCT FROM 'string' "
        "AND c.state IS DISTINCT FROM 'completed' "
        "AND coalesce(t.data->'labels', '[]'::jsonb) @> %s::jsonb "
        "AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(t.data->'depends_on') d "
        f"WHERE NOT EXISTS (SELECT 1 FROM {s}.claims u WHERE u.task = d.value "
        "AND u.state = 'completed')), "
        "(t.data->>'priority')::bigint, (t.data->>'added_at')::float8 "
        f"FROM (SELECT task, data FROM {s}.tasks WHERE NOT done "
        f"AND ({inner}) > (%s, %s, %s COLLATE \"C\") ORDER BY {inner} LIMIT %s) t "
        f"LEFT JOIN {s}.claims c ON c.task = t.task ORDER BY {outer}"
    )


def installed_version(conn: psycopg.Connection[Any], s: str) -> int:
    """The schema version in place (0: none)."""
    try:
        row = conn.execute(f"SELECT max(version) FROM {s}.schema_version").fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return 0
    return int(row[0]) if row and row[0] is not None else 0


def check_version(version: int, schema: str, location: str) -> None:
    """Refuse a schema newer than this fleetclaims understands."""
    if version > SCHEMA_VERSION:
        raise SchemaMismatch(
            location,
            f"schema {schema!r} is at version {version}, newer than this fleetclaims "
            f"understands ({SCHEMA_VERSION})",
            hint="Upgrade fleetclaims on this machine; it never writes to a schema it does "
            "not understand.",
        )


def migrate(conn: psycopg.Connection[Any], schema: str, location: str) -> int:
    """Create or upgrade ``schema`` to SCHEMA_VERSION in one transaction; returns the version
    now in place. Safe to run concurrently (an advisory lock serialises migrations)."""
    key = int.from_bytes(
        hashlib.sha256(f"fleetclaims-schema:{schema}".encode()).digest()[:8], "big",
        signed=True,
    )
    s = f'"{schema}"'
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now(), by_version text NOT NULL)"
            )
            row = conn.execute(f"SELECT max(version) FROM {s}.schema_version").fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            from ... import __version__

            for version, statements in sorted(migrations(s).items()):
                if version <= current:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    f"INSERT INTO {s}.schema_version (version, by_version) VALUES (%s, %s)",
                    (version, __version__),
                )
                current = version
    except psycopg.errors.InsufficientPrivilege as exc:
        raise AccessDenied(
            location,
            f"not allowed to create or upgrade schema {schema!r}: {describe(exc)}",
            hint="Ask the database owner to run `fleetclaims db migrate` with this URL, or to "
            "GRANT this role CREATE on the database.",
        ) from None
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        from ...core.errors import StoreReadOnly

        raise StoreReadOnly(location, f"cannot create schema {schema!r}: {describe(exc)}") \
            from None
    except psycopg.Error as exc:
        raise StoreUnavailable(location, describe(exc), committed=False) from None
    return current


def describe(exc: BaseException) -> str:
    """A database error in one line, with its SQLSTATE."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    return f"{first} (SQLSTATE {state})" if state else first
