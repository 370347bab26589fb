"""``fleetclaims run``: hold a claim for exactly as long as a command runs.

The command starts in a session (and process group) of its own, so what it starts (``sh -c``
-> ``make`` -> the compiler) can be stopped with it: on lease loss, on Ctrl-C or SIGTERM to
``run``, on ``--timeout``, and when the command itself exits, every process still in its group
gets SIGTERM, and SIGKILL ``grace`` seconds later (default ``GRACE``) if any is left. No
descendant keeps working once the claim has ended (a process that leaves the group on purpose,
with ``setsid``, has left the run's care too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

from ..api import Lease, Registry
from ..cli.agents import GRACE  # seconds the group gets between SIGTERM and SIGKILL
from ..cli.output import EXIT_CONFLICT, EXIT_NOT_HOLDER  # `run` is a command: its exit codes
from ..core.errors import FleetclaimsError

EXIT_TIMEOUT = 124  # as timeout(1): the command ran past --timeout


@dataclass(frozen=True)
class RunOptions:
    """How to claim and how to run: what ``fleetclaims run`` was given."""

    owner: str
    ttl: float
    note: str | None = None
    take_stale: bool = False
    json_out: bool = False
    grace: float = GRACE
    timeout: float | None = None
    labels: tuple[str, ...] = ()
    wait: float | None = None
    paths: tuple[str, ...] = ()  # reserved with the claim (exclusive, then shared)
    shared_paths: tuple[str, ...] = ()


def run_next(reg: Registry, cmd: list[str], opts: RunOptions) -> int:
    """Claim the best ready task of the queue (waiting ``opts.wait`` for one) and run ``cmd``
    on it as ``run_command`` does; exit 3 when nothing was ready."""
    claim = reg.claim_next(owner=opts.owner, labels=opts.labels, ttl=opts.ttl, note=opts.note,
                           take_stale=opts.take_stale, wait=opts.wait, paths=opts.paths,
                           shared_paths=opts.shared_paths)
    if claim is None:
        counts = reg.stats().queue
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "queue empty"
        message = (f"nothing ready to run ({summary}); nothing was started. Use --wait "
                   "DURATION to wait for a task.")
        if opts.json_out:
            print(json.dumps({"task": None, "error": "nothing_ready", "message": message,
                              "queue": counts}))
        sys.stderr.write(f"fleetclaims: {message}\n")
        return EXIT_CONFLICT
    return _run_claimed(reg, Lease(reg, claim), cmd, opts)


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
    grace: float = GRACE,
    timeout: float | None = None,
    paths: tuple[str, ...] = (),
    shared_paths: tuple[str, ...] = (),
) -> int:
    """Claim ``task``, run ``cmd`` with the claim in its environment, renew at a third of the
    TTL while it runs, complete on exit 0 and release otherwise; return the command's exit code.
    If the lease is lost, stop the command's whole group (it must not keep working unfenced)
    and return 4; past ``timeout`` seconds stop it likewise and return 124."""
    opts = RunOptions(owner=owner, ttl=ttl, note=note, take_stale=take_stale,
                      json_out=json_out, grace=grace, timeout=timeout)
    claim = reg.claim(task, owner=owner, ttl=ttl, note=note, take_stale=take_stale,
                      paths=paths, shared_paths=shared_paths)
    return _run_claimed(reg, Lease(reg, claim), cmd, opts)


def _environment(reg: Registry, lease: Lease, owner: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FLEETCLAIMS_TASK=lease.task, FLEETCLAIMS_TOKEN=lease.token,
               FLEETCLAIMS_FENCE=str(lease.fence), FLEETCLAIMS_OWNER=owner)
    from ..store.base import LOCAL_DIRECTORY

    if LOCAL_DIRECTORY in reg.store.capabilities:
        # The command's own fleetclaims calls (the guard in git hooks, renew) must find this
        # registry even when it was chosen with --dir; a URL is left to the caller's settings.
        env["FLEETCLAIMS_DIR"] = reg.store.location
        env.pop("FLEETCLAIMS_URL", None)
    return env


class _Group:
    """The command's process group: signalled as a whole, stopped TERM-then-KILL."""

    def __init__(self, proc: subprocess.Popen[bytes], grace: float) -> None:
        self.proc = proc
        self.grace = grace
        self.kill_at: float | None = None  # set once the group was told to stop

    def signal(self, signum: int) -> None:
        # Gone already (PermissionError: what macOS says of a group whose leader is a zombie).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def alive(self) -> bool:
        """Whether any process of the group is left (the leader reaped first)."""
        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def terminate(self) -> None:
        """SIGTERM the group now; SIGKILL it at ``grace`` seconds (see ``tick``)."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace
        self.signal(signal.SIGTERM)

    def tick(self) -> None:
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.signal(signal.SIGKILL)

    def stop(self) -> None:
        """Stop whatever is left of the group: TERM, then KILL after the grace period."""
        if not self.alive():
            return
        self.terminate()
        while self.alive():
            self.tick()
            time.sleep(0.02)


def _run_claimed(reg: Registry, lease: Lease, cmd: list[str], opts: RunOptions) -> int:
    task = lease.task
    try:
        proc = subprocess.Popen(cmd, env=_environment(reg, lease, opts.owner),
                                start_new_session=True)
    except OSError as exc:
        lease.release()
        why = f"cannot start {cmd[0]!r}: {exc.strerror or exc}; the claim on {task} was released"
        sys.stderr.write(f"fleetclaims: {why}.\n")
        if opts.json_out:  # (as every other outcome of run: one document on stdout)
            print(json.dumps({"task": task, "fence": lease.fence, "exit_code": 127,
                              "outcome": "not_started", "error": "not_started",
                              "message": why}))
        return 127
    group = _Group(proc, opts.grace)

    def forward(signum: int, frame: FrameType | None) -> None:
        # The command is in a session of its own, so the terminal's Ctrl-C reaches only us:
        # pass it on to the whole group; a second one (or the grace period) escalates.
        if group.kill_at is None:
            group.kill_at = time.monotonic() + opts.grace
            group.signal(signum)
        else:
            group.signal(signal.SIGTERM)

    def suspend(signum: int, frame: FrameType | None) -> None:
        # Ctrl-Z stops the terminal's foreground group, which is us, not the command's own
        # session: stop its group first, then ourselves. On SIGCONT the group goes on only if
        # the claim is still ours (a pause past the TTL may have let another owner take it).
        group.signal(signal.SIGSTOP)
        # SIGSTOP, not SIGTSTP's default action: that one is discarded in an orphaned
        # process group (run started from a script or a service), where run would go on
        # and resume the group at once.
        os.kill(os.getpid(), signal.SIGSTOP)  # (stopped here until SIGCONT)
        with contextlib.suppress(FleetclaimsError):
            lease.check()
        if lease.lost.is_set():
            group.terminate()  # (delivered as it continues: it does no more work as before)
        group.signal(signal.SIGCONT)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    if hasattr(signal, "SIGTSTP"):
        previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, suspend)
    deadline = None if opts.timeout is None else time.monotonic() + opts.timeout
    timed_out = False
    try:
        while True:
            try:
                code = proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            group.tick()
            if lease.lost.is_set():
                return _lost(lease, group, task, opts.json_out)
            if deadline is not None and time.monotonic() >= deadline and not timed_out:
                timed_out = True
                sys.stderr.write(f"fleetclaims: {cmd[0]} ran past --timeout; stopping it "
                                 f"(SIGTERM, SIGKILL after {opts.grace:g}s)\n")
                group.terminate()
        group.stop()  # what the command left running in its group ends with the claim
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    lease.stop()
    if lease.lost.is_set():
        return _lost(lease, group, task, opts.json_out)
    return _finish(lease, cmd, code, timed_out, opts.json_out)


def _finish(lease: Lease, cmd: list[str], code: int, timed_out: bool, json_out: bool) -> int:
    task = lease.task
    done = code == 0 and not timed_out
    outcome = "completed" if done else "released"
    try:
        if done:
            lease.complete({"exit_code": 0})
        else:
            lease.release()
    except FleetclaimsError as exc:
        sys.stderr.write(f"fleetclaims: LEASE LOST: {exc}\n")
        return EXIT_NOT_HOLDER
    status = EXIT_TIMEOUT if timed_out else code if code >= 0 else 128 - code
    if json_out:
        print(json.dumps({"task": task, "fence": lease.fence, "exit_code": status,
                          "outcome": outcome, "timed_out": timed_out}))
    else:
        sys.stderr.write(f"fleetclaims: {cmd[0]} exited with {status}; {task} {outcome}\n")
    return status


def _lost(lease: Lease, group: _Group, task: str, json_out: bool) -> int:
    reason = lease.lost_reason
    bar = "!" * 72
    sys.stderr.write(
        f"\n{bar}\nfleetclaims: LEASE LOST on {task} (fence {lease.fence}): {reason}\n"
        f"fleetclaims: stopping the command and everything it started; its work is no longer "
        f"protected by the claim.\n{bar}\n"
    )
    group.stop()
    lease.stop()
    if json_out:
        print(json.dumps({"task": task, "fence": lease.fence, "exit_code": EXIT_NOT_HOLDER,
                          "outcome": "lease_lost", "reason": str(reason)}))
    return EXIT_NOT_HOLDER
