"""The example registry in .cache-example/ is reproducible and verifies."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from fleetclaims import Registry
from fleetclaims.cli import main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_regenerated_example_verifies(tmp_path: Path) -> None:
    """The generator makes every kind of event the README promises, and it verifies."""
    build = runpy.run_path(str(ROOT / "scripts" / "make_cache_example.py"))["build"]
    target = tmp_path / "example"
    build(target)
    reg = Registry(target)
    assert reg.verify().ok and reg.verify().anchor_ok
    kinds = {e.type for e in reg.events(limit=1000).events}
    assert {"claim_created", "lease_renewed", "claim_rejected", "lease_expired",
            "claim_recovered", "claim_completed", "claim_handed_off",
            "registry_rebuilt"} <= kinds
    notes = list((target / "quarantine").glob("*.note.json"))
    assert len(notes) == 1 and "snapshot" in json.loads(notes[0].read_text())["reason"]


def test_committed_example_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed example is a valid registry (audit verify exits 0)."""
    assert main(["audit", "verify", "--dir", str(ROOT / ".cache-example"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_anchored"] is True


def test_audit_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """audit report --html writes one self-contained HTML file with a bar per holding."""
    build = runpy.run_path(str(ROOT / "scripts" / "make_cache_example.py"))["build"]
    build(tmp_path / "ex")
    out = tmp_path / "t.html"
    assert main(["audit", "report", "--html", str(out), "--dir", str(tmp_path / "ex")]) == 0
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html") or html.lower().startswith("<!doctype html")
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert html.count('data-task="issue-102"') >= 3  # agent-b, agent-c, agent-d holdings
