"""The registry's anchor: its origin, head (seq, hash) and fence high-water, mirrored outside
the registry folder, so a wiped folder (``git clean -fdx``), a journal replaced by another
registry's, or a journal cut short is refused instead of silently starting fences again.

Where: for a registry inside a git repository, the git common directory (shared by every
worktree, also a bare repository's): ``.git/fleetclaims/anchor.json`` for the default
registry ``<main worktree>/.cache/fleetclaims``, ``.git/fleetclaims/anchors/<key>.json`` for
another one; outside a repository ``<user state dir>/anchors/<key>.json``. ``<key>`` is a hash
of the registry's path. ``FLEETCLAIMS_ANCHOR_DIR`` overrides the place (tests).

When: the anchor is written after a checkpoint (and by doctor --fix / init --new-history),
never on the hot path. It records a head whose journal bytes were made durable before (the
checkpoint follows the append's fdatasync), so the mirror may lag the journal but never leads
it: "the journal ends before the anchor's head" is never a crash between append and mirror.
Checked once per load of a handle: one small file read.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from ...core.errors import HistoryLost
from ...core.state import State
from ...location import SUBDIR, git_common_dir

ENV = "FLEETCLAIMS_ANCHOR_DIR"
FORMAT = 1


@dataclass(frozen=True)
class Anchor:
    origin: str
    seq: int
    head: str
    fence: int
    registry: str
    path: Path
    mac: str | None = None  # HMAC with the user's key (see seal_problem), when there is one

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
    """The anchor of ``directory``'s registry; None when there is none or it is unreadable (a
    damaged mirror must not stop the registry: it only weakens what can be noticed)."""
    path = anchor_file(directory)
    try:
        with open(path, "rb") as f:
            data = orjson.loads(f.read(65536))
    except (OSError, orjson.JSONDecodeError):
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


def record(directory: Path, state: State, *, force: bool = False) -> None:
    """Mirror ``state``'s origin, head and fence (best effort: an unwritable place, such as
    another user's repository, leaves the mirror as it was). Never moves the mirror back
    within one origin unless ``force`` (a recorded repair or reset)."""
    if not state.origin or state.seq <= 0:
        return
    if not force:
        old = read(directory)
        if old is not None and (old.origin != state.origin or old.seq >= state.seq):
            return
    path = anchor_file(directory)
    doc: dict[str, object] = {"format": FORMAT, "registry": str(Path(directory).absolute()),
                              "origin": state.origin, "seq": state.seq, "head": state.head,
                              "fence": state.fence}
    key = load_key()
    if key is not None:
        doc["mac"] = _mac(key, state.origin, state.seq, state.head, state.fence)
    data = orjson.dumps(doc)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        # No fsync: what it records is durable in the journal already; a mirror lost on power
        # loss only weakens detection, never raises a false alarm.
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def problem(state: State, anchor: Anchor | None, lock_fence: int = 0) -> str | None:
    """Why the history loaded into ``state`` (the journal end) falls short of what was
    recorded outside it, or None."""
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
