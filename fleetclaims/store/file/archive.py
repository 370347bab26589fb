"""Retention: ``fleetclaims audit archive --before AGE [--to DIR]`` moves the oldest sealed
segments out of ``segments/`` (to ``DIR``, by default the registry's ``archive/`` folder) and
records an anchor, ``segments/archived.json``: the seq and hash of the last archived line, and
each archived file's name, size and SHA-256. ``audit verify`` then proves the remaining chain
goes on from that anchor; ``audit verify --with DIR`` checks the archived files too.

Nothing is archived unless asked; the default keeps everything. Steps (crash points):

- ``archive.after_copy``: the segments are copied (fsynced) into DIR; nothing else changed
  (a file of a segment's name already in DIR is never replaced: with the very same bytes it
  counts as the copy, otherwise, as for a DIR that is the registry's own segments/ folder,
  nothing is done: ValidationError);
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
from ...core.errors import ArchiveMismatch, ValidationError
from ...core.model import GENESIS
from . import fsutil, segments
from .faults import crash_point, osc
from .journal import check_link, write_at

ANCHOR = "archived.json"
JOURNAL = "audit.jsonl"  # (a registry folder holds one: never archived into)
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


def _target(directory: Path, to: Path | None) -> Path:
    """The folder to archive to, refused (ValidationError, nothing changed) where the copies
    would be the segments themselves (the registry's segments/ folder, under any name: the
    "copies" were then removed as archived) or would land in a registry's own folders."""
    target = (to or directory / DEFAULT_DIR).resolve()
    home = directory.resolve()
    folder = home / segments.DIRNAME
    if target == home:
        why = "is the registry folder itself"
    elif target == folder or folder in target.parents or _same_file(target, folder):
        why = (f"is the registry's own {segments.DIRNAME}/ folder (or inside it, or a link to "
               "it): the copies would be the sealed segments themselves, which archiving then "
               "removes")
    elif (target / JOURNAL).exists() or (target.name == segments.DIRNAME
                                         and (target.parent / JOURNAL).exists()):
        why = "is another registry's folder or its segments/ folder"
    else:
        return target
    raise ValidationError("--to", f"{target} {why}; archive to a folder of its own, outside "
                          f"the registry (the default is {home / DEFAULT_DIR})")


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file or folder (same device and inode: a hard link or
    a bind mount is not told apart by its path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _taken(seg: segments.Segment, dst: Path, sha256: str, field: str = "--to") -> bool:
    """Whether ``dst`` (the archived copy's name) is taken already: False when it is free, True
    when it holds the very same bytes (it counts as the copy: an archive interrupted before
    its anchor, or the same segment archived twice). Otherwise ValidationError: a file of
    that name is never replaced (two registries' segments share names) nor the segment
    itself archived onto."""
    if not os.path.lexists(dst):
        return False
    if _same_file(seg.path, dst):
        raise ValidationError(field, f"{dst} is the sealed segment {seg.path} itself (a hard "
                              "link or a mount of the registry's segments/ folder): archive "
                              "to a folder of its own")
    if dst.is_file() and not dst.is_symlink() and _sha256(dst) == sha256:
        return True
    raise ValidationError(field, f"{dst} already exists and is not a copy of {seg.path} "
                          "(another registry's segment of the same name, or an earlier "
                          "history's?); it is never replaced: archive each registry (and each "
                          "history) to a folder of its own")


def _copy(seg: segments.Segment, dst: Path, sha256: str, sync: bool, field: str) -> None:
    """Copy ``seg`` to ``dst`` through a temp file, never replacing a file of that name: a
    hard link to the temp file fails if one appeared since ``_taken`` said it was free."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    segments.write_new(tmp, seg.path.read_bytes(), sync=sync)
    try:
        try:
            os.link(tmp, dst)
        except FileExistsError:
            if not _taken(seg, dst, sha256, field):  # (gone again meanwhile)
                os.link(tmp, dst)
        except OSError:  # a file system without hard links: checked, then renamed
            if not _taken(seg, dst, sha256, field):
                osc.replace(str(tmp), str(dst))
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def archive(directory: Path, before: float, to: Path | None = None, *,
            now: float | None = None, sync: bool = True) -> dict[str, Any]:
    """Move the sealed segments whose last event is older than ``before`` seconds (the oldest
    ones, in order; the active journal is never archived) to ``to``. Call under the registry
    lock. Returns what was done (for the CLI)."""
    now = time.time() if now is None else now
    target = _target(directory, to)
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
    # Every name checked before anything is copied: a refusal changes nothing.
    field = "--to" if to is not None else f"archive folder (default {DEFAULT_DIR}/)"
    sums = [_sha256(seg.path) for seg in chosen]
    fresh = [(seg, sha) for seg, sha in zip(chosen, sums, strict=True)
             if not _taken(seg, target / seg.path.name, sha, field)]
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    for seg, sha in fresh:
        _copy(seg, target / seg.path.name, sha, sync, field)
    if sync:
        fsutil.fsync_dir(target)
    crash_point("archive.after_copy")
    last = chosen[-1]
    seq, head = segments.last_link(last)
    for seg, sha in zip(chosen, sums, strict=True):
        files.append({"name": seg.path.name, "first": seg.first, "last": seg.last,
                      "bytes": seg.path.stat().st_size, "sha256": sha, "dir": str(target)})
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
        if _same_file(copy, seg.path):  # (an anchor naming segments/ itself, as one once could)
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
