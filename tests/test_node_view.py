"""Each private node in ``broker status`` (human and --json), ``broker report`` (human and
--json) and the metrics (issue 18, item 5): slots, running, done, state (starting / waiting
/ up / away / rejoined / lost / refused) and when its agent was last heard from, all read from
the journal by :mod:`broker.shells.node_view`. Before, a run showed "fleet 0 alive" while its
private nodes worked, and a refused or lost node showed nowhere but the events."""

from __future__ import annotations

import json
import sqlite3

import pytest

from broker.cli import main
from broker.cli.status import render, snapshot, status_document
from broker.core.model import Task
from broker.shells.journal import AttemptResult, Journal
from broker.shells.metrics import JournalCollector

NODES = ("h0", "h1", "h2", "h3", "h4", "h5")


def _journal(run_dir, *, finished: bool = False) -> None:
    with Journal.open(run_dir) as journal:
        journal.create_run("r1", goal_kind="theta", goal_value=1.0, retries=0, at_s=0.0)
        journal.add_tasks([Task("t0", "echo 0"), Task("t1", "echo 1")])
        for name in NODES:
            journal.record_private_node(name, slots=2, speed=1.0, cost_per_hour=0.0, at_s=0.0)
        for name in ("h0", "h2", "h4", "h5"):
            journal.record_event("node.ready", {"node": name, "at_s": 1.0, "slots": 2}, at_s=1.0)
        journal.record_event("node.unreachable", {"node": "h1", "reason": "no route to host", "grace_s": 600.0},
                             at_s=1.5)
        journal.record_event("node.lost", {"node": "h3", "reason": "could not start its agent: host key for "
                                           "10.0.0.4:22 is not in known_hosts", "refused": True}, at_s=1.5)
        journal.record_event("node.away", {"node": "h2", "reason": "silent for 20 s", "running": 0,
                                           "grace_s": 600.0}, at_s=10.0)
        journal.record_event("agent.reattached", {"node": "h2", "reason": "its link is back"}, at_s=15.0)
        journal.record_event("node.away", {"node": "h4", "reason": "silent for 20 s", "running": 0,
                                           "grace_s": 10.0}, at_s=5.0)
        journal.record_event("node.lost", {"node": "h4", "reason": "not reached again within its grace"}, at_s=20.0)
        journal.record_event("node.away", {"node": "h5", "reason": "silent for 20 s", "running": 0,
                                           "grace_s": 600.0}, at_s=25.0)
        journal.task_started("t0", 1, "h0", at_s=2.0)
        journal.task_started("t1", 1, "h2", at_s=3.0)
        journal.task_finished("t1", 1, AttemptResult(exit_code=0, runtime_s=4.0), node="h2", at_s=7.0)
        journal.record_heard({"h0": 28.0, "h2": 27.0, "h4": 4.0, "h5": 5.0})
        journal.record_heard({"h0": 20.0})  # an older word never moves it back
        if finished:
            journal.task_finished("t0", 1, AttemptResult(exit_code=0, runtime_s=30.0), node="h0", at_s=32.0)
            journal.record_heard({"h0": 32.0})
            journal.finish_run("finished", at_s=33.0)


EXPECTED = {  # node: (state, running, done, last heard s ago at 30 s, reason shown)
    "h0": ("up", 1, 0, 2.0, None),
    "h1": ("waiting", 0, 0, None, "no route to host"),
    "h2": ("rejoined", 0, 1, 3.0, None),
    "h3": ("refused", 0, 0, None, "could not start its agent: host key for 10.0.0.4:22 is not in known_hosts"),
    "h4": ("lost", 0, 0, 26.0, "not reached again within its grace"),
    "h5": ("away", 0, 0, 25.0, "silent for 20 s"),
}


def test_status_json_lists_every_private_node_with_its_state_and_last_word(tmp_path):
    _journal(tmp_path)
    with Journal.open(tmp_path, readonly=True) as journal:
        document = status_document(journal, tmp_path, wall_now_s=30.0)
    rows = {n["node"]: n for n in document["node_list"]}
    assert list(rows) == list(NODES)
    for name, (state, running, done, ago, reason) in EXPECTED.items():
        n = rows[name]
        assert (n["state"], n["running"], n["done"], n["last_heard_ago_s"], n["reason"], n["slots"]) == \
            (state, running, done, ago, reason, 2), name
    assert rows["h0"]["last_heard_s"] == 28.0 and rows["h2"]["since_s"] == 15.0 and rows["h4"]["since_s"] == 20.0
    json.dumps(document)  # one JSON object


def test_status_shows_a_node_table_and_why_each_node_that_is_not_up_is_not(tmp_path):
    _journal(tmp_path)
    with Journal.open(tmp_path, readonly=True) as journal:
        text = render(snapshot(journal, 30.0), tmp_path)
    assert "nodes  6 private nodes: 1 waiting, 1 up, 1 away, 1 rejoined, 1 lost, 1 refused" in text, text
    table = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  h") and ":" not in line}
    assert table["h0"] == ["up", "2", "1", "2s", "ago"]
    assert table["h3"][:4] == ["refused", "2", "0", "never"]
    assert "  h3 refused: could not start its agent: host key for 10.0.0.4:22 is not in known_hosts" in text
    assert "  h1 waiting: no route to host" in text and "  h4 lost: not reached again within its grace" in text


def test_the_report_lists_each_node_in_json_and_in_words(tmp_path, capsys):
    _journal(tmp_path, finished=True)
    assert main(["report", str(tmp_path), "--json"]) == 0
    rows = {n["node"]: n for n in json.loads(capsys.readouterr().out)["nodes"]["list"]}
    assert {k: (v["state"], v["done"]) for k, v in rows.items()} == {
        "h0": ("up", 1), "h1": ("waiting", 0), "h2": ("rejoined", 1), "h3": ("refused", 0), "h4": ("lost", 0),
        "h5": ("away", 0)}
    assert rows["h0"]["last_heard_ago_s"] == 1.0  # at the run's end (33 s), not at the wall clock's now
    assert main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "node h0: up, 2 slots, 1 task done, last heard 1s before the end" in text, text
    assert "node h3: refused, 2 slots, 0 tasks done, never heard from" in text
    assert "node refused: h3 at 2s (could not start its agent: host key for 10.0.0.4:22" in text, text
    assert "node lost: h4 at 20s (not reached again within its grace)" in text
    assert "finished on 3 of the 6 private nodes it was given (h1 never reached, h3 refused, h4 lost)" in text


def test_metrics_have_per_node_gauges_labelled_by_node(tmp_path):
    pytest.importorskip("prometheus_client")
    _journal(tmp_path)
    collector = JournalCollector(tmp_path, now_s=lambda: 30.0)
    try:
        families = {f.name: f for f in collector.collect()}
    finally:
        collector.close()
    samples = {name: {tuple(sorted(s.labels.items())): s.value for s in families[name].samples}
               for name in ("broker_node_slots", "broker_node_running", "broker_node_state",
                            "broker_node_last_heard_seconds")}
    assert samples["broker_node_slots"][(("node", "h1"),)] == 2
    assert samples["broker_node_running"][(("node", "h0"),)] == 1
    assert samples["broker_node_last_heard_seconds"] == {(("node", "h0"),): 2.0, (("node", "h2"),): 3.0,
                                                         (("node", "h4"),): 26.0, (("node", "h5"),): 25.0}
    on = {dict(k)["node"]: dict(k)["state"] for k, v in samples["broker_node_state"].items() if v == 1.0}
    assert on == {name: state for name, (state, *_rest) in EXPECTED.items()}
    assert len(samples["broker_node_state"]) == 6 * 8  # every state of every node, one of them 1


def test_a_journal_written_before_heard_times_were_kept_reads_and_resumes(tmp_path):
    _journal(tmp_path)
    db = sqlite3.connect(tmp_path / "journal.sqlite")
    db.execute("DROP TABLE node_heard")
    db.commit()
    db.close()
    with Journal.open(tmp_path, readonly=True) as journal:
        assert journal.heard() == {}
        assert {n["node"]: n["last_heard_s"] for n in status_document(journal, tmp_path, 30.0)["node_list"]} == \
            dict.fromkeys(NODES)
    with Journal.open(tmp_path) as journal:  # opened to write (a resume): the table is made
        journal.record_heard({"h0": 31.0})
        assert journal.heard() == {"h0": 31.0}
