"""Path reservations: pattern normalisation, the exact overlap decision, and an index.

A claim may reserve repository-relative path patterns, exclusively (``paths``) or shared
(``shared_paths``). This module decides, without reading any file system, whether two patterns
can cover a common path, and finds the reservations a new pattern may overlap without
comparing it with every reservation held.

The supported syntax (a subset of gitignore's, decided exactly):

- A pattern is ``/``-separated segments, relative to the repository root and anchored there
  (``*.py`` is the top level only; write ``**/*.py`` for every directory).
- ``*`` matches any characters of one segment (never ``/``); ``?`` one character of one
  segment; ``**`` as a whole segment matches zero or more segments. Anything else is literal.
- A pattern covers a path when the path, or one of its parent directories, matches it (as in
  gitignore, a matched directory covers everything in it): ``src/parser``, ``src/parser/`` and
  ``src/parser/**`` all reserve the directory and everything under it, and ``src/a.py`` also
  covers ``src/a.py/x`` (no file-system read tells a file from a directory).
- Case: patterns and paths are compared after NFC and ``str.casefold``, whatever the file
  system of the machine deciding, so two machines always agree. On a case-insensitive checkout
  (macOS, Windows) ``Src/A.py`` and ``src/a.py`` are one file; on Linux they are two, and
  treating them as one is the safe mistake (a refusal, never a missed overlap).
- Normalised: repeated ``/`` and ``.`` segments are dropped, a trailing ``/`` is dropped,
  consecutive ``**`` collapse into one. Refused (``ValidationError``): an empty pattern, a
  leading ``/`` (absolute), ``..`` segments, ``\\`` (an escape or a Windows separator), NUL and
  other control characters, gitignore's ``!`` negation, character classes (``[``/``]``: not
  supported, so never half-decided), ``**`` inside a segment, and sizes beyond the limits
  below (which bound every decision's time).

Two patterns overlap when some path is covered by both. Both have an implicit trailing ``**``
(the directory rule), so once either is used up the other's remainder is always satisfiable:
the decision is a small dynamic programme over segment positions, and two segment globs
overlap when the product of their two automata reaches both ends (``_segments_meet``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

from .errors import ValidationError
from .validate import SURROGATE_REASON

MAX_PATTERN: Final = 512  # characters of one pattern
MAX_SEGMENT: Final = 255  # characters of one segment (a file name's usual limit)
MAX_SEGMENTS: Final = 64
MAX_WILDCARDS: Final = 16  # ``*`` and ``?`` in one pattern
MAX_PATTERNS: Final = 256  # patterns on one claim
ANY: Final = "**"
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_REFUSED = {"\\": "a backslash (escapes and Windows separators are not supported)",
            "[": "a character class (not supported)", "]": "a character class (not supported)"}


def normalise(pattern: object, field_name: str = "paths") -> str:
    """The normal form of one pattern, or ``ValidationError`` naming what is wrong."""
    if not isinstance(pattern, str):
        raise ValidationError(field_name, "a pattern must be a string", value=pattern)
    if len(pattern) > MAX_PATTERN:
        raise ValidationError(field_name, f"a pattern is at most {MAX_PATTERN} characters",
                              value=pattern)
    for char in pattern:
        # (C0 and C1 controls, DEL, and the line and paragraph separators: all break lines)
        if char < " " or "\x7f" <= char <= "\x9f" or char in "\u2028\u2029":
            raise ValidationError(field_name, "a pattern may not hold control characters or NUL",
                                  value=pattern)
        if char in _REFUSED:
            raise ValidationError(field_name, f"{_REFUSED[char]} in pattern", value=pattern)
        if char in _BIDI:  # (shown, the pattern would read as something else: Trojan Source)
            raise ValidationError(field_name, "a pattern may not hold bidirectional-override "
                                  "or isolate characters", value=pattern)
        if "\ud800" <= char <= "\udfff":
            raise ValidationError(field_name, f"a pattern {SURROGATE_REASON}", value=pattern)
    if pattern.startswith("/"):
        raise ValidationError(field_name, "patterns are relative to the repository root, "
                              "not absolute", value=pattern)
    if pattern.startswith("!"):
        raise ValidationError(field_name, "negated patterns are not supported", value=pattern)
    segments: list[str] = []
    for seg in pattern.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            raise ValidationError(field_name, "'..' may not appear in a pattern", value=pattern)
        if len(seg) > MAX_SEGMENT:
            raise ValidationError(field_name, f"a segment is at most {MAX_SEGMENT} characters",
                                  value=pattern)
        if "**" in seg and seg != ANY:
            raise ValidationError(field_name, "'**' must be a whole segment", value=pattern)
        if seg == ANY and segments and segments[-1] == ANY:
            continue
        segments.append(seg)
    if not segments:
        raise ValidationError(field_name, "a pattern must name something", value=pattern)
    if len(segments) > MAX_SEGMENTS:
        raise ValidationError(field_name, f"a pattern has at most {MAX_SEGMENTS} segments",
                              value=pattern)
    if sum(seg.count("*") + seg.count("?") for seg in segments if seg != ANY) > MAX_WILDCARDS:
        raise ValidationError(field_name, f"a pattern has at most {MAX_WILDCARDS} wildcards",
                              value=pattern)
    if segments[-1] == ANY and len(segments) > 1:
        segments.pop()  # ``dir/**`` is ``dir``: the directory rule covers everything under it
    return "/".join(segments)


def normalise_all(patterns: Iterable[object] | None, field_name: str = "paths") -> tuple[str, ...]:
    """Normalised, de-duplicated patterns in first-seen order (``ValidationError`` on any bad
    one, or on more than ``MAX_PATTERNS``)."""
    if patterns is None:
        return ()
    if isinstance(patterns, (str, bytes)):
        raise ValidationError(field_name, "give a list of patterns, not one string",
                              value=patterns)
    if not isinstance(patterns, Iterable) or isinstance(patterns, dict):
        raise ValidationError(field_name, "give a list of patterns", value=patterns)
    out: dict[str, None] = {}
    for count, pattern in enumerate(patterns, 1):
        if count > MAX_PATTERNS:
            raise ValidationError(field_name, f"a claim reserves at most {MAX_PATTERNS} patterns")
        out[normalise(pattern, field_name)] = None
    return tuple(out)


def _fold(text: str) -> str:
    """The form names are compared in: case-folded, after NFC (``café`` typed as ``e`` and a
    combining accent is the same name: one file on macOS)."""
    if text.isascii():
        return text.casefold()
    import unicodedata  # (only for names that need it: a cold command imports less)

    return unicodedata.normalize("NFC", text).casefold()


def _key(pattern: str) -> tuple[str, ...]:
    return tuple(_fold(pattern).split("/"))


def _wild(segment: str) -> bool:
    return "*" in segment or "?" in segment


def _segments_meet(a: str, b: str) -> bool:
    """Whether some non-empty segment matches both globs (``*``, ``?``, literals).

    Defined as reachability in the product of the two glob automata (a ``*`` skipped or
    consuming a character, ``?`` and literals consuming one; tests/test_paths.py keeps that
    definition and checks these against it), decided here in linear time: the product is
    quadratic, and 256 patterns of long segments held the lock for minutes."""
    if not _wild(a) or not _wild(b):
        return glob_match(b, a) if not _wild(a) else glob_match(a, b)
    if "*" in a and "*" in b:
        # Both have a star: they meet exactly when their parts before the first star agree
        # and their parts after the last star agree (character by character, ``?`` agreeing
        # with anything, over the shorter length). Then a word made of the longer prefix,
        # a's middle, b's middle and the longer suffix matches both (each one's stars take
        # the other's parts).
        pa, pb = a[: a.index("*")], b[: b.index("*")]
        sa, sb = a[a.rindex("*") + 1 :], b[b.rindex("*") + 1 :]
        return _agree(pa, pb) and _agree(sa[::-1], sb[::-1])
    return _meet_fixed(a, b) if "*" not in b else _meet_fixed(b, a)


def _meet_fixed(glob: str, fixed: str) -> bool:
    """Whether ``glob`` matches some word that the star-free ``fixed`` (literals and ``?``)
    matches: the product automaton run on bit masks of the positions in ``fixed`` (one integer
    operation per character of ``glob``)."""
    n = len(fixed)
    everything = (1 << (n + 1)) - 1
    anything = sum(1 << j for j, d in enumerate(fixed) if d == "?")
    fit: dict[str, int] = {}
    at = 1  # bit j: glob read so far can have consumed fixed[:j]
    for c in glob:
        if c == "*":
            at = everything & ~((at & -at) - 1)  # any j at or after the lowest reached
        elif c == "?":
            at = (at << 1) & everything
        else:
            if c not in fit:
                fit[c] = anything | sum(1 << j for j, d in enumerate(fixed) if d == c)
            at = ((at & fit[c]) << 1) & everything
        if not at:
            return False
    return bool(at >> n & 1)


def _agree(x: str, y: str) -> bool:
    """Whether two star-free glob parts agree on their common length (``?`` with anything)."""
    return all(c == d or c == "?" or d == "?" for c, d in zip(x, y, strict=False))


def glob_match(glob: str, text: str) -> bool:
    """Whether ``text`` (one segment) matches ``glob``: the greedy two-pointer match that
    backtracks only to the last ``*`` (O(len(glob) * len(text)), no regular expressions)."""
    gi = ti = 0
    star = -1
    mark = 0
    while ti < len(text):
        if gi < len(glob) and glob[gi] == "*":
            star, mark = gi, ti
            gi += 1
        elif gi < len(glob) and (glob[gi] == "?" or glob[gi] == text[ti]):
            gi += 1
            ti += 1
        elif star >= 0:
            gi = star + 1
            mark += 1
            ti = mark
        else:
            return False
    while gi < len(glob) and glob[gi] == "*":
        gi += 1
    return gi == len(glob) and bool(text)


@lru_cache(maxsize=65536)
def overlap(a: str, b: str) -> bool:
    """Whether two normalised patterns can cover a common path (symmetric, exact)."""
    return overlap_keys(_key(a), _key(b))


def overlap_keys(sa: tuple[str, ...], sb: tuple[str, ...]) -> bool:
    """``overlap`` over casefolded segment tuples. The common prefix without ``**`` is walked
    first (most pairs part there, at a literal or a glob); the rest is the general programme."""
    start = 0
    for a, b in zip(sa, sb, strict=False):
        if a == ANY or b == ANY:
            break
        if a != b and not _segments_meet(a, b):
            return False
        start += 1
    else:
        return True  # one is used up: its directory rule covers whatever follows
    memo: dict[tuple[int, int], bool] = {}

    def meet(i: int, j: int) -> bool:
        if i == len(sa) or j == len(sb):
            return True  # the used-up pattern's directory rule covers whatever follows
        found = memo.get((i, j))
        if found is None:
            if sa[i] == ANY:
                found = meet(i + 1, j) or meet(i, j + 1)
            elif sb[j] == ANY:
                found = meet(i, j + 1) or meet(i + 1, j)
            else:
                found = _segments_meet(sa[i], sb[j]) and meet(i + 1, j + 1)
            memo[(i, j)] = found
        return found

    return meet(start, start)


def covers(pattern: str, path: str) -> bool:
    """Whether a normalised ``pattern`` covers the repository-relative file ``path``."""
    sp = _key(pattern)
    sx = tuple(seg for seg in _fold(path).split("/") if seg not in ("", "."))
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        if i == len(sp):
            return True  # a parent directory matched: the rest is inside it
        if j == len(sx):
            return all(seg == ANY for seg in sp[i:])
        found = memo.get((i, j))
        if found is None:
            if sp[i] == ANY:
                found = match(i + 1, j) or match(i, j + 1)
            else:
                found = glob_match(sp[i], sx[j]) and match(i + 1, j + 1)
            memo[(i, j)] = found
        return found

    return match(0, 0)


# --- the index: reservations by leading literal segments -------------------------------------


@dataclass(frozen=True, slots=True)
class Reserved:
    """One reserved pattern of one claim."""

    task: str
    pattern: str
    exclusive: bool
    key: tuple[str, ...] = field(default=(), compare=False, repr=False)  # casefolded segments


@dataclass(slots=True)
class _Node:
    here: list[Reserved] = field(default_factory=list)  # patterns whose literal prefix ends here
    below: dict[str, _Node] = field(default_factory=dict)


def _literal_prefix(pattern: str) -> tuple[str, ...]:
    key = _key(pattern)
    for n, seg in enumerate(key):
        if _wild(seg) or seg == ANY:
            return key[:n]
    return key


class PathIndex:
    """Reserved patterns in a tree keyed by their leading literal segments (casefolded).

    A query walks only the branches its own pattern can reach: the patterns stored on its
    literal path (their wildcards start there), and below the point where its own first
    wildcard starts, the children that wildcard segment matches (every child for ``**``)."""

    __slots__ = ("_by_task", "_root")

    def __init__(self) -> None:
        self._root = _Node()
        self._by_task: dict[str, tuple[Reserved, ...]] = {}

    def put(self, task: str, exclusive: Iterable[str], shared: Iterable[str]) -> None:
        """Replace ``task``'s reservations (none: forget the task)."""
        self.drop(task)
        entries = (*(Reserved(task, p, True, _key(p)) for p in exclusive),
                   *(Reserved(task, p, False, _key(p)) for p in shared))
        if not entries:
            return
        self._by_task[task] = entries
        for entry in entries:
            node = self._root
            for seg in _literal_prefix(entry.pattern):
                node = node.below.setdefault(seg, _Node())
            node.here.append(entry)

    def drop(self, task: str) -> None:
        for entry in self._by_task.pop(task, ()):
            node = self._root
            for seg in _literal_prefix(entry.pattern):
                node = node.below[seg]
            node.here.remove(entry)  # (empty nodes stay: a task's next claim likely reuses them)

    def holds(self, task: str) -> bool:
        return task in self._by_task

    def tasks(self) -> list[str]:
        return sorted(self._by_task)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_task.values())

    def candidates(self, pattern: str) -> Iterator[Reserved]:
        """Reservations that may overlap ``pattern`` (a superset; ``overlap`` decides)."""
        return _walk(self._root, _key(pattern), 0)

    def covering(self, path: str) -> Iterator[Reserved]:
        """Reservations that cover the file ``path`` (a pattern covering it has a literal
        prefix that is a prefix of the path: only the nodes along it are read)."""
        parts = [seg for seg in _fold(path).split("/") if seg not in ("", ".")]
        node: _Node | None = self._root
        for depth in range(len(parts) + 1):
            assert node is not None
            for reserved in node.here:
                if covers(reserved.pattern, path):
                    yield reserved
            node = node.below.get(parts[depth]) if depth < len(parts) else None
            if node is None:
                return

    def conflicts(self, task: str, exclusive: Iterable[str], shared: Iterable[str]
                  ) -> Iterator[tuple[str, Reserved]]:
        """(my pattern, their reservation) pairs of other tasks that conflict: an exclusive
        pattern on either side and an overlap. Deterministic order (input, then task)."""
        pairs = [*((p, True) for p in exclusive), *((p, False) for p in shared)]
        for pattern, excl in pairs:
            key = _key(pattern)
            found = sorted({r for r in _walk(self._root, key, 0)
                            if r.task != task and (excl or r.exclusive)
                            and overlap_keys(key, r.key)},
                           key=lambda r: (r.task, r.pattern))
            for reserved in found:
                yield pattern, reserved


def _walk(node: _Node, key: tuple[str, ...], depth: int) -> Iterator[Reserved]:
    """``candidates`` continued from ``node`` with the query's segments from ``depth``."""
    if depth == len(key):
        yield from _subtree(node)
        return
    seg = key[depth]
    yield from node.here
    if seg == ANY:
        yield from _subtree_below(node)
        return
    if _wild(seg):
        for name, child in node.below.items():
            if glob_match(seg, name):
                yield from _walk(child, key, depth + 1)
        return
    found = node.below.get(seg)
    if found is not None:
        yield from _walk(found, key, depth + 1)


def _subtree(node: _Node) -> Iterator[Reserved]:
    yield from node.here
    yield from _subtree_below(node)


def _subtree_below(node: _Node) -> Iterator[Reserved]:
    stack = list(node.below.values())
    while stack:
        current = stack.pop()
        yield from current.here
        stack.extend(current.below.values())
