"""The report page's parts: the counts, the three answers (where agents waited, what was lost,
who worked on what), the legend and the work-queue table, and the page around them.

Every table is bounded (the first rows, then a count of the rest), so a million-event journal
gives a page of the same few kilobytes of answers; the timeline's size is bounded in
``timeline``."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from ..core import events as ev
from .facts import Event, Loss, OwnerSummary, Selection, Wait, duration, iso, short_time
from .timeline import SYMBOLS

_HERE = Path(__file__).parent
CSS = (_HERE / "report.css").read_text(encoding="utf-8")
JS = (_HERE / "report.js").read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only our own inline style and script run (by hash); nothing is fetched. The data block is
# JSON (type application/json), which a browser does not execute, so the CSP need not allow it.
CSP = (f"default-src 'none'; style-src {_csp_hash(CSS)}; script-src {_csp_hash(JS)}; "
       "img-src data:; base-uri 'none'; form-action 'none'")
ROWS = 8  # rows of each answer shown at once; the rest behind "more"
MORE_ROWS = 500  # at most this many behind "more"


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def swatch(colour: str) -> str:
    return (f'<svg width="14" height="14"><rect width="14" height="14" rx="3" fill="{colour}"/>'
            "</svg>")


@dataclass(frozen=True)
class Counts:
    """The header's figures, all counted inside the selection."""

    events: int
    tasks: int
    owners: int
    grants: int
    completions: int
    refusals: int
    lost: int
    held_now: int


def cards(c: Counts) -> str:
    items = [("events", c.events, False), ("tasks", c.tasks, False), ("owners", c.owners, False),
             ("grants", c.grants, False), ("completed", c.completions, False),
             ("refused claims", c.refusals, c.refusals > 0),
             ("lost leases", c.lost, c.lost > 0), ("still held", c.held_now, False)]
    return '<div class="cards">' + "".join(
        f'<div class="card{" warn" if warn else ""}" data-count="{esc(name)}"><b>{n:,}</b>'
        f"<span>{name}</span></div>" for name, n, warn in items) + "</div>"


def _table(head: list[str], rows: list[str], numeric: Collection[int] = ()) -> str:
    """A table of the first ``ROWS`` rows and, if there are more, a <details> with the next
    ``MORE_ROWS`` (and how many were left out)."""
    th = "".join(f'<th{" class=n" if i in numeric else ""}>{h}</th>' for i, h in enumerate(head))

    def block(body: list[str]) -> str:
        return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"

    out = block(rows[:ROWS])
    if len(rows) > ROWS:
        rest = rows[ROWS:ROWS + MORE_ROWS]
        left = len(rows) - ROWS - len(rest)
        out += (f"<details><summary>{len(rows) - ROWS:,} more</summary>{block(rest)}"
                + (f"<p>… and {left:,} more (use --task, --owner or --since to narrow)</p>"
                   if left else "") + "</details>")
    return out


def _few(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1}"


def _secs(seconds: float, count: int) -> str:
    if not count:  # nobody who waited got the task: no waiting time to show
        return '<td class="n">—</td>'
    return f'<td class="n" data-seconds="{seconds:.3f}">{duration(seconds)}</td>'


def waited(ws: list[Wait], span: float) -> str:
    """Where did agents wait: per task, the time from a first refusal to the grant."""
    if not ws:
        return ('<section id="waits"><h2>Where agents waited</h2><p class="none">No claim was '
                "refused: nobody waited.</p></section>")
    total = sum(w.total for w in ws)
    refused = sum(w.refusals for w in ws)
    rows = [f'<tr data-task="{esc(w.task)}"><td class="t" title="{esc(w.task)}">'
            f"{esc(w.task)}</td>{_secs(w.total, w.waits)}{_secs(w.longest, w.waits)}"
            f'<td class="n">{w.refusals}</td><td class="t" title="{esc(", ".join(w.waiters))}">'
            f'{esc(_few(w.waiters))}</td><td class="n">{w.gave_up or ""}</td></tr>'
            for w in ws]
    return ('<section id="waits"><h2>Where agents waited</h2>'
            f"<p>{refused:,} refused claims on {len(ws):,} tasks; "
            + (f"{duration(total)} waited in all, from an owner's first refusal to its grant"
               if any(w.waits for w in ws) else "no refused owner was granted the task after")
            + " (\u201cgave up\u201d: granted other work first, or never).</p>"
            + _table(["Task", "Waited", "Longest", "Refused", "Who", "Gave up"], rows,
                     (1, 2, 3, 5)) + "</section>")


_LOSS_LABEL = {ev.LEASE_EXPIRED: "lease expired", ev.CLAIM_RECOVERED: "taken over",
               ev.CLAIM_PREEMPTED: "preempted", ev.CLAIM_SUPERSEDED: "superseded",
               ev.CLAIM_RELEASED_FORCED: "force-released"}


def lost(ls: list[Loss], span: float) -> str:
    """What was lost: expiries, takeovers, preemptions, supersessions, forced releases."""
    if not ls:
        return ('<section id="losses"><h2>What was lost</h2><p class="none">Nothing: no lease '
                "expired, nothing was taken over or force-released.</p></section>")
    by_kind: dict[str, int] = {}
    for x in ls:
        by_kind[x.kind] = by_kind.get(x.kind, 0) + 1
    summary = ", ".join(f"{n:,} {_LOSS_LABEL.get(k, k)}" for k, n in
                        sorted(by_kind.items(), key=lambda kv: -kv[1]))
    rows = [f'<tr data-seq="{x.seq}"><td class="n" title="{iso(x.ts)}">'
            f'{short_time(x.ts, span)}</td><td class="t" title="{esc(x.task)}">{esc(x.task)}'
            f'</td><td class="w">{_LOSS_LABEL.get(x.kind, esc(x.kind))}</td><td class="w">'
            f'{esc(x.lost_by)}{" → " + esc(x.by) if x.by else ""}</td><td class="t r" '
            f'title="{esc(x.reason or "")}">{esc(x.reason or "")}</td></tr>'
            for x in reversed(ls)]
    return (f'<section id="losses"><h2>What was lost</h2><p>{summary}. Latest first:</p>'
            + _table(["When", "Task", "What", "Who → taken by", "Reason"], rows, (0,))
            + "</section>")


def _bar(width: int, colour: str) -> str:
    """A bar of ``width`` px drawn by SVG attributes: the page's policy allows no style
    attribute (a styled span showed no bar at all in a browser that enforces it)."""
    return (f'<svg class="hbar" width="{width}" height="9"><rect width="{width}" height="9" '
            f'rx="2" fill="{colour}"/></svg>')


def worked(summary: list[OwnerSummary], colours: Mapping[str, str]) -> str:
    """Who worked on what: per owner, time held under a valid lease, grants, completions."""
    if not summary:
        return ('<section id="owners"><h2>Who worked on what</h2><p class="none">No claims in '
                "this selection.</p></section>")
    ranked = sorted(summary, key=lambda s: (-s.held_seconds, s.owner))
    peak = max(s.held_seconds for s in ranked) or 1.0
    rows = [f'<tr data-owner-row="{esc(s.owner)}"><td>{swatch(colours[s.owner])} {esc(s.owner)}'
            f'</td><td class="n" data-seconds="{s.held_seconds:.3f}">'
            f'{_bar(max(1, round(60 * s.held_seconds / peak)), colours[s.owner])}'
            f'{duration(s.held_seconds)}</td>'
            f'<td class="n">{s.tasks}</td><td class="n">{s.claims}</td>'
            f'<td class="n">{s.completions}</td><td class="n">{s.lost}</td>'
            f'<td class="n">{s.rejected}</td><td class="n">{s.recoveries}</td></tr>'
            for s in ranked]
    return ('<section id="owners"><h2>Who worked on what</h2>'
            + _table(["Owner", "Time held", "Tasks", "Claims", "Completed", "Lost leases",
                      "Refused", "Took over"], rows, (1, 2, 3, 4, 5, 6, 7)) + "</section>")


def legend(colours: Mapping[str, str], kinds_used: Collection[str]) -> str:
    return ('<div class="legend" aria-label="owners">'
            + "".join(f'<span data-owner="{esc(o)}" title="click to highlight">'
                      f"{swatch(c)} {esc(o)}</span>" for o, c in colours.items())
            + '</div><div class="legend" aria-label="markers">'
            + "".join(f'<span data-kind="{k}"><svg width="14" height="14"><use href="#m-{k}" '
                      f'transform="translate(7,7)"/></svg> {label}</span>'
                      for k, (label, _) in SYMBOLS.items() if k in kinds_used)
            + '<span><svg width="14" height="14"><rect width="14" height="14" fill="#999"/>'
            '<rect width="14" height="14" fill="url(#stale)"/></svg> '
            "hatched: lease ran out, not yet taken over</span><span>faded bands: more holdings "
            "or events than pixels (counts in the tooltip; zoom in for each one)</span></div>")


def queue_table(evs: list[Event], sel: Selection) -> str:
    """The work queue's waits: per added task, how long it was pending (added to ready), how
    long it waited ready (to its first claim) and how long the work took (to completion)."""
    from ..core.queue import queue_times

    times = queue_times(evs)
    picked = [(t, row) for t, row in sorted(times.items(), key=lambda kv: (kv[1]["added"] or 0,
                                                                          kv[0]))
              if (sel.tasks is None or t in sel.tasks) and row["added"] is not None
              and (sel.until is None or row["added"] <= sel.until)
              and (sel.since is None or max(v for v in row.values() if v is not None)
                   >= sel.since)]
    if not picked:
        return ""

    def span(a: float | None, b: float | None) -> str:
        if a is None or b is None:
            return '<td class="n">—</td>'
        return f'<td class="n" data-seconds="{b - a:.3f}">{duration(b - a)}</td>'

    rows = [f"<tr><td>{esc(t)}</td><td>{iso(r['added'] or 0)}</td>"
            f"{span(r['added'], r['ready'])}{span(r['ready'], r['claimed'])}"
            f"{span(r['claimed'], r['completed'])}</tr>" for t, r in picked]
    return ('<h2>Work queue</h2><div class="queue">'
            + _table(["Task", "Added", "Pending (to ready)", "Ready (to claimed)",
                      "Worked (to completed)"], rows, (2, 3, 4)) + "</div>")


def document(*, title: str, meta: str, body: Iterable[str], data_json: str) -> str:
    """The page: one file, inline CSS and script under a CSP that allows nothing else."""
    safe = data_json.replace("<", "\\u003c")  # "<" is only ever inside a JSON string
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><h1>{esc(title)}</h1>\n"
            f'<div class="meta">{meta}</div>\n' + "".join(body)
            + f'<div id="tip" hidden></div><script type="application/json" id="fc-data">{safe}'
            f"</script><script>{JS}</script></body></html>\n")


def controls(total: int, shown: int) -> str:
    """The timeline's controls; hidden until the script runs (they need it)."""
    orders = {"contention": "most contended first", "name": "by name",
              "first": "by first activity", "group": "grouped by prefix"}
    options = "".join(f'<option value="{k}">{v}</option>' for k, v in orders.items())
    return ('<div id="controls" hidden><input id="filter" type="search" placeholder="filter '
            f'tasks" aria-label="filter tasks"><label>order <select id="sort">{options}'
            '</select></label><button id="zin" type="button">zoom in</button><button id="zout" '
            'type="button">zoom out</button><button id="zreset" type="button">whole period'
            f'</button><span id="shown">showing {shown:,} of {total:,} tasks · wheel or + -: '
            "zoom · drag or arrows: pan · double-click or 0: whole period</span></div>")


def more_button(total: int, shown: int) -> str:
    note = "" if total <= shown else (
        f'<p class="none">{total - shown:,} more tasks: the script shows them (more tasks, '
        "or filter); without it, narrow the report with --task or --owner.</p>")
    return (f'<button id="more" type="button"{"" if total > shown else " hidden"}>more tasks'
            f"</button>{note}")


def as_json(value: Any) -> str:
    import orjson  # a dependency already; 5-10x json's speed on a million-event report

    return orjson.dumps(value).decode()
