"""``fleetclaims brief``: a short, current picture of the registry for an agent's context.

Who holds what, what is stale, what this owner holds and must renew soon, and the exact
commands to use: shell commands, or for an agent on the MCP server (``tools=True``) the tool
calls it can make. Kept short on purpose (an agent's context is precious): lists are capped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._reads import lease_left
from ..core.durations import format_duration, relative

if TYPE_CHECKING:
    from ..api import Registry
    from ..core.model import Claim, Now

SHOWN = 15  # entries per section; the rest are counted, not listed
RENEW_AT = 1 / 3  # renew once less than this share of the TTL is left (what `hold`/`run` do)


def _entry(c: Claim, clocks: Now, stale: str | None) -> dict[str, Any]:
    left = lease_left(c.expires_at, c.boot_deadline, c.deadline_boot, clocks)
    left = None if left is None else round(left, 1)
    renew = (stale is None and left is not None and c.ttl is not None
             and left < c.ttl * RENEW_AT)
    return {"task": c.task, "owner": c.owner, "fence": c.fence, "phase": c.phase,
            "expires_in": left, "ttl": c.ttl, "note": c.note, "stale": stale,
            "renew_now": renew, "paths": list(c.paths), "shared_paths": list(c.shared_paths)}


def build(reg: Registry, owner: str | None, now: float, *, tools: bool = False,
          ) -> dict[str, Any]:
    """The brief as data (``--json``); :func:`render` turns it into text. ``tools``: the
    actions as MCP tool calls instead of shell commands. ``now`` is the time of the brief;
    the time left of each lease is told by the store's clocks, those that decide expiry (on
    the boot that set a deadline, the boot clock: a wall-clock step does not move it)."""
    mine, others, stale = [], [], []
    clocks = reg.store.now()
    for c in reg.claims(include_expired=True):
        why = reg.is_stale(c)
        e = _entry(c, clocks, why)
        if owner is not None and c.owner == owner:
            mine.append(e)
        elif why is not None:
            stale.append(e)
        else:
            others.append(e)
    me = owner or "YOU"
    ready = [{"task": t.task, "priority": t.priority, "labels": list(t.labels),
              "title": t.title} for t in reg.ready()]
    commands = TOOL_CALLS if tools else {
        "claim-next": f"fleetclaims claim-next --owner {me} --ttl 10m   # the best ready task",
        "claim": f"fleetclaims claim TASK --owner {me} --ttl 10m",
        "run": f"fleetclaims run TASK --owner {me} -- CMD ARGS...",
        "renew": "fleetclaims renew TASK --token $FLEETCLAIMS_TOKEN",
        "complete": "fleetclaims complete TASK --token $FLEETCLAIMS_TOKEN",
        "release": "fleetclaims release TASK --token $FLEETCLAIMS_TOKEN",
        "recover": f"fleetclaims recover TASK --owner {me} --reason '...'",
        "explain": "fleetclaims explain TASK",
    }
    return {"registry": str(reg.location), "owner": owner, "generated_at": now,
            "mine": mine, "held_by_others": others, "stale": stale, "ready": ready,
            "queue": reg.stats().queue, "commands": commands, "tools": tools}


#: what an agent on the MCP server can call (its owner is fixed; the server keeps tokens)
TOOL_CALLS = {
    "claim_next": "claim_next(ttl=600, wait=300)   # the best ready task; waits up to 5 min",
    "claim": "claim(task='TASK', ttl=600)",
    "renew": "renew(task='TASK')   # the server renews while you work; after a long pause, too",
    "complete": "complete(task='TASK', result={'pr': 17})",
    "release": "release(task='TASK')   # stop without finishing",
    "handoff": "handoff(task='TASK', to_owner='OTHER', note='...')",
    "transition": "transition(task='TASK', phase='review')   # parked: no lease to renew",
    "recover": "recover(task='TASK', reason='...')   # only a stale claim",
    "add": "add(task='TASK', title='...', description='...', depends_on=['OTHER'])",
    "explain": "explain(task='TASK')",
}


def render(doc: dict[str, Any]) -> str:
    """The brief as text: a few lines an agent can read at the start of its turn."""
    now = doc["generated_at"]
    owner = doc["owner"]
    tools = bool(doc.get("tools"))
    more_claims = "call claims" if tools else "fleetclaims claims"
    lines = [f"fleetclaims brief ({doc['registry']})"]

    def section(title: str, entries: list[dict[str, Any]], show_owner: bool) -> None:
        if not entries:
            return
        lines.append("")
        lines.append(title)
        for e in entries[:SHOWN]:
            who = f" {e['owner']}" if show_owner else ""
            if e["stale"] is not None:
                when = f"STALE: {e['stale']}"
            elif e["expires_in"] is None:
                when = "parked (no expiry)"
            else:
                when = "expires " + relative(now + e["expires_in"], now)
                if e["renew_now"] and not show_owner:  # only your own to renew
                    when += " - RENEW NOW"
            note = f' "{e["note"]}"' if e["note"] else ""
            lines.append(f"  {e['task']}{who} (fence {e['fence']}, {e['phase']}) {when}{note}")
            if e.get("paths") or e.get("shared_paths"):  # files the claim reserved (#23)
                shared = [f"{p} (shared)" for p in e.get("shared_paths") or []]
                lines.append(f"    paths: {', '.join([*e.get('paths', []), *shared])}")
        if len(entries) > SHOWN:
            lines.append(f"  ... and {len(entries) - SHOWN} more ({more_claims})")

    if owner is not None:
        mine = doc["mine"]
        if mine:
            ttls = sorted({e["ttl"] for e in mine if e["ttl"]})
            every = f" (every {format_duration(ttls[0] * RENEW_AT)} or sooner)" if ttls else ""
            section(f"You ({owner}) hold {len(mine)}; renew each before it expires{every}:",
                    mine, show_owner=False)
        else:
            lines.append("")
            lines.append(f"You ({owner}) hold nothing.")
    section("Held by others - do not work on these:", doc["held_by_others"], show_owner=True)
    section("Stale - may be taken over with recover:", doc["stale"], show_owner=True)
    if not (doc["mine"] or doc["held_by_others"] or doc["stale"]):
        lines.append("No live claims: every task is free.")
    if doc["queue"]:
        counts = ", ".join(f"{n} {k}" for k, n in doc["queue"].items() if n)
        lines.append("")
        take = "claim_next()" if tools else "`fleetclaims claim-next`"
        lines.append(f"Work queue ({counts}); take the next with {take}:")
        for t in doc["ready"][:SHOWN]:
            labels = f" [{', '.join(t['labels'])}]" if t["labels"] else ""
            title = f": {t['title']}" if t.get("title") else ""
            lines.append(f"  {t['task']} (priority {t['priority']}){labels}{title}")
        if len(doc["ready"]) > SHOWN:
            lines.append(f"  ... and {len(doc['ready']) - SHOWN} more ready "
                         f"({'call ready' if tools else 'fleetclaims ready'})")
    lines.append("")
    lines.append("Tool calls:" if tools else "Commands:")
    width = max(len(k) for k in doc["commands"])
    for name, command in doc["commands"].items():
        lines.append(f"  {name.ljust(width)}  {command}")
    return "\n".join(lines)
