"""Issue 6's crash test: SIGKILL the dry-run daemon at 50 points, resume after each kill.

Every other chain runs a faulty bag (a transient failure, a poison task, a task that always
times out) and has its agents SIGTERMed once while tasks run (issue 14): the poison and
timed-out tasks must end quarantined, every other task done once, and no run may hang.

The loop is ``bench/bench_crash.py``'s (read its docstring): chains of one run directory
each, killed once per phase (sampling, launching, dispatching, releasing) at an exact
kill point (``BROKER_CRASH_AT=<point>:<n>``: the daemon SIGKILLs itself right after the
n-th journal write, event or EC2 call of that name), resumed after every kill with the same
``broker run`` command, then finished. Each ``broker run`` is forked from a warm server
(bench_crash.use_fork_server) so that 70-odd runs do not each pay the imports; the process
killed is still the daemon itself.

Checked per chain, from the journal, the run's moto server and the process table: every
task done and recorded exactly once (one ``task.done`` event each, none re-run after its
counted attempt ended), no instance of the run's tag alive in moto, no journal row left
unterminated, no agent process left, no intent left open, committed spend after the last
resume at least what it was at every kill, and attempts re-attached across the chains.

Wall time: about 2 minutes on 2 shared cores (4 chains at once, ~2.5 s per kill point).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bench_crash as bc  # noqa: E402

KILL_POINTS = 50


def test_fifty_kill_points_lose_duplicate_and_orphan_nothing(tmp_path):
    bc.use_fork_server()
    summary = bc.crash_loop(KILL_POINTS, tmp_path, parallel=4)
    report = "\n".join(
        f"chain {c.index}: kills {[p for _, p in c.kills]} not reached {c.not_reached} lost {c.lost} "
        f"duplicates {c.duplicates} reruns {c.reruns} orphans moto {c.orphans_moto} journal {c.orphans_journal} "
        f"agents {c.orphans_agents} intents {c.open_intents} spend {c.spend_at_kills} -> {c.spend_final} "
        f"faulty {c.faulty} sigterms {c.agent_sigterms} wrongly quarantined {c.quarantined_wrongly} "
        f"error {c.error}"
        for c in summary.chains
    )
    assert not [c for c in summary.chains if c.error], report
    assert summary.kills >= KILL_POINTS, report
    # The kill points really are spread over the run's phases.
    phases = summary.by_phase()
    assert phases.pop("failing") >= 1, report  # a phase only the faulty chains have
    assert all(n >= KILL_POINTS // 8 for n in phases.values()), (summary.by_phase(), report)
    faulty = [c for c in summary.chains if c.faulty]
    assert faulty and summary.total("agent_sigterms") > 0, report  # agents were SIGTERMed mid-run
    assert sum(len(c.kills) for c in faulty) >= KILL_POINTS // 3, report
    assert summary.total("tasks") == sum(8 if c.faulty else 10 for c in summary.chains)
    assert summary.total("lost") == 0, report
    assert summary.total("quarantined_wrongly") == 0, report  # the poison and timed-out tasks, and no other
    assert summary.total("duplicates") == 0 and summary.total("reruns") == 0, report
    assert summary.total("orphans_moto") == 0 and summary.total("orphans_journal") == 0, report
    assert summary.total("orphans_agents") == 0 and summary.total("open_intents") == 0, report
    assert summary.total("spend_decreases") == 0, report
    assert all(c.spend_final > 0 for c in summary.chains), report  # every chain rented instances
    assert summary.total("reattached") > 0, report
    print(f"\n{report}\n{summary.kills} kill points in {len(summary.chains)} chains, {summary.wall_s:.0f} s "
          f"({summary.wall_s / summary.kills:.2f} s per point), by phase {summary.by_phase()}")
