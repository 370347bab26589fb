"""The liveness verdict, decided from facts the system layer gathered. Dead only on proof."""

from __future__ import annotations

from dataclasses import dataclass

from .model import DEAD, LIVE, UNKNOWN, Identity, Verdict


@dataclass(frozen=True, slots=True)
class LocalFacts:
    """Where the verdict is being decided: this machine, this boot, this PID namespace."""

    host: str
    machine: str = ""
    boot: str = ""
    pidns: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """What probing a PID on this machine found."""

    exists: bool
    zombie: bool = False
    start: int | None = None  # start ticks; None when unreadable
    denied: bool = False  # the process exists but we may not look at it
    error: str | None = None  # the probe itself failed (counts as unknown)


def decide_liveness(identity: Identity | None, local: LocalFacts, probe: Probe | None) -> Verdict:
    """Live, dead or unknown for the owner ``identity``, seen from ``local``.

    Dead requires proof on this machine and boot: the PID is gone, a zombie, or reused (other
    start ticks); or the machine booted again since the claim. Anything else that is not clearly
    alive is unknown, and unknown never counts as dead.
    """
    if identity is None:
        return Verdict(UNKNOWN, ("no process identity recorded",))
    if not identity.machine or not local.machine:
        return Verdict(UNKNOWN, ("machine id unavailable",))
    if identity.machine != local.machine:
        return Verdict(UNKNOWN, (f"claimed on another machine ({identity.host})",))
    if not identity.boot or not local.boot:
        return Verdict(UNKNOWN, ("boot id unavailable",))
    if identity.boot != local.boot:
        return Verdict(DEAD, ("machine rebooted since the claim",))
    if not identity.pidns or identity.pidns != local.pidns:
        return Verdict(UNKNOWN, ("claimed in another PID namespace",))
    if identity.pid <= 0:
        return Verdict(UNKNOWN, ("no PID recorded",))
    if probe is None:
        return Verdict(UNKNOWN, ("process not probed",))
    if probe.error is not None:
        return Verdict(UNKNOWN, (f"probe failed: {probe.error}",))
    if probe.denied:
        return Verdict(LIVE, (f"PID {identity.pid} exists (probing it was denied)",))
    if not probe.exists:
        return Verdict(DEAD, (f"PID {identity.pid} no longer exists",))
    if probe.zombie:
        return Verdict(DEAD, (f"PID {identity.pid} is a zombie",))
    if identity.start < 0 or probe.start is None:
        return Verdict(UNKNOWN, (f"PID {identity.pid} exists but its start time is unknown",))
    if probe.start != identity.start:
        return Verdict(
            DEAD,
            (f"PID {identity.pid} was reused (start ticks {probe.start} != {identity.start})",),
        )
    return Verdict(LIVE, (f"PID {identity.pid} is running",))
