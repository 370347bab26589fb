"""Cross-machine claims: a lease kept on the git remote, one ref per task.

``refs/fleetclaims/leases/<task>`` points to a commit whose ``lease.json`` names the holder
(owner, token hash, fence, expiry) or says the task was released or completed; each commit's
parent is the lease before, so the ref's log is the task's history on the remote. Every change
moves the ref by compare-and-swap (``push --force-with-lease=<ref>:<the commit read>``), so two
machines online at the same time cannot both hold the task: the one whose swap lands holds it,
the other gets ``ClaimConflict`` naming the holder.

The local registry stays the first gate (local holders, tokens, rules), and the fence of a
grant is raised above the remote lease's, so fences of a task only grow across machines. Each
remote step is recorded in the local journal (``remote_lease``), so the audit stays in one
place. Order of each operation: read the remote lease (offline: ``RemoteUnavailable``, nothing
changed), decide locally, swap the remote ref; a swap that loses undoes the local grant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from ..core import events as ev
from ..core import rules, validate
from ..core.chain import token_hash
from ..core.errors import (
    ClaimConflict,
    NotHolder,
    RemoteRewritten,
    RemoteUnavailable,
    TaskCompleted,
    ValidationError,
    shown_remote,
)
from ..core.model import UNKNOWN_VERDICT, Claim, Now
from ..core.rules import Decision
from ..core.state import State
from .gitrefs import Git, ref_component, remote_key, repository_of

if TYPE_CHECKING:
    from ..api import Registry

T = TypeVar("T")
LEASES_NS = "refs/fleetclaims/leases/"
_SWAP_TRIES = 5
HELD, RELEASED, COMPLETED = "held", "released", "completed"


def lease_ref(task: str) -> str:
    return LEASES_NS + ref_component(task)


class RemoteLeases:
    """The remote leases of one registry's repository on one remote."""

    def __init__(self, reg: Registry, remote: str | None) -> None:
        kind = reg.store.capabilities.kind
        if kind != "file":  # PostgreSQL holds one lease per task for every machine already
            raise ValidationError("remote", f"remote leases are for a file registry in a git "
                                  f"repository, not a {kind} one", value=remote)
        self.reg = reg
        self.git = Git(repository_of(reg.location))
        self.remote = remote or self.git.default_remote()
        self.shown = shown_remote(self.remote)  # (as messages and the journal name it)

    # --- the remote ref ----------------------------------------------------------------------

    def read(self, task: str) -> tuple[str | None, dict[str, Any] | None]:
        """(commit, lease document) of ``task`` on the remote; (None, None) when it has none."""
        return fetch_lease(self.git, self.remote, task)

    def swap(self, task: str, old: str | None, doc: dict[str, Any]) -> str | None:
        """Move the task's ref from ``old`` to a new lease commit; None when the swap lost."""
        blob = self.git.blob(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")
        commit = self.git.commit(
            self.git.tree([("lease.json", blob)]), old,
            f"fleetclaims lease: {task} {doc['state']} {doc['owner']} fence {doc['fence']}")
        ref = lease_ref(task)
        for attempt in range(_SWAP_TRIES):
            if self.git.push(self.remote, {ref: (old, commit)}).ok:
                return commit
            # Refused. A push that lost its compare-and-swap finds the ref moved; one that met
            # another push holding the ref's lock on the remote (`cannot lock ref`) finds it
            # unchanged, and tries again.
            if self.git.ls_remote(self.remote, ref).get(ref) != old:
                return None
            time.sleep(0.01 * (attempt + 1))
        return None

    def record(self, task: str, action: str, claim_owner: str, fence: int, commit: str | None,
               **extra: Any) -> None:
        event = {"type": ev.REMOTE_LEASE, "task": task, "actor": claim_owner,
                 "owner": claim_owner, "fence": fence, "remote": self.shown,
                 "action": action, "commit": commit or ""}
        event.update({k: v for k, v in extra.items() if v is not None})
        self.reg._run(lambda state, now: Decision((event,)))

    # --- operations --------------------------------------------------------------------------

    def claim(self, task: str, take_stale: bool, preempt: bool,
              grant_args: dict[str, Any]) -> Claim:
        old, lease = self.read(task)
        now = self.reg._now()
        raw, grant = self.reg._grant(**grant_args)
        if lease is not None and live(lease, now.wall) and lease["token_hash"] != grant.token_hash:
            raise self._conflict(task, lease)
        if lease is not None and lease["state"] == COMPLETED:
            # (the local rules would refuse it too, once this clone has the completion)
            raise TaskCompleted(
                task, owner=str(lease["owner"]), fence=int(lease["fence"]), completed_at=None,
                hint=f"It was completed on another machine (git remote {self.shown!r}, "
                f"{lease_ref(task)}): run `fleetclaims sync` to bring that history here, and "
                "reopen it to work on it again.")
        floor = int(lease["fence"]) if lease is not None else 0

        def decide(state: State, now: Now) -> Decision:
            current = state.claims.get(task)
            verdict = UNKNOWN_VERDICT
            if current is not None and current.live and current.token_hash != grant.token_hash:
                verdict = self.reg._verdict(current)
            if floor <= state.fence:
                return rules.decide_claim(state, task, grant, now, verdict,
                                          take_stale=take_stale, preempt=preempt)
            # Above every fence the remote lease carried: fences only grow across machines.
            # The grant records that floor, so a replay knows why it skips fence numbers.
            decision = rules.decide_claim(replace(state, fence=floor), task, grant, now,
                                          verdict, take_stale=take_stale, preempt=preempt)
            return replace(decision, events=tuple(
                {**e, "fence_floor": floor} if e.get("type") in ev.GRANTS else e
                for e in decision.events))

        _, state = self.reg._run(decide)
        mine = state.claims.get(task)
        assert mine is not None
        try:
            commit = self.swap(task, old, document(mine, HELD, state.origin, now.wall))
        except RemoteUnavailable:
            self._undo(task, mine, "the remote became unreachable")
            raise
        if commit is None:
            _, lease = self.read(task)
            self._undo(task, mine, "another machine's swap landed first")
            raise self._conflict(task, lease)
        self.record(task, "claimed", mine.owner, mine.fence, commit,
                    expires_at=mine.expires_at)
        return mine.with_token(raw)

    def change(self, task: str, token: str, action: str, local: Callable[[], T]) -> T:
        """Renew, transition, hand off, release or complete ``task`` here and on the remote:
        ``local()`` runs the local operation once the remote lease is known to be ours."""
        th = token_hash(validate.token(token))
        old, lease = self.read(task)
        ours = lease is not None and lease["token_hash"] == th and lease["state"] == HELD
        if lease is not None and not ours and action != "released":
            raise NotHolder(task, f"the lease on git remote {self.shown!r} is "
                            f"{lease['owner']}'s (fence {lease['fence']}, {lease['state']})",
                            holder=str(lease["owner"]), fence=int(lease["fence"]))
        result = local()
        claim = self.reg.store.read().claims.get(task)
        if not ours or claim is None:
            return result  # not a remote claim (or no longer ours there): local only
        state = {"released": RELEASED, "completed": COMPLETED}.get(action, HELD)
        commit = self.swap(task, old, document(claim, state, self.reg.store.read().origin,
                                               self.reg._now().wall))
        if commit is None:
            self.record(task, "lost", claim.owner, claim.fence, None,
                        reason="the remote lease moved meanwhile")
            raise NotHolder(task, f"the lease on git remote {self.shown!r} moved while this "
                            f"{action.replace('_', ' ')} was being recorded")
        self.record(task, action, claim.owner, claim.fence, commit, expires_at=claim.expires_at)
        return result

    def refence(self, claim: Claim, origin: str) -> bool:
        """After a merge re-granted ``claim`` (one this registry holds through the remote) a
        higher fence: the remote lease carries it too, so the next grant on any machine is
        above it and a commit of the old holder's work under a lower fence is refused. False
        when there is nothing to raise, or the lease moved meanwhile (it is no longer ours)."""
        old, lease = self.read(claim.task)
        if (lease is None or lease["state"] != HELD or lease["token_hash"] != claim.token_hash
                or int(lease["fence"]) >= claim.fence or not claim.live):
            return False
        commit = self.swap(claim.task, old, document(claim, HELD, origin, self.reg._now().wall))
        if commit is None:
            return False
        self.record(claim.task, "refenced", claim.owner, claim.fence, commit,
                    expires_at=claim.expires_at)
        return True

    def _undo(self, task: str, mine: Claim, why: str) -> None:
        """The grant never reached the remote: release it here, and say why."""
        self.reg._run(lambda s, now: rules.decide_release(s, task, mine.token_hash, now))
        self.record(task, "lost", mine.owner, mine.fence, None, reason=why)

    def _conflict(self, task: str, lease: dict[str, Any] | None) -> ClaimConflict:
        lease = lease or {}
        return ClaimConflict(
            task, holder=str(lease.get("owner", "?")), fence=int(lease.get("fence", 0)),
            expires_at=lease.get("expires_at"),
            reason=f"held through git remote {self.shown!r} ({lease_ref(task)})")


def live(lease: dict[str, Any], wall: float) -> bool:
    expires = lease.get("expires_at")
    return lease.get("state") == HELD and (expires is None or float(expires) > wall)


def document(claim: Claim, state: str, origin: str, now: float) -> dict[str, Any]:
    """The lease as the remote keeps it. A claim parked here without a deadline (its owner
    process watched) still expires on the remote after DEFAULT_MAX_PARK: other machines cannot
    see that process die, and a dead owner must not wedge the task for them."""
    expires = claim.expires_at
    if expires is None and state == HELD:
        expires = now + rules.DEFAULT_MAX_PARK
    return {"format": 1, "task": claim.task, "state": state, "owner": claim.owner,
            "token_hash": claim.token_hash, "fence": claim.fence,
            "expires_at": expires, "ttl": claim.ttl, "origin": origin}


def read_lease(git: Git, commit: str) -> dict[str, Any] | None:
    """The lease document of a lease commit, checked; None when it is not one (no
    lease.json, not JSON, a field missing or of the wrong type)."""
    names = git.ls_tree(commit)
    if "lease.json" not in names:
        return None
    try:
        data = orjson.loads(git.read_blobs([names["lease.json"]])[0])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("state") not in (HELD, RELEASED, COMPLETED):
        return None
    fence, expires = data.get("fence"), data.get("expires_at")
    if not (type(fence) is int and fence >= 0 and isinstance(data.get("owner"), str)
            and isinstance(data.get("token_hash"), str)
            and (expires is None or type(expires) in (int, float))):
        return None
    return data


def fetch_lease(git: Git, remote: str, task: str) -> tuple[str | None, dict[str, Any] | None]:
    """(commit, lease document) of ``task`` on ``remote``; (None, None) when it has none."""
    ref = lease_ref(task)
    sha = git.ls_remote(remote, ref).get(ref)
    if sha is None:
        return None, None
    if not git.has(sha):
        local = f"refs/fleetclaims-sync/{remote_key(remote)}/leases/{ref_component(task)}"
        git.fetch(remote, [f"+{ref}:{local}"])
        # What was fetched: the ref may have moved since ls-remote answered.
        sha = git.rev(local)
        if sha is None:
            return None, None
    lease = read_lease(git, sha)
    if lease is None:  # fail closed: a ref we cannot read is nobody's to take
        raise RemoteRewritten(remote, ref, f"its commit {sha[:12]} holds no readable lease")
    return sha, lease


def remote_lease(git: Git, remote: str, task: str) -> dict[str, Any] | None:
    """The lease document of ``task`` on ``remote`` (None: no lease there)."""
    return fetch_lease(git, remote, task)[1]


__all__ = ["LEASES_NS", "RemoteLeases", "document", "fetch_lease", "lease_ref", "live",
           "remote_lease"]
