"""CLI commands for AI agents: ``mcp``, ``guard``, ``hooks`` and ``brief``.

Kept apart from :mod:`fleetclaims.cli` so those commands' imports (the MCP SDK, git) load
only when one of them runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.errors import EXIT_OK, FleetclaimsError, ValidationError

if TYPE_CHECKING:
    from . import Out

AddParser = Callable[[str, str], argparse.ArgumentParser]

EXAMPLES = {
    "mcp": "fleetclaims mcp --owner agent-a     # an MCP server on stdio, for an MCP client",
    "guard": "fleetclaims guard   # in a `fleetclaims run` child: exit 4 if the claim was lost",
    "hooks": "fleetclaims hooks install     # pre-commit, pre-push, prepare-commit-msg\n"
    "  fleetclaims hooks uninstall   # restore the hooks that were there",
    "brief": "fleetclaims brief --owner agent-a\n  fleetclaims brief --owner agent-a --json",
}


def add_parsers(add: AddParser, examples: dict[str, str]) -> None:
    """Register this module's subcommands with ``add(name, help)`` (see cli.build_parser)."""
    examples.update(EXAMPLES)
    owner_help = "who this agent is (default: $FLEETCLAIMS_OWNER)"

    p = add("mcp", "serve the registry to an AI agent over MCP (stdio), as one owner")
    p.add_argument("--owner", default=None, help=owner_help)

    p = add("guard", "refuse (exit non-zero) if this run's claim is no longer live and ours")
    p.add_argument("--hook", default=None, help="the git hook calling it (for the message)")

    p = add("hooks", "install or remove the guard as git hooks (chained to existing hooks)")
    p.add_argument("action", choices=("install", "uninstall"))
    p.add_argument("--repo", default=".", help="a directory inside the git repository")
    p.add_argument("--no-trailer", action="store_true",
                   help="do not add a `Claim: TASK fence N` trailer to commit messages")

    p = add("brief", "a short current picture of the registry for an agent's context")
    p.add_argument("--owner", default=None, help=owner_help)


def _owner(args: argparse.Namespace, required: bool) -> str | None:
    owner = args.owner or os.environ.get("FLEETCLAIMS_OWNER") or None
    if owner is None and required:
        raise ValidationError("owner", "is required: pass --owner NAME or set FLEETCLAIMS_OWNER")
    return owner


def cmd_mcp(args: argparse.Namespace, out: Out) -> int:
    from . import _registry

    owner = _owner(args, required=True)
    assert owner is not None
    try:
        from ..agents import mcp_server
    except ImportError as exc:
        raise FleetclaimsError(
            f"the MCP server needs the MCP SDK, which is not installed ({exc}).",
            hint="Install the extra: pip install 'fleetclaims[mcp]'.") from None
    mcp_server.serve(_registry(args), owner)
    return EXIT_OK


def cmd_guard(args: argparse.Namespace, out: Out) -> int:
    from ..agents import guard

    found = guard.claim_env(os.environ)
    if found is None:
        return EXIT_OK  # not in a claimed run: nothing to guard
    if isinstance(found, guard.ClaimEnv):
        from ..location import is_url, resolve
        from . import _registry

        location = resolve(args.dir)
        try:
            if not is_url(location) and not os.path.isdir(location):
                raise FleetclaimsError(
                    f"there is no registry at {location}, so nobody holds {found.task!r} there",
                    hint="Was the run started with another --dir or FLEETCLAIMS_DIR? Run the "
                    "guard with the same registry.")
            # Read only: never create a registry (or anything else) from a hook.
            reg = _registry(args, create=False)
        except FleetclaimsError as exc:
            result = guard.GuardResult(False, found.task, found.fence, code=exc.code,
                                       reason=exc.message, exit_code=exc.exit_code,
                                       next_action=exc.hint or "")
        else:
            try:
                result = guard.check(reg, found)
            finally:
                reg.close()
    else:
        result = found
    if out.json:
        out.doc(result.to_dict())
    if not result.ok:
        what = {"pre-commit": "commit", "pre-push": "push"}.get(args.hook or "", "work")
        sys.stderr.write(f"fleetclaims guard: {what} refused: {result.reason.rstrip('.')}.\n"
                         f"{result.next_action}\n")
    return result.exit_code


def cmd_hooks(args: argparse.Namespace, out: Out) -> int:
    from ..agents import hooks

    if args.action == "install":
        changes = hooks.install(args.repo, trailer=not args.no_trailer)
    else:
        changes = hooks.uninstall(args.repo)
    if out.json:
        out.doc({"action": args.action, "hooks": [c.to_dict() for c in changes]})
        return EXIT_OK
    if not changes:
        out.line("no fleetclaims hooks were installed; nothing to do")
    for c in changes:
        out.line(f"{c.action} {c.path}" + (f" ({c.detail})" if c.detail else ""))
    if args.action == "install":
        out.line("commits and pushes inside `fleetclaims run` are now refused once its claim "
                 "is lost; outside a claimed run the hooks do nothing")
    return EXIT_OK


def cmd_brief(args: argparse.Namespace, out: Out) -> int:
    import time

    from ..agents import brief
    from . import _registry

    doc = brief.build(_registry(args), _owner(args, required=False), time.time())
    if out.json:
        out.doc(doc)
    else:
        out.line(brief.render(doc))
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, Out], int]] = {
    "mcp": cmd_mcp, "guard": cmd_guard, "hooks": cmd_hooks, "brief": cmd_brief,
}
