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
JSON_DEPTH_MAX = 16
#: the largest PID any supported system hands out (Linux's PID_MAX_LIMIT, 2**22; macOS stops
#: at 99,998): a larger number cannot name a process, so a claim made for it would be stale
#: at once
PID_MAX = 2**22
#: event sequence numbers and cursors are signed 64-bit integers in every store
SEQ_MAX = 2**63 - 1
#: timestamps (seconds since the epoch) accepted as filters: up to the year 10000
TIMESTAMP_MAX = 253_402_300_800.0

_TASK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+#=,~-]*\Z")
_OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+~-]*\Z")
_PHASE_RE = re.compile(r"[a-z][a-z0-9_-]*\Z")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,256}\Z")
# C0/C1 controls except tab and newline, plus the bidirectional overrides and isolates that
# make text display differently from what it is ("Trojan Source").
_BAD_TEXT_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# A lone surrogate is not Unicode text: no UTF-8 encoder accepts it. It reaches us from a JSON
# "\\ud800" escape, or from a command-line argument that was not valid UTF-8 (Python decodes
# undecodable bytes to surrogates, PEP 383).
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
SURROGATE_REASON = ("contains a lone surrogate or bytes that are not UTF-8 (text must be valid "
                    "Unicode)")


def task(value: Any) -> str:
    return _ident("task", value, _TASK_RE, TASK_MAX,
                  "ASCII letters, digits and . _ : / @ + # = , ~ -")


LABEL_MAX = 64
NAMES_MAX = 256  # dependencies or labels of one task


def flag(field: str, value: Any) -> bool:
    """A yes/no argument: True or False only (a string "no" is truthy)."""
    if not isinstance(value, bool):
        raise ValidationError(field, "must be True or False", value=value)
    return value


def _bounded_list(field: str, value: Any, what: str) -> list[Any]:
    """The first NAMES_MAX + 1 members of the iterable ``value`` (a huge one is not read
    whole to be refused)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ValidationError(field, f"must be a list of {what}", value=value)
    import itertools

    return list(itertools.islice(value, NAMES_MAX + 1))


def names(field: str, value: Any, check: Any = None) -> tuple[str, ...]:
    """A list of task ids (or labels): each validated, duplicates dropped, sorted, so that two
    spellings of the same set compare equal (``add`` is idempotent on identical input)."""
    if value is None:
        return ()
    value = _bounded_list(field, value, "names")
    if len(value) > NAMES_MAX:
        raise ValidationError(field, f"has more than {NAMES_MAX} entries")
    one = check or task
    return tuple(sorted({one(v) for v in value}))


def event_types(value: Any, known: frozenset[str]) -> frozenset[str] | None:
    """An event-type filter: None (every type), or known type names. A misspelt type is an
    error, never a filter that silently matches nothing."""
    if value is None:
        return None
    value = _bounded_list("type", value, "event types")
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
    return _ident("label", value, _OWNER_RE, LABEL_MAX, "ASCII letters, digits and . _ : @ + ~ -")


def owner(value: Any, field: str = "owner") -> str:
    return _ident(field, value, _OWNER_RE, OWNER_MAX, "ASCII letters, digits and . _ : @ + ~ -")


def phase(value: Any) -> str:
    return _ident("phase", value, _PHASE_RE, PHASE_MAX, "lower-case ASCII letters, digits, _ and -")


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
    _check_chars(field, value)
    return value


def _check_chars(field: str, value: str) -> None:
    if _SURROGATE_RE.search(value):
        raise ValidationError(field, SURROGATE_REASON)
    if _BAD_TEXT_RE.search(value):
        raise ValidationError(field, "contains control or bidirectional-override characters")


def reason(value: Any) -> str | None:
    """An optional reason for the audit log."""
    return text("reason", value, REASON_MAX)


def required_reason(value: Any, explain: str) -> str:
    """A reason the operation cannot go without; ``explain`` says what it must explain."""
    found = reason(value)
    if not found:
        raise ValidationError("reason", f"is required: {explain}")
    return found


def ttl(value: Any, *, allow_none: bool = False, name: str = "ttl") -> float | None:
    """A lease length in seconds (``name``: the parameter named in a refusal)."""
    if value is None:
        if allow_none:
            return None
        raise ValidationError(name, "is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(name, "must be a number of seconds", value=value)
    # Compared before float(): float(10**400) raises OverflowError.
    if not (isinstance(value, int) or math.isfinite(value)) or not TTL_MIN <= value <= TTL_MAX:
        raise ValidationError(
            name, f"must be between {TTL_MIN:g}s and {TTL_MAX:g}s (24h)", value=value
        )
    return float(value)


def priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("priority", "must be an integer", value=value)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValidationError(
            "priority", f"must be between {PRIORITY_MIN} and {PRIORITY_MAX}", value=value
        )
    return value


def process(value: Any) -> bool | int:
    """Whose death makes a claim stale: True (the caller), False (none) or a PID that can
    exist (1 to PID_MAX)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and 1 <= value <= PID_MAX:
        return value
    raise ValidationError("process", f"must be True, False or a PID from 1 to {PID_MAX}",
                          value=value)


def cursor(field: str, value: Any) -> int:
    """An event sequence number used as a cursor (``after``): 0 to 2**63-1."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEQ_MAX:
        raise ValidationError(field, f"must be an integer from 0 to {SEQ_MAX}", value=value)
    return value


def timestamp(field: str, value: Any) -> float | None:
    """An optional time filter: seconds since the epoch, finite, from 0 to the year 10000."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(field, "must be a number of seconds since the epoch", value=value)
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= TIMESTAMP_MAX:
        raise ValidationError(
            field, f"must be seconds since the epoch from 0 to {TIMESTAMP_MAX:.0f}", value=value)
    return float(value)


def json_text(field: str, text: str) -> Any:
    """``text`` parsed as JSON (a command-line ``--metadata``), refused before parsing when it
    nests deeper than JSON_DEPTH_MAX: the parser recurses and would raise RecursionError."""
    _check_text_depth(field, text)
    import json

    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ValidationError(field, "is not valid JSON", value=text) from None


def _check_text_depth(field: str, text: str) -> None:
    if len(text) > 4 * JSON_MAX:  # whitespace may pad it, but not without bound
        raise ValidationError(field, f"longer than {4 * JSON_MAX} characters")
    if json_nesting_exceeds(text, JSON_DEPTH_MAX):
        raise ValidationError(field, f"nested deeper than {JSON_DEPTH_MAX} levels")


def json_nesting_exceeds(text: str, limit: int) -> bool:
    """Whether the JSON text ``text`` opens more than ``limit`` nested arrays or objects: told
    by a scan that skips strings, so a parser that recurses is never handed it."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def json_value(field: str, value: Any, *, mapping: bool = False) -> Any:
    """A JSON-compatible value of bounded size (metadata, result): checked by an iterative walk
    (no recursion limit to reach, work bounded by JSON_MAX) before it is encoded."""
    if value is None:
        return None
    if mapping and not isinstance(value, dict):
        raise ValidationError(field, "must be a mapping of strings to JSON values", value=value)
    _walk_json(field, value)
    import json  # here: a cold command without metadata does not pay for importing it

    encoded = json.dumps(value, allow_nan=False, ensure_ascii=False, sort_keys=True,
                         separators=(",", ":"))  # (counted compact: the bytes the user sent)
    if len(encoded.encode()) > JSON_MAX:
        raise ValidationError(field, f"larger than {JSON_MAX} bytes as JSON")
    # Round-trip so the stored value is exactly what JSON gives back (tuples become lists).
    return json.loads(encoded)


def _walk_json(field: str, value: Any) -> None:
    """Every member of ``value`` is plain JSON: str keys, finite numbers, 64-bit integers,
    valid text, at most JSON_DEPTH_MAX levels; stops once JSON_MAX is surely exceeded."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    budget = JSON_MAX  # every member costs at least one byte of JSON
    while stack:
        item, level = stack.pop()
        budget -= 1
        if budget < 0:
            raise ValidationError(field, f"larger than {JSON_MAX} bytes as JSON")
        if isinstance(item, str):
            budget -= len(item)
            if budget < 0:
                raise ValidationError(field, f"larger than {JSON_MAX} bytes as JSON")
            _check_chars(field, item)
        elif item is None or isinstance(item, bool):
            pass
        elif isinstance(item, int):
            # JSON allows any integer; our encoders (and PostgreSQL's jsonb) stop at 64 bits.
            if not -(2**63) <= item < 2**63:
                raise ValidationError(field, "holds an integer outside the signed 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValidationError(field, "holds NaN or an infinity, which JSON cannot carry")
        elif isinstance(item, (dict, list, tuple)):
            if level >= JSON_DEPTH_MAX:
                raise ValidationError(field, f"nested deeper than {JSON_DEPTH_MAX} levels")
            if isinstance(item, dict):
                for key, member in item.items():
                    if not isinstance(key, str):
                        raise ValidationError(field, "has a key that is not a string", value=key)
                    stack.append((key, level + 1))
                    stack.append((member, level + 1))
            else:
                stack.extend((member, level + 1) for member in item)
        else:
            raise ValidationError(field, f"is not plain JSON (holds a {type(item).__name__})")


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
