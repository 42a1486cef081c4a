"""Malformed input, one case per row: each must be refused with the right file, line, field
and reason, and with no other problem reported alongside it.

A case is an inventory (``inv.yaml``) or a bag (``bag.yaml``) written into a fresh folder,
with any side files it names; ``{key}`` in the text becomes the path of an SSH key file
created with ``key_mode`` permissions. ``where`` is the start of the rendered problem
(``file:line: field``) and ``reason`` a fragment of what follows it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from broker.config.bag import load_bag
from broker.config.errors import ConfigError
from broker.config.inventory import load_inventory

TYPE = "{name: t, slots: 1, speed: 1, price: 1, limit: 1}"
LOCAL = "{name: n, local: true, slots: 1}"
SWEEP_BAG = "command: 'run {x}'\nsweep: {x: [1, 2]}\n"


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "inventory" or "bag"
    text: str
    where: str
    reason: str
    files: dict[str, str] = field(default_factory=dict)
    live: bool = False
    key_mode: int | None = None
    count: int = 1


def inv(id: str, text: str, where: str, reason: str, **kw) -> Case:
    return Case(id, "inventory", text, where, reason, **kw)


def bag(id: str, text: str, where: str, reason: str, **kw) -> Case:
    return Case(id, "bag", text, where, reason, **kw)


CASES = [
    # -- YAML itself ----------------------------------------------------------------------
    inv("yaml-bad-indent", "private:\n  - name: a\n   slots: 2\n", "inv.yaml:3", "malformed YAML at column 4"),
    inv("yaml-tab", "private:\n\t- {name: a}\n", "inv.yaml:2", "found character '\\t' that cannot start any token"),
    inv("yaml-unclosed-flow", "aws:\n  types: [" + TYPE + "\n", "inv.yaml:3", "malformed YAML"),
    inv("yaml-duplicate-key", f"private:\n  - {LOCAL}\nprivate: []\n", "inv.yaml:3", "duplicate key 'private' (first given on line 1)"),
    inv("yaml-two-documents", f"private: [{LOCAL}]\n---\naws: {{}}\n", "inv.yaml:2", "expected a single document"),
    bag("yaml-bag-unclosed-quote", "command: 'run {x}\ntimeout: 1m\n", "bag.yaml:3", "malformed YAML"),
    # -- inventory shape and keys ---------------------------------------------------------
    inv("inv-top-level-list", "- name: a\n", "inv.yaml:1", "expected a mapping of keys to values, got a list"),
    inv("inv-empty-file", "# nothing yet\n", "inv.yaml", "declares no private nodes and no EC2 types"),
    inv("inv-empty-lists", "private: []\naws:\n  types: []\n", "inv.yaml", "nothing could run a task"),
    inv("inv-unknown-top-key", f"privat: [{LOCAL}]\n", "inv.yaml:1: privat", "unknown key 'privat' (did you mean 'private'?)"),
    inv("inv-unknown-node-key", "private:\n  - name: a\n    local: true\n    slots: 1\n    sped: 2\n", "inv.yaml:5: private[0].sped", "(did you mean 'speed'?)"),
    inv("inv-unknown-type-key", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, prize: 1, price: 1, limit: 1}\n", "inv.yaml:3: aws.types[0].prize", "(did you mean 'price'?)"),
    inv("inv-missing-price", "aws:\n  types:\n    - name: t\n      slots: 1\n      speed: 1\n      limit: 1\n", "inv.yaml:3: aws.types[0].price", "missing required key 'price'"),
    inv("inv-types-not-a-list", f"aws:\n  types: {TYPE}\n", "inv.yaml:2: aws.types", "expected a list, got a mapping"),
    # -- inventory types and ranges -------------------------------------------------------
    inv("inv-slots-string", "private:\n  - {name: n, local: true, slots: '4'}\n", "inv.yaml:2: private[0].slots", "expected an integer >= 1, got the string '4'"),
    inv("inv-slots-float", "private:\n  - {name: n, local: true, slots: 2.5}\n", "inv.yaml:2: private[0].slots", "expected an integer >= 1, got 2.5"),
    inv("inv-slots-bool", "private:\n  - {name: n, local: true, slots: yes}\n", "inv.yaml:2: private[0].slots", "got true (a boolean)"),
    inv("inv-slots-zero", "aws:\n  types:\n    - {name: t, slots: 0, speed: 1, price: 1, limit: 1}\n", "inv.yaml:3: aws.types[0].slots", "expected an integer >= 1, got 0"),
    inv("inv-speed-bool", "private:\n  - {name: n, local: true, slots: 1, speed: true}\n", "inv.yaml:2: private[0].speed", "expected a number > 0, got true (a boolean)"),
    inv("inv-speed-zero", "aws:\n  types:\n    - {name: t, slots: 1, speed: 0, price: 1, limit: 1}\n", "inv.yaml:3: aws.types[0].speed", "expected a number > 0, got 0"),
    inv("inv-price-negative", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: -0.17, limit: 1}\n", "inv.yaml:3: aws.types[0].price", "expected a number >= 0, got -0.17"),
    inv("inv-price-string", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: '$0.17', limit: 1}\n", "inv.yaml:3: aws.types[0].price", "got the string '$0.17'"),
    inv("inv-price-nan", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: .nan, limit: 1}\n", "inv.yaml:3: aws.types[0].price", "expected a number >= 0, got nan"),
    inv("inv-limit-negative", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: -1}\n", "inv.yaml:3: aws.types[0].limit", "expected an integer >= 0, got -1"),
    inv("inv-cost-negative", "private:\n  - {name: n, local: true, slots: 1, cost_per_hour: -1}\n", "inv.yaml:2: private[0].cost_per_hour", "expected a number >= 0"),
    inv("inv-port-range", "private:\n  - {name: n, host: h.invalid, port: 70000, slots: 1}\n", "inv.yaml:2: private[0].port", "expected an integer from 1 to 65535, got 70000"),
    inv("inv-boot-bad-duration", "aws:\n  types:\n    - {name: t, slots: 1, speed: 1, price: 1, limit: 1, boot: 90 secs}\n", "inv.yaml:3: aws.types[0].boot", "expected a duration like 90s"),
    inv("inv-billing-typo", f"aws:\n  billing: hourley\n  types: [{TYPE}]\n", "inv.yaml:2: aws.billing", "unknown billing model 'hourley' (did you mean 'hourly'?)"),
    inv("inv-billing-no-unit", f"aws:\n  billing: {{minimum: 60s}}\n  types: [{TYPE}]\n", "inv.yaml:2: aws.billing.unit", "missing required key 'unit'"),
    inv("inv-billing-zero-unit", f"aws:\n  billing: {{unit: 0s}}\n  types: [{TYPE}]\n", "inv.yaml:2: aws.billing.unit", "must be longer than 0 seconds"),
    inv("inv-tag-not-string", f"aws:\n  tags:\n    cost-centre: 42\n  types: [{TYPE}]\n", "inv.yaml:3: aws.tags.cost-centre", "expected a string value, got 42 (quote it)"),
    # -- inventory consistency ------------------------------------------------------------
    inv("inv-duplicate-node", f"private:\n  - {LOCAL}\n  - {LOCAL}\n", "inv.yaml:3: private[1].name", "duplicate private node name 'n' (first used on line 2)"),
    inv("inv-duplicate-type", f"aws:\n  types:\n    - {TYPE}\n\n    - {TYPE}\n", "inv.yaml:5: aws.types[1].name", "duplicate EC2 type name 't' (first used on line 3)"),
    inv("inv-name-clash", "private:\n  - {name: t, local: true, slots: 1}\naws:\n  types: [" + TYPE + "]\n", "inv.yaml", "the name 't' is used by a private node and an EC2 type"),
    inv("inv-local-and-host", "private:\n  - name: n\n    local: true\n    host: h.invalid\n    slots: 1\n", "inv.yaml:4: private[0].host", "either local: true or host, not both"),
    inv("inv-neither-local-nor-host", "private:\n  - name: n\n    slots: 1\n", "inv.yaml:2: private[0]", "needs host: (reached over SSH) or local: true"),
    inv("inv-user-on-local-node", "private:\n  - {name: n, local: true, user: me, slots: 1}\n", "inv.yaml:2: private[0].user", "only apply to SSH nodes"),
    # -- live-only checks -----------------------------------------------------------------
    inv("live-missing-region", f"aws:\n  ami: ami-0\n  key_name: k\n  security_group: sg-0\n  types: [{TYPE}]\n", "inv.yaml:1: aws.region", "a live run that rents EC2 instances needs aws.region", live=True),
    inv("live-key-0644", "private:\n  - name: n\n    host: h.invalid\n    key: {key}\n    slots: 1\n", "inv.yaml:4: private[0].key", "accessible by group or others (mode 0644)", live=True, key_mode=0o644),
    inv("live-key-missing", "private:\n  - name: n\n    host: h.invalid\n    key: {key}.absent\n    slots: 1\n", "inv.yaml:4: private[0].key", "SSH key file not found", live=True, key_mode=0o600),
    # -- bag fields -----------------------------------------------------------------------
    bag("bag-top-level-string", "just a command\n", "bag.yaml:1", "expected a mapping of keys to values, got the string"),
    bag("bag-missing-timeout", SWEEP_BAG, "bag.yaml:1: timeout", "missing required key 'timeout'"),
    bag("bag-timeout-zero", SWEEP_BAG + "timeout: 0\n", "bag.yaml:3: timeout", "must be longer than 0 seconds, got 0"),
    bag("bag-timeout-words", SWEEP_BAG + "timeout: one hour\n", "bag.yaml:3: timeout", "expected a duration like 90s, 15m, 6h, 2d"),
    bag("bag-retries-negative", SWEEP_BAG + "timeout: 1m\nretries: -1\n", "bag.yaml:4: retries", "expected an integer >= 0, got -1"),
    bag("bag-unknown-key", SWEEP_BAG + "timeout: 1m\nretry: 3\n", "bag.yaml:4: retry", "unknown key 'retry' (did you mean 'retries'?)"),
    bag("bag-env-number", SWEEP_BAG + "timeout: 1m\nenv:\n  OMP_NUM_THREADS: 1\n", "bag.yaml:5: env.OMP_NUM_THREADS", "expected a string value, got 1 (quote it)"),
    bag("bag-env-bad-name", SWEEP_BAG + "timeout: 1m\nenv: {'MY-VAR': x}\n", "bag.yaml:4: env.MY-VAR", "not a valid environment variable name"),
    # -- bag task sources -----------------------------------------------------------------
    bag("bag-no-source", "timeout: 1m\n", "bag.yaml:1", "the bag names no tasks: give command + sweep, tasks_file, or csv"),
    bag("bag-two-sources", "tasks_file: a.txt\ncsv: b.csv\ntimeout: 1m\n", "bag.yaml:2: csv", "give only one task source; this bag has tasks_file and csv"),
    bag("bag-sweep-with-file", "tasks_file: a.txt\nsweep: {x: [1]}\ntimeout: 1m\n", "bag.yaml:2: sweep", "it does not apply to tasks_file"),
    bag("bag-command-without-sweep", "command: run it\ntimeout: 1m\n", "bag.yaml:1: sweep", "needs a sweep of the parameters"),
    bag("bag-missing-placeholder", "command: 'run {x} {seed}'\nsweep: {x: [1], sed: [1]}\ntimeout: 1m\n", "bag.yaml:1: command", "placeholder {seed} is not a sweep parameter (did you mean 'sed'?)", count=2),
    bag("bag-unused-parameter", "command: 'run {x}'\nsweep:\n  x: [1]\n  seed: {range: [1, 9]}\ntimeout: 1m\n", "bag.yaml:4: sweep.seed", "sweep parameter 'seed' is not used in the command"),
    bag("bag-positional-placeholder", "command: 'run {}'\nsweep: {x: [1]}\ntimeout: 1m\n", "bag.yaml:1: command", "positional placeholder {}"),
    bag("bag-unbalanced-brace", "command: 'run {x'\nsweep: {x: [1]}\ntimeout: 1m\n", "bag.yaml:1: command", "bad template: expected '}' before end of string"),
    bag("bag-format-fails", "command: 'run {x:d}'\nsweep: {x: [0.5]}\ntimeout: 1m\n", "bag.yaml:1: command", "cannot fill the template with x=0.5"),
    bag("bag-empty-values", "command: 'run {x}'\nsweep:\n  x: []\ntimeout: 1m\n", "bag.yaml:3: sweep.x", "the parameter has no values"),
    bag("bag-empty-range", "command: 'run {x}'\nsweep:\n  x: {range: [5, 5]}\ntimeout: 1m\n", "bag.yaml:3: sweep.x.range", "range [5, 5] is empty (stop is excluded)"),
    bag("bag-range-float", "command: 'run {x}'\nsweep:\n  x: {range: [0, 2.5]}\ntimeout: 1m\n", "bag.yaml:3: sweep.x.range[1]", "expected an integer, got 2.5"),
    bag("bag-linspace-count", "command: 'run {x}'\nsweep:\n  x: {linspace: [0, 1, 0]}\ntimeout: 1m\n", "bag.yaml:3: sweep.x.linspace[2]", "expected an integer >= 1, got 0"),
    bag("bag-nested-value", "command: 'run {x}'\nsweep:\n  x: [1, [2, 3]]\ntimeout: 1m\n", "bag.yaml:3: sweep.x[1]", "expected a number or a string, got a list"),
    bag("bag-sweep-too-big", "command: 'run {x} {y}'\nsweep:\n  x: {range: [0, 100000]}\n  y: {range: [0, 1000]}\ntimeout: 1m\n", "bag.yaml:2: sweep", "the sweep makes 100,000,000 tasks"),
    bag("bag-missing-tasks-file", "tasks_file: nowhere.txt\ntimeout: 1m\n", "bag.yaml:1: tasks_file", "file not found: nowhere.txt"),
    bag("bag-missing-csv", "timeout: 1m\ncsv: data/tasks.csv\n", "bag.yaml:2: csv", "file not found: data/tasks.csv"),
    bag("bag-empty-tasks-file", "tasks_file: c.txt\ntimeout: 1m\n", "bag.yaml:1: tasks_file", "the bag has no tasks: c.txt lists no commands", files={"c.txt": "# todo\n\n"}),
    bag("bag-csv-empty", "csv: t.csv\ntimeout: 1m\n", "t.csv:1", "the CSV file is empty", files={"t.csv": ""}),
    bag("bag-csv-only-header", "csv: t.csv\ntimeout: 1m\n", "bag.yaml:1: csv", "the bag has no tasks: t.csv lists no commands", files={"t.csv": "command\n"}),
    bag("bag-csv-no-command-column", "csv: t.csv\ntimeout: 1m\n", "t.csv:1: command", "missing the required column 'command' (the header has: cmd)", files={"t.csv": "cmd\necho\n"}, count=2),
    bag("bag-csv-unknown-column", "csv: t.csv\ntimeout: 1m\n", "t.csv:1: estimat_model", "(did you mean 'estimate_model'?)", files={"t.csv": "command,estimat_model\necho,1\n"}),
    bag("bag-csv-duplicate-id", "csv: t.csv\ntimeout: 1m\n", "t.csv:4: id", "duplicate task id 'a' (first on line 2)", files={"t.csv": "id,command\na,echo 1\nb,echo 2\na,echo 3\n"}),
    bag("bag-csv-estimate-text", "csv: t.csv\ntimeout: 1m\n", "t.csv:3: estimate_user", "expected an estimate in seconds (a number >= 0), got 'ten'", files={"t.csv": "command,estimate_user\necho 1,5\necho 2,ten\n"}),
    bag("bag-csv-estimate-negative", "csv: t.csv\ntimeout: 1m\n", "t.csv:2: estimate_user", "got '-5'", files={"t.csv": "command,estimate_user\necho 1,-5\n"}),
    bag("bag-csv-ragged-row", "csv: t.csv\ntimeout: 1m\n", "t.csv:3", "the row has 3 fields but the header has 2", files={"t.csv": "command,id\necho 1,a\necho 2,b,c\n"}),
    bag("bag-csv-empty-command", "csv: t.csv\ntimeout: 1m\n", "t.csv:2: command", "the command is empty", files={"t.csv": "command,estimate_m\n ,3\n"}),
]


def _load(case: Case, folder) -> None:
    text = case.text
    if case.key_mode is not None:
        key = folder / "id_key"
        key.write_text("not really a key\n")
        os.chmod(key, case.key_mode)
        text = text.replace("{key}", str(key))
    for name, content in case.files.items():
        (folder / name).write_text(content)
    if case.kind == "inventory":
        (folder / "inv.yaml").write_text(text)
        load_inventory("inv.yaml", live=case.live)
    else:
        (folder / "bag.yaml").write_text(text)
        load_bag("bag.yaml")


def test_the_table_is_large_and_its_ids_unique():
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_with_file_line_field_and_reason(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        _load(case, tmp_path)
    lines = [problem.render() for problem in exc.value.problems]
    matching = [line for line in lines if line.startswith(case.where + ":") and case.reason in line[len(case.where) :]]
    assert matching, f"no problem at {case.where!r} saying {case.reason!r}; got:\n" + "\n".join(lines)
    assert len(lines) == case.count, "unexpected extra problems:\n" + "\n".join(lines)
