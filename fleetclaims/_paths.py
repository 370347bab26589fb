"""The Registry's path reservations (#23): validated input in, core decisions out.

The decisions are in ``core/reserve.py`` (a grant's paths against other live claims') and the
pattern rules in ``core/paths.py``; this module turns method arguments into them, so
``api.py`` stays a façade.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from .core import reservations, reserve, rules, validate
from .core.errors import ValidationError
from .core.model import Claim, Now
from .core.paths import MAX_PATTERNS, normalise_all
from .core.reserve import Reservation
from .core.rules import Decision, Grant
from .core.state import State

if TYPE_CHECKING:
    from .api import Registry


def patterns(paths: Iterable[str] | None, shared: Iterable[str] | None
             ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Normalised exclusive and shared patterns (``ValidationError`` on any bad one, or on
    more than ``MAX_PATTERNS`` of both together)."""
    excl, sh = normalise_all(paths, "paths"), normalise_all(shared, "shared_paths")
    if len(excl) + len(sh) > MAX_PATTERNS:
        raise ValidationError("paths", f"a claim reserves at most {MAX_PATTERNS} patterns, "
                              "exclusive and shared together", value=len(excl) + len(sh))
    return excl, sh


def with_paths(grant: Grant, paths: Iterable[str] | None,
               shared: Iterable[str] | None) -> Grant:
    """``grant`` asking to reserve ``paths`` (exclusive) and ``shared`` (a claim on a git
    remote's lease is refused them first: ``not_remote``)."""
    if paths is None and shared is None:
        return grant  # the common case: no reservations, nothing to check or copy
    excl, sh = patterns(paths, shared)
    return replace(grant, paths=Reservation.of(excl, sh))


def not_remote(paths: Iterable[str] | None, shared: Iterable[str] | None) -> None:
    """Refuse reservations asked of a claim taken on a git remote's lease."""
    if paths is None and shared is None:
        return
    excl, sh = patterns(paths, shared)
    if excl or sh:
        raise ValidationError("paths", "reservations are kept by the registry, not by a git "
                              "remote's lease: claim without remote=, or reserve after")


def recover_checked(state: State, decision: Decision, now: Now) -> Decision:
    """A recovery carries the stale claim's reservations; they lapsed with it, so they are
    checked again against the claims made since."""
    checked: Decision = reserve.with_paths(state, decision, None, now, rules.lease_expired)
    return checked


def reserve_paths(reg: Registry, task: str, token: str, paths: Iterable[str] | None,
                  shared: Iterable[str] | None) -> Claim:
    task, th = validate.task(task), reg._token(token)
    excl, sh = patterns(paths, shared)
    if not excl and not sh:
        raise ValidationError("paths", "give at least one pattern to reserve")
    _, state = reg._run(lambda s, now: reservations.decide_reserve(s, task, th, excl, sh, now))
    return reg._mine(state, task, token)


def unreserve_paths(reg: Registry, task: str, token: str, paths: Iterable[str] | None) -> Claim:
    task, th = validate.task(task), reg._token(token)
    drop = None if paths is None else normalise_all(paths, "paths")
    _, state = reg._run(lambda s, now: reservations.decide_unreserve(s, task, th, drop, now))
    return reg._mine(state, task, token)
