"""The command line: argument parsing, output formatting and exit codes. No rules live here."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

from ..core.durations import format_duration, iso, parse_duration, parse_instant, relative
from ..core.errors import (
    EXIT_CONFLICT,
    EXIT_DAMAGED,
    EXIT_ERROR,
    EXIT_NOT_HOLDER,
    EXIT_OK,
    EXIT_USAGE,
    FleetclaimsError,
    ValidationError,
)

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.model import Claim

VERSION = "0.1.0"

EPILOG = """\
exit codes: 0 ok, 1 error, 2 usage, 3 conflict, 4 not holder / expired / superseded,
            5 registry damaged
registry:   --dir DIR or postgresql://URL; else FLEETCLAIMS_URL, FLEETCLAIMS_DIR, the git
            repository's .cache/fleetclaims/, or the user state directory
"""

EXAMPLES: dict[str, str] = {
    "claim": "fleetclaims claim issue-42 --owner agent-a --ttl 10m --note 'fixing the parser'",
    "renew": "fleetclaims renew issue-42 --token $FLEETCLAIMS_TOKEN --ttl 10m",
    "release": "fleetclaims release issue-42 --token $TOKEN\n  "
    "fleetclaims release issue-42 --force --reason 'agent crashed, workspace wiped'",
    "complete": "fleetclaims complete issue-42 --token $TOKEN --result '{\"pr\": 17}'",
    "recover": "fleetclaims recover issue-42 --owner agent-b --reason 'agent-a died'",
    "transition": "fleetclaims transition issue-42 --token $TOKEN --phase review  # parked",
    "handoff": "fleetclaims handoff issue-42 --token $TOKEN --to agent-b --note 'your turn'",
    "reopen": "fleetclaims reopen issue-42 --reason 'regression found'",
    "show": "fleetclaims show issue-42 --json",
    "list": "fleetclaims list --owner agent-a --all",
    "stats": "fleetclaims stats",
    "events": "fleetclaims events --after 120 --limit 50 --type claim_rejected",
    "sweep": "fleetclaims sweep --dry-run",
    "merge": "fleetclaims merge /media/usb/laptop-registry",
    "explain": "fleetclaims explain issue-42",
    "doctor": "fleetclaims doctor            # report only\n  fleetclaims doctor --fix      "
    "# repair; damaged bytes go to quarantine/",
    "audit": "fleetclaims audit --task issue-42 --since 2h\n  fleetclaims audit --follow --json\n"
    "  fleetclaims audit verify\n  fleetclaims audit export --format csv > audit.csv\n"
    "  fleetclaims audit report --html timeline.html",
    "run": "fleetclaims run issue-42 --owner agent-a --ttl 5m -- make test",
    "migrate": "fleetclaims migrate --from .cache/fleetclaims --to postgresql://me@db/claims",
    "db": "fleetclaims db migrate --dir postgresql://me@db/claims",
}


# --- output ------------------------------------------------------------------------------------


class Out:
    def __init__(self, json_mode: bool, stream: TextIO | None = None) -> None:
        self.json = json_mode
        self.stream = stream or sys.stdout
        self.color = (
            not json_mode and self.stream.isatty() and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb"
        )

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")

    def doc(self, data: Any) -> None:
        import orjson  # 10x faster than json for a 10,000-claim listing

        raw = orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
        buffer = getattr(self.stream, "buffer", None)
        if buffer is not None:
            self.stream.flush()
            buffer.write(raw)
            buffer.flush()
        else:
            self.stream.write(raw.decode())

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if not rows:
            return
        widths = [len(h) for h in headers]
        for row in rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))
        self.line(self.paint("  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip(),
                             "1"))
        for row in rows:
            self.line("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())


def _err(out_json: bool, exc: FleetclaimsError) -> int:
    if out_json:
        import json

        sys.stdout.write(json.dumps(exc.to_dict(), ensure_ascii=False) + "\n")
    sys.stderr.write(f"fleetclaims: {exc}\n")
    return exc.exit_code


def claim_doc(c: Claim, now: float) -> dict[str, Any]:
    data = c.to_dict(with_token=True)
    for key in ("boot_deadline", "deadline_boot", "retired", "eid"):
        data.pop(key, None)
    data["expires_in"] = None if c.expires_at is None else round(c.expires_at - now, 3)
    return data


_DOC_HIDDEN = ("boot_deadline", "deadline_boot", "retired", "eid")


def _data_doc(data: dict[str, Any], now: float) -> dict[str, Any]:
    """claim_doc() made in place from a dict of Registry.claims_data() (new, with every
    optional member): the same members in the same form (a cold `list --json` does this for
    every claim of the registry)."""
    pop = data.pop
    for key in _DOC_HIDDEN:
        pop(key, None)
    expires = data["expires_at"]
    data["expires_in"] = None if expires is None else round(expires - now, 3)
    return data


def _claim_rows(claims: Sequence[Claim], now: float,
                stale: Callable[[Claim], str | None] | None = None) -> list[list[str]]:
    rows = []
    for c in claims:
        why = stale(c) if stale is not None and c.live else None
        if why is not None and c.state == "active" and why.startswith("owner dead"):
            exp = "STALE: " + why  # the lease still runs, but its owner is gone
        elif c.state == "active":
            exp = "parked" if c.expires_at is None else (
                "expired " + relative(c.expires_at, now) if c.expires_at <= now
                else "expires " + relative(c.expires_at, now))
        else:
            exp = c.state + " " + relative(c.ended_at, now)
        rows.append([c.task, c.owner, str(c.fence), c.phase, c.state, exp, c.note or ""])
    return rows


# --- parser ------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--dir", default=default, metavar="DIR|URL",
                        help="registry directory or postgresql:// URL")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="machine-readable output (one JSON document; streams: one per line)")
    parser.add_argument("--durability", choices=("full", "process"),
                        default="full" if top else argparse.SUPPRESS,
                        help="full: survive power loss (default); process: skip fsync")
    parser.add_argument("--allow-unsafe-fs", action="store_true",
                        default=False if top else argparse.SUPPRESS,
                        help="allow network/FUSE/cloud-sync filesystems (locks may not work)")


def _dur(field: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, field)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


class _Parser(argparse.ArgumentParser):
    # Set by main() for a command line that asks for --json: a usage error is then a JSON
    # document on stdout as well, like every other error, so a program reading stdout learns
    # what went wrong.
    json_errors = False

    def error(self, message: str) -> NoReturn:
        hint = f"Run `{self.prog} --help` for usage."
        if self.json_errors:
            import json

            sys.stdout.write(json.dumps({"error": "usage", "message": message, "hint": hint},
                                        ensure_ascii=False) + "\n")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"fleetclaims: {message}\n{hint}\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, sized to the terminal as argparse sizes it but without
    ``shutil``: argparse makes a formatter for every argument added, and importing shutil (and
    the compression modules it brings) costs a cold command ~2 ms."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_columns() - 2 if width is None else width)


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Discarded:
    """Stands in for the parser of a subcommand that is not being run: its arguments are
    thrown away without building argparse actions (a cold command builds only its own)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        return None

    def add_mutually_exclusive_group(self, **kwargs: Any) -> _Discarded:
        return self


_DISCARD = _Discarded()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, the other subcommands are left out (a cold command should
    not pay for building twenty parsers)."""
    parser = _Parser(
        prog="fleetclaims",
        description="Claim tasks under a lease, hand them over, complete them, and recover the "
        "work of owners that died; every change goes to a hash-chained audit log.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"fleetclaims {VERSION}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        if only is not None and name != only:
            return cast(argparse.ArgumentParser, _DISCARD)
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog="example:\n  " + EXAMPLES.get(name, f"fleetclaims {name}"),
                           formatter_class=_Formatter)
        _common(p, top=False)
        return p

    def token(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("--token", default=None,
                       help="the token from claim (default: $FLEETCLAIMS_TOKEN)")

    p = add("claim", "claim a task under a lease")
    p.add_argument("task")
    p.add_argument("--owner", required=True, help="who claims it, e.g. agent-a")
    p.add_argument("--ttl", type=_dur("ttl"), default=600.0, help="lease length (default 10m)")
    p.add_argument("--note")
    p.add_argument("--priority", type=int, default=100, help="lower wins duplicates (default 100)")
    p.add_argument("--metadata", help="a JSON object stored with the claim")
    p.add_argument("--token", help="choose the token yourself (makes retries idempotent)")
    p.add_argument("--take-stale", action="store_true",
                   help="take the task over if its claim is stale (expired or owner dead)")
    p.add_argument("--preempt", action="store_true",
                   help="take a live claim if this one wins the resolver order (priority)")
    p.add_argument("--pid", type=int, default=None,
                   help="the owner's process (e.g. $$ in a shell script): when it dies the claim "
                   "is stale at once; without it the lease alone decides")

    p = add("renew", "extend your lease")
    p.add_argument("task")
    token(p)
    p.add_argument("--ttl", type=_dur("ttl"), help="new lease length (default: the claim's)")

    p = add("release", "give a task up (or force-release someone else's claim)")
    p.add_argument("task")
    token(p)
    p.add_argument("--force", action="store_true", help="release whoever holds it")
    p.add_argument("--reason", help="required with --force")
    p.add_argument("--actor", default=os.environ.get("USER", "operator"), help="who forces it")

    p = add("complete", "mark a task done")
    p.add_argument("task")
    token(p)
    p.add_argument("--result", help="JSON (or plain text) recorded with the completion")

    p = add("recover", "take over a stale claim (expired lease or dead owner)")
    p.add_argument("task")
    p.add_argument("--owner", required=True)
    p.add_argument("--reason", required=True)
    p.add_argument("--ttl", type=_dur("ttl"), default=600.0)
    p.add_argument("--note")

    p = add("transition", "move your claim to another phase (without --ttl: parked, no expiry)")
    p.add_argument("task")
    token(p)
    p.add_argument("--phase", required=True)
    p.add_argument("--ttl", type=_dur("ttl"))

    p = add("handoff", "hand your claim to another owner (new token, new fence)")
    p.add_argument("task")
    token(p)
    p.add_argument("--to", required=True, dest="to_owner")
    p.add_argument("--note")
    p.add_argument("--ttl", type=_dur("ttl"))

    p = add("reopen", "make a completed task claimable again")
    p.add_argument("task")
    p.add_argument("--reason", required=True)
    p.add_argument("--actor", default=os.environ.get("USER", "operator"))

    p = add("show", "show one task's claim")
    p.add_argument("task")

    p = add("list", "list claims (live ones by default)")
    p.add_argument("--owner")
    p.add_argument("--expired", action="store_true", help="include expired leases")
    p.add_argument("--completed", action="store_true", help="include completed tasks")
    p.add_argument("--all", action="store_true", help="include expired, completed and released")
    p.add_argument("--tasks", action="store_true",
                   help="list the work queue instead: every added task with its readiness")
    p.add_argument("--status", action="append", choices=("ready", "held", "pending", "blocked",
                   "completed"), help="with --tasks: only tasks in this state (repeatable)")

    add("stats", "counts of active, expired and completed claims, per owner, and of the "
        "work queue by readiness")

    p = add("events", "page through the audit events (see also: audit)")
    p.add_argument("--after", type=int, default=0, help="cursor: the last seq already seen")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--type", action="append", dest="types")
    p.add_argument("--task")

    p = add("sweep", "record lease_expired for expired leases and dead owners")
    p.add_argument("--dry-run", action="store_true", help="report only")
    p.add_argument("--actor", default="sweeper")

    p = add("merge", "merge another registry directory into this one")
    p.add_argument("other", help="the other registry directory")

    p = add("explain", "who holds a task and why, from the audit log")
    p.add_argument("task")

    p = add("doctor", "check the registry files; repair with --fix (never deletes data)")
    p.add_argument("--fix", action="store_true")

    p = add("audit", "review the audit log: filter, follow, verify, export, report")
    p.add_argument("action", nargs="?", choices=("list", "verify", "export", "report"),
                   default="list")
    p.add_argument("--task")
    p.add_argument("--owner")
    p.add_argument("--type", action="append", dest="types")
    p.add_argument("--since", help="ISO time or age (10m, 2h, 1d)")
    p.add_argument("--until", help="ISO time or age")
    p.add_argument("--after", type=int, default=0, help="cursor: the last seq already seen")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--follow", "-f", action="store_true", help="stream new events as committed")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="export format")
    p.add_argument("--html", metavar="FILE", help="report: write the HTML timeline here")
    p.add_argument("--output", "-o", metavar="FILE", help="export: write here instead of stdout")

    p = add("run", "claim a task, heartbeat while CMD runs, complete on exit 0, else release")
    p.add_argument("task")
    p.add_argument("--owner", required=True)
    p.add_argument("--ttl", type=_dur("ttl"), default=300.0, help="lease length (default 5m)")
    p.add_argument("--note")
    p.add_argument("--take-stale", action="store_true")

    p = add("migrate", "copy a registry (claims and the whole audit history) to another store")
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--to", dest="target", required=True)

    p = add("db", "database maintenance (PostgreSQL)")
    p.add_argument("action", choices=("migrate",))
    p.add_argument("--schema", help="PostgreSQL schema name (default fleetclaims)")

    # The work queue's and the agent-facing commands live in their own modules.
    from . import agents as cli_agents
    from . import queue as cli_queue

    cli_queue.add_parsers(add, EXAMPLES, _dur)
    cli_agents.add_parsers(add, EXAMPLES)
    return parser


# --- commands ----------------------------------------------------------------------------------


def _registry(args: argparse.Namespace, **extra: Any) -> Registry:
    from ..api import Registry

    return Registry(args.dir, durability=args.durability, allow_unsafe_fs=args.allow_unsafe_fs,
                    **extra)


def _token(args: argparse.Namespace) -> str:
    tok = args.token or os.environ.get("FLEETCLAIMS_TOKEN")
    if not tok:
        raise ValidationError("token", "is required: pass --token or set FLEETCLAIMS_TOKEN")
    return str(tok)


def _json_arg(field: str, text: str | None, *, plain_ok: bool) -> Any:
    if text is None:
        return None
    try:
        import json

        return json.loads(text)
    except ValueError:
        if plain_ok:
            return text
        raise ValidationError(field, "is not valid JSON", value=text) from None


def _show_claim(out: Out, c: Claim, verb: str) -> None:
    now = time.time()
    if out.json:
        out.doc(claim_doc(c, now))
        return
    if c.state != "active":
        exp = f"{c.state} {relative(c.ended_at, now)}"
    elif c.expires_at is None:
        exp = "no expiry (parked)"
    else:
        exp = f"expires {relative(c.expires_at, now)} ({iso(c.expires_at)})"
    out.line(f"{out.paint(verb, '32')} {c.task} for {c.owner}: fence {c.fence}, phase {c.phase}, "
             f"{exp}")
    if c.token:
        out.line(f"token: {c.token}")
        out.line("keep it secret; pass it to renew/complete/release (or set FLEETCLAIMS_TOKEN)")


def cmd_claim(args: argparse.Namespace, out: Out) -> int:
    reg = _registry(args)
    c = reg.claim(args.task, owner=args.owner, ttl=args.ttl, note=args.note,
                  priority=args.priority, token=args.token,
                  metadata=_json_arg("metadata", args.metadata, plain_ok=False),
                  take_stale=args.take_stale, preempt=args.preempt,
                  process=args.pid if args.pid is not None else False)
    _show_claim(out, c, "claimed")
    return EXIT_OK


def cmd_renew(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).renew(args.task, token=_token(args), ttl=args.ttl)
    _show_claim(out, c, "renewed")
    return EXIT_OK


def cmd_release(args: argparse.Namespace, out: Out) -> int:
    reg = _registry(args)
    if args.force:
        done = reg.release(args.task, force=True, reason=args.reason, actor=args.actor)
    else:
        done = reg.release(args.task, token=_token(args))
    if out.json:
        out.doc({"task": args.task, "released": done})
    else:
        out.line(f"released {args.task}" if done else
                 f"nothing live to release for {args.task} (already released, expired or done)")
    return EXIT_OK


def cmd_complete(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).complete(args.task, token=_token(args),
                                 result=_json_arg("result", args.result, plain_ok=True))
    _show_claim(out, c.with_token(None), "completed")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).recover(args.task, owner=args.owner, reason=args.reason, ttl=args.ttl,
                                note=args.note)
    _show_claim(out, c, "recovered")
    return EXIT_OK


def cmd_transition(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).transition(args.task, token=_token(args), phase=args.phase, ttl=args.ttl)
    _show_claim(out, c.with_token(None), "moved")
    return EXIT_OK


def cmd_handoff(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).handoff(args.task, token=_token(args), to_owner=args.to_owner,
                                note=args.note, ttl=args.ttl)
    _show_claim(out, c, "handed off")
    return EXIT_OK


def cmd_reopen(args: argparse.Namespace, out: Out) -> int:
    c = _registry(args).reopen(args.task, reason=args.reason, actor=args.actor)
    if out.json:
        out.doc({"task": args.task, "reopened": c is not None})
    else:
        out.line(f"reopened {args.task}" if c else f"{args.task} was not completed; nothing to do")
    return EXIT_OK


def cmd_show(args: argparse.Namespace, out: Out) -> int:
    reg = _registry(args)
    c = reg.get(args.task)
    queued = reg.task(args.task)
    now = time.time()
    queue_doc = None if queued is None else {
        "status": queued.status, "waits_for": list(queued.waits_for),
        "priority": queued.task.priority, "depends_on": list(queued.task.depends_on),
        "labels": list(queued.task.labels), "blocked": queued.task.blocked}
    if c is None:
        if out.json:
            out.doc({"task": args.task, "claim": None, "queue": queue_doc})
        elif queued is not None:
            waits = f", waits for {', '.join(queued.waits_for)}" if queued.waits_for else ""
            block = f": {queued.task.blocked}" if queued.task.blocked else ""
            out.line(f"{args.task} is queued and has never been claimed: "
                     f"{queued.status}{block}{waits}")
        else:
            out.line(f"{args.task} has never been claimed")
        return EXIT_OK
    stale = reg.is_stale(c) if c.live else None
    verdict = reg.verdict(c) if c.live else None
    if out.json:
        doc = claim_doc(c, now)
        doc["stale"] = stale
        doc["liveness"] = None if verdict is None else {"state": verdict.state,
                                                        "reasons": list(verdict.reasons)}
        doc["queue"] = queue_doc
        out.doc(doc)
        return EXIT_OK
    rows = [
        ("task", c.task), ("owner", c.owner), ("state", c.state), ("phase", c.phase),
        ("fence", str(c.fence)), ("priority", str(c.priority)),
        ("claimed", f"{relative(c.claimed_at, now)} ({iso(c.claimed_at)})"),
        ("renewed", f"{relative(c.renewed_at, now)}"),
        ("expires", "never (parked)" if c.expires_at is None
         else f"{relative(c.expires_at, now)} ({iso(c.expires_at)})"),
    ]
    if c.note:
        rows.append(("note", c.note))
    if c.identity is not None:
        rows.append(("process", f"pid {c.identity.pid} on {c.identity.host}"))
    if verdict is not None:
        rows.append(("owner is", f"{verdict.state} ({'; '.join(verdict.reasons)})"))
    if stale:
        rows.append(("stale", f"{stale}; take over with `fleetclaims recover {c.task} "
                              "--owner YOU --reason ...`"))
    if c.result is not None:
        import json

        rows.append(("result", json.dumps(c.result)))
    if queued is not None:
        rows.append(("queue", queued.status + (
            f", after {', '.join(queued.task.depends_on)}" if queued.task.depends_on else "")))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.line(f"{key.ljust(width)}  {value}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace, out: Out) -> int:
    if args.tasks:
        from .queue import show_tasks

        return show_tasks(args, out)
    reg = _registry(args)
    if out.json:
        now = time.time()
        docs = reg.claims_data(owner=args.owner, include_expired=args.expired or args.all,
                               include_completed=args.completed or args.all,
                               include_released=args.all)
        out.doc([_data_doc(d, now) for d in docs])
        return EXIT_OK
    claims = reg.claims(owner=args.owner, include_expired=args.expired or args.all,
                        include_completed=args.completed or args.all,
                        include_released=args.all)
    now = time.time()
    if out.json:
        out.doc([claim_doc(c, now) for c in claims])
        return EXIT_OK
    if not claims:
        out.line("no claims" + ("" if args.all else " (use --all to include finished ones)"))
        return EXIT_OK
    out.table(["TASK", "OWNER", "FENCE", "PHASE", "STATE", "LEASE", "NOTE"],
              _claim_rows(claims, now, reg.is_stale))
    return EXIT_OK


def cmd_stats(args: argparse.Namespace, out: Out) -> int:
    s = _registry(args).stats()
    if out.json:
        out.doc({"active": s.active, "expired": s.expired, "completed": s.completed,
                 "released": s.released, "seq": s.seq, "fence": s.fence,
                 "per_owner": {o: vars(v) for o, v in s.per_owner.items()},
                 "queue": s.queue})
        return EXIT_OK
    out.line(f"active {s.active}, expired {s.expired}, completed {s.completed}, "
             f"released {s.released}; journal at seq {s.seq}, last fence {s.fence}")
    if s.queue:
        out.line("queue: " + ", ".join(f"{n} {k}" for k, n in s.queue.items()))
    out.table(["OWNER", "ACTIVE", "EXPIRED", "COMPLETED"],
              [[o, str(v.active), str(v.expired), str(v.completed)]
               for o, v in s.per_owner.items()])
    return EXIT_OK


def _event_detail(e: dict[str, Any]) -> str:
    from ..core.explain import describe

    return describe(e)


def _print_events(out: Out, events: Sequence[dict[str, Any]], header: bool = True) -> None:
    if out.json:
        for e in events:
            out.doc(e)
        return
    rows = [[str(e["seq"]), iso(e.get("ts")), str(e.get("type")), str(e.get("task") or "-"),
             _event_detail(e)] for e in events]
    if header:
        out.table(["SEQ", "TIME", "TYPE", "TASK", "WHAT"], rows)
    else:
        for row in rows:
            out.line("  ".join(row))


def cmd_events(args: argparse.Namespace, out: Out) -> int:
    page = _registry(args).events(after=args.after, limit=args.limit, types=args.types,
                                  task=args.task)
    if out.json:
        out.doc({"events": [e.data for e in page.events], "next_cursor": page.next_cursor,
                 "more": page.more})
        return EXIT_OK
    _print_events(out, [e.data for e in page.events])
    out.line(f"next cursor: --after {page.next_cursor}" + ("" if page.more else " (end)"))
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace, out: Out) -> int:
    report = _registry(args).sweep(dry_run=args.dry_run, actor=args.actor)
    if out.json:
        out.doc({"dry_run": args.dry_run, "found": [
            {"task": i.task, "owner": i.owner, "fence": i.fence, "reason": i.reason}
            for i in report.found]})
        return EXIT_OK
    if not report.found:
        out.line("nothing stale")
    verb = "would mark" if args.dry_run else "marked"
    for item in report.found:
        out.line(f"{verb} {item.task} ({item.owner}, fence {item.fence}) stale: {item.reason}")
    return EXIT_OK


def cmd_merge(args: argparse.Namespace, out: Out) -> int:
    plan = _registry(args).merge(args.other)
    if out.json:
        out.doc({"imported": plan.imported, "changed": list(plan.changed),
                 "conflicts": [c.to_dict() for c in plan.conflicts],
                 "tasks_changed": list(plan.tasks_changed),
                 "task_conflicts": list(plan.task_conflicts),
                 "queue_cycles": [list(c) for c in plan.cycles]})
        return EXIT_OK
    if not plan.events:
        out.line("nothing new to merge")
        return EXIT_OK
    out.line(f"merged: {plan.imported} events imported, {len(plan.changed)} claims changed, "
             f"{len(plan.conflicts)} conflicts, {len(plan.tasks_changed)} queued tasks changed")
    for c in plan.conflicts:
        out.line(f"  {c.task}: {c.winner} (fence {c.winner_fence}) wins over {c.loser} "
                 f"(fence {c.loser_fence}) by {c.rule}")
    for task in plan.task_conflicts:
        out.line(f"  {task}: changed on both sides; the later change was kept")
    for loop in plan.cycles:
        out.line(f"  dependency loop {' -> '.join(loop)}: these tasks stay pending until one "
                 f"drops a dependency (fleetclaims add {loop[0]} --depends-on ...)")
    return EXIT_OK


def cmd_explain(args: argparse.Namespace, out: Out) -> int:
    x = _registry(args).explain(args.task)
    if out.json:
        out.doc(x.to_dict())
        return EXIT_OK
    head = {"held": f"held by {x.holder} (fence {x.fence})", "free": "free",
            "completed": "completed", "stale": f"stale (last holder {x.holder})"}.get(x.state,
                                                                                      x.state)
    out.line(f"{x.task}: {head}")
    out.line(f"because: {x.why}")
    if x.steps:
        out.line("")
        out.line("history:")
        for s in x.steps:
            out.line(f"  seq {s.seq:<6} {iso(s.ts)}  {s.text}")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace, out: Out) -> int:
    from ..location import is_url, resolve
    from ..store.file.doctor import main_report

    location = resolve(args.dir)
    if is_url(location):
        raise ValidationError("--dir", "doctor checks file registries; use `audit verify` for "
                                       "PostgreSQL")
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
        elif not args.fix:
            out.line("run `fleetclaims doctor --fix` to repair (damaged data goes to quarantine/)")
    return EXIT_OK if report.ok else EXIT_DAMAGED


def _audit_filters(args: argparse.Namespace) -> dict[str, Any]:
    now = time.time()
    return {
        "types": args.types,
        "task": args.task,
        "owner": args.owner,
        "since": None if args.since is None else parse_instant(args.since, now, "--since"),
        "until": None if args.until is None else parse_instant(args.until, now, "--until"),
    }


def cmd_audit(args: argparse.Namespace, out: Out) -> int:
    action = args.action
    if action == "verify":
        return _audit_verify(args, out)
    reg = _registry(args)
    filters = _audit_filters(args)
    if action in ("export", "report"):
        # A report needs the whole journal (a holding may start before --since); its filters
        # choose what is drawn. An export is filtered like `audit`.
        events = _all_events(reg, args.after, filters if action == "export" else {})
        if action == "export":
            from ..review.report import to_csv, to_jsonl

            text = to_csv(events) if args.format == "csv" else to_jsonl(events)
            if args.output:
                with open(args.output, "w", encoding="utf-8", newline="") as fh:
                    fh.write(text)
                sys.stderr.write(f"wrote {len(events)} events to {args.output}\n")
            else:
                sys.stdout.write(text)
            return EXIT_OK
        if not args.html:
            raise ValidationError("--html", "is required: audit report --html FILE")
        from ..review.report import render_html

        html = render_html(events, title=f"fleetclaims audit — {reg.location}",
                           generated_at=time.time(),
                           tasks=None if args.task is None else [args.task],
                           since=filters["since"], until=filters["until"])
        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(html)
        if out.json:
            out.doc({"html": args.html, "events": len(events)})
        else:
            out.line(f"wrote {args.html} ({len(events)} events)")
        return EXIT_OK
    cursor = args.after
    page = reg.events(after=cursor, limit=args.limit, **filters)
    if out.json and not args.follow:  # one document; only the --follow stream is line by line
        out.doc({"events": [e.data for e in page.events], "next_cursor": page.next_cursor,
                 "more": page.more})
        return EXIT_OK
    _print_events(out, [e.data for e in page.events], header=not args.follow)
    if not args.follow:
        if not out.json:
            out.line(f"next cursor: --after {page.next_cursor}" + (
                "" if page.more else " (end)"))
        return EXIT_OK
    cursor = page.next_cursor
    try:
        while True:
            page = reg.events(after=cursor, limit=1000, **filters)
            if page.events:
                _print_events(out, [e.data for e in page.events], header=False)
                out.stream.flush()
            if page.next_cursor == cursor:
                time.sleep(0.2)
            cursor = page.next_cursor
    except KeyboardInterrupt:
        return EXIT_OK


def _all_events(reg: Registry, after: int, filters: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cursor = after
    while True:
        page = reg.events(after=cursor, limit=100_000, **filters)
        events.extend(e.data for e in page.events)
        if not page.more:
            return events
        cursor = page.next_cursor


def _audit_verify(args: argparse.Namespace, out: Out) -> int:
    reg = _registry(args)
    show = sys.stderr.isatty() and not out.json

    def progress(done: int, total: int) -> None:
        if show and total:
            sys.stderr.write(f"\rverifying {done * 100 // total:3d}% ({done}/{total} bytes)")
            sys.stderr.flush()

    started = time.perf_counter()
    report = reg.store.verify(progress)
    elapsed = time.perf_counter() - started
    if show:
        sys.stderr.write("\n")
    if out.json:
        doc = {"ok": report.ok, "events": report.events, "bytes": report.bytes,
               "head": report.head, "error": report.error, "seq": report.seq,
               "offset": report.offset, "snapshot_anchored": report.anchor_ok,
               "torn_tail_bytes": report.torn_tail, "seconds": round(elapsed, 3)}
        out.doc(doc)
    elif report.ok and report.anchor_ok is False:
        out.line(out.paint("DAMAGED", "31;1") + f": the journal verifies ({report.events} events, "
                 f"head {report.head[:16]}…) but the snapshot claims.json does not match it: "
                 f"{report.error or 'not anchored in the journal'}")
        out.line("run `fleetclaims doctor --fix` to rebuild the snapshot from the journal "
                 "(the old one goes to quarantine/)")
    elif report.ok:
        anchor = {None: "no snapshot", True: "snapshot anchored"}[report.anchor_ok]
        out.line(f"ok: {report.events} events verified ({report.bytes} bytes, "
                 f"{format_duration(elapsed)}), head {report.head[:16]}…, {anchor}")
        if report.torn_tail:
            out.line(f"note: {report.torn_tail} bytes of an incomplete last line (a writer died "
                     "mid-append); the next write repairs it")
    else:
        out.line(out.paint("DAMAGED", "31;1") + f": first break at seq {report.seq}, byte "
                 f"offset {report.offset}: {report.error}")
        out.line("run `fleetclaims doctor --fix` to salvage the verified prefix "
                 "(the rest goes to quarantine/)")
    if not report.ok or report.anchor_ok is False:
        return EXIT_DAMAGED
    return EXIT_OK


def cmd_run(args: argparse.Namespace, out: Out) -> int:
    from ..agents.runner import run_command

    cmd = list(args.cmd or [])
    if not cmd:
        raise ValidationError("CMD", "is missing: fleetclaims run TASK --owner O -- CMD ARGS...")
    return run_command(_registry(args), args.task, owner=args.owner, ttl=args.ttl,
                       note=args.note, take_stale=args.take_stale, cmd=cmd, json_out=out.json)


def cmd_migrate(args: argparse.Namespace, out: Out) -> int:
    from ..review.migrate import copy_registry

    r = copy_registry(args.source, args.target)
    if out.json:
        out.doc({"source": r.source, "target": r.target, "events": r.events, "head": r.head,
                 "claims": r.claims, "verified": r.verify.ok})
    else:
        out.line(f"copied {r.events} events and {r.claims} claims from {r.source} to {r.target}; "
                 f"head {r.head[:16]}…, audit verify {'ok' if r.verify.ok else 'FAILED'}")
    return EXIT_OK


def cmd_db(args: argparse.Namespace, out: Out) -> int:
    reg = _registry(args, schema=args.schema)
    migrate = getattr(reg.store, "migrate_schema", None)
    if migrate is None:
        raise ValidationError("--dir", "db migrate needs a postgresql:// registry")
    version = migrate()
    if out.json:
        out.doc({"schema_version": version})
    else:
        out.line(f"schema at version {version}")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, Out], int]] = {
    "claim": cmd_claim, "renew": cmd_renew, "release": cmd_release, "complete": cmd_complete,
    "recover": cmd_recover, "transition": cmd_transition, "handoff": cmd_handoff,
    "reopen": cmd_reopen, "show": cmd_show, "list": cmd_list, "stats": cmd_stats,
    "events": cmd_events, "sweep": cmd_sweep, "merge": cmd_merge, "explain": cmd_explain,
    "doctor": cmd_doctor, "audit": cmd_audit, "run": cmd_run, "migrate": cmd_migrate,
    "db": cmd_db,
}


def all_commands() -> dict[str, Callable[[argparse.Namespace, Out], int]]:
    from . import agents as cli_agents
    from . import queue as cli_queue

    return {**COMMANDS, **cli_queue.COMMANDS, **cli_agents.COMMANDS}


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (skipping global options and their values)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--dir", "--durability"):
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg if arg in all_commands() else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(argv))
    # Everything after the first "--" is the command of `run`, never options of ours.
    cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1 :]
    _Parser.json_errors = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors, as a return value
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        _Parser.json_errors = False
    args.cmd = cmd
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    out = Out(bool(args.json))
    try:
        return all_commands()[args.command](args, out)
    except FleetclaimsError as exc:
        return _err(out.json, exc)
    except KeyboardInterrupt:
        sys.stderr.write("fleetclaims: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:
        sys.stderr.write(f"fleetclaims: {exc}\nCheck the path and permissions, then retry.\n")
        return EXIT_ERROR


__all__ = ["EXIT_CONFLICT", "EXIT_NOT_HOLDER", "all_commands", "build_parser", "main"]
