"""Where the registry lives: explicit path or URL, environment, git repository, user state dir."""

from __future__ import annotations

import os
from pathlib import Path

SUBDIR = Path(".cache") / "fleetclaims"


def is_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


def resolve(path: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> str:
    """An explicit path or URL wins; then FLEETCLAIMS_URL, FLEETCLAIMS_DIR; then the main working
    tree of the enclosing git repository; then the platform's user state directory."""
    if path is not None:
        return _absolute(_path_text(path, "registry location"), "registry location")
    url = os.environ.get("FLEETCLAIMS_URL")
    if url:
        if not is_url(url.strip()):  # (a typo must not become a local registry of its own)
            from .core.errors import ValidationError

            raise ValidationError("FLEETCLAIMS_URL", "is not a postgresql:// URL (the form is "
                                  "postgresql://user@host:port/database; for a directory set "
                                  "FLEETCLAIMS_DIR instead)")  # (no echo: it may hold a password)
        from urllib.parse import urlsplit

        try:
            urlsplit(url.strip()).port  # noqa: B018  (a malformed port or host raises)
        except ValueError as exc:
            from .core.errors import ValidationError

            raise ValidationError("FLEETCLAIMS_URL", f"is not a valid PostgreSQL URL ({exc}); "
                                  "the form is postgresql://user@host:port/database") from None
        return _absolute(url, "FLEETCLAIMS_URL")
    env_dir = os.environ.get("FLEETCLAIMS_DIR")
    if env_dir:
        return _absolute(env_dir, "FLEETCLAIMS_DIR")
    root = git_main_worktree(cwd or Path.cwd())
    if root is not None:
        return str(root / SUBDIR)
    from platformdirs import user_state_dir

    return str(Path(user_state_dir("fleetclaims", appauthor=False)) / "registry")


def _path_text(path: object, field: str) -> str:
    """``path`` as text, or a typed refusal: an empty path would make the current directory
    a registry (an unset shell variable in ``--dir "$X"``)."""
    from .core.errors import ValidationError

    if not isinstance(path, (str, os.PathLike)):
        raise ValidationError(field, "must be a directory path (str or os.PathLike) or a "
                              "postgresql:// URL", value=path)
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ValidationError(field, "must be a text path, not bytes", value=text)
    return text


def _absolute(text: str, field: str) -> str:
    from .core.errors import ValidationError
    from .core.validate import SURROGATE_REASON

    if not text.strip():
        raise ValidationError(field, "is empty; name a directory (an unset shell variable?)",
                              value=text)
    if "\x00" in text:
        raise ValidationError(field, "contains a NUL character", value=text)
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise ValidationError(field, SURROGATE_REASON, value=text)
    _check_scheme(text, field)
    if is_url(text):
        return text
    try:
        absolute = Path(text).expanduser().absolute()
    except RuntimeError as exc:  # "~nosuchuser/x": no such user's home directory
        raise ValidationError(field, f"cannot be expanded ({exc})", value=text) from None
    try:
        absolute.resolve()
    except (RuntimeError, OSError):  # a loop (RuntimeError before Python 3.13)
        raise ValidationError(field, "is a symbolic link loop (it leads nowhere): name the "
                              "directory itself", value=text) from None
    return str(absolute)


def _check_scheme(text: str, field: str = "registry location") -> None:
    """A URL of a scheme we do not serve is a mistake, not a directory name to create; so is
    a mistyped PostgreSQL URL ("postgresql:/host/db"): a local registry made of it would let
    two machines each hold the same task."""
    from .core.errors import ValidationError

    scheme, sep, _ = text.partition("://")
    if sep and scheme.isalnum() and not is_url(text):
        raise ValidationError(
            field, f"{scheme}:// is not supported; use a directory or a "
            "postgresql:// URL")  # (no echo: a URL may hold a password)
    if not is_url(text) and text.lower().startswith(("postgresql:", "postgres:")):
        raise ValidationError(
            field, "looks like a mistyped PostgreSQL URL; the form is "
            "postgresql://user@host:port/database (a directory of that name: write ./ before "
            "it)")


def git_main_worktree(start: Path) -> Path | None:
    """The main working tree of the repository containing ``start``, read from the .git files
    (no git process): every linked worktree of one repository shares one registry."""
    here = start.absolute()
    for directory in (here, *here.parents):
        dotgit = directory / ".git"
        if dotgit.is_dir():
            return directory
        if dotgit.is_file():
            try:
                text = dotgit.read_text().strip()
            except OSError:
                return directory
            if not text.startswith("gitdir:"):
                return directory
            gitdir = Path(text[len("gitdir:") :].strip())
            if not gitdir.is_absolute():
                gitdir = (directory / gitdir).resolve()
            commondir_file = gitdir / "commondir"
            try:
                common = Path(commondir_file.read_text().strip())
            except OSError:
                return directory  # a submodule: its own working tree is the root
            if not common.is_absolute():
                common = (gitdir / common).resolve()
            return common.parent if common.name == ".git" else directory
    return None


def git_common_dir(start: Path) -> Path | None:
    """The git directory shared by every worktree of the repository containing ``start`` (the
    main ``.git``, or a bare repository), read from the .git files (no git process): where a
    repository registry's anchor lives, outside what ``git clean`` removes."""
    here = start.absolute()
    for directory in (here, *here.parents):
        dotgit = directory / ".git"
        if dotgit.is_dir():
            return dotgit
        if not dotgit.is_file():
            continue
        try:
            text = dotgit.read_text().strip()
        except OSError:
            return None
        if not text.startswith("gitdir:"):
            return None
        gitdir = Path(text[len("gitdir:") :].strip())
        if not gitdir.is_absolute():
            gitdir = (directory / gitdir).resolve()
        try:
            common = Path((gitdir / "commondir").read_text().strip())
        except OSError:
            return gitdir  # a submodule: its own git directory
        return common if common.is_absolute() else (gitdir / common).resolve()
    return None
