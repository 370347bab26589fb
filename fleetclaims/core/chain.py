"""The hash chain of the audit journal.

A journal line is one JSON object. Its last member is ``"hash"``: the SHA-256 of the line's own
bytes up to that member (with the object closed), and the body carries ``"prev"``, the hash of
the line before. Hashing the stored bytes, rather than a re-serialisation, makes verification a
single hash per line and keeps the chain valid whatever JSON encoder wrote it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .model import GENESIS

_MARK = b',"hash":"'
SUFFIX_LEN = len(_MARK) + 64 + 2  # ,"hash":"<64 hex>"}
_HEX = frozenset(b"0123456789abcdef")

__all__ = [
    "GENESIS", "SUFFIX_LEN", "ChainError", "check_seal", "envelope", "seal", "token_hash", "unseal",
]


class ChainError(ValueError):
    """A line is not a well-formed sealed journal line."""


def envelope(seq: int, ts: float, fields: dict[str, Any], prev: str) -> dict[str, Any]:
    """The event object in its canonical member order: seq, ts, type, task, ..., prev."""
    event: dict[str, Any] = {"seq": seq, "ts": ts}
    event.update(fields)
    event["prev"] = prev
    return event


def seal(body: bytes) -> tuple[bytes, str]:
    """Append the hash member to a serialised event object; returns (line with newline, hash)."""
    if not body.endswith(b"}"):
        raise ChainError("event body is not a JSON object")
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + _MARK + digest.encode() + b'"}\n', digest


def unseal(line: bytes) -> tuple[bytes, str]:
    """Split a line (without its newline) into (body, recorded hash) and check the hash."""
    digest = check_seal(line)
    return line[: len(line) - SUFFIX_LEN] + b"}", digest


def check_seal(line: bytes) -> str:
    """Check a line's (without its newline) hash member against its bytes; return the hash.

    Run on every journal line a process reads, so the common case is one hash and two
    comparisons: a recorded value equal to the computed hex digest is 64 lower-case hex
    digits, and only a mismatch is examined further (for the message)."""
    cut = len(line) - SUFFIX_LEN
    if cut < 2 or not line.startswith(_MARK, cut) or not line.endswith(b'"}'):
        raise ChainError("line does not end with a hash member")
    digest = hashlib.sha256(line[:cut] + b"}").hexdigest()
    if line[cut + len(_MARK) : -2] != digest.encode():
        if not _HEX.issuperset(line[cut + len(_MARK) : -2]):
            raise ChainError("hash member is not 64 lower-case hex digits")
        raise ChainError("hash does not match the line's bytes")
    return digest


def token_hash(token: str) -> str:
    """How a token is stored and logged: never the token itself."""
    return hashlib.sha256(b"fleetclaims-token:" + token.encode()).hexdigest()
