"""The audit report: bars and markers computed from real journals, escaping, exports, and the
page as headless Chromium renders it."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from fleetclaims import Registry
from fleetclaims.core.model import Claim, Now
from fleetclaims.core.rules import DEFAULT_MAX_PARK
from fleetclaims.errors import ClaimConflict
from fleetclaims.review import report

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
EVIL = 'dead <script>alert("x")</script> & \'quoted\' "owner"'
GRANTS = {"claim_created", "claim_recovered", "claim_preempted", "claim_handed_off"}


class FakeClock:
    def __init__(self) -> None:
        self.t = T0

    def now(self) -> Now:
        return Now(wall=self.t, boot=None, boot_id="")


def tok(claim: Claim) -> str:
    assert claim.token is not None
    return claim.token


def build(path: Path) -> tuple[list[dict[str, Any]], float]:
    """A journal with every kind of marker, made through the real library. Returns the events
    and a generated_at after the last one."""
    c = FakeClock()
    r = Registry(path, clock=c, durability="process")
    a = r.claim("build/x", owner="agent-a", ttl=60, note=EVIL)
    c.t += 10
    with pytest.raises(ClaimConflict):
        r.claim("build/x", owner="agent-b", ttl=60)
    r.renew("build/x", token=tok(a))
    c.t += 100  # past the renewed deadline (T0 + 70)
    r.sweep()
    b = r.recover("build/x", owner="agent-b", reason=EVIL)
    c.t += 5
    h = r.handoff("build/x", token=tok(b), to_owner="agent-c")
    c.t += 5
    r.transition("build/x", token=tok(h), phase="review", ttl=None)
    r.complete("build/x", token=tok(h), result={"ok": True})
    r.claim("docs", owner="agent-a", ttl=30)
    c.t += 3
    r.claim("docs", owner="agent-d", ttl=30, priority=1, preempt=True)
    r.release("docs", force=True, reason="ops <b>stop</b>", actor="admin")
    r.claim("lint", owner="agent-a", ttl=30)
    c.t += 40  # lint's lease lapses without a sweep: take_stale recovers it
    w = r.claim("lint", owner="agent-b", ttl=30, take_stale=True)
    r.release("lint", token=tok(w))
    r.reopen("build/x", reason="flaky, again")
    t = r.claim("test", owner="agent-c", ttl=300, paths=["tests/**"])  # held at generated_at
    r.reserve("test", token=tok(t), paths=["conftest.py"])
    r.unreserve("test", token=tok(t), paths=["conftest.py"])
    c.t += 50
    evs = [e.data for e in r.events(limit=100000).events]
    r.close()
    return evs, c.t


@pytest.fixture()
def journal(tmp_path: Path) -> tuple[list[dict[str, Any]], float]:
    return build(tmp_path / "reg")


def seqs(evs: list[dict[str, Any]], kind: str, task: str | None = None) -> list[int]:
    return [e["seq"] for e in evs if e["type"] == kind and (task is None or e["task"] == task)]


def test_holdings_match_events(journal: tuple[list[dict[str, Any]], float]) -> None:
    """One bar per grant, closed by the event that ended it, never overlapping on a lane."""
    evs, gen = journal
    hs = report.holdings(evs, generated_at=gen)
    grants = [e for e in evs if e["type"] in GRANTS]
    # One bar per grant, starting at the grant, for its owner and fence.
    assert [(h.start_seq, h.task, h.owner, h.fence) for h in hs] == [
        (e["seq"], e["task"], e["owner"], e["fence"]) for e in grants]
    by_seq = {e["seq"]: e for e in evs}
    for h in hs:
        if h.end_seq is None:
            continue
        end = by_seq[h.end_seq]
        assert end["task"] == h.task and end["type"] == h.end_type
        assert h.fence in (end.get("fence"), end.get("prev_fence"))
        assert h.end_ts == end["ts"] >= h.start_ts
    ends = {(h.task, h.owner): (h.end_type, h.end_seq) for h in hs}
    assert ends[("build/x", "agent-a")] == ("lease_expired", seqs(evs, "lease_expired")[0])
    assert ends[("build/x", "agent-b")] == ("claim_handed_off", seqs(evs, "claim_handed_off")[0])
    assert ends[("build/x", "agent-c")] == ("claim_completed", seqs(evs, "claim_completed")[0])
    assert ends[("docs", "agent-a")] == ("claim_preempted", seqs(evs, "claim_preempted")[0])
    assert ends[("docs", "agent-d")] == ("claim_released_forced",
                                         seqs(evs, "claim_released_forced")[0])
    assert ends[("lint", "agent-a")] == ("claim_recovered", seqs(evs, "claim_recovered", "lint")[0])
    assert ends[("lint", "agent-b")] == ("claim_released", seqs(evs, "claim_released")[0])
    assert ends[("test", "agent-c")] == ("held", None)
    # Bars on one lane never overlap.
    for task in {h.task for h in hs}:
        lane = [h for h in hs if h.task == task]
        assert all(a.end_ts <= b.start_ts for a, b in itertools.pairwise(lane))


def test_open_and_stale_bars(journal: tuple[list[dict[str, Any]], float]) -> None:
    """A claim still held is open to generated_at; a lapsed lease is stale from its deadline."""
    evs, gen = journal
    held = [h for h in report.holdings(evs, generated_at=gen) if h.open]
    assert [(h.task, h.end_type, h.end_ts) for h in held] == [("test", "held", gen)]
    later = report.holdings(evs, generated_at=gen + 3600)  # its 300 s lease has lapsed
    assert [(h.end_type, h.held_until) for h in later if h.open] == [
        ("lapsed", held[0].expires_at)]
    lint_a = next(h for h in later if (h.task, h.owner) == ("lint", "agent-a"))
    assert lint_a.held_until == lint_a.start_ts + 30 < lint_a.end_ts  # stale before recovery
    parked = next(h for h in later if (h.task, h.owner) == ("build/x", "agent-c"))
    # Parked with no owner process to watch: bounded by the default maximum park time (#17).
    assert parked.expires_at == parked.end_ts + DEFAULT_MAX_PARK
    assert parked.held_until == parked.end_ts


def test_superseded_closes_the_loser_only() -> None:
    """A merge supersession ends the loser's bar and leaves the winner's."""
    base = {"ts": T0, "owner": "a", "task": "t"}
    evs = [
        {**base, "seq": 1, "type": "claim_created", "fence": 1},
        {**base, "seq": 2, "type": "claim_created", "fence": 2, "owner": "b", "imported": True},
        {**base, "seq": 3, "ts": T0 + 5, "type": "claim_superseded", "loser": "b",
         "loser_fence": 2, "winner": "a", "rule": "earlier claim time"},
        {**base, "seq": 4, "ts": T0 + 9, "type": "claim_released", "fence": 1},
    ]
    hs = report.holdings(evs)
    assert [(h.owner, h.end_seq, h.end_type) for h in hs] == [
        ("a", 4, "claim_released"), ("b", 3, "claim_superseded")]
    assert [m.kind for m in report.markers(evs)] == ["superseded"]


def test_owner_summary(journal: tuple[list[dict[str, Any]], float]) -> None:
    """Per owner: grants, completions, takeovers, losses, refusals and time held, windowed."""
    evs, gen = journal
    rows = {s.owner: s for s in report.owner_summary(evs, generated_at=gen)}
    assert sorted(rows) == ["agent-a", "agent-b", "agent-c", "agent-d"]
    a, b, c = rows["agent-a"], rows["agent-b"], rows["agent-c"]
    assert (a.claims, a.completions, a.recoveries, a.lost, a.rejected) == (3, 0, 0, 3, 0)
    assert (b.claims, b.recoveries, b.rejected) == (2, 2, 1)
    assert (c.claims, c.completions) == (2, 1)
    # agent-a: build/x until its deadline (70 s), docs 3 s, lint until its deadline (30 s).
    assert a.held_seconds == pytest.approx(70 + 3 + 30)
    assert c.held_seconds == pytest.approx(5 + 50)  # build/x 5 s, test until generated_at
    only_docs = report.owner_summary(evs, generated_at=gen, tasks={"docs"})
    assert [(s.owner, s.claims) for s in only_docs] == [("agent-a", 1), ("agent-d", 1)]
    late = report.owner_summary(evs, generated_at=gen, since=gen - 10)  # only "test" is held
    assert [(s.owner, s.claims, s.held_seconds) for s in late] == [("agent-c", 0, 10.0)]


def test_colours_are_deterministic_and_distinct() -> None:
    """An owner's colour depends on its name alone: the same in every report, whoever else is
    in it; ten agents get ten different colours."""
    owners = [f"agent-{i}" for i in range(10)]
    first = report.owner_colours(owners)
    assert first == report.owner_colours(reversed(owners))
    assert len(set(first.values())) == 10
    many = report.owner_colours([*(f"o{i}" for i in range(50)), *owners])
    assert len(many) == 60 and all(re.fullmatch(r"hsl\(\d+,\d+%,\d+%\)", c)
                                   for c in many.values())
    assert all(many[o] == first[o] == report.owner_colour(o) for o in owners)
    assert report.owner_colours(["agent-a"])["agent-a"] == report.owner_colour("agent-a")


class Dom(HTMLParser):
    """Elements with their attributes, plus text, as a browser-independent parse."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        self._in = tag if tag in ("script", "style") else None

    def handle_data(self, data: str) -> None:
        {"script": self.scripts, "style": self.styles}.get(self._in or "", self.text).append(data)
        self._in = None

    def find(self, cls: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if cls in a.get("class", "").split()]


def parse(html: str) -> Dom:
    dom = Dom()
    dom.feed(html)
    return dom


def test_html_bars_and_markers(journal: tuple[list[dict[str, Any]], float]) -> None:
    """The static page draws a bar per grant and a marker per notable event, lane per task."""
    evs, gen = journal
    dom = parse(report.render_html(evs, title="fleet audit", generated_at=gen))
    bars = dom.find("bar")
    assert [(b["data-task"], b["data-owner"], int(b["data-start-seq"])) for b in bars] == [
        (e["task"], e["owner"], e["seq"]) for e in evs if e["type"] in GRANTS]
    kinds = [m["data-kind"] for m in dom.find("marker")]
    for kind, event_type in report.MARKER_KINDS.items():
        if event_type == "superseded":
            continue
        assert kinds.count(event_type) == len(seqs(evs, kind)) >= 1, kind
    marker_seqs = {int(m["data-seq"]) for m in dom.find("marker")}
    assert marker_seqs == {e["seq"] for e in evs if e["type"] in report.MARKER_KINDS}
    assert [a["data-task"] for a in dom.find("lane")] == ["build/x", "docs", "lint", "test"]
    assert {a["data-owner"] for t, a in dom.elements if t == "span" and "data-owner" in a} == {
        "agent-a", "agent-b", "agent-c", "agent-d"}


def test_escaping_and_offline(journal: tuple[list[dict[str, Any]], float]) -> None:
    """Hostile text is escaped everywhere and the page loads nothing but its own code."""
    evs, gen = journal
    title = 'audit <img src=x onerror=alert(1)> "t"'
    html = report.render_html(evs, title=title, generated_at=gen)
    # One script runs (ours); the other is the timeline's data, which a browser never runs,
    # and in which no "<" survives to close it early.
    assert html.count("<script") == 2 and "<img" not in html and "<b>stop" not in html
    assert html.count('<script type="application/json" id="fc-data">') == 1
    assert "&lt;script&gt;alert(&quot;x&quot;)" in html
    dom = parse(html)
    data = json.loads(dom.scripts[0])
    assert "<" not in dom.scripts[0] and "build/x" in data["tasks"]
    assert title in dom.text  # shown literally, once parsed
    tips = [a["data-tip"] for _, a in dom.elements if "data-tip" in a]
    assert any(EVIL in t for t in tips)  # the reason survives intact in the tooltip
    assert any("ops <b>stop</b>" in t for t in tips)
    # Nothing is fetched: only fragment references, and the CSP allows only our inline code.
    refs = re.findall(r'\b(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith("#") for r in refs)
    assert set(re.findall(r"https?://[^\"' ]+", html)) == {"http://www.w3.org/2000/svg"}
    csp = next(a["content"] for t, a in dom.elements if a.get("http-equiv") ==
               "Content-Security-Policy")

    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert "default-src 'none'" in csp
    assert f"script-src {digest(dom.scripts[1])}" in csp
    assert f"style-src {digest(dom.styles[0])}" in csp
    # The policy allows no style attribute in the markup: a browser drops it (the owner bars
    # were styled spans, shown as nothing). (The script's CSSOM writes are allowed.)
    assert not [(t, a) for t, a in dom.elements if "style" in a]
    # A malformed link (#q=%) must not stop the page's script.
    assert "try { hash[" in dom.scripts[1]


def test_window_keeps_bars_that_started_earlier(
    journal: tuple[list[dict[str, Any]], float],
) -> None:
    """A --since window still draws a holding granted before it began."""
    evs, gen = journal
    since = T0 + 50  # inside agent-a's first holding of build/x
    dom = parse(report.render_html(evs, title="w", generated_at=gen, tasks=["build/x"],
                                   since=since))
    bars = dom.find("bar")
    assert {b["data-task"] for b in bars} == {"build/x"}
    assert [b["data-owner"] for b in bars] == ["agent-a", "agent-b", "agent-c"]
    assert "claim_rejected" not in "".join(m["data-tip"] for m in dom.find("marker"))
    empty = report.render_html([], title="nothing", generated_at=gen)
    assert "No claims in this selection" in empty and not parse(empty).find("bar")


def test_csv_round_trip(journal: tuple[list[dict[str, Any]], float]) -> None:
    """The CSV export reads back to exactly the events, and its columns read well alone."""
    evs, _ = journal
    odd = {"seq": 999, "ts": T0, "type": "claim_released_forced", "task": "t", "owner": "o",
           "actor": "admin", "fence": None, "reason": 'line1\nline2, "q" =1+1 é', "x": [1, 2]}
    text = report.to_csv([*evs, odd, {"seq": 1000, "ts": T0, "type": "x", "reason": ""}])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(report.CSV_COLUMNS)
    assert rows[0]["time"] == "2023-11-14T22:13:20.000Z" and rows[0]["type"] == "registry_created"
    assert report.from_csv(text) == [*evs, odd, {"seq": 1000, "ts": T0, "type": "x", "reason": ""}]
    # The columns alone (without extra) are what a spreadsheet user reads.
    forced = next(r for r in rows if r["type"] == "claim_released_forced")
    event = next(e for e in evs if e["type"] == "claim_released_forced")
    assert (forced["actor"], forced["reason"], forced["fence"], forced["task"]) == (
        "admin", "ops <b>stop</b>", str(event["fence"]), "docs")
    assert "hash" in json.loads(forced["extra"])


def test_jsonl_round_trip(journal: tuple[list[dict[str, Any]], float]) -> None:
    """The JSONL export is one event per line, exactly as recorded."""
    evs, _ = journal
    text = report.to_jsonl(evs)
    assert text.endswith("\n") and text.count("\n") == len(evs)
    assert [json.loads(line) for line in text.splitlines()] == evs


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", *args],
        capture_output=True, encoding="utf-8", timeout=120, env={**os.environ, "HOME": str(tmp)},
        stdin=subprocess.DEVNULL, check=False)


@pytest.mark.slow
def test_chromium_renders_the_report(
    journal: tuple[list[dict[str, Any]], float], tmp_path: Path,
) -> None:
    """Headless Chromium runs the page's script under its CSP and builds every bar."""
    exe = chromium()
    if exe is None:
        pytest.skip("headless Chromium not installed (apt-get install -y chromium)")
    evs, gen = journal
    page = tmp_path / "report.html"
    page.write_text(report.render_html(evs, title="fleet audit", generated_at=gen),
                    encoding="utf-8")
    done = run_chromium(exe, tmp_path, "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = parse(done.stdout)
    html_attrs = next(a for t, a in dom.elements if t == "html")
    expected = [(e["task"], e["owner"], e["seq"]) for e in evs if e["type"] in GRANTS]
    # The script ran (the CSP let it) and counted the bars the browser built.
    assert html_attrs.get("data-ready") == str(len(expected)), "report script did not run"
    bars = dom.find("bar")
    assert [(b["data-task"], b["data-owner"], int(b["data-start-seq"])) for b in bars] == expected
    hs = report.holdings(evs, generated_at=gen)
    assert [b["data-end-seq"] for b in bars] == [
        "" if h.end_seq is None else str(h.end_seq) for h in hs]
    assert len(dom.find("marker")) == sum(e["type"] in report.MARKER_KINDS for e in evs)
    shot = tmp_path / "report.png"
    done = run_chromium(exe, tmp_path, f"--screenshot={shot}", "--window-size=1300,700",
                        page.as_uri())
    assert done.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if keep := os.environ.get("FLEETCLAIMS_REPORT_SCREENSHOT"):
        shutil.copy(shot, keep)


def ev(seq: int, dt: float, kind: str, task: str, owner: str, **fields: Any) -> dict[str, Any]:
    """A minimal journal event at T0 + dt."""
    return {"seq": seq, "ts": T0 + dt, "type": kind, "task": task, "owner": owner,
            "actor": fields.pop("actor", owner), **fields}


def test_waits_run_from_first_refusal_to_the_waiters_grant() -> None:
    """A wait is an owner's first refusal to its own grant of that task; an owner granted other
    work first gave up (not counted as waiting); one still refused at the end gave up too."""
    evs = [ev(1, 0, "claim_created", "t", "a", fence=1),
           ev(2, 10, "claim_rejected", "t", "b"), ev(3, 20, "claim_rejected", "t", "b"),
           ev(4, 15, "claim_rejected", "t", "c"),
           ev(5, 40, "claim_completed", "t", "a", fence=1),
           ev(6, 70, "claim_created", "t", "b", fence=2),        # b waited 70 - 10 = 60 s
           ev(7, 75, "claim_created", "u", "c", fence=3),        # c gave up on t for u
           ev(8, 80, "claim_rejected", "u", "d")]                # d still waiting at the end
    ws = {w.task: w for w in report.waits(evs)}
    t, u = ws["t"], ws["u"]
    assert (t.refusals, t.waiters, t.waits, t.total, t.longest, t.longest_owner, t.gave_up) == (
        3, ("b", "c"), 1, 60.0, 60.0, "b", 1)
    assert (u.refusals, u.waits, u.total, u.gave_up) == (1, 0, 0.0, 1)
    assert [w.task for w in report.waits(evs)] == ["t", "u"]  # longest total wait first
    only_u = report.waits(evs, report.Selection(tasks={"u"}))
    assert [w.task for w in only_u] == ["u"]
    assert report.waits(evs, report.Selection(since=T0 + 76)) == [
        report.Wait("u", 1, ("d",), 0, 0.0, 0.0, "", 1, T0 + 80)]


def test_losses_name_who_lost_and_who_took(
    journal: tuple[list[dict[str, Any]], float],
) -> None:
    """Every expiry, takeover, preemption and forced release is a loss naming the holder that
    lost it and who took it (or forced it), in journal order."""
    evs, _ = journal
    got = [(x.task, x.kind, x.lost_by, x.by) for x in report.losses(evs)]
    assert got == [("build/x", "lease_expired", "agent-a", None),
                   ("build/x", "claim_recovered", "agent-a", "agent-b"),
                   ("docs", "claim_preempted", "agent-a", "agent-d"),
                   ("docs", "claim_released_forced", "agent-d", "admin"),
                   ("lint", "claim_recovered", "agent-a", "agent-b")]
    assert report.losses(evs, report.Selection(owners={"agent-d"})) == [
        x for x in report.losses(evs) if "agent-d" in (x.lost_by, x.by)]


def counts(html: str) -> dict[str, int]:
    """The header's figures, by name."""
    found = re.findall(r'data-count="([^"]+)"><b>([\d,]+)</b>', html)
    return {name: int(n.replace(",", "")) for name, n in found}


def test_header_counts_and_period_follow_the_selection(
    journal: tuple[list[dict[str, Any]], float],
) -> None:
    """A filtered report counts only what it shows, and its axis spans only the selected
    events (not up to the time it was generated)."""
    evs, gen = journal
    html = report.render_html(evs, title="all", generated_at=gen + 86400)
    assert counts(html) == {
        "events": len(evs), "tasks": 4, "owners": 4, "grants": 8, "completed": 1,
        "refused claims": 1, "lost leases": 5, "still held": 1}
    data = json.loads(parse(html).scripts[0])
    assert (data["t0"], data["t1"]) == (evs[0]["ts"], evs[-1]["ts"])
    docs = report.render_html(evs, title="docs", generated_at=gen, tasks=["docs"])
    picked = [e for e in evs if e.get("task") == "docs"]
    assert counts(docs) == {"events": len(picked), "tasks": 1, "owners": 2, "grants": 2,
                            "completed": 0, "refused claims": 0, "lost leases": 2,
                            "still held": 0}
    data = json.loads(parse(docs).scripts[0])
    assert (data["t0"], data["t1"]) == (picked[0]["ts"], picked[-1]["ts"])
    assert data["tasks"] == ["docs"]
    assert "What was lost" in docs and "force-released" in docs and "preempted" in docs


def test_cli_report_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real registry and the command line: --html - writes the page to stdout (no
    file named "-"), --task selects and counts one task, and --html without `report` or
    `report` without --html is a usage error that writes nothing."""
    from fleetclaims.cli import main

    evs, _ = build(tmp_path / "reg")
    monkeypatch.chdir(tmp_path)
    base = ["--dir", str(tmp_path / "reg"), "audit"]
    assert main([*base, "report", "--html", "-"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!DOCTYPE html>") and not (tmp_path / "-").exists()
    assert counts(page)["events"] == len(evs) and counts(page)["tasks"] == 4
    assert main([*base, "report", "--html", "x.html", "--task", "build/x"]) == 0
    assert "wrote x.html" in capsys.readouterr().out
    only = (tmp_path / "x.html").read_text(encoding="utf-8")
    assert counts(only)["events"] == sum(e.get("task") == "build/x" for e in evs)
    assert counts(only)["tasks"] == 1 and json.loads(parse(only).scripts[0])["tasks"] == [
        "build/x"]
    assert main([*base, "--html", "y.html"]) == 2
    assert "audit report" in capsys.readouterr().err and not (tmp_path / "y.html").exists()
    assert main([*base, "report"]) == 2
    assert "--html" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--owner", "bad owner"], ["--task", "bad!"],
                                  ["--type", "claim_creatd"], ["--type", "claim_created"]])
def test_report_filters_are_checked(tmp_path: Path, args: list[str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """audit report took a malformed --owner or --task as a filter matching nothing (exit 0,
    an empty report) and ignored --type; they are refused (exit 2), nothing written."""
    from fleetclaims import Registry
    from fleetclaims.cli import main

    d = tmp_path / "r"
    Registry(d).claim("t", owner="a")
    out = tmp_path / "r.html"
    assert main(["--dir", str(d), "audit", "report", "--html", str(out), *args]) == 2
    assert not out.exists()
    capsys.readouterr()
