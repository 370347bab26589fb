"""Audit review: the reviewer's report of a journal as one self-contained HTML page, and the
CSV and JSONL exports.

Pure functions over event dicts (``audit.jsonl`` lines, journal order): no I/O, no clock, stdlib
only (plus orjson, a dependency, to write the page's data). The page answers the reviewer's
questions first (the period and its counts, where agents waited, what was lost, who worked on
what), then draws the timeline (``timeline``). The facts come from ``facts``; the page's parts
from ``page``. Offline: inline CSS/JS/SVG under a CSP that allows nothing else."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Collection, Iterable
from typing import Any

from ..core import events as ev
from . import page, timeline
from .facts import (
    END_TYPES,
    GRANT_TYPES,
    LOST_TYPES,
    MARKER_KINDS,
    REGISTRY_TYPES,
    Event,
    Holding,
    Loss,
    Marker,
    OwnerSummary,
    Selection,
    Wait,
    _int,
    _num,
    _str,
    describe,
    duration,
    holdings,
    iso,
    losses,
    markers,
    owner_summary,
    waits,
)
from .page import CSP, Counts

__all__ = [
    "CSP", "CSV_COLUMNS", "END_TYPES", "GRANT_TYPES", "LOST_TYPES", "MARKER_KINDS",
    "REGISTRY_TYPES", "Holding", "Loss", "Marker", "OwnerSummary", "Selection", "Wait",
    "describe", "duration", "from_csv", "holdings", "iso", "losses", "markers", "owner_colour",
    "owner_colours", "owner_summary", "render_html", "to_csv", "to_jsonl", "waits",
]

CSV_COLUMNS = ("seq", "ts", "time", "type", "task", "owner", "actor", "fence", "reason", "extra")
_FIELDS = ("seq", "ts", "type", "task", "owner", "actor", "fence", "reason")


def owner_colour(owner: str) -> str:
    """An owner's colour, a function of its name alone, so it is the same in every report of
    every registry: a hue in 10-degree steps, a saturation and a lightness, all from SHA-256
    of the name (mid lightness, readable under white text and on white)."""
    d = hashlib.sha256(owner.encode()).digest()
    hue = (int.from_bytes(d[:2], "big") % 36) * 10
    return f"hsl({hue},{(58, 68, 78)[d[2] % 3]}%,{(38, 46, 54)[d[3] % 3]}%)"


def owner_colours(owners: Iterable[str]) -> dict[str, str]:
    """``owner_colour`` of each owner, in name order."""
    return {o: owner_colour(o) for o in sorted(set(owners))}


def _scan(evs: list[Event], sel: Selection) -> tuple[int, set[str], int, float | None,
                                                      float | None]:
    """One pass over the selected events: how many, their tasks, completions, first and last
    time."""
    n = completions = 0
    tasks: set[str] = set()
    lo = hi = None
    pick = None if sel.whole else sel.event
    for e in evs:
        if pick is not None and not pick(e):
            continue
        ts = e.get("ts")
        if type(ts) is not float and type(ts) is not int:
            continue
        n += 1
        if lo is None or ts < lo:
            lo = ts
        if hi is None or ts > hi:
            hi = ts
        task = e.get("task")
        if type(task) is str:
            tasks.add(task)
        completions += e.get("type") == ev.CLAIM_COMPLETED
    return n, tasks, completions, lo, hi


def _counts(scan: tuple[int, set[str], int, float | None, float | None], sel: Selection,
            hs: list[Holding], ws: list[Wait], ls: list[Loss]) -> Counts:
    n, tasks, completions, _, _ = scan
    grants = [h for h in hs if (sel.since is None or h.start_ts >= sel.since)
              and (sel.until is None or h.start_ts <= sel.until)]
    owners = {h.owner for h in hs} | {o for w in ws for o in w.waiters}
    return Counts(n, len(tasks), len(owners), len(grants), completions,
                  sum(w.refusals for w in ws), len(ls), sum(h.open for h in hs))


def render_html(
    events: Iterable[Event],
    *,
    title: str,
    generated_at: float,
    tasks: Collection[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    owners: Collection[str] | None = None,
) -> str:
    """One self-contained HTML page. Pass the whole journal: ``tasks``, ``owners``, ``since``
    and ``until`` select what is shown and counted, so a holding granted before ``since`` is
    still drawn. The time axis spans the selected events (not up to ``generated_at``)."""
    evs = events if isinstance(events, list) else list(events)
    sel = Selection(tasks, owners, since, until)
    all_hs = holdings(evs, generated_at=generated_at)
    hs = [h for h in all_hs if sel.holding(h)]
    ms = markers(evs, None if sel.whole else sel)
    regs = [(t, describe(e)) for e in evs if e.get("type") in REGISTRY_TYPES
            and (t := _num(e.get("ts"))) is not None and sel.event(e)]
    ws, ls = waits(evs, sel), losses(evs, sel)
    scan = _scan(evs, sel)
    first, last = scan[3], scan[4]
    t0 = since if since is not None else min(
        [*([] if first is None else [float(first)]), *(h.start_ts for h in hs)],
        default=generated_at)
    t1 = until if until is not None else (t0 if last is None else float(last))
    x = timeline.Scale(t0, t1)
    # Time held is counted inside the period shown (a claim still held counts up to its end).
    summary = owner_summary(evs, generated_at=generated_at, tasks=tasks, since=since,
                            until=x.t1, hs=all_hs)
    if owners is not None:
        summary = [s for s in summary if s.owner in owners]
    lanes = timeline.build_lanes(hs, ms)
    colours = owner_colours([h.owner for h in hs] + [s.owner for s in summary])
    overview = timeline.density([(h.start_ts, "granted") for h in hs]
                                + [(m.ts, m.kind) for m in ms], x, timeline.DENS_PX)
    counts = _counts(scan, sel, hs, ws, ls)
    span = x.t1 - x.t0
    meta = (f"{iso(x.t0)} to {iso(x.t1)} ({duration(span)}) · {page.esc(sel.describe())} · "
            f"generated {iso(generated_at)} · times in UTC")
    shown = min(len(lanes), timeline.STATIC_LANES)
    body = [page.cards(counts), '<div class="answers">', page.waited(ws, span),
            page.lost(ls, span), page.worked(summary, colours), "</div>",
            "<h2>Timeline</h2>", page.legend(colours, {m.kind for m in ms}),
            page.controls(len(lanes), shown),
            "" if hs or ms else "<p>No claims in this selection.</p>",
            f'<div class="chart" id="chart">{timeline.svg(lanes, x, colours, overview, regs)}'
            "</div>", page.more_button(len(lanes), shown), page.queue_table(evs, sel)]
    data = timeline.data(lanes, x, list(colours), colours, regs)
    return page.document(title=title, meta=meta, body=body, data_json=page.as_json(data))


# --- export ------------------------------------------------------------------------------------


def to_jsonl(events: Iterable[Event]) -> str:
    """One compact JSON object per line, keys in their recorded order."""
    return "".join(json.dumps(dict(e), ensure_ascii=False, separators=(",", ":")) + "\n"
                   for e in events)


def _cell(key: str, value: Any) -> tuple[str, bool]:
    """The cell text, and whether it alone restores ``value`` exactly."""
    if key == "ts":
        exact = isinstance(value, float)
    else:
        exact = _int(value) is not None if key in ("seq", "fence") else bool(_str(value))
    return ("" if value is None else str(value)), exact


def to_csv(events: Iterable[Event]) -> str:
    """CSV with columns CSV_COLUMNS; ``time`` is UTC ISO-8601 and ``extra`` holds every other
    field as JSON (prev and hash included), so ``from_csv`` restores the events exactly."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for e in events:
        cells = {k: _cell(k, e[k]) for k in _FIELDS if k in e}
        extra = {k: v for k, v in e.items() if k not in cells or not cells[k][1]}
        ts = _num(e.get("ts"))
        cells["time"] = (iso(ts) if ts is not None else "", True)
        cells["extra"] = (json.dumps(extra, ensure_ascii=False, separators=(",", ":")), True)
        w.writerow([cells.get(c, ("", True))[0] for c in CSV_COLUMNS])
    return buf.getvalue()


def from_csv(text: str) -> list[dict[str, Any]]:
    """Events back from ``to_csv`` output."""
    conv: dict[str, Any] = {"ts": float, "seq": int, "fence": int}
    return [{**{k: conv.get(k, str)(row[k]) for k in _FIELDS if row.get(k)},
             **json.loads(row.get("extra") or "{}")} for row in csv.DictReader(io.StringIO(text))]
