"""Retention: ``fleetclaims audit archive --before AGE [--to DIR]`` moves the oldest sealed
segments out of ``segments/`` (to ``DIR``, by default the registry's ``archive/`` folder) and
records an anchor, ``segments/archived.json``: the seq and hash of the last archived line, and
each archived file's name, size and SHA-256. ``audit verify`` then proves the remaining chain
goes on from that anchor; ``audit verify --with DIR`` checks the archived files too.

Nothing is archived unless asked; the default keeps everything. Steps (crash points):

- ``archive.after_copy``: the segments are copied (fsynced) into DIR; nothing else changed;
- ``archive.after_anchor``: the anchor names them; they are still in ``segments/`` too
  (readers skip them; the next archive removes them once their copies check out);
- then they are removed from ``segments/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ...core.chain import ChainError
from ...core.errors import ArchiveMismatch
from ...core.model import GENESIS
from . import fsutil, segments
from .faults import crash_point, osc
from .journal import check_link, write_at

ANCHOR = "archived.json"
DEFAULT_DIR = "archive"

__all__ = ["ANCHOR", "DEFAULT_DIR", "Anchor", "archive", "read_anchor", "verify_with"]


@dataclass(frozen=True)
class Anchor:
    """Where the chain in ``segments/`` starts: after line ``seq`` whose hash is ``hash``."""

    seq: int
    hash: str
    files: tuple[dict[str, Any], ...]  # name, first, last, bytes, sha256, dir
    path: Path


def read_anchor(directory: Path) -> Anchor | None:
    """The archive anchor, or None (nothing archived). ArchiveMismatch when it is unreadable."""
    path = directory / segments.DIRNAME / ANCHOR
    try:
        data = orjson.loads(path.read_bytes())
        return Anchor(int(data["seq"]), str(data["hash"]), tuple(data["files"]), path)
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ArchiveMismatch(str(path), f"the archive anchor cannot be read ({exc})",
                              hint="Restore segments/archived.json from a backup; without it "
                              "the chain after the archived segments cannot be proven.") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _last_ts(seg: segments.Segment) -> float:
    last = b""
    for last in segments.read_lines(seg):  # noqa: B007 - the last line is wanted
        pass
    return float(orjson.loads(last)["ts"])


def _copy(src: Path, dst_dir: Path, sync: bool) -> None:
    tmp = dst_dir / f".{src.name}.tmp"
    segments.write_new(tmp, src.read_bytes(), sync=sync)
    osc.replace(str(tmp), str(dst_dir / src.name))


def archive(directory: Path, before: float, to: Path | None = None, *,
            now: float | None = None, sync: bool = True) -> dict[str, Any]:
    """Move the sealed segments whose last event is older than ``before`` seconds (the oldest
    ones, in order; the active journal is never archived) to ``to``. Call under the registry
    lock. Returns what was done (for the CLI)."""
    now = time.time() if now is None else now
    target = (to or directory / DEFAULT_DIR).resolve()
    anchor = read_anchor(directory)
    start = anchor.seq if anchor is not None else 0
    files = list(anchor.files) if anchor is not None else []
    _finish(directory, anchor)  # a crash after the anchor left archived segments behind
    chosen: list[segments.Segment] = []
    for seg in segments.sealed(directory):
        if seg.last <= start:
            continue
        if seg.first != start + 1 + sum(s.last - s.first + 1 for s in chosen):
            break  # a gap: verify names it; archive only what continues the chain
        if _last_ts(seg) >= now - before:
            break
        chosen.append(seg)
    if not chosen:
        return {"archived": [], "to": str(target), "seq": start}
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    for seg in chosen:
        _copy(seg.path, target, sync)
    if sync:
        fsutil.fsync_dir(target)
    crash_point("archive.after_copy")
    last = chosen[-1]
    seq, head = segments.last_link(last)
    for seg in chosen:
        files.append({"name": seg.path.name, "first": seg.first, "last": seg.last,
                      "bytes": seg.path.stat().st_size, "sha256": _sha256(seg.path),
                      "dir": str(target)})
    _write_anchor(directory, {"seq": seq, "hash": head, "files": files}, sync)
    crash_point("archive.after_anchor")
    _finish(directory, read_anchor(directory))
    return {"archived": [s.path.name for s in chosen], "to": str(target), "seq": seq,
            "hash": head}


def _write_anchor(directory: Path, data: dict[str, Any], sync: bool) -> None:
    folder = directory / segments.DIRNAME
    tmp = folder / f".{ANCHOR}.tmp"
    fd = fsutil.open_file(tmp, os.O_WRONLY | os.O_TRUNC, create=True)
    try:
        write_at(fd, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n", 0)
        if sync:
            osc.fsync(fd)
    finally:
        os.close(fd)
    osc.replace(str(tmp), str(folder / ANCHOR))
    if sync:
        fsutil.fsync_dir(folder)


def _finish(directory: Path, anchor: Anchor | None) -> None:
    """Remove from segments/ what the anchor says is archived, once its copy is there with the
    recorded size and hash (else it stays: nothing is removed that is not kept elsewhere)."""
    if anchor is None:
        return
    for seg in segments.sealed(directory):
        if seg.last > anchor.seq:
            continue
        entry = next((f for f in anchor.files if f["name"] == seg.path.name), None)
        copy = Path(entry["dir"]) / seg.path.name if entry else None
        if copy is None or not copy.exists() or _sha256(copy) != entry["sha256"]:  # type: ignore[index]
            continue
        seg.path.unlink()
        with contextlib.suppress(FileNotFoundError):
            seg.index_path.unlink()
    crash_point("archive.after_remove")


def verify_with(directory: Path, archive_dir: Path) -> dict[str, Any]:
    """Check the archived segments in ``archive_dir`` against the anchor: each file's size and
    SHA-256, and one chain from the first event to the anchor's seq and hash. Raises
    ArchiveMismatch naming the file and what is wrong."""
    anchor = read_anchor(directory)
    if anchor is None:
        return {"archived_events": 0, "seq": 0}
    seq, prev = 0, GENESIS
    for entry in sorted(anchor.files, key=lambda f: int(f["first"])):
        path = archive_dir / entry["name"]
        what = f"archived segment {path}"
        if not path.exists():
            raise ArchiveMismatch(str(path), f"{what} is missing (the anchor lists it, archived "
                                  f"to {entry['dir']})", hint=_HINT)
        if path.stat().st_size != entry["bytes"] or _sha256(path) != entry["sha256"]:
            raise ArchiveMismatch(str(path), f"{what} is not the file that was archived (size "
                                  "or SHA-256 differs from the anchor)", hint=_HINT)
        if int(entry["first"]) != seq + 1:
            raise ArchiveMismatch(str(path), f"{what} starts at seq {entry['first']}, the "
                                  f"chain expects {seq + 1}", hint=_HINT)
        seg = segments.Segment(path, int(entry["first"]), int(entry["last"]))
        try:
            for line in segments.read_lines(seg):
                seq += 1
                prev = check_link(line, seq, prev)
        except (ChainError, orjson.JSONDecodeError, segments.SegmentError) as exc:
            raise ArchiveMismatch(str(path), f"{what} does not verify at seq {seq}: {exc}",
                                  hint=_HINT) from None
    if (seq, prev) != (anchor.seq, anchor.hash):
        raise ArchiveMismatch(str(archive_dir), f"the archived chain ends at seq {seq}, hash "
                              f"{prev[:16]}…, the anchor says seq {anchor.seq}, hash "
                              f"{anchor.hash[:16]}…", hint=_HINT)
    return {"archived_events": seq, "seq": anchor.seq, "hash": anchor.hash}


_HINT = ("Point --with at the directory the segments were archived to (the anchor, "
         "segments/archived.json, names it), or restore the archive from a backup. Nothing in "
         "the registry was changed.")


def archive_registry(store: Any, before: float, to: Path | None) -> dict[str, Any]:
    """``archive`` on a file store's registry, under its lock (a rotation is not running)."""
    store._ensure_open()
    with store._lock.held():
        return archive(Path(store.directory), before, to, sync=bool(store.sync))
