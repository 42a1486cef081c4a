"""Bad input, one row per case: each is refused with a message naming what is wrong and where,
and nothing is launched or lost. Two kinds of row make up the one table (``ALL_ROWS``):

``CASES``: input files. A case is an inventory (``inv.yaml``) or a bag (``bag.yaml``)
written into a fresh folder, with any side files it names; ``{key}`` in the text becomes the
path of an SSH key file created with ``key_mode`` permissions. ``where`` is the start of the
rendered problem (``file:line: field``) and ``reason`` a fragment of what follows it; no other
problem may be reported alongside it.

``PROBES``: what only shows when the broker reaches out: SSH to a real sshd on 127.0.0.1
(closed port, wrong key, key permissions, unknown or changed host key), AWS (missing
credentials; unknown AMI or instance type under moto, through ``broker validate --live``),
a local worker agent (command not found, output of hundreds of MB, a missing working
directory), the CLI (refused before a run directory exists) and a full disk (a small tmpfs
in a private mount namespace). Each probe returns the message the user would see and what
it must name; the row's ``reason`` fragments must all be in it.
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
    inv("inv-port-range", "private:\n  - {name: n, host: h.invalid, key: /k, port: 70000, slots: 1}\n", "inv.yaml:2: private[0].port", "expected an integer from 1 to 65535, got 70000"),
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


# =========================================================================================
# Probes: bad input that only shows at run time
# =========================================================================================

import json  # noqa: E402 - the probes' imports are kept with the probes
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from broker.cli import main as cli_main  # noqa: E402
from broker.shells.ssh import SshError, SshTarget, connect  # noqa: E402
from tests.sshd import connects_to  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Seen:
    """What a probe saw: the message a user gets, and the place it must name."""

    message: str
    where: str


@dataclass(frozen=True)
class Probe:
    id: str
    kind: str  # "ssh", "aws", "agent", "cli" or "disk"
    run: Callable[["ProbeEnv"], Seen]
    reason: tuple[str, ...]


@dataclass
class ProbeEnv:
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    request: pytest.FixtureRequest
    capsys: pytest.CaptureFixture

    @property
    def sshd(self):
        return self.request.getfixturevalue("sshd")


def probe(id: str, kind: str, *reason: str):
    def register(run: Callable[[ProbeEnv], Seen]) -> Callable[[ProbeEnv], Seen]:
        PROBES.append(Probe(id, kind, run, reason))
        return run

    return register


PROBES: list[Probe] = []


# -- SSH ------------------------------------------------------------------------------------
def _ssh_failure(target: SshTarget) -> str:
    with pytest.raises(SshError) as refused:
        connect(target)
    return str(refused.value)


def _target(env: ProbeEnv, **overrides) -> SshTarget:
    server = env.sshd
    fields = dict(host=server.host, port=server.port, user=server.user, key_path=str(server.client_key_path),
                  known_hosts_path=str(server.known_hosts_path), connect_timeout_s=5.0)  # fmt: skip
    fields.update(overrides)
    return SshTarget(**fields)


def _keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True,
                   capture_output=True)  # fmt: skip
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@probe("ssh-unreachable-closed-port", "ssh", "cannot reach", "connection refused (is sshd running on that port?)")
def _(env: ProbeEnv) -> Seen:
    key = _keygen(env.tmp / "k")
    port = _closed_port()
    message = _ssh_failure(SshTarget(host="127.0.0.1", port=port, user="u", key_path=str(key), connect_timeout_s=5))
    return Seen(message, f"127.0.0.1:{port}")


@probe("ssh-key-not-authorized", "ssh", "refused key", "is its public half in", "authorized_keys")
def _(env: ProbeEnv) -> Seen:
    stranger = _keygen(env.tmp / "stranger")
    return Seen(_ssh_failure(_target(env, key_path=str(stranger))), f"127.0.0.1:{env.sshd.port} refused key {stranger}")


@probe("ssh-wrong-user", "ssh", "refused key", "for user 'no-such-user-here'")
def _(env: ProbeEnv) -> Seen:
    return Seen(_ssh_failure(_target(env, user="no-such-user-here")), f"127.0.0.1:{env.sshd.port}")


@probe("ssh-key-readable-by-others", "ssh", "permissions 0644", "are too open", "chmod 600")
def _(env: ProbeEnv) -> Seen:
    env.sshd.client_key_path.chmod(0o644)
    with connects_to(env.sshd.host, env.sshd.port) as attempts:
        message = _ssh_failure(_target(env))
    assert attempts == []  # refused before connecting
    return Seen(message, str(env.sshd.client_key_path))


@probe("ssh-key-readable-by-group", "ssh", "permissions 0640", "are too open")
def _(env: ProbeEnv) -> Seen:
    env.sshd.client_key_path.chmod(0o640)
    return Seen(_ssh_failure(_target(env)), str(env.sshd.client_key_path))


@probe("ssh-key-missing", "ssh", "does not exist")
def _(env: ProbeEnv) -> Seen:
    missing = env.tmp / "id_gone"
    return Seen(_ssh_failure(_target(env, key_path=str(missing))), f"private key {missing}")


@probe("ssh-key-garbage", "ssh", "is not a private key the broker can read")
def _(env: ProbeEnv) -> Seen:
    garbage = env.tmp / "garbage"
    garbage.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----\n")
    garbage.chmod(0o600)
    return Seen(_ssh_failure(_target(env, key_path=str(garbage))), str(garbage))


@probe("ssh-key-public-half-given", "ssh", "is not a private key the broker can read")
def _(env: ProbeEnv) -> Seen:
    public = Path(str(env.sshd.client_key_path) + ".pub")
    if not public.exists():
        public = _keygen(env.tmp / "mine").with_suffix(".pub")
    public.chmod(0o600)
    return Seen(_ssh_failure(_target(env, key_path=str(public))), str(public))


@probe("ssh-key-with-passphrase", "ssh", "is passphrase-protected", "without a passphrase")
def _(env: ProbeEnv) -> Seen:
    locked = _keygen(env.tmp / "locked", passphrase="correct horse battery")
    message = _ssh_failure(_target(env, key_path=str(locked)))
    assert "correct horse" not in message
    return Seen(message, str(locked))


@probe("ssh-unknown-host-key", "ssh", "is not in known_hosts", "Check that fingerprint", "ssh-keyscan -p")
def _(env: ProbeEnv) -> Seen:
    empty = env.tmp / "known_hosts"
    empty.write_text("")
    message = _ssh_failure(_target(env, known_hosts_path=str(empty)))
    assert empty.read_text() == ""  # nothing trusted behind the user's back
    assert "trust_on_first_use" not in message  # no inventory or CLI setting has that name
    return Seen(message, f"host key for 127.0.0.1:{env.sshd.port}")


@probe("ssh-unknown-host-key-by-default", "ssh", "is not in known_hosts (~/.ssh/known_hosts)")
def _(env: ProbeEnv) -> Seen:
    # The default target checks ~/.ssh/known_hosts and trusts nothing new: verified by default.
    home = env.tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    env.monkeypatch.setenv("HOME", str(home))
    server = env.sshd
    target = SshTarget(host=server.host, port=server.port, user=server.user, key_path=str(server.client_key_path))
    assert target.known_hosts_path is None and not target.trust_on_first_use
    message = _ssh_failure(target)
    assert not (home / ".ssh" / "known_hosts").exists()
    return Seen(message, f"host key for 127.0.0.1:{server.port}")


@probe("ssh-changed-host-key", "ssh", "does not match known_hosts", "check it, then fix the known_hosts entry")
def _(env: ProbeEnv) -> Seen:
    impostor = _keygen(env.tmp / "impostor")
    pinned = " ".join(impostor.with_suffix(".pub").read_text().split()[:2])
    known_hosts = env.tmp / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{env.sshd.port} {pinned}\n")
    message = _ssh_failure(_target(env, known_hosts_path=str(known_hosts), trust_on_first_use=True))
    return Seen(message, f"host key for 127.0.0.1:{env.sshd.port}")


@probe("ssh-node-without-key", "ssh", "has no key to log in with")
def _(env: ProbeEnv) -> Seen:
    from broker.core.model import PrivateNode

    with pytest.raises(ValueError) as refused:
        SshTarget.for_node(PrivateNode(name="lab-a", slots=1, host="127.0.0.1"))
    return Seen(str(refused.value), "private node 'lab-a'")


# -- AWS, through `broker validate --live` -------------------------------------------------
def _live_inventory(env: ProbeEnv, ami: str, type_name: str, group: str = "sg-0") -> Path:
    inventory = env.tmp / "inv.yaml"
    inventory.write_text(
        f"aws:\n  region: us-east-1\n  ami: {ami}\n  key_name: k\n  security_group: {group}\n"
        f"  types:\n    - {{name: {type_name}, slots: 2, speed: 1, price: 0.1, limit: 2}}\n"
    )
    return inventory


def _validate_live(env: ProbeEnv, inventory: Path) -> str:
    code = cli_main(["validate", str(inventory), "--live"])
    out, err = env.capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("warning: "))
    assert err.startswith("1 problem found; nothing was started:"), err
    return err


def _no_real_aws(env: ProbeEnv) -> None:
    from test_aws_fleet import isolate_from_real_aws

    isolate_from_real_aws(env.monkeypatch, env.tmp)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.monkeypatch.delenv(name, raising=False)


@probe("aws-missing-credentials", "aws", "aws: no AWS credentials found", "AWS_ACCESS_KEY_ID")
def _(env: ProbeEnv) -> Seen:
    _no_real_aws(env)
    env.monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # should a request leave, it goes nowhere
    inventory = _live_inventory(env, "ami-12345678", "m5.large")
    return Seen(_validate_live(env, inventory), f"{inventory}: aws")


def _with_moto(env: ProbeEnv, inventory_for: Callable[[str, str], Path]) -> tuple[str, Path]:
    """``inventory_for(ami, security_group)`` under moto, which holds that AMI, that group and the key pair k."""
    import boto3
    from moto import mock_aws

    _no_real_aws(env)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        env.monkeypatch.setenv(name, value)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        images = ec2.describe_images(
            Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
        ec2.create_key_pair(KeyName="k")
        group = ec2.create_security_group(GroupName="broker", Description="broker")["GroupId"]
        inventory = inventory_for(sorted(i["ImageId"] for i in images)[0], group)
        return _validate_live(env, inventory), inventory


@probe("aws-unknown-ami", "aws", "aws.ami: AMI 'ami-0badbadbadbadbad0' not found")
def _(env: ProbeEnv) -> Seen:
    message, inventory = _with_moto(env, lambda _real, sg: _live_inventory(env, "ami-0badbadbadbadbad0", "m5.large", sg))
    return Seen(message, str(inventory))


@probe("aws-unknown-instance-type", "aws", "aws.types.m5.lrage: instance type 'm5.lrage' is not offered in us-east-1")
def _(env: ProbeEnv) -> Seen:
    message, inventory = _with_moto(env, lambda real, sg: _live_inventory(env, real, "m5.lrage", sg))
    return Seen(message, str(inventory))


# -- a local worker agent ------------------------------------------------------------------
def _run_on_agent(env: ProbeEnv, run, *, max_output_bytes: int | None = None, timeout_s: float = 600.0):
    from broker.shells.agent_client import AgentClient
    from broker.shells.local_transport import attach_local_agent, stop_local_agent
    from tests.processes import agent_task_processes
    from workers.protocol import Result

    if max_output_bytes is not None:
        env.monkeypatch.setenv("BROKER_AGENT_MAX_OUTPUT_BYTES", str(max_output_bytes))
    state_dir = env.tmp / "agent"
    client = AgentClient(attach_local_agent(state_dir, 1, node="node-a", grace_s=1.0, progress_poll_s=0.05), "node-a")
    try:
        client.submit([run])
        # A guard against a hang, not a speed limit: a 200 MB flood on a loaded CI machine's disk
        # took over a minute once.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in client.poll(0.1):
                if isinstance(event, Result):
                    return event
        raise AssertionError(f"no result for {run.task} within {timeout_s} s")
    finally:
        client.close()
        stop_local_agent(state_dir, timeout_s=30.0)  # a loaded machine may take seconds to stop it
        assert agent_task_processes(state_dir) == []


def _failure_text(result) -> str:
    from broker.shells.daemon import failure_reason

    return f"{failure_reason(result, 'node-a')}\n{result.stderr_tail}"


@probe("agent-command-not-found", "agent", "exit code 127: command not found", "no-such-solver-v9: not found")
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    result = _run_on_agent(env, Run("t000001", 1, "no-such-solver-v9 --in data.txt"))
    assert result.exit_code == 127 and not result.ok
    assert Path(result.stderr_path).name == "t000001.1.stderr"  # the whole stderr is kept on the node
    return Seen(_failure_text(result), "on node node-a")


@probe("agent-command-not-executable", "agent", "exit code 126: command found but not executable", "Permission denied")
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    script = env.tmp / "solver.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = _run_on_agent(env, Run("t000002", 1, "./solver.sh", cwd=str(env.tmp)))
    assert result.exit_code == 126
    return Seen(_failure_text(result), "on node node-a")


@probe("agent-missing-workdir", "agent", "cannot enter the working directory", "No such file or directory")
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    workdir = env.tmp / "no" / "such" / "dir"
    result = _run_on_agent(env, Run("t000003", 1, "true", cwd=str(workdir)))
    assert result.exit_code is None and not result.ok
    return Seen(_failure_text(result), str(workdir))


@probe("agent-bad-output-cap-setting", "agent", "='lots'",
       "expected a number of bytes >= 0 (0: no cap)")  # fmt: skip
def _(env: ProbeEnv) -> Seen:
    from broker.shells.local_transport import AGENT_SCRIPT

    state_dir = env.tmp / "agent"
    done = subprocess.run([sys.executable, str(AGENT_SCRIPT), "serve", "--stdio", "--state-dir", str(state_dir),
                           "--slots", "1"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                          env={**os.environ, "BROKER_AGENT_MAX_OUTPUT_BYTES": "lots"})  # fmt: skip
    assert done.returncode == 2 and not state_dir.exists()  # refused before it could take a task
    return Seen(done.stderr, "agent.py: error: BROKER_AGENT_MAX_OUTPUT_BYTES")


CAP = 1_000_000


def _assert_capped_file(path: str, written: int) -> str:
    size = os.path.getsize(path)
    kept = Path(path).read_bytes()
    note = kept[CAP:].decode()
    assert CAP < size <= CAP + 400 and note.strip().startswith("[broker agent:")
    assert f"wrote {written:,} bytes" in note
    assert os.stat(path).st_blocks * 512 < 2 * CAP + (1 << 16)  # no hidden hundreds of MB
    return note


@probe("agent-output-200MB-to-dev-stdout", "agent", "stdout truncated: the task wrote 200,000,000 bytes",
       "the file keeps the first 1,000,000")  # fmt: skip
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    result = _run_on_agent(env, Run("flood", 1, "head -c 200000000 /dev/zero > /dev/stdout"), max_output_bytes=CAP)
    assert result.ok  # a chatty task is not a failed one
    _assert_capped_file(result.stdout_path, 200_000_000)
    log = (env.tmp / "agent" / "agent.log").read_text()
    assert "task 'flood' attempt 1: [broker agent: stdout truncated" in log
    return Seen(result.stdout_tail, "stdout")


@probe("agent-output-flood-keeps-head-and-tail", "agent", "stdout truncated: the task wrote 50,000,010 bytes")
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    command = "yes abcdefgh | head -c 50000000; echo last-line"
    result = _run_on_agent(env, Run("chatty", 1, command), max_output_bytes=CAP)
    kept = Path(result.stdout_path).read_bytes()
    assert kept.startswith(b"abcdefgh\nabcdefgh\n") and b"last-line" not in kept[:CAP]
    assert "last-line\n" in result.stdout_tail  # the tail is still the end of the output
    _assert_capped_file(result.stdout_path, 50_000_010)
    return Seen(result.stdout_tail, "stdout")


@probe("agent-stderr-flood", "agent", "stderr truncated: the task wrote 30,000,000 bytes", "exit code 3")
def _(env: ProbeEnv) -> Seen:
    from workers.protocol import Run

    result = _run_on_agent(env, Run("noisy", 1, "head -c 30000000 /dev/zero >&2; exit 3"), max_output_bytes=CAP)
    _assert_capped_file(result.stderr_path, 30_000_000)
    return Seen(_failure_text(result), "stderr")


# -- the CLI: refused before a run directory exists ----------------------------------------
def _refused_run(env: ProbeEnv, inventory: str, bag: str, *extra: str) -> str:
    run_dir = env.tmp / "run"
    env.monkeypatch.chdir(ROOT)
    code = cli_main(["run", "--dry-run", "--yes", "--inventory", inventory, bag, "--run-dir", str(run_dir), *extra])
    out, err = env.capsys.readouterr()
    assert code == 2, (code, out, err)
    assert not run_dir.exists()  # no journal, no agent, no instance
    return err


@probe("cli-run-bad-inventory", "cli", "private[0].slots: expected an integer >= 1, got 0", "nothing was started")
def _(env: ProbeEnv) -> Seen:
    inventory = env.tmp / "inv.yaml"
    inventory.write_text("private:\n  - {name: n, local: true, slots: 0}\n")
    return Seen(_refused_run(env, str(inventory), "examples/sweep.yaml"), f"{inventory}:2")


@probe("cli-run-empty-bag", "cli", "the bag has no tasks", "lists no commands")
def _(env: ProbeEnv) -> Seen:
    (env.tmp / "none.txt").write_text("# nothing yet\n")
    bag = env.tmp / "bag.yaml"
    bag.write_text("tasks_file: none.txt\ntimeout: 1m\n")
    return Seen(_refused_run(env, "inventory.yaml", str(bag)), f"{bag}:1: tasks_file")


@probe("cli-run-duplicate-task-ids", "cli", "duplicate task id 'a' (first on line 2)")
def _(env: ProbeEnv) -> Seen:
    (env.tmp / "t.csv").write_text("id,command\na,echo 1\na,echo 2\n")
    bag = env.tmp / "bag.yaml"
    bag.write_text("csv: t.csv\ntimeout: 1m\n")
    return Seen(_refused_run(env, "inventory.yaml", str(bag)), f"{env.tmp / 't.csv'}:3: id")


@probe("cli-run-bad-deadline", "cli", "expected a duration like 90s, 15m, 6h, 2d or seconds, got 'soonish'")
def _(env: ProbeEnv) -> Seen:
    return Seen(_refused_run(env, "inventory.yaml", "examples/sweep.yaml", "--deadline", "soonish"), "--deadline")


@probe("cli-run-zero-time-scale", "cli", "--time-scale: must be positive, got 0")
def _(env: ProbeEnv) -> Seen:
    return Seen(_refused_run(env, "inventory.yaml", "examples/sweep.yaml", "--time-scale", "0"), "broker run")


@probe("cli-validate-missing-files", "cli", "inventory file not found", "bag file not found")
def _(env: ProbeEnv) -> Seen:
    missing = env.tmp / "nope.yaml"
    assert cli_main(["validate", str(missing), str(env.tmp / "nobag.yaml")]) == 2
    return Seen(env.capsys.readouterr().err, str(missing))


# -- a full disk in the run directory ------------------------------------------------------
def _in_small_tmpfs(env: ProbeEnv, size: str, script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` (Python) with ``argv[1]`` a fresh tmpfs of ``size``, in a private mount
    namespace so that nothing outside the test sees it. Needs root or user namespaces; CI
    (CI=true) must be able to, elsewhere the probe is skipped with the reason."""
    mount_point = env.tmp / "small"
    mount_point.mkdir()
    unshare = shutil.which("unshare")
    prefix = [unshare, "--mount", "--propagation", "private"] if os.geteuid() == 0 else [unshare, "-r", "-m"]
    shell = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    argv = [*prefix, "sh", "-c", shell, "sh", size, str(mount_point), sys.executable, "-c", script,
            str(mount_point), *args]  # fmt: skip
    if unshare is None:
        result = None
    else:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    if result is None or "mount" in result.stderr.split(":")[0] or "unshare" in result.stderr.split(":")[0]:
        why = "no unshare(1)" if result is None else result.stderr.strip()
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the disk-full probes, but a private tmpfs cannot be mounted: {why}")
        pytest.skip(f"disk-full probe not run: a private tmpfs cannot be mounted here ({why})")
    return result


_JOURNAL_FILLS_UP = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from broker.shells.journal import Journal, JournalDiskFull
    small = Path(sys.argv[1])
    (small / "reserve").write_bytes(b"r" * 65536)  # freed afterwards, to read back
    journal = Journal.open(small / "run")
    journal.create_run("r1", goal_kind="theta", goal_value=1.0, budget_usd=None, deadline_s=None, retries=0,
                       inventory_path=None, bag_path=None, options={}, at_s=0.0)
    committed, message = 0, None
    try:
        while committed < 100000:
            journal.record_event("fill", {"i": committed, "pad": "p" * 3000}, at_s=float(committed))
            committed += 1
    except JournalDiskFull as exc:
        message = str(exc)
    journal.close()
    (small / "reserve").unlink()
    back = Journal.open(small / "run", readonly=True)
    kept = [fields["i"] for _, _, fields in back.events("fill")]
    print(json.dumps({"committed": committed, "message": message, "kept": kept}))
    """
)


@probe("disk-full-journal", "disk", "disk full in", "the change was rolled back", "everything committed before it is kept")
def _(env: ProbeEnv) -> Seen:
    result = _in_small_tmpfs(env, "400k", _JOURNAL_FILLS_UP)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["committed"] > 5 and seen["kept"] == list(range(seen["committed"]))  # nothing lost
    return Seen(seen["message"], f"disk full in {env.tmp / 'small' / 'run'}: could not write the journal")


_EVENTS_FILL_UP = textwrap.dedent(
    """
    import io, json, sys
    from pathlib import Path
    import structlog
    from broker.shells.logging import configure_logging
    small = Path(sys.argv[1])
    stderr = io.StringIO()
    with open(small / "events.jsonl", "a", encoding="utf-8") as events:
        configure_logging(stream=stderr, json=True, extra_files=[events])
        log = structlog.get_logger()
        for i in range(2000):
            log.info("fill", i=i, pad="p" * 1000)
    lines = (small / "events.jsonl").read_text().splitlines()
    parsed = [json.loads(line)["i"] for line in lines]  # every line whole
    print(json.dumps({"file": parsed, "stderr": stderr.getvalue().splitlines()}))
    """
)


@probe("disk-full-events-jsonl", "disk", "disk full in", "events.jsonl stops before this event",
       "every line written before is whole")  # fmt: skip
def _(env: ProbeEnv) -> Seen:
    result = _in_small_tmpfs(env, "128k", _EVENTS_FILL_UP)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    kept = seen["file"]
    assert 10 < len(kept) < 2000 and kept == list(range(len(kept)))
    stderr = [json.loads(line) for line in seen["stderr"]]
    assert [e["i"] for e in stderr if e["event"] == "fill"] == list(range(2000))  # stderr lost nothing
    (warning,) = [e for e in stderr if e["event"] == "log.disk_full"]
    assert warning["i"] == len(kept)  # the first event the file could not take
    return Seen(warning["message"], f"disk full in {env.tmp / 'small'}")


_DRY_RUN_FILLS_UP = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path
    small = Path(sys.argv[1])
    run_dir = small / "run"
    (small / "reserve").write_bytes(b"r" * 65536)
    cmd = [sys.executable, "-m", "broker", "run", "--dry-run", "--yes", "--inventory", "inventory.yaml",
           "examples/sweep.yaml", "--deadline", "10m", "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    (small / "reserve").unlink()
    from broker.shells.journal import Journal
    from tests.processes import agent_task_processes
    agents = sorted(str(p) for p in (run_dir / "agents").iterdir()) if (run_dir / "agents").exists() else []
    left = agent_task_processes([Path(a) for a in agents])
    alive = [a for a in agents if (Path(a) / "agent.pid").exists()]
    journal = Journal.open(run_dir, readonly=True)
    check = journal._db.execute("PRAGMA integrity_check").fetchone()[0]
    done_in_journal = sorted(t for _, _, f in journal.events("task.done") for t in [f["task"]])
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    print(json.dumps({"code": done.returncode, "stderr": done.stderr, "left": left, "alive": alive,
                      "check": check, "done_in_journal": done_in_journal,
                      "done_logged": sorted(e["task"] for e in logged if e["event"] == "task.done")}))
    """
)


@probe("disk-full-during-a-dry-run", "disk", "broker run: disk full in", "could not write the journal")
def _(env: ProbeEnv) -> Seen:
    result = _in_small_tmpfs(env, "300k", _DRY_RUN_FILLS_UP)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["code"] == 1, seen["stderr"][-2000:]
    assert seen["left"] == [] and seen["alive"] == []  # every agent and task stopped
    assert seen["check"] == "ok"
    assert set(seen["done_in_journal"]) <= set(seen["done_logged"])  # what was committed was also logged
    last = seen["stderr"].strip().splitlines()[-1]
    return Seen(last, f"disk full in {env.tmp / 'small' / 'run'}")


ALL_ROWS = [*CASES, *PROBES]


def test_the_whole_table_has_at_least_forty_rows_of_every_kind_the_issue_lists():
    assert len(ALL_ROWS) >= 40
    assert len({row.id for row in ALL_ROWS}) == len(ALL_ROWS)
    assert {p.kind for p in PROBES} == {"ssh", "aws", "agent", "cli", "disk"}


@pytest.mark.parametrize("row", PROBES, ids=[p.id for p in PROBES])
def test_bad_input_at_run_time_is_refused_with_what_and_where(row, tmp_path, monkeypatch, request, capsys):
    if row.kind == "ssh":
        request.getfixturevalue("structlog_defaults")
    seen = row.run(ProbeEnv(tmp_path, monkeypatch, request, capsys))
    assert seen.where and seen.where in seen.message, f"{row.id}: {seen.where!r} not named in:\n{seen.message}"
    missing = [fragment for fragment in row.reason if fragment not in seen.message]
    assert not missing, f"{row.id}: {missing} not in:\n{seen.message}"
