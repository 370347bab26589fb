"""What the command line shows: human and JSON output, and the one table of exit codes.

The library's errors carry a stable ``code`` and their data; which process exit status a code
means is a promise of the command line alone (README, "Errors and exit codes"), so the table
lives here and every command, the guard and ``run`` take their status from it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..core.durations import iso, relative

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.errors import FleetclaimsError
    from ..core.model import Claim, Now

# --- exit codes (stable, documented) ------------------------------------------------------------

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3
EXIT_NOT_HOLDER = 4
EXIT_DAMAGED = 5
#: a bug: an exception that is not a FleetclaimsError (BSD sysexits' EX_SOFTWARE). Not in
#: EXIT_CODES: no error class means it.
EXIT_INTERNAL = 70

#: error code -> exit status. A code not listed here exits 1 (EXIT_ERROR); an error class
#: without an entry of its own takes the nearest base class's (see exit_code_of).
EXIT_CODES: dict[str, int] = {
    "ok": EXIT_OK,
    "usage": EXIT_USAGE,             # argparse: a missing or malformed argument
    "invalid": EXIT_USAGE,           # ValidationError: nothing was written
    "dependency_cycle": EXIT_USAGE,
    "conflict": EXIT_CONFLICT,       # someone else holds the task
    "unreserved": EXIT_CONFLICT,     # guard: a changed path no claim of the committer reserved
    "completed": EXIT_CONFLICT,
    "not_ready": EXIT_CONFLICT,
    "nothing_ready": EXIT_CONFLICT,  # claim-next found no ready task
    "not_holder": EXIT_NOT_HOLDER,   # the caller lost (or never had) the claim
    "lease_expired": EXIT_NOT_HOLDER,
    "superseded": EXIT_NOT_HOLDER,
    "fence_mismatch": EXIT_NOT_HOLDER,  # guard: the work was started under an earlier grant
    "stale": EXIT_NOT_HOLDER,        # guard: the run's claim may be taken over
    "corrupt": EXIT_DAMAGED,         # repair with `doctor --fix`
    "audit_corrupt": EXIT_DAMAGED,
    "segment_damaged": EXIT_DAMAGED,  # a sealed segment missing or damaged: restore it
    "archive_mismatch": EXIT_DAMAGED,  # audit verify --with DIR: the archive is not the anchor's
    "history_lost": EXIT_DAMAGED,    # the anchor outside the folder records more history
    "read_only": EXIT_ERROR,         # PostgreSQL: a standby or read-only database
    "too_many_connections": EXIT_ERROR,  # PostgreSQL: no connection slot free
    "schema_mismatch": EXIT_ERROR,   # PostgreSQL: schema missing or newer than the code
    "no_registry": EXIT_USAGE,       # a read, merge or migrate --from where none exists
    "access_denied": EXIT_ERROR,     # file permissions, a database role without rights
    "missing_dependency": EXIT_ERROR,  # e.g. psycopg for a postgresql:// URL
    "remote_unavailable": EXIT_ERROR,  # sync/--remote: the git remote is unreachable
    "remote_rewritten": EXIT_DAMAGED,  # sync: a fleetclaims ref was force-pushed or deleted
    "git_failed": EXIT_ERROR,        # a local git command failed (not a repository ...)
}


def exit_code(code: str) -> int:
    """The exit status for an error (or guard) ``code``."""
    return EXIT_CODES.get(code, EXIT_ERROR)


def exit_code_of(exc: FleetclaimsError) -> int:
    """The exit status for ``exc``: its code's, else the nearest base class's code's, so a
    new subclass of NotHolder exits 4 like its parent until the table says otherwise."""
    for cls in type(exc).__mro__:
        code = cls.__dict__.get("code")
        if isinstance(code, str) and code in EXIT_CODES:
            return EXIT_CODES[code]
    return EXIT_ERROR


def report_error(json_mode: bool, exc: FleetclaimsError) -> int:
    """Tell the user about ``exc`` (stderr; with --json also a document on stdout) and return
    the exit status."""
    if json_mode:
        import json

        with contextlib.suppress(OSError, ValueError):  # (stdout may be what failed)
            sys.stdout.write(json.dumps(exc.to_dict(), ensure_ascii=True) + "\n")
            sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"fleetclaims: {exc}\n")
    return exit_code_of(exc)


# --- output ----------------------------------------------------------------------------------


def write_private(path: str, text: str) -> None:
    """Write ``text`` to the file ``path`` readable by its owner only (0600), whatever the
    umask: an export or a report holds the audit trail (owners, notes, metadata)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                     0o600)
        with open(fd, "w", encoding="utf-8", newline="") as fh:
            # An existing file keeps its mode through O_CREAT, so narrow it; but only a regular
            # file: `-o /dev/null` or a pipe must not have the device's own mode changed (as
            # root, that made /dev/null unwritable for every other user of the machine).
            if hasattr(os, "fchmod") and stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o600)
            fh.write(text)
    except OSError as exc:  # (not "standard output": the file the user named)
        from ..core.errors import ValidationError

        raise ValidationError("output file", f"{path} could not be written "
                              f"({exc.strerror or exc}); the registry was only read: choose "
                              "another file") from None


class Out:
    """Where a command writes: one JSON document (``--json``) or lines and tables for people,
    coloured only on a terminal and never with NO_COLOR."""

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


_DOC_HIDDEN = ("boot_deadline", "deadline_boot", "retired", "eid")


def claim_doc(c: Claim, now: float | Now) -> dict[str, Any]:
    """A claim as the JSON document every command prints (token included: it is the caller's).
    ``expires_in`` is told by the clock that decides expiry when ``now`` is a Now."""
    from .._reads import lease_left

    data = c.to_dict(with_token=True)
    for key in _DOC_HIDDEN:
        data.pop(key, None)
    left = lease_left(c.expires_at, c.boot_deadline, c.deadline_boot, now)
    data["expires_in"] = None if left is None else round(left, 3)
    return data


def data_doc(data: dict[str, Any], now: float | Now) -> dict[str, Any]:
    """claim_doc() made in place from a dict of Registry.claims_data() (new, with every
    optional member): the same members in the same form (a cold `claims --json` does this for
    every claim of the registry)."""
    from .._reads import lease_left

    left = lease_left(data["expires_at"], data.get("boot_deadline"),
                      data.get("deadline_boot") or "", now)
    pop = data.pop
    for key in _DOC_HIDDEN:
        pop(key, None)
    data.setdefault("paths", [])  # (a listing leaves out empty reservations, as stored)
    data.setdefault("shared_paths", [])
    data["expires_in"] = None if left is None else round(left, 3)
    return data


def show_claim(out: Out, c: Claim, verb: str) -> None:
    """One claim after a change (``claimed``, ``renewed`` ...), with the token when it is new."""
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
    if c.paths or c.shared_paths:
        out.line(f"paths: {paths_text(c)}")
    if c.token:
        out.line(f"token: {c.token}")
        out.line("keep it secret; pass it to renew/complete/release (or set FLEETCLAIMS_TOKEN)")


def claim_rows(claims: Sequence[Claim], now: float,
               stale: Callable[[Claim], str | None] | None = None) -> list[list[str]]:
    """The rows of the claims table: the lease told relative to now, stale owners flagged."""
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
        note = c.note or ""
        if c.paths or c.shared_paths:
            note = f"{note} [paths: {paths_text(c)}]".strip()
        rows.append([c.task, c.owner, str(c.fence), c.phase, c.state, exp, note])
    return rows


def paths_text(c: Claim) -> str:
    """A claim's reservations in one line: exclusive patterns, then shared ones marked so."""
    return ", ".join([*c.paths, *(f"{p} (shared)" for p in c.shared_paths)])


def print_events(out: Out, events: Sequence[dict[str, Any]], header: bool = True) -> None:
    """Events one JSON object per line, or a table (``header=False``: bare rows, to follow)."""
    if out.json:
        for e in events:
            out.doc(e)
        return
    from ..core.events import fill_renewal
    from ..core.explain import describe

    holders: dict[str, tuple[Any, Any]] = {}  # (a compact renewal named by its grant above)
    rows = [[str(e["seq"]), iso(e.get("ts")), str(e.get("type")), str(e.get("task") or "-"),
             describe(fill_renewal(e, holders))] for e in events]
    if header:
        out.table(["SEQ", "TIME", "TYPE", "TASK", "WHAT"], rows)
    else:
        for row in rows:
            out.line("  ".join(row))


def damage_member(reg: Registry) -> dict[str, Any] | None:
    """What a read of a damaged journal could not verify (the store's ``damage_doc``: file,
    seq and byte range, reason, what to run), for ``--json``; None on a healthy registry."""
    describe = getattr(reg.store, "damage_doc", None)
    return describe() if callable(describe) else None


def listed_or_damaged(key: str, docs: list[Any], reg: Registry) -> Any:
    """A listing for --json: the array when healthy, ``{key: [...], "damage": {...}}`` on a
    damaged journal, so a script cannot take the verified part for the whole registry."""
    damage = damage_member(reg)
    return docs if damage is None else {key: docs, "damage": damage}


def with_damage(doc: dict[str, Any], reg: Registry) -> dict[str, Any]:
    """``doc`` with a ``damage`` member when the journal is damaged (absent when healthy)."""
    damage = damage_member(reg)
    if damage is not None:
        doc["damage"] = damage
    return doc
