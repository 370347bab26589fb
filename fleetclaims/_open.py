"""Opening a registry: the arguments of ``Registry()`` and the environment typed, the store
chosen by location, and the checks that keep a mistyped path from becoming a registry. Also
the typed error for an OS or database failure that escaped a store (used by the command line
and the MCP server, which must never show a traceback)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import TYPE_CHECKING

from .core.errors import (
    AccessDenied,
    FleetclaimsError,
    MissingDependency,
    RegistryNotFound,
    ValidationError,
)
from .store.base import Store
from .system import Clock

if TYPE_CHECKING:
    from .api import Registry
    from .sync.remote_lease import RemoteLeases

#: the files of which one at least is in every file registry that was ever opened for writing
REGISTRY_MARKERS = ("audit.jsonl", "claims.json", "claims.lock")
LOCK_TIMEOUT_MAX = 24 * 3600.0

def lock_timeout(value: object) -> float:
    """``lock_timeout`` (else FLEETCLAIMS_LOCK_TIMEOUT, else 10 s) as seconds, typed."""
    field = "lock_timeout"
    if value is None:
        text = os.environ.get("FLEETCLAIMS_LOCK_TIMEOUT", "").strip()
        if not text:
            return 10.0
        field = "FLEETCLAIMS_LOCK_TIMEOUT"
        try:
            if not text.isascii():  # (float() takes Arabic-Indic or fullwidth digits too)
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise ValidationError(field, "must be a number of seconds, e.g. 10 or 0.5",
                                  value=text) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        isinstance(value, int) or math.isfinite(value)
    ) or not 0 <= value <= LOCK_TIMEOUT_MAX:
        raise ValidationError(field, f"must be a number of seconds from 0 to "
                              f"{LOCK_TIMEOUT_MAX:g}", value=value)
    return float(value)


def remote(value: object) -> str | None:
    """A git remote argument (a remote name, a path or URL), typed; None: not given."""
    if value is None:
        return None
    if not isinstance(value, str) or value.startswith("-") or any(
            ord(c) < 32 or c == "\x7f" for c in value) or len(value) > 4096:
        raise ValidationError("remote", "must be a git remote name, path or URL", value=value)
    return value


def leases(reg: Registry, remote: str | None) -> RemoteLeases | None:
    """The leases of ``reg`` on the git ``remote``; None ("" or None): claims stay local. The
    sync package (git, subprocess) is imported only when a remote is used."""
    if not remote:
        return None
    from .sync.remote_lease import RemoteLeases

    return RemoteLeases(reg, remote)


def open_store(
    path: str | os.PathLike[str] | None, *, durability: str, lock_timeout: float,
    clock: Clock, schema: str | None, allow_unsafe_fs: bool, create: bool,
) -> Store:
    """The store at ``path`` (a directory or a postgresql:// URL; None: the default one)."""
    from .location import is_url, resolve

    location = resolve(path)
    if is_url(location):
        try:
            from .store.postgres.store import PostgresStore
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("psycopg"):
                raise
            raise MissingDependency("psycopg", "a postgresql:// registry",
                                    "pip install 'fleetclaims[postgres]'") from None
        except ImportError as exc:  # installed but unusable: no libpq, a wrong PSYCOPG_IMPL
            if "psycopg" not in str(exc) and "pq" not in str(exc):
                raise
            raise MissingDependency(
                "psycopg", "a postgresql:// registry", "libpq (Debian: apt-get install "
                "libpq5) or pip install 'psycopg[binary]', and check PSYCOPG_IMPL",
                why=f"is installed but cannot load ({exc})") from None
        return PostgresStore(location, clock=clock, durability=durability,
                             lock_timeout=lock_timeout, schema=schema, create=create)
    if not create:
        require_registry(location)
    else:
        _check_new_home(location)
    from .store.file.store import FileStore

    return FileStore(location, clock=clock, durability=durability, lock_timeout=lock_timeout,
                     allow_unsafe_fs=allow_unsafe_fs, create=create)


def typed_store_error(exc: BaseException) -> FleetclaimsError | None:
    """The typed error for an OS permission failure or a PostgreSQL error that escaped a store
    (a role without rights on the schema ...), or None."""
    if isinstance(exc, PermissionError):
        return AccessDenied(exc.filename or "a registry file", exc.strerror or str(exc))
    psycopg = sys.modules.get("psycopg")  # never imported here for this
    if psycopg is not None and isinstance(exc, psycopg.Error):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if getattr(exc, "sqlstate", None) == "42501":  # insufficient_privilege
            return AccessDenied("the PostgreSQL registry", reason, hint=(
                "Ask the database owner to grant this role USAGE on the schema and SELECT, "
                "INSERT, UPDATE on its tables (or run `fleetclaims db migrate` as the owner)."))
        from .core.errors import StoreUnavailable

        return StoreUnavailable("PostgreSQL", reason, committed=None)
    return None


def _check_new_home(location: str) -> None:
    """A registry is made only in a directory that does not exist yet (the store creates it
    with its .gitignore) or that is empty (given its .gitignore here); an existing directory
    holding other files and no registry is a mistyped path, refused before anything lands in
    it (a journal in a repository's root)."""
    try:
        names = set(os.listdir(location))
    except OSError:  # missing (the store creates it), or not a directory (the store refuses)
        return
    if names & set(REGISTRY_MARKERS):
        return
    if names - {".gitignore"}:
        raise RegistryNotFound(location, "the directory holds other files and no registry; "
                               "a new registry is made only in a new or empty directory")
    from .store.file.fsutil import GITIGNORE, O_CLOEXEC, O_NOFOLLOW

    try:
        fd = os.open(os.path.join(location, ".gitignore"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
    except OSError:  # there already, or not ours to write: the store's checks decide
        return
    try:
        os.write(fd, GITIGNORE.encode())
    finally:
        os.close(fd)


def require_registry(location: str) -> None:
    """Refuse (RegistryNotFound) a directory that does not hold a file registry; HistoryLost
    when the anchor says one lived there (its folder removed or emptied), as a write says."""
    try:
        names = set(os.listdir(location))
    except FileNotFoundError:
        _vanished(location)
        raise RegistryNotFound(location, "the directory does not exist") from None
    except NotADirectoryError:
        raise RegistryNotFound(location, "it is a file, not a directory") from None
    except PermissionError as exc:
        raise AccessDenied(location, exc.strerror or "permission denied") from None
    except OSError as exc:  # a name too long, a loop of symlinks, an I/O error ...
        raise RegistryNotFound(location, f"it cannot be read ({exc.strerror or exc})") from None
    if not names & set(REGISTRY_MARKERS):
        _vanished(location)
        raise RegistryNotFound(location, "the directory holds no registry files ("
                               + ", ".join(REGISTRY_MARKERS) + ")")


def _vanished(location: str) -> None:
    from pathlib import Path

    from .store.file import anchor

    with contextlib.suppress(OSError):
        anchor.check_vanished(Path(location).absolute())




__all__ = ["LOCK_TIMEOUT_MAX", "REGISTRY_MARKERS", "leases", "lock_timeout", "open_store", "remote",
           "require_registry", "typed_store_error"]
