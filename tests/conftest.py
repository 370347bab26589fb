"""Shared fixtures: a fake clock and prober, and a registry on every store backend; and the
check that every test carries a speed class (unit, integration or slow)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.store.memory import MemoryStore
from fleetclaims.testing import FakeClock, FakeProber

# pytester: tests/test_speed_classes.py collects small test modules of its own
pytest_plugins = ["pytester"]

STORES = ["file", "memory", "postgres"]

#: the speed classes, fastest first; `-m "not slow"` is the fast subset
SPEED_CLASSES = ("unit", "integration", "slow")


def speed_class_problem(item: pytest.Item) -> str | None:
    """What is wrong with ``item``'s speed class, or None when it has exactly one.

    A module (or class) names the class of most of its tests with ``pytestmark``; a test of it
    that takes longer says ``@pytest.mark.slow`` itself, and then it is slow. Nothing else may
    combine: a test marked both unit and integration, or a test in a slow module marked faster,
    would run in a subset it does not belong to.
    """
    own = {m.name for m in item.own_markers if m.name in SPEED_CLASSES}
    inherited = {m.name for m in item.iter_markers() if m.name in SPEED_CLASSES} - own
    classes = own | inherited
    if not classes:
        return "no speed class"
    if len(own) > 1 or len(inherited) > 1:
        return "several speed classes: " + ", ".join(sorted(classes))
    if own and inherited and own != {"slow"}:
        return f"{own.pop()} inside a {inherited.pop()} module: only slow may override"
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything: every collected test is checked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse to run when a test has no speed class, so no new test escapes the fast/slow split."""
    problems: dict[str, list[str]] = {}
    for item in items:
        problem = speed_class_problem(item)
        if problem is not None:
            problems.setdefault(problem, []).append(item.nodeid)
    if problems:
        lines = [f"  {problem}: {len(ids)} test(s), e.g. {', '.join(ids[:3])}"
                 for problem, ids in sorted(problems.items())]
        raise pytest.UsageError(
            "every test needs exactly one speed class: put `pytestmark = pytest.mark.unit` "
            "(or integration, or slow) at the top of its module, and `@pytest.mark.slow` on a "
            "test that takes longer than its module's class (see pyproject.toml's markers):\n"
            + "\n".join(lines))


@pytest.fixture(autouse=True)
def _isolated_default_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the repository's own .cache/fleetclaims/ (the default location)."""
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(tmp_path / "default-registry"))
    monkeypatch.delenv("FLEETCLAIMS_URL", raising=False)
    # (nor the user's anchors: test_honest_history.py tests the real places)
    monkeypatch.setenv("FLEETCLAIMS_ANCHOR_DIR", str(tmp_path / "anchors"))


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
