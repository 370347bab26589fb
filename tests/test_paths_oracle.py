"""Path reservations under contention: processes claim tasks with overlapping and disjoint
paths on one file registry; two oracles find no moment with overlapping holders.

- Live oracle: while it holds a claim, a worker marks each sample file its exclusive patterns
  cover with an O_EXCL file (a second exclusive holder fails to create it) and each file its
  shared patterns cover with a file of its own; after marking it checks the other kind is
  absent. Marks are made after the grant and removed before the release, so two holders whose
  reservations overlap in time always meet on some mark.
- Journal oracle: the audit log replayed with a plain scan of every pair of live claims: no
  grant or paths_reserved ever overlaps another live claim's exclusive reservation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclaims.core.paths import covers, normalise, overlap

pytestmark = pytest.mark.slow

WORKERS = 6
ROUNDS = 120
EXCLUSIVE = ["src", "src/a", "src/a/x.py", "src/b/**", "src/*.py", "docs/*.md", "tests",
             "**/*.lock", "lib/c"]
SHARED = ["docs", "src/a/x.py", "README.md", "lib/**"]
SAMPLES = ["src/a/x.py", "src/a/y.py", "src/b/z.py", "src/m.py", "docs/g.md", "docs/s/h.md",
           "tests/t.py", "x.lock", "src/a/k.lock", "README.md", "lib/c/d.py", "lib/e.py"]

WORKER = r"""
import os, random, sys, time
from pathlib import Path
from fleetclaims import Registry
from fleetclaims.core.errors import ClaimConflict
from fleetclaims.core.paths import covers, normalise

registry, marks, seed, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
EXCLUSIVE, SHARED, SAMPLES = {exclusive!r}, {shared!r}, {samples!r}
rng = random.Random(seed)
me = f"w{{seed}}"
granted = refused = 0
with Registry(registry) as reg:
    for n in range(rounds):
        excl = rng.sample(EXCLUSIVE, rng.randint(0, 2))
        shared = rng.sample(SHARED, rng.randint(0, 1))
        if not excl and not shared:
            excl = [rng.choice(EXCLUSIVE)]
        try:
            claim = reg.claim(f"{{me}}-{{n}}", owner=me, ttl=120, process=False,
                              paths=excl, shared_paths=shared)
        except ClaimConflict:
            refused += 1
            continue
        granted += 1
        made = []
        for i, sample in enumerate(SAMPLES):
            if any(covers(normalise(p), sample) for p in claim.paths):
                fd = os.open(marks / f"x{{i}}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # raises
                os.close(fd)
                made.append(marks / f"x{{i}}")
                if any(marks.glob(f"s{{i}}-*")):
                    raise SystemExit(f"VIOLATION: {{sample}} shared while {{me}} holds it")
            elif any(covers(normalise(p), sample) for p in claim.shared_paths):
                mark = marks / f"s{{i}}-{{me}}"
                mark.touch()
                made.append(mark)
                if (marks / f"x{{i}}").exists():
                    raise SystemExit(f"VIOLATION: {{sample}} exclusive while {{me}} shares it")
        time.sleep(rng.random() / 500)
        for mark in made:
            mark.unlink()
        reg.release(claim.task, token=claim.token)
print(granted, refused)
"""


def _journal(directory: Path) -> list[dict[str, object]]:
    lines = (directory / "audit.jsonl").read_bytes().split(b"\0", 1)[0].splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def journal_violations(events: list[dict[str, object]]) -> list[str]:
    """Grants and reservations overlapping another live claim's exclusive reservation, found
    by comparing every pair (no index)."""
    live: dict[str, tuple[list[str], list[str]]] = {}
    found = []
    for event in events:
        kind, task = event.get("type"), str(event.get("task"))
        if kind in ("claim_created", "claim_recovered", "claim_preempted", "claim_handed_off",
                    "paths_reserved", "paths_released"):
            excl = [str(p) for p in event.get("paths") or []]  # type: ignore[attr-defined]
            shared = [str(p) for p in event.get("shared_paths") or []]  # type: ignore[attr-defined]
            for other, (o_excl, o_shared) in live.items():
                if other == task:
                    continue
                pairs = [(m, t) for m in excl for t in (*o_excl, *o_shared)]
                pairs += [(m, t) for m in shared for t in o_excl]
                found += [f"seq {event['seq']}: {task} {m} ~ {other} {t}"
                          for m, t in pairs if overlap(m, t)]
            live[task] = (excl, shared)
        elif kind in ("claim_released", "claim_released_forced", "claim_completed",
                      "lease_expired"):
            live.pop(task, None)
    return found


def test_no_two_overlapping_exclusive_holders(tmp_path: Path) -> None:
    """6 processes x 120 claims with random overlapping and disjoint paths: some granted, some
    refused, and neither oracle sees overlapping holders."""
    registry, marks = tmp_path / "reg", tmp_path / "marks"
    marks.mkdir()
    source = WORKER.format(exclusive=EXCLUSIVE, shared=SHARED, samples=SAMPLES)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", source, str(registry), str(marks),
                               str(seed), str(ROUNDS)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for seed in range(WORKERS)]
    granted = refused = 0
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        g, r = map(int, out.split())
        granted, refused = granted + g, refused + r
    assert granted > WORKERS * 10 and refused > WORKERS * 5, (granted, refused)
    events = _journal(registry)
    assert sum(e["type"] == "claim_created" for e in events) == granted
    assert journal_violations(events) == []
    assert not any(marks.iterdir())


def test_the_journal_oracle_sees_a_forged_overlap() -> None:
    """The journal oracle is not vacuous: two live grants of overlapping paths are caught."""
    forged = [{"seq": 1, "type": "claim_created", "task": "a", "paths": [normalise("src/**")]},
              {"seq": 2, "type": "claim_created", "task": "b", "shared_paths": ["src/x.py"]}]
    assert journal_violations(forged) == ["seq 2: b src/x.py ~ a src"]
    assert covers("src", "src/x.py")
