"""``fleetclaims hooks install|uninstall``: the guard as git hooks, chained to the hooks there.

Each hook is a short ``sh`` script. pre-commit and pre-push start the guard for every commit
and push, in a claimed run or not: it checks the claim of a ``fleetclaims run`` (if any) and the
changed paths against the paths other claims reserved (#23; it returns at once when nothing is
staged or there is no registry); pre-push also checks the fences of pushed commits' ``Claim:``
trailers against the tasks' leases on the remote (Python starts only when one is there). A
hook that was already there is moved aside to ``<name>.fleetclaims-chained`` and called after
the guard with the same arguments and stdin;
``uninstall`` moves it back, byte for byte. The hooks directory is the one git itself uses
(``core.hooksPath`` honoured, worktrees share the main repository's hooks).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ValidationError

MARKER = "# fleetclaims-hook v1"
CHAINED_SUFFIX = ".fleetclaims-chained"
GUARD_HOOKS = ("pre-commit", "pre-push")
TRAILER_HOOK = "prepare-commit-msg"


@dataclass(frozen=True, slots=True)
class HookChange:
    """What install/uninstall did to one hook."""

    name: str
    path: str
    action: str  # installed / updated / chained / removed / restored / skipped
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"hook": self.name, "path": self.path, "action": self.action, "detail": self.detail}


def hooks_dir(repo: str | os.PathLike[str] = ".") -> Path:
    """The directory git runs hooks from for ``repo`` (``core.hooksPath`` or ``.git/hooks``)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--git-path", "hooks"], cwd=repo,
                              capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ValidationError("git", f"cannot run git: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise ValidationError("--repo", "is not inside a git repository "
                              f"({done.stderr.strip() or 'git rev-parse failed'})", value=str(repo))
    return Path(repo, done.stdout.strip()).absolute()  # git prints it relative to ``repo``


def _command() -> str:
    # This installation by absolute path: a git client's PATH (an IDE, a GUI) may not have it.
    return f"{shlex.quote(sys.executable)} -m fleetclaims"


def script(name: str) -> str:
    """The hook script for ``name``: guard (or add the trailer) in a claimed run, then chain."""
    chained = f'"$(dirname "$0")/{name}{CHAINED_SUFFIX}"'
    if name == "pre-push":
        return _pre_push(chained)
    if name == "pre-commit":
        return _pre_commit(chained)
    if name == TRAILER_HOOK:
        # $1 is the message file. The trailer lets reviewers match a commit to its claim.
        action = ('  git interpret-trailers --in-place --if-exists addIfDifferent --trailer '
                  '"Claim: $FLEETCLAIMS_TASK fence $FLEETCLAIMS_FENCE" "$1" || exit $?\n')
    else:
        # stdin is the chained hook's (pre-push reads the refs from it), never the guard's.
        action = f"  {_command()} guard --hook {name} </dev/null || exit $?\n"
    return (
        "#!/bin/sh\n"
        f"{MARKER} ({name}): installed by `fleetclaims hooks install`; undo with "
        "`fleetclaims hooks uninstall`.\n"
        "# Outside a claimed run (FLEETCLAIMS_TASK unset) it only calls the chained hook.\n"
        'if [ -n "${FLEETCLAIMS_TASK:-}" ]; then\n'
        f"{action}"
        "fi\n"
        f"if [ -x {chained} ]; then\n"
        f'  exec {chained} "$@"\n'
        "fi\n"
        "exit 0\n"
    )


def _pre_commit(chained: str) -> str:
    """pre-commit: the guard always runs, in a claimed run or not, because a commit touching
    paths another claim reserved is refused whoever makes it (#23); it exits at once when
    nothing is staged or no registry exists."""
    return (
        "#!/bin/sh\n"
        f"{MARKER} (pre-commit): installed by `fleetclaims hooks install`; undo with "
        "`fleetclaims hooks uninstall`.\n"
        "# The claim of a `fleetclaims run` (if any), then the staged paths against the "
        "paths other claims reserved.\n"
        f"{_command()} guard --hook pre-commit </dev/null || exit $?\n"
        f"if [ -x {chained} ]; then\n"
        f'  exec {chained} "$@"\n'
        "fi\n"
        "exit 0\n"
    )


def _pre_push(chained: str) -> str:
    """pre-push: the guard in a claimed run, then the fences of the pushed commits' ``Claim:``
    trailers against the remote's leases (Python starts only when a pushed commit carries one),
    then the chained hook with the same refs on its stdin."""
    return (
        "#!/bin/sh\n"
        f"{MARKER} (pre-push): installed by `fleetclaims hooks install`; undo with "
        "`fleetclaims hooks uninstall`.\n"
        "refs=$(cat)\n"
        "# The claim of a `fleetclaims run` (if any), then the paths the pushed commits change "
        "against the paths other claims reserved.\n"
        f"printf '%s\\n' \"$refs\" | {_command()} guard --hook pre-push --remote \"$1\" "
        "|| exit $?\n"
        "# The Claim trailers of the commits this push sends (new branch: those not on the "
        "remote yet).\n"
        "remote=$1 format='%(trailers:key=Claim,valueonly)'\n"
        "claims=$(printf '%s\\n' \"$refs\" | while read -r lref lsha rref rsha; do\n"
        '  case "$lsha" in *[!0]*) ;; *) continue ;; esac\n'
        '  if git cat-file -e "$rsha^{commit}" 2>/dev/null; then\n'
        '    git log --format="$format" "$rsha..$lsha"\n'
        '  else\n'
        '    git log --format="$format" "$lsha" --not --remotes="$remote"\n'
        '  fi\n'
        "done)\n"
        'if [ -n "$(printf \'%s\' "$claims" | tr -d \'[:space:]\')" ]; then\n'
        f"  printf '%s\\n' \"$claims\" | {_command()} sync --check-fences \"$remote\" || exit $?\n"
        "fi\n"
        f"if [ -x {chained} ]; then\n"
        f'  printf \'%s\\n\' "$refs" | {chained} "$@"; exit $?\n'
        "fi\n"
        "exit 0\n"
    )


def _ours(path: Path) -> bool:
    if path.is_symlink():  # (ours are files; a link may lead to a hook we replace meanwhile)
        return False
    try:
        with path.open("rb") as fh:
            return MARKER.encode() in fh.read(512)
    except OSError:
        return False


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _relink(link: Path, hooks: tuple[str, ...], suffix: str) -> None:
    """A hook that is a symlink to another hook of ``hooks`` (``pre-push -> pre-commit``) is
    led to where that one's original is now: its chained name on install (``suffix``), its
    own name again on uninstall; so the user's hook still runs the user's hook."""
    if not link.is_symlink():
        return
    target = os.readlink(link)
    base = target[: -len(CHAINED_SUFFIX)] if target.endswith(CHAINED_SUFFIX) else target
    if base in hooks and target != base + suffix:
        os.remove(link)
        os.symlink(base + suffix, link)


def install(repo: str | os.PathLike[str] = ".", *, trailer: bool = True) -> list[HookChange]:
    """Install the guard hooks (and the trailer hook unless ``trailer=False``); idempotent."""
    directory = hooks_dir(repo)
    directory.mkdir(parents=True, exist_ok=True)
    names = GUARD_HOOKS + ((TRAILER_HOOK,) if trailer else ())
    for name in names:  # check every hook before touching any, so a refusal changes nothing
        path, aside = directory / name, directory / (name + CHAINED_SUFFIX)
        if _exists(path) and not _ours(path) and _exists(aside):
            raise ValidationError(
                "hooks", f"{path} is not ours and {aside.name} already exists, so it cannot be "
                "moved aside without overwriting one of them; nothing was changed",
                value=str(directory))
    changes = []
    for name in names:
        path, aside = directory / name, directory / (name + CHAINED_SUFFIX)
        if _exists(path) and not _ours(path):
            os.rename(path, aside)  # a rename keeps its bytes, mode and symlink-ness
            _relink(aside, names, CHAINED_SUFFIX)
            action, detail = "chained", f"the existing hook now runs after ours as {aside.name}"
        elif _exists(path):
            action, detail = "updated", ""
        else:
            action, detail = "installed", ""
        tmp = directory / f".{name}.fleetclaims-tmp"
        tmp.write_text(script(name), encoding="utf-8")
        tmp.chmod(0o755)
        os.replace(tmp, path)
        changes.append(HookChange(name, str(path), action, detail))
    if not trailer and _ours(directory / TRAILER_HOOK):  # (one installed before goes)
        changes += _remove(directory, (TRAILER_HOOK,))
    return changes


def uninstall(repo: str | os.PathLike[str] = ".") -> list[HookChange]:
    """Remove our hooks and put the chained ones back where they were."""
    return _remove(hooks_dir(repo), (*GUARD_HOOKS, TRAILER_HOOK))


def _remove(directory: Path, names: tuple[str, ...]) -> list[HookChange]:
    changes = []
    for name in names:
        path, aside = directory / name, directory / (name + CHAINED_SUFFIX)
        if _exists(path) and not _ours(path):
            kept = f"; {aside.name} kept" if _exists(aside) else ""
            changes.append(HookChange(name, str(path), "skipped", "not a fleetclaims hook "
                                      f"(replaced since install?), left alone{kept}"))
            continue
        if _exists(path):
            path.unlink()
            action = "removed"
        else:
            action = ""
        if _exists(aside):
            _relink(aside, (*GUARD_HOOKS, TRAILER_HOOK), "")
            os.rename(aside, path)
            action = "restored"
        if action:
            changes.append(HookChange(name, str(path), action))
    return changes
