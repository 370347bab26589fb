"""Input validation: every identifier and free text is checked before anything is written."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ValidationError

TASK_MAX = 200
OWNER_MAX = 128
PHASE_MAX = 32
NOTE_MAX = 2000
REASON_MAX = 500
JSON_MAX = 16 * 1024
TTL_MIN = 1.0
TTL_MAX = 24 * 3600.0
DEFAULT_TTL = 600.0
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000

_TASK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+#=,~-]*\Z")
_OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+~-]*\Z")
_PHASE_RE = re.compile(r"[a-z][a-z0-9_-]*\Z")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,256}\Z")
# C0/C1 controls except tab and newline, plus the bidirectional overrides and isolates that
# make text display differently from what it is ("Trojan Source").
_BAD_TEXT_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def task(value: Any) -> str:
    return _ident("task", value, _TASK_RE, TASK_MAX, "letters, digits and . _ : / @ + # = , ~ -")


LABEL_MAX = 64
NAMES_MAX = 256  # dependencies or labels of one task


def names(field: str, value: Any, check: Any = None) -> tuple[str, ...]:
    """A list of task ids (or labels): each validated, duplicates dropped, sorted, so that two
    spellings of the same set compare equal (``add`` is idempotent on identical input)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValidationError(field, "must be a list of names", value=value)
    value = list(value)
    if len(value) > NAMES_MAX:
        raise ValidationError(field, f"has more than {NAMES_MAX} entries")
    one = check or task
    return tuple(sorted({one(v) for v in value}))


def event_types(value: Any, known: frozenset[str]) -> frozenset[str] | None:
    """An event-type filter: None (every type), or known type names. A misspelt type is an
    error, never a filter that silently matches nothing."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValidationError("type", "must be a list of event types", value=value)
    try:
        wanted = frozenset(value)
    except TypeError:  # an unhashable member
        raise ValidationError("type", "must be a list of event types", value=value) from None
    for name in sorted(wanted, key=repr):
        if name not in known:
            import difflib

            close = difflib.get_close_matches(str(name), known, n=1)
            guess = f"did you mean {close[0]}? " if close else ""
            raise ValidationError(
                "type", f"is not an event type; {guess}the types are " + ", ".join(sorted(known)),
                value=name)
    return wanted


def label(value: Any) -> str:
    return _ident("label", value, _OWNER_RE, LABEL_MAX, "letters, digits and . _ : @ + ~ -")


def owner(value: Any, field: str = "owner") -> str:
    return _ident(field, value, _OWNER_RE, OWNER_MAX, "letters, digits and . _ : @ + ~ -")


def phase(value: Any) -> str:
    return _ident("phase", value, _PHASE_RE, PHASE_MAX, "lower-case letters, digits, _ and -")


def token(value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN_RE.match(value):
        # Never echo a token back: it may be a real secret typed into the wrong place.
        raise ValidationError("token", "must be 16-256 characters of A-Z a-z 0-9 _ -")
    return value


def text(field: str, value: Any, limit: int = NOTE_MAX) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string", value=value)
    if len(value) > limit:
        raise ValidationError(field, f"longer than {limit} characters", value=value)
    if _BAD_TEXT_RE.search(value):
        raise ValidationError(field, "contains control or bidirectional-override characters")
    return value


def reason(value: Any) -> str | None:
    """An optional reason for the audit log."""
    return text("reason", value, REASON_MAX)


def required_reason(value: Any, explain: str) -> str:
    """A reason the operation cannot go without; ``explain`` says what it must explain."""
    found = reason(value)
    if not found:
        raise ValidationError("reason", f"is required: {explain}")
    return found


def ttl(value: Any, *, allow_none: bool = False) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise ValidationError("ttl", "is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError("ttl", "must be a number of seconds", value=value)
    seconds = float(value)
    if not math.isfinite(seconds) or not TTL_MIN <= seconds <= TTL_MAX:
        raise ValidationError(
            "ttl", f"must be between {TTL_MIN:g}s and {TTL_MAX:g}s (24h)", value=value
        )
    return seconds


def priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("priority", "must be an integer", value=value)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(
            "priority", f"must be between {PRIORITY_MIN} and {PRIORITY_MAX}", value=value
        )
    return value


def json_value(field: str, value: Any, *, mapping: bool = False) -> Any:
    """A JSON-compatible value of bounded size (metadata, result)."""
    if value is None:
        return None
    if mapping and not isinstance(value, dict):
        raise ValidationError(field, "must be a mapping of strings to JSON values", value=value)
    import json  # here: a cold command without metadata does not pay for importing it

    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValidationError(field, f"is not plain JSON ({exc})") from None
    if len(encoded.encode()) > JSON_MAX:
        raise ValidationError(field, f"larger than {JSON_MAX} bytes as JSON")
    if _too_big_int(value):
        raise ValidationError(field, "holds an integer outside the signed 64-bit range")
    if _depth(value) > 16:
        raise ValidationError(field, "nested deeper than 16 levels")
    if _BAD_TEXT_RE.search(encoded):
        raise ValidationError(field, "contains control or bidirectional-override characters")
    # Round-trip so the stored value is exactly what JSON gives back (tuples become lists).
    return json.loads(encoded)


def _too_big_int(value: Any) -> bool:
    # JSON allows any integer; our encoders (and PostgreSQL's jsonb) stop at 64 bits.
    if isinstance(value, int) and not isinstance(value, bool):
        return not -(2**63) <= value < 2**63
    if isinstance(value, dict):
        return any(_too_big_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_too_big_int(v) for v in value)
    return False


def _depth(value: Any, level: int = 0) -> int:
    if level > 16:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _ident(field: str, value: Any, pattern: re.Pattern[str], limit: int, allowed: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(field, "must be a string", value=value)
    if not value:
        raise ValidationError(field, "must not be empty")
    if len(value) > limit:
        raise ValidationError(field, f"longer than {limit} characters", value=value)
    if not pattern.match(value):
        raise ValidationError(
            field, f"may contain only {allowed}, starting with a letter or digit", value=value
        )
    return value
