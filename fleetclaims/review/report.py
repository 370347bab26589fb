"""Audit review: holdings from the journal, a self-contained HTML timeline, CSV and JSONL.

Pure functions over event dicts (``audit.jsonl`` lines, journal order): no I/O, no clock, stdlib
only. The HTML is offline: inline CSS/JS/SVG under a CSP that allows nothing else."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from html import escape
from typing import Any

from ..core import events as ev

Event = Mapping[str, Any]

GRANT_TYPES = ev.GRANTS
# What ends a holding on the timeline: the claim's end, or its lease marked stale.
END_TYPES = ev.ENDS | {ev.LEASE_EXPIRED}
LOST_TYPES = ev.LOSSES
MARKER_KINDS: dict[str, str] = {
    ev.CLAIM_REJECTED: "rejected", ev.LEASE_EXPIRED: "expired",
    ev.CLAIM_RECOVERED: "recovered", ev.CLAIM_PREEMPTED: "preempted",
    ev.CLAIM_HANDED_OFF: "handed_off", ev.CLAIM_COMPLETED: "completed",
    ev.CLAIM_RELEASED_FORCED: "forced_release", ev.CLAIM_SUPERSEDED: "superseded",
    ev.CLAIM_REOPENED: "reopened",
}
REGISTRY_TYPES = ev.REGISTRY_EVENTS
CSV_COLUMNS = ("seq", "ts", "time", "type", "task", "owner", "actor", "fence", "reason", "extra")
_FIELDS = ("seq", "ts", "type", "task", "owner", "actor", "fence", "reason")


@dataclass(frozen=True, slots=True)
class Holding:
    """A bar: ``task`` granted to ``owner`` by event ``start_seq`` until event ``end_seq``. Open
    at ``generated_at``: ``end_seq`` None, ``end_type`` "held" or "lapsed" (deadline passed with
    nothing recorded). ``expires_at``: last recorded lease deadline (None: parked)."""

    task: str
    owner: str
    fence: int | None
    start_seq: int
    start_ts: float
    start_type: str
    end_seq: int | None
    end_ts: float
    end_type: str
    end_actor: str | None = None
    end_reason: str | None = None
    expires_at: float | None = None

    @property
    def open(self) -> bool:
        return self.end_seq is None

    @property
    def held_until(self) -> float:  # end of the valid lease: bar end or deadline if earlier
        end = self.end_ts if self.expires_at is None else min(self.end_ts, self.expires_at)
        return max(self.start_ts, end)


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # a value of MARKER_KINDS
    seq: int
    ts: float
    task: str
    detail: str  # plain text for the tooltip


@dataclass(frozen=True, slots=True)
class OwnerSummary:
    owner: str
    claims: int = 0  # grants received: claims, recoveries, hand-offs to them, preemptions
    completions: int = 0
    recoveries: int = 0  # stale claims this owner took over
    lost: int = 0  # grants ended by expiry, recovery, preemption, supersession or force
    rejected: int = 0
    held_seconds: float = 0.0  # time under a valid lease, clipped to the report window


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def iso(ts: float) -> str:
    """UTC ISO-8601 with milliseconds, e.g. 2023-11-14T22:13:20.000Z."""
    text = datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def duration(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m}m {sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m" if h < 48 else f"{h // 24}d {h % 24:02d}h"


def describe(e: Event) -> str:
    """A multi-line plain-text description of an event, for tooltips."""
    ts = _num(e.get("ts"))
    lines = [f"#{e.get('seq')} {e.get('type')}", iso(ts) if ts is not None else "?"]
    for key in ("task", "owner", "actor", "fence", "prev_owner", "prev_fence", "holder",
                "loser", "winner", "from_phase", "phase", "reason", "rule", "note"):
        if (value := e.get(key)) is not None and value != "":
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def holdings(events: Iterable[Event], *, generated_at: float | None = None) -> list[Holding]:
    """The grants in ``events``, each closed by the event that ended it, by ``start_seq``.
    ``generated_at`` (default: the last event's time) ends the bars still open."""
    evs = list(events)
    now = generated_at
    if now is None:
        now = max((t for e in evs if (t := _num(e.get("ts"))) is not None), default=0.0)
    live: dict[str, list[Holding]] = {}
    done: list[Holding] = []

    def close(task: str, fence: int | None, e: Event, kind: str) -> None:
        for h in live.get(task, []):
            if fence is None or h.fence == fence:
                done.append(replace(
                    h, end_seq=_int(e.get("seq")), end_ts=max(h.start_ts, _num(e["ts"]) or 0.0),
                    end_type=kind, end_actor=_str(e.get("actor")),
                    end_reason=_str(e.get("reason")) or _str(e.get("rule"))))
        live[task] = [h for h in live.get(task, []) if fence is not None and h.fence != fence]

    for e in evs:
        kind, task, seq = _str(e.get("type")), _str(e.get("task")), _int(e.get("seq"))
        ts = _num(e.get("ts"))
        if kind is None or task is None or seq is None or ts is None:
            continue
        if kind in GRANT_TYPES:  # ends the grant it replaces; a new claim replaces none
            if kind != ev.CLAIM_CREATED:  # (a duplicate from a merge runs alongside)
                close(task, _int(e.get("prev_fence")), e, kind)
            live.setdefault(task, []).append(Holding(
                task, _str(e.get("owner")) or "?", _int(e.get("fence")), seq, ts, kind,
                None, ts, "held", expires_at=_num(e.get("expires_at"))))
        elif kind in (ev.LEASE_RENEWED, ev.PHASE_CHANGED):
            f = _int(e.get("fence"))
            live[task] = [replace(h, expires_at=_num(e.get("expires_at")))
                          if f is None or h.fence == f else h for h in live.get(task, [])]
        elif kind in END_TYPES:
            close(task, _int(e.get("fence")), e, kind)
        elif kind == ev.CLAIM_SUPERSEDED:
            close(task, _int(e.get("loser_fence")), e, kind)
    for hs in live.values():
        for h in hs:
            end = max(h.start_ts, now)
            lapsed = h.expires_at is not None and h.expires_at < end
            done.append(replace(h, end_ts=end, end_type="lapsed" if lapsed else "held"))
    return sorted(done, key=lambda h: h.start_seq)


def markers(events: Iterable[Event]) -> list[Marker]:
    """A marker per rejection, expiry, recovery, preemption, hand-off, completion, forced
    release, supersession and reopening."""
    out: list[Marker] = []
    for e in events:
        kind = MARKER_KINDS.get(_str(e.get("type")) or "")
        task, seq, ts = _str(e.get("task")), _int(e.get("seq")), _num(e.get("ts"))
        if kind and task is not None and seq is not None and ts is not None:
            out.append(Marker(kind, seq, ts, task, describe(e)))
    return out


def _in(ts: float, since: float | None, until: float | None) -> bool:
    return (since is None or ts >= since) and (until is None or ts <= until)


def owner_summary(
    events: Iterable[Event],
    *,
    generated_at: float | None = None,
    tasks: Collection[str] | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[OwnerSummary]:
    """Per owner (sorted by name): grants, completions, recoveries, lost grants, rejections and
    time held under a valid lease, counting what falls inside the optional task/time window."""
    evs = list(events)
    acc: dict[str, dict[str, float]] = {}

    def bump(owner: str, key: str, amount: float = 1) -> None:
        acc.setdefault(owner, {})[key] = acc.get(owner, {}).get(key, 0) + amount

    for h in holdings(evs, generated_at=generated_at):
        if tasks is not None and h.task not in tasks:
            continue
        if _in(h.start_ts, since, until):
            bump(h.owner, "claims")
        if h.end_seq is not None and h.end_type in LOST_TYPES and _in(h.end_ts, since, until):
            bump(h.owner, "lost")
        lo = h.start_ts if since is None else max(h.start_ts, since)
        hi = h.held_until if until is None else min(h.held_until, until)
        if hi > lo:
            bump(h.owner, "held_seconds", hi - lo)
    keys = {ev.CLAIM_COMPLETED: "completions", ev.CLAIM_RECOVERED: "recoveries",
            ev.CLAIM_REJECTED: "rejected"}
    for e in evs:
        key, owner, ts = keys.get(str(e.get("type"))), _str(e.get("owner")), _num(e.get("ts"))
        if key and owner is not None and ts is not None and _in(ts, since, until) and (
                tasks is None or e.get("task") in tasks):
            bump(owner, key)
    return [OwnerSummary(o, int(r.get("claims", 0)), int(r.get("completions", 0)),
                         int(r.get("recoveries", 0)), int(r.get("lost", 0)),
                         int(r.get("rejected", 0)), r.get("held_seconds", 0.0))
            for o, r in sorted(acc.items())]


# Ten mutually distinct categorical colours (tab10); an owner's slot is a hash of its name.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def owner_colours(owners: Iterable[str]) -> dict[str, str]:
    """A deterministic colour per owner name: the palette slot given by SHA-256 of the name or,
    when an owner earlier in name order in this report took it, the next free slot; past ten
    owners, a hue and lightness from the hash."""
    out: dict[str, str] = {}
    for owner in sorted(set(owners)):
        d = hashlib.sha256(owner.encode()).digest()
        slot = int.from_bytes(d[:4], "big") % len(_PALETTE)
        if len(out) >= len(_PALETTE):
            out[owner] = f"hsl({int.from_bytes(d[4:6], 'big') % 360},60%,{35 + d[6] % 25}%)"
            continue
        while _PALETTE[slot] in out.values():
            slot = (slot + 1) % len(_PALETTE)
        out[owner] = _PALETTE[slot]
    return out


# --- HTML --------------------------------------------------------------------------------------

_CSS = """body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:20px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px}.meta{color:#666;margin-bottom:8px}
.chart{overflow-x:auto;border:1px solid #ddd;border-radius:6px;background:#fff}
svg text{font-size:12px;fill:#333}.axis text{fill:#777;font-size:11px}.axis line{stroke:#eee}
.lane:nth-child(odd) .bg{fill:#f6f7f9}.bar,.marker,[data-owner]{cursor:pointer}
.bar:focus,.marker:focus{outline:none}.dim{opacity:.12}.regline{stroke:#b00;stroke-dasharray:3 3}
.bar:hover .main,.bar:focus .main{stroke:#000;stroke-width:1.5}.legend .sel{font-weight:bold}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;margin:8px 0}.legend svg{vertical-align:middle}
table{border-collapse:collapse}th,td{padding:4px 10px;border-bottom:1px solid #eee}
th{text-align:left;background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:6px 8px;z-index:9;
border-radius:4px;white-space:pre;font-size:12px;max-width:70ch;overflow:hidden}"""

_JS = ("(function(){var d=document,tip=d.getElementById('tip'),sel=null;function show(el,x,y){"
       "tip.textContent=el.getAttribute('data-tip');tip.hidden=false;tip.style.left=Math.max(0,"
       "Math.min(x+14,innerWidth-tip.offsetWidth-4))+'px';tip.style.top=Math.max(0,Math.min(y+14,"
       "innerHeight-tip.offsetHeight-4))+'px';}function at(t){return t&&t.closest?t.closest("
       "'[data-tip]'):null;}d.addEventListener('mousemove',function(ev){var el=at(ev.target);"
       "if(el)show(el,ev.clientX,ev.clientY);else tip.hidden=true;});d.addEventListener('focusin',"
       "function(ev){var el=at(ev.target);if(el){var r=el.getBoundingClientRect();show(el,r.left,"
       "r.bottom);}});d.addEventListener('focusout',function(){tip.hidden=true;});"
       "var items=d.querySelectorAll('.legend [data-owner]');items.forEach(function(it){"
       "it.addEventListener('click',function(){var o=it.getAttribute('data-owner');"
       "sel=(sel===o)?null:o;items.forEach(function(i){i.classList.toggle('sel',"
       "i.getAttribute('data-owner')===sel);});d.querySelectorAll('.bar').forEach(function(b){"
       "b.classList.toggle('dim',sel!==null&&b.getAttribute('data-owner')!==sel);});});});"
       "d.documentElement.setAttribute('data-ready',String(d.querySelectorAll('.bar').length));"
       "})();")

# Marker glyphs around (0,0), no fonts needed: kind -> (legend label, SVG).
_SYMBOLS: dict[str, tuple[str, str]] = {k: (label, g.replace("'", '"')) for k, label, g in [
    ("rejected", "rejected claim", "<path d='M-4-4L4 4M4-4L-4 4' stroke='#d00' stroke-width='3'/>"),
    ("expired", "lease expired", "<circle r='5' fill='#fff' stroke='#e08a00' stroke-width='2'/>"
     "<path d='M0-3V0H2.5' stroke='#e08a00' stroke-width='1.5' fill='none'/>"),
    ("recovered", "recovered (stale claim taken over)",
     "<path d='M0-5L5 0L0 5L-5 0Z' fill='#1565c0' stroke='#fff'/>"),
    ("preempted", "preempted", "<path d='M-5-4H5L0 5Z' fill='#7b1fa2' stroke='#fff'/>"),
    ("handed_off", "handed off", "<path d='M-5-2H1V-5L6 0L1 5V2H-5Z' fill='#00897b'/>"),
    ("completed", "completed", "<circle r='5.5' fill='#2e7d32'/><path d='M-3 0L-1 2.5L3-2.5' "
     "stroke='#fff' stroke-width='1.8' fill='none'/>"),
    ("forced_release", "force-released", "<rect x='-4' y='-4' width='8' height='8' fill='#222'/>"),
    ("superseded", "superseded (lost a duplicate)", "<path d='M-5 0L0-5L5 0L0 5Z' fill='#fff' "
     "stroke='#555' stroke-width='2'/>"),
    ("reopened", "reopened", "<circle r='4.5' fill='#fff' stroke='#2e7d32' stroke-width='2'/>")]}


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSP = (f"default-src 'none'; style-src {_csp_hash(_CSS)}; script-src {_csp_hash(_JS)}; "
       "img-src data:; base-uri 'none'; form-action 'none'")


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _ticks(t0: float, t1: float) -> list[float]:
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, 604800)
    step = next((s for s in steps if (t1 - t0) / s <= 10), (t1 - t0) / 10)
    first = (t0 // step + 1) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


def _swatch(colour: str) -> str:
    return f'<svg width="14" height="14"><rect width="14" height="14" rx="3" fill="{colour}"/>' \
        "</svg>"


def _bar(h: Holding, x: Any, y: float, colour: str) -> str:
    xs = x(h.start_ts)
    xe = max(x(h.end_ts), xs + 2)
    xv = min(max(x(h.held_until), xs), xe)
    ended = {"held": "still held", "lapsed": "lease lapsed, nothing recorded yet"}.get(
        h.end_type, f"ended by #{h.end_seq} {h.end_type}")
    tip = "\n".join(filter(None, [
        f"{h.task}: {h.owner} (fence {h.fence})",
        f"from #{h.start_seq} {h.start_type} at {iso(h.start_ts)}",
        f"to {iso(h.end_ts)}: {ended}",
        f"by {h.end_actor}" if h.end_actor and h.end_actor != h.owner else "",
        f"reason: {h.end_reason}" if h.end_reason else "",
        f"lease valid for {duration(h.held_until - h.start_ts)}"
        + (f", stale from {iso(h.held_until)}" if h.held_until < h.end_ts else "")]))
    stale = (f'<rect x="{xv:.1f}" y="{y}" width="{xe - xv:.1f}" height="14" fill="url(#stale)"/>'
             if xe - xv >= 1 else "")
    return (f'<g class="bar{" open" if h.open else ""}" tabindex="0" data-task="{_e(h.task)}" '
            f'data-owner="{_e(h.owner)}" data-fence="{_e(h.fence)}" '
            f'data-start-seq="{h.start_seq}" data-end-seq="{_e(h.end_seq)}" '
            f'data-end-type="{_e(h.end_type)}" data-tip="{_e(tip)}"><title>{_e(tip)}</title>'
            f'<rect class="main" x="{xs:.1f}" y="{y}" width="{xe - xs:.1f}" height="14" rx="3" '
            f'fill="{colour}"/>{stale}</g>')


def render_html(
    events: Iterable[Event],
    *,
    title: str,
    generated_at: float,
    tasks: Collection[str] | None = None,
    since: float | None = None,
    until: float | None = None,
) -> str:
    """One self-contained HTML page: a timeline (a lane per task, a bar per holding coloured by
    owner, markers for rejections, expiries, recoveries, preemptions, hand-offs, completions...),
    a legend and a per-owner summary table. Pass the whole journal: ``tasks``, ``since`` and
    ``until`` select what is shown, so a holding granted before ``since`` is still drawn."""
    evs = list(events)
    hs = [h for h in holdings(evs, generated_at=generated_at)
          if (tasks is None or h.task in tasks)
          and (since is None or h.end_ts >= since) and (until is None or h.start_ts <= until)]
    ms = [m for m in markers(evs) if (tasks is None or m.task in tasks) and _in(m.ts, since, until)]
    regs = [(t, describe(e)) for e in evs if e.get("type") in REGISTRY_TYPES
            and (t := _num(e.get("ts"))) is not None and _in(t, since, until)]
    lanes: dict[str, int] = {}
    for _, task in sorted({(h.start_seq, h.task) for h in hs} | {(m.seq, m.task) for m in ms}):
        lanes.setdefault(task, len(lanes))
    times = [h.start_ts for h in hs] + [h.end_ts for h in hs] + [m.ts for m in ms]
    t0 = since if since is not None else min(times, default=generated_at)
    t1 = max(until if until is not None else max([*times, generated_at]), t0 + 1.0)
    label_w, chart_w, lane_h, top = 210, 940, 30, 26
    width, height = label_w + chart_w + 20, top + lane_h * max(1, len(lanes)) + 6

    def x(ts: float) -> float:
        return label_w + (min(max(ts, t0), t1) - t0) / (t1 - t0) * chart_w

    summary = owner_summary(evs, generated_at=generated_at, tasks=tasks, since=since, until=until)
    colours = owner_colours([h.owner for h in hs] + [s.owner for s in summary])
    fmt = "%H:%M:%S" if t1 - t0 < 600 else "%H:%M" if t1 - t0 < 86400 else "%m-%d %H:%M"
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'role="img" aria-label="timeline"><defs><pattern id="stale" width="6" height="6" '
           'patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" '
           'height="6" fill="#fff" opacity=".65"/></pattern>'
           + "".join(f'<g id="m-{k}">{g}</g>' for k, (_, g) in _SYMBOLS.items())
           + f'</defs><g class="axis"><text x="4" y="{top - 10}">task \\ time (UTC)</text>']
    for t in _ticks(t0, t1):
        label = datetime.fromtimestamp(t, tz=timezone.utc).strftime(fmt)
        svg.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top - 6}" y2="{height}"/>'
                   f'<text x="{x(t):.1f}" y="{top - 10}" text-anchor="middle">{label}</text>')
    svg.append('</g><g class="lanes">')
    for task, i in lanes.items():
        short = task if len(task) <= 30 else task[:29] + "…"
        svg.append(f'<g class="lane" data-task="{_e(task)}"><rect class="bg" y="{top + i * lane_h}"'
                   f' width="{width}" height="{lane_h}" fill="transparent"/><text x="6" '
                   f'y="{top + i * lane_h + 19}"><title>{_e(task)}</title>{_e(short)}</text></g>')
    svg.append('</g><g class="bars">')
    svg += [_bar(h, x, top + lanes[h.task] * lane_h + 8, colours[h.owner]) for h in hs]
    svg.append('</g><g class="markers">')
    last: dict[str, float] = {}
    for m in ms:
        mx, prev = x(m.ts), last.get(m.task)
        if prev is not None and 0 <= prev + 9 - mx <= 27:  # nudge coinciding markers apart
            mx = prev + 9
        last[m.task] = mx
        svg.append(f'<g class="marker" tabindex="0" data-kind="{m.kind}" data-seq="{m.seq}" '
                   f'data-task="{_e(m.task)}" data-tip="{_e(m.detail)}" transform="translate('
                   f'{mx:.1f},{top + lanes[m.task] * lane_h + 15})"><title>{_e(m.detail)}</title>'
                   f'<use href="#m-{m.kind}"/></g>')
    svg.append("</g>")
    svg += [f'<line class="regline" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{height}" '
            f'data-tip="{_e(d)}"><title>{_e(d)}</title></line>' for t, d in regs]
    svg.append("</svg>")
    used = {m.kind for m in ms}
    legend = ('<div class="legend" aria-label="owners">'
              + "".join(f'<span data-owner="{_e(o)}" title="click to highlight">'
                        f"{_swatch(c)} {_e(o)}</span>" for o, c in colours.items())
              + '</div><div class="legend" aria-label="markers">'
              + "".join(f'<span data-kind="{k}"><svg width="14" height="14"><use href="#m-{k}" '
                        f'transform="translate(7,7)"/></svg> {label}</span>'
                        for k, (label, _) in _SYMBOLS.items() if k in used)
              + '<span><svg width="14" height="14"><rect width="14" height="14" fill="#999"/>'
              '<rect width="14" height="14" fill="url(#stale)"/></svg> '
              "hatched: lease ran out, not yet taken over</span></div>")
    rows = "".join(
        f"<tr><td>{_swatch(colours[s.owner])} {_e(s.owner)}</td><td class=\"n\">{s.claims}</td>"
        f'<td class="n">{s.completions}</td><td class="n">{s.recoveries}</td>'
        f'<td class="n">{s.lost}</td><td class="n">{s.rejected}</td>'
        f'<td class="n" data-seconds="{s.held_seconds:.3f}">{duration(s.held_seconds)}</td></tr>'
        for s in summary)
    queue = _queue_table(evs, tasks, since, until)
    window = ", ".join(filter(None, [
        f"tasks: {', '.join(sorted(tasks))}" if tasks is not None else "",
        f"since {iso(since)}" if since is not None else "",
        f"until {iso(until)}" if until is not None else ""])) or "whole journal"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{_CSS}</style></head>
<body><h1>{_e(title)}</h1>
<div class="meta">Generated {iso(generated_at)} · {len(evs)} events · {len(lanes)} tasks ·
{len(hs)} holdings · {_e(window)} · times in UTC · hover or focus a bar or marker for details</div>
{legend}{"" if hs or ms else "<p>No claims in this selection.</p>"}
<div class="chart">{"".join(svg)}</div>
<h2>Owners</h2><table><thead><tr><th>Owner</th><th>Claims</th><th>Completions</th>
<th>Recoveries</th><th>Lost leases</th><th>Rejected</th><th>Time held</th></tr></thead>
<tbody>{rows}</tbody></table>{queue}<div id="tip" hidden></div><script>{_JS}</script></body></html>
"""


def _queue_table(evs: list[Event], tasks: Collection[str] | None, since: float | None,
                 until: float | None) -> str:
    """The work queue's waits: per added task, how long it was pending (added to ready), how
    long it waited ready (to its first claim) and how long the work took (to completion)."""
    from ..core.queue import queue_times

    times = queue_times(evs)
    picked = [(t, row) for t, row in sorted(times.items(), key=lambda kv: (kv[1]["added"] or 0,
                                                                          kv[0]))
              if (tasks is None or t in tasks) and row["added"] is not None
              and _in(row["added"], None, until) and (since is None or max(
                  v for v in row.values() if v is not None) >= since)]
    if not picked:
        return ""

    def span(a: float | None, b: float | None) -> str:
        if a is None or b is None:
            return '<td class="n">—</td>'
        return f'<td class="n" data-seconds="{b - a:.3f}">{duration(b - a)}</td>'

    body = "".join(
        f"<tr><td>{_e(t)}</td><td>{iso(r['added'] or 0)}</td>"
        f"{span(r['added'], r['ready'])}{span(r['ready'], r['claimed'])}"
        f"{span(r['claimed'], r['completed'])}</tr>" for t, r in picked)
    return ('<h2>Work queue</h2><table class="queue"><thead><tr><th>Task</th><th>Added</th>'
            "<th>Pending (to ready)</th><th>Ready (to claimed)</th><th>Worked (to completed)"
            f"</th></tr></thead><tbody>{body}</tbody></table>")


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
