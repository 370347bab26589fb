"""The guard's path check (#23): a commit or push touching files another live claim reserved
exclusively is refused.

pre-commit checks the staged paths (``git diff --cached --no-renames``: a rename counts as its
old and its new path, a deletion as the deleted path); pre-push the paths the pushed commits
change (those not on the remote yet). A path is the committer's when one of their own claims
reserved it: the claim of the ``fleetclaims run`` the commit happens in (``FLEETCLAIMS_TASK``)
or any claim of ``FLEETCLAIMS_OWNER``. With ``git config fleetclaims.requirePaths true``
(``hooks install --require-paths``), a path none of the committer's claims reserved is
refused too, for teams that want every change covered by a claim.

The check only reads the registry; no registry means no reservations (nothing to refuse).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from shlex import quote
from typing import TYPE_CHECKING

from ..core import reserve, rules, validate
from ..core.errors import FleetclaimsError, GitFailed, ValidationError
from ..core.model import ACTIVE
from .guard import GuardResult

if TYPE_CHECKING:
    from ..api import Registry

REQUIRE_KEY = "fleetclaims.requirePaths"


def _git(repo: str, *args: str) -> str:
    try:
        # (file names are bytes to git: one that is not UTF-8 is kept, escaped, not a crash)
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=False,
                              encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise GitFailed(args[0], str(exc)) from None
    if done.returncode != 0:
        said = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        first = next((ln for ln in said if ln.startswith(("fatal:", "error:"))), None)
        raise GitFailed(" ".join(args[:2]), first or (said[-1] if said else
                                                      f"exit {done.returncode}"))
    return done.stdout


def staged_paths(repo: str) -> list[str]:
    """The paths the next commit changes, renames as old and new path, deletions included."""
    out = _git(repo, "diff", "--cached", "--name-only", "--no-renames", "-z")
    return sorted({p for p in out.split("\0") if p})


def pushed_paths(repo: str, remote: str, refs: str) -> list[str]:
    """The paths changed by the commits a push sends (pre-push's stdin lines): for an update,
    the commits after the remote's sha; for a new branch, those on no branch of ``remote``."""
    paths: set[str] = set()
    # What the remote has already is not pushed again: its refs as it lists them (a push to
    # a URL has no remote-tracking branches: `--remotes=<url>` matched none, so the whole
    # history was checked and refused), and its remote-tracking branches.
    known = _git(repo, "remote").split()
    others = [f"--remotes={remote}" if remote in known else "--remotes"]
    listed = subprocess.run(["git", "ls-remote", remote], cwd=repo, capture_output=True,
                            text=True, check=False, timeout=60)
    if listed.returncode == 0:
        others += [sha for sha in {ln.split("\t")[0] for ln in listed.stdout.splitlines()}
                   if sha.strip("0") and _has_commit(repo, sha)]
    for line in refs.splitlines():
        parts = line.split()
        if len(parts) != 4 or not parts[1].strip("0"):
            continue  # malformed, or a deletion of a remote branch (changes no file)
        local, remote_sha = parts[1], parts[3]
        if remote_sha.strip("0") and _has_commit(repo, remote_sha):
            spec = [f"{remote_sha}..{local}"]
        else:
            spec = [local, "--not", *others]
        # --cc: a merge commit lists the files it changed itself (a resolution, or an edit
        # made while merging); plain --name-only lists none for a merge.
        out = _git(repo, "log", "--format=", "--name-only", "--cc", "--no-renames", "-z", *spec)
        paths.update(p.strip("\n") for p in out.split("\0") if p.strip("\n"))
    return sorted(paths)


def _has_commit(repo: str, sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=repo,
                          capture_output=True, check=False).returncode == 0


def require_paths(repo: str) -> bool:
    """Whether the repository asks for every changed path to be reserved by the committer."""
    done = subprocess.run(["git", "config", "--bool", "--get", REQUIRE_KEY], cwd=repo,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() == "true"


def check(reg: Registry, paths: Iterable[str], env: Mapping[str, str], *,
          require: bool = False, pushing: bool = False) -> GuardResult:
    """The first path another live claim reserved exclusively (or, with ``require``, the
    first one none of the committer's claims reserved), as a refusal; else ok."""
    my_task = env.get("FLEETCLAIMS_TASK") or None
    my_owner = env.get("FLEETCLAIMS_OWNER") or None
    for name, value, checker in (("FLEETCLAIMS_TASK", my_task, validate.task),
                                 ("FLEETCLAIMS_OWNER", my_owner, validate.owner)):
        try:
            if value is not None:
                checker(value)
        except ValidationError as exc:  # (fail closed, and never print the bad bytes)
            return GuardResult(False, None, code="invalid",
                               reason=f"{name} is not valid: {exc.reason}",
                               next_action=f"Fix or unset {name}.")
    state = reg.store.read()
    damage = getattr(reg.store, "damage", None)
    if damage is not None:  # (fail closed: what the damage hides may reserve these paths)
        return GuardResult(
            False, None, code="audit_corrupt",
            reason=f"the registry is damaged, and reservations recorded after the damage "
            f"cannot be seen ({damage})",
            next_action="Run `fleetclaims doctor`, then `fleetclaims doctor --fix`; until then "
            "the guard lets no change through.")
    now = reg._now()
    index = reserve.index(state)
    count = 0
    for path in paths:
        count += 1
        mine = False
        for reserved in index.covering(path):
            holder = state.claims.get(reserved.task)
            if holder is None or holder.state != ACTIVE or rules.lease_expired(holder, now):
                continue  # lapsed with its claim
            if holder.task == my_task or (my_owner is not None and holder.owner == my_owner):
                mine = True
                continue
            if reserved.exclusive:
                return GuardResult(
                    False, my_task, code="conflict", holder=holder.owner,
                    reason=f"{path} is reserved by {holder.owner} for {holder.task!r} "
                    f"(pattern {reserved.pattern!r}, fence {holder.fence})",
                    next_action=(
                        f"Take the change to {quote(path)} out of the commits you push (e.g. "
                        f"`git revert` it, or rework them with `git rebase -i`)" if pushing
                        else f"Unstage it (`git restore --staged -- {quote(path)}`)")
                    + f", or ask {holder.owner} to finish {holder.task!r} or to `fleetclaims "
                    f"unreserve {holder.task} {quote(reserved.pattern)}`; `fleetclaims get "
                    f"{holder.task}` shows the claim.")
        if require and not mine:
            who = f"claim on {my_task!r}" if my_task else (
                f"claims of {my_owner}" if my_owner else "claims (no FLEETCLAIMS_OWNER set)")
            return GuardResult(
                False, my_task, code="unreserved",
                reason=f"{path} is not reserved by your {who}, and this repository requires "
                f"every change to be ({REQUIRE_KEY})",
                next_action="Reserve it first: `fleetclaims reserve TASK PATTERN --token ...` "
                "(or claim with --paths), then commit again.")
    return GuardResult(True, my_task, reason=f"{count} path(s) checked against reservations")


def hook_check(open_registry: Callable[[], Registry | None], hook: str, env: Mapping[str, str],
               refs: str = "", remote: str = "", repo: str = ".") -> GuardResult:
    """The path check a git hook runs: ``pre-commit`` on the staged paths, ``pre-push`` on
    the pushed commits' (``refs``: the hook's stdin lines). ``open_registry`` gives None
    when there is no registry (then nothing is reserved)."""
    try:
        if hook in ("pre-commit", "pre-push") and subprocess.run(
                ["git", "rev-parse", "--git-dir"], cwd=repo, capture_output=True,
                check=False).returncode != 0:
            raise GitFailed("git rev-parse", f"{os.path.abspath(repo)} is not inside a git "
                            "repository", hint="Run it inside the repository whose changes "
                            "it checks (the installed git hooks do).")
        if hook == "pre-commit":
            paths = staged_paths(repo)
        elif hook == "pre-push" and remote:
            paths = pushed_paths(repo, remote, refs)
        else:
            return GuardResult(True, reason="no paths to check for this hook")
        if not paths:
            return GuardResult(True, reason="no changed paths")
        reg = open_registry()
        if reg is None:
            return GuardResult(True, reason="no registry: nothing is reserved")
        try:
            return check(reg, paths, env, require=require_paths(repo),
                         pushing=hook == "pre-push")
        finally:
            reg.close()
    except FleetclaimsError as exc:
        return GuardResult(False, env.get("FLEETCLAIMS_TASK") or None, code=exc.code,
                           reason=exc.message, next_action=exc.hint or "Fix it, then retry.")
