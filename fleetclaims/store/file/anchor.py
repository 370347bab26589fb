"""The registry's anchor: its origin, head (seq, hash) and fence high-water, mirrored outside
the registry folder, so a wiped folder (``git clean -fdx``), a journal replaced by another
registry's, or a journal cut short is refused instead of silently starting fences again.

Where: for a registry inside a git repository, the git common directory (shared by every
worktree, also a bare repository's): ``.git/fleetclaims/anchor.json`` for the default
registry ``<main worktree>/.cache/fleetclaims``, ``.git/fleetclaims/anchors/<key>.json`` for
another one; outside a repository ``<user state dir>/anchors/<key>.json``. ``<key>`` is a hash
of the registry's path. ``FLEETCLAIMS_ANCHOR_DIR`` overrides the place (tests).

When: the anchor is written after a checkpoint and after a rotation's snapshot (so at most ~1 s
behind while busy), at rest on close (also when a rotation left no checkpoint due), and by
doctor --fix / init --new-history; never on the hot path. It records a head whose journal
bytes were made durable before (the checkpoint follows the append's fdatasync; a rotation's
head is sealed), so the mirror may lag the journal but never leads it: "the journal ends
before the anchor's head" is never a crash between append and mirror. Checked once per load
of a handle: one small file read (and claims.lock's anchor mark, see below).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import orjson

from ...core.errors import FleetclaimsError, HistoryLost
from ...core.state import State
from ...location import SUBDIR, git_common_dir
from .lock import RegistryLock, read_anchor_mark, write_anchor_mark

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

ENV = "FLEETCLAIMS_ANCHOR_DIR"
FORMAT = 1
LOCK_NAME = "claims.lock"  # (catchup.LOCK: not imported, catchup imports rotation imports us)


class Head(Protocol):
    """What an anchor records: a State, or a rotation's sealed head (rotation.py)."""

    @property
    def origin(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def head(self) -> str: ...
    @property
    def fence(self) -> int: ...


@dataclass(frozen=True)
class Sealed:
    """A head recorded apart from a State (a rotation's, whose state has moved on)."""

    origin: str
    seq: int
    head: str
    fence: int


@dataclass(frozen=True)
class Anchor:
    origin: str
    seq: int
    head: str
    fence: int
    registry: str
    path: Path
    mac: str | None = None  # HMAC with the user's key (see seal_problem), when there is one
    # Why this anchor cannot be trusted (deleted, unreadable, its seal broken), or None. Then
    # origin/seq/head/fence are what claims.lock's anchor mark says the last one recorded.
    damage: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"format": FORMAT, "registry": self.registry, "origin": self.origin,
                "seq": self.seq, "head": self.head, "fence": self.fence}


_PLACES: dict[Path, Path] = {}  # registry directory -> its anchor file (walking up costs stats)


def anchor_file(directory: Path) -> Path:
    """Where the anchor of the registry in ``directory`` lives (see the module docstring)."""
    directory = Path(os.path.realpath(directory))
    found = _PLACES.get(directory)
    env = os.environ.get(ENV)
    if found is not None and not env:
        return found
    key = hashlib.sha256(os.fsencode(directory)).hexdigest()[:24]
    if env:
        return Path(env) / f"{key}.json"
    common = git_common_dir(directory)
    if common is not None:
        main = common.parent if common.name == ".git" else None
        if main is not None and directory == Path(os.path.realpath(main / SUBDIR)):
            found = common / "fleetclaims" / "anchor.json"
        else:
            found = common / "fleetclaims" / "anchors" / f"{key}.json"
    else:
        from platformdirs import user_state_dir

        found = Path(user_state_dir("fleetclaims", appauthor=False)) / "anchors" / f"{key}.json"
    _PLACES[directory] = found
    return found


def read(directory: Path) -> Anchor | None:
    """The anchor of ``directory``'s registry; None when there is none (or an unreadable one
    that claims.lock does not say was written: see ``load``). An anchor that cannot be
    trusted is returned with ``damage`` set (``problem`` reports it first)."""
    return load(directory)[0]


def load(directory: Path) -> tuple[Anchor | None, str | None]:
    """(``read``'s answer, why an existing anchor file cannot be read when claims.lock has no
    mark of it: a registry last written before marks were kept). A file we may not open
    (another user's) is no anchor: it only weakens what can be noticed."""
    path = anchor_file(directory)
    mark = _mark(directory, path)
    try:
        with open(path, "rb") as f:
            raw: bytes | None = f.read(65536)
    except FileNotFoundError:
        raw = None
    except OSError:
        return None, None
    if raw is None:
        if mark is None:
            return None, None
        return _from_mark(mark, path, f"the anchor {path} was deleted (claims.lock records "
                          "that it was written there)"), None
    if not raw.strip(b"\0"):
        # Empty: a rename not flushed when the power went (anchors are not fsynced: they only
        # lag). No alarm; what the mark recorded stands in (a cut journal is still found).
        return (None if mark is None else _from_mark(mark, path, None)), None
    found = _parse(raw, path)
    if found is None:
        why = (f"the anchor {path} cannot be read (it is not an anchor: damaged or "
               "overwritten)")
        return (None, why) if mark is None else (_from_mark(mark, path, why), None)
    key = load_key()
    if key is not None:
        if found.mac is None and mark is not None and mark.get("k") is True:
            # (an anchor written before the key was made carries no seal, and its mark says so)
            return replace(found, damage=f"the anchor {found.path} carries no seal of your "
                           "key, but the one last written did: it was rewritten without the "
                           "key"), None
        if found.mac is not None and not hmac.compare_digest(
                _mac(key, found.origin, found.seq, found.head, found.fence), found.mac):
            return replace(found, damage=f"the anchor {found.path} is not sealed by your key: "
                           "it was rewritten without it"), None
    return found, None


def _parse(raw: bytes, path: Path) -> Anchor | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    origin, seq, head, fence = (data.get(k) for k in ("origin", "seq", "head", "fence"))
    if not (isinstance(origin, str) and type(seq) is int and isinstance(head, str)
            and type(fence) is int):
        return None
    mac = data.get("mac")
    return Anchor(origin, seq, head, fence, str(data.get("registry", "")), path,
                  mac if isinstance(mac, str) else None)


# --- the anchor mark in claims.lock -------------------------------------------------------------
# Written after each anchor, it says which anchor file was written (a hash of its path: a
# registry moved or copied elsewhere, or FLEETCLAIMS_ANCHOR_DIR changed, has none there yet,
# which is no alarm) and what it recorded, sealed or not. So an anchor deleted or overwritten
# with junk is told from one never written, and an anchor stripped of its seal from one written
# before the key was made. (A forger who rewrites claims.lock too is not found this way.)


def _path_key(path: Path) -> str:
    return hashlib.sha256(os.fsencode(path)).hexdigest()[:16]


def _mark(directory: Path, path: Path) -> dict[str, Any] | None:
    """claims.lock's anchor mark when it names ``path``, else None (none, torn, elsewhere)."""
    raw = read_anchor_mark(Path(directory) / LOCK_NAME).strip(b"\0 \n")
    if not raw:
        return None
    try:
        mark = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # (torn by a concurrent pwrite: no alarm)
    if not (isinstance(mark, dict) and mark.get("a") == _path_key(path)
            and isinstance(mark.get("o"), str) and type(mark.get("s")) is int
            and isinstance(mark.get("h"), str) and type(mark.get("f")) is int):
        return None
    return mark


def _from_mark(mark: dict[str, Any], path: Path, damage: str | None) -> Anchor:
    return Anchor(mark["o"], mark["s"], mark["h"], mark["f"], "", path, None, damage)


def _write_mark(directory: Path, path: Path, head: Head, sealed: bool) -> None:
    mark = {"a": _path_key(path), "o": head.origin, "s": head.seq, "h": head.head,
            "f": head.fence, "k": sealed}
    with contextlib.suppress(OSError, ValueError, FleetclaimsError):
        write_anchor_mark(Path(directory) / LOCK_NAME, orjson.dumps(mark))


@contextlib.contextmanager
def _serialized(place: Path) -> Iterator[None]:
    """Anchor writers one at a time (an flock on the anchors' folder): two closing writers
    each reading the old anchor then writing their own left it at the older head. Best effort:
    after ~0.5 s (a forked child inherited a held lock) it goes on unserialized."""
    try:
        fd = os.open(place, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        if fcntl is not None:
            for _ in range(50):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.01)
                except OSError:
                    break
        yield
    finally:
        os.close(fd)  # (releases the flock)


def record(directory: Path, state: Head, *, force: bool = False) -> bool:
    """Mirror ``state``'s origin, head and fence, and mark it in claims.lock (best effort: an
    unwritable place, such as another user's repository, leaves the mirror as it was). Never
    moves the mirror back within one origin, nor replaces an anchor that cannot be read or
    trusted (that is for a recorded repair or reset: ``force``). True when written."""
    if not state.origin or state.seq <= 0:
        return False
    path = anchor_file(directory)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _serialized(path.parent):
        if not force:
            old, garbled = load(directory)
            if garbled is not None or (old is not None and old.damage is not None):
                return False  # (refused on load: see history.py)
            if old is not None and (old.origin != state.origin or old.seq >= state.seq):
                if old.origin == state.origin and _mark(directory, path) is None:
                    _write_mark(directory, path, old, old.mac is not None)  # (made before marks)
                return False
        else:
            _keep_aside(directory, path)
        doc: dict[str, object] = {"format": FORMAT, "registry": str(Path(directory).absolute()),
                                  "origin": state.origin, "seq": state.seq, "head": state.head,
                                  "fence": state.fence}
        key = load_key()
        if key is not None:
            doc["mac"] = _mac(key, state.origin, state.seq, state.head, state.fence)
        data = orjson.dumps(doc)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            # No fsync: what it records is durable in the journal already; a mirror lost on
            # power loss only weakens detection, never raises a false alarm.
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        _write_mark(directory, path, state, key is not None)
    return True


def _keep_aside(directory: Path, path: Path) -> None:
    """Before a recorded repair or reset replaces an anchor that cannot be read or trusted:
    keep it beside, renamed (evidence is never destroyed)."""
    old, garbled = load(directory)
    if (garbled is not None or (old is not None and old.damage is not None)) and (
            os.path.lexists(path)):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(f"{path.name}.untrusted-{stamp}-{os.getpid()}"))


def mirror(directory: Path, lock: RegistryLock, state: Head) -> None:
    """After a checkpoint or a rotation: the fence mark in claims.lock, then the anchor (both
    of a head durable in the journal or a sealed segment already: they lag, never lead)."""
    with contextlib.suppress(OSError):
        lock.mark_fence(state.fence)
    with contextlib.suppress(OSError):  # (best effort: never fails the write it follows)
        record(directory, state)


def problem(state: State, anchor: Anchor | None, lock_fence: int = 0) -> str | None:
    """Why the history loaded into ``state`` (the journal end) falls short of what was
    recorded outside it, or None. An anchor that cannot be trusted (``damage``) comes first:
    nothing outside the folder then vouches for this history."""
    if anchor is not None and anchor.damage is not None:
        return anchor.damage
    if anchor is not None:
        if state.origin and state.origin != anchor.origin:
            return (f"the journal belongs to registry {state.origin}, not to this registry "
                    f"({anchor.origin}): another registry's history was put in its place")
        if state.seq < anchor.seq:
            return (f"the journal ends at seq {state.seq}, but this registry had reached seq "
                    f"{anchor.seq}: events {state.seq + 1}..{anchor.seq} are lost")
        if state.seq == anchor.seq and state.head != anchor.head:
            return (f"the journal's line {state.seq} is not the one recorded (hash "
                    f"{anchor.head[:16]}...): the history was rewritten")
    floor = max(lock_fence, anchor.fence if anchor is not None else 0)
    if state.fence < floor:
        return (f"the journal's fences end at {state.fence}, but fence {floor} was handed out: "
                "grants are missing from the journal")
    return None


def check(directory: Path, state: State, lock_fence: int = 0) -> None:
    """Raise HistoryLost when the loaded history falls short of the anchor or the lock file's
    fence mark."""
    anchor = read(directory)
    reason = problem(state, anchor, lock_fence)
    if reason is not None:
        raise lost(directory, reason, anchor, lock_fence)


def check_vanished(directory: Path) -> None:
    """No journal, no snapshot, a fresh lock file: a new registry, unless the anchor says one
    lived here (its folder was removed, e.g. by ``git clean -fdx``)."""
    anchor = read(directory)
    if anchor is not None:
        raise lost(directory, f"the registry folder was removed or emptied: journal and "
                    f"snapshot are gone (registry {anchor.origin} had reached seq {anchor.seq})",
                    anchor, 0, restorable=False)


def unreadable(directory: Path, reason: str, lock_fence: int) -> HistoryLost:
    """HistoryLost for an anchor file that cannot be read, claims.lock having no mark of it
    (a registry last written before marks were kept): doctor cannot tell what it held."""
    path = anchor_file(directory)
    return HistoryLost(
        str(directory), reason + "; nothing outside the folder vouches for this history now",
        anchor=str(path), origin="?", seq=0, fence=lock_fence,
        fix=f"Look at {path} (kept as it is). If this journal is the registry's true history "
        "(`fleetclaims audit verify`), move that file aside (e.g. to "
        f"{path.name}.damaged): the next write records a new anchor. Otherwise run "
        "`fleetclaims init --new-history` (the old files go to quarantine/, fences go on "
        "above the recorded ones).")


def lost(directory: Path, reason: str, anchor: Anchor | None, lock_fence: int, *,
         restorable: bool = True) -> HistoryLost:
    return HistoryLost(
        str(directory), reason,
        anchor=str(anchor.path) if anchor is not None else str(directory / "claims.lock"),
        origin=anchor.origin if anchor is not None else "?",
        seq=anchor.seq if anchor is not None else 0,
        fence=max(lock_fence, anchor.fence if anchor is not None else 0),
        restorable=restorable,
    )


# --- the optional per-user key ------------------------------------------------------------------
# A chain of plain SHA-256 seals can be re-sealed by anyone who rewrites the journal; the
# anchor then names a head the forged journal does not hold, unless the forger rewrites the
# anchor too. With a per-user key (0600, in the user state directory) the anchor carries an
# HMAC of what it records, which nobody without the key can produce: `audit verify` checks it.


def key_file() -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env) / "anchor.key"
    from platformdirs import user_state_dir

    return Path(user_state_dir("fleetclaims", appauthor=False)) / "anchor.key"


def load_key() -> bytes | None:
    """The user's key, or None (none made; or readable by others, hence worthless)."""
    path = key_file()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            return None
        key = os.read(fd, 256).strip()
    finally:
        os.close(fd)
    return key or None


def create_key() -> tuple[Path, bool]:
    """Make the user's key (0600) unless there is one; returns (its path, whether made)."""
    path = key_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path, False
    try:
        os.write(fd, os.urandom(32).hex().encode())  # (as secrets.token_hex)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path, True


def _mac(key: bytes, origin: str, seq: int, head: str, fence: int) -> str:
    message = orjson.dumps([FORMAT, origin, seq, head, fence])
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal_problem(anchor: Anchor) -> str | None:
    """Why the anchor's HMAC does not hold, or None (also None without a key)."""
    key = load_key()
    if key is None:
        return None
    if anchor.mac is None:
        return (f"the anchor {anchor.path} carries no seal of your key (written before the key "
                "was made: the next write seals it; or rewritten by someone without the key)")
    wanted = _mac(key, anchor.origin, anchor.seq, anchor.head, anchor.fence)
    if not hmac.compare_digest(wanted, anchor.mac):
        return f"the anchor {anchor.path} is not sealed by your key: it was rewritten without it"
    return None
