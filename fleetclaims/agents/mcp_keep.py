"""What lets the MCP server survive a restart and an agent's long thinking.

``TokenFile``: the tokens of the claims the server holds, persisted (0600, in a 0700 directory
under the user state directory, one file per registry and owner) so a restarted server (MCP
clients restart servers freely) resumes its own claims instead of telling the agent to stop.
A token is a secret: the file holds nothing else of value and is replaced atomically.

``Keeper``: a thread that renews the leases the server holds, at a third of their TTL, while
the client is connected (the server runs only as long as its stdio connection), for at most
``KEEPALIVE_MAX`` seconds after the agent's last tool call: an agent that thinks for ten
minutes keeps its claims; an agent that went away for good lets them expire an hour later.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import FleetclaimsError, NotHolder

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: one server per owner and registry
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from ..api import Registry

KEEPALIVE_MAX = 3600.0  # renew for at most this long after the agent's last tool call
TICK = 0.5  # how often the keeper looks at the leases it holds (one state read each)
RENEW_WHEN_LEFT = 2 / 3  # renew once less than this share of the TTL is left (every ttl/3)


def state_directory() -> Path:
    """Where servers keep their tokens: the user state directory (XDG_STATE_HOME on Linux)."""
    from platformdirs import user_state_dir

    return Path(user_state_dir("fleetclaims", appauthor=False)) / "mcp-tokens"


class TokenFile:
    """The server's tokens on disk, keyed by registry location and owner."""

    def __init__(self, location: str, owner: str, directory: Path | None = None) -> None:
        key = hashlib.sha256(f"{location}\n{owner}".encode()).hexdigest()[:32]
        self.directory = directory if directory is not None else state_directory()
        self.path = self.directory / f"{key}.json"
        self.location, self.owner = location, owner
        self._saved: dict[str, str] = {}  # what this process last had written there

    def load(self) -> dict[str, str]:
        """The tokens last saved; empty when there are none or the file is not ours."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError:
            return {}
        except ValueError:  # cut short or edited: kept aside, never overwritten (its tokens
            self._set_aside()  # are an agent's claims: a human may still want them)
            return {}
        if not isinstance(data, dict) or data.get("registry") != self.location \
                or data.get("owner") != self.owner or not isinstance(data.get("tokens"), dict):
            return {}
        return {str(k): str(v) for k, v in data["tokens"].items() if isinstance(v, str)}

    def _set_aside(self) -> None:
        kept = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
                                   f"-{os.getpid()}")
        try:
            os.rename(self.path, kept)
        except OSError:
            return  # (another server moved it first)
        sys.stderr.write(f"fleetclaims mcp: the token file {self.path} could not be read; kept "
                         f"as {kept} (the tokens in it are not used: take them from there, or "
                         "recover the claims once stale)\n")

    def save(self, tokens: dict[str, str]) -> None:
        """Write ``tokens`` into the file (temp file, fsync, rename; the directory is created
        0700), merged with what another server of the same owner and registry wrote there
        meanwhile (under a lock): its tokens are kept, only ours are added or taken out."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_name(f".{self.path.name}.lock"),
                       os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            merged = self.load()
            for task, token in self._saved.items():
                if task not in tokens and merged.get(task) == token:
                    del merged[task]  # (ours, and given up since)
            merged.update(tokens)
            self._write(merged)
            self._saved = dict(tokens)
        finally:
            os.close(lock)  # (and its lock)

    def _write(self, tokens: dict[str, str]) -> None:
        text = json.dumps({"registry": self.location, "owner": self.owner,
                           "tokens": dict(sorted(tokens.items()))})
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, self.path)


def resume(registry: Registry, owner: str, tokens: dict[str, str]) -> dict[str, str]:
    """The saved tokens that still hold a live claim of ``owner`` (the others are dropped)."""
    from ..core.chain import token_hash

    kept = {}
    for task, token in tokens.items():
        try:
            claim = registry.get(task)
            ours = claim is not None and claim.live and claim.owner == owner \
                and claim.token_hash == token_hash(token)
        except (FleetclaimsError, ValueError):
            ours = False
        if ours:
            kept[task] = token
    return kept


class Keeper:
    """Renews the server's leases while the agent is around (see the module docstring)."""

    def __init__(self, registry: Registry, tokens: dict[str, str], lock: threading.Lock,
                 dropped: Callable[[str], None], keepalive: float = KEEPALIVE_MAX) -> None:
        self.registry, self.tokens, self.lock = registry, tokens, lock
        self.dropped = dropped  # told when a lease turned out lost (the token is forgotten)
        self.keepalive = keepalive
        self.last_call = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetclaims-mcp-keeper",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def touched(self) -> None:
        """The agent called a tool: it is still there."""
        self.last_call = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            if time.monotonic() - self.last_call > self.keepalive:
                continue  # the agent went quiet for too long: let the leases run out
            with self.lock:
                self.renew_due()

    def renew_due(self) -> None:
        """Renew every held lease with less than RENEW_WHEN_LEFT of its TTL left."""
        from .._reads import lease_left

        now = self.registry.store.now()
        for task, token in list(self.tokens.items()):
            with contextlib.suppress(FleetclaimsError):  # busy: the next tick retries
                claim = self.registry.get(task)
                if claim is None or not claim.live or claim.ttl is None:
                    continue  # parked claims have no lease to renew
                left = lease_left(claim.expires_at, claim.boot_deadline, claim.deadline_boot,
                                  now)
                if left is not None and left >= claim.ttl * RENEW_WHEN_LEFT:
                    continue
                try:
                    self.registry.renew(task, token=token)
                except NotHolder:  # lost (LeaseExpired is a NotHolder): stop keeping it
                    self.dropped(task)
