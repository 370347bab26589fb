"""Checking a claim's paths against 1,000 live claims with 10 patterns each (#23: < 1 ms).

The state holds 1,000 active claims, each reserving 10 patterns shaped like a repository's:
directories (``src/pkg17/mod3``), globs within them (``docs/pkg17/*.md``), single files, and
on 1 % of the claims a pattern starting with a wildcard (``pkg17-*.lock``) that every check must
compare with. A new claim asks for 10 patterns. Reported, median of many runs:

Every run asks for patterns never asked before (the exact decisions are cached by pattern
pair, so repeating one claim would measure the cache).

- ``check``: ``core.reserve.overlaps`` (the index walk plus the exact decisions), the cost
  ``decide_claim`` adds to a claim with paths, for a disjoint claim and for a conflicting one;
- ``decide_claim``: the whole decision of a claim with 10 patterns;
- ``scan``: the same answer by comparing every pattern with every reservation (what the index
  saves), and the one-time index build.

    .venv/bin/python bench/paths_bench.py [--claims 1000] [--patterns 10] [--runs 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetclaims.core import reserve, rules
from fleetclaims.core.model import Claim, Now
from fleetclaims.core.paths import normalise, overlap
from fleetclaims.core.reserve import Reservation
from fleetclaims.core.state import State

NOW = Now(wall=1000.0)
TOPS = ("src", "tests", "docs", "lib", "tools", "web", "api", "cli", "scripts", "config")


def patterns_of(n: int, count: int) -> tuple[str, ...]:
    """``count`` patterns of claim ``n``: its own package across the top directories."""
    shapes = [f"src/pkg{n}/mod{{k}}", f"tests/pkg{n}/test_{{k}}.py", f"docs/pkg{n}/*.md",
              f"lib/pkg{n}/**/*.py", f"web/pkg{n}/page{{k}}.ts"]
    out = [shapes[k % len(shapes)].format(k=k) for k in range(count)]
    if n % 100 == 0:
        out[-1] = f"pkg{n}-*.lock"
    return tuple(normalise(p) for p in out)


def build(claims: int, count: int) -> State:
    state = State(fence=claims)
    for n in range(claims):
        state.claims[f"t{n}"] = Claim(f"t{n}", f"agent-{n % 50}", n + 1, token_hash=f"h{n}",
                                      expires_at=5000.0, paths=patterns_of(n, count))
    return state


def timed(fn: Callable[[int], object], runs: int) -> float:
    """Median seconds of ``fn(i)`` over ``runs`` calls, each on patterns never seen before
    (nothing answered from a cache)."""
    samples = []
    for i in range(runs):
        start = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=1000)
    ap.add_argument("--patterns", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    state = build(args.claims, args.patterns)
    start = time.perf_counter()
    reserve.index(state)
    built = time.perf_counter() - start

    def fresh(i: int) -> tuple[str, ...]:  # a new package: disjoint from every claim
        return patterns_of(args.claims + 7 + i, args.patterns)

    def clash(i: int) -> tuple[str, ...]:  # the same with one overlapping pattern
        return (*fresh(i)[:-1], f"src/pkg{(i * 7 + 1) % args.claims}/mod0/x{i}.py")

    expired = rules.lease_expired
    # (patterns made and normalised beforehand: the API normalises them before deciding)
    mine = [fresh(i) for i in range(args.runs)]
    clashing = [clash(i) for i in range(args.runs)]
    decided = [fresh(args.runs + i) for i in range(args.runs)]
    assert not reserve.overlaps(state, "new", mine[0], (), NOW, expired)
    assert reserve.overlaps(state, "new", clashing[0], (), NOW, expired)
    disjoint = timed(lambda i: reserve.overlaps(state, "new", mine[i], (), NOW, expired),
                     args.runs)
    conflicting = timed(lambda i: reserve.overlaps(state, "new", clashing[i], (), NOW,
                                                   expired), args.runs)
    decide = timed(lambda i: rules.decide_claim(state, "new", rules.Grant(
        owner="me", token_hash="x", ttl=600.0, paths=Reservation.of(decided[i], ())), NOW,
        rules.UNKNOWN), args.runs)

    held = [(c.task, p) for c in state.claims.values() for p in c.paths]

    def scan(i: int) -> list[tuple[str, str]]:
        return [(t, p) for mine in fresh(i) for t, p in held if overlap(mine, p)]

    scanned = timed(scan, max(3, args.runs // 200))
    limit = 1e-3
    print(f"{args.claims} live claims x {args.patterns} patterns, a claim of "
          f"{args.patterns} patterns (median of {args.runs}):")
    print(f"  check, disjoint:     {disjoint * 1e6:8.1f} us")
    print(f"  check, conflicting:  {conflicting * 1e6:8.1f} us")
    print(f"  decide_claim:        {decide * 1e6:8.1f} us")
    print(f"  scan of every pair:  {scanned * 1e6:8.1f} us (what the index saves)")
    print(f"  index build (once):  {built * 1e3:8.1f} ms")
    ok = max(disjoint, conflicting, decide) < limit
    print("under 1 ms: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
