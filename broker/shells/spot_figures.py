"""What spot interruptions did to a run, read from its journal: for ``broker status``,
``broker report`` (text and JSON) and the metrics.

- ``notices``: two-minute notices an agent read (``instance.interruption_notice``);
- ``interruptions``: spot instances EC2 took back (``instance.interrupted``);
- ``attempts_interrupted``: attempts ended by either (journal outcome ``interrupted``), of
  which ``requeued_at_notice`` were stopped at the notice because they could not end in time;
- ``lost_work_s``: the run time those attempts had run, thrown away;
- ``fallback_tasks``: tasks interrupted on spot that were done on an on-demand instance or a
  private node; ``spot_cost_usd`` / ``on_demand_cost_usd``: what each market's instances cost.

None for a run that rented no spot instance and saw no interruption.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from broker.shells.journal import JOURNAL_FILE

SPOT_SUFFIX = "@spot"  # broker.core.model.spot_key


def spot_figures(journal: Any, run_dir: Path, cost_by_type_usd: dict[str, float] | None = None) -> dict[str, Any] | None:
    notices = journal.events("instance.interruption_notice")
    interrupted = journal.events("instance.interrupted")
    at_notice = [f for _, _, f in journal.events("task.interrupted") if f.get("cause") == "spot_notice"]
    db = sqlite3.connect(f"file:{(Path(run_dir) / JOURNAL_FILE).resolve().as_posix()}?mode=ro", uri=True)
    try:
        types = dict(db.execute("SELECT id, type FROM instances").fetchall())
        rows = db.execute("SELECT task_id, node, outcome, started_at, ended_at FROM attempts "
                          "WHERE outcome IN ('interrupted', 'ok')").fetchall()
    finally:
        db.close()
    spot_nodes = {i for i, t in types.items() if str(t).endswith(SPOT_SUFFIX)}
    if not spot_nodes and not notices and not interrupted:
        return None
    lost = [r for r in rows if r[2] == "interrupted"]
    interrupted_tasks = {r[0] for r in lost}
    fallback = {r[0] for r in rows if r[2] == "ok" and r[0] in interrupted_tasks and r[1] not in spot_nodes}
    by_type = cost_by_type_usd or {}
    return {
        "spot_instances": len(spot_nodes),
        "notices": len(notices),
        "interruptions": len(interrupted),
        "attempts_interrupted": len(lost),
        "requeued_at_notice": len(at_notice),
        "lost_work_s": round(sum(max(0.0, (e or s or 0.0) - (s or 0.0)) for _, _, _, s, e in lost), 3),
        "fallback_tasks": len(fallback),
        "spot_cost_usd": round(sum(v for k, v in by_type.items() if k.endswith(SPOT_SUFFIX)), 6),
        "on_demand_cost_usd": round(sum(v for k, v in by_type.items() if not k.endswith(SPOT_SUFFIX)), 6),
    }


def spot_line(spot: dict[str, Any] | None, fmt_duration: Any) -> str | None:
    """One line for the text report and status."""
    if not spot:
        return None
    return (f"spot: {spot['interruptions']} interruption(s) of {spot['spot_instances']} spot instance(s), "
            f"{spot['notices']} notice(s) read; {spot['attempts_interrupted']} attempt(s) interrupted "
            f"({spot['requeued_at_notice']} re-queued at the notice), {fmt_duration(spot['lost_work_s'])} of work "
            f"lost; {spot['fallback_tasks']} task(s) finished on the on-demand fallback "
            f"(on-demand ${spot['on_demand_cost_usd']:.4f}, spot ${spot['spot_cost_usd']:.4f})")
