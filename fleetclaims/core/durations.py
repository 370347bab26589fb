"""Durations and instants as people write and read them: ``90s``, ``10m``, ``1h30m``, ``4m ago``."""

from __future__ import annotations

import re

from .errors import ValidationError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")  # (ASCII digits only)


def parse_duration(text: str, field: str = "duration") -> float:
    """Seconds in ``text``: plain seconds or parts like ``1h30m``, ``90s``, ``250ms``."""
    value = text.strip().lower()
    if not value:
        raise ValidationError(field, "is empty; write e.g. 90s, 10m or 2h")
    try:
        return float(value) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) else _parts(value, field)
    except OverflowError:
        raise ValidationError(field, "is too large", value=text) from None


def _parts(value: str, field: str) -> float:
    pos = 0
    total = 0.0
    for match in _PART_RE.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(value) or pos == 0:
        raise ValidationError(field, "is not a duration; write e.g. 90s, 10m, 1h30m", value=value)
    return total


def format_duration(seconds: float) -> str:
    """A short human duration: ``45s``, ``4m``, ``2h5m``, ``3d``."""
    s = abs(seconds)
    if s < 1:
        return f"{int(s * 1000)}ms"
    if s < 60:
        return f"{int(s)}s"
    if s < 3600:
        return f"{int(s // 60)}m" + (f"{int(s % 60)}s" if s < 600 and int(s % 60) else "")
    if s < 86400:
        return f"{int(s // 3600)}h" + (f"{int(s % 3600 // 60)}m" if int(s % 3600 // 60) else "")
    return f"{int(s // 86400)}d" + (f"{int(s % 86400 // 3600)}h" if int(s % 86400 // 3600) else "")


def relative(ts: float | None, now: float, *, future: str = "in {}", past: str = "{} ago") -> str:
    if ts is None:
        return "never"
    delta = ts - now
    if abs(delta) < 1:
        return "just now"
    return (future if delta >= 0 else past).format(format_duration(delta))


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        from datetime import datetime, timezone  # lazily: most commands never format a time

        stamp = datetime.fromtimestamp(ts, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def parse_instant(text: str, now: float, field: str = "time") -> float:
    """An instant: epoch seconds, ISO 8601 (``2026-11-30T12:00``, UTC unless an offset is given),
    or a duration ago (``10m``, ``2h``, ``1d``)."""
    value = text.strip()
    if re.fullmatch(r"[0-9]{9,}(\.[0-9]+)?", value):
        return float(value)
    if re.fullmatch(r"[0-9.]+(ms|s|m|h|d|w)([0-9.]+(ms|s|m|h|d|w))*", value.lower()):
        return now - parse_duration(value, field)
    try:
        from datetime import datetime, timezone

        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(
            field, "is not a time; write an ISO date (2026-11-30T12:00Z) or an age (10m, 2h)",
            value=text,
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()
