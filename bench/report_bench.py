"""The audit report at volume: page size, Python build time and headless Chromium render time
for journals of N events, with optional screenshots.

    .venv/bin/python bench/report_bench.py                      # 200, 20,000, 1,000,000 events
    .venv/bin/python bench/report_bench.py --events 20000 --shots /tmp/report-shots
    .venv/bin/python bench/report_bench.py --docs docs/audit-report.png   # the README's picture

The journals are simulated (tests/report_synth.py: 4 owners, heartbeats every 15 s, refusals,
hand-offs, lost leases; 20,000 tasks, or 10 tasks at 20,000 events as in issue 20): the report
is a pure function of event dicts, and building a million events through the Registry takes
many minutes. Render time is the wall time of ``chromium --headless --screenshot`` on the page
minus the same on a blank page (Chromium's own start-up), best of ``--runs``.
Budget (issue 20): 1,000,000 events, no filter: at most 5 MB and under 5 s; 20,000 in under 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import report_synth  # noqa: E402

from fleetclaims.review.report import render_html  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def shoot(exe: str, tmp: Path, page: Path, png: Path) -> float:
    started = time.perf_counter()
    subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--screenshot={png}",
                    "--window-size=1280,1600", page.as_uri()], check=True, timeout=300,
                   capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "HOME": str(tmp)})
    return time.perf_counter() - started


def measure(n: int, exe: str | None, tmp: Path, runs: int, shots: Path | None) -> None:
    kw = {"tasks": 10} if n == 20_000 else {"tasks": 30} if n <= 1000 else {}
    evs = report_synth.events(n, **kw)
    started = time.perf_counter()
    html = render_html(evs, title=f"fleetclaims audit — {n:,} events",
                       generated_at=evs[-1]["ts"] + 60)
    build = time.perf_counter() - started
    page = tmp / f"report-{n}.html"
    page.write_text(html, encoding="utf-8")
    tasks = len({e["task"] for e in evs if "task" in e})
    line = (f"{n:>9,} events {tasks:>6,} tasks  {len(html.encode()) / 1e6:6.2f} MB  "
            f"build {build:5.2f} s")
    if exe is not None:
        blank = tmp / "blank.html"
        blank.write_text("<!DOCTYPE html><title>blank</title>", encoding="utf-8")
        png = tmp / f"report-{n}.png"
        startup = min(shoot(exe, tmp, blank, tmp / "blank.png") for _ in range(runs))
        render = min(shoot(exe, tmp, page, png) for _ in range(runs))
        line += f"  render {render - startup:5.2f} s (Chromium start-up {startup:.2f} s)"
        if shots is not None:
            shots.mkdir(parents=True, exist_ok=True)
            shutil.copy(png, shots / png.name)
            shutil.copy(page, shots / page.name)
    print(line, flush=True)


def docs_image(exe: str, tmp: Path, target: Path) -> None:
    """The README's picture: 20,000 events on 10 tasks, the top of the page at 0.8 scale."""
    evs = report_synth.events(20_000, tasks=10)
    page = tmp / "docs.html"
    page.write_text(render_html(evs, title="fleetclaims audit — 20,000 events, 10 tasks, "
                                "4 agents", generated_at=evs[-1]["ts"]), encoding="utf-8")
    subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--hide-scrollbars",
                    "--force-device-scale-factor=0.8", f"--screenshot={target.resolve()}",
                    "--window-size=1240,1100", page.as_uri()], check=True, timeout=300,
                   capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, "HOME": str(tmp)})
    print(f"wrote {target} ({target.stat().st_size:,} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, nargs="+", default=[200, 20_000, 1_000_000])
    ap.add_argument("--runs", type=int, default=2, help="best of this many renders")
    ap.add_argument("--shots", type=Path, help="keep the pages and screenshots here")
    ap.add_argument("--docs", type=Path, help="write the README's picture here and stop "
                    "(docs/audit-report.png)")
    args = ap.parse_args()
    exe = chromium()
    if exe is None:
        print("chromium not found: sizes and build times only (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.docs is not None and exe is not None:
            docs_image(exe, Path(tmp), args.docs)
            return
        for n in args.events:
            measure(n, exe, Path(tmp), args.runs, args.shots)


if __name__ == "__main__":
    main()
