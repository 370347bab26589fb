"""CLI commands for AI agents: ``run``, ``mcp``, ``guard``, ``hooks`` and ``brief``.

Their implementations live in :mod:`fleetclaims.agents` and load only when one of these
commands runs (the MCP SDK, git, subprocess).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..core.errors import FleetclaimsError, ValidationError
from .args import AddParser, Handler, dur, reader, registry
from .output import EXIT_OK, exit_code

if TYPE_CHECKING:
    from .output import Out

EXAMPLES = {
    "run": "fleetclaims run issue-42 --owner agent-a --ttl 5m -- make test",
    "mcp": "fleetclaims mcp --owner agent-a     # an MCP server on stdio, for an MCP client",
    "guard": "fleetclaims guard   # in a `fleetclaims run` child: exit 4 if the claim was lost",
    "hooks": "fleetclaims hooks install     # pre-commit, pre-push, prepare-commit-msg\n"
    "  fleetclaims hooks uninstall   # restore the hooks that were there",
    "brief": "fleetclaims brief --owner agent-a\n  fleetclaims brief --owner agent-a --json",
}


def add_parsers(add: AddParser) -> None:
    p = add("run", "claim a task, heartbeat while CMD runs, complete on exit 0, else release")
    p.add_argument("task")
    p.add_argument("--owner", required=True)
    p.add_argument("--ttl", type=dur("ttl"), default=300.0, help="lease length (default 5m)")
    p.add_argument("--note")
    p.add_argument("--take-stale", action="store_true")

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


def cmd_run(args: argparse.Namespace, out: Out) -> int:
    from ..agents.runner import run_command

    cmd = list(args.cmd or [])
    if not cmd:
        raise ValidationError("CMD", "is missing: fleetclaims run TASK --owner O -- CMD ARGS...")
    return run_command(registry(args), args.task, owner=args.owner, ttl=args.ttl,
                       note=args.note, take_stale=args.take_stale, cmd=cmd, json_out=out.json)


def cmd_mcp(args: argparse.Namespace, out: Out) -> int:
    owner = _owner(args, required=True)
    assert owner is not None
    try:
        from ..agents import mcp_server
    except ImportError as exc:
        raise FleetclaimsError(
            f"the MCP server needs the MCP SDK, which is not installed ({exc}).",
            hint="Install the extra: pip install 'fleetclaims[mcp]'.") from None
    mcp_server.serve(registry(args), owner)
    return EXIT_OK


def cmd_guard(args: argparse.Namespace, out: Out) -> int:
    from ..agents import guard

    found = guard.claim_env(os.environ)
    if found is None:
        return EXIT_OK  # not in a claimed run: nothing to guard
    if isinstance(found, guard.ClaimEnv):
        from ..location import is_url, resolve

        location = resolve(args.dir)
        try:
            if not is_url(location) and not os.path.isdir(location):
                raise FleetclaimsError(
                    f"there is no registry at {location}, so nobody holds {found.task!r} there",
                    hint="Was the run started with another --dir or FLEETCLAIMS_DIR? Run the "
                    "guard with the same registry.")
            # Read only: never create a registry (or anything else) from a hook.
            reg = registry(args, create=False)
        except FleetclaimsError as exc:
            result = guard.refused(found, exc)
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
    return exit_code(result.code)


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

    doc = brief.build(reader(args), _owner(args, required=False), time.time())
    if out.json:
        out.doc(doc)
    else:
        out.line(brief.render(doc))
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "run": cmd_run, "mcp": cmd_mcp, "guard": cmd_guard, "hooks": cmd_hooks, "brief": cmd_brief,
}
