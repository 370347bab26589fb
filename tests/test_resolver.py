"""The resolver: one total order, deterministic, independent of input order and locale."""

from __future__ import annotations

import itertools
import locale

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetclaims.core.model import Claim
from fleetclaims.core.resolver import compare, order_key, winner

pytestmark = pytest.mark.unit

claims = st.builds(
    Claim,
    task=st.just("t"),
    owner=st.text(alphabet="aAbBzZ09._-äé", min_size=1, max_size=6),
    fence=st.integers(1, 50),
    token_hash=st.text(alphabet="0123456789abcdef", min_size=4, max_size=4),
    claimed_at=st.sampled_from([1.0, 2.0, 2.5, 1e9]),
    priority=st.integers(-3, 3),
)
entries = st.tuples(claims, st.booleans())


@given(entries, entries)
def test_antisymmetric(a: tuple[Claim, bool], b: tuple[Claim, bool]) -> None:
    """If a beats b then b does not beat a; ties only for identical keys."""
    ab, _ = compare(a[0], a[1], b[0], b[1])
    ba, _ = compare(b[0], b[1], a[0], a[1])
    assert ab == -ba
    if ab == 0:
        assert order_key(*a) == order_key(*b)


@given(entries, entries, entries)
def test_transitive(a: tuple[Claim, bool], b: tuple[Claim, bool], c: tuple[Claim, bool]) -> None:
    """a <= b and b <= c imply a <= c."""
    if compare(*a, *b)[0] <= 0 and compare(*b, *c)[0] <= 0:
        assert compare(*a, *c)[0] <= 0


@settings(max_examples=60)
@given(st.lists(entries, min_size=1, max_size=5))
def test_same_winner_for_every_permutation(items: list[tuple[Claim, bool]]) -> None:
    """The winner does not depend on the order the candidates arrive in."""
    first = order_key(*((w := winner(items)[0]), dict((id(c), s) for c, s in items)[id(w)]))
    for perm in itertools.permutations(items):
        chosen = winner(list(perm))[0]
        stale = next(s for c, s in perm if c is chosen)
        assert order_key(chosen, stale) == first


def test_rules_in_order() -> None:
    """Not stale before stale, then priority, claim time, owner bytes, token hash."""
    base = Claim(task="t", owner="b", fence=1, token_hash="bb", claimed_at=5.0, priority=10)
    from dataclasses import replace

    assert compare(base, False, replace(base, priority=1), True) == (-1, "not stale before stale")
    assert compare(base, False, replace(base, priority=1), False) == (1, "lower priority number")
    assert compare(base, False, replace(base, claimed_at=4.0), False) == (1, "earlier claim time")
    assert compare(base, False, replace(base, owner="B"), False) == (1, "owner name")  # b"B"<b"b"
    assert compare(base, False, replace(base, token_hash="aa"), False) == (1, "token hash")


def test_independent_of_locale() -> None:
    """Owner names compare as UTF-8 bytes whatever the locale says about collation."""
    a = Claim(task="t", owner="ä", fence=1)
    b = Claim(task="t", owner="z", fence=2)
    results = []
    saved = locale.setlocale(locale.LC_ALL)  # restored after, so no later test runs in "C"
    try:
        for name in ("C", "C.UTF-8", "de_DE.UTF-8", "sv_SE.UTF-8", "en_US.UTF-8"):
            try:
                locale.setlocale(locale.LC_ALL, name)
            except locale.Error:
                continue
            results.append(compare(a, False, b, False))
    finally:
        locale.setlocale(locale.LC_ALL, saved)
    assert results and all(r == (1, "owner name") for r in results)  # b"z" < "ä".encode()
