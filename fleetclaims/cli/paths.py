"""CLI commands on path reservations (#23): ``reserve`` and ``unreserve``, and the
``--paths``/``--shared`` options that ``claim``, ``claim-next`` and ``run`` share."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import AddParser, Handler, existing, token, token_option
from .output import EXIT_OK, show_claim

if TYPE_CHECKING:
    from .output import Out

EXAMPLES = {
    "reserve": "fleetclaims reserve issue-42 'src/parser/**' tests/test_parser.py "
    "--token $FLEETCLAIMS_TOKEN",
    "unreserve": "fleetclaims unreserve issue-42 tests/test_parser.py --token $TOKEN",
}

PATTERNS_HELP = ("repository-relative, gitignore-style: `*` within a directory, `**` across, "
                 "`?` one character; a directory covers everything under it; compared "
                 "case-insensitively")


def paths_options(p: argparse.ArgumentParser) -> None:
    """``--paths`` (exclusive) and ``--shared`` patterns reserved with a claim."""
    p.add_argument("--paths", nargs="+", action="extend", default=None, metavar="PATTERN",
                   help="reserve these paths exclusively with the claim: " + PATTERNS_HELP)
    p.add_argument("--shared", nargs="+", action="extend", default=None, metavar="PATTERN",
                   help="reserve these paths shared (they coexist with other shared "
                   "reservations, not with an exclusive one)")


def add_parsers(add: AddParser) -> None:
    p = add("reserve", "reserve more paths with a claim you hold")
    p.add_argument("task")
    p.add_argument("patterns", nargs="*", metavar="PATTERN", help="exclusive: " + PATTERNS_HELP)
    p.add_argument("--shared", nargs="+", action="extend", default=None, metavar="PATTERN",
                   help="shared reservations")
    token_option(p)

    p = add("unreserve", "drop path reservations from a claim you hold")
    p.add_argument("task")
    p.add_argument("patterns", nargs="*", metavar="PATTERN",
                   help="the patterns to drop, as reserved (none: --all)")
    p.add_argument("--all", action="store_true", help="drop every reservation of the claim")
    token_option(p)


def cmd_reserve(args: argparse.Namespace, out: Out) -> int:
    c = existing(args).reserve(args.task, token=token(args), paths=args.patterns,
                               shared_paths=args.shared)
    show_claim(out, c.with_token(None), "reserved")
    return EXIT_OK


def cmd_unreserve(args: argparse.Namespace, out: Out) -> int:
    from ..core.errors import ValidationError

    if not args.patterns and not args.all:
        raise ValidationError("patterns", "name the patterns to drop, or pass --all")
    c = existing(args).unreserve(args.task, token=token(args),
                                 paths=None if args.all else args.patterns)
    show_claim(out, c.with_token(None), "unreserved")
    return EXIT_OK


COMMANDS: dict[str, Handler] = {"reserve": cmd_reserve, "unreserve": cmd_unreserve}

__all__ = ["COMMANDS", "EXAMPLES", "add_parsers", "paths_options"]
