"""PostgreSQL refusals are typed errors that say what to do: a role without privileges, a
missing schema, a schema newer than the code, a read-only server, no connection slot free."""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from pg_server import PgServer, back_to

from fleetclaims import Registry
from fleetclaims.cli import main
from fleetclaims.core.errors import (
    AccessDenied,
    RegistryNotFound,
    SchemaMismatch,
    StoreOverloaded,
    StoreReadOnly,
)

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _fresh(pg_server: PgServer) -> tuple[str, str]:
    """(URL of a new database as the superuser, its name)."""
    name = "e_" + uuid.uuid4().hex[:10]
    return pg_server.create_database(name), name


def _as(url: str, role: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


def _admin(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_role_without_privileges_gets_access_denied(
        pg_server: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A role that may connect but has no rights on the registry's schema gets AccessDenied
    (with what to grant), from the library and as a --json document from the CLI."""
    url, _ = _fresh(pg_server)
    Registry(url).claim("t", owner="owner")  # the owner creates the registry
    role = "r_" + uuid.uuid4().hex[:8]
    _admin(url, f"CREATE ROLE {role} LOGIN")
    with pytest.raises(AccessDenied) as denied:
        Registry(_as(url, role)).claim("u", owner="intruder")
    assert "GRANT" in str(denied.value) and denied.value.code == "access_denied"
    assert main(["claim", "u", "--owner", "intruder", "--dir", _as(url, role), "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["error"] == "access_denied"


def test_role_that_cannot_create_the_schema_gets_access_denied(pg_server: PgServer) -> None:
    """A registry that does not exist yet, opened by a role without CREATE: AccessDenied
    naming `fleetclaims db migrate`, nothing created."""
    url, _ = _fresh(pg_server)
    role = "r_" + uuid.uuid4().hex[:8]
    _admin(url, f"CREATE ROLE {role} LOGIN", "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    with pytest.raises(AccessDenied, match="db migrate"):
        Registry(_as(url, role)).claim("t", owner="a")


def test_older_schema_and_a_role_that_cannot_upgrade_it(pg_server: PgServer) -> None:
    """A schema 3 registry used by a role with every right on its rows but not the owner's:
    AccessDenied naming `fleetclaims db migrate`, nothing written; once the owner has run
    it, the same role writes (schema 5: the table of retired grants the upgrade creates gets
    the rights the role has on the claims table)."""
    url, _ = _fresh(pg_server)
    owner = Registry(url)
    owner.release("t", token=owner.claim("t", owner="a").token or "")
    owner.close()
    role = "r_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        back_to(conn, "fleetclaims", 3)
    _admin(url, f"CREATE ROLE {role} LOGIN", f"GRANT USAGE ON SCHEMA fleetclaims TO {role}",
           f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA fleetclaims TO {role}")
    worker = Registry(_as(url, role))
    with pytest.raises(AccessDenied, match="db migrate"):
        worker.claim("u", owner="b")
    assert [c.task for c in Registry(url).claims()] == []  # (this handle upgrades it)
    assert worker.claim("u", owner="b").fence == 2
    again = worker.claim("t", owner="b")
    assert worker.release("t", token=again.token or "") is True
    assert [r.cause for r in Registry(url).get("t").retired] == ["released"] * 2  # type: ignore[union-attr]
    assert worker.verify().ok
    worker.close()


def test_dropped_schema_is_a_schema_mismatch(pg_server: PgServer) -> None:
    """The registry's schema dropped under a live handle: SchemaMismatch saying to migrate
    (never a silent fresh registry on the same connection)."""
    url, _ = _fresh(pg_server)
    reg = Registry(url)
    reg.claim("t", owner="a")
    _admin(url, "DROP SCHEMA fleetclaims CASCADE")
    with pytest.raises(SchemaMismatch, match="db migrate"):
        reg.claim("u", owner="a")
    reg.close()


def test_newer_schema_is_refused(pg_server: PgServer) -> None:
    """A schema migrated by a newer fleetclaims is refused with SchemaMismatch (upgrade), on
    every call of the handle, not only the first."""
    url, _ = _fresh(pg_server)
    Registry(url).claim("t", owner="a")
    _admin(url, "INSERT INTO fleetclaims.schema_version (version, by_version) "
           "VALUES (99, 'future')")
    reg = Registry(url)
    for _ in range(2):
        with pytest.raises(SchemaMismatch, match="Upgrade fleetclaims"):
            reg.claim("u", owner="a")


def test_read_only_server_gets_store_read_only(pg_server: PgServer) -> None:
    """A database that only accepts reads (as a hot standby does): writes give StoreReadOnly
    naming the primary; reads still work."""
    url, name = _fresh(pg_server)
    Registry(url).claim("t", owner="a")
    _admin(url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    reg = Registry(url)
    with pytest.raises(StoreReadOnly, match="primary") as refused:
        reg.claim("u", owner="b")
    assert refused.value.committed is False
    assert [c.task for c in reg.claims()] == ["t"]


@pytest.mark.slow
def test_no_connection_slot_gives_store_overloaded(pg_server: PgServer) -> None:
    """A role at its connection limit gets StoreOverloaded within the lock_timeout budget."""
    url, _ = _fresh(pg_server)
    Registry(url).claim("t", owner="a")
    role = "r_" + uuid.uuid4().hex[:8]
    _admin(url, f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1",
           f"GRANT ALL ON SCHEMA fleetclaims TO {role}",
           f"GRANT ALL ON ALL TABLES IN SCHEMA fleetclaims TO {role}")
    with psycopg.connect(_as(url, role)):
        started = time.monotonic()
        with pytest.raises(StoreOverloaded, match="PgBouncer"):
            Registry(_as(url, role), lock_timeout=1).claim("u", owner="b")
        assert time.monotonic() - started < 3
    assert Registry(_as(url, role)).claim("u", owner="b").fence == 2


def test_a_role_the_server_does_not_have_is_told_so(pg_server: PgServer) -> None:
    """A user name that is no role on the server: AccessDenied naming the fix (not advice to
    check that the server is running), and the CLI's --json says the same."""
    url, _ = _fresh(pg_server)
    with pytest.raises(AccessDenied, match="CREATE ROLE") as denied:
        Registry(_as(url, "nosuchrole")).claims()
    assert "does not exist" in str(denied.value)


def test_libpq_options_in_the_url_reach_the_server(pg_server: PgServer) -> None:
    """A URL's libpq parameters keep their percent-encoding (a space as %20 is a space to
    libpq; written back as "+" it was not, and the connection failed)."""
    url, _ = _fresh(pg_server)
    reg = Registry(url + "?options=-c%20work_mem%3D5MB")
    assert reg.store.query("SHOW work_mem") == [("5MB",)]  # type: ignore[attr-defined]
    assert "options=-c%20work_mem%3D5MB" in reg.location
    reg.claim("t", owner="a")
    reg.close()


def test_a_read_of_a_schema_that_is_not_there_creates_nothing(pg_server: PgServer) -> None:
    """A misspelt ?schema= read from the CLI (--dir names it), or opened with create=False:
    RegistryNotFound, and no schema is left behind; the first write creates it as before."""
    url, _ = _fresh(pg_server)

    def schemas() -> set[str]:
        with psycopg.connect(url, autocommit=True) as conn:
            return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")}

    before = schemas()
    with pytest.raises(RegistryNotFound, match="no fleetclaims schema 'typo_a'"):
        Registry(url + "?schema=typo_a", create=False).claims()
    for argv in (["claims", "--json"], ["audit", "verify", "--json"], ["stats", "--json"]):
        code = main([*argv, "--dir", url + "?schema=typo_b"])
        assert code == 2, argv
    assert schemas() == before
    Registry(url + "?schema=typo_b").claim("t", owner="a")
    assert schemas() == before | {"typo_b"}
    assert [c.task for c in Registry(url + "?schema=typo_b", create=False).claims()] == ["t"]
