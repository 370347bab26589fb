"""Long form of the crash-point suite: every crash point x RUNS runs (default 50).

    python stress/crash_points.py [RUNS]

Prints runs per point, crashes reached and the elapsed time; exits non-zero on any violation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    runs = sys.argv[1] if len(sys.argv) > 1 else "50"
    env = dict(os.environ, FLEETCLAIMS_LONG="1", FLEETCLAIMS_CRASH_RUNS=runs)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "test_crash_points.py")], env=env, cwd=ROOT, check=False)
    from fleetclaims.store.file.faults import CRASH_POINTS

    elapsed = time.monotonic() - started
    print(f"crash points: {len(CRASH_POINTS)} points x {runs} runs each, {elapsed:.1f}s, "
          f"{'OK' if done.returncode == 0 else 'FAILED'}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
