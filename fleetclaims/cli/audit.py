"""CLI commands that read the audit log: ``events`` (a cursor over it), ``explain`` (one
task's story), ``audit`` (filter, follow, verify, export, report) and ``top`` (a live view)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.durations import format_duration, iso, parse_instant
from ..core.errors import FleetclaimsError, ValidationError
from .args import AddParser, Handler, reader
from .output import EXIT_DAMAGED, EXIT_OK, print_events, with_damage, write_private

if TYPE_CHECKING:
    from ..api import Registry
    from ..store.base import VerifyReport
    from .output import Out

EXAMPLES = {
    "events": "fleetclaims events --after 120 --limit 50 --type claim_rejected",
    "explain": "fleetclaims explain issue-42",
    "audit": "fleetclaims audit --task issue-42 --since 2h\n  fleetclaims audit --follow --json\n"
    "  fleetclaims audit verify\n  fleetclaims audit export --format csv > audit.csv\n"
    "  fleetclaims audit report --html report.html --since 1d",
    "top": "fleetclaims top\n  fleetclaims top --owner agent-a --once",
}


def add_parsers(add: AddParser) -> None:
    p = add("events", "page through the audit events (see also: audit)")
    p.add_argument("--after", type=int, default=0, help="cursor: the last seq already seen")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--type", action="append", dest="types")
    p.add_argument("--task")

    p = add("explain", "who holds a task and why, from the audit log")
    p.add_argument("task")

    p = add("audit", "review the audit log: filter, follow, verify, export, report")
    p.add_argument("action", nargs="?",
                   choices=("list", "verify", "export", "report", "anchor", "archive"),
                   default="list")
    p.add_argument("--before", metavar="AGE",
                   help="archive: move sealed journal segments whose events are all older than "
                   "AGE (90d, 12h) out of segments/")
    p.add_argument("--to", metavar="DIR",
                   help="archive: where to move them (default: the registry's archive/ folder)")
    p.add_argument("--with", dest="with_dir", metavar="DIR",
                   help="verify: also check the segments archived to DIR against the anchor")
    p.add_argument("--anchor", metavar="SEQ:HASH",
                   help="verify: prove the journal still holds this head (from `audit anchor`)")
    p.add_argument("--key", action="store_true",
                   help="anchor: make your key (0600, user state dir) that seals the anchors "
                   "of your registries with an HMAC, so a re-sealed forgery without it is found")
    p.add_argument("--task")
    p.add_argument("--owner")
    p.add_argument("--type", action="append", dest="types")
    p.add_argument("--since", help="ISO time or age (10m, 2h, 1d)")
    p.add_argument("--until", help="ISO time or age")
    p.add_argument("--after", type=int, default=0, help="cursor: the last seq already seen")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--follow", "-f", action="store_true", help="stream new events as committed")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", help="export format")
    p.add_argument("--html", metavar="FILE",
                   help="report: write the HTML report here (- for stdout)")
    p.add_argument("--output", "-o", metavar="FILE", help="export: write here instead of stdout")


    p = add("top", "a live view: held tasks, time left, waiters, recent events (q quits)")
    p.add_argument("--owner", help="show only this owner's claims (key o cycles)")
    p.add_argument("--label", help="show only tasks with this label (key l cycles)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")


def cmd_top(args: argparse.Namespace, out: Out) -> int:
    from ..review.top import document, run  # terminal handling is imported by top only

    reg = reader(args)
    if out.json:
        out.doc(with_damage(document(reg, str(reg.location)), reg))
        return EXIT_OK
    return run(reg, str(reg.location), owner=args.owner, label=args.label, once=args.once)


def cmd_events(args: argparse.Namespace, out: Out) -> int:
    reg = reader(args)
    page = reg.events(after=args.after, limit=args.limit, types=args.types, task=args.task)
    if out.json:
        out.doc(with_damage({"events": [e.data for e in page.events],
                             "next_cursor": page.next_cursor, "more": page.more}, reg))
        return EXIT_OK
    print_events(out, [e.data for e in page.events])
    out.line(f"next cursor: --after {page.next_cursor}" + ("" if page.more else " (end)"))
    return EXIT_OK


def cmd_explain(args: argparse.Namespace, out: Out) -> int:
    reg = reader(args)
    x = reg.explain(args.task)
    if out.json:
        out.doc(with_damage(x.to_dict(), reg))
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
    if args.html is not None and args.action != "report":
        raise ValidationError("--html", f"belongs to `audit report` (not `audit {args.action}`): "
                              f"fleetclaims audit report --html {args.html}")
    if args.key and args.action != "anchor":
        raise ValidationError("--key", "belongs to `audit anchor`: fleetclaims audit anchor --key")
    if args.anchor is not None and args.action != "verify":
        raise ValidationError("--anchor", "belongs to `audit verify`: fleetclaims audit verify "
                              f"--anchor {args.anchor}")
    if (args.before is not None or args.to is not None) and args.action != "archive":
        raise ValidationError("--before/--to", "belong to `audit archive`: fleetclaims audit "
                              "archive --before 90d [--to DIR]")
    if args.with_dir is not None and args.action != "verify":
        raise ValidationError("--with", "belongs to `audit verify`: fleetclaims audit verify "
                              f"--with {args.with_dir}")
    if args.action == "archive":
        return _audit_archive(args, out)
    if args.action == "verify":
        return _audit_verify(args, out)
    if args.action == "anchor":
        return _audit_anchor(args, out)
    reg = reader(args)
    filters = _audit_filters(args)
    if args.action == "export":
        return _audit_export(args, reg, filters)
    if args.action == "report":
        return _audit_report(args, out, reg, filters)
    return _audit_list(args, out, reg, filters)


def _audit_export(args: argparse.Namespace, reg: Registry, filters: dict[str, Any]) -> int:
    from ..review.report import to_csv, to_jsonl

    events = _all_events(reg, args.after, filters)
    text = to_csv(events) if args.format == "csv" else to_jsonl(events)
    if args.output:
        write_private(args.output, text)
        sys.stderr.write(f"wrote {len(events)} events to {args.output}\n")
    else:
        sys.stdout.write(text)
    # A damaged journal: the verified part is written and the damage named on stderr, but an
    # export feeds other systems, so its exit says the copy is not whole.
    return EXIT_DAMAGED if getattr(reg.store, "damage", None) is not None else EXIT_OK


def _audit_report(args: argparse.Namespace, out: Out, reg: Registry,
                  filters: dict[str, Any]) -> int:
    if not args.html:
        raise ValidationError("--html", "is required: audit report --html FILE (- for stdout)")
    # A report needs the whole journal (a holding may start before --since); its filters
    # choose what is drawn and counted, and are checked as audit's are (a malformed --owner
    # was an empty report, exit 0; a --type, misspelt or not, was ignored).
    from ..core import validate
    from ..review.report import render_html

    if filters["types"]:
        raise ValidationError("--type", "belongs to `audit` and `audit export`: a report draws "
                              "holdings from every event (choose with --task, --owner, --since, "
                              "--until)")
    if args.task is not None:
        validate.task(args.task)
    if args.owner is not None:
        validate.owner(args.owner)
    events = _all_events(reg, args.after, {})
    html = render_html(events, title=f"fleetclaims audit — {reg.location}",
                       generated_at=time.time(),
                       tasks=None if args.task is None else [args.task],
                       owners=None if args.owner is None else [args.owner],
                       since=filters["since"], until=filters["until"])
    if args.html == "-":
        sys.stdout.write(html)
        return EXIT_OK
    write_private(args.html, html)
    if out.json:
        out.doc(with_damage({"html": args.html, "events": len(events)}, reg))
    else:
        out.line(f"wrote {args.html} (drawn from the journal's {len(events)} events)")
    return EXIT_OK


def _audit_list(args: argparse.Namespace, out: Out, reg: Registry,
                filters: dict[str, Any]) -> int:
    page = reg.events(after=args.after, limit=args.limit, **filters)
    if out.json and not args.follow:  # one document; only the --follow stream is line by line
        out.doc(with_damage({"events": [e.data for e in page.events],
                             "next_cursor": page.next_cursor, "more": page.more}, reg))
        return EXIT_OK
    print_events(out, [e.data for e in page.events], header=not args.follow)
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
                print_events(out, [e.data for e in page.events], header=False)
                out.stream.flush()
            if page.next_cursor == cursor:
                if _reader_gone():  # (`| head -1`: else noticed only at the next event)
                    return EXIT_OK
                time.sleep(0.2)
            cursor = page.next_cursor
    except KeyboardInterrupt:
        return EXIT_OK


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end was closed (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # (POLLERR and POLLHUP are always reported)
        return any(flags & (select.POLLERR | select.POLLHUP) for _, flags in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # (no poll, or no descriptor: keep going)
        return False


def _all_events(reg: Registry, after: int, filters: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cursor = after
    while True:
        page = reg.events(after=cursor, limit=100_000, **filters)
        events.extend(e.data for e in page.events)
        if not page.more:
            return events
        cursor = page.next_cursor


def _audit_anchor(args: argparse.Namespace, out: Out) -> int:
    """The head (seq, hash) to record elsewhere (a commit trailer, a ticket)."""
    reg = reader(args)
    if args.key:
        from pathlib import Path

        from ..store.file import anchor as anchors

        path, made = anchors.create_key()
        directory = getattr(reg.store, "directory", None)
        if directory is not None:  # this registry's anchor sealed now, the others at their
            state = reg.store.read()  # next checkpoint
            anchors.record(Path(directory), state, force=True)
        sys.stderr.write(f"{'made' if made else 'using'} the key {path} (keep it 0600; it "
                         "seals your registries' anchors)\n")
    state = reg.store.read()
    if out.json:
        out.doc({"seq": state.seq, "head": state.head, "origin": state.origin,
                 "fence": state.fence, "anchor": f"{state.seq}:{state.head}"})
    else:
        out.line(f"{state.seq}:{state.head}")
    return EXIT_OK


def _parse_anchor(text: str) -> tuple[int, str]:
    seq, sep, digest = text.partition(":")
    if not (sep and seq.isdigit() and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest)):
        raise ValidationError("--anchor", "must be SEQ:HASH as `fleetclaims audit anchor` "
                              "prints it (a seq, a colon, 64 hex digits)", value=text)
    return int(seq), digest


def _anchor_held(reg: Any, seq: int, digest: str) -> str | None:
    """Why the journal does not hold line ``seq`` with hash ``digest``, or None."""
    if seq == 0:
        return None if digest == "0" * 64 else "seq 0 has no hash but the genesis"
    for event in reg.store.iter_events(after=seq - 1):
        if event.get("seq") != seq:
            break
        if event.get("hash") == digest:
            return None
        return f"line {seq} has hash {str(event.get('hash'))[:16]}…, not {digest[:16]}…"
    return f"the journal does not reach seq {seq}"


def _mirror_problem(reg: Any) -> str | None:
    """A file registry's own anchor (outside its folder): its head must be in the journal,
    and, with the user's key, its seal must hold."""
    directory = getattr(reg.store, "directory", None)
    if directory is None:
        return None
    from pathlib import Path

    from ..store.file import anchor as anchors

    found = anchors.read(Path(directory))
    if found is None:
        return None
    sealed = anchors.seal_problem(found)
    if sealed is not None:
        return sealed
    missing = _anchor_held(reg, found.seq, found.head)
    return None if missing is None else f"the registry's anchor {found.path}: {missing}"


def _store_refusal(reg: Any) -> str | None:
    """Why the store would refuse to work (a lost history, a sealed line that cannot be
    applied, a journal missing), or None: verify fails whenever the store would."""
    try:
        reg.store.read()
        damage = getattr(reg.store, "damage", None)
        if damage is not None:  # (a read shows the verified state; verify must not pass)
            return str(damage)
        # Every claim record built: a snapshot entry is decoded lazily, at first use.
        reg.claims(include_expired=True, include_completed=True, include_released=True)
    except FleetclaimsError as exc:
        return str(exc)
    return _mirror_problem(reg)


def _audit_archive(args: argparse.Namespace, out: Out) -> int:
    from ..core.durations import parse_duration
    from ..store.file import archive

    if args.before is None:
        raise ValidationError("--before", "is required: say how old the archived events must "
                              "be (fleetclaims audit archive --before 90d); nothing is archived "
                              "by default")
    before = parse_duration(args.before, "--before")
    reg = reader(args)
    if not hasattr(reg.store, "journal_path"):
        raise ValidationError("archive", "applies to a file registry's journal segments "
                              f"({reg.location} keeps its journal in a database)")
    done = archive.archive_registry(reg.store, before, None if args.to is None else
                                    _directory("--to", args.to))
    if out.json:
        out.doc(done)
    elif done["archived"]:
        out.line(f"archived {len(done['archived'])} segment(s) to {done['to']}: events up to "
                 f"seq {done['seq']} (anchor in segments/{archive.ANCHOR}; check them with "
                 f"`fleetclaims audit verify --with {done['to']}`)")
    else:
        out.line(f"nothing to archive: no sealed segment is older than {args.before}")
    return EXIT_OK


def _directory(option: str, text: str) -> Path:
    """A directory argument; an empty one (an unset shell variable) would be the current
    directory: refused, as for --dir."""
    if not text.strip():
        raise ValidationError(option, "is empty; name a directory (an unset shell variable?)")
    return Path(text)


def _verify_with(reg: Any, directory: str) -> dict[str, Any]:
    from ..store.file import archive

    path = _directory("--with", directory)
    if not path.is_dir():  # (a typo said "ok" when nothing had been archived yet)
        raise ValidationError("--with", "is not a directory: name the folder `audit archive "
                              "--to` copied the segments to", value=directory)
    return archive.verify_with(Path(str(reg.location)), path)


def _audit_verify(args: argparse.Namespace, out: Out) -> int:
    wanted = None if args.anchor is None else _parse_anchor(args.anchor)
    reg = reader(args)
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
    refusal = _store_refusal(reg) if report.ok else None
    missing = None if wanted is None or not report.ok else _anchor_held(reg, *wanted)
    archived = None if args.with_dir is None else _verify_with(reg, args.with_dir)
    stale = list(report.index_problems)
    if out.json:
        out.doc({"ok": report.ok and refusal is None and missing is None and not stale,
                 "index_problems": stale, "events": report.events, "bytes": report.bytes,
                 "head": report.head, "error": report.error, "seq": report.seq,
                 "offset": report.offset, "snapshot_anchored": report.anchor_ok,
                 "torn_tail_bytes": report.torn_tail, "seconds": round(elapsed, 3),
                 "sealed": report.sealed,
                 "refused": refusal, "anchor": args.anchor,
                 "anchor_held": None if wanted is None else missing is None,
                 "anchor_problem": missing, "archive": archived})
    else:
        _print_verify(out, report, elapsed, database=not hasattr(reg.store, "journal_path"))
        if refusal is not None:
            out.line(out.paint("DAMAGED", "31;1") + f": the chain verifies but the registry "
                     f"refuses to work: {refusal}")
        for problem in stale:  # (derived data: the chain is fine, some reads are not)
            out.line(out.paint("STALE INDEX", "31;1") + f": {problem}")
        if archived is not None:
            out.line(f"archive {args.with_dir}: {archived['archived_events']} events verified, "
                     f"ending at the anchor (seq {archived['seq']})")
        if wanted is not None and report.ok:
            out.line(f"anchor {wanted[0]}:{wanted[1][:16]}…: " + (
                "held by the journal" if missing is None else out.paint("NOT HELD", "31;1")
                + f": {missing}"))
    if not report.ok or report.anchor_ok is False or refusal is not None or missing or stale:
        return EXIT_DAMAGED
    return EXIT_OK


# doctor repairs files; a database's damage is undone from the database's own backups
_DB_FIX = ("the journal rows were changed outside fleetclaims (doctor repairs file registries "
           "only): restore the database from a backup, or migrate the verified part out with "
           "`fleetclaims migrate` and review it")


def _print_verify(out: Out, report: VerifyReport, elapsed: float, *,
                  database: bool = False) -> None:
    if report.ok and report.anchor_ok is False:
        out.line(out.paint("DAMAGED", "31;1") + f": the journal verifies ({report.events} events, "
                 f"head {report.head[:16]}…) but the snapshot claims.json does not match it: "
                 f"{report.error or 'not anchored in the journal'}")
        out.line(_DB_FIX if database else "run `fleetclaims doctor --fix` to rebuild the "
                 "snapshot from the journal (the old one goes to quarantine/)")
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
        if report.sealed or "segment" in (report.error or ""):  # (doctor --fix never
            # rewrites sealed history: its advice would be refused)
            out.line("the sealed history (segments/) is missing or damaged: put the original "
                     "segment back from a backup or the archive directory (`fleetclaims audit "
                     "verify --with DIR` checks an archive), then run `fleetclaims audit verify` "
                     "again; `doctor --fix` does not rewrite sealed history")
        elif database:
            out.line(_DB_FIX)
        else:
            out.line("run `fleetclaims doctor --fix` to repair: it keeps every line that still "
                     "verifies and names what the damaged bytes held (kept in quarantine/)")


COMMANDS: dict[str, Handler] = {"events": cmd_events, "explain": cmd_explain, "audit": cmd_audit,
                                "top": cmd_top}
