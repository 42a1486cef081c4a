"""Each private node of a run as its journal tells it: slots, what it runs and ran, its state
and when its agent was last heard from. ``broker status`` (human and ``--json``), ``broker
report`` (human and ``--json``) and the metrics (:mod:`broker.shells.metrics`) all read it
from here, so they agree.

States (:data:`NODE_STATES`), from the node's events in order:

- ``starting``: its agent is being reached (no answer yet, no failure yet);
- ``waiting``: it did not answer at start and is tried again in the background for its grace
  (``node.unreachable``); the run waits for it;
- ``up``: its agent answered (``node.ready``) and has not been lost since;
- ``away``: it stopped answering; its tasks are held while it is reached again for its grace
  (``node.away``), or its agent is stopping (``node.down``);
- ``rejoined``: it came back after being away or lost (``agent.reattached``, ``node.ready``);
- ``lost``: given up (not reached within its grace, its setup failed; ``node.lost``);
- ``refused``: it refused us at start (a host key unknown or changed, our key refused, no key:
  ``node.lost`` with ``refused``), and was not retried;
- ``quarantined``: tasks kept failing there while they succeeded elsewhere.
"""

from __future__ import annotations

from typing import Any

NODE_STATES = ("starting", "waiting", "up", "away", "rejoined", "lost", "refused", "quarantined")
_EVENTS = ("node.unreachable", "node.ready", "agent.reattached", "node.away", "node.down", "node.lost",
           "node.setup_failed", "node.quarantined")
_GONE = ("away", "lost")


def _next_state(state: str, name: str, fields: dict[str, Any]) -> str:
    if name == "node.unreachable":
        return "waiting" if state in ("starting", "waiting") else state
    if name in ("node.ready", "agent.reattached"):
        if state in _GONE:
            return "rejoined"
        return "up" if state in ("starting", "waiting") else state
    if name in ("node.away", "node.down"):
        return "away"
    if name == "node.lost":
        return "refused" if fields.get("refused") else "lost"
    if name == "node.setup_failed":
        return "lost"
    return "quarantined"


def node_rows(journal: Any, now_s: float, start_s: float) -> list[dict[str, Any]]:
    """One row per private node: ``node``, ``slots``, ``running`` (attempts now), ``done``
    (tasks it ran to success), ``state``, ``since_s`` (when it entered that state) and
    ``last_heard_s`` (run seconds from the start; None if never heard), ``last_heard_ago_s``
    (seconds before ``now_s``), ``reason`` (why it is not up, when it is not)."""
    nodes = journal.private_nodes()
    if not nodes:
        return []
    state = {name: "starting" for name, _ in nodes}
    since = {name: 0.0 for name, _ in nodes}
    reason: dict[str, str | None] = {name: None for name, _ in nodes}
    events = sorted(((at, name, f) for name in _EVENTS for at, _, f in journal.events(name)), key=lambda e: e[0])
    for at, name, fields in events:
        node = fields.get("node")
        if node not in state:
            continue
        new = _next_state(state[node], name, fields)
        if new != state[node]:
            state[node], since[node] = new, round(at - start_s, 3)
        reason[node] = None if new in ("up", "rejoined") else str(fields.get("reason", name))
    running: dict[str, int] = {}
    for attempt in journal.running_attempts():
        running[attempt.node] = running.get(attempt.node, 0) + 1
    done, heard = journal.done_by_node(), journal.heard()
    rows = []
    for name, slots in nodes:
        at = heard.get(name)
        rows.append({"node": name, "slots": slots, "running": running.get(name, 0), "done": done.get(name, 0),
                     "state": state[name], "since_s": since[name],
                     "last_heard_s": None if at is None else round(at - start_s, 3),
                     "last_heard_ago_s": None if at is None else round(max(0.0, now_s - at), 3),
                     "reason": reason[name]})
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """``3 private nodes: 2 up, 1 lost``."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    parts = ", ".join(f"{counts[s]} {s}" for s in NODE_STATES if s in counts)
    return f"{len(rows)} private node{'s' if len(rows) != 1 else ''}: {parts}"
