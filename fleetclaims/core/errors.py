"""Every error fleetclaims raises, in one module to avoid import loops.

Each exception carries the data a caller needs (task, holder, fence, seq, offset ...) as
attributes, a message that says what happened and what to do next, and a stable ``code``
(``conflict``, ``lease_expired`` ...). What a code means to a process's exit status is the
command line's business: ``fleetclaims.cli.output.EXIT_CODES`` maps codes to exit codes.
"""

from __future__ import annotations

from typing import ClassVar


class FleetclaimsError(Exception):
    """Base class of every error fleetclaims raises on purpose."""

    #: a short machine-readable name, stable across releases (used by ``--json`` output)
    code: ClassVar[str] = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} {hint}")

    def to_dict(self) -> dict[str, object]:
        """The error as plain data (for ``--json`` output and logs); never contains a token."""
        data: dict[str, object] = {"error": self.code, "message": str(self)}
        for key, value in vars(self).items():
            if key in ("message", "hint") or key.startswith("_"):
                continue
            if isinstance(value, (str, int, float, bool)) or value is None:
                data[key] = value
            elif isinstance(value, (list, tuple)):
                data[key] = [v if isinstance(v, (str, int, float, bool)) else str(v) for v in value]
        return data


class ValidationError(FleetclaimsError, ValueError):
    """An argument is malformed; nothing was written."""

    code = "invalid"

    def __init__(self, field: str, reason: str, *, value: object = None) -> None:
        self.field = field
        self.reason = reason
        shown = "" if value is None else f" (got {_preview(value)})"
        super().__init__(
            f"invalid {field}: {reason}{shown}; nothing was written.",
            hint="Fix the argument and try again.",
        )


class ClaimConflict(FleetclaimsError):
    """The task is held by someone else (or by the same owner name without its token)."""

    code = "conflict"

    def __init__(
        self,
        task: str,
        *,
        holder: str,
        fence: int,
        expires_at: float | None,
        reason: str,
        stale: bool = False,
        phase: str = "working",
    ) -> None:
        self.task = task
        self.holder = holder
        self.fence = fence
        self.expires_at = expires_at
        self.reason = reason
        self.stale = stale
        self.phase = phase
        expiry = "never (parked)" if expires_at is None else f"at {_iso(expires_at)}"
        if "same owner name" in reason:
            hint = (
                "If that claim is yours, pass its token (--token or FLEETCLAIMS_TOKEN) to renew "
                "or complete it; otherwise wait for it to be released."
            )
        elif stale:
            hint = (
                f"The claim is stale ({reason}); take it over with "
                f"`fleetclaims recover {task} --owner YOU --reason ...` "
                "or claim(..., take_stale=True)."
            )
        else:
            hint = "Wait for the holder to release or complete it, or pick another task."
        super().__init__(
            f"task {task!r} is held by {holder!r} (fence {fence}, phase {phase}, "
            f"lease expires {expiry}): {reason}.",
            hint=hint,
        )



class PathConflict(ClaimConflict):
    """The task is free, but the paths asked for overlap another live claim's reservation
    (``holder`` holds ``holder_task`` and reserved ``theirs``, which ``mine`` overlaps)."""

    def __init__(self, task: str, *, holder: str, fence: int, expires_at: float | None,
                 reason: str, phase: str, holder_task: str, mine: str, theirs: str) -> None:
        # ClaimConflict's fields, with a message about paths (the task itself is free).
        self.task, self.holder, self.fence, self.expires_at = task, holder, fence, expires_at
        self.reason, self.stale, self.phase = reason, False, phase
        self.holder_task = holder_task
        self.mine = mine
        self.theirs = theirs
        FleetclaimsError.__init__(
            self, f"the paths asked for {task!r} conflict: {reason}.",
            hint=f"Reserve other paths, wait for {holder} to finish {holder_task!r} or "
            f"unreserve them, or ask {holder}; `fleetclaims explain {task}` shows the refusal.")

class NotHolder(FleetclaimsError):
    """The token presented is not the live holder's token for the task."""

    code = "not_holder"

    def __init__(
        self,
        task: str,
        reason: str,
        *,
        holder: str | None = None,
        fence: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.task = task
        self.reason = reason
        self.holder = holder
        self.fence = fence
        super().__init__(
            f"not the holder of task {task!r}: {reason}.",
            hint=hint or "Check the token, or claim the task again.",
        )


class LeaseExpired(NotHolder):
    """The caller's lease ran out (and may have been taken over): renew and complete refuse."""

    code = "lease_expired"

    def __init__(
        self,
        task: str,
        *,
        owner: str,
        fence: int,
        expired_at: float | None,
        taken_by: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.owner = owner
        self.expired_at = expired_at
        self.taken_by = taken_by
        when = "" if expired_at is None else f" at {_iso(expired_at)}"
        what = f"the lease of {owner!r} (fence {fence}) expired{when}"
        if taken_by is not None:
            what += f" and was taken over by {taken_by!r}"
        if reason:
            what += f" ({reason})"
        super().__init__(
            task,
            what,
            holder=taken_by,
            fence=fence,
            hint=(
                "Stop working on it. To continue, take it over explicitly with "
                f"`fleetclaims recover {task} --owner {owner} --reason ...`."
                if taken_by is None
                else "Stop working on it: another owner holds it now."
            ),
        )


class ClaimSuperseded(NotHolder):
    """A duplicate claim lost to another under the resolver order (preemption or merge)."""

    code = "superseded"

    def __init__(self, task: str, *, owner: str, fence: int, winner: str, rule: str) -> None:
        self.owner = owner
        self.winner = winner
        self.rule = rule
        super().__init__(
            task,
            f"the claim of {owner!r} (fence {fence}) was superseded by {winner!r} "
            f"(rule: {rule})",
            holder=winner,
            fence=fence,
            hint=f"Stop working on it; `fleetclaims explain {task}` shows the decision.",
        )


class TaskCompleted(FleetclaimsError):
    """The task was completed; it refuses claims until reopened."""

    code = "completed"

    def __init__(self, task: str, *, owner: str, fence: int, completed_at: float | None,
                 hint: str | None = None) -> None:
        self.task = task
        self.owner = owner
        self.fence = fence
        self.completed_at = completed_at
        when = "" if completed_at is None else f" at {_iso(completed_at)}"
        super().__init__(
            f"task {task!r} was completed by {owner!r} (fence {fence}){when}.",
            hint=hint or f"Reopen it first (`fleetclaims reopen {task} --reason ...`) to work "
            "on it again.",
        )


class TaskNotReady(FleetclaimsError):
    """The task is in the work queue but may not be claimed yet: it is blocked, or a task it
    depends on is not completed."""

    code = "not_ready"

    def __init__(
        self, task: str, *, status: str, waits_for: list[str], reason: str | None = None
    ) -> None:
        self.task = task
        self.status = status  # "pending" or "blocked"
        self.waits_for = waits_for
        self.reason = reason
        if status == "blocked":
            what = f"is blocked: {reason}" if reason else "is blocked"
            hint = f"Unblock it first (`fleetclaims unblock {task}`) or take another task " \
                "(`fleetclaims claim-next --owner YOU`)."
        else:
            what = "waits for " + ", ".join(repr(t) for t in waits_for) + " to be completed"
            hint = ("Complete those first, or take a ready task "
                    "(`fleetclaims claim-next --owner YOU`).")
        super().__init__(f"task {task!r} is not ready: it {what}; nothing was claimed.",
                         hint=hint)


class UnknownTask(FleetclaimsError):
    """The task was never added to the work queue."""

    code = "unknown_task"

    def __init__(self, task: str) -> None:
        self.task = task
        super().__init__(
            f"task {task!r} is not in the work queue; nothing was written.",
            hint=f"Add it first: `fleetclaims add {task}` (check the spelling with "
            "`fleetclaims tasks`).",
        )


class DependencyCycle(ValidationError):
    """Adding these dependencies would make a task wait for itself."""

    code = "dependency_cycle"

    def __init__(self, task: str, cycle: list[str]) -> None:
        FleetclaimsError.__init__(
            self,
            f"task {task!r} cannot depend on that: it would wait for itself "
            f"({' -> '.join(cycle)}); nothing was written.",
            hint="Drop one of those dependencies, or split the task.",
        )
        self.field = "depends_on"
        self.reason = "dependency cycle"
        self.task = task
        self.cycle = cycle


class RegistryBusy(FleetclaimsError):
    """The registry lock could not be taken within the timeout."""

    code = "busy"

    def __init__(self, path: str, timeout: float, holder: str | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self.holder = holder
        who = f" (held by {holder})" if holder else ""
        super().__init__(
            f"the registry lock {path} was not free within {timeout:g}s{who}.",
            hint=(
                "Another process is writing or is stopped while holding the lock; "
                "try again, or raise the timeout (lock_timeout=, FLEETCLAIMS_LOCK_TIMEOUT)."
            ),
        )


class RegistryCorrupt(FleetclaimsError):
    """A registry file is damaged or unsafe in a way that stops the operation."""

    code = "corrupt"

    def __init__(self, path: str, reason: str, *, hint: str | None = None) -> None:
        self.path = path
        self.reason = reason
        what = "registry" if str(path).startswith(("postgresql://", "postgres://")) else (
            "registry file")
        super().__init__(
            f"{what} {path} is damaged: {reason}.",
            hint=hint or "Run `fleetclaims doctor` to inspect it and `fleetclaims doctor --fix` "
            "to repair it (damaged bytes are kept in quarantine).",
        )


class AuditCorrupt(RegistryCorrupt):
    """The audit journal fails verification at a given seq and byte offset."""

    code = "audit_corrupt"

    def __init__(self, path: str, *, seq: int, offset: int, reason: str,
                 hint: str | None = None) -> None:
        self.seq = seq
        self.offset = offset
        super().__init__(
            path,
            f"audit journal broken at seq {seq}, byte offset {offset}: {reason}",
            hint=hint or "Nothing was written (reads still show the verified state). Run "
            "`fleetclaims audit verify` for details and `fleetclaims doctor --fix` to repair: it "
            "keeps every line that still verifies and names what the damaged bytes held (kept "
            "in quarantine).",
        )


class SegmentDamaged(AuditCorrupt):
    """A sealed journal segment (segments/*.jsonl.gz) is missing, fails to decompress or breaks
    the chain: restored from a backup or the archive, never rewritten."""

    code = "segment_damaged"

    def __init__(self, path: str, *, seq: int, offset: int, reason: str) -> None:
        self.seq = seq
        self.offset = offset
        RegistryCorrupt.__init__(
            self, path, f"audit journal broken at seq {seq}: {reason}",
            hint="Nothing was written. Put the sealed segment back (from a backup or the "
            "directory `audit archive` moved it to) and run `fleetclaims audit verify`; "
            "`doctor --fix` does not rewrite sealed history.")


class ArchiveMismatch(RegistryCorrupt):
    """Archived journal segments (``audit archive``) do not match the anchor recorded when they
    were moved out: a file missing, changed, or a chain that does not end at the anchor."""

    code = "archive_mismatch"


class HistoryLost(RegistryCorrupt):
    """The registry's history does not reach what its anchor (mirrored outside the registry
    folder) recorded: the folder vanished, the journal was replaced by another registry's, or
    it ends before the recorded head. Refused so fences are never handed out again."""

    code = "history_lost"

    def __init__(self, path: str, reason: str, *, anchor: str, origin: str, seq: int,
                 fence: int, restorable: bool = True, fix: str | None = None) -> None:
        self.anchor = anchor
        self.origin = origin
        self.seq = seq
        self.fence = fence
        what = ("Run `fleetclaims doctor --fix` to restore what can be restored (the fences go "
               "on above the recorded ones), or `fleetclaims init --new-history`"
               if restorable else "Nothing is left here to restore from: if this registry "
               "was synced through a git remote, `fleetclaims sync` brings its history back "
               "byte for byte; else run `fleetclaims init --new-history`")
        super().__init__(
            path, reason,
            # (``fix``: what to do when the anchor itself cannot say what it recorded)
            hint=fix or f"The anchor {anchor} recorded registry {origin} at seq {seq}, fence "
            f"{fence}. {what} to acknowledge a deliberate reset (a new history starting above "
            f"fence {fence}).",
        )


class UnsafeRegistry(FleetclaimsError):
    """The registry location is unsafe (symlink, FIFO, hard link, foreign owner, network FS)."""

    code = "unsafe"

    def __init__(self, path: str, reason: str, *, hint: str | None = None) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"refusing to use {path}: {reason}.",
            hint=hint or "Point fleetclaims at a private local directory (--dir, FLEETCLAIMS_DIR).",
        )


class DurabilityError(FleetclaimsError):
    """An OS call on the write path failed; the operation was not acknowledged."""

    code = "durability"

    def __init__(self, operation: str, path: str, error: OSError) -> None:
        self.operation = operation
        self.path = path
        self.errno = error.errno
        self.strerror = error.strerror or str(error)
        super().__init__(
            f"{operation} failed on {path}: {self.strerror}; the operation was NOT acknowledged, "
            "and this registry handle refuses further use.",
            hint="Fix the cause (disk space, permissions, hardware) and open the registry again.",
        )


class StoreUnavailable(FleetclaimsError):
    """The backing store (a PostgreSQL server) could not be reached or lost the connection."""

    code = "unavailable"

    def __init__(self, where: str, reason: str, *, committed: bool | None = False,
                 hint: str | None = None) -> None:
        self.where = where
        self.reason = reason
        self.committed = committed
        state = {
            False: _NOT_COMMITTED,
            None: "whether the change committed is unknown; read it back before retrying",
            True: "the change was committed",
        }[committed]
        super().__init__(
            f"store {where} unavailable: {reason}; {state}.",
            hint=hint or "Check that the server is running and reachable, then retry.",
        )

    def as_read(self) -> StoreUnavailable:
        """This error as a statement outside any write transaction met it (a read, or the
        server's clock read before deciding): there was no change to commit, so the message
        says nothing was written (same class, same fields, ``committed`` still False)."""
        if self.committed is False and _NOT_COMMITTED in self.message:
            self.message = self.message.replace(_NOT_COMMITTED, "nothing was written")
            self.args = (self.message if self.hint is None else f"{self.message} {self.hint}",)
        return self


_NOT_COMMITTED = "the change was not committed"


class StoreReadOnly(StoreUnavailable):
    """The database server accepts only reads (a hot standby, a read-only database)."""

    code = "read_only"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason, hint="Point the URL at the primary server (a standby "
                         "serves reads only), or lift the database's read-only setting.")


class StoreOverloaded(StoreUnavailable):
    """The database server (or its pooler) has no connection free for us."""

    code = "too_many_connections"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason, hint="Retry later; for many clients put PgBouncer "
                         "(transaction pooling) in front, or raise max_connections or the "
                         "role's CONNECTION LIMIT.")


class SchemaMismatch(UnsafeRegistry):
    """The registry's schema is missing, or newer than this fleetclaims understands."""

    code = "schema_mismatch"

    def __init__(self, where: str, reason: str, *, hint: str) -> None:
        super().__init__(where, reason, hint=hint)


class RegistryNotFound(ValidationError):
    """There is no registry where one must already exist (a read, ``merge``, ``migrate
    --from``, ``create=False``); nothing was created there. A mistyped location is an
    argument error, so this is a ValidationError (field ``registry``)."""

    code = "no_registry"

    def __init__(self, path: str, reason: str) -> None:
        self.field = "registry"
        self.path = path
        self.reason = reason
        FleetclaimsError.__init__(
            self,
            f"no registry at {path}: {reason}; nothing was created there.",
            hint="Check the path (--dir, FLEETCLAIMS_DIR); a registry is created by the first "
            "write (claim, add ...) to a directory that does not exist yet.",
        )


class AccessDenied(FleetclaimsError):
    """The operating system or the database refused access (file permissions, a PostgreSQL
    role without rights on the schema)."""

    code = "access_denied"

    def __init__(self, where: str, reason: str, *, hint: str | None = None) -> None:
        self.where = where
        self.reason = reason
        super().__init__(
            f"access to {where} denied: {reason}; nothing was written.",
            hint=hint or "Check the permissions of the registry's files (or the database "
            "role's rights), then retry.",
        )


class MissingDependency(FleetclaimsError):
    """An optional dependency this operation needs is not installed."""

    code = "missing_dependency"

    def __init__(self, module: str, feature: str, install: str,
                 why: str = "is not installed") -> None:
        self.module = module
        self.feature = feature
        self.install = install
        super().__init__(f"{feature} needs the Python package {module!r}, which {why}.",
                         hint=f"Install it: {install}")


def shown_remote(remote: str) -> str:
    """A git remote as messages, reports and the journal show it: a URL's password replaced
    by ``***`` (git's own messages redact it too); anything else unchanged."""
    scheme, sep, rest = remote.partition("://")
    if not sep:
        return remote
    netloc, slash, path = rest.partition("/")
    user, at, host = netloc.rpartition("@")
    if not at or ":" not in user:
        return remote
    return f"{scheme}://{user.split(':', 1)[0]}:***@{host}{slash}{path}"


class RemoteUnavailable(FleetclaimsError):
    """The git remote could not be reached (offline, path gone, refused); nothing was
    changed on it, and a sync changed nothing here either (run it again later)."""

    code = "remote_unavailable"

    def __init__(self, remote: str, reason: str, *, hint: str | None = None) -> None:
        self.remote = remote = shown_remote(remote)
        self.reason = reason
        super().__init__(f"git remote {remote!r} unavailable: {reason}.", hint=hint or (
            "Check the network and the remote's URL (`git remote -v`), then run it again: "
            "a later `fleetclaims sync` converges."))


class RemoteRewritten(FleetclaimsError):
    """A fleetclaims ref on the git remote no longer extends what this clone published or saw
    there before (force-pushed, deleted, or its history does not verify); nothing was
    changed here."""

    code = "remote_rewritten"

    def __init__(self, remote: str, ref: str, reason: str, *, hint: str | None = None) -> None:
        self.remote = remote = shown_remote(remote)
        self.ref = ref
        self.reason = reason
        super().__init__(
            f"the fleetclaims ref {ref} on git remote {remote!r} was rewritten: {reason}; "
            "nothing was changed here.",
            hint=hint or "Find out who rewrote it (the remote's reflog); the local registry "
            "keeps everything. `fleetclaims sync --accept-rewritten` publishes again over it.")


class GitFailed(FleetclaimsError):
    """A local git command failed (not a repository, a damaged object store, git missing
    a feature)."""

    code = "git_failed"

    def __init__(self, command: str, reason: str, *, hint: str | None = None) -> None:
        self.command = command
        self.reason = reason
        super().__init__(f"{command} failed: {reason}.",
                         hint=hint or "Check the repository with `git fsck`, then retry.")


def _preview(value: object) -> str:
    """``value`` shortened for a message; never fails (a 10**5000 int or a list nested
    100,000 deep has no repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 190:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, str) and len(value) > 200:
        value = value[:200]
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _iso(ts: float) -> str:
    # Local import keeps this module import-light; datetime is stdlib.
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return repr(ts)
