"""Shared fixtures: a fake clock and prober, and a registry on every store backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.store.memory import MemoryStore
from fleetclaims.testing import FakeClock, FakeProber

STORES = ["file", "memory", "postgres"]


@pytest.fixture(autouse=True)
def _isolated_default_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the repository's own .cache/fleetclaims/ (the default location)."""
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(tmp_path / "default-registry"))
    monkeypatch.delenv("FLEETCLAIMS_URL", raising=False)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def prober() -> FakeProber:
    return FakeProber()


@pytest.fixture(params=STORES)
def make_registry(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, prober: FakeProber
) -> Iterator[Callable[[], Registry]]:
    """A factory of Registry handles on one shared registry, for each store backend."""
    kind = request.param
    made: list[Registry] = []
    memory = MemoryStore(clock=clock) if kind == "memory" else None

    def make() -> Registry:
        if kind == "file":
            reg = Registry(tmp_path / "reg", clock=clock, prober=prober)
        elif kind == "memory":
            reg = Registry(store=memory, clock=clock, prober=prober)
        else:
            url = request.getfixturevalue("postgres_url")
            reg = Registry(url, clock=clock, prober=prober, schema=_schema_for(request))
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def _schema_for(request: pytest.FixtureRequest) -> str:
    import hashlib

    return "t_" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]


@pytest.fixture
def registry(make_registry: Callable[[], Registry]) -> Registry:
    return make_registry()


@pytest.fixture
def file_registry(tmp_path: Path, clock: FakeClock, prober: FakeProber) -> Iterator[Registry]:
    reg = Registry(tmp_path / "reg", clock=clock, prober=prober)
    yield reg
    reg.close()

# The throwaway PostgreSQL server (session fixtures `pg_server`, `postgres_url`).
from pg_server import pg_server, postgres_url  # noqa: E402, F401
