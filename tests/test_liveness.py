"""The liveness verdict: every branch, with real processes where the branch is real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from fleetclaims import system
from fleetclaims.core.liveness import LocalFacts, Probe, decide_liveness
from fleetclaims.core.model import Identity
from fleetclaims.system import SystemProber, local_facts, probe

pytestmark = pytest.mark.integration

HERE = local_facts()


def me() -> Identity:
    return SystemProber().identity()


def test_this_process_is_live() -> None:
    """The current process, with its real start ticks, is live."""
    verdict = SystemProber().verdict(me())
    assert verdict.state == "live", verdict.reasons


def test_exited_child_is_dead() -> None:
    """A real child that exited and was reaped is dead: its PID no longer exists."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = SystemProber().identity_of(child.pid)
    assert ident.start > 0
    child.wait()
    verdict = SystemProber().verdict(ident)
    assert verdict.state == "dead" and "no longer exists" in verdict.reasons[0]


def test_zombie_is_dead() -> None:
    """A real zombie (exited, not yet reaped) is dead."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = SystemProber().identity_of(child.pid)
    for _ in range(200):
        if probe(child.pid).zombie:
            break
        time.sleep(0.01)
    try:
        verdict = SystemProber().verdict(ident)
        assert verdict.state == "dead" and "zombie" in verdict.reasons[0]
    finally:
        child.wait()


def test_reused_pid_is_dead() -> None:
    """A record whose start ticks differ from the running PID's is a reused PID: dead."""
    forged = replace(me(), start=me().start + 12345)
    verdict = SystemProber().verdict(forged)
    assert verdict.state == "dead" and "reused" in verdict.reasons[0]


def test_other_boot_is_dead() -> None:
    """A claim from an earlier boot of this machine: the machine rebooted, the owner is dead."""
    verdict = SystemProber().verdict(replace(me(), boot="an-earlier-boot"))
    assert verdict.state == "dead" and "rebooted" in verdict.reasons[0]


def test_foreign_machine_is_unknown() -> None:
    """Another machine's process can't be probed: unknown, never dead."""
    verdict = SystemProber().verdict(replace(me(), machine="another-machine", host="elsewhere"))
    assert verdict.state == "unknown" and "another machine" in verdict.reasons[0]


def test_other_pid_namespace_is_unknown() -> None:
    """A PID from another namespace (a container) means nothing here: unknown."""
    verdict = SystemProber().verdict(replace(me(), pidns="pid:[1]"))
    assert verdict.state == "unknown"


def test_permission_denied_is_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process we may not inspect (EPERM, e.g. /proc mounted with hidepid) exists: live."""
    real = system.read_proc  # (the one function fleetclaims.system reads /proc with)

    def denied(path: str) -> bytes:
        if path.startswith("/proc/") and path.endswith("/stat"):
            raise PermissionError(1, "Operation not permitted", path)
        return real(path)

    monkeypatch.setattr(system, "read_proc", denied)
    found = probe(os.getpid())
    assert found.exists and found.denied
    verdict = SystemProber().verdict(me())
    assert verdict.state == "live" and "denied" in verdict.reasons[0]


@pytest.mark.parametrize(
    ("ident", "probe_result", "expected"),
    [
        (None, None, "unknown"),
        (Identity("h", "", "b", "n", 10, 5), Probe(exists=False), "unknown"),
        (Identity("h", "m", "", "n", 10, 5), Probe(exists=False), "unknown"),
        (Identity("h", "m", "b", "", 10, 5), Probe(exists=False), "unknown"),
        (Identity("h", "m", "b", "n", 0, 5), Probe(exists=False), "unknown"),
        (Identity("h", "m", "b", "n", 10, 5), None, "unknown"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, error="EIO"), "unknown"),
        (Identity("h", "m", "b", "n", 10, -1), Probe(exists=True, start=5), "unknown"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, start=None), "unknown"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, denied=True), "live"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, start=5), "live"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=False), "dead"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, zombie=True, start=5), "dead"),
        (Identity("h", "m", "b", "n", 10, 5), Probe(exists=True, start=6), "dead"),
        (Identity("h", "m", "b2", "n", 10, 5), Probe(exists=True, start=5), "dead"),
        (Identity("h2", "m2", "b", "n", 10, 5), Probe(exists=False), "unknown"),
    ],
)
def test_verdict_table(ident: Identity | None, probe_result: Probe | None, expected: str) -> None:
    """The pure decision, one row per branch: dead only on proof."""
    facts = LocalFacts(host="h", machine="m", boot="b", pidns="n")
    assert decide_liveness(ident, facts, probe_result).state == expected


def test_local_facts_are_known_on_linux() -> None:
    """On Linux the machine id, boot id and PID namespace are all found."""
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux sources")
    assert HERE.machine and HERE.boot and HERE.pidns
