"""``fleetclaims run``: hold a claim for exactly as long as a command runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from types import FrameType

from ..api import Lease, Registry
from ..cli.output import EXIT_NOT_HOLDER  # the command line's exit codes: `run` is a command
from ..core.errors import FleetclaimsError

GRACE = 10.0  # seconds a command gets between SIGTERM and SIGKILL once the lease is lost


def run_command(
    reg: Registry,
    task: str,
    *,
    owner: str,
    ttl: float,
    note: str | None,
    take_stale: bool,
    cmd: list[str],
    json_out: bool = False,
) -> int:
    """Claim ``task``, run ``cmd`` with the claim in its environment, renew at a third of the
    TTL while it runs, complete on exit 0 and release otherwise; return the command's exit code.
    If the lease is lost, stop the command (it must not keep working unfenced) and return 4."""
    claim = reg.claim(task, owner=owner, ttl=ttl, note=note, take_stale=take_stale)
    lease = Lease(reg, claim)
    env = dict(os.environ)
    env.update(FLEETCLAIMS_TASK=task, FLEETCLAIMS_TOKEN=lease.token,
               FLEETCLAIMS_FENCE=str(lease.fence), FLEETCLAIMS_OWNER=owner)
    from ..store.base import LOCAL_DIRECTORY

    if LOCAL_DIRECTORY in reg.store.capabilities:
        # The command's own fleetclaims calls (the guard in git hooks, renew) must find this
        # registry even when it was chosen with --dir; a URL is left to the caller's settings.
        env["FLEETCLAIMS_DIR"] = reg.store.location
        env.pop("FLEETCLAIMS_URL", None)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        lease.release()
        sys.stderr.write(f"fleetclaims: cannot start {cmd[0]!r}: {exc.strerror or exc}; "
                         f"the claim on {task} was released.\n")
        return 127

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if lease.lost.is_set():
                return _lost(lease, proc, task, json_out)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    lease.stop()
    if lease.lost.is_set():
        return _lost(lease, proc, task, json_out)
    outcome = "completed" if code == 0 else "released"
    try:
        if code == 0:
            lease.complete({"exit_code": 0})
        else:
            lease.release()
    except FleetclaimsError as exc:
        sys.stderr.write(f"fleetclaims: LEASE LOST: {exc}\n")
        return EXIT_NOT_HOLDER
    status = code if code >= 0 else 128 - code
    if json_out:
        print(json.dumps({"task": task, "fence": lease.fence, "exit_code": status,
                          "outcome": outcome}))
    else:
        sys.stderr.write(f"fleetclaims: {cmd[0]} exited with {status}; {task} {outcome}\n")
    return status


def _lost(lease: Lease, proc: subprocess.Popen[bytes], task: str, json_out: bool) -> int:
    reason = lease.lost_reason
    bar = "!" * 72
    sys.stderr.write(
        f"\n{bar}\nfleetclaims: LEASE LOST on {task} (fence {lease.fence}): {reason}\n"
        f"fleetclaims: stopping the command; its work is no longer protected by the claim.\n"
        f"{bar}\n"
    )
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lease.stop()
    if json_out:
        print(json.dumps({"task": task, "fence": lease.fence, "exit_code": EXIT_NOT_HOLDER,
                          "outcome": "lease_lost", "reason": str(reason)}))
    return EXIT_NOT_HOLDER
