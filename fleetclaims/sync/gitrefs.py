"""The only place fleetclaims runs ``git``: plumbing commands through ``subprocess``.

Nothing here reimplements git or touches credentials: a remote is whatever ``git fetch`` and
``git push`` accept (a remote name, a path, ``file://``, ``git://``, ssh), and git's own
credential helpers apply. Output is parsed in the C locale. A transport failure (remote
unreachable, refused) is ``RemoteUnavailable``; a local plumbing failure is ``GitFailed``.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.errors import GitFailed, MissingDependency, RemoteUnavailable, ValidationError

#: how long one network operation may take before the remote counts as unreachable
NETWORK_TIMEOUT = 60.0
LOCAL_TIMEOUT = 30.0
_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
# A ref name component git accepts as is (check-ref-format); anything else is %-escaped.
_REF_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# fleetclaims commits carry a fixed identity: they record registry data, not anyone's work,
# and must be writable in a clone where user.name/user.email are not configured.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "fleetclaims", "GIT_AUTHOR_EMAIL": "fleetclaims@localhost",
    "GIT_COMMITTER_NAME": "fleetclaims", "GIT_COMMITTER_EMAIL": "fleetclaims@localhost",
}


def ref_component(name: str) -> str:
    """``name`` as one ref name component: [A-Za-z0-9_-] kept, every other byte %XX (so a
    task called ``a/b..c`` or ``x.lock`` is a valid, reversible ref component)."""
    return "".join(c if c in _REF_SAFE else "".join(f"%{b:02X}" for b in c.encode())
                   for c in name)


@dataclass(frozen=True)
class PushResult:
    """The outcome of one push: ``ok``, or the ref was rejected (a compare-and-swap lost)."""

    ok: bool
    rejected: tuple[str, ...] = ()
    detail: str = ""


class Git:
    """``git`` run in one repository (``cwd``)."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd

    def run(self, args: Sequence[str], *, data: bytes | None = None, check: bool = True,
            timeout: float = LOCAL_TIMEOUT, env: Mapping[str, str] | None = None,
            remote: str | None = None) -> subprocess.CompletedProcess[bytes]:
        full_env = dict(os.environ)
        full_env.update(LC_ALL="C", LANGUAGE="C", GIT_OPTIONAL_LOCKS="0")
        if env:
            full_env.update(env)
        try:
            done = subprocess.run(["git", *args], cwd=self.cwd, input=data, capture_output=True,
                                  timeout=timeout, env=full_env, check=False)
        except FileNotFoundError:
            raise MissingDependency("git", "sharing a registry through a git remote",
                                    "install git (https://git-scm.com)") from None
        except subprocess.TimeoutExpired:
            if remote is not None:  # a remote that stopped answering is an unavailable one
                raise RemoteUnavailable(remote, f"no answer within {timeout:g} s") from None
            raise GitFailed(f"git {args[0]}", f"no answer within {timeout:g} s") from None
        if check and done.returncode != 0:
            raise GitFailed(f"git {args[0]}", _last_line(done.stderr))
        return done

    def out(self, args: Sequence[str], **kw: object) -> str:
        return self.run(args, **kw).stdout.decode().strip()  # type: ignore[arg-type]

    # --- local repository --------------------------------------------------------------------

    def git_dir(self) -> str:
        return os.path.abspath(os.path.join(self.cwd, self.out(["rev-parse", "--git-dir"])))

    def rev(self, ref: str) -> str | None:
        done = self.run(["rev-parse", "--verify", "-q", ref + "^{commit}"], check=False)
        text = done.stdout.decode().strip()
        return text if done.returncode == 0 and _SHA.fullmatch(text) else None

    def refs(self, prefix: str) -> dict[str, str]:
        """ref name -> commit for every ref under ``prefix`` (ending in /)."""
        text = self.out(["for-each-ref", "--format=%(objectname) %(refname)", prefix])
        found = {}
        for line in text.splitlines():
            sha, _, name = line.partition(" ")
            found[name] = sha
        return found

    def has(self, sha: str) -> bool:
        return self.run(["cat-file", "-e", sha + "^{commit}"], check=False).returncode == 0

    def is_ancestor(self, old: str, new: str) -> bool:
        done = self.run(["merge-base", "--is-ancestor", old, new], check=False)
        if done.returncode not in (0, 1):
            raise GitFailed("git merge-base", _last_line(done.stderr))
        return done.returncode == 0

    def blob(self, data: bytes) -> str:
        return self.out(["hash-object", "-w", "--stdin"], data=data)

    def tree(self, entries: Iterable[tuple[str, str]]) -> str:
        """A tree of blobs: (name, blob sha) pairs."""
        text = "".join(f"100644 blob {sha}\t{name}\n" for name, sha in sorted(entries))
        return self.out(["mktree"], data=text.encode())

    def commit(self, tree: str, parent: str | None, message: str,
               extra_parents: Sequence[str] = ()) -> str:
        args = ["commit-tree", tree, "-m", message]
        for sha in (parent, *extra_parents):
            if sha:
                args += ["-p", sha]
        return self.out(args, env=_IDENTITY)

    def ls_tree(self, commit: str) -> dict[str, str]:
        """name -> blob sha of the top-level blobs of ``commit``'s tree."""
        text = self.out(["ls-tree", commit])
        found = {}
        for line in text.splitlines():
            meta, _, name = line.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                found[name] = parts[2]
        return found

    def read_blobs(self, shas: Sequence[str]) -> list[bytes]:
        """The contents of ``shas``, in order, read by one ``cat-file --batch``."""
        if not shas:
            return []
        raw = self.run(["cat-file", "--batch"], data="".join(s + "\n" for s in shas).encode()
                       ).stdout
        out, pos = [], 0
        for sha in shas:
            nl = raw.index(b"\n", pos)
            header = raw[pos:nl].split()
            if len(header) != 3 or header[1] != b"blob":
                raise GitFailed("git cat-file", f"object {sha} is not a blob")
            size = int(header[2])
            out.append(raw[nl + 1 : nl + 1 + size])
            pos = nl + 1 + size + 1
        return out

    def update_refs(self, updates: Mapping[str, str | None]) -> None:
        """Set (sha) or delete (None) local refs in one transaction."""
        if not updates:
            return
        lines = "".join(f"update {ref} {sha}\n" if sha else f"delete {ref}\n"
                        for ref, sha in updates.items())
        self.run(["update-ref", "--stdin"], data=lines.encode())

    def default_remote(self) -> str:
        """The current branch's remote, else ``origin``; refused (ValidationError) when the
        repository has no such remote (it was told as the network being down)."""
        branch = self.run(["symbolic-ref", "--short", "-q", "HEAD"], check=False)
        name = branch.stdout.decode().strip()
        if branch.returncode == 0 and name:
            got = self.run(["config", f"branch.{name}.remote"], check=False)
            if got.returncode == 0 and got.stdout.strip():
                return got.stdout.decode().strip()
        listed = self.run(["remote"], check=False)
        remotes = listed.stdout.decode().split() if listed.returncode == 0 else ["origin"]
        if "origin" not in remotes:
            raise ValidationError(
                "remote", "none given, and this repository has no remote named origin (`git "
                f"remote` lists {', '.join(remotes) or 'none'}): name one (fleetclaims sync "
                "REMOTE) or add it (git remote add origin URL)")
        return "origin"

    # --- the remote --------------------------------------------------------------------------

    def ls_remote(self, remote: str, pattern: str) -> dict[str, str]:
        done = self.run(["ls-remote", "--refs", remote, pattern], check=False,
                        timeout=NETWORK_TIMEOUT, env=_NO_PROMPT, remote=remote)
        if done.returncode != 0:
            raise RemoteUnavailable(remote, _last_line(done.stderr))
        found = {}
        for line in done.stdout.decode().splitlines():
            sha, _, name = line.partition("\t")
            found[name] = sha
        return found

    def fetch(self, remote: str, refspecs: Sequence[str], *, prune: bool = False) -> None:
        args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head"]
        if prune:
            args.append("--prune")
        done = self.run([*args, remote, *refspecs], check=False, timeout=NETWORK_TIMEOUT,
                        env=_NO_PROMPT, remote=remote)
        if done.returncode != 0:
            raise RemoteUnavailable(remote, _last_line(done.stderr))

    def push(self, remote: str, updates: Mapping[str, tuple[str | None, str | None]],
             *, atomic: bool = True) -> PushResult:
        """Compare-and-swap ``ref: (expected old sha or None for absent, new sha or None to
        delete)`` on the remote, all or nothing (``--atomic``)."""
        args = ["push", "--porcelain"]
        if atomic and len(updates) > 1:
            args.append("--atomic")
        specs = []
        for ref, (old, new) in updates.items():
            args.append(f"--force-with-lease={ref}:{old or ''}")
            specs.append(f"{new or ''}:{ref}")
        done = self.run([*args, remote, *specs], check=False, timeout=NETWORK_TIMEOUT,
                        env=_NO_PROMPT, remote=remote)
        rejected, refused = [], []
        for line in done.stdout.decode().splitlines():
            flag, _, rest = line.partition("\t")
            if flag == "!":
                ref, _, summary = rest.partition("\t")
                rejected.append(ref.rpartition(":")[2])
                if summary.startswith("[remote rejected]") and not any(
                        race in summary for race in _RACES):
                    refused.append(summary)
        if refused:  # (the remote said no, e.g. a hook: not a lost compare-and-swap)
            raise RemoteUnavailable(remote, f"it refused the push: {refused[0]} "
                                    f"{_last_line(done.stderr)}".strip())
        if rejected:
            return PushResult(False, tuple(rejected), done.stdout.decode().strip())
        if done.returncode != 0:
            raise RemoteUnavailable(remote, _last_line(done.stderr) or _last_line(done.stdout))
        return PushResult(True)


# A "[remote rejected]" that means another push won the ref meanwhile (a lost compare-and-swap
# to retry), not a remote refusing pushes (a hook, a permission).
_RACES = ("failed to update ref", "failed to lock", "cannot lock ref", "atomic push failed",
          "incorrect old value", "stale info", "failed to write")

# No interactive prompt may hang a claim: credentials come from git's helpers or ssh agents.
_NO_PROMPT = {"GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": os.environ.get(
    "GIT_SSH_COMMAND", "ssh -o BatchMode=yes")}


def remote_key(remote: str) -> str:
    """A ref component naming ``remote`` in this clone's bookkeeping refs: a plain remote
    name as is, a URL or path by a hash of it."""
    if remote and all(c in _REF_SAFE for c in remote):
        return remote
    return "u" + hashlib.sha256(remote.encode()).hexdigest()[:16]


def repository_of(path: str) -> str:
    """The working directory of the git repository holding ``path`` (or the current one)."""
    probe = path
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    git = Git(probe or ".")
    done = git.run(["rev-parse", "--show-toplevel"], check=False)
    if done.returncode != 0:
        done = git.run(["rev-parse", "--git-dir"], check=False)  # a bare repository
        if done.returncode != 0:
            raise GitFailed("git rev-parse", f"{path} is not inside a git repository",
                            hint="Keep the registry inside a clone of the repository it "
                            "syncs through (by default it is <clone>/.cache/fleetclaims: run "
                            "fleetclaims there without --dir).")
        return os.path.abspath(os.path.join(probe or ".", done.stdout.decode().strip()))
    return done.stdout.decode().strip()


def _last_line(stderr: bytes) -> str:
    """What git said went wrong: its first fatal: or error: line (the lines after it are often
    advice such as "Please make sure you have the correct access rights and the repository
    exists."), else its last line."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    for line in lines:
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[-1] if lines else "git failed"


__all__ = ["NETWORK_TIMEOUT", "Git", "PushResult", "ref_component", "remote_key",
           "repository_of"]
