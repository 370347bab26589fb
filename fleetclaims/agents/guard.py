"""``fleetclaims guard``: is the claim this process works under still live and still ours?

``fleetclaims run`` exports ``FLEETCLAIMS_TASK``, ``FLEETCLAIMS_TOKEN`` and ``FLEETCLAIMS_FENCE``
to its command. A git hook calls the guard before a commit or a push, so work done after the
lease was lost (recovered by someone else, handed off, preempted, expired) is refused instead of
landing unfenced. The check only reads the registry: a hook must never change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import FleetclaimsError

if TYPE_CHECKING:
    from ..api import Registry


@dataclass(frozen=True, slots=True)
class GuardResult:
    """The outcome of one check: ``ok``, or a refusal saying why and what to do next.

    ``code`` is an error code (``invalid``, ``fence_mismatch``, ``stale``, ``lease_expired``
    ...); the command line turns it into the exit status (cli.output.EXIT_CODES)."""

    ok: bool
    task: str | None = None
    fence: int | None = None
    code: str = "ok"
    reason: str = ""
    next_action: str = ""
    holder: str | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = {"ok": self.ok, "task": self.task, "fence": self.fence, "code": self.code,
               "reason": self.reason, "next_action": self.next_action, "holder": self.holder}
        if not self.ok:  # (as every other --json refusal: its code under "error" too)
            doc["error"] = self.code
        return doc


@dataclass(frozen=True, slots=True)
class ClaimEnv:
    """The claim a ``fleetclaims run`` child works under, as read from its environment."""

    task: str
    token: str
    fence: int


def claim_env(env: Mapping[str, str]) -> ClaimEnv | GuardResult | None:
    """The claim named by the environment; None outside a claimed run; a refusal when the
    environment names a task but not its token or a valid fence (fail closed: a half-set
    environment is a mistake, never a reason to let the work through)."""
    task = env.get("FLEETCLAIMS_TASK", "")
    if not task:
        return None
    token = env.get("FLEETCLAIMS_TOKEN", "")
    fence_text = env.get("FLEETCLAIMS_FENCE", "")
    missing = [n for n, v in (("FLEETCLAIMS_TOKEN", token), ("FLEETCLAIMS_FENCE", fence_text))
               if not v]
    if missing:
        return GuardResult(
            False, task, code="invalid",
            reason=f"FLEETCLAIMS_TASK is set but {' and '.join(missing)} is not",
            next_action="Work under `fleetclaims run TASK --owner O -- CMD`, which exports all "
            "three, or unset FLEETCLAIMS_TASK outside a claimed run.")
    try:
        fence = int(fence_text)
    except ValueError:
        fence = -1
    bad_task = _bad_task(task)
    if bad_task:
        return GuardResult(False, None, code="invalid",
                           reason=f"FLEETCLAIMS_TASK is not a task id: {bad_task}",
                           next_action="Export the task as claim printed it (or use fleetclaims "
                           "run, which exports it).")
    if fence < 1 or fence > FENCE_MAX:
        return GuardResult(False, task, code="invalid",
                           reason=f"FLEETCLAIMS_FENCE is not a positive integer: {fence_text!r}",
                           next_action="Export the fence printed by claim (or use fleetclaims "
                           "run, which exports it).")
    return ClaimEnv(task, token, fence)


FENCE_MAX = 2**63 - 1  # (fences are 64-bit everywhere: JSON readers, PostgreSQL bigint)


def _bad_task(task: str) -> str | None:
    """Why ``task`` (from the environment) is not a task id, or None."""
    from ..core import validate
    from ..core.errors import ValidationError

    try:
        validate.task(task)
    except ValidationError as exc:
        return exc.reason
    return None


def check(reg: Registry, claim: ClaimEnv) -> GuardResult:
    """Whether ``claim`` is the live, unexpired holding of its task, with the same fence, and
    its owner process is not proven dead. Reads the registry; writes nothing."""
    from ..core import rules, validate
    from ..core.chain import token_hash

    try:
        th = token_hash(validate.token(claim.token))
        state = reg.store.read()
        # The same clock every decision of this registry uses (PostgreSQL: the server's), and
        # the same holder test renew/complete apply, so the guard and the registry agree on
        # why a holder lost its task.
        now = reg._now()
        current, refusal = rules.holder_check(state, validate.task(claim.task), th, now)
    except FleetclaimsError as exc:
        return refused(claim, exc)
    if current is None:
        assert refusal.error is not None
        return refused(claim, refusal.error)
    if current.fence != claim.fence:
        return GuardResult(
            False, claim.task, claim.fence, code="fence_mismatch",
            holder=current.owner,
            reason=f"the claim on {claim.task!r} now has fence {current.fence}, not "
            f"{claim.fence}: the work was started under an earlier grant",
            next_action="Stop and check `fleetclaims explain " + claim.task + "`; "
            "redo the work under the current claim.")
    stale = reg.is_stale(current)
    if stale is not None:
        return GuardResult(
            False, claim.task, claim.fence, code="stale",
            holder=current.owner,
            reason=f"the claim on {claim.task!r} (fence {claim.fence}) is stale: {stale}",
            next_action="Anyone may take it over now; renew it if you still run, or recover "
            f"it: `fleetclaims recover {claim.task} --owner {current.owner} --reason ...`.")
    return GuardResult(True, claim.task, claim.fence, holder=current.owner,
                       reason=f"{current.owner} holds {claim.task!r} (fence {claim.fence})")


def check_fences(repo: str, remote: str, trailers: str) -> GuardResult:
    """pre-push: the ``Claim: TASK fence N`` trailers of the commits being pushed (one value a
    line) against each task's lease on the git ``remote`` (``claim --remote``). A fence below
    the lease's is work started under a grant since replaced: refused (``fence_mismatch``). A
    task without a remote lease passes; a remote that cannot be read refuses (fail closed: the
    push could not reach it either)."""
    from ..sync.gitrefs import Git
    from ..sync.remote_lease import remote_lease

    lowest: dict[str, int] = {}
    for line in trailers.splitlines():
        task, _, number = line.strip().rpartition(" fence ")
        if task and number.isdigit():  # anything else is not a trailer of ours
            lowest[task] = min(int(number), lowest.get(task, int(number)))
    git = Git(repo)
    for task, fence in sorted(lowest.items()):
        try:
            lease = remote_lease(git, remote, task)
        except FleetclaimsError as exc:
            return GuardResult(False, task, fence, code=exc.code, reason=exc.message,
                               next_action=exc.hint or "Check the remote, then push again.")
        if lease is not None and fence < int(lease["fence"]):
            holder = str(lease["owner"])
            return GuardResult(
                False, task, fence, code="fence_mismatch", holder=holder,
                reason=f"a commit carries fence {fence} for {task!r}, below the fence "
                f"{lease['fence']} of its lease on {remote!r} ({holder}, {lease['state']})",
                next_action=f"That work was started under an earlier grant; check `fleetclaims "
                f"explain {task}` and redo it under the current claim.")
    return GuardResult(True, reason=f"{len(lowest)} claimed task(s) checked against {remote!r}")


def refused(claim: ClaimEnv, exc: FleetclaimsError) -> GuardResult:
    """The refusal for ``claim`` that ``exc`` (raised while checking it) stands for."""
    holder = getattr(exc, "holder", None)
    return GuardResult(False, claim.task, claim.fence, code=exc.code,
                       reason=exc.message, holder=holder if isinstance(holder, str) else None,
                       next_action=exc.hint or "Stop working on this task.")
