"""Checking a claim's paths against 1,000 live claims with 10 patterns each (#23: < 1 ms).

The state holds 1,000 active claims, each reserving 10 patterns shaped like a repository's:
directories (``src/pkg17/mod3``), globs within them (``docs/pkg17/*.md``), single files, and
on 1 % of the claims a pattern starting with a wildcard (``pkg17-*.lock``) that every check must
compare with. A new claim asks for 10 patterns. Reported, median of many runs:

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


def timed(fn: object, runs: int) -> float:
    """Median seconds of ``fn()`` over ``runs`` calls."""
    call = fn  # type: ignore[assignment]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()  # type: ignore[operator]
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

    fresh = patterns_of(args.claims + 7, args.patterns)  # a new package: disjoint
    clash = (*fresh[:-1], f"src/pkg{args.claims // 2 + 1}/mod0/x.py")  # one overlap
    expired = rules.lease_expired
    disjoint = timed(lambda: reserve.overlaps(state, "new", fresh, (), NOW, expired), args.runs)
    found = reserve.overlaps(state, "new", clash, (), NOW, expired)
    assert not reserve.overlaps(state, "new", fresh, (), NOW, expired) and found
    conflicting = timed(lambda: reserve.overlaps(state, "new", clash, (), NOW, expired),
                        args.runs)
    grant = rules.Grant(owner="me", token_hash="x", ttl=600.0,
                        paths=Reservation.of(fresh, ()))
    decide = timed(lambda: rules.decide_claim(state, "new", grant, NOW, rules.UNKNOWN),
                   args.runs)

    held = [(c.task, p) for c in state.claims.values() for p in c.paths]

    def scan() -> list[tuple[str, str]]:
        return [(t, p) for mine in fresh for t, p in held if overlap(mine, p)]

    overlap.cache_clear()
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
