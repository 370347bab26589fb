"""Long form of the contention suite: WORKERS processes x OPS operations with SIGSTOP/SIGKILL
chaos, checked by the journal oracle; prints the figures.

    python stress/contention.py [WORKERS] [OPS] [SEEDS]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_contention_oracle import _report, oracle, run_contention


def main() -> int:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ops = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    seeds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    for seed in range(1, seeds + 1):
        with tempfile.TemporaryDirectory(prefix="fc-contention-") as tmp:
            run = run_contention(Path(tmp), workers, ops, seed=seed, max_kills=12)
            stats = oracle(run)  # raises AssertionError on any violation
            print(f"seed {seed}: {_report(run, stats, workers, ops)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
