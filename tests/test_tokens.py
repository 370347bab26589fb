"""Tokens are secrets that shell scripts pass as `--token $T`: they never start with a dash."""

from __future__ import annotations

import secrets

import pytest

from fleetclaims.api import new_token

pytestmark = pytest.mark.unit


def test_a_token_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw that starts with "-" is drawn again, so argparse never reads a token as an option."""
    draws = iter(["-starts-with-dash", "-again", "fine-token"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(draws))
    assert new_token() == "fine-token"


def test_tokens_are_long_and_distinct() -> None:
    """Fresh tokens carry 192 bits (32 URL-safe characters) and do not repeat."""
    tokens = {new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert all(len(t) == 32 and not t.startswith("-") for t in tokens)
