"""The public facade: ``Registry``. What ``Registry.hold`` returns, ``Lease``, lives in
``_lease.py``; the listings, counts and event pages are computed in ``_reads.py``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from . import _open, _paths, _reads, _wait
from ._lease import Lease
from ._queue_api import QueueMethods
from ._reads import OwnerStats, Stats
from .core import events as ev
from .core import rules, validate
from .core.chain import token_hash
from .core.errors import AccessDenied, AuditCorrupt, ValidationError
from .core.model import DEAD, UNKNOWN_VERDICT, Claim, Identity, Now, Verdict
from .core.rules import Decision, Grant, SweepReport
from .core.state import State
from .store.base import EventPage, Store, VerifyReport
from .system import Clock, Prober, SystemClock, SystemProber

if TYPE_CHECKING:  # imported where used: a cold CLI command should not pay for them
    from .core.explain import Explanation
    from .core.merge import MergePlan
    from .core.prune import PruneReport
    from .sync.history import SyncReport
    from .sync.remote_lease import RemoteLeases

Durability = Literal["full", "process"]


def new_token() -> str:
    """A fresh secret token: 192 bits from the OS CSPRNG via ``secrets``."""
    # Imported here: ``secrets`` pulls in random, base64 and hmac (~6 ms), which read-only
    # commands (list, show, audit) never need.
    import secrets

    # A token that starts with "-" reads as an option to a shell script's `--token $T`
    # (argparse refuses it); drawing again costs nothing and keeps 192 random bits.
    while (token := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return token


class Registry(QueueMethods):
    """A claims registry. ``path`` is a directory (the embedded file store) or a
    ``postgresql://`` URL; None picks the default location (see ``fleetclaims.location``).

    ``durability="full"`` (default) makes every acknowledged change survive power loss;
    ``"process"`` skips fsync: changes survive a crash of any process, not of the machine."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        durability: Durability = "full",
        lock_timeout: float | None = None,
        clock: Clock | None = None,
        prober: Prober | None = None,
        allow_unsafe_fs: bool | None = None,
        store: Store | None = None,
        schema: str | None = None,
        create: bool = True,
        remote: str | None = None,
    ) -> None:
        self.remote = _open.remote(remote)  # claims take a lease on this git remote too
        if durability not in ("full", "process"):
            raise ValidationError("durability", "must be 'full' or 'process'", value=durability)
        for name, flag in (("allow_unsafe_fs", allow_unsafe_fs), ("create", create)):
            if flag is not None and not isinstance(flag, bool):
                raise ValidationError(name, "must be True or False", value=flag)
        if schema is not None and not isinstance(schema, str):
            raise ValidationError("schema", "must be a string", value=schema)
        lock_timeout = _open.lock_timeout(lock_timeout)
        self.clock: Clock = clock or SystemClock()
        self.prober: Prober = prober or SystemProber()
        if allow_unsafe_fs is None:
            allow_unsafe_fs = os.environ.get("FLEETCLAIMS_ALLOW_UNSAFE_FS", "") not in ("", "0")
        self.store = store if store is not None else _open.open_store(
            path, durability=durability, lock_timeout=lock_timeout, clock=self.clock,
            schema=schema, allow_unsafe_fs=allow_unsafe_fs, create=create)
        self.location = self.store.location

    # --- helpers -----------------------------------------------------------------------------

    def _now(self) -> Now:
        """The clock decisions use: the store's (PostgreSQL: the server's) or ours."""
        return self.store.now()

    def _run(self, decide: Callable[[State, Now], Decision]) -> tuple[Decision, State]:
        decision, state = self.store.transact(decide)
        if decision.error is not None:
            raise decision.error
        return decision, state

    def _verdict(self, claim: Claim | None) -> Verdict:
        if claim is None or not claim.live:
            return UNKNOWN_VERDICT
        return self.prober.verdict(claim.identity)

    def _verdicts(self, claims: Iterable[Claim]) -> Callable[[Claim | None], Verdict]:
        """One verdict per owner process, probed now (before the registry lock, from the state
        this handle last saw: no I/O) for ``claims``; a claim whose owner was not probed then
        (the state changed meanwhile) is probed when asked. For one decision only: a verdict
        is a fact of the moment."""
        memo: dict[Identity | None, Verdict] = {}
        for c in claims:
            if c.live and c.identity not in memo:
                memo[c.identity] = self.prober.verdict(c.identity)

        def verdict(claim: Claim | None) -> Verdict:
            if claim is None or not claim.live:
                return UNKNOWN_VERDICT
            found = memo.get(claim.identity)
            if found is None:
                found = memo[claim.identity] = self.prober.verdict(claim.identity)
            return found

        return verdict

    def _seen(self, task: str | None = None) -> list[Claim]:
        """The claims (of ``task``) as this handle last saw them, without I/O or the lock
        (a store that cannot say so cheaply: none; then probes happen in the decision)."""
        peek = getattr(self.store, "peek", None)
        state: State | None = peek() if peek is not None else None
        if state is None:
            return []
        if task is None:
            return [c for c in state.claims.values() if c.live]
        found = state.claims.get(task)
        return [] if found is None else [found]

    def _grant(
        self,
        owner: str,
        token: str | None,
        ttl: float | None,
        *,
        priority: int = 100,
        note: str | None = None,
        metadata: dict[str, Any] | None = None,
        process: bool | int = True,
        allow_parked: bool = False,
    ) -> tuple[str, Grant]:
        raw = new_token() if token is None else validate.token(token)
        grant = Grant(
            owner=validate.owner(owner),
            token_hash=token_hash(raw),
            ttl=validate.ttl(ttl, allow_none=allow_parked),
            priority=validate.priority(priority),
            note=validate.text("note", note),
            metadata=validate.json_value("metadata", metadata, mapping=True),
            identity=self._identity(process),
        )
        return raw, grant

    def _identity(self, process: bool | int) -> Identity | None:
        process = validate.process(process)
        if process is True:
            return self.prober.identity()
        if process is False:
            return None
        return self.prober.identity_of(process)

    def _leases(self, remote: str | None) -> RemoteLeases | None:
        return _open.leases(self, self.remote if remote is None else _open.remote(remote))

    @staticmethod
    def _token(token: str | None) -> str:
        if token is None:
            raise ValidationError("token", "is required (the token returned by claim)")
        return token_hash(validate.token(token))

    # --- operations --------------------------------------------------------------------------

    def claim(
        self,
        task: str,
        *,
        owner: str,
        ttl: float = validate.DEFAULT_TTL,
        note: str | None = None,
        priority: int = 100,
        metadata: dict[str, Any] | None = None,
        token: str | None = None,
        take_stale: bool = False,
        preempt: bool = False,
        process: bool | int = True,
        remote: str | None = None,
        wait: float | None = None,
        paths: Iterable[str] | None = None,
        shared_paths: Iterable[str] | None = None,
    ) -> Claim:
        """Claim ``task`` for ``owner`` for ``ttl`` seconds. Raises ClaimConflict when anyone
        holds it live, TaskCompleted when it is done. The returned claim carries the token.
        With ``wait`` (seconds), wait that long for the holder to let go (see ``_wait``).
        ``process`` names the owner process whose death makes the claim stale before its lease
        ends: True (default) this process, an int another PID, False none (lease only).
        ``remote`` (default: the registry's) also takes the lease on that git remote.
        ``paths``/``shared_paths`` reserve path patterns with the claim (core/paths.py): a
        conflict with another live claim's is ``PathConflict``."""
        task = validate.task(task)
        take_stale = validate.flag("take_stale", take_stale)
        preempt = validate.flag("preempt", preempt)
        wait = _wait.check_wait(wait)
        if remote:  # (checked before the remote is looked up: refused, never dropped)
            _paths.not_remote(paths, shared_paths)
        if (leases := self._leases(remote)) is not None:
            _paths.not_remote(paths, shared_paths)  # (the registry's own remote)
            return leases.claim(task, take_stale, preempt, dict(owner=owner, token=token, ttl=ttl,
                                priority=priority, note=note, metadata=metadata, process=process))
        raw, grant = self._grant(owner, token, ttl, priority=priority, note=note,
                                 metadata=metadata, process=process)
        grant = _paths.with_paths(grant, paths, shared_paths)

        # The holder's liveness is probed before the lock (nothing slow under it): the decision
        # reuses that verdict when the holder is still the same process, else probes again.
        held = [c for c in self._seen(task) if c.live and c.token_hash != grant.token_hash]
        verdicts = self._verdicts(held) if held else self._verdict

        def decide(state: State, now: Now) -> Decision:
            nonlocal verdicts
            current = state.claims.get(task)
            verdict = UNKNOWN_VERDICT
            if current is not None and current.live and current.token_hash != grant.token_hash:
                verdict = verdicts(current)
                verdicts = self._verdict  # a retry (wait=) probes afresh
            return rules.decide_claim(state, task, grant, now, verdict,
                                      take_stale=take_stale, preempt=preempt)

        _, state = _wait.transact(self, decide, wait)
        return self._mine(state, task, raw)

    def _mine(self, state: State, task: str, raw: str) -> Claim:
        claim = state.claims.get(task)
        assert claim is not None
        return ev.with_token(claim, raw)

    def renew(self, task: str, *, token: str, ttl: float | None = None,
              process: bool | int = True, remote: str | None = None) -> Claim:
        """Extend the lease by ``ttl`` (default: the claim's ttl) from now. An owner process
        proven dead (a holder restarted with its token) is replaced by ``process`` (as claim)."""
        if (leases := self._leases(remote)) is not None:
            return leases.change(task, token, "renewed",
                                 lambda: self.renew(task, token=token, ttl=ttl, remote=""))
        task, th = validate.task(task), self._token(token)
        ttl = validate.ttl(ttl, allow_none=True)
        rebind = self._rebind(task, th, process)
        _, state = self._run(lambda s, now: rules.decide_renew(s, task, th, ttl, now, rebind))
        return self._mine(state, task, token)

    def _rebind(self, task: str, th: str, process: bool | int) -> rules.Rebind | None:
        """(its dead owner process, ``process``) for a holder restarted with its token."""
        seen = self._seen(task) or [c for c in [self.store.read().claims.get(task)] if c]
        mine = [c.identity for c in seen if c.token_hash == th and c.identity is not None]
        dead = mine and self.prober.verdict(mine[0]).state == DEAD
        return (mine[0], self._identity(process)) if dead else None

    def release(
        self,
        task: str,
        *,
        token: str | None = None,
        force: bool = False,
        reason: str | None = None,
        actor: str = "operator",
        remote: str | None = None,
    ) -> bool:
        """Give the task up. True when a live claim was released; False when there was nothing
        live to release. ``force=True`` releases whoever holds it and records ``reason``."""
        task = validate.task(task)
        if not force and token is not None and (leases := self._leases(remote)) is not None:
            return bool(leases.change(task, token, "released",
                                      lambda: self.release(task, token=token, remote="")))
        if validate.flag("force", force):
            why = validate.required_reason(reason, "say why you release someone's claim")
            who = validate.owner(actor, "actor")
            decision, _ = self._run(lambda s, now: rules.decide_force_release(s, task, who, why))
            return bool(decision.result)
        th = self._token(token)
        decision, _ = self._run(lambda s, now: rules.decide_release(s, task, th, now))
        return bool(decision.result)

    def complete(self, task: str, *, token: str, result: Any = None,
                 remote: str | None = None) -> Claim:
        """Mark the task done. Refused (LeaseExpired) once the lease has run out."""
        if (leases := self._leases(remote)) is not None:
            return leases.change(task, token, "completed", lambda: self.complete(
                task, token=token, result=result, remote=""))
        task, th = validate.task(task), self._token(token)
        result = validate.json_value("result", result)
        _, state = self._run(lambda s, now: rules.decide_complete(s, task, th, result, now))
        return self._mine(state, task, token)

    def recover(
        self,
        task: str,
        *,
        owner: str,
        reason: str,
        ttl: float = validate.DEFAULT_TTL,
        note: str | None = None,
        priority: int = 100,
        process: bool | int = True,
    ) -> Claim:
        """Take over a stale claim (expired lease or owner proven dead); recorded with the
        previous owner, fence and reason. A live owner is never robbed (ClaimConflict).
        ``process`` as for ``claim``."""
        task = validate.task(task)
        why = validate.required_reason(reason, "say why you take the task over")
        raw, grant = self._grant(owner, None, ttl, priority=priority, note=note, process=process)

        def decide(state: State, now: Now) -> Decision:
            return _paths.recover_checked(state, rules.decide_recover(
                state, task, grant, why, now, self._verdict(state.claims.get(task))), now)

        _, state = self._run(decide)
        return self._mine(state, task, raw)

    def transition(
        self, task: str, *, token: str, phase: str, ttl: float | None = None,
        max_park: float | None = None, process: bool | int = True, remote: str | None = None,
    ) -> Claim:
        """Move the claim to another phase (e.g. ``review``). ``ttl=None`` parks it: no lease; it
        ends with the owner process, or after ``max_park`` s (a day when none is recorded)."""
        if (leases := self._leases(remote)) is not None:
            return leases.change(task, token, "transitioned", lambda: self.transition(
                task, token=token, phase=phase, ttl=ttl, max_park=max_park, remote=""))
        task, th, ph = validate.task(task), self._token(token), validate.phase(phase)
        ttl = validate.ttl(ttl, allow_none=True)
        max_park = validate.ttl(max_park, allow_none=True, name="max_park")
        rebind = self._rebind(task, th, process)  # (as renew)
        _, state = self._run(lambda s, now: rules.decide_transition(s, task, th, ph, ttl, now,
                                                                    max_park, rebind))
        return self._mine(state, task, token)

    def handoff(
        self,
        task: str,
        *,
        token: str,
        to_owner: str,
        note: str | None = None,
        ttl: float | None = None,
        remote: str | None = None,
    ) -> Claim:
        """Give the claim to ``to_owner`` with a new token and fence (returned on the claim)."""
        if (leases := self._leases(remote)) is not None:
            return leases.change(task, token, "handed_off", lambda: self.handoff(
                task, token=token, to_owner=to_owner, note=note, ttl=ttl, remote=""))
        task, th = validate.task(task), self._token(token)
        raw, grant = self._grant(to_owner, None, ttl, note=note, process=False,
                                 allow_parked=True)
        _, state = self._run(lambda s, now: rules.decide_handoff(s, task, th, grant, now))
        return self._mine(state, task, raw)

    def reserve(self, task: str, *, token: str, paths: Iterable[str] | None = None,
                shared_paths: Iterable[str] | None = None) -> Claim:
        """Add path reservations to the held claim of ``task`` (PathConflict on overlap)."""
        return _paths.reserve_paths(self, task, token, paths, shared_paths)

    def unreserve(self, task: str, *, token: str, paths: Iterable[str] | None = None) -> Claim:
        """Drop path reservations from the held claim of ``task`` (all when ``paths`` is None)."""
        return _paths.unreserve_paths(self, task, token, paths)

    def reopen(self, task: str, *, reason: str, actor: str = "operator") -> Claim | None:
        """Make a completed task claimable again. None when it was not completed."""
        task = validate.task(task)
        why = validate.required_reason(reason, "say why the task is reopened")
        who = validate.owner(actor, "actor")
        decision, state = self._run(lambda s, now: rules.decide_reopen(s, task, who, why))
        return state.claims.get(task) if decision.result else None

    def sweep(self, *, dry_run: bool = False, actor: str = "sweeper") -> SweepReport:
        """Record ``lease_expired`` for every claim whose lease ran out or whose owner is dead."""
        who = validate.owner(actor, "actor")
        dry_run = validate.flag("dry_run", dry_run)

        def decide(state: State, now: Now) -> Decision:
            # one probe per owner process, made before the lock for the claims already seen
            return rules.decide_sweep(state, now, verdicts, who)

        if dry_run:
            state = self.store.read()
            verdicts = self._verdicts(())
            decision = decide(state, self._now())
        else:
            verdicts = self._verdicts(self._seen())
            decision, _ = self._run(decide)
        assert isinstance(decision.result, SweepReport)
        return decision.result

    def prune(self, older_than: float | str, *, actor: str = "fleetclaims",
              dry_run: bool = False) -> PruneReport:
        """Remove from the live state the records of claims that ended (released or completed)
        more than ``older_than`` ago (seconds, or a duration such as ``"90d"``), recorded as
        one ``claims_pruned`` event. A completed task keeps a compact record (owner, fence,
        completion time), so it stays refused to ``claim`` until ``reopen``; the journal keeps
        every event. Nothing is pruned unless this is called."""
        from .core import prune
        from .core.durations import parse_duration

        who = validate.owner(actor, "actor")
        dry_run = validate.flag("dry_run", dry_run)
        if isinstance(older_than, str):
            age = parse_duration(older_than, "older_than")
        elif isinstance(older_than, (int, float)) and not isinstance(older_than, bool):
            age = float(older_than)
        else:
            raise ValidationError("older_than", "must be seconds or a duration such as 90d",
                                  value=older_than)
        if not age >= 0 or age == float("inf"):
            raise ValidationError("older_than", "must be a finite duration, 0 or more",
                                  value=older_than)

        def decide(state: State, now: Now) -> Decision:
            return prune.decide_prune(state, now.wall - age, who, dry_run=dry_run)

        decision = decide(self.store.read(), self._now()) if dry_run else self._run(decide)[0]
        if decision.events:
            from .store.file.faults import crash_point

            crash_point("prune.after_sync")
        assert isinstance(decision.result, prune.PruneReport)
        return decision.result

    def merge(
        self, other: str | os.PathLike[str] | Registry, *, actor: str = "merge"
    ) -> MergePlan:
        """Merge another registry (a directory copied from another machine, or a Registry) into
        this one. Idempotent; merging A into B and B into A yields the same claims."""
        from .core.merge import plan_merge

        who = validate.owner(actor, "actor")
        if not isinstance(other, (str, os.PathLike, Registry)):
            raise ValidationError("other", "must be a registry directory, a postgresql:// URL "
                                  "or a Registry", value=other)
        # (create=False: a path that is not a registry is refused before anything is made)
        source = other if isinstance(other, Registry) else Registry(
            other, clock=self.clock, prober=self.prober, allow_unsafe_fs=True, create=False
        )
        report = source.verify()
        if not report.ok:
            raise AuditCorrupt(source.location, seq=report.seq or 0, offset=report.offset or 0,
                               reason=f"refusing to merge a damaged registry: {report.error}")
        theirs = source.store.read()
        their_events = list(source.store.iter_events(0))
        if source.location == self.location:
            raise ValidationError("other", "is this same registry; nothing to merge")
        plan_box: list[MergePlan] = []

        def decide(state: State, now: Now) -> Decision:
            ours = list(self.store.iter_events(0))
            plan = plan_merge(state, ours, theirs, their_events, now,
                              source=source.location, actor=who)
            plan_box.append(plan)
            return Decision(plan.events)

        self._run(decide)
        return plan_box[-1]

    def sync(self, remote: str | None = None, *, actor: str = "sync",
             accept_rewritten: bool = False) -> SyncReport:
        """Publish to the git ``remote`` and merge what others published (fleetclaims.sync)."""
        from .sync.history import sync

        return sync(self, _open.remote(remote) or self.remote, actor=validate.owner(actor, "actor"),
                    accept_rewritten=validate.flag("accept_rewritten", accept_rewritten))

    def explain(self, task: str) -> Explanation:
        """Who holds ``task`` and why, from the audit log alone."""
        from .core.explain import explain

        task = validate.task(task)
        quick = getattr(self.store, "task_events", None)  # (the file store: a bytes filter)
        if quick is not None:
            found = list(_reads.verified_part(self.store, quick(task)))
            return explain(task, found, getattr(self.store, "archived_through", int)())
        return explain(task, [e for e in self.store.iter_events(0)
                              if e.get("task") == task or e.get("type") == "registries_merged"])

    # --- reading -----------------------------------------------------------------------------

    def get(self, task: str) -> Claim | None:
        """The latest record of ``task`` (any state), or None if it was never claimed."""
        return self.store.read().claims.get(validate.task(task))

    def claims(
        self,
        owner: str | None = None,
        include_expired: bool = False,
        include_completed: bool = False,
        include_released: bool = False,
    ) -> list[Claim]:
        """Claims sorted by task: live ones, plus expired/completed/released when asked."""
        owner = _listing(owner, include_expired, include_completed, include_released)
        return _reads.listed_claims(self.store.read(), self._now(), owner, include_expired,
                                    include_completed, include_released)

    def claims_data(
        self,
        owner: str | None = None,
        include_expired: bool = False,
        include_completed: bool = False,
        include_released: bool = False,
    ) -> list[dict[str, Any]]:
        """``claims()`` as persisted dicts (sorted by task), without building Claim objects for
        snapshot entries nothing has touched: what a cold ``fleetclaims claims --json`` needs.
        Each dict is new (yours to change) and has every optional member (None when unset)."""
        owner = _listing(owner, include_expired, include_completed, include_released)
        return _reads.listed_data(self.store.read(), self._now(), owner, include_expired,
                                  include_completed, include_released)

    def is_stale(self, claim: Claim) -> str | None:
        """Why ``claim`` may be taken over now, or None."""
        _claim_arg(claim)
        return rules.stale_reason(claim, self._now(), self._verdict(claim))

    def verdict(self, claim: Claim) -> Verdict:
        """The liveness verdict of the claim's owner process."""
        _claim_arg(claim)
        return self.prober.verdict(claim.identity)

    def stats(self) -> Stats:
        """Claims by kind (active, expired, completed, released) and per owner, and the work
        queue's tasks by readiness."""
        return _reads.count(self.store.read(), self._now())

    def events(
        self,
        after: int = 0,
        limit: int = 100,
        types: Iterable[str] | None = None,
        task: str | None = None,
        owner: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> EventPage:
        """A page of committed events with seq > ``after`` matching the filters, oldest first.
        Pass ``page.next_cursor`` as ``after`` for the next page."""
        after = validate.cursor("after", after)
        since = validate.timestamp("since", since)
        until = validate.timestamp("until", until)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ValidationError("limit", "must be an integer from 1 to 100000", value=limit)
        wanted = validate.event_types(types, ev.ALL_TYPES)
        task = None if task is None else validate.task(task)
        owner = None if owner is None else validate.owner(owner)
        return _reads.events(self.store, after, limit, wanted, task, owner, since, until)

    def verify(self) -> VerifyReport:
        """Check the whole journal (hash chain, sequence) and the snapshot against it."""
        try:
            return self.store.verify()
        except PermissionError as exc:
            raise AccessDenied(self.location, f"cannot read {exc.filename or 'a file'}: "
                               f"{exc.strerror}") from None

    def hold(
        self,
        task: str,
        *,
        owner: str,
        ttl: float = 60.0,
        note: str | None = None,
        priority: int = 100,
        metadata: dict[str, Any] | None = None,
        take_stale: bool = False,
    ) -> Lease:
        """Claim ``task`` and keep renewing it in a background thread; use with ``with``."""
        claim = self.claim(task, owner=owner, ttl=ttl, note=note, priority=priority,
                           metadata=metadata, take_stale=take_stale)
        return Lease(self, claim)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

def _listing(owner: object, *flags: object) -> str | None:
    """The arguments of a listing, typed: an owner (or None) and the include_* flags."""
    for name, value in zip(("include_expired", "include_completed", "include_released"), flags,
                           strict=True):
        validate.flag(name, value)
    return None if owner is None else validate.owner(owner)


def _claim_arg(claim: object) -> None:
    if not isinstance(claim, Claim):
        raise ValidationError("claim", "must be a Claim (from get, claims or claim)",
                              value=claim)


__all__ = ["Durability", "Lease", "OwnerStats", "Registry", "Stats", "new_token"]
