"""doctor on a registry that others are writing to (a cron job on a busy registry).

Its examination once ran beside the writers: a line appended over preallocated zeros while it
read looked like "data after unused (zero) space", a checkpoint landing meanwhile like a
snapshot ahead of the journal, a live writer's checkpoint in progress like a stray temp file;
it exited 5 on 49 of 49 runs of a probe, and ``--fix`` then "salvaged" the healthy journal
(a journal_break of nothing, every later line renumbered and re-sealed). Oracle: every check
of the busy registry is clean, --fix finds nothing to do, and the acknowledged fences of the
writers are all in the journal afterwards, with no journal_break, rebuild or quarantine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fc_support import whole_journal

from fleetclaims.store.file import doctor

pytestmark = pytest.mark.integration

WRITER = r"""
import json, os, sys, time
import fleetclaims
reg = fleetclaims.Registry(sys.argv[1], durability=sys.argv[3])
log = open(sys.argv[2], "a")
end = time.time() + float(sys.argv[4])
i = 0
while time.time() < end:
    c = reg.claim("%s-%d" % (sys.argv[3], i % 5), owner=sys.argv[3], ttl=60)
    log.write(json.dumps({"task": c.task, "fence": c.fence}) + "\n")
    log.flush()
    reg.release(c.task, token=c.token)
    i += 1
reg.close()
"""


def test_doctor_beside_busy_writers_finds_nothing_and_fixes_nothing(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    logs = [tmp_path / "full.log", tmp_path / "process.log"]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(reg), str(log), mode, "4"])
               for log, mode in zip(logs, ("full", "process"), strict=True)]
    try:
        time.sleep(0.5)
        checks = fixes = 0
        while any(w.poll() is None for w in writers):
            fix = checks % 4 == 3
            report = doctor.check(reg, fix=fix)
            problems = [f.to_dict() for f in report.findings if f.severity != "info"]
            assert problems == [], problems
            checks += 1
            fixes += fix
    finally:
        for w in writers:
            w.wait(timeout=60)
    assert all(w.returncode == 0 for w in writers)
    assert checks >= 4 and fixes >= 1, (checks, fixes)
    events = [json.loads(line) for line in whole_journal(reg)]
    kinds = {e["type"] for e in events}
    assert not kinds & {"journal_break", "registry_rebuilt"}, kinds
    assert not (reg / "quarantine").exists()
    granted = {(e["task"], e["fence"]) for e in events if e["type"] == "claim_created"}
    acked = {(a["task"], a["fence"]) for log in logs
             for a in map(json.loads, log.read_text().splitlines())}
    assert acked and acked <= granted


def test_a_directory_the_user_made_is_advice_not_damage(tmp_path: Path) -> None:
    """A registry made in an existing directory keeps its mode (755 under umask 022): doctor
    said so as a warning and exited 5, the code of a damaged registry. Reported as advice,
    exit 0; --fix still makes it private."""
    import os
    import stat

    from fleetclaims import Registry

    d = tmp_path / "mine"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    Registry(d).claim("t", owner="a")
    report = doctor.check(d)
    assert report.exit_code == 0 and "permissions" in report.kinds()
    doctor.check(d, fix=True)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
