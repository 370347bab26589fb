"""Path patterns (core/paths.py): normalisation, the overlap decision as a table, coverage of
files, hostile patterns, and the index against a scan of every pair."""

from __future__ import annotations

import random
import time

import pytest

from fleetclaims.core.errors import ValidationError
from fleetclaims.core.paths import (
    MAX_PATTERNS,
    PathIndex,
    covers,
    normalise,
    normalise_all,
    overlap,
)

pytestmark = pytest.mark.unit

NORMAL = [
    ("src/parser/**", "src/parser"),
    ("src/parser/", "src/parser"),
    ("./src//parser/./", "src/parser"),
    ("src/**/**/x.py", "src/**/x.py"),
    ("**", "**"),
    ("**/", "**"),
    ("*.py", "*.py"),
    ("Src/A.py", "Src/A.py"),  # kept as written; compared casefolded
]


@pytest.mark.parametrize(("given", "normal"), NORMAL)
def test_normalise(given: str, normal: str) -> None:
    """Repeated slashes, ``.`` segments, trailing ``/`` and ``/**`` and repeated ``**`` go."""
    assert normalise(given) == normal


# (a, b, overlap?, why)
OVERLAP = [
    ("src/parser", "src/parser/lexer.py", True, "a directory overlaps everything under it"),
    ("src/parser/", "src/parser/lexer.py", True, "trailing slash: the same directory"),
    ("src/parser/**", "src/parser", True, "dir/** is the directory"),
    ("src/parser", "src/parse", False, "a prefix of a name is not a parent directory"),
    ("src/parser", "src/parser2/x.py", False, "segments, not characters"),
    ("src/a.py", "src/a.py/x", True, "a literal may be a directory (no file-system reads)"),
    ("src/*.py", "src/a.py", True, "* within a segment"),
    ("src/*.py", "src/a/b.py", False, "* does not cross /"),
    ("src/**/*.py", "src/a/b.py", True, "** crosses /"),
    ("src/**/*.py", "src/b.py", True, "** matches zero segments"),
    ("src/*.py", "src/*.txt", False, "different suffixes never meet"),
    ("src/a*", "src/*b", True, "a...b matches both"),
    ("src/a*c", "src/*b", False, "ends in c and in b"),
    ("src/?.py", "src/ab.py", False, "? is one character"),
    ("src/?.py", "src/*.py", True, "x.py"),
    ("*.py", "src/a.py", False, "patterns are anchored at the root"),
    ("**/*.py", "src/a.py", True, "**/ reaches every directory"),
    ("**", "anything/at/all", True, "** covers the repository"),
    ("docs/*.md", "src/**", False, "different top directories"),
    ("Src/A.py", "src/a.py", True, "case: compared casefolded"),
    ("SRC/**", "src/x", True, "case of a directory"),
    ("a/*/c", "a/b/*", True, "a/b/c"),
    ("a/*/c", "*/b/d", False, "third segment c vs d"),
    ("a/**/z", "a/b/**/y", True, "a/b/y/z: both directory rules reach"),
    ("a/*", "a", True, "a covers a/x"),
]


@pytest.mark.parametrize(("a", "b", "expected", "why"), OVERLAP,
                         ids=[f"{a} ~ {b}" for a, b, *_ in OVERLAP])
def test_overlap_table(a: str, b: str, expected: bool, why: str) -> None:
    """Each row's overlap decision, the same both ways round."""
    na, nb = normalise(a), normalise(b)
    assert overlap(na, nb) is expected, why
    assert overlap(nb, na) is expected, why


def test_two_characters_can_hold_a_then_b() -> None:
    """``??`` meets ``*a*b*`` at ``ab``, and not ``*a*b*c`` (three characters at least)."""
    assert overlap("??", "*a*b*")
    assert not overlap("??", "*a*b*c")


COVERS = [
    ("src/parser", "src/parser/lexer.py", True),
    ("src/parser", "src/parser", True),
    ("src/parser", "src/parsers.py", False),
    ("src/*.py", "src/a.py", True),
    ("src/*.py", "src/sub/a.py", False),
    ("**/*.py", "a/b/c.py", True),
    ("**/test_*.py", "tests/test_x.py", True),
    ("**/test_*.py", "tests/x.py", False),
    ("Docs", "docs/readme.md", True),
    ("*", "README", True),
]


@pytest.mark.parametrize(("pattern", "path", "expected"), COVERS)
def test_covers(pattern: str, path: str, expected: bool) -> None:
    """Whether a pattern covers a file, with the directory rule."""
    assert covers(normalise(pattern), path) is expected


HOSTILE = [
    ("../x", "'..'"),
    ("src/../../etc", "'..'"),
    ("/etc/passwd", "absolute"),
    ("a\x00b", "NUL"),
    ("a\nb", "control"),
    ("a\x85b", "control"),  # (C1, and the separators that end a line)
    ("a\u2028b", "control"),
    ("a\\b", "backslash"),
    ("src/[ab].py", "character class"),
    ("!src", "negated"),
    ("src/a**b", "whole segment"),
    ("", "name something"),
    ("./", "name something"),
    ("x" * 600, "at most"),
    ("/".join(["d"] * 70), "segments"),
    ("*a" * 20, "wildcards"),
]


@pytest.mark.parametrize(("pattern", "says"), HOSTILE)
def test_hostile_patterns_are_refused_with_a_typed_error(pattern: str, says: str) -> None:
    """Each hostile pattern raises ValidationError (field ``paths``) saying what is wrong."""
    with pytest.raises(ValidationError) as caught:
        normalise(pattern)
    assert caught.value.field == "paths"
    assert says in caught.value.reason


def test_too_many_patterns_and_a_lone_string_are_refused() -> None:
    """10,000 patterns, or one string where a list belongs, are refused at once."""
    start = time.perf_counter()
    with pytest.raises(ValidationError, match="at most"):
        normalise_all(f"p{i}" for i in range(10_000))
    assert time.perf_counter() - start < 0.5
    with pytest.raises(ValidationError, match="list"):
        normalise_all("src/**")
    assert len(normalise_all([f"p{i}" for i in range(MAX_PATTERNS)])) == MAX_PATTERNS


def test_pathological_globs_are_decided_in_bounded_time() -> None:
    """The longest allowed many-star segments against each other: milliseconds, not minutes
    (no regular expressions, no backtracking explosion)."""
    worst = normalise("*a" * 8 + "?" * 7 + "b" * 200)
    other = normalise("*a" * 8 + "c" * 200)
    start = time.perf_counter()
    assert not overlap(worst, other)
    assert not covers(worst, "a" * 254 + "c")
    assert time.perf_counter() - start < 1.0


def _product_meet(a: str, b: str) -> bool:
    """The definition: reachability in the product of the two segment globs' automata."""
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        i, j = todo.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        ca = a[i] if i < len(a) else ""
        cb = b[j] if j < len(b) else ""
        if ca == "*":
            todo.append((i + 1, j))
        if cb == "*":
            todo.append((i, j + 1))
        if ca and cb and (ca in "*?" or cb in "*?" or ca == cb):
            todo.append((i if ca == "*" else i + 1, j if cb == "*" else j + 1))
    return False


def test_segment_meeting_agrees_with_the_product_automaton() -> None:
    """The linear decisions (both with a star: prefixes and suffixes; one star-free: bit masks)
    agree with the product automaton on every pair of short globs over a small alphabet."""
    from fleetclaims.core.paths import _segments_meet

    rng = random.Random(5)
    for _ in range(40_000):
        a, b = ("".join(rng.choice("ab*?") for _ in range(rng.randint(1, 7)))
                for _ in range(2))
        assert _segments_meet(a, b) == _product_meet(a, b), (a, b)


def test_many_long_many_star_patterns_against_one_claim_stay_fast() -> None:
    """256 reserved patterns of long three-star segments against a new one (a probe's case
    held the registry lock 22 s, about 85 ms a pair): all pairs within a second together."""
    held = [normalise("*" + "a" * 120 + "*" + "a" * (118 - i % 100) + f"*b{i}")
            for i in range(MAX_PATTERNS)]
    asked = normalise("*" + "a" * 120 + "*" + "a" * 118 + "*c")
    start = time.perf_counter()
    assert not any(overlap(asked, p) for p in held)
    assert time.perf_counter() - start < 1.0


def _random_pattern(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        parts.append(rng.choice(["a", "b", "ab", "*", "a*", "*b", "?", "**", "c.py", "*.py"]))
    try:
        return normalise("/".join(parts))
    except ValidationError:
        return "a"


def _paths(rng: random.Random) -> list[str]:
    alphabet = ["a", "b", "ab", "ba", "c.py", "a.py", "x"]
    return ["/".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(400)]


@pytest.mark.slow
def test_overlap_agrees_with_a_witness_search() -> None:
    """Whenever a sampled path is covered by both patterns, overlap says yes (no missed
    overlap); random pairs over a small alphabet."""
    rng = random.Random(23)
    paths = _paths(rng)
    for _ in range(400):
        a, b = _random_pattern(rng), _random_pattern(rng)
        if any(covers(a, p) and covers(b, p) for p in paths):
            assert overlap(a, b), (a, b)


def test_index_finds_exactly_what_a_scan_of_every_pair_finds() -> None:
    """The index's conflicts equal those of comparing every pattern with every reservation."""
    rng = random.Random(7)
    index = PathIndex()
    held: dict[str, tuple[list[str], list[str]]] = {}
    for n in range(60):
        excl = [_random_pattern(rng) for _ in range(rng.randint(0, 3))]
        shared = [_random_pattern(rng) for _ in range(rng.randint(0, 2))]
        held[f"t{n}"] = (excl, shared)
        index.put(f"t{n}", excl, shared)
    for task in ("t3", "t10"):  # a dropped claim's reservations are gone
        index.drop(task)
        del held[task]
    for _ in range(200):
        mine = [_random_pattern(rng)]
        shared = [_random_pattern(rng)]
        got = {(m, r.task, r.pattern) for m, r in index.conflicts("me", mine, shared)}
        want = set()
        for task, (excl, sh) in held.items():
            for m, m_excl in ((mine[0], True), (shared[0], False)):
                for theirs, t_excl in [*((p, True) for p in excl), *((p, False) for p in sh)]:
                    if (m_excl or t_excl) and overlap(m, theirs):
                        want.add((m, task, theirs))
        assert got == want


def test_a_name_in_nfc_and_in_nfd_is_one_name() -> None:
    """`café` with a precomposed é and with e + combining accent are one name on macOS: the
    reservations overlap and one covers the other (they never did)."""
    nfc, nfd = normalise("docs/caf\u00e9"), normalise("docs/cafe\u0301")
    assert overlap(nfc, nfd)
    assert covers(nfc, "docs/cafe\u0301/notes.md") and covers(nfd, "docs/caf\u00e9")


@pytest.mark.parametrize("pattern", ["\u202e", "src/\u202egnp.exe", "docs/\u2066x", "src/\udc80x"])
def test_bidi_overrides_and_lone_surrogates_are_refused_naming_paths(pattern: str) -> None:
    """A pattern of bidi overrides was accepted and the guard printed it raw; a lone surrogate
    failed later as "invalid event: cannot be stored as JSON" without naming paths."""
    with pytest.raises(ValidationError) as info:
        normalise(pattern)
    assert info.value.field == "paths"
