"""``Lease``: a held claim kept alive by a heartbeat thread (what ``Registry.hold`` returns)."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .core.errors import FleetclaimsError, LeaseExpired, NotHolder, RegistryBusy, StoreUnavailable

if TYPE_CHECKING:
    from .api import Registry
    from .core.model import Claim


class Lease:
    """A held claim renewed at a third of its TTL by a daemon thread.

    ``lost`` is set when renewal fails for good; ``lost_reason`` says why (never hidden). On leaving
    the ``with`` block the claim is released unless ``complete()`` was called or it was lost.
    """

    def __init__(self, registry: Registry, claim: Claim) -> None:
        self.registry = registry
        self.claim = claim
        self.task = claim.task
        self.fence = claim.fence
        assert claim.token is not None
        self.token: str = claim.token
        self.lost = threading.Event()
        self.lost_reason: FleetclaimsError | None = None
        self._stop = threading.Event()
        self._done = False
        self._mutex = threading.RLock()  # (check() may renew from inside complete())
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"fleetclaims-lease-{claim.task}", daemon=True
        )
        self._thread.start()

    def _interval(self) -> float:
        ttl = self.claim.ttl
        return 5.0 if ttl is None else max(ttl / 3.0, 0.05)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._interval()):
            self._beat()
            if self.lost.is_set():
                return

    def _beat(self) -> None:
        with self._mutex:
            if self._done or self.lost.is_set():
                return
            try:
                self.claim = self.registry.renew(self.task, token=self.token)
            except (RegistryBusy, StoreUnavailable) as exc:
                # Transient: the next beat retries, until the lease runs out meanwhile: then it
                # is lost by this process's clock, not when the store answers again (`run`
                # kept a command going 20 s past its lease while a server was down).
                if self._ran_out():
                    claim = self.claim
                    self.lost_reason = LeaseExpired(
                        self.task, owner=claim.owner, fence=claim.fence,
                        expired_at=claim.expires_at,
                        reason=f"it could not be renewed before it ran out ({exc})")
                    self.lost.set()
                return
            except FleetclaimsError as exc:
                self.lost_reason = exc
                self.lost.set()

    def renew(self) -> Claim:
        with self._mutex:
            self.claim = self.registry.renew(self.task, token=self.token)
            return self.claim

    def check(self) -> None:
        """Raise the reason the lease was lost, if it was. A lease whose deadline passed by this
        process's own clock (it was paused, e.g. SIGSTOP or a laptop asleep, past its TTL) is
        asked about at once rather than at the next heartbeat: renewing it then tells whether
        it is still held (LeaseExpired, and ``lost`` set, when it ran out or was taken)."""
        if self.lost_reason is None and not self._done and self._overdue():
            self._beat()
        if self.lost_reason is not None:
            raise self.lost_reason

    def _ran_out(self) -> bool:
        """Whether the lease's deadline passed, told without the store if it cannot answer."""
        try:
            return self._overdue()
        except FleetclaimsError:  # (PostgreSQL's clock is the server's: ours, unreachable)
            expires = self.claim.expires_at
            return expires is not None and time.time() >= expires

    def _overdue(self) -> bool:
        claim = self.claim
        now = self.registry._now()
        if (claim.boot_deadline is not None and now.boot is not None
                and claim.deadline_boot == now.boot_id):
            return now.boot >= claim.boot_deadline  # (the boot clock: immune to wall steps)
        return claim.expires_at is not None and now.wall >= claim.expires_at

    def complete(self, result: Any = None) -> Claim:
        with self._mutex:
            self.check()
            self.claim = self.registry.complete(self.task, token=self.token, result=result)
            self._done = True
        self._stop.set()
        return self.claim

    def release(self) -> bool:
        with self._mutex:
            if self._done:
                return False
            self._done = True
            self._stop.set()
            try:
                return self.registry.release(self.task, token=self.token)
            except NotHolder:
                return False

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self.stop()
        if not self._done and not self.lost.is_set():
            self.release()
