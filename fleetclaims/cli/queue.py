"""CLI commands of the work queue: ``add``, ``depend``, ``block``, ``unblock``,
``claim-next`` (alias ``next``), ``ready`` and ``tasks`` (also ``claims --tasks``)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from ..core.durations import relative
from ..core.errors import ValidationError
from .args import AddParser, Handler, ascii_int, dur, existing, reader, registry, writer
from .output import EXIT_OK, claim_doc, exit_code, listed_or_damaged, show_claim
from .paths import paths_options
from .who import actor_of, owner_of, owner_option, wait_option

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.queue import Task, TaskStatus
    from .output import Out

EXAMPLES = {
    "add": "fleetclaims add build-docs --priority 10 --after write-docs --label docs "
    "--title 'Build the docs'\n  fleetclaims add --from tasks.jsonl   # JSONL or a JSON list, "
    "one transaction",
    "depend": "fleetclaims depend release-1.2 --on build-docs --on run-tests",
    "block": "fleetclaims block release-1.2 --reason 'waiting for legal review'",
    "unblock": "fleetclaims unblock release-1.2",
    "claim-next": "fleetclaims claim-next --owner agent-a --label docs --ttl 15m\n"
    "  # exit 3 and no claim when nothing is ready\n"
    "  fleetclaims next --wait 10m   # owner from $FLEETCLAIMS_OWNER; sleeps until one is",
    "ready": "fleetclaims ready --label docs",
    "tasks": "fleetclaims tasks --status pending",
}


def add_parsers(add: AddParser) -> None:
    p = add("add", "put a task in the work queue, or update it: an update changes only the "
            "options given; repeats change nothing")
    p.add_argument("task", nargs="?", help="the task id (or give --from FILE)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="add every task of FILE in one transaction: JSON Lines or one JSON "
                   "list of objects with id, title, description, labels, priority, depends_on "
                   "('-' reads standard input)")
    p.add_argument("--title", help="a one-line summary shown by tasks, get, next and brief "
                   "('' clears it)")
    p.add_argument("--description", help="what to do, shown by get, next and brief")
    p.add_argument("--priority", type=ascii_int, default=None,
                   help="lower numbers are handed out first (a new task: 100)")
    deps = p.add_mutually_exclusive_group()
    deps.add_argument("--after", "--depends-on", dest="depends_on", action="append",
                      default=None, metavar="TASK",
                      help="a task that must be completed first (repeatable; on an update, "
                      "the whole set: `depend` adds to it)")
    deps.add_argument("--no-after", action="store_true", help="drop every dependency")
    labels = p.add_mutually_exclusive_group()
    labels.add_argument("--label", dest="labels", action="append", default=None,
                        help="a label workers can ask for with `claim-next --label` "
                        "(repeatable; on an update, the whole set)")
    labels.add_argument("--no-labels", action="store_true", help="drop every label")
    p.add_argument("--note")

    p = add("depend", "make a queued task also wait for other tasks")
    p.add_argument("task")
    p.add_argument("--on", dest="on", action="append", required=True, metavar="TASK",
                   help="the task it waits for (repeatable)")

    p = add("block", "keep a queued task from being claimed until unblocked")
    p.add_argument("task")
    p.add_argument("--reason", required=True)

    p = add("unblock", "let a blocked task be claimed again")
    p.add_argument("task")
    p.add_argument("--reason")

    p = add("claim-next", "claim the best ready task of the queue (atomically), or exit 3")
    owner_option(p)
    p.add_argument("--label", dest="labels", action="append", default=[],
                   help="only tasks carrying this label (repeatable: all of them)")
    p.add_argument("--ttl", type=dur("ttl"), default=600.0, help="lease length (default 10m)")
    p.add_argument("--note")
    p.add_argument("--take-stale", action="store_true",
                   help="a ready task whose claim is stale counts as ready")
    p.add_argument("--pid", type=int, default=None,
                   help="the owner's process: when it dies the claim is stale at once")
    wait_option(p, "for a task to become ready")
    paths_options(p)

    p = add("ready", "what `claim-next` would hand out now, best first")
    p.add_argument("--label", dest="labels", action="append", default=[])

    p = add("tasks", "every queued task with its readiness, in hand-out order")
    p.add_argument("--status", action="append", choices=("ready", "held", "pending", "blocked",
                   "completed"), help="only tasks in this state (repeatable)")


def _task_doc(t: Task) -> dict[str, Any]:
    return t.to_dict()


def _status_doc(s: TaskStatus) -> dict[str, Any]:
    doc = _task_doc(s.task)
    doc.update(status=s.status, waits_for=list(s.waits_for), holder=s.holder)
    return doc


def cmd_add(args: argparse.Namespace, out: Out) -> int:
    if args.from_file is not None:
        return _add_from(args, out)
    if args.task is None:
        raise ValidationError("task", "is missing: fleetclaims add TASK, or add --from FILE")

    def add(reg: Registry) -> Task:
        return reg.add(args.task, priority=args.priority,
                       depends_on=[] if args.no_after else args.depends_on,
                       labels=[] if args.no_labels else args.labels, note=args.note,
                       title=args.title, description=args.description,
                       actor=actor_of(args))

    reg = writer(args, add)
    seq = reg.stats().seq
    existed = reg.task(args.task) is not None
    t = add(reg)
    changed = reg.stats().seq != seq
    if out.json:
        out.doc({**_task_doc(t), "changed": changed})
        return EXIT_OK
    status = reg.task(t.task)
    verb = ("updated" if existed else "added") if changed else "unchanged"
    after = f", after {', '.join(t.depends_on)}" if t.depends_on else ""
    out.line(f"{out.paint(verb, '32')} {t.task}: priority {t.priority}{after}; "
             f"{status.status if status else '?'}")
    return EXIT_OK


def _add_from(args: argparse.Namespace, out: Out) -> int:
    """``add --from FILE``: every task of the file in one transaction (all or none)."""
    given = [f"--{n}" for n, v in (("title", args.title), ("description", args.description),
                                   ("note", args.note)) if v is not None]
    if args.task is not None or args.depends_on is not None or args.labels is not None \
            or given or args.priority is not None or args.no_after or args.no_labels:
        raise ValidationError("from", "takes every field from the file; give no TASK or "
                              "other options with it")
    items = read_tasks(args.from_file)
    actor = actor_of(args)
    reg = writer(args, lambda r: r.add_many(items, actor=actor))
    written = reg.add_many(items, actor=actor)
    if out.json:
        out.doc({"tasks": len(items), "events": written})
    else:
        out.line(f"{out.paint('added', '32')} {len(items)} tasks from {args.from_file} in one "
                 f"transaction ({written} changed, {len(items) - written} unchanged or updated)"
                 if written else f"unchanged: the {len(items)} tasks of {args.from_file} are "
                 "already queued as given")
    return EXIT_OK


def read_tasks(path: str) -> list[Any]:
    """The tasks of a file: one JSON list, or JSON Lines (one object a line; blank lines and
    lines starting with # are skipped). Errors name the line."""
    import json
    import sys

    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read(64 * 1024 * 1024 + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError("from", f"cannot read {path}: {exc}") from None
    if len(text) > 64 * 1024 * 1024:
        raise ValidationError("from", f"{path} is larger than 64 MiB; add it in parts")
    try:  # (a list's errors count the lines of the whole text, as _json_lines' do)
        items = json.loads(text) if text.lstrip().startswith("[") else _json_lines(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        where = (f" (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                 if isinstance(exc, json.JSONDecodeError) else " (nested too deeply)")
        raise ValidationError("from", f"{path} is not JSON Lines or a JSON list{where}") \
            from None
    if not isinstance(items, list) or not items:
        raise ValidationError("from", f"{path} holds no tasks")
    return items


def _json_lines(text: str) -> list[Any]:
    """One JSON value a line (blank lines and # comments skipped). An error is raised at its
    place in the whole text, so its line is the file's, not 1 of the one line decoded."""
    import json

    items = []
    start = 0  # where the line begins in text
    for line in text.split("\n"):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise json.JSONDecodeError(exc.msg, text, start + exc.pos) from None
        start += len(line) + 1
    return items


def cmd_depend(args: argparse.Namespace, out: Out) -> int:
    def depend(reg: Registry) -> Task:
        return reg.depend(args.task, on=args.on, actor=actor_of(args))

    t = depend(writer(args, depend))
    if out.json:
        out.doc(_task_doc(t))
    else:
        out.line(f"{t.task} waits for {', '.join(t.depends_on)}")
    return EXIT_OK


def cmd_block(args: argparse.Namespace, out: Out) -> int:
    def block(reg: Registry) -> bool:
        return reg.block(args.task, reason=args.reason, actor=actor_of(args))

    changed = block(writer(args, block))
    if out.json:
        out.doc({"task": args.task, "blocked": True, "changed": changed})
    else:
        out.line(f"{'blocked' if changed else 'already blocked'} {args.task}: {args.reason}")
    return EXIT_OK


def cmd_unblock(args: argparse.Namespace, out: Out) -> int:
    def unblock(reg: Registry) -> bool:
        return reg.unblock(args.task, reason=args.reason, actor=actor_of(args))

    reg = writer(args, unblock)
    changed = unblock(reg)
    status = reg.task(args.task)
    if out.json:
        out.doc({"task": args.task, "blocked": False, "changed": changed,
                 "status": status.status if status else None})
    else:
        out.line(f"{'unblocked' if changed else 'was not blocked:'} {args.task}; "
                 f"now {status.status if status else '?'}")
    return EXIT_OK


def cmd_claim_next(args: argparse.Namespace, out: Out) -> int:
    reg = registry(args) if args.wait else existing(args)  # (a wait sees the registry made)
    c = reg.claim_next(owner=owner_of(args), labels=args.labels, ttl=args.ttl, note=args.note,
                       take_stale=args.take_stale,
                       process=args.pid if args.pid is not None else False, wait=args.wait,
                       paths=args.paths, shared_paths=args.shared)
    if c is not None:
        queued = reg.task(c.task)
        if out.json:
            doc = claim_doc(c, time.time())
            if queued is not None:
                doc.update(title=queued.task.title, description=queued.task.description)
            out.doc(doc)
            return EXIT_OK
        show_claim(out, c, "claimed")
        if queued is not None and queued.task.title:
            out.line(f"title: {queued.task.title}")
        if queued is not None and queued.task.description:
            out.line(queued.task.description)
        return EXIT_OK
    counts = reg.stats().queue
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "the queue is empty"
    nothing_ready(out, f"nothing ready{' with those labels' if args.labels else ''} "
                  f"({summary}); nothing was claimed. Wait and retry (--wait DURATION), or "
                  "see `fleetclaims tasks`.", counts)
    return exit_code("nothing_ready")


def nothing_ready(out: Out, message: str, counts: dict[str, int]) -> None:
    """No ready task, told as every error is: with --json a document with ``error`` and
    ``message`` (and the queue's counts) on stdout; the message for people on stderr."""
    import contextlib
    import sys

    if out.json:
        out.doc({"task": None, "error": "nothing_ready", "message": message, "queue": counts})
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"fleetclaims: {message}\n")


def cmd_ready(args: argparse.Namespace, out: Out) -> int:
    reg = reader(args)
    tasks = reg.ready(labels=args.labels)
    if out.json:  # (an array; with a damage member on a damaged journal, as claims)
        out.doc(listed_or_damaged("tasks", [_task_doc(t) for t in tasks], reg))
        return EXIT_OK
    if not tasks:
        out.line("nothing ready (see `fleetclaims tasks` for what is pending or blocked)")
        return EXIT_OK
    now = time.time()
    out.table(["TASK", "PRIORITY", "LABELS", "ADDED", "TITLE"],
              [[t.task, str(t.priority), ",".join(t.labels), relative(t.added_at, now),
                t.title or t.note or ""] for t in tasks])
    return EXIT_OK


def cmd_tasks(args: argparse.Namespace, out: Out) -> int:
    """Every queued task with its readiness, in hand-out order (also ``claims --tasks``)."""
    reg = reader(args)
    items = reg.tasks(status=args.status or None)
    if out.json:
        out.doc(listed_or_damaged("tasks", [_status_doc(s) for s in items], reg))
        return EXIT_OK
    counts = reg.stats().queue
    if not items:
        out.line("no queued tasks" + (" in that state" if args.status else
                                      " (add some with `fleetclaims add TASK`)"))
        return EXIT_OK
    rows = []
    for s in items:
        detail = (f"waits for {', '.join(s.waits_for)}" if s.waits_for
                  else f"held by {s.holder}" if s.holder
                  else f"blocked: {s.task.blocked}" if s.task.blocked else "")
        rows.append([s.task.task, s.status.upper(), str(s.task.priority),
                     ",".join(s.task.labels), s.task.title or "", detail])
    out.table(["TASK", "STATUS", "PRIORITY", "LABELS", "TITLE", "DETAIL"], rows)
    out.line("queue: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return EXIT_OK


COMMANDS: dict[str, Handler] = {
    "add": cmd_add, "depend": cmd_depend, "block": cmd_block, "unblock": cmd_unblock,
    "claim-next": cmd_claim_next, "ready": cmd_ready, "tasks": cmd_tasks,
}
