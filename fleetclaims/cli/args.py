"""From the command line to library calls: the argparse plumbing every command group shares,
and the helpers that turn parsed arguments into a Registry, a token, a JSON value."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from ..core.durations import parse_duration
from ..core.errors import ValidationError
from .output import EXIT_USAGE

if TYPE_CHECKING:
    from ..api import Registry
    from .output import Out

#: a command: parsed arguments and where to write in, exit status out
Handler = Callable[[argparse.Namespace, "Out"], int]


class AddParser(Protocol):
    """``add(name, help)``: the parser of one subcommand (see cli.build_parser), or a stand-in
    that discards its arguments when that subcommand is not the one being run."""

    def __call__(self, name: str, help_text: str) -> argparse.ArgumentParser: ...


def common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--dir", default=default, metavar="DIR|URL",
                        help="registry directory or postgresql:// URL")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="machine-readable output (one JSON document; streams: one per line)")
    parser.add_argument("--durability", choices=("full", "process"),
                        default="full" if top else argparse.SUPPRESS,
                        help="full: survive power loss (default); process: skip fsync")
    parser.add_argument("--allow-unsafe-fs", action="store_true",  # (None: the environment)
                        default=None if top else argparse.SUPPRESS,
                        help="allow network/FUSE/cloud-sync filesystems (locks may not work)")


def dur(field: str) -> Callable[[str], float]:
    """An argparse type for a duration (``10m``, ``90s``, ``1.5h``), as seconds."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, field)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def ascii_int(text: str) -> int:
    """An argparse type for a whole number in ASCII digits (``int()`` also takes Arabic-Indic
    or fullwidth ones, which no script means to send)."""
    body = text.strip()
    digits = body[1:] if body[:1] in ("+", "-") else body
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"must be a whole number in ASCII digits (got {text!r})")
    return int(body)


def token_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token", default=None,
                   help="the token from claim (default: $FLEETCLAIMS_TOKEN)")


class Parser(argparse.ArgumentParser):
    # Set by main() for a command line that asks for --json: a usage error is then a JSON
    # document on stdout as well, like every other error, so a program reading stdout learns
    # what went wrong.
    json_errors = False

    def error(self, message: str) -> NoReturn:
        hint = f"Run `{self.prog} --help` for usage."
        if self.json_errors:
            import json

            sys.stdout.write(json.dumps({"error": "usage", "message": message, "hint": hint},
                                        ensure_ascii=True) + "\n")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"fleetclaims: {message}\n{hint}\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
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


class Discarded:
    """Stands in for the parser of a subcommand that is not being run: its arguments are
    thrown away without building argparse actions (a cold command builds only its own)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        return None

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Discarded:
        return self


# --- arguments -> library ------------------------------------------------------------------


def registry(args: argparse.Namespace, **extra: Any) -> Registry:
    from ..api import Registry

    return Registry(args.dir, durability=args.durability, allow_unsafe_fs=args.allow_unsafe_fs,
                    **extra)


def writer(args: argparse.Namespace, trial: Callable[[Registry], object]) -> Registry:
    """A Registry for a command that writes, given as ``trial``. Where the command would
    create the registry (a directory that does not exist yet, or is empty), ``trial`` runs
    first on an empty registry in memory: a refusal (an invalid argument, a task that is not
    in the queue, a dependency cycle) is raised from there, so a refused command leaves
    nothing behind, not even the new registry's files."""
    from ..location import is_url, resolve

    location = resolve(args.dir)
    if not is_url(location) and _unmade(location):
        from pathlib import Path

        from ..api import Registry
        from ..store.file.anchor import check_vanished
        from ..store.memory import MemoryStore
        from ..system import SystemClock

        check_vanished(Path(location))  # (a registry removed from here: HistoryLost, as ever)
        trial(Registry(store=MemoryStore(clock=SystemClock(), location=location)))
    return registry(args)


def existing(args: argparse.Namespace) -> Registry:
    """A Registry for a command that acts on what a registry already records (renew, release,
    complete, recover, hand-off, reopen, reservations, claim-next without waiting). Where no
    registry was made yet, an empty one in memory answers (nobody holds anything there): a
    refused or empty command leaves nothing behind (a mistyped --dir was left holding a new
    registry's files)."""
    from ..location import is_url, resolve

    location = resolve(args.dir)
    if is_url(location) or not _unmade(location):
        return registry(args)
    from pathlib import Path

    from ..api import Registry
    from ..store.file.anchor import check_vanished
    from ..store.memory import MemoryStore
    from ..system import SystemClock

    check_vanished(Path(location))  # (a registry removed from here: HistoryLost, as ever)
    return Registry(store=MemoryStore(clock=SystemClock(), location=location))


def _unmade(location: str) -> bool:
    """Whether no registry lives at ``location`` and a write would make one there."""
    try:
        names = set(os.listdir(location))
    except FileNotFoundError:
        return True
    except OSError:  # not a directory, unreadable ...: the store reports it
        return False
    return not names - {".gitignore"}


def _first_run(location: str) -> bool:
    """Whether nothing is at ``location`` yet and a first write could make a registry there:
    it does not exist (not even as a dangling link) and its nearest existing ancestor is a
    directory."""
    path = os.path.abspath(location)
    if os.path.lexists(path):
        return False
    parent = os.path.dirname(path)
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return os.path.isdir(parent)


def reader(args: argparse.Namespace, **extra: Any) -> Registry:
    """A Registry for a command that only reads, which never creates one. A registry named
    by hand (--dir) must exist: a typo is refused (RegistryNotFound). One that comes from the
    environment (FLEETCLAIMS_DIR, set once in a hook or by `run`) or the default location and
    that no write has created yet reads as empty: that is the first run, not a typo."""
    from ..location import is_url, resolve

    if args.dir is not None:
        return registry(args, create=False, **extra)
    location = resolve(None)  # FLEETCLAIMS_URL, FLEETCLAIMS_DIR, git repository, user state
    if is_url(location) or os.path.isdir(location):
        return registry(args, **extra)
    if not _first_run(location):  # (a file, or under one: no write could ever make it)
        return registry(args, create=False, **extra)
    from pathlib import Path

    from ..api import Registry
    from ..store.file.anchor import check_vanished
    from ..store.memory import MemoryStore
    from ..system import SystemClock

    check_vanished(Path(location))  # not a first run when a registry lived here (git clean)
    return Registry(store=MemoryStore(clock=SystemClock(), location=location))


def from_env(name: str, check: Callable[[str], str] | None = None) -> str | None:
    """The value of environment variable ``name`` (None: unset or empty), checked by
    ``check`` (a validator of fleetclaims.core.validate): a bad value is refused naming the
    variable, since there is no argument to fix."""
    from ..core.errors import ValidationError

    value = os.environ.get(name) or None
    if value is None or check is None:
        return value
    try:
        return check(value)
    except ValidationError as exc:
        raise ValidationError(name, f"{exc.reason} (a value from the environment: fix or unset "
                              f"{name})", value=value) from None


def token(args: argparse.Namespace) -> str:
    from ..core import validate

    tok = args.token or from_env("FLEETCLAIMS_TOKEN", validate.token)
    if not tok:
        raise ValidationError("token", "is required: pass --token or set FLEETCLAIMS_TOKEN")
    return str(tok)


def json_arg(field: str, text: str | None, *, plain_ok: bool) -> Any:
    """``text`` parsed as JSON; with ``plain_ok``, text that is not JSON is kept as a string,
    unless it opens like a JSON object or array (a cut-off '{"pr": 17' is a mistake, not
    text to keep)."""
    if text is None:
        return None
    from ..core import validate

    try:
        return validate.json_text(field, text)
    except ValidationError as exc:
        if plain_ok and exc.reason == "is not valid JSON" and not text.lstrip().startswith(
                ("{", "[")):
            return text
        raise
