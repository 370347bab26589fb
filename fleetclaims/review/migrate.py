"""Copy a whole registry between stores: a directory and PostgreSQL, either way.

The journal is copied line by line, byte for byte: every sealed line keeps its seq, timestamp,
fence and hash, so the hash chain of the copy is the chain of the original and ``audit verify``
reports the same head on both sides. The target rebuilds its claims by applying the copied
events (the same ``core.events.apply`` both stores use) and must be empty beforehand.

Stop the writers of the source while migrating: events written to the source after the copy
started are not copied (the copy is the journal as it stood when it began).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import AuditCorrupt, RegistryCorrupt, ValidationError
from ..location import is_url, resolve
from ..store.base import VerifyReport

__all__ = ["MigrationReport", "copy_registry", "read_journal_lines"]


@dataclass(frozen=True)
class MigrationReport:
    source: str
    target: str
    events: int
    head: str
    claims: int
    verify: VerifyReport


def read_journal_lines(location: str, *, schema: str | None = None) -> Generator[bytes, None, None]:
    """The committed, sealed journal lines of a registry (each ending in a newline), checked
    against the hash chain as they are read; stops at the journal's end when the read began."""
    if is_url(location):
        from ..store.postgres.store import PostgresStore

        store = PostgresStore(location, schema=schema)
        try:
            end = store.read().seq
            checked = store.verify()  # (before anything is written: a file source is read
            if not checked.ok:  # through the verifying reader, a damaged one stops at once)
                raise AuditCorrupt(store.location, seq=checked.seq or 0, offset=0,
                                   reason=f"the source does not verify: {checked.error}")
            for seq, text in store.iter_lines(0):
                if seq > end:
                    break
                yield text.encode() + b"\n"
        finally:
            store.close()
        return
    from ..store.file import fsutil
    from ..store.file.reader import JournalReader

    journal = Path(location) / "audit.jsonl"
    try:
        fd = fsutil.open_file(journal, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        reader = JournalReader(fd, str(journal), end=os.fstat(fd).st_size)
        for _, line, _ in reader.events():
            yield line + b"\n"
        # A torn tail was never acknowledged: not copied. Damage stops the copy.
        if reader.damage is not None:
            raise reader.corrupt()
    finally:
        os.close(fd)


def _claims(location: str, schema: str | None) -> tuple[int, str, dict[str, Any]]:
    store = _open(location, schema)
    try:
        state = store.read()
        return state.seq, state.head, {c.task: c.to_dict() for c in state.claims.values()}
    finally:
        store.close()


def _open(location: str, schema: str | None) -> Any:
    from ..system import SystemClock

    if is_url(location):
        from ..store.postgres.store import PostgresStore

        return PostgresStore(location, clock=SystemClock(), schema=schema)
    from ..store.file.store import FileStore

    return FileStore(location, clock=SystemClock())


def copy_registry(
    src_location: str | os.PathLike[str],
    dst_location: str | os.PathLike[str],
    *,
    src_schema: str | None = None,
    dst_schema: str | None = None,
) -> MigrationReport:
    """Copy the registry at ``src_location`` (a directory or ``postgresql://`` URL) into the
    empty registry at ``dst_location``: the whole journal with its seq numbers, hashes and
    fences, then the claims rebuilt from it. Checks afterwards that the target verifies, ends at
    the same head and holds equal claims; raises RegistryCorrupt otherwise."""
    src = resolve(src_location)
    dst = resolve(dst_location)
    if src == dst and src_schema == dst_schema:
        raise ValidationError("target", "is the source registry itself", value=dst)
    if not is_url(src) and not (Path(src) / "audit.jsonl").exists():
        raise ValidationError("source", "holds no registry (no audit.jsonl)", value=src)
    source = read_journal_lines(src, schema=src_schema)
    first = next(source, None)  # (read before the target is touched)
    if first is None:
        source.close()
        raise ValidationError("source", "holds no registry (its journal is empty: a mistyped "
                              "schema or directory?); nothing was copied")
    lines = itertools.chain((first,), source)
    target = _open(dst, dst_schema)
    try:
        if is_url(dst):
            target.import_lines(lines)
        else:
            target.import_events(list(lines))
        report: VerifyReport = target.verify()
        dst_shown = target.location
    finally:
        target.close()
    src_seq, src_head, src_claims = _claims(src, src_schema)
    dst_seq, dst_head, dst_claims = _claims(dst, dst_schema)
    if not report.ok or report.head != dst_head:
        raise AuditCorrupt(dst_shown, seq=report.seq or 0, offset=report.offset or 0,
                           reason=f"the copied journal does not verify: {report.error}")
    if (dst_seq, dst_head) != (src_seq, src_head):
        raise RegistryCorrupt(
            dst_shown,
            f"the copy ends at seq {dst_seq} but the source at seq {src_seq} (was the source "
            "written to while migrating?)",
            hint="Stop the writers of the source and migrate into an empty target again.",
        )
    if dst_claims != src_claims:
        differ = sorted(t for t in {*src_claims, *dst_claims}
                        if src_claims.get(t) != dst_claims.get(t))
        raise RegistryCorrupt(dst_shown, f"claims differ after the copy: {differ[:5]}")
    src_shown = src
    if is_url(src):  # (as shown everywhere: without the password)
        from ..store.postgres.schema import parse_location

        src_shown = parse_location(src, src_schema)[2]
    return MigrationReport(src_shown, dst_shown, report.events, report.head, len(dst_claims),
                           report)
