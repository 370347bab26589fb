"""``fleetclaims sync``: share this registry through the repository's git remote; and the
``--remote`` option of the claim commands (a lease kept on the remote, see fleetclaims.sync)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..core.errors import shown_remote
from .args import AddParser, Handler, registry
from .output import EXIT_OK

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..api import Registry
    from ..core.merge_paths import PathConflict
    from .output import Out

EXAMPLES = {
    "sync": "fleetclaims sync            # the branch's remote, else origin\n  "
    "fleetclaims sync upstream --json",
}


def remote_option(p: argparse.ArgumentParser) -> None:
    """``--remote [REMOTE]``: also take/rotate the lease on a git remote."""
    p.add_argument("--remote", nargs="?", const="", default=None, metavar="REMOTE",
                   help="hold the lease on this git remote too, by an atomic ref update "
                   "(without a name: the branch's remote, else origin)")


def remote_arg(args: argparse.Namespace, reg: Registry) -> str | None:
    """The remote named by ``--remote`` (None: the option was not given)."""
    remote: str | None = getattr(args, "remote", None)
    if remote == "":  # given without a name
        from ..sync.gitrefs import Git, repository_of

        return Git(repository_of(reg.location)).default_remote()
    return remote


def add_parsers(add: AddParser) -> None:
    p = add("sync", "publish this registry to the git remote and merge the other clones'")
    p.add_argument("remote", nargs="?", default=None,
                   help="a git remote name or URL (default: the branch's remote, else origin)")
    p.add_argument("--actor", default="sync", help="who is recorded as merging")
    p.add_argument("--accept-rewritten", action="store_true",
                   help="go on although a fleetclaims ref on the remote was force-pushed or "
                   "deleted (the local registry is kept whole and published again)")
    p.add_argument("--check-fences", action="store_true",
                   help="(the pre-push hook) read `TASK fence N` lines (Claim trailers of the "
                   "commits being pushed) on stdin; refuse one below the task's lease on REMOTE")


def cmd_sync(args: argparse.Namespace, out: Out) -> int:
    if args.check_fences:
        return _check_fences(args, out)
    report = registry(args).sync(args.remote, actor=args.actor,
                                 accept_rewritten=args.accept_rewritten)
    if out.json:
        out.doc(report.to_dict())
        return EXIT_OK
    out.line(f"synced with {shown_remote(report.remote)}: {len(report.merged)} registries merged, "
             f"{report.imported_events} events imported, {len(report.changed)} claims changed, "
             + (f"published {report.published[:12]}" if report.published else
                "nothing new to publish"))
    if report.restored:
        out.line(f"  this registry's folder was emptied: its {report.restored} journal lines "
                 "came back from the remote")
    for c in report.conflicts:
        out.line(f"  {c.task}: {c.winner} (fence {c.winner_fence}) wins over {c.loser} "
                 f"(fence {c.loser_fence}) by {c.rule}; see `fleetclaims explain {c.task}`")
    for line in path_conflict_lines(report.path_conflicts):
        out.line(line)
    for what in report.skipped:
        out.line(f"  not merged (accepted): {what}")
    return EXIT_OK


def path_conflict_lines(found: Sequence[PathConflict]) -> list[str]:
    """One line per reservation a merge took from a claim (merge_paths)."""
    return [f"  {c.loser_task}: {c.loser} no longer reserves {', '.join(c.dropped)}: it "
            f"overlapped {c.winner}'s reservation for {c.winner_task!r} (granted apart; "
            f"{c.winner} wins by {c.rule})" for c in found]


def _check_fences(args: argparse.Namespace, out: Out) -> int:
    import sys

    from ..agents.guard import check_fences
    from ..sync.gitrefs import Git, repository_of
    from .output import exit_code

    repo = repository_of(".")
    result = check_fences(repo, args.remote or Git(repo).default_remote(), sys.stdin.read())
    if out.json:
        out.doc(result.to_dict())
    if not result.ok:
        sys.stderr.write(f"fleetclaims guard: push refused: {result.reason.rstrip('.')}.\n"
                         f"{result.next_action}\n")
    return exit_code(result.code)


COMMANDS: dict[str, Handler] = {"sync": cmd_sync}

__all__ = ["COMMANDS", "EXAMPLES", "add_parsers", "remote_arg", "remote_option"]
