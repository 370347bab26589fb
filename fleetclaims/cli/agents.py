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
    from ..agents.guard import GuardResult
    from ..api import Registry
    from .output import Out

EXAMPLES = {
    "run": "fleetclaims run issue-42 --owner agent-a --ttl 5m -- make test\n"
    "  fleetclaims run --next --label docs --wait 1h -- ./work-on.sh   # $FLEETCLAIMS_TASK",
    "mcp": "fleetclaims mcp --owner agent-a     # an MCP server on stdio, for an MCP client",
    "guard": "fleetclaims guard   # in a `fleetclaims run` child: exit 4 if the claim was lost",
    "hooks": "fleetclaims hooks install     # pre-commit, pre-push, prepare-commit-msg\n"
    "  fleetclaims hooks uninstall   # restore the hooks that were there",
    "brief": "fleetclaims brief --owner agent-a\n  fleetclaims brief --owner agent-a --json",
}


GRACE = 10.0  # run: seconds between SIGTERM and SIGKILL of the command's group (runner.py)


def add_parsers(add: AddParser) -> None:
    from .who import wait_option

    p = add("run", "claim a task, heartbeat while CMD runs, complete on exit 0, else release")
    p.add_argument("task", nargs="?", help="the task (or --next: the best ready one)")
    p.add_argument("--next", action="store_true", dest="next_task",
                   help="claim the best ready task of the queue; CMD finds its id in "
                   "$FLEETCLAIMS_TASK")
    p.add_argument("--label", dest="labels", action="append", default=[],
                   help="with --next: only tasks carrying this label (repeatable)")
    wait_option(p, "with --next, for a task to become ready")
    p.add_argument("--owner", default=None, help="who runs it (default: $FLEETCLAIMS_OWNER)")
    p.add_argument("--ttl", type=dur("ttl"), default=300.0, help="lease length (default 5m)")
    p.add_argument("--note")
    p.add_argument("--take-stale", action="store_true")
    p.add_argument("--timeout", type=dur("timeout"), default=None,
                   help="stop the command after this long (exit 124, the claim is released)")
    p.add_argument("--grace", type=dur("grace"), default=GRACE,
                   help="seconds between SIGTERM and SIGKILL when the command's process group "
                   f"is stopped (lease lost, Ctrl-C, --timeout; default {GRACE:g}s)")
    from .paths import paths_options

    paths_options(p)

    owner_help = "who this agent is (default: $FLEETCLAIMS_OWNER)"

    p = add("mcp", "serve the registry to an AI agent over MCP (stdio), as one owner")
    p.add_argument("--owner", default=None, help=owner_help)
    p.add_argument("--keepalive", type=dur("keepalive"), default=3600.0,
                   help="renew the leases the server holds for at most this long after the "
                   "agent's last tool call (default 1h)")

    p = add("guard", "refuse (exit non-zero) if this run's claim is no longer live and ours")
    p.add_argument("--hook", default=None, help="the git hook calling it (for the message)")
    p.add_argument("--remote", default="", help="pre-push: the remote pushed to (the pushed "
                   "refs on stdin, as git gives them), to check the paths the push changes")

    p = add("hooks", "install or remove the guard as git hooks (chained to existing hooks)")
    p.add_argument("action", choices=("install", "uninstall"))
    p.add_argument("--repo", default=".", help="a directory inside the git repository")
    p.add_argument("--no-trailer", action="store_true",
                   help="do not add a `Claim: TASK fence N` trailer to commit messages")

    p = add("brief", "a short current picture of the registry for an agent's context")
    p.add_argument("--owner", default=None, help=owner_help)


def _owner(args: argparse.Namespace, required: bool) -> str | None:
    from ..core import validate
    from .who import env_owner

    owner = validate.owner(args.owner) if args.owner is not None else env_owner()
    if owner is None and required:
        raise ValidationError("owner", "is required: pass --owner NAME or set FLEETCLAIMS_OWNER")
    return owner


def cmd_run(args: argparse.Namespace, out: Out) -> int:
    from ..agents.runner import RunOptions, run_command, run_next

    cmd = list(args.cmd or [])
    if not cmd:
        raise ValidationError("CMD", "is missing: fleetclaims run TASK --owner O -- CMD ARGS...")
    if args.next_task == (args.task is not None):
        raise ValidationError("task", "give a TASK or --next (the best ready task), not both"
                              if args.next_task else "is missing: give a TASK, or --next for "
                              "the best ready task")
    if not args.next_task and (args.labels or args.wait is not None):
        raise ValidationError("next", "--label and --wait choose a task: use them with --next")
    owner = _owner(args, required=True)
    assert owner is not None
    if args.next_task:
        return run_next(registry(args), cmd, RunOptions(
            owner=owner, ttl=args.ttl, note=args.note, take_stale=args.take_stale,
            json_out=out.json, grace=args.grace, timeout=args.timeout,
            labels=tuple(args.labels), wait=args.wait, paths=tuple(args.paths or ()),
            shared_paths=tuple(args.shared or ())))
    return run_command(registry(args), args.task, owner=owner, ttl=args.ttl,
                       note=args.note, take_stale=args.take_stale, cmd=cmd, json_out=out.json,
                       grace=args.grace, timeout=args.timeout,
                       paths=tuple(args.paths or ()), shared_paths=tuple(args.shared or ()))


def cmd_mcp(args: argparse.Namespace, out: Out) -> int:
    owner = _owner(args, required=True)
    assert owner is not None
    _explicit_registry(args)
    try:
        from ..agents import mcp_server
    except ImportError as exc:
        raise FleetclaimsError(
            f"the MCP server needs the MCP SDK, which is not installed ({exc}).",
            hint="Install the extra: pip install 'fleetclaims[mcp]'.") from None
    mcp_server.serve(registry(args), owner, keepalive=args.keepalive)
    return EXIT_OK


def _explicit_registry(args: argparse.Namespace) -> None:
    """Refuse to serve a registry chosen silently: MCP clients pass no environment and may start
    the server in ``/``, where the default would be the user's own registry, not the project's."""
    from pathlib import Path

    from ..location import git_main_worktree

    if args.dir or os.environ.get("FLEETCLAIMS_DIR") or os.environ.get("FLEETCLAIMS_URL"):
        return
    if git_main_worktree(Path.cwd()) is None:
        raise ValidationError(
            "dir", f"is required: the server runs in {os.getcwd()}, which is not inside a git "
            "repository, so it would serve a registry of its own choosing. Pass --dir "
            "/path/to/repo/.cache/fleetclaims (or a postgresql:// URL) in the client's "
            "configuration, or set FLEETCLAIMS_DIR")


def cmd_guard(args: argparse.Namespace, out: Out) -> int:
    from ..agents import guard

    found = guard.claim_env(os.environ)
    if found is None:  # not in a claimed run: only the paths others reserved to check
        result = guard.GuardResult(True)
    elif isinstance(found, guard.ClaimEnv):
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
    if result.ok and args.hook in ("pre-commit", "pre-push"):
        result = _paths_guard(args)
    if out.json:
        out.doc(result.to_dict())
    if not result.ok:
        what = {"pre-commit": "commit", "pre-push": "push"}.get(args.hook or "", "work")
        sys.stderr.write(f"fleetclaims guard: {what} refused: {result.reason.rstrip('.')}.\n"
                         f"{result.next_action}\n")
    return exit_code(result.code)


def _paths_guard(args: argparse.Namespace) -> GuardResult:
    """The staged (pre-commit) or pushed (pre-push) paths against others' reservations."""
    from ..agents import guard_paths
    from ..location import is_url, resolve

    def open_registry() -> Registry | None:
        location = resolve(args.dir)
        if not is_url(location) and not os.path.isdir(location):
            return None
        return registry(args, create=False)  # read only: a hook never creates a registry

    refs = sys.stdin.read() if args.hook == "pre-push" and args.remote else ""
    return guard_paths.hook_check(open_registry, args.hook, os.environ, refs, args.remote)


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
                 "is lost, and any commit or push touching paths another claim reserved")
    return EXIT_OK


def cmd_brief(args: argparse.Namespace, out: Out) -> int:
    import time

    from ..agents import brief
    from .output import with_damage

    reg = reader(args)
    doc = brief.build(reg, _owner(args, required=False), time.time())
    if out.json:
        out.doc(with_damage(doc, reg))
    else:
        out.line(brief.render(doc))
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "run": cmd_run, "mcp": cmd_mcp, "guard": cmd_guard, "hooks": cmd_hooks, "brief": cmd_brief,
}
