"""The timeline: a lane per task over the selected period, as a static SVG (what a reader
sees with scripts off, and the first paint) and as compact data the page's script redraws
from when the reader zooms, pans or filters (``report.js`` mirrors the drawing rules here).

Drawing rule, per lane: holdings are individual bars when each starts at least 3 px after the
one before, else occupancy bands (per 3 px bucket: the owner who held it longest, shaded by
how much of the bucket was held); markers are individual glyphs when there are few, else
density bands (per 4 px bucket: the count, coloured by the most frequent kind)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from typing import Any

from ..core import events as ev
from . import facts
from .facts import Holding, Marker, duration, iso

LABEL_W, CHART_W, LANE_H, OVERVIEW_H, TOP = 230, 940, 30, 54, 26
WIDTH = LABEL_W + CHART_W + 12
BAR_MIN_PX, OCC_PX, DENS_PX = 3, 3, 4
MAX_GLYPHS = CHART_W // 10  # more markers than this in one lane: a density band
STATIC_LANES = 120  # lanes in the static SVG; the script shows the rest on demand

# Kinds of marks: "granted" (a bar's start) counts in densities but has no glyph.
KINDS = ("granted", "rejected", "expired", "recovered", "preempted", "handed_off", "completed",
         "forced_release", "superseded", "reopened", "paths_reserved", "paths_released")
KIND_COLOURS = {"granted": "#90a4ae", "rejected": "#d32f2f", "expired": "#e08a00",
                "recovered": "#1565c0", "preempted": "#7b1fa2", "handed_off": "#00897b",
                "completed": "#2e7d32", "forced_release": "#222222", "superseded": "#616161",
                "reopened": "#66bb6a", "paths_reserved": "#5d4037",
                "paths_released": "#a1887f"}

# Marker glyphs around (0,0), no fonts needed: kind -> (legend label, SVG).
SYMBOLS: dict[str, tuple[str, str]] = {k: (label, g.replace("'", '"')) for k, label, g in [
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
    ("reopened", "reopened", "<circle r='4.5' fill='#fff' stroke='#2e7d32' stroke-width='2'/>"),
    ("paths_reserved", "paths reserved", "<rect x='-4.5' y='-3.5' width='9' height='7' "
     "fill='#5d4037'/>"),
    ("paths_released", "paths released", "<rect x='-4.5' y='-3.5' width='9' height='7' "
     "fill='#fff' stroke='#a1887f' stroke-width='2'/>")]}
# How a holding ended, as the script's data numbers it: still open, or the ending event's type.
END_TYPES = ("held", "lapsed", *sorted((facts.END_TYPES | facts.GRANT_TYPES
                                        | {ev.CLAIM_SUPERSEDED}) - {ev.CLAIM_CREATED}))


@dataclass(frozen=True, slots=True)
class Lane:
    """One task's row: its holdings and markers in the selection, and how contended it was."""

    task: str
    holdings: list[Holding]
    markers: list[Marker]
    refusals: int
    lost: int
    first: float

    @property
    def contention(self) -> int:
        return self.refusals + 2 * self.lost + max(0, len({h.owner for h in self.holdings}) - 1)


def build_lanes(hs: Iterable[Holding], ms: Iterable[Marker]) -> list[Lane]:
    """Lanes, most contended first (refusals, losses, owners), then busiest, then by name."""
    by_task: dict[str, tuple[list[Holding], list[Marker]]] = {}
    for h in hs:
        by_task.setdefault(h.task, ([], []))[0].append(h)
    for m in ms:
        by_task.setdefault(m.task, ([], []))[1].append(m)
    out = []
    for task, (th, tm) in by_task.items():
        refusals = sum(m.kind == "rejected" for m in tm)
        lost = sum(m.kind in ("expired", "recovered", "preempted", "forced_release", "superseded")
                   for m in tm)
        first = min([h.start_ts for h in th[:1]] + [m.ts for m in tm[:1]])
        out.append(Lane(task, th, tm, refusals, lost, first))
    out.sort(key=lambda ln: (-ln.contention, -(len(ln.holdings) + len(ln.markers)), ln.task))
    return out


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def ticks(t0: float, t1: float) -> list[float]:
    """About ten round instants between t0 and t1."""
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, 604800)
    step = next((s for s in steps if (t1 - t0) / s <= 10), (t1 - t0) / 10)
    first = (t0 // step + 1) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


class Scale:
    """Time to x: the period [t0, t1] onto the chart's width, clamped at both ends."""

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 1.0)
        self.k = CHART_W / (self.t1 - self.t0)

    def __call__(self, ts: float) -> float:
        return LABEL_W + (min(max(ts, self.t0), self.t1) - self.t0) * self.k

    def bucket(self, ts: float, px: int) -> int:
        return min(CHART_W // px - 1, max(0, int((ts - self.t0) * self.k / px)))


def _bar(h: Holding, x: Scale, y: float, colour: str) -> str:
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


def _occupancy(hs: list[Holding], x: Scale) -> tuple[list[dict[str, float]], list[int]]:
    """Per 3 px bucket: seconds held per owner (an instant holding counts a sliver, so it
    shows), and how many holdings start in it."""
    n = CHART_W // OCC_PX
    width = (x.t1 - x.t0) / n
    held: list[dict[str, float]] = [{} for _ in range(n)]
    starts = [0] * n
    for h in hs:
        a, b = max(h.start_ts, x.t0), min(h.end_ts, x.t1)
        if b < a:
            continue
        i, j = x.bucket(a, OCC_PX), x.bucket(b, OCC_PX)
        starts[i] += 1
        for k in range(i, j + 1):
            lo, hi = max(a, x.t0 + k * width), min(b, x.t0 + (k + 1) * width)
            d = held[k]
            d[h.owner] = d.get(h.owner, 0.0) + max(hi - lo, width * 0.05)
    return held, starts


def _occupancy_bands(hs: list[Holding], x: Scale, y: float, colours: Mapping[str, str]) -> str:
    """Too many bars for the pixels: per 3 px bucket, the owner who held it longest, shaded by
    how much of the bucket was held (4 levels); a run of equal buckets is one band."""
    held, starts = _occupancy(hs, x)
    n, width = len(held), (x.t1 - x.t0) / len(held)
    keys: list[tuple[str, int] | None] = []
    for d in held:
        if not d:
            keys.append(None)
            continue
        owner = max(sorted(d), key=lambda o: d[o])
        keys.append((owner, min(4, math.ceil(4 * min(1.0, sum(d.values()) / width)))))
    out, k = [], 0
    while k < n:
        key = keys[k]
        end = k + 1
        while end < n and keys[end] == key:
            end += 1
        if key is not None:
            tip = (f"{hs[0].task}: {sum(starts[k:end])} holdings from {iso(x.t0 + k * width)} "
                   f"to {iso(x.t0 + end * width)}, mostly {key[0]}")
            out.append(f'<rect class="occ" x="{LABEL_W + k * OCC_PX}" y="{y}" '
                       f'width="{(end - k) * OCC_PX}" height="14" fill="{colours[key[0]]}" '
                       f'opacity="{0.25 + 0.1875 * key[1]}"><title>{_e(tip)}</title></rect>')
        k = end
    return "".join(out)


def _glyphs(ms: list[Marker], x: Scale, y: float) -> str:
    out, last = [], -1e9
    for m in ms:
        mx = x(m.ts)
        if 0 <= last + 9 - mx <= 27:  # nudge coinciding markers apart
            mx = last + 9
        last = mx
        out.append(f'<g class="marker" tabindex="0" data-kind="{m.kind}" data-seq="{m.seq}" '
                   f'data-task="{_e(m.task)}" data-tip="{_e(m.detail)}" transform="translate('
                   f'{mx:.1f},{y})"><title>{_e(m.detail)}</title><use href="#m-{m.kind}"/></g>')
    return "".join(out)


def density(points: Iterable[tuple[float, str]], x: Scale, px: int) -> list[dict[str, int]]:
    """Counts per kind in each ``px``-wide bucket of the chart."""
    counts: list[dict[str, int]] = [{} for _ in range(CHART_W // px)]
    for ts, kind in points:
        if x.t0 <= ts <= x.t1:
            d = counts[x.bucket(ts, px)]
            d[kind] = d.get(kind, 0) + 1
    return counts


def _dominant(d: Mapping[str, int]) -> str:
    return max(sorted(d), key=lambda k: (d[k], -KINDS.index(k) if k in KINDS else 0))


def density_bars(counts: list[dict[str, int]], x: Scale, bottom: float, height: float,
                 px: int, label: str) -> str:
    """A bar per non-empty bucket, its height by the log of its count, coloured by its most
    frequent kind; the tooltip lists the counts."""
    peak = max((sum(d.values()) for d in counts), default=0)
    out = []
    for i, d in enumerate(counts):
        if not d:
            continue
        n = sum(d.values())
        h = max(2.0, height * math.log1p(n) / math.log1p(peak))
        when = x.t0 + i * px / x.k
        tip = (f"{label}: {n} events from {iso(when)} over {duration(px / x.k)}\n"
               + ", ".join(f"{c} {k.replace('_', ' ')}" for k, c in
                           sorted(d.items(), key=lambda kv: -kv[1])))
        out.append(f'<rect class="dens" x="{LABEL_W + i * px}" y="{bottom - h:.1f}" '
                   f'width="{px - 0.5}" height="{h:.1f}" fill="{KIND_COLOURS.get(_dominant(d))}">'
                   f"<title>{_e(tip)}</title></rect>")
    return "".join(out)


def _lane(lane: Lane, i: int, x: Scale, y0: float, colours: Mapping[str, str]) -> str:
    y = y0 + i * LANE_H
    short = lane.task if len(lane.task) <= 32 else lane.task[:31] + "…"
    parts = [f'<g class="lane" data-task="{_e(lane.task)}"><rect class="bg" y="{y}" '
             f'width="{WIDTH}" height="{LANE_H}"/><text x="6" y="{y + 19}"><title>'
             f"{_e(lane.task)}</title>{_e(short)}</text>"]
    hs = lane.holdings
    if len(hs) <= CHART_W // 6 and all(x(b.start_ts) - x(a.start_ts) >= BAR_MIN_PX
                                       for a, b in itertools.pairwise(hs)):
        parts += [_bar(h, x, y + 5, colours[h.owner]) for h in hs]
    else:
        parts.append(_occupancy_bands(hs, x, y + 5, colours))
    ms = [m for m in lane.markers if x.t0 <= m.ts <= x.t1]
    if len(ms) <= MAX_GLYPHS:
        parts.append(_glyphs(ms, x, y + 12))
    else:
        counts = density(((m.ts, m.kind) for m in ms), x, DENS_PX)
        parts.append(density_bars(counts, x, y + LANE_H - 1, 9, DENS_PX, lane.task))
    parts.append("</g>")
    return "".join(parts)


def svg(lanes: list[Lane], x: Scale, colours: Mapping[str, str],
        overview: list[dict[str, int]], registry: list[tuple[float, str]]) -> str:
    """The static timeline: axis, an overview of every selected task's events, then the first
    ``STATIC_LANES`` lanes."""
    shown = lanes[:STATIC_LANES]
    y0 = TOP + OVERVIEW_H
    height = y0 + LANE_H * max(1, len(shown)) + 6
    span = x.t1 - x.t0
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{WIDTH}" '
           f'height="{height}" role="img" aria-label="timeline"><defs><pattern id="stale" '
           'width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
           '<rect width="3" height="6" fill="#fff" opacity=".65"/></pattern>'
           + "".join(f'<g id="m-{k}">{g}</g>' for k, (_, g) in SYMBOLS.items())
           + f'</defs><g class="axis"><text x="4" y="{TOP - 10}">task \\ time (UTC)</text>']
    for t in ticks(x.t0, x.t1):
        label = datetime.fromtimestamp(t, tz=timezone.utc).strftime(fmt)
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP - 6}" y2="{height}"/>'
                   f'<text x="{x(t):.1f}" y="{TOP - 10}" text-anchor="middle">{label}</text>')
    out.append(f'</g><g class="overview"><text x="6" y="{TOP + 22}">all {len(lanes)} tasks</text>'
               f'<text x="6" y="{TOP + 38}" class="sub">events per {duration(DENS_PX / x.k)}'
               "</text>" + density_bars(overview, x, TOP + OVERVIEW_H - 6, OVERVIEW_H - 12,
                                        DENS_PX, "all tasks") + '</g><g class="lanes">')
    out += [_lane(lane, i, x, y0, colours) for i, lane in enumerate(shown)]
    out.append("</g>")
    out += [f'<line class="regline" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{height}" '
            f'data-tip="{_e(d)}"><title>{_e(d)}</title></line>' for t, d in registry
            if x.t0 <= t <= x.t1]
    out.append("</svg>")
    return "".join(out)


def data(lanes: list[Lane], x: Scale, owners: list[str], colours: Mapping[str, str],
         registry: list[tuple[float, str]]) -> dict[str, Any]:
    """The timeline as compact numbers for the page's script: times in units of a millionth
    of the period, delta-encoded within each lane, so a million events fit in a few MB.
    Holdings: start delta, length, valid length, owner index, end type index. Markers: time
    delta, kind index."""
    q = (x.t1 - x.t0) / 1_000_000
    own = {o: i for i, o in enumerate(owners)}
    ends = {t: i for i, t in enumerate(END_TYPES)}
    kinds = {k: i for i, k in enumerate(KINDS)}
    hcols, mcols = [], []
    for lane in lanes:
        flat: list[int] = []
        prev = 0
        for h in lane.holdings:
            s = round((h.start_ts - x.t0) / q)
            flat += [s - prev, round((h.end_ts - h.start_ts) / q),
                     round((h.held_until - h.start_ts) / q), own[h.owner], ends.get(h.end_type, 0)]
            prev = s
        hcols.append(flat)
        flat, prev = [], 0
        for m in lane.markers:
            s = round((m.ts - x.t0) / q)
            flat += [s - prev, kinds[m.kind]]
            prev = s
        mcols.append(flat)
    return {"t0": x.t0, "t1": x.t1, "q": q, "owners": owners,
            "colours": [colours[o] for o in owners], "kinds": list(KINDS),
            "kindColours": [KIND_COLOURS[k] for k in KINDS], "ends": list(END_TYPES),
            "tasks": [lane.task for lane in lanes], "first": [lane.first for lane in lanes],
            "contention": [lane.contention for lane in lanes], "h": hcols, "m": mcols,
            "reg": [[t, d] for t, d in registry], "static": min(len(lanes), STATIC_LANES)}

