"""The command line: ``main``, which parses, dispatches to one command and turns a typed error
into an exit status and a message. No rules live here.

The commands live in one module per group (``claims``, ``queue``, ``audit``, ``admin``,
``agents``); each names its subcommands after the Registry methods they call (``get``,
``claims``, ``claim-next``), and the older names stay as aliases (ALIASES). A cold command
imports and builds the parser of its own group's subcommand only (``build_parser(only=...)``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

from .._version import __version__
from ..core.errors import FleetclaimsError, ValidationError
from .args import Discarded, Formatter, Handler, Parser, common
from .output import (
    EXIT_CONFLICT,
    EXIT_DAMAGED,
    EXIT_ERROR,
    EXIT_INTERNAL,
    EXIT_NOT_HOLDER,
    EXIT_OK,
    EXIT_USAGE,
    Out,
    claim_doc,
    exit_code,
    exit_code_of,
    report_error,
)
from .output import data_doc as _data_doc

if TYPE_CHECKING:
    from .args import AddParser

VERSION = __version__
#: where a bug (an internal error, exit 70) is reported
REPORT_TO = "the fleetclaims issue tracker (fleetclaims --version tells the version)"

EPILOG = """\
exit codes: 0 ok, 1 error, 2 usage, 3 conflict, 4 not holder / expired / superseded,
            5 registry damaged, 70 internal error (a bug: please report it)
registry:   --dir DIR or postgresql://URL; else FLEETCLAIMS_URL, FLEETCLAIMS_DIR, the git
            repository's .cache/fleetclaims/, or the user state directory
aliases:    show = get, list = claims, next = claim-next (handoff: --to = --to-owner)
"""

#: every subcommand -> the module (of this package) that defines it, in --help order. Written
#: out so that a cold command finds its module without importing the others (a test checks
#: it against each module's COMMANDS).
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("claim", "renew", "release", "complete", "recover", "transition",
                     "handoff", "reopen", "get", "claims", "stats", "sweep"), "claims"),
    **dict.fromkeys(("add", "depend", "block", "unblock", "claim-next", "ready", "tasks"),
                    "queue"),
    **dict.fromkeys(("events", "explain", "audit", "top"), "audit"),
    **dict.fromkeys(("merge", "doctor", "init", "migrate", "db", "prune"), "admin"),
    **dict.fromkeys(("run", "mcp", "guard", "hooks", "brief"), "agents"),
    "sync": "sync",
    **dict.fromkeys(("reserve", "unreserve"), "paths"),
}

#: older subcommand names, kept working for the scripts that use them -> the canonical name
ALIASES: dict[str, str] = {"show": "get", "list": "claims", "next": "claim-next"}

GROUPS = ("claims", "queue", "audit", "admin", "agents", "sync", "paths")


def _group(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(f".{name}", __name__)


def all_commands() -> dict[str, Handler]:
    """Every canonical subcommand's function (imports every command module)."""
    found: dict[str, Handler] = {}
    for group in GROUPS:
        found.update(cast("dict[str, Handler]", _group(group).COMMANDS))
    return found


def canonical(name: str) -> str:
    """The canonical name of a subcommand given by its name or an alias."""
    return ALIASES.get(name, name)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, the other subcommands are left out (a cold command should
    not pay for building thirty parsers)."""
    parser = Parser(
        prog="fleetclaims",
        description="Claim tasks under a lease, hand them over, complete them, and recover the "
        "work of owners that died; every change goes to a hash-chained audit log.",
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"fleetclaims {VERSION}")
    common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    wanted = None if only is None else canonical(only)
    aliases: dict[str, list[str]] = {}
    for old, new in ALIASES.items():
        aliases.setdefault(new, []).append(old)
    for group in GROUPS:
        if wanted is not None and COMMANDS.get(wanted) != group:
            continue
        module = _group(group)
        examples: dict[str, str] = module.EXAMPLES

        def add(name: str, help_text: str, examples: dict[str, str] = examples
                ) -> argparse.ArgumentParser:
            if wanted is not None and name != wanted:
                return cast(argparse.ArgumentParser, Discarded())
            p = sub.add_parser(name, aliases=aliases.get(name, []), help=help_text,
                               description=help_text, formatter_class=Formatter,
                               epilog="example:\n  " + examples.get(name, f"fleetclaims {name}"))
            common(p, top=False)
            return p

        module.add_parsers(cast("AddParser", add))
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The canonical subcommand named in ``argv`` (skipping global options and their values),
    or None when there is none or it is unknown."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--dir", "--durability"):
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            name = canonical(arg)
            return name if name in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; the exit status is returned, never a traceback shown: an
    exception that is not a FleetclaimsError is a bug, reported in one line (exit 70)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args_list
    _guard_streams()
    try:
        code = _main(args_list)
    except FleetclaimsError as exc:  # refused before a command ran (an argument not UTF-8)
        return report_error(json_mode, exc)
    except KeyboardInterrupt:
        _interrupted(json_mode)
        return 130
    except BrokenPipeError:
        _discard_output()
        return EXIT_OK
    except OSError as exc:
        if _output_failed() or (exc.filename is None and exc.errno in _OUTPUT_ERRNOS):
            return _output_error(exc)
        typed = typed_error(exc)
        return internal_error(json_mode, exc) if typed is None else report_error(json_mode, typed)
    except Exception as exc:  # the last line of defence: see internal_error
        typed = typed_error(exc)
        if typed is not None:
            return report_error(json_mode, typed)
        return internal_error(json_mode, exc)
    try:
        sys.stdout.flush()  # (a full disk or a dead terminal shows here, not at exit)
    except BrokenPipeError:
        _discard_output()
    except (OSError, ValueError) as exc:
        return _output_error(exc if isinstance(exc, OSError) else OSError(str(exc)))
    return code


def _interrupted(json_mode: bool) -> None:
    """Say that Ctrl-C (SIGINT) stopped the command, on stderr and, with --json, as an error
    document on stdout (a script reading stdout got nothing). A wait that was interrupted
    claimed nothing; an operation that had completed before the signal stands."""
    message = ("interrupted (SIGINT) before the command finished: a wait claims nothing; an "
               "operation completed before the signal stands (`fleetclaims get TASK` shows it)")
    if json_mode:
        import json

        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(json.dumps({"error": "interrupted", "message": message}) + "\n")
            sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"fleetclaims: {message}\n")


def _guard_streams() -> None:
    """A closed stdin, stdout or stderr (`>&-`) reads as /dev/null: the command runs and its
    exit status still says how it went. Text no encoding of the stream can hold (e.g.
    PYTHONIOENCODING=ascii) is escaped rather than failing; JSON is always written as UTF-8."""
    import os

    for name in ("stdin", "stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w",  # noqa: SIM115
                                    encoding="utf-8"))
        elif name != "stdin" and str(getattr(stream, "encoding", "utf-8")).lower().replace(
                "-", "").replace("_", "") != "utf8":
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


# A raw OSError of a stream write (no file name: the registry's own I/O errors reach here
# typed) that means the output cannot be written.
_OUTPUT_ERRNOS = frozenset({5, 9, 27, 28, 122})  # EIO, EBADF, EFBIG, ENOSPC, EDQUOT


def _output_failed() -> bool:
    """Whether standard output cannot take what was written to it (a full disk, an I/O error,
    a closed descriptor)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        return True
    return False


def _discard_output() -> None:
    """What is left unwritten goes nowhere (else the flush at exit fails again, noisily)."""
    import os

    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with contextlib.suppress(OSError, ValueError):
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


def _output_error(exc: OSError) -> int:
    _discard_output()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            f"fleetclaims: could not write to standard output ({exc.strerror or exc}): the "
            "command itself ran, and what it changed is recorded (`fleetclaims get TASK` shows "
            "a task's holder; a token that could not be shown is lost: wait for the lease to "
            "end or have it released with `fleetclaims release TASK --force --reason R`). "
            "Send the output somewhere that can take it.\n")
    return EXIT_ERROR


def _main(argv: list[str]) -> int:
    # Everything after the first "--" is the command of `run`, never options of ours (its
    # arguments may be any bytes: file names are passed on as they came).
    cmd: list[str] = []
    if "--" in argv and _command_of(argv[: argv.index("--")]) == "run":
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1 :]
    _check_arguments(argv)
    parser = build_parser(_command_of(argv))
    Parser.json_errors = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors, as a return value
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        Parser.json_errors = False
    args.cmd = cmd
    if not args.command:
        if args.json:  # (a script asked for a JSON answer: an error document, not the help)
            return report_error(True, ValidationError(
                "command", "is missing: fleetclaims [options] COMMAND ... (`fleetclaims "
                "--help` lists them)"))
        parser.print_help()
        return EXIT_USAGE
    name = canonical(args.command)
    out = Out(bool(args.json))
    try:
        handlers = cast("dict[str, Handler]", _group(COMMANDS[name]).COMMANDS)
        return handlers[name](args, out)
    except FleetclaimsError as exc:
        return report_error(out.json, exc)


def _check_arguments(argv: list[str]) -> None:
    """Refuse an argument that is not valid UTF-8 before anything reads it: Python hands such
    bytes over as lone surrogates (PEP 383), which no file or JSON document can hold."""
    for position, arg in enumerate(argv, 1):
        if any("\ud800" <= ch <= "\udfff" for ch in arg):
            from ..core.validate import SURROGATE_REASON

            shown: object = arg
            with contextlib.suppress(UnicodeEncodeError):  # the bytes as they came
                shown = arg.encode("utf-8", "surrogateescape")
            raise ValidationError(f"argument {position}", SURROGATE_REASON, value=shown)


def typed_error(exc: BaseException) -> FleetclaimsError | None:
    """The typed error an OS or database failure stands for, or None for a bug."""
    from .._open import typed_store_error

    found = typed_store_error(exc)
    if found is None and isinstance(exc, FileNotFoundError) and _cwd_gone():
        found = FleetclaimsError("the current directory no longer exists (it was removed "
                                 "after this shell entered it), so no registry path can be "
                                 "found from it.", hint="cd to a directory that exists, or "
                                 "pass an absolute --dir, then retry.")
    if found is None and isinstance(exc, OSError):
        found = FleetclaimsError(f"{exc}.", hint="Check the path and permissions, then retry.")
    return found


def _cwd_gone() -> bool:
    import os

    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def internal_error(json_mode: bool, exc: BaseException) -> int:
    """One line naming the bug, the version and where to report it; exit 70."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:  # the innermost frame: where it broke, for the report
        where = f" at {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    what = f"{type(exc).__name__}{where}: {str(exc)[:200].rstrip('.')}"
    message = (f"internal error (a bug in fleetclaims {VERSION}): {what}. Nothing more was "
               f"done; please report this line and the command to {REPORT_TO}.")
    if json_mode:
        import json

        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(json.dumps({"error": "internal", "message": message,
                                         "exception": type(exc).__name__, "version": VERSION,
                                         "report_to": REPORT_TO}, ensure_ascii=True) + "\n")
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"fleetclaims: {message}\n".encode("ascii", "backslashreplace").decode())
    return EXIT_INTERNAL


__all__ = [
    "ALIASES",
    "COMMANDS",
    "EXIT_CONFLICT",
    "EXIT_DAMAGED",
    "EXIT_ERROR",
    "EXIT_INTERNAL",
    "EXIT_NOT_HOLDER",
    "EXIT_OK",
    "EXIT_USAGE",
    "Out",
    "_data_doc",
    "all_commands",
    "build_parser",
    "claim_doc",
    "exit_code",
    "exit_code_of",
    "main",
]
