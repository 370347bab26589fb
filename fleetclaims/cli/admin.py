"""CLI commands that look after a registry as a whole: ``doctor``, ``init``, ``merge``,
``prune``, ``migrate`` and ``db``."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..core.errors import RegistryNotFound, ValidationError
from .args import AddParser, Handler, registry
from .output import EXIT_DAMAGED, EXIT_OK
from .sync import path_conflict_lines

if TYPE_CHECKING:
    from .output import Out

EXAMPLES = {
    "merge": "fleetclaims merge /media/usb/laptop-registry",
    "doctor": "fleetclaims doctor            # report only\n  fleetclaims doctor --fix      "
    "# repair; damaged bytes go to quarantine/",
    "migrate": "fleetclaims migrate --from .cache/fleetclaims --to postgresql://me@db/claims",
    "db": "fleetclaims db migrate --dir postgresql://me@db/claims",
    "init": "fleetclaims init\n  fleetclaims init --new-history   # after a deliberate reset",
    "prune": "fleetclaims prune --ended-before 90d --dry-run   # what would go\n"
    "  fleetclaims prune --ended-before 90d",
}


def add_parsers(add: AddParser) -> None:
    p = add("merge", "merge another registry directory into this one")
    p.add_argument("other", help="the other registry directory")

    p = add("doctor", "check the registry files; repair with --fix (never deletes data)")
    p.add_argument("--fix", action="store_true")

    p = add("init", "create the registry here, or start a new history after a lost one")
    p.add_argument("--new-history", action="store_true",
                   help="acknowledge a deliberate reset: the old journal and snapshot go to "
                   "quarantine/ and fences start above every fence recorded before")

    p = add("prune", "remove the records of claims that ended long ago from the live state "
            "(recorded; completed tasks stay refused to claim until reopened)")
    p.add_argument("--ended-before", required=True, metavar="AGE",
                   help="prune claims that ended more than AGE ago (e.g. 90d, 12h)")
    p.add_argument("--dry-run", action="store_true", help="say what would be pruned, change "
                   "nothing")
    p.add_argument("--actor", default="fleetclaims", help="who prunes (recorded)")

    p = add("migrate", "copy a registry (claims and the whole audit history) to another store")
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--to", dest="target", required=True)

    p = add("db", "database maintenance (PostgreSQL)")
    p.add_argument("action", choices=("migrate",))
    p.add_argument("--schema", help="PostgreSQL schema name (default fleetclaims)")


def cmd_merge(args: argparse.Namespace, out: Out) -> int:
    plan = registry(args).merge(args.other)
    if out.json:
        out.doc({"imported": plan.imported, "changed": list(plan.changed),
                 "conflicts": [c.to_dict() for c in plan.conflicts],
                 "tasks_changed": list(plan.tasks_changed),
                 "task_conflicts": list(plan.task_conflicts),
                 "queue_cycles": [list(c) for c in plan.cycles],
                 "path_conflicts": [c.to_dict() for c in plan.path_conflicts]})
        return EXIT_OK
    if not plan.events:
        out.line("nothing new to merge")
        return EXIT_OK
    out.line(f"merged: {plan.imported} events imported, {len(plan.changed)} claims changed, "
             f"{len(plan.conflicts)} conflicts, {len(plan.tasks_changed)} queued tasks changed")
    for c in plan.conflicts:
        out.line(f"  {c.task}: {c.winner} (fence {c.winner_fence}) wins over {c.loser} "
                 f"(fence {c.loser_fence}) by {c.rule}")
    for line in path_conflict_lines(plan.path_conflicts):
        out.line(line)
    for task in plan.task_conflicts:
        out.line(f"  {task}: changed on both sides; the later change was kept")
    for loop in plan.cycles:
        out.line(f"  dependency loop {' -> '.join(loop)}: these tasks stay pending until one "
                 f"drops a dependency (fleetclaims add {loop[0]} --after ... naming the ones "
                 "it keeps, or --no-after)")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace, out: Out) -> int:
    from ..location import is_url, resolve
    from ..store.file.doctor import main_report

    location = resolve(args.dir)
    if is_url(location):
        raise ValidationError("--dir", "doctor checks file registries; use `audit verify` for "
                                       "PostgreSQL")
    if args.dir is not None and not os.path.lexists(location):
        from pathlib import Path

        from ..store.file import anchor

        # A mistyped --dir is an error, not a healthy registry that is not there; a folder the
        # anchor says held one was removed: reported (history_lost, exit 5).
        if anchor.read(Path(location).absolute()) is None:
            raise RegistryNotFound(location, "the directory does not exist")
    report = main_report(location, fix=args.fix)
    if out.json:
        out.doc(report.to_dict())
    else:
        for f in report.findings:
            if f.severity in ("warning", "info"):
                mark = f.severity
            else:
                mark = "fixed" if f.fixed else ("ok" if f.kind == "ok" else "PROBLEM")
            out.line(f"[{mark}] {f.message}")
        if report.ok:
            out.line("registry is healthy" if not args.fix else "registry is healthy now")
        elif not args.fix and any(not f.fixed and f.severity == "error"
                                  and f.kind != "segment_damaged" for f in report.findings):
            # (sealed damage alone: its finding says what repairs it; --fix would not)
            out.line("run `fleetclaims doctor --fix` to repair (damaged data goes to quarantine/)")
    # The exit status is the command line's to decide (output.EXIT_CODES), from the report.
    return EXIT_OK if report.ok else EXIT_DAMAGED


def cmd_init(args: argparse.Namespace, out: Out) -> int:
    from ..location import is_url, resolve

    location = resolve(args.dir)
    if args.new_history:
        if is_url(location):
            raise ValidationError("--new-history", "is for file registries")
        from pathlib import Path

        from ..store.file.doctor_history import new_history

        done = new_history(Path(location))
        if out.json:
            out.doc({"registry": location, **done})
        else:
            out.line(f"new history {done['origin']} at {location}: fences start above "
                     f"{done['fence_floor']}"
                     + (f" (previous history {done['previous_origin']})"
                        if done["previous_origin"] else ""))
            for name in done["quarantined"]:
                out.line(f"  kept in quarantine/: {name}")
        return EXIT_OK
    from ..core.rules import Decision

    # An empty transaction: creates the registry (its registry_created line) if there is
    # none; refuses a lost history (HistoryLost) like any write.
    reg = registry(args)
    _, state = reg.store.transact(lambda state, now: Decision(()))
    location = str(reg.location)  # (a URL as shown: without its password)
    if out.json:
        out.doc({"registry": location, "origin": state.origin, "seq": state.seq,
                 "head": state.head, "fence": state.fence})
    else:
        out.line(f"registry {state.origin or '(new)'} at {location}: seq {state.seq}, "
                 f"fence {state.fence}")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace, out: Out) -> int:
    from ..core.durations import iso

    report = registry(args).prune(args.ended_before, actor=args.actor, dry_run=args.dry_run)
    if out.json:
        out.doc({**report.to_dict(), "dry_run": args.dry_run})
        return EXIT_OK
    what = "would prune" if args.dry_run else "pruned"
    out.line(f"{what} the records of {len(report.released)} released and "
             f"{len(report.completed)} completed claims that ended before {iso(report.before)}"
             + ("" if args.dry_run or not report.count else
                " (completed tasks stay refused to claim until reopened; the journal keeps "
                "their history)"))
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace, out: Out) -> int:
    from .._open import require_registry
    from ..location import is_url, resolve
    from ..review.migrate import copy_registry

    source = resolve(args.source)
    if not is_url(source):
        require_registry(source)  # before anything is opened or created at --to

    r = copy_registry(args.source, args.target)
    if out.json:
        out.doc({"source": r.source, "target": r.target, "events": r.events, "head": r.head,
                 "claims": r.claims, "verified": r.verify.ok})
    else:
        out.line(f"copied {r.events} events and {r.claims} claims from {r.source} to {r.target}; "
                 f"head {r.head[:16]}…, audit verify {'ok' if r.verify.ok else 'FAILED'}")
    return EXIT_OK


def cmd_db(args: argparse.Namespace, out: Out) -> int:
    reg = registry(args, schema=args.schema)
    migrate = getattr(reg.store, "migrate_schema", None)
    if migrate is None:
        raise ValidationError("--dir", "db migrate needs a postgresql:// registry")
    version = migrate()
    if out.json:
        out.doc({"schema_version": version})
    else:
        out.line(f"schema at version {version}")
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "merge": cmd_merge, "doctor": cmd_doctor, "init": cmd_init, "migrate": cmd_migrate,
    "db": cmd_db, "prune": cmd_prune,
}
