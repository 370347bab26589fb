"""Options the claiming commands share (``claim``, ``claim-next``, ``recover``, ``run``):
who claims (``--owner`` or ``$FLEETCLAIMS_OWNER``) and how long to wait (``--wait``); and
who a change is recorded as (``actor_of``)."""

from __future__ import annotations

import argparse

from .args import dur, from_env


def owner_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--owner", default=None,
                   help="who claims it, e.g. agent-a (default: $FLEETCLAIMS_OWNER)")


def env_owner() -> str | None:
    """``$FLEETCLAIMS_OWNER``, checked as an owner name."""
    from ..core import validate

    return from_env("FLEETCLAIMS_OWNER", validate.owner)


def owner_of(args: argparse.Namespace) -> str:
    """``--owner``, else ``$FLEETCLAIMS_OWNER``; refused (usage) when neither is set."""
    from ..core.errors import ValidationError

    owner = args.owner or env_owner()
    if owner is None:
        raise ValidationError("owner", "is required: pass --owner NAME or set FLEETCLAIMS_OWNER")
    return str(owner)


def actor_of(args: argparse.Namespace, default: str = "operator") -> str:
    """Who a change is recorded as (its events' ``actor``): ``--actor`` where the command has
    it, else ``$FLEETCLAIMS_OWNER`` (every command honours it), else ``default``."""
    given = getattr(args, "actor", None)
    return str(given or env_owner() or default)


def operator_default() -> str:
    """The actor of an operator's command (``release --force``, ``reopen``) when neither
    ``--actor`` nor ``$FLEETCLAIMS_OWNER`` names one: the login name when it is a valid
    owner name, else "operator" (a login name is not the user's to fix for this)."""
    from ..core import validate
    from ..core.errors import ValidationError

    try:
        return from_env("USER", validate.owner) or "operator"
    except ValidationError:
        return "operator"


WAIT_MAX = 7 * 86400.0  # --wait without a duration: a week (_wait.WAIT_MAX, the longest)


def wait_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--wait", type=dur("wait"), nargs="?", const=WAIT_MAX, default=None,
                   metavar="DURATION",
                   help=f"wait {what} (woken by registry changes, no polling), at most "
                   "DURATION (default: a week); one refusal is recorded per wait")
