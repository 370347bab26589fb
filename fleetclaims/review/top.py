"""``fleetclaims top``: a live view of the registry in the terminal.

Held tasks with owner, phase and time left (with a bar), who is waiting for them, and the
latest events; redrawn when the journal grows (polled: a read of only the new journal bytes)
and every second for the clocks. Keys: ``o`` next owner filter, ``l`` next label filter,
``c`` clear filters, ``q`` quit. Not a terminal (a pipe, a file): one plain-text snapshot.
``NO_COLOR`` (any non-empty value) turns colour off.

Plain ANSI and the standard library (termios, select), imported only by this command, so no
other command pays for it. ``render`` is a pure function of a ``Model`` (tested directly);
``Watcher`` keeps the model up to date from a Registry; ``run`` is the terminal loop."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._reads import lease_left
from ..core import events as ev
from ..core.model import Now
from .facts import duration

if TYPE_CHECKING:
    from ..api import Registry

RECENT = 200  # events kept for the "recent" pane
HISTORY = 5000  # events read at start: enough for the recent pane and the current waiters


@dataclass(frozen=True, slots=True)
class Held:
    """One held task as the view shows it."""

    task: str
    owner: str
    phase: str
    claimed_at: float
    expires_at: float | None  # None: parked (no deadline)
    ttl: float | None
    stale: bool  # lease ran out (or marked stale) and nobody took it over yet
    labels: tuple[str, ...] = ()
    waiters: tuple[str, ...] = ()  # owners refused since it was granted
    boot_deadline: float | None = None  # the deadline on the boot clock of deadline_boot
    deadline_boot: str = ""

    def left(self, now: Now | float) -> float | None:
        """Seconds of lease left (None: parked), told by the clock that decides expiry
        (_reads.lease_left: the boot clock on the boot that set the deadline)."""
        return lease_left(self.expires_at, self.boot_deadline, self.deadline_boot, now)


@dataclass
class Model:
    """What the view shows: held tasks, recent events (ts, type, owner, task, narration) and
    the filters."""

    location: str
    seq: int = 0
    held: list[Held] = field(default_factory=list)
    recent: deque[tuple[float, str, str, str, str]] = field(
        default_factory=lambda: deque(maxlen=RECENT))
    owner: str | None = None
    label: str | None = None
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task -> labels

    def owners(self) -> list[str]:
        return sorted({h.owner for h in self.held} | {r[2] for r in self.recent if r[2]})

    def all_labels(self) -> list[str]:
        return sorted({lb for lbs in self.labels.values() for lb in lbs})

    def cycle(self, key: str) -> None:
        """``o``/``l``: the next owner/label filter (after the last one: none); ``c``: none."""
        if key == "c":
            self.owner = self.label = None
            return
        choices: list[str] = self.owners() if key == "o" else self.all_labels()
        current = self.owner if key == "o" else self.label
        nxt = (choices[choices.index(current) + 1] if current in choices
               and choices.index(current) + 1 < len(choices) else None)
        if current is None and choices:
            nxt = choices[0]
        if key == "o":
            self.owner = nxt
        else:
            self.label = nxt


class Style:
    """SGR colour codes, or nothing (NO_COLOR, not a terminal)."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and text else text


def _bar(left: float, ttl: float | None, width: int) -> str:
    if ttl is None or ttl <= 0:
        return " " * width
    full = round(width * max(0.0, min(1.0, left / ttl)))
    return "█" * full + "░" * (width - full)


def _left(h: Held, now: Now | float, style: Style, width: int) -> str:
    left = h.left(now)
    if left is None:
        return style("parked".ljust(10), "36") + " " * width
    if h.stale or left <= 0:
        return style(f"-{duration(-left)}".ljust(10), "31;1") + style(" stale".ljust(width), "31")
    code = "32" if h.ttl is None or left > h.ttl / 3 else "33"
    return style(duration(left).ljust(10), code) + style(_bar(left, h.ttl, width), code)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def render(model: Model, now: Now | float, *, width: int = 100, height: int = 30,
           colour: bool = False, tty: bool = True) -> list[str]:
    """The screen as lines (each at most ``width`` visible characters); ``now``: the clocks
    (a wall-clock time alone tells the leases by the wall clock)."""
    st = Style(colour)
    held = [h for h in model.held if (model.owner is None or h.owner == model.owner)
            and (model.label is None or model.label in h.labels)]
    waiting = sum(len(h.waiters) for h in held)
    filters = ", ".join(f for f in (model.owner and f"owner={model.owner}",
                                    model.label and f"label={model.label}") if f) or "all"
    clock = time.strftime("%H:%M:%S", time.gmtime(now.wall if isinstance(now, Now) else now))
    lines = [_fit(f"fleetclaims top · {model.location} · {clock} UTC · seq {model.seq}",
                  width),
             _fit(f"{len(held)} held · {sum(h.stale for h in held)} stale · {waiting} waiting"
                  f" · filter: {filters}", width), ""]
    bar_w = 12
    tw = max(12, min(40, width - 70))
    who_w = max(0, width - (tw + 14 + 9 + 10 + bar_w + 4))  # what is left: the waiters
    lines.append(st(f"{'TASK':<{tw}} {'OWNER':<14} {'PHASE':<9} {'LEFT':<10}{'':<{bar_w}} "
                    "WAITING", "1"))
    # On a screen, held rows leave room for a few recent events; in a snapshot, all of them.
    room = max(3, height - 8 - min(8, len(model.recent))) if tty else max(1, len(held))
    for h in sorted(held, key=lambda h: (not h.stale, h.expires_at or float("inf"), h.task))[
            :room]:
        lines.append(f"{_fit(h.task, tw):<{tw}} {_fit(h.owner, 14):<14} {_fit(h.phase, 9):<9} "
                     f"{_left(h, now, st, bar_w)} "
                     + st(_fit(", ".join(h.waiters), who_w), "33"))
    if len(held) > room:
        lines.append(f"… {len(held) - room} more")
    if not held:
        lines.append("(nothing held)")
    recent = [r for r in model.recent if (model.owner is None or model.owner == r[2])
              and (model.label is None or model.label in model.labels.get(r[3], ()))]
    lines += ["", st("RECENT", "1")]
    for ts, kind, _, _, text in list(recent)[-(max(1, height - len(lines) - 2) if tty else 10):]:
        code = {ev.CLAIM_REJECTED: "31", ev.LEASE_EXPIRED: "31", ev.CLAIM_RECOVERED: "35",
                ev.CLAIM_COMPLETED: "32"}.get(kind, "")
        lines.append(_fit(time.strftime("%H:%M:%S ", time.gmtime(ts)) + text, width)
                     if not code else time.strftime("%H:%M:%S ", time.gmtime(ts))
                     + st(_fit(text, width - 9), code))
    if tty:
        lines.append(st("keys: o owner · l label · c clear · q quit", "2"))
    return lines


class Watcher:
    """Keeps a Model up to date from a Registry: new events after a cursor, and the held
    claims whenever the journal moved."""

    def __init__(self, reg: Registry, location: str) -> None:
        self.reg = reg
        self.model = Model(location)
        # Start near the head: a million-event journal is not replayed to draw a screen.
        self.cursor = max(0, reg.stats().seq - HISTORY)
        self.refused: dict[str, dict[str, float]] = {}  # task -> owner -> last refusal

    def now(self) -> Now:
        """The clocks of the registry's store (those that decide expiry)."""
        return self.reg.store.now()

    def poll(self) -> bool:
        """Read what was appended; True when anything was."""
        moved = self._appeared()
        while True:
            page = self.reg.events(after=self.cursor, limit=10_000)
            for e in page.events:
                self._event(e.data)
            moved = moved or bool(page.events)
            self.cursor = page.next_cursor
            if not page.more:
                break
        if moved or not self.model.held:
            self._held()
        return moved

    def _appeared(self) -> bool:
        """A default registry that no write had created when top started is shown empty (see
        cli.args.reader); once a write creates it, it is read from then on. True then."""
        from ..store.memory import MemoryStore

        location = str(self.reg.location)
        if not isinstance(self.reg.store, MemoryStore) or not os.path.isabs(location):
            return False
        from .._open import REGISTRY_MARKERS

        try:
            if not set(os.listdir(location)) & set(REGISTRY_MARKERS):
                return False
        except OSError:  # not there yet
            return False
        from ..api import Registry

        self.reg = Registry(location, create=False)
        self.cursor = max(0, self.reg.stats().seq - HISTORY)
        return True

    def _event(self, e: dict[str, Any]) -> None:
        kind, task = str(e.get("type")), e.get("task")
        self.model.seq = int(e.get("seq", self.model.seq))
        if kind == ev.LEASE_RENEWED:
            return  # heartbeats would crowd out everything else
        if isinstance(task, str):
            if kind == ev.CLAIM_REJECTED:
                self.refused.setdefault(task, {})[str(e.get("owner"))] = float(e["ts"])
            elif kind in ev.GRANTS or kind in ev.ENDS:
                self.refused.pop(task, None)
        self.model.recent.append((float(e.get("ts", 0.0)), kind, str(e.get("owner") or ""),
                                  task if isinstance(task, str) else "", ev.narrate(e)))

    def _held(self) -> None:
        labels = {t.task.task: t.task.labels for t in self.reg.tasks()}
        self.model.labels = labels
        now = self.now()
        held = []
        for c in self.reg.claims(include_expired=True):
            left = lease_left(c.expires_at, c.boot_deadline, c.deadline_boot, now)
            held.append(Held(c.task, c.owner, c.phase, c.claimed_at, c.expires_at, c.ttl,
                             c.state == "expired" or (left is not None and left <= 0),
                             labels.get(c.task, ()), tuple(sorted(self.refused.get(c.task, {}))),
                             c.boot_deadline, c.deadline_boot))
        self.model.held = held


def document(reg: Registry, location: str) -> dict[str, Any]:
    """``top --json``: the same view as one JSON document (held tasks, recent events)."""
    watcher = Watcher(reg, location)
    watcher.poll()
    m = watcher.model
    return {"location": location, "seq": m.seq,
            "held": [{"task": h.task, "owner": h.owner, "phase": h.phase,
                      "claimed_at": h.claimed_at, "expires_at": h.expires_at, "ttl": h.ttl,
                      "stale": h.stale, "labels": list(h.labels), "waiters": list(h.waiters)}
                     for h in m.held],
            "recent": [{"ts": ts, "type": kind, "owner": owner or None, "task": task or None,
                        "text": text} for ts, kind, owner, task, text in m.recent]}


def snapshot(watcher: Watcher, now: Now | float, write: Callable[[str], Any], width: int,
             colour: bool) -> None:
    """The plain-text fallback: one snapshot, no cursor movement."""
    watcher.poll()
    write("\n".join(render(watcher.model, now, width=width, colour=colour, tty=False)) + "\n")


def run(reg: Registry, location: str, *, owner: str | None = None, label: str | None = None,
        interval: float = 0.25, once: bool = False, in_fd: int = 0, out_fd: int = 1,
        environ: dict[str, str] | None = None) -> int:
    """The command: a live view on a terminal, one snapshot otherwise (or with ``once``)."""
    env = os.environ if environ is None else environ
    colour = not env.get("NO_COLOR") and os.isatty(out_fd) and env.get("TERM") != "dumb"
    watcher = Watcher(reg, location)
    watcher.model.owner, watcher.model.label = owner, label

    def write(text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(out_fd, data):]

    size = _size(out_fd)
    if once or not os.isatty(out_fd) or not os.isatty(in_fd):
        snapshot(watcher, watcher.now(), write, size[0], colour)
        return 0
    return _live(watcher, in_fd, out_fd, write, interval, colour)


def _size(fd: int) -> tuple[int, int]:
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        cols, rows = 100, 30
    return max(40, cols), max(10, rows)


def _live(watcher: Watcher, in_fd: int, out_fd: int, write: Callable[[str], None],
          interval: float, colour: bool) -> int:
    import select
    import termios
    import tty

    saved = termios.tcgetattr(in_fd)
    tty.setcbreak(in_fd)
    write("\x1b[?1049h\x1b[?25l")  # the alternate screen, cursor hidden: restored on exit
    try:
        last_draw = 0.0
        dirty = True
        while True:
            dirty = watcher.poll() or dirty
            now = watcher.now()
            if dirty or now.wall - last_draw >= 1.0:
                cols, rows = _size(out_fd)
                lines = render(watcher.model, now, width=cols, height=rows, colour=colour)
                write("\x1b[H" + "".join(line + "\x1b[K\r\n" for line in lines[:rows - 1])
                      + "\x1b[J")
                last_draw, dirty = now.wall, False
            ready, _, _ = select.select([in_fd], [], [], interval)
            if ready:
                key = os.read(in_fd, 32).decode("utf-8", "replace")
                if "q" in key or "\x03" in key or not key:
                    return 0
                for k in key:
                    if k in "olc":
                        watcher.model.cycle(k)
                        dirty = True
    except KeyboardInterrupt:
        return 0
    finally:
        write("\x1b[?25h\x1b[?1049l")
        termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
