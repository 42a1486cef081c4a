"""deploy/: the systemd unit, its environment file, the worker user-data and the example
inventory, checked against the real CLI parser, the inventory loader, the console-key
parser the broker uses, moto's RunInstances and (when installed) ``systemd-analyze verify``."""

from __future__ import annotations

import base64
import configparser
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from broker.cli import build_parser
from broker.cli.plan import goal_from_args
from broker.config.errors import ConfigError
from broker.config.inventory import load_inventory, parse_inventory
from broker.shells.aws import Ec2Fleet
from broker.shells.ssh import host_keys_from_console, write_known_hosts

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "broker.service"
ENV_FILE = DEPLOY / "broker.env"
USER_DATA = DEPLOY / "user-data.sh"
INVENTORY = DEPLOY / "inventory.example.yaml"
README = ROOT / "README.md"

SECRET_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


# -- the unit -----------------------------------------------------------------------------
def read_unit(path: Path = UNIT) -> configparser.ConfigParser:
    """systemd's ini dialect: repeated keys allowed, case kept, no interpolation."""
    unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                     comment_prefixes=("#", ";"), empty_lines_in_values=False)
    unit.optionxform = str
    unit.read_string(path.read_text())
    return unit


def read_env_file(path: Path = ENV_FILE) -> dict[str, str]:
    env = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}:{number}: not KEY=value: {line!r}"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]  # systemd, like the shell, drops the quotes
        env[key] = value
    return env


def test_env_file_sources_in_a_shell_to_the_values_systemd_reads() -> None:
    """The README sources it (set -a; . broker.env) to run broker commands as the service does."""
    script = f"set -a; . {shlex.quote(str(ENV_FILE))}; set +a; env -0"
    shell = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env={})
    assert shell.returncode == 0, shell.stderr
    sourced = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    assert {k: sourced.get(k) for k in read_env_file()} == read_env_file()


def expand_exec(command: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion of an Exec line: ``${X}`` inside a word, ``$X`` alone splits."""
    argv: list[str] = []
    for word in shlex.split(command):
        alone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if alone:
            argv.extend(env[alone.group(1)].split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return argv


def test_unit_has_the_required_settings() -> None:
    unit = read_unit()
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    expected = {
        "User": "broker",
        "Group": "broker",
        "WorkingDirectory": "/var/lib/broker",
        "EnvironmentFile": "/etc/broker/broker.env",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ReadWritePaths": "/var/lib/broker",
        "PrivateTmp": "yes",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2",
        "KillSignal": "SIGTERM",
        "KillMode": "mixed",
    }
    assert {k: service.get(k) for k in expected} == expected
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    timeout = re.fullmatch(r"(\d+)min", service["TimeoutStopSec"])
    assert timeout and int(timeout.group(1)) >= 10  # long enough to release a fleet (see the unit's comment)
    # The run directory, where the journal is, must be writable under ProtectSystem=strict.
    env = read_env_file()
    assert env["BROKER_RUN_DIR"].startswith(service["ReadWritePaths"] + "/")


def test_unit_comments_explain_restart_and_stop_timeout() -> None:
    text = UNIT.read_text()
    restart_comment = text[: text.index("Restart=on-failure")].rsplit("\n\n", 1)[-1]
    assert "resumes a run" in restart_comment and "journal" in restart_comment
    assert "ExecStopPost" in restart_comment  # says why a crash is not resumed
    stop_comment = text[: text.index("TimeoutStopSec=")].rsplit("\n\n", 1)[-1]
    assert "--on-stop release" in stop_comment and "terminates every" in stop_comment


def test_exec_start_parses_with_the_real_cli_parser() -> None:
    unit, env = read_unit(), read_env_file()
    argv = expand_exec(unit["Service"]["ExecStart"], env)
    assert argv[0] == "/opt/broker/venv/bin/broker"
    args = build_parser().parse_args(argv[1:])  # argparse exits (SystemExit) on an unknown flag
    assert args.command == "run" and args.func.__module__ == "broker.cli.run"
    assert args.yes, "no terminal under systemd: --yes is needed"
    assert args.on_stop == "release" and not args.dry_run
    assert args.inventory == env["BROKER_INVENTORY"] and args.bag == env["BROKER_BAG"]
    assert args.run_dir == env["BROKER_RUN_DIR"]
    goal = goal_from_args(args)  # the run's own goal check (UsageError on a bad value)
    assert (goal.kind, goal.value) == ("budget", 1.0)  # from BROKER_GOAL
    assert args.metrics_port == 9464  # from BROKER_RUN_ARGS


def test_exec_start_parses_with_empty_extra_arguments() -> None:
    env = {**read_env_file(), "BROKER_RUN_ARGS": "", "BROKER_GOAL": "--deadline 6h"}
    args = build_parser().parse_args(expand_exec(read_unit()["Service"]["ExecStart"], env)[1:])
    goal = goal_from_args(args)
    assert (goal.kind, goal.value) == ("deadline", 6 * 3600.0) and args.metrics_port is None


def test_exec_stop_post_runs_broker_down_unless_the_run_was_left() -> None:
    """Every stop of the unit (done, error, SIGTERM, a stop timeout, a crash) ends with
    `broker down --unless-left RUN_DIR`: a no-op on a run that ended cleanly, a clean-up of
    anything else, and nothing at all for a run left with --on-stop leave."""
    unit, env = read_unit(), read_env_file()
    argv = expand_exec(unit["Service"]["ExecStopPost"], env)
    assert argv[0] == "/opt/broker/venv/bin/broker"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "down" and args.func.__module__ == "broker.cli.down"
    assert args.unless_left and args.run_dir == env["BROKER_RUN_DIR"]
    assert "SERVICE_RESULT" not in unit["Service"]["ExecStopPost"], "down runs after every kind of stop"
    text = UNIT.read_text()
    comment = text[: text.index("ExecStopPost=")].rsplit("\n\n", 1)[-1]
    assert "--on-stop leave" in comment and "no-op" in comment


def test_every_variable_the_unit_uses_is_in_the_env_file_and_no_secret_is() -> None:
    unit_text, env = UNIT.read_text(), read_env_file()
    service = read_unit()["Service"]
    used = set(re.findall(r"(?<!\$)\$\{?([A-Z_][A-Z0-9_]*)", service["ExecStart"]))
    assert used and used <= set(env), f"not in broker.env: {sorted(used - set(env))}"
    for name in SECRET_NAMES:
        assert name not in env and f"{name}=" not in unit_text
    assert not re.search(r"AKIA[0-9A-Z]{16}", unit_text + ENV_FILE.read_text())


def _systemd_analyze() -> str:
    """The systemd-analyze binary; without it the verify checks skip, except under CI=true,
    where .ci/run installs it and its absence is a failure."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing under CI=true (.ci/run installs systemd)")
        pytest.skip("systemd-analyze is not installed: only the verify check is skipped")
    return analyze


def test_systemd_analyze_verify_accepts_the_unit(tmp_path) -> None:
    analyze = _systemd_analyze()
    # verify insists that ExecStart's binary exists: point it at a stand-in, change nothing else.
    stand_in = tmp_path / "bin" / "broker"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    text = UNIT.read_text().replace("/opt/broker/venv/bin/broker", str(stand_in))
    assert text.count(str(stand_in)) == 2
    (tmp_path / "broker.service").write_text(text)
    checked = subprocess.run([analyze, "verify", str(tmp_path / "broker.service")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "Unknown" not in checked.stderr and "ignoring" not in checked.stderr, checked.stderr


def test_systemd_analyze_verify_catches_a_misspelt_key(tmp_path) -> None:
    """The check above can fail: a misspelt hardening key is reported."""
    analyze = _systemd_analyze()
    text = UNIT.read_text().replace("/opt/broker/venv/bin/broker", "/bin/true")
    (tmp_path / "broker.service").write_text(text.replace("ProtectSystem=strict", "ProtectSytem=strict"))
    checked = subprocess.run([analyze, "verify", str(tmp_path / "broker.service")],
                             capture_output=True, text=True, timeout=60)
    assert "ProtectSytem" in checked.stderr


# -- the worker side ----------------------------------------------------------------------
def test_user_data_passes_bash_n() -> None:
    checked = subprocess.run(["bash", "-n", str(USER_DATA)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def _host_keys_function(ssh_dir: Path) -> str:
    text = USER_DATA.read_text()
    body = re.search(r"^host_keys_block\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert body, "user-data.sh defines host_keys_block()"
    return body.group(0).replace("/etc/ssh/", f"{ssh_dir}/")


def test_user_data_prints_host_keys_the_broker_reads_from_the_console(tmp_path) -> None:
    keygen = shutil.which("ssh-keygen")
    assert keygen is not None, "ssh-keygen (openssh-client) is needed, as for the sshd tests"
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir()
    for kind in ("ed25519", "ecdsa", "rsa"):
        subprocess.run([keygen, "-q", "-t", kind, "-N", "", "-C", "root@ip-10-0-0-5",
                        "-f", str(ssh_dir / f"ssh_host_{kind}_key")], check=True, timeout=60)
    script = 'log() { echo "$*" >&2; }\n' + _host_keys_function(ssh_dir) + "host_keys_block\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True).stdout
    # As the console shows it: after a boot log, with cloud-init's "ec2: " prefix style around.
    console = "[    2.1] Booting\nec2: ####\n" + out + "Cloud-init v. 23 finished\n"
    keys = host_keys_from_console(console)
    expected = sorted(tuple((ssh_dir / f"ssh_host_{k}_key.pub").read_text().split()[:2])
                      for k in ("ed25519", "ecdsa", "rsa"))
    assert sorted(keys) == expected
    write_known_hosts(tmp_path / "known_hosts", "10.0.0.5", 22, keys)  # real keys: accepted
    assert len((tmp_path / "known_hosts").read_text().splitlines()) == 3


def test_user_data_prints_no_block_without_host_keys(tmp_path) -> None:
    """An empty block would be the last one and hide cloud-init's; none is printed instead."""
    script = ('log() { echo "$*" >&2; }\nsleep() { :; }\n' + _host_keys_function(tmp_path)
              + "host_keys_block\n")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "" and "no SSH host keys" in done.stderr


def test_user_data_prints_the_keys_before_anything_that_can_fail() -> None:
    text = USER_DATA.read_text()
    assert text.index("KEYS_BLOCK=$(host_keys_block)") < min(text.index("useradd"), text.index("exit 1"))


# -- the example inventory ----------------------------------------------------------------
def test_example_inventory_is_coherent_with_the_user_data() -> None:
    inventory = load_inventory(INVENTORY)
    aws = inventory.aws
    assert aws.user_data == USER_DATA.read_text()  # aws.user_data is relative to the inventory
    text = USER_DATA.read_text()
    assert re.search(rf"^AGENT_USER={re.escape(aws.user)}$", text, re.M)
    assert re.search(rf"^AGENT_DIR={re.escape(aws.agent_dir)}$", text, re.M)
    assert aws.host_key_policy == "console"
    assert inventory.types, "the walkthrough's first run rents at least one type"


def test_example_inventory_live_check_needs_the_key_file(tmp_path) -> None:
    text = INVENTORY.read_text()
    with pytest.raises(ConfigError) as refused:
        parse_inventory(text.replace("/etc/broker/broker-key.pem", str(tmp_path / "absent.pem")),
                        str(INVENTORY), live=True)
    assert "SSH key file not found" in refused.value.render()
    key = tmp_path / "broker-key.pem"
    key.write_text("placeholder\n")
    key.chmod(0o600)
    live = parse_inventory(text.replace("/etc/broker/broker-key.pem", str(key)), str(INVENTORY), live=True)
    assert live.aws.key == str(key)


def test_user_data_errors_name_the_file_and_field(tmp_path) -> None:
    base = "aws:\n  user_data: {}\n  types:\n    - {{name: m5.large, slots: 2, speed: 1, price: 0.1, limit: 1}}\n"
    source = tmp_path / "inv.yaml"
    with pytest.raises(ConfigError) as missing:
        parse_inventory(base.format("nothing-here.sh"), str(source))
    assert f"user-data file not found: {tmp_path / 'nothing-here.sh'}" in missing.value.render()
    assert "aws.user_data" in missing.value.render()
    (tmp_path / "big.sh").write_bytes(b"#!/bin/bash\n" + b"#" * (16 * 1024))
    with pytest.raises(ConfigError) as big:
        parse_inventory(base.format("big.sh"), str(source))
    assert "EC2 takes at most 16384" in big.value.render()


@mock_aws
def test_a_launch_carries_the_inventory_user_data() -> None:
    inventory = load_inventory(INVENTORY)
    ec2 = boto3.client("ec2", region_name=inventory.aws.region)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]  # moto's stock AMIs
    from dataclasses import replace

    settings = replace(inventory.aws, ami=image, key_name=None, security_group=None, subnet=None)
    fleet = Ec2Fleet(ec2, settings, "deploy-test", sleep=lambda s: None)
    outcome = fleet.launch(inventory.types[0].name, 1, client_token="deploy-test-1")
    assert outcome.failure is None, outcome.failure
    attribute = ec2.describe_instance_attribute(InstanceId=outcome.instances[0].id, Attribute="userData")
    assert base64.b64decode(attribute["UserData"]["Value"]).decode() == USER_DATA.read_text()


# -- the README's Deploy section ------------------------------------------------------------
def deploy_section() -> str:
    text = README.read_text()
    start = text.index("\n## Deploy\n")
    end = text.index("\n## ", start + 1)
    assert text.index("\n## Benchmarks\n") == end, "Deploy comes right before Benchmarks"
    return text[start:end]


def _without_prefix(words: list[str]) -> list[str]:
    """``sudo -u broker X=1 broker ...`` -> ``broker ...``."""
    while words:
        if words[0] == "sudo":
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[2:] if words[0] in ("-u", "-g") else words[1:]
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            words = words[1:]
        else:
            break
    return words


def readme_broker_commands() -> list[list[str]]:
    """Every ``broker ...`` command line in the Deploy section's code (indented) blocks."""
    commands = []
    for line in deploy_section().splitlines():
        if not line.startswith("    "):
            continue
        for part in re.split(r"&&|;|\|", line.strip()):
            words = _without_prefix(shlex.split(part, comments=True))
            if words and (words[0] == "broker" or words[0].endswith("/bin/broker")):
                commands.append(words)
    return commands


def test_readme_deploy_section_names_the_essential_steps() -> None:
    section = deploy_section()
    for needle in ("iam-policy.json", "aws configure", "aws ec2 create-key-pair",
                   "aws ec2 authorize-security-group-ingress", "/32", "--budget 1", "broker validate",
                   "--live", "broker status", "--watch", "--metrics-port", "broker down",
                   "Name=tag:broker:run,Values=", "systemctl", "broker.service", "user-data.sh"):
        assert needle in section, needle


def test_every_broker_command_in_the_readme_deploy_section_parses() -> None:
    commands = readme_broker_commands()
    names = {words[1] for words in commands if len(words) > 1}
    assert {"validate", "run", "status", "down"} <= names, names
    for words in commands:
        try:
            args = build_parser().parse_args(words[1:])
        except SystemExit as exc:  # argparse's way of refusing
            raise AssertionError(f"README Deploy: `{shlex.join(words)}` does not parse") from exc
        assert args.command == words[1]
        if args.command in ("run", "plan"):
            assert goal_from_args(args) is not None, f"`{shlex.join(words)}` names no goal"


def test_readme_command_extraction_can_fail() -> None:
    """A misspelt flag in a command like the README's is refused by the parser."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "runs/x", "--wacth"])


def test_readme_tag_filter_names_the_real_run_tag() -> None:
    from broker.shells.aws import RUN_TAG

    assert f"Name=tag:{RUN_TAG},Values=" in deploy_section()


# -- user-data, run for real as at first boot ------------------------------------------------
# In a private mount namespace: /etc is a private copy, /home, /opt, /var/lib and /var/log are
# empty tmpfs, /dev/console is a file of the test's. Each is checked to be private before the
# script runs, so nothing outside the namespace can be changed. Needs root (CI runs as root
# in its container); elsewhere the test is skipped with the reason, and under CI=true it fails.
_FIRST_BOOT = r"""
set -eu
work=$1; user_data=$2; default_user=$3
mkdir -p "$work/etc"
cp -a /etc/. "$work/etc/"
touch "$work/etc/.broker-test-private" "$work/console"
mount --bind "$work/etc" /etc
for dir in /home /opt /var/lib /var/log; do mount -t tmpfs tmpfs "$dir"; done
mount --bind "$work/console" /dev/console
[ -e /etc/.broker-test-private ] || { echo "refusing: /etc is not the private copy" >&2; exit 97; }
for dir in /home /opt /var/lib /var/log /dev/console; do
    mountpoint -q "$dir" || { echo "refusing: $dir is not private" >&2; exit 97; }
done
# The stock AMI: host keys, and the default user with the launch key pair (cloud-init's doing).
ls /etc/ssh/ssh_host_*_key.pub >/dev/null 2>&1 || ssh-keygen -A >/dev/null
useradd --create-home "$default_user"
install -d -m 700 -o "$default_user" -g "$default_user" "/home/$default_user/.ssh"
echo "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBrokerTestLaunchKeyPair launch-key" > "/home/$default_user/.ssh/authorized_keys"
bash "$user_data" > "$work/stdout" 2> "$work/stderr"
echo "passwd: $(getent passwd broker)"
echo "agent_dir: $(stat -c '%U %a' /opt/broker-agent) outputs: $(stat -c '%U %a' /opt/broker-agent/outputs)"
echo "ssh: $(stat -c '%U %a' /home/broker/.ssh) keys: $(stat -c '%U %a' /home/broker/.ssh/authorized_keys)"
echo "authorized: $(cat /home/broker/.ssh/authorized_keys)"
echo "ready: $(tr '\n' ' ' < /var/lib/broker/ready)"
"""


@pytest.mark.parametrize("default_user", ["ec2-user", "ubuntu"])  # Amazon Linux 2023, Ubuntu
def test_user_data_prepares_a_stock_machine_and_its_console(tmp_path, default_user) -> None:
    unshare = shutil.which("unshare")
    why = None
    if unshare is None:
        why = "no unshare(1)"
    elif os.geteuid() != 0:
        why = "useradd and mounts need root"
    else:
        (tmp_path / "probe").mkdir()
        probe = subprocess.run([unshare, "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs",
                                str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            why = f"no private mount namespace here ({probe.stderr.strip()})"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run user-data as at first boot, but cannot: {why}")
        pytest.skip(f"user-data not run as at first boot: {why}")
    done = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", _FIRST_BOOT, "sh",
                           str(tmp_path), str(USER_DATA), default_user],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stderr}\n{(tmp_path / 'stderr').read_text() if (tmp_path / 'stderr').exists() else ''}"
    facts = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert facts["passwd"].startswith("broker:") and facts["passwd"].endswith(":/home/broker:/bin/bash")
    assert facts["agent_dir"] == "broker 700 outputs: broker 700"  # private to the broker user
    assert facts["ssh"] == "broker 700 keys: broker 600"
    assert facts["authorized"].endswith("launch-key")  # the launch key pair, copied from the default user
    assert "agent_dir=/opt/broker-agent" in facts["ready"] and "user=broker" in facts["ready"]
    # What the console shows is what the broker pins: exactly the machine's host keys.
    expected = sorted(tuple(p.read_text().split()[:2]) for p in (tmp_path / "etc" / "ssh").glob("ssh_host_*_key.pub"))
    console = (tmp_path / "console").read_text()
    assert expected and sorted(host_keys_from_console(console)) == expected
    assert sorted(host_keys_from_console((tmp_path / "stdout").read_text())) == expected  # cloud-init-output.log
    assert "ready:" in (tmp_path / "stderr").read_text()
