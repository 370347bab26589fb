"""Regenerate .cache-example/: a small registry that shows the on-disk format.

    python scripts/make_cache_example.py [TARGET_DIR]

It holds claims, a renewal, a conflict, an expiry and recovery, a completion, a hand-off and a
quarantined damaged snapshot. Times come from a fake clock so the content reads naturally.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from fleetclaims import ClaimConflict, Registry
from fleetclaims.testing import FakeClock, FakeProber


def build(target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    clock = FakeClock(wall=1_796_000_000.0)
    prober = FakeProber(host="laptop")
    reg = Registry(target, clock=clock, prober=prober)
    a = reg.claim("issue-101", owner="agent-a", ttl=600, note="fix the tokenizer",
                  token="example-token-agent-a-101")
    clock.advance(120)
    reg.renew("issue-101", token=a.token or "")
    with contextlib.suppress(ClaimConflict):  # recorded as claim_rejected
        reg.claim("issue-101", owner="agent-b", note="me too")
    prober.as_pid(5151)
    b = reg.claim("issue-102", owner="agent-b", ttl=300, token="example-token-agent-b-102")
    clock.advance(400)  # agent-b's lease on issue-102 runs out
    reg.sweep()
    c = reg.recover("issue-102", owner="agent-c", reason="agent-b stopped heartbeating")
    reg.complete("issue-101", token=a.token or "", result={"pr": 17})
    reg.handoff("issue-102", token=c.token or "", to_owner="agent-d", note="needs a reviewer")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()
    # Damage the snapshot; the next writer quarantines it and rebuilds from the journal.
    snapshot = target / "claims.json"
    snapshot.write_bytes(snapshot.read_bytes()[:200])
    reg = Registry(target, clock=clock, prober=prober)
    reg.claim("issue-103", owner="agent-a", ttl=900, token="example-token-agent-a-103")
    reg.store.checkpoint()  # type: ignore[attr-defined]
    reg.close()
    assert b.fence == 2


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache-example"))
