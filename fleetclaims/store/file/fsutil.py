"""Careful file handling: refuse symlinks, FIFOs, hard links, foreign owners; fsync; quarantine."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from ...core.errors import UnsafeRegistry
from .faults import osc

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a planted FIFO must not hang
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
GITIGNORE = "# Created by fleetclaims: the registry is local state, never commit it.\n*\n"


def euid() -> int | None:
    """The user the registry files must belong to (None: a platform without uids). A seam:
    tests that run as root replace it to meet another user's registry."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def check_directory(path: Path, *, create: bool, others_ok: bool = False) -> int | None:
    """The registry directory must be a real directory that others cannot write to, and ours;
    with ``others_ok``, another user's is accepted for reading: returns its owner's uid (None:
    ours), and the caller opens it read-only and refuses writes."""
    try:
        st = os.lstat(path)
    except NotADirectoryError:  # (a file where a parent folder should be)
        raise UnsafeRegistry(str(path), "a parent of the registry path is a file, not a "
                             "directory") from None
    except FileNotFoundError:
        if not create:
            raise
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except (NotADirectoryError, FileExistsError):
            raise UnsafeRegistry(str(path), "a parent of the registry path is a file, not a "
                                 "directory") from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        _write_gitignore(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRegistry(str(path), "the registry directory is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRegistry(str(path), "the registry path exists and is not a directory")
    me = euid()
    foreign = None if me is None or st.st_uid == me else st.st_uid
    if foreign is not None and not others_ok:
        raise UnsafeRegistry(
            str(path), f"the directory is owned by uid {st.st_uid}, not by you (uid {me})"
        )
    if st.st_mode & 0o022:
        raise UnsafeRegistry(
            str(path),
            f"the directory is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})",
            hint=f"Run `chmod 700 {path}` if that is your registry, then retry.",
        )
    return foreign


def _write_gitignore(path: Path) -> None:
    target = path / ".gitignore"
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(fd, GITIGNORE.encode())
    finally:
        os.close(fd)


def open_file(path: Path, flags: int, *, create: bool = False) -> int:
    """Open a registry file safely: no symlink, no FIFO or device, no hard link, ours."""
    mode_flags = flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = osc.open(str(path), mode_flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRegistry(str(path), "it is a symbolic link") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeRegistry(str(path), "it is a socket or FIFO, not a regular file") from None
        if exc.errno == errno.EISDIR:
            raise UnsafeRegistry(str(path), "it is a directory, not a regular file") from None
        raise
    try:
        check_fd(fd, path, reading=not flags & (os.O_WRONLY | os.O_RDWR) and not create)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_fd(fd: int, path: Path, *, reading: bool = False) -> os.stat_result:
    """A registry file is a regular file with one link, ours; for ``reading`` also one of
    another user's registry (owned by the owner of its directory, see check_directory)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeRegistry(str(path), "it is not a regular file (FIFO, device or directory)")
    if st.st_nlink > 1:
        raise UnsafeRegistry(str(path), f"it has {st.st_nlink} hard links; a registry file has one")
    me = euid()
    if me is not None and st.st_uid != me and not (
            reading and st.st_uid == os.lstat(path.parent).st_uid):
        raise UnsafeRegistry(str(path), f"it is owned by uid {st.st_uid}, not by you")
    return st


# A large file written beside live writers (a snapshot, a segment) is flushed every this many
# bytes, not once at the end: a single fsync of 40 MB fills the device queue for tens of ms,
# and every writer's fdatasync issued meanwhile waits behind it (the slowest operation at
# 100,000 claims went from ~21 ms to ~10 ms; bench/README.md, "Paced flushing").
PACE = 1 << 20


def write_paced(fd: int, data: bytes | memoryview, *, sync: bool,
                halfway: Callable[[], None] | None = None) -> None:
    """Write all of ``data`` at the file position of ``fd`` in PACE-sized pieces, each made
    durable before the next when ``sync`` (the caller still fsyncs at the end: the file's
    size and metadata). ``halfway`` runs once half is written (a crash point)."""
    view = memoryview(data)
    total, pos, half = len(view), 0, len(view) // 2
    while pos < total:
        end = min(pos + PACE, total)
        while pos < end:
            n = osc.write(fd, view[pos:end])
            if n <= 0:
                raise OSError(errno.EIO, f"short write ({pos} of {total} bytes)")
            pos += n
        if halfway is not None and pos >= half:
            halfway()
            halfway = None
        if sync and pos < total:
            osc.fdatasync(fd)


def replace_over(src: Path, dst: Path) -> int:
    """Rename ``src`` over ``dst``; a descriptor of the file replaced (-1: none) for the
    caller to close once convenient. A rename over the last link of a large file frees its
    blocks inside the rename, under the directory's lock (~17 ms for 40 MB on ext4), and
    every process listing or changing the directory meanwhile waits; freed at the close of
    a descriptor held across the rename, they are freed outside that lock."""
    try:
        old = os.open(dst, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
    except OSError:
        old = -1
    try:
        osc.replace(str(src), str(dst))
    except BaseException:
        if old >= 0:
            os.close(old)
        raise
    return old


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    except OSError:
        return  # some platforms cannot open directories; rename is then as durable as it gets
    try:
        osc.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    # One read of the whole size first: joining 1 MiB chunks copies a large snapshot once more
    # (~3 ms of a cold command at 10,000 claims). The loop covers a file that grew meanwhile.
    try:
        size = os.fstat(fd).st_size
    except OSError:
        size = 0
    chunks: list[bytes] = []
    want = max(size + 1, 1 << 16)
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.append(chunk)
        want = 1 << 20


def quarantine_name(name: str, reason: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    slug = "".join(c if c.isalnum() else "-" for c in reason.lower())[:40].strip("-")
    return f"{stamp}-{os.getpid()}-{os.urandom(3).hex()}-{name}-{slug}"


def _quarantine_dir(directory: Path) -> Path:
    qdir = directory / "quarantine"
    with contextlib.suppress(FileExistsError):
        os.mkdir(qdir, 0o700)
    if qdir.is_symlink() or not qdir.is_dir():
        raise UnsafeRegistry(str(qdir), "the quarantine path is not a plain directory")
    return qdir


def write_note(qdir: Path, name: str, note: dict[str, Any], *, sync: bool) -> None:
    path = qdir / f"{name}.note.json"
    fd = open_file(path, os.O_WRONLY | os.O_EXCL, create=True)
    try:
        os.write(fd, orjson.dumps(note, option=orjson.OPT_INDENT_2) + b"\n")
        if sync:
            osc.fsync(fd)
    finally:
        os.close(fd)


def quarantine_file(
    directory: Path,
    path: Path,
    reason: str,
    *,
    sync: bool = True,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Move a damaged file aside, with a note of why. Never deletes it."""
    qdir = _quarantine_dir(directory)
    name = quarantine_name(path.name, reason)
    target = qdir / name
    try:
        size = os.lstat(path).st_size
    except OSError:
        size = None
    os.rename(path, target)
    note = {"reason": reason, "original": str(path), "size": size, "moved_at": time.time()}
    note.update(extra or {})
    write_note(qdir, name, note, sync=sync)
    if sync:
        fsync_dir(qdir)
        fsync_dir(directory)
    return target


def quarantine_bytes(
    directory: Path, name: str, data: bytes, reason: str, *, sync: bool = True,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Keep a copy of damaged bytes (e.g. a torn journal tail) before they are cut off."""
    return _quarantine_chunks(directory, name, [data], len(data), reason, sync=sync, extra=extra)


def quarantine_copy(
    directory: Path, name: str, src_fd: int, reason: str, *, sync: bool = True,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Keep a copy of the whole file open at ``src_fd`` (read a chunk at a time: a journal can
    be larger than the memory one should use to repair it)."""
    size = os.fstat(src_fd).st_size

    def chunks() -> Iterator[bytes]:
        pos = 0
        while pos < size:
            chunk = os.pread(src_fd, min(1 << 20, size - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            yield chunk

    return _quarantine_chunks(directory, name, chunks(), size, reason, sync=sync, extra=extra)


def _quarantine_chunks(
    directory: Path, name: str, chunks: Iterable[bytes], size: int, reason: str, *, sync: bool,
    extra: dict[str, Any] | None,
) -> Path:
    qdir = _quarantine_dir(directory)
    qname = quarantine_name(name, reason)
    target = qdir / qname
    fd = open_file(target, os.O_WRONLY | os.O_EXCL, create=True)
    try:
        for data in chunks:
            view = memoryview(data)
            while view:
                view = view[osc.write(fd, bytes(view)) :]
        if sync:
            osc.fsync(fd)
    finally:
        os.close(fd)
    note = {"reason": reason, "original": str(directory / name), "size": size,
            "moved_at": time.time()}
    note.update(extra or {})
    write_note(qdir, qname, note, sync=sync)
    if sync:
        fsync_dir(qdir)
    return target


def refuse_read_only(fd: int, where: str, exc: OSError) -> None:
    """Raise AccessDenied when a write to ``fd`` failed because it was opened read-only: the
    registry was opened for reading on a read-only mount or with files this user may not
    write (a write there said "Bad file descriptor" and blamed the disk)."""
    import fcntl

    from ...core.errors import AccessDenied

    if exc.errno != errno.EBADF:
        return
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return
    if mode == os.O_RDONLY:
        raise AccessDenied(where, "this registry can only be read here (a read-only mount, or "
                           "files this user may not write)", hint=(
                               "Write from a user that owns the registry's files, or remount "
                               "it read-write; reads work as they are.")) from None
