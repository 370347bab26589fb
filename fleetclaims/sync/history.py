"""``sync``: publish this registry's journal to a git remote and merge the other clones'.

Each registry publishes its sealed journal lines, byte for byte (so every line's hash verifies
as it did here), as blobs of at most CHUNK lines in one commit per sync, under
``refs/fleetclaims/journal/<origin>``; each commit's parent is the one published before, so the
ref only ever moves forward. The ref is moved by compare-and-swap (``push
--force-with-lease``) from the value this sync fetched.

A sync fetches every ``refs/fleetclaims/journal/*`` into this clone's bookkeeping namespace,
checks that each ref still extends what this clone saw there last time (else
``RemoteRewritten``: a force-push or a deletion, and nothing changes here), verifies each new
history line by line with the hash chain, merges it with ``Registry.merge`` (the one
deterministic merge), then publishes its own journal. What it saw is remembered in local refs
``refs/fleetclaims-sync/<remote>/seen/<origin>``, inside ``.git`` where ``git clean`` does not
reach. Offline, the fetch fails first: ``RemoteUnavailable`` and nothing changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..core.chain import check_seal
from ..core.errors import (
    AuditCorrupt,
    GitFailed,
    RegistryBusy,
    RegistryCorrupt,
    RemoteRewritten,
    ValidationError,
    shown_remote,
)
from ..core.merge import Conflict
from ..core.merge_paths import PathConflict
from .gitrefs import Git, remote_key, repository_of

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.state import State

JOURNAL_NS = "refs/fleetclaims/journal/"
CHUNK = 1024  # journal lines per blob: a full blob never changes, so it is written once
FORMAT = 1
_ATTEMPTS = 4  # publishing lost a compare-and-swap to a concurrent sync: fetch and retry


@dataclass(frozen=True)
class SyncReport:
    """What one sync did: the remote, the other registries merged (by origin), the claims
    they changed and the conflicts settled, and the commit published (None: nothing new)."""

    remote: str
    origin: str
    merged: tuple[str, ...] = ()
    imported_events: int = 0
    changed: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    published: str | None = None
    seen: dict[str, str] = field(default_factory=dict)
    restored: int = 0  # journal lines taken back from the remote into an emptied registry
    path_conflicts: tuple[PathConflict, ...] = ()  # reservations granted apart, settled
    skipped: tuple[str, ...] = ()  # "ref: why" of refs holding no history (--accept-rewritten)

    def to_dict(self) -> dict[str, Any]:
        return {"remote": shown_remote(self.remote), "origin": self.origin,
                "merged": list(self.merged),
                "imported_events": self.imported_events, "changed": list(self.changed),
                "conflicts": [c.to_dict() for c in self.conflicts],
                "published": self.published, "registries": dict(sorted(self.seen.items())),
                "restored": self.restored,
                "path_conflicts": [c.to_dict() for c in self.path_conflicts],
                "skipped": list(self.skipped)}


class _Side:
    """This clone's view of one remote: where fetched refs land and what was seen before."""

    def __init__(self, git: Git, remote: str) -> None:
        self.git = git
        self.remote = remote
        self.base = f"refs/fleetclaims-sync/{remote_key(remote)}/"
        self.incoming_ns = self.base + "incoming/"

    def seen_ns(self, our_origin: str) -> str:
        # Per local registry: a registry made anew (after `git clean -fdx`) has seen nothing
        # yet and takes every history back from the remote.
        return f"{self.base}seen/{our_origin or 'new'}/"

    def fetch(self) -> dict[str, str]:
        self.git.fetch(self.remote, [f"+{JOURNAL_NS}*:{self.incoming_ns}*"], prune=True)
        return self._strip(self.git.refs(self.incoming_ns), self.incoming_ns)

    def home(self, location: str) -> str:
        """The local ref naming the last commit this clone published for the registry at
        ``location``: how an emptied registry finds its own history again."""
        key = hashlib.sha256(location.encode()).hexdigest()[:16]
        return f"{self.base}home/{key}"

    def seen(self, our_origin: str) -> dict[str, str]:
        ns = self.seen_ns(our_origin)
        return self._strip(self.git.refs(ns), ns)

    @staticmethod
    def _strip(refs: dict[str, str], prefix: str) -> dict[str, str]:
        return {name[len(prefix):]: sha for name, sha in refs.items()}


def sync(reg: Registry, remote: str | None = None, *, actor: str = "sync",
         accept_rewritten: bool = False, repo: str | None = None) -> SyncReport:
    """Publish ``reg``'s journal to ``remote`` and merge every other registry published
    there. Re-running converges; see the module docstring for the guarantees."""
    if reg.store.capabilities.kind != "file":
        raise ValidationError("registry", "sync shares a file registry through git; a "
                              "PostgreSQL registry is shared by its server already",
                              value=reg.location)
    git = Git(repo or repository_of(reg.location))
    remote = remote or git.default_remote()
    if remote.startswith("-"):
        raise ValidationError("remote", "must be a remote name or URL", value=remote)
    with _one_sync_at_a_time(git):
        return _sync(reg, git, remote, actor, accept_rewritten)


_SYNC_WAIT = 300.0  # seconds a sync waits for another sync of the same repository
_THREADS = threading.Lock()


@contextlib.contextmanager
def _one_sync_at_a_time(git: Git) -> Iterator[None]:
    """Syncs through one repository run one after the other (agents in worktrees of one clone
    share its registry and its refs of what was seen): two at once read each other's
    half-updated refs as a rewritten remote (a false RemoteRewritten) or lost a ref lock
    (`cannot lock ref`, reported as the network). An flock on ``fleetclaims-sync.lock`` in the
    repository's common git directory (beside the refs it guards; never a registry file: a
    POSIX lock there was dropped whenever another descriptor of that file closed), a mutex
    between threads; the second sync then fetches what the first published and goes on."""
    done = git.run(["rev-parse", "--git-common-dir"], check=False)
    common = done.stdout.decode().strip() if done.returncode == 0 else ""
    fd = -1
    if common:
        path = os.path.join(git.cwd, common) if not os.path.isabs(common) else common
        try:
            fd = os.open(os.path.join(path, "fleetclaims-sync.lock"),
                         os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            fd = -1  # (a read-only repository: the sync itself says what is wrong)
    deadline = time.monotonic() + _SYNC_WAIT
    with _THREADS:
        try:
            while fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise RegistryBusy(
                            os.path.join(common, "fleetclaims-sync.lock"), _SYNC_WAIT,
                            holder="another sync through this repository") from None
                    time.sleep(0.05)
            yield
        finally:
            if fd >= 0:
                os.close(fd)  # (releases the flock)


def _sync(reg: Registry, git: Git, remote: str, actor: str,
          accept_rewritten: bool) -> SyncReport:
    side = _Side(git, remote)
    merged: list[str] = []
    changed: set[str] = set()
    conflicts: list[Conflict] = []
    path_conflicts: list[PathConflict] = []
    skipped: dict[str, str] = {}  # refs that hold no history to merge (--accept-rewritten)
    imported = restored = 0
    for _attempt in range(_ATTEMPTS):
        incoming = side.fetch()
        if not restored:
            restored = _restore(reg, git, side, incoming, accept_rewritten)
        our_origin = reg.store.read().origin
        seen = side.seen(our_origin)
        if not accept_rewritten:
            _check_extends(git, remote, seen, incoming)
        # Every new history is verified before any is merged: a bad one changes nothing here.
        theirs = []
        for origin, sha in sorted(incoming.items()):
            if origin == our_origin or seen.get(origin) == sha:
                continue
            try:
                theirs.append((origin, _registry_of(reg, git, remote, origin, sha)))
            except RemoteRewritten as exc:
                if not accept_rewritten:
                    raise
                skipped[origin] = f"{exc.ref}: {exc.reason}"  # (accepted: named, not merged)
        for origin, source in theirs:
            plan = reg.merge(source, actor=actor)
            merged.append(origin)
            imported += plan.imported
            changed.update(plan.changed)
            conflicts.extend(plan.conflicts)
            path_conflicts.extend(plan.path_conflicts)
        # Accepting a rewrite, our commit also descends from what we published before, so the
        # clones that saw that still find their commit in the ref's history.
        heal = seen.get(our_origin) if accept_rewritten else None
        published, ok = _publish(reg, git, remote, incoming, heal, seen.get(our_origin))
        if not ok:
            continue  # another sync of this registry moved our ref meanwhile: fetch again
        state = reg.store.read()
        _refence_leases(reg, remote, state, changed)
        now_seen = {o: s for o, s in incoming.items()
                    if o != state.origin and o not in skipped}
        if published or state.origin in incoming:
            now_seen[state.origin] = published or incoming[state.origin]
        ns = side.seen_ns(state.origin)
        home = {side.home(reg.location): now_seen[state.origin]} if state.origin in now_seen \
            else {}
        git.update_refs({**{ns + o: None for o in seen if o not in now_seen},
                         **{ns + o: s for o, s in now_seen.items()}, **home})
        return SyncReport(remote, state.origin, tuple(merged), imported, tuple(sorted(changed)),
                          tuple(conflicts), published, now_seen, restored,
                          tuple(path_conflicts), tuple(sorted(skipped.values())))
    raise RemoteRewritten(remote, JOURNAL_NS + reg.store.read().origin,
                          f"it kept moving under {_ATTEMPTS} attempts to publish")


def _refence_leases(reg: Registry, remote: str, state: State, changed: set[str]) -> None:
    """The claims a merge changed that this registry holds through a lease on ``remote``:
    a re-granted fence goes to the lease too (fences only grow across machines: a clone that
    never synced claims above it). One ``ls-remote`` of the leases, then one per changed
    live claim that has a lease there."""
    from .remote_lease import LEASES_NS, RemoteLeases, lease_ref

    live = [c for task in sorted(changed) if (c := state.claims.get(task)) is not None and c.live]
    if not live:
        return
    leases = RemoteLeases(reg, remote)
    held = leases.git.ls_remote(remote, LEASES_NS + "*")
    for claim in live:
        if lease_ref(claim.task) in held:
            leases.refence(claim, state.origin)


def _restore(reg: Registry, git: Git, side: _Side, incoming: dict[str, str],
              accept_rewritten: bool) -> int:
    """An emptied registry (its folder removed, e.g. by ``git clean -fdx``) that this clone
    published before takes its own journal back, byte for byte: same origin, same seq and
    hashes, same fences; the number of lines restored (0: nothing to do).

    Only what was published comes back; a store that recorded more (an anchor outside the
    folder) still says what is missing after this."""
    try:
        if reg.store.read().seq:
            return 0
    except RegistryCorrupt as exc:  # the store knows a history lived here (its anchor)
        if not getattr(exc, "origin", None):
            raise
    home = git.rev(side.home(reg.location))
    origin = str(_meta(git, home).get("origin", "")) if home else ""
    if not origin or origin not in incoming:
        return 0
    if not accept_rewritten:
        seen = {o: c for o, c in side.seen(origin).items() if o == origin}
        _check_extends(git, side.remote, seen, incoming)
    lines = _verified_lines(git, side.remote, origin, incoming[origin])
    reg.store.import_events(lines)
    return len(lines)


def _check_extends(git: Git, remote: str, seen: dict[str, str],
                   incoming: dict[str, str]) -> None:
    """Every ref seen before is still there and extends what was seen (its parent chain
    holds the seen commit, and its journal holds the seen head at the same seq)."""
    for origin, old in sorted(seen.items()):
        ref = JOURNAL_NS + origin
        new = incoming.get(origin)
        if new is None:
            raise RemoteRewritten(remote, ref, f"it was deleted (this clone saw {old[:12]})")
        if new == old:
            continue
        if not git.is_ancestor(old, new):
            raise RemoteRewritten(remote, ref, f"{new[:12]} does not extend {old[:12]}, which "
                                  "this clone saw before (force-pushed)")
        was = _meta(git, old)
        lines = _lines(git, new)
        seq = _int(was.get("seq", 0))
        if seq and (len(lines) < seq or _hash_of(lines[seq - 1]) != was.get("head")):
            raise RemoteRewritten(remote, ref, f"its journal no longer holds line {seq} as "
                                  "seen before (truncated or rewritten)")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _hash_of(line: bytes) -> Any:
    """The hash member of a journal line, or None when it is not a JSON object."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return event.get("hash") if isinstance(event, dict) else None


def _meta(git: Git, commit: str) -> dict[str, Any]:
    names = git.ls_tree(commit)
    if "meta.json" not in names:
        return {}
    try:
        data = orjson.loads(git.read_blobs([names["meta.json"]])[0])
    except orjson.JSONDecodeError:
        return {}  # (then nothing is taken from it: the journal itself is verified)
    return data if isinstance(data, dict) else {}


def _lines(git: Git, commit: str) -> list[bytes]:
    names = git.ls_tree(commit)
    chunks = sorted(n for n in names if n.startswith("journal-") and n.endswith(".jsonl"))
    lines: list[bytes] = []
    for blob in git.read_blobs([names[n] for n in chunks]):
        lines.extend(blob.splitlines())
    return lines


def _registry_of(reg: Registry, git: Git, remote: str, origin: str, sha: str) -> Registry:
    """The history published at ``sha`` as an in-memory registry, verified line by line."""
    from ..api import Registry
    from ..store.memory import MemoryStore

    lines = _verified_lines(git, remote, origin, sha)
    store = MemoryStore(clock=reg.clock, location=f"{shown_remote(remote)}#{JOURNAL_NS + origin}")
    store.import_events(lines)
    return Registry(store=store, clock=reg.clock, prober=reg.prober)


def _verified_lines(git: Git, remote: str, origin: str, sha: str) -> list[bytes]:
    """The journal lines published at ``sha``, each checked against its seal, seq and link,
    and the history checked to be registry ``origin``'s."""
    from ..core.model import GENESIS
    from ..store.file.journal import parse_line

    ref = JOURNAL_NS + origin
    try:
        lines = _lines(git, sha)
    except GitFailed as exc:  # (a blob or a tag where a journal commit belongs)
        raise RemoteRewritten(remote, ref, f"it holds no fleetclaims journal ({exc.reason})",
                              hint=_NOT_OURS) from None
    prev, offset, found = GENESIS, 0, ""
    for number, line in enumerate(lines, 1):
        try:
            event = parse_line(line, seq=number, prev=prev, offset=offset, path=ref)
        except AuditCorrupt as exc:
            raise RemoteRewritten(remote, ref, f"its history does not verify: {exc.message}",
                                  hint=_NOT_OURS) from None
        if event.get("type") == "registry_created" and not found:
            found = str(event.get("origin", ""))
        prev, offset = event["hash"], offset + len(line) + 1
    if found != origin:
        raise RemoteRewritten(remote, ref, f"it holds the history of registry {found!r}, "
                              f"not {origin!r}", hint=_NOT_OURS)
    return lines


_NOT_OURS = (
    "Nothing was merged or published. If no clone's registry is published there (a ref pushed "
    "by mistake), remove it from the remote (`git push REMOTE :REF`); `fleetclaims sync "
    "--accept-rewritten` goes on without merging it, and names it.")


def _our_lines(reg: Registry) -> list[bytes]:
    """This registry's journal lines as sealed (re-serialised by the encoder that wrote them,
    and checked against each line's own hash)."""
    lines: list[bytes] = []
    for event in reg.store.iter_events(0):
        if not lines and event["seq"] != 1:  # (the rest of the chain was archived)
            raise ValidationError("remote", f"events 1..{event['seq'] - 1} of this registry "
                                  "were archived (`audit archive`), and a sync publishes the "
                                  "whole journal for other clones to verify from its start: "
                                  "copy the archived segments back into segments/ to sync")
        line = orjson.dumps(event)
        if check_seal(line) != event["hash"]:
            raise AuditCorrupt(reg.location, seq=int(event["seq"]), offset=0, reason=(
                "this line cannot be published byte for byte (written by another encoder)"))
        lines.append(line)
    return lines


def _altered(lines: list[bytes], tree: dict[str, str]) -> bool:
    """Whether a published tree's journal chunks differ from ``lines`` (by blob name)."""
    names = {n for n in tree if n.startswith("journal-") and n.endswith(".jsonl")}
    for i in range(0, len(lines), CHUNK):
        name = f"journal-{i // CHUNK:08d}.jsonl"
        names.discard(name)
        if tree.get(name) != _blob_sha(b"\n".join(lines[i:i + CHUNK]) + b"\n"):
            return True
    return bool(names)


def _blob_sha(data: bytes) -> str:
    # The name git gives a blob (SHA-1 repositories): lets us skip writing chunks the
    # previous commit holds already. A SHA-256 repository never matches and writes them all.
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _publish(reg: Registry, git: Git, remote: str, incoming: dict[str, str],
             heal: str | None = None, last: str | None = None) -> tuple[str | None, bool]:
    """Push this registry's journal when the remote's copy is behind: (commit or None when
    nothing was new, False when the compare-and-swap lost). ``last``: the commit of our ref
    this clone published or saw last."""
    state = reg.store.read()
    if not state.origin or state.seq == 0:
        return None, True
    ref = JOURNAL_NS + state.origin
    parent = incoming.get(state.origin)
    heal = heal if heal and heal != parent and git.has(heal) else None
    old: dict[str, str] = {}
    meta: dict[str, Any] = {}
    lines: list[bytes] | None = None
    if parent is not None and heal is None:
        meta = _meta(git, parent)
        old = git.ls_tree(parent)
        if meta.get("seq") == state.seq and meta.get("head") == state.head:
            if parent == last:
                return None, True
            # Our ref moved without us, to the head we have: its lines must be ours too (a
            # commit pushed there with an edited line and the same meta.json stopped every
            # other clone while this one saw nothing new).
            lines = _our_lines(reg)
            if not _altered(lines, old):
                return None, True
            raise RemoteRewritten(
                remote, ref, f"commit {parent[:12]} on it holds lines this journal does not "
                "have under the same head (changed on the remote)", hint=(
                    "This registry's journal here is whole; `fleetclaims sync "
                    "--accept-rewritten` publishes it again over the changed copy. Find out "
                    "who pushed it (the remote's reflog)."))
    lines = _our_lines(reg) if lines is None else lines
    theirs = _int(meta.get("seq"))
    if theirs and (theirs > len(lines) or _hash_of(lines[theirs - 1]) != meta.get("head")):
        # The remote holds a history of this registry that ours does not extend: another copy
        # of this folder published it (or ours was cut since). Never pushed over.
        raise RemoteRewritten(remote, ref, f"it holds this registry's line {theirs} with a "
                              "hash this journal does not have there: another copy of this "
                              "registry (the same origin: a copied folder?) published a "
                              "different history, or this journal was cut since. Keep one "
                              "copy; give the other a history of its own (`fleetclaims init "
                              "--new-history` there, then `fleetclaims merge` the kept one)")
    meta_doc = {"format": FORMAT, "origin": state.origin, "seq": len(lines),
                "head": orjson.loads(lines[-1])["hash"], "fence": state.fence, "chunk": CHUNK}
    entries = [("meta.json", git.blob(orjson.dumps(meta_doc, option=orjson.OPT_SORT_KEYS)))]
    for i in range(0, len(lines), CHUNK):
        data = b"\n".join(lines[i:i + CHUNK]) + b"\n"
        name = f"journal-{i // CHUNK:08d}.jsonl"
        sha = _blob_sha(data)
        entries.append((name, sha if old.get(name) == sha else git.blob(data)))
    commit = git.commit(git.tree(entries), parent,
                        f"fleetclaims journal {state.origin}: seq {meta_doc['seq']}",
                        () if heal is None else (heal,))
    result = git.push(remote, {ref: (parent, commit)})
    return (commit, True) if result.ok else (None, False)


__all__ = ["CHUNK", "JOURNAL_NS", "SyncReport", "sync"]
